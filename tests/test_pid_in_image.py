"""A process's PID as an image of its tree records it.

A tree restored before lives in a PID namespace of its own and is dumped from
inside it, so its image holds the PIDs the tree knows, not ours. The GPU
records of the image must name the same PIDs, or the next restore cannot find
its GPU processes (a GPU job's second restore failed that way).
"""

import os
import subprocess
import time

import pytest

from gpucr_hpc.criu import run as criu_mod

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace needs root here")


def test_a_process_in_our_namespace_is_recorded_as_itself():
    assert criu_mod.pid_in_image(os.getpid()) == os.getpid()


def test_a_process_in_a_child_namespace_is_recorded_by_its_pid_there():
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc",
                          "sh", "-c", "sleep 60 & wait"])
    try:
        deadline, inner = time.monotonic() + 10, []
        while not inner and time.monotonic() < deadline:
            inner = [q for q in criu_mod.process_tree(p.pid) if criu_mod.nspid(q)[-1] == 2]
            time.sleep(0.05)
        assert inner, "the namespace's second process did not appear"
        assert inner[0] != 2
        assert criu_mod.pid_in_image(inner[0]) == 2
    finally:
        p.kill()
        p.wait()
