"""Root's scratch directories: private, sized ahead, and never left behind.

A dump writes its images, and a restore its checked copy, into a directory only
root can reach, in /dev/shm when it has room, else /var/tmp. Its name carries
the helper's PID: a helper killed outright (a job's end kills its whole cgroup)
cannot remove its own, so every later run of the helper removes those of
helpers that are gone. Only directories that are root's are ever removed:
/dev/shm and /var/tmp are open to everyone, and a user may name a directory so.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PARENTS = ("/dev/shm", "/var/tmp")
PREFIX = "gpucr-root-"
_NAME = re.compile(rf"{PREFIX}[a-z]+-(\d+)-[A-Za-z0-9_]+")
SPARE = 256 << 20


@contextmanager
def private_dir(kind: str, need: int = 0) -> Iterator[Path]:
    parent = PARENTS[1]
    try:
        st = os.statvfs(PARENTS[0])
        if st.f_bavail * st.f_frsize > need + SPARE:
            parent = PARENTS[0]
    except OSError:
        pass
    d = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-", dir=parent))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def sweep() -> list[str]:
    """Remove the scratch directories of helpers that are gone; their paths."""
    gone = []
    for parent in PARENTS:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            m = _NAME.fullmatch(name)
            if not m or os.path.exists(f"/proc/{m.group(1)}"):
                continue
            path = os.path.join(parent, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o077:
                shutil.rmtree(path, ignore_errors=True)
                gone.append(path)
    return gone
