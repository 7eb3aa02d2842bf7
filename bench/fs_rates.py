"""A file system's own sequential rates, to hold the image store's rates against.

Write: 16 MiB writes, each handed to the disk at once (sync_file_range, as the
image writer does), fsync at the end. Read: the page cache dropped first
(posix_fadvise DONTNEED after fsync), then 16 MiB reads, through the page cache
and with O_DIRECT (as the checked restore reads). Each by one stream, and by 4
streams over the file's 4 quarters: the image store writes and reads with
several threads, and some disks (virtio) are faster so. The reference is the
fastest of these, so that a ratio against it never flatters the image store.
"""

from __future__ import annotations

import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpucr_hpc.store import writeback  # noqa: E402

BLOCK = 16 << 20
STREAMS = (1, 4)


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


def _ranges(size: int, streams: int) -> list[tuple[int, int]]:
    step = -(-size // streams // BLOCK) * BLOCK  # whole blocks per stream
    return [(off, min(size, off + step)) for off in range(0, size, step or 1)]


def _each(streams: int, fn, ranges) -> None:
    with ThreadPoolExecutor(max_workers=streams) as ex:
        for f in [ex.submit(fn, lo, hi) for lo, hi in ranges]:
            f.result()


def write_seconds(path: Path, size: int, block: bytes | None = None, streams: int = 1) -> float:
    """Write `size` bytes to a new file at `path`, fsync'd; seconds taken."""
    view = memoryview(block or os.urandom(BLOCK))
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        def part(lo: int, hi: int) -> None:
            while lo < hi:
                n = os.pwrite(fd, view[: min(len(view), hi - lo)], lo)
                writeback.start(fd, lo, n)
                lo += n

        _each(streams, part, _ranges(size, streams))
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def read_seconds(path: Path, streams: int = 1, direct: bool = False) -> float:
    """Read the whole file from the disk (its page cache dropped first), through the
    page cache or with O_DIRECT (whole 16 MiB reads, the last one rounded up to a
    page); seconds taken."""
    drop_cache(path)
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        def part(lo: int, hi: int) -> None:
            buf = mmap.mmap(-1, BLOCK)  # page-aligned
            while lo < hi:
                want = min(BLOCK, -(-(hi - lo) // 4096) * 4096) if direct else min(BLOCK, hi - lo)
                n = os.preadv(fd, [memoryview(buf)[:want]], lo)
                if n <= 0:
                    raise OSError(f"{path}: short read at offset {lo}")
                lo += n

        _each(streams, part, _ranges(os.fstat(fd).st_size, streams))
    finally:
        os.close(fd)
    return time.perf_counter() - t


def direct_ok(path: Path) -> bool:
    """Whether path's file system takes O_DIRECT reads."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


def rates(root: Path, size: int, repeat: int = 1) -> dict:
    """Write then read `size` bytes in a scratch file under root, by 1 and by 4
    streams (reads also with O_DIRECT where the file system allows it), best of
    `repeat` each: MB/s of each, and the fastest as the reference."""
    path = Path(root) / "fs-rates.tmp"
    out: dict = {"bytes": size}
    try:
        for k in STREAMS:
            w = min(write_seconds(path, size, streams=k) for _ in range(repeat))
            r = min(read_seconds(path, streams=k) for _ in range(repeat))
            out[f"write_{k}_MBps"] = round(size / w / 1e6, 1)
            out[f"read_{k}_MBps"] = round(size / r / 1e6, 1)
            if direct_ok(path):
                r = min(read_seconds(path, streams=k, direct=True) for _ in range(repeat))
                out[f"read_direct_{k}_MBps"] = round(size / r / 1e6, 1)
    finally:
        path.unlink(missing_ok=True)
    out["write_MBps"] = max(out[f"write_{k}_MBps"] for k in STREAMS)
    out["read_MBps"] = max(v for k, v in out.items() if k.startswith("read_") and k.endswith("_MBps"))
    return out
