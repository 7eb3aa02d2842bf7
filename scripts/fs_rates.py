"""A file system's own sequential rates, to hold the image store's rates against.

Write: 16 MiB writes, each handed to the disk at once (sync_file_range, as the
image writer does), fsync at the end. Read: the page cache dropped first
(posix_fadvise DONTNEED after fsync), then 16 MiB reads.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpucr_hpc import gpu_image  # noqa: E402

BLOCK = 16 << 20


def drop_cache(path: Path) -> None:
    """Drop the page cache of a file, or of every file under a directory."""
    path = Path(path)
    for p in ([path] if path.is_file() else [q for q in path.rglob("*") if q.is_file()]):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def write_seconds(path: Path, size: int, block: bytes | None = None) -> float:
    """Write `size` bytes to a new file at `path`, fsync'd; seconds taken."""
    view = memoryview(block or os.urandom(BLOCK))
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        done = 0
        while done < size:
            n = os.write(fd, view[: min(len(view), size - done)])
            gpu_image._start_writeback(fd, done, n)
            done += n
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def read_seconds(path: Path) -> float:
    """Read the whole file from the disk (its page cache dropped first); seconds taken."""
    drop_cache(path)
    buf = bytearray(BLOCK)
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def rates(root: Path, size: int) -> dict:
    """Write then read `size` bytes in a scratch file under root: MB/s of each."""
    path = Path(root) / "fs-rates.tmp"
    try:
        w = write_seconds(path, size)
        r = read_seconds(path)
    finally:
        path.unlink(missing_ok=True)
    return {"bytes": size, "write_s": round(w, 3), "write_MBps": round(size / w / 1e6, 1),
            "read_s": round(r, 3), "read_MBps": round(size / r / 1e6, 1)}
