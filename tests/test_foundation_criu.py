"""The installed CRIU (>= 4.1) dumps and restores a real CPU process, which continues."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CRIU = os.environ.get("GPUCR_CRIU", "/opt/gpucr-hpc/bin/criu")

pytestmark = pytest.mark.criu

COUNTER = """
import sys, time
out = open(sys.argv[1], "a", buffering=1)
i = 0
while True:
    out.write(f"{i}\\n")
    i += 1
    time.sleep(0.02)
"""


def criu_version():
    try:
        out = subprocess.run([CRIU, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return None
    m = re.search(r"Version:\s*(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


@pytest.fixture(scope="module")
def criu():
    if os.geteuid() != 0:
        pytest.skip("CRIU dump/restore of an arbitrary process needs root")
    version = criu_version()
    assert version is not None, f"no CRIU at {CRIU}: run scripts/install-deps"
    assert version >= (4, 1), f"CRIU {version} is too old; 4.1 or newer is needed"
    return CRIU


def wait_lines(path: Path, n: int, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {n} lines")


def test_installed_criu_is_recent(criu):
    assert criu_version() >= (4, 1)


def test_dump_kill_restore_continues(criu, tmp_path):
    log = tmp_path / "count.txt"
    images = tmp_path / "img"
    images.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", COUNTER, str(log)], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    restored_pid = None
    try:
        wait_lines(log, 10)
        subprocess.run([criu, "dump", "-t", str(proc.pid), "-D", str(images), "-o", "dump.log"],
                       check=True, capture_output=True, timeout=120)
        assert proc.wait(timeout=30) is not None  # the dump ended the process
        before = log.read_text().splitlines()
        time.sleep(0.3)
        assert log.read_text().splitlines() == before, "nothing may run between dump and restore"

        subprocess.run([criu, "restore", "-D", str(images), "-d", "-o", "restore.log"],
                       check=True, capture_output=True, timeout=120)
        restored_pid = proc.pid  # CRIU restores the process under its old PID
        wait_lines(log, len(before) + 10)
    finally:
        for pid in {proc.pid, restored_pid} - {None}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    numbers = [int(x) for x in log.read_text().split()]
    assert numbers == list(range(len(numbers))), "the counter repeated or skipped a value"
    assert len(numbers) > len(before)
