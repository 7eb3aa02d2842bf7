"""Hand written pages to the disk at once (sync_file_range), so that a large file's
final fsync waits for little and the disk works while the writer goes on."""

from __future__ import annotations

import ctypes

_SYNC_FILE_RANGE_WRITE = 2
_libc = None


def start(fd: int, off: int, n: int) -> None:
    """Start writing [off, off + n) of fd to the disk now; best effort."""
    global _libc
    try:
        if _libc is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.sync_file_range.restype = ctypes.c_int
            libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            _libc = libc
        _libc.sync_file_range(fd, off, n, _SYNC_FILE_RANGE_WRITE)
    except (AttributeError, OSError):
        pass
