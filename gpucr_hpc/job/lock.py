"""One command at a time on a job: checkpoint, preempt, suspend, resume, restore.

Two at once would fight over the job's processes (CRIU: "Unable to detach")
and its next generation. The lock is an flock on `<job dir>/lock`, held for
the whole command; the image store is shared by every node, so commands on
a login node and the batch supervisor on a compute node see one lock (on a
file system whose locks reach across nodes: NFSv4, Lustre mounted with
`flock`). The holder writes who it is into the file, so that a refused
command can name it. A lock dies with its process: one left by a killed
command never blocks the next.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import dirs as job_dirs

LOCK_NAME = "lock"
POLL_S = 0.5


def command_line() -> str:
    """What this process is, as the user typed it."""
    return " ".join(["gpucr-hpc", *sys.argv[1:]])


def _identity(what: str) -> bytes:
    return json.dumps({"command": what, "pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()


def _holder(fd: int, patience_s: float = 1.0) -> str:
    """Who holds the lock; it writes its name just after it took the lock, so an
    empty file is read again for a moment."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            h = json.loads(os.pread(fd, 4096, 0))
            return f"`{h['command']}` (pid {h['pid']} on {h['host']}, started {h['started']})"
        except (OSError, ValueError, KeyError, TypeError):  # between its lock and its write
            if time.monotonic() >= deadline:
                return "another gpucr-hpc command"
            time.sleep(0.05)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise


def _open(job_dir: Path, uid: int) -> int:
    path = Path(job_dir) / LOCK_NAME
    try:
        with job_dirs.as_owner(uid):  # root opens it as the job's user: theirs, and only theirs opened
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise GpucrError(f"cannot open the job's lock {path}: {e.strerror}",
                         "only the job's owner or root can act on it") from e
    return fd


@contextmanager
def held(job_dir: Path, jobid: str, uid: int, what: str | None = None, wait_s: float = 0.0):
    """The job's lock for the body of the with-statement. Refused with one line naming
    the holder if another command holds it for longer than wait_s (0: refused at once)."""
    fd = _open(job_dir, uid)
    try:
        deadline = time.monotonic() + wait_s
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                raise GpucrError(f"job {jobid} is busy: {_holder(fd)} is running on it",
                                 "wait for it to end, then try again")
            time.sleep(POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, _identity(what or command_line()), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # no stale name for the next one to show
    finally:
        os.close(fd)
