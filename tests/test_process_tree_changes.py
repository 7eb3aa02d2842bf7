"""A process tree that changes while it is checkpointed in place: a process under
the shim that ends between being found and being asked (the srun wrapper's short
`sleep`s do) is no target; the rest of the tree is checkpointed and restored."""

import signal
import subprocess

import pytest
from shim_helpers import build_shim, shim_env, wait_for

from gpucr_hpc.process import in_place


@pytest.fixture
def shimmed(tmp_path):
    build_shim()
    run = tmp_path / "run"
    procs = []

    def start():
        p = subprocess.Popen(["sleep", "60"], env=shim_env(run))
        procs.append(p)
        assert wait_for(run / f"{p.pid}.sock"), "no control socket appeared"
        return p

    yield run, start
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["ended", "killed"])
def test_a_process_ending_after_it_was_found_is_skipped(shimmed, how):
    run, start = shimmed
    stays, ends = start(), start()
    targets = [t for pid in (stays.pid, ends.pid)
               for t in in_place.discover(pid, run, need_driver=False)[0]]
    assert [t.shim_state for t in targets] == ["running", "running"]
    ends.send_signal(how)
    ends.wait()
    done = in_place.shim_checkpoint(targets, 5000, run)
    assert {t.pid: t.shim_state for t in done} == {stays.pid: "checkpointed", ends.pid: "gone"}
    in_place.shim_restore(targets, run)
    assert in_place.discover(stays.pid, run, need_driver=False)[0][0].shim_state == "running"

