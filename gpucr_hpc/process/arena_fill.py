"""A restored process's arena, filled from its image while CRIU and the driver
restore the rest of the process.

Without it, a restore waits for CRIU and the driver, then the shim makes its
arena anew (fresh pages, faulted in), then the .h5 file is copied into it: on
the H100, 0.6 s and 0.4 s for 17 GiB from node memory, after all the rest
(restore.log's "arena" and "GPU data read"). With it, before CRIU starts, one
thread per GPU process makes each segment of its arena as a file with no name
(O_TMPFILE) in the arena's directory, faults its pages in as the shim would
(all of them: a page the shim later touches must not be missing) and copies the
.h5 file's allocations to where the shim had placed them. At arena_attach the
descriptors go to the shim (SCM_RIGHTS), which maps them at the segments'
addresses: the data is there. An image in node memory whose checkpoint left the
arena's own files there (store/files.py) needs no fill: they are opened and
handed over as they are (`adopt`).

It serves only where it does what the shim would: the image records the arena's
segments and directory (earlier images do not), that directory is here, and the
node has one NUMA node (the shim puts a segment on its GPU's node, which a fill
from here would not). Where it cannot get its memory either, the restore makes
the arena as before (`Unavailable`). A data error (a bad checksum, a layout that
does not fit the segments) fails the restore, as the load it replaces would.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import mmap
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpucr_hpc.shim.protocol import Blob
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import gpu_data
from gpucr_hpc.store.manifest import image_pid

MADV_POPULATE_WRITE = 23  # Linux 5.14: faults the pages in, or says why not (no SIGBUS later)
FAULT_SLICE = 1 << 30     # what one thread faults in at a time
FAULT_WORKERS = 8
# CPUs a fill leaves to CRIU and the driver beside it: with every CPU copying, the
# driver's restore of a 17 GiB job took 1.04 s instead of 0.55 s on the H100 machine.
SPARE_CPUS = 4
NUMA_ONLINE = Path("/sys/devices/system/node/online")


class Unavailable(Exception):
    """The fill cannot serve here; the restore makes the arena itself."""


@dataclass
class Filled:
    """One process's arena, filled: a descriptor per segment, in address order."""

    fds: list[int]
    blobs: list[Blob]  # as the shim placed them at the checkpoint
    bytes: int
    fill_s: float
    kept: bool = False  # the checkpoint's own arena files, left in node memory (adopt)
    linkable: bool = False  # made with O_TMPFILE, never named: a preemption may link them

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def one_numa_node() -> bool:
    try:
        return NUMA_ONLINE.read_text().strip() in ("0", "")
    except OSError:
        return True  # no NUMA in sysfs: one node


def usable(rec: dict) -> str | None:
    """Why the arena of this image record (one with GPU data) cannot be filled ahead
    here; None: it can."""
    if not rec.get("arena_segments") or not rec.get("arena_dir"):
        return "the image does not record its arena's segments"
    if not os.path.isdir(rec["arena_dir"]):
        return f"the arena's directory {rec['arena_dir']} is not here"
    if not one_numa_node():
        return "this node has several NUMA nodes: the shim places the arena by its GPU"
    return None


def _nameless_file(directory: str, size: int) -> tuple[int, bool]:
    """A file of `size` bytes in directory that no name leads to: gone with its last
    descriptor and mapping, however the restore ends; and whether it was made with
    O_TMPFILE (a name may still be given to it: a preemption's link, no copy)."""
    try:
        fd, linkable = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600), True
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise Unavailable(f"cannot make a file in {directory}: {e.strerror}") from e
        fd, name = tempfile.mkstemp(prefix="gpucr-arena-fill-", dir=directory)
        os.unlink(name)
        linkable = False
    try:
        os.ftruncate(fd, size)
    except OSError as e:
        os.close(fd)
        raise Unavailable(f"cannot size a file in {directory}: {e.strerror}") from e
    return fd, linkable


