"""One style for sizes and timings in every command's output."""

from gpucr_hpc import figures


def test_sizes_in_binary_units_with_one_decimal():
    assert figures.size(0) == "0 B" and figures.size(512) == "512 B"
    assert figures.size(7.1 * 2**20) == "7.1 MiB"
    assert figures.size(80 * 2**30) == "80.0 GiB"
    assert figures.size(3 * 2**40) == "3.0 TiB" and figures.size(5000 * 2**40) == "5000.0 TiB"


def test_a_rate_is_printed_as_a_rate_not_as_seconds():
    """A report printed `gpu_h5_MBps=1931.824s`."""
    line = figures.timings_line({"quiesce_s": 0.1234, "h5_MBps": 1931.824, "persist_MBps": None, "files": 3})
    assert line == "quiesce 0.123 s, h5 1931.8 MB/s, files 3"


def test_timings_in_a_given_order_leave_the_others_out():
    t = {"total_s": 2.0, "data_s": 1.5, "other_s": 9.0, "quiesce_s": 0.25}
    assert figures.timings_line(t, ("quiesce_s", "data_s", "control_s", "total_s")) == \
        "quiesce 0.250 s, data 1.500 s, total 2.000 s"
