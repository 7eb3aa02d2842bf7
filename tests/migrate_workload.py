"""A CPU process tree for migration tests, and helpers to drive and clean it up.

The workload: a root process with a worker thread and a ticker thread, a
forked child that answers over pipes (n -> n+1), a read-only data file read
sequentially (its offset must survive) and a counter file appended to line by
line. Each counter line is `i chunk` where chunk is the next 4 bytes of the data
file, so after a restore the counter must go on from where it stopped, neither
repeating nor skipping, and the file offset must be the one it had.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpucr_hpc.criu.run import is_alive as alive  # noqa: F401 - the tests use it from here

REPO = Path(__file__).resolve().parent.parent

WORKLOAD = r'''
import os, sys, threading, time
out_path, data_path = sys.argv[1], sys.argv[2]
r1, w1 = os.pipe()
r2, w2 = os.pipe()
child = os.fork()
if child == 0:
    os.close(w1); os.close(r2)
    rf = os.fdopen(r1, "r"); wf = os.fdopen(w2, "w", buffering=1)
    for line in rf:
        wf.write(f"{int(line) + 1}\n")
    os._exit(0)
os.close(r1); os.close(w2)
to_child = os.fdopen(w1, "w", buffering=1)
from_child = os.fdopen(r2, "r")
data = open(data_path, "rb")
out = open(out_path, "a", buffering=1)
ticks = [0]
def ticker():
    while True:
        ticks[0] += 1
        time.sleep(0.005)
def worker():
    i = 0
    while True:
        to_child.write(f"{i}\n")
        if int(from_child.readline()) != i + 1:
            out.write("BAD-ECHO\n"); return
        chunk = data.read(4)
        if len(chunk) < 4:
            data.seek(0); chunk = data.read(4)
        out.write(f"{i} {chunk.decode()}\n")
        i += 1
        time.sleep(0.01)
threading.Thread(target=ticker, daemon=True).start()
t = threading.Thread(target=worker, daemon=True)
t.start()
t.join()
'''

DATA = "".join(f"{n:04d}" for n in range(1000))  # 4 bytes per line, 1000 lines per cycle


def _write_workload(tmp: Path) -> tuple[list[str], Path]:
    script = tmp / "workload.py"
    script.write_text(WORKLOAD)
    (tmp / "data.txt").write_text(DATA)
    out = tmp / "counter.txt"
    return [sys.executable, str(script), str(out), str(tmp / "data.txt")], out


def start_workload(tmp: Path) -> tuple[subprocess.Popen, Path]:
    """The workload as the leader of its own session (how Slurm starts tasks)."""
    argv, out = _write_workload(tmp)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, out


def start_workload_under(tmp: Path, wrapper: list[str], *,
                         new_session: bool) -> tuple[subprocess.Popen, int, Path]:
    """The workload as the child of `wrapper` (a shell, unshare ...); returns
    the wrapper, the workload's PID and the counter file."""
    from gpucr_hpc.criu.run import children

    argv, out = _write_workload(tmp)
    proc = subprocess.Popen([*wrapper, *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=new_session)
    deadline = time.monotonic() + 10
    while not children(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    kids = children(proc.pid)
    assert len(kids) == 1, f"{wrapper} has children {kids}"
    return proc, kids[0], out


def lines(out: Path) -> list[str]:
    return out.read_text().splitlines() if out.exists() else []


def wait_lines(out: Path, n: int, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = lines(out)
        if len(got) >= n:
            return got
        time.sleep(0.02)
    raise AssertionError(f"{out} has {len(lines(out))} lines, waited for {n}")


def assert_counter_exact(got: list[str]) -> None:
    """Lines are 0, 1, 2, ... each once, and each carries the data file's next 4 bytes."""
    for i, line in enumerate(got):
        expect = f"{i} {DATA[(i * 4) % len(DATA):(i * 4) % len(DATA) + 4]}"
        assert line == expect, f"line {i}: {line!r}, expected {expect!r} (counter repeated or skipped)"


def cli(*args, env=None, check=False) -> subprocess.CompletedProcess:
    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "gpucr_hpc", *args], capture_output=True,
                       text=True, env=e, timeout=300, stdin=subprocess.DEVNULL)
    if check:
        assert r.returncode == 0, f"gpucr-hpc {' '.join(args)} failed: {r.stderr.strip()}"
    return r


def cli_json(*args, **kw) -> dict:
    r = cli(*args, "--json", check=True, **kw)
    return json.loads(r.stdout)


def kill_tree(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL pid and its descendants (by PID, never by name) and wait until gone."""
    from gpucr_hpc.criu.run import process_tree

    pids = process_tree(pid) if alive(pid) else [pid]
    for p in reversed(pids):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