def _fault_in(addrs: list[int], sizes: list[int]) -> None:
    """Every page of the mappings, by several threads; Unavailable when the kernel or
    the file system cannot give them (then nothing was copied yet)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    slices = [(a + k, min(FAULT_SLICE, n - k)) for a, n in zip(addrs, sizes) for k in range(0, n, FAULT_SLICE)]

    def one(piece: tuple[int, int]) -> None:
        if libc.madvise(piece[0], piece[1], MADV_POPULATE_WRITE) != 0:
            err = ctypes.get_errno()
            raise Unavailable(f"cannot fault the arena's pages in: {os.strerror(err)}")

    with ThreadPoolExecutor(max_workers=FAULT_WORKERS) as ex:
        for f in [ex.submit(one, p) for p in slices]:
            f.result()


def fill(h5: Path, segments: list[tuple[int, int]], directory: str, cancelled: threading.Event,
         digests: list[str] | None = None, block_bytes: int = image_store.HASH_BLOCK) -> Filled:
    """One process's arena: a file per segment (address, size), the .h5 file's
    allocations copied in at their checkpoint placements. The descriptors come in
    the order of `segments`, the shim's (arena_attach maps the k-th to its k-th
    segment), which need not be the order of their addresses."""
    t0 = time.monotonic()
    blobs = [b for b, _ in gpu_data.placed_blobs(h5)]
    sizes = [n for _, n in segments]
    by_address = sorted(range(len(segments)), key=lambda k: segments[k][0])
    bases = [segments[k][0] for k in by_address]
    fds: list[int] = []
    maps: list[mmap.mmap] = []
    linkable = True
    try:
        for size in sizes:
            fd, tmpfile = _nameless_file(directory, size)
            fds.append(fd)
            linkable &= tmpfile
            maps.append(mmap.mmap(fds[-1], size))
        addrs = []
        for mm in maps:
            view = np.frombuffer(mm, dtype=np.uint8)
            addrs.append(view.ctypes.data)
            del view  # no buffer exported, so that mm can close
        _fault_in(addrs, sizes)

        def put(ours: int, host: int, n: int) -> None:
            if cancelled.is_set():
                raise Unavailable("the restore ended before the arena was filled")
            j = bisect.bisect_right(bases, host) - 1
            i = by_address[j] if j >= 0 else -1
            if i < 0 or host + n > bases[j] + sizes[i]:
                raise ValueError(f"allocation bytes at {host:#x} lie outside the arena's segments")
            ctypes.memmove(addrs[i] + host - bases[j], ours, n)

        cpus = len(os.sched_getaffinity(0))
        rep = gpu_data.load_arena(h5, blobs, put, "the arena filled ahead", block_digests=digests,
                                  block_bytes=block_bytes,
                                  workers=min(gpu_data.MEMORY_WORKERS, max(2, cpus - SPARE_CPUS)))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        for mm in maps:
            mm.close()  # the pages stay in the files
    return Filled(fds=fds, blobs=blobs, bytes=rep["bytes"], fill_s=time.monotonic() - t0, linkable=linkable)


def adopt(image_dir: Path, entry: dict, segments: list[tuple[int, int]]) -> Filled:
    """The arena a checkpoint left in node memory as its own files (store/files.py):
    opened, not copied; they hold the data at the shim's placements already. A file
    that does not match the segments the image records is a ValueError."""
    t0 = time.monotonic()
    parts = image_store.arena_parts(entry)
    if [(a, n) for _, a, n in parts] != [(int(a), int(n)) for a, n in segments]:
        raise ValueError("the arena's files in node memory are not the segments the image records")
    blobs = [b for b, _ in gpu_data.placed_blobs(image_dir / entry["arena"]["layout"])]
    for b in blobs:
        if b.size and not any(a <= b.host and b.host + b.size <= a + n for _, a, n in parts):
            raise ValueError(f"allocation bytes at {b.host:#x} lie outside the arena's segments")
    fds: list[int] = []
    try:
        for name, _, size in parts:
            fds.append(os.open(image_dir / name, os.O_RDWR | os.O_CLOEXEC))
            if os.fstat(fds[-1]).st_size != size:
                raise ValueError(f"{image_dir / name} is not of its segment's {size} bytes")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return Filled(fds=fds, blobs=blobs, bytes=sum(b.size for b in blobs), fill_s=time.monotonic() - t0, kept=True)


class ArenaFill:
    """The fills of an image's GPU processes, started at once, each in its thread;
    `take` waits for one, `close` ends what is left (a restore that failed)."""

    def __init__(self, m: dict, image_dir: Path, check: bool):
        self.skipped: dict[int, str] = {}  # image PID -> why its arena was not filled ahead
        self._cancelled = threading.Event()
        self._futures: dict[int, Future] = {}
        checked = image_store.gpu_data_files(m) if check else frozenset()
        wanted, staged = [], []
        for rec in m.get("gpu_processes") or []:
            if not rec.get("h5"):
                continue  # no GPU data: no arena to fill
            if ((m.get("files") or {}).get(rec["h5"]) or {}).get("arena"):
                staged.append(rec)  # the arena's own files, left in node memory: nothing to fill
                continue
            why = usable(rec)
            if why:
                self.skipped[image_pid(rec)] = why
            else:
                wanted.append(rec)
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(wanted) + len(staged)),
                                        thread_name_prefix="gpucr-fill")
        for rec in staged:
            self._futures[image_pid(rec)] = self._pool.submit(
                adopt, image_dir, m["files"][rec["h5"]], [tuple(s) for s in rec.get("arena_segments") or ()])
        for rec in wanted:
            digests, block = (image_store.block_checksums(m, rec["h5"]) if rec["h5"] in checked
                              else (None, image_store.HASH_BLOCK))
            self._futures[image_pid(rec)] = self._pool.submit(
                fill, image_dir / rec["h5"], [tuple(s) for s in rec["arena_segments"]], rec["arena_dir"],
                self._cancelled, digests, block)

    def take(self, image_pid: int) -> Filled | None:
        """The filled arena of that process, once done; None where it was not filled
        ahead (the reason is in `skipped`). A data error is raised."""
        fut = self._futures.pop(image_pid, None)
        if fut is None:
            return None
        try:
            return fut.result()
        except Unavailable as e:
            self.skipped[image_pid] = str(e)
            return None

    def close(self) -> None:
        self._cancelled.set()
        for fut in self._futures.values():
            try:
                fut.result().close()
            except Exception:
                pass  # its error is moot: the restore did not get that far
        self._futures.clear()
        self._pool.shutdown(wait=True)
