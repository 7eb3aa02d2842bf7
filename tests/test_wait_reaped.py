"""A dump waits for a process of the tree caught mid-exit to be reaped: CRIU
refuses a tree with a zombie that still has threads (seen once in CI, a
checkpoint aborted for it)."""

import subprocess
import sys
import time

from gpucr_hpc.criu import run as criu_mod

# A parent whose child exits at once, reaped only after `delay` seconds.
PARENT = r"""
import os, sys, time
pid = os.fork()
if pid == 0:
    os._exit(0)
print("forked", flush=True)
time.sleep(float(sys.argv[1]))
os.waitpid(pid, 0)
time.sleep(60)
"""


def start(delay: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", PARENT, str(delay)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "forked\n"
    time.sleep(0.05)  # the child has exited by now: a zombie until reaped
    return p


def test_a_child_reaped_soon_is_waited_for():
    p = start(0.4)
    try:
        assert any(not criu_mod.is_alive(c) for c in criu_mod.process_tree(p.pid))
        t = time.monotonic()
        criu_mod.wait_reaped(p.pid)
        assert time.monotonic() - t < 1.5
        assert criu_mod.process_tree(p.pid) == [p.pid]
    finally:
        p.kill()
        p.wait()


def test_a_zombie_that_stays_is_left_to_criu_after_the_timeout():
    p = start(30)
    try:
        t = time.monotonic()
        criu_mod.wait_reaped(p.pid, timeout=0.3)
        assert 0.3 <= time.monotonic() - t < 1.0
    finally:
        p.kill()
        p.wait()
