"""The one way a TCP end is written and read."""

import ipaddress

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.tcp import end as tcp_end


@pytest.mark.parametrize("text,addr,port", [
    ("10.0.0.1:4242", "10.0.0.1", 4242),
    ("[fd00::1]:4242", "fd00::1", 4242),
    ("[fd00::a00:1]:80", "fd00::a00:1", 80),
    ("0.0.0.0:0", "0.0.0.0", 0),
])
def test_an_end_reads_back_as_it_was_written(text, addr, port):
    a, p = tcp_end.parse(text)
    assert (a, p) == (ipaddress.ip_address(addr), port)
    assert tcp_end.text(a, p) == text


@pytest.mark.parametrize("text", ["localhost:80", "fd00::1:80", "[10.0.0.1]:80", "10.0.0.1:65536",
                                  "10.0.0.1", "10.0.0.1:x", "", "10.0.0.1:80; drop"])
def test_anything_else_is_refused_with_the_fix(text):
    with pytest.raises(GpucrError) as e:
        tcp_end.parse(text)
    assert "10.0.0.1:4242" in e.value.fix
