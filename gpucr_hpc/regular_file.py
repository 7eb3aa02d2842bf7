"""Opening a file a user could have swapped: the file itself, and only a regular one.

Standard library only: the root helper uses it too (tests/test_layout.py).
"""

from __future__ import annotations

import errno
import os
import stat

NOT_REGULAR = errno.EINVAL


def open_regular(path: str | os.PathLike, dir_fd: int | None = None) -> int:
    """An fd for reading the regular file at path: never what a link there names
    (ELOOP), never a FIFO or a device (opened without blocking, then refused with
    NOT_REGULAR)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(NOT_REGULAR, "not a regular file", os.fsdecode(path))
    return fd
