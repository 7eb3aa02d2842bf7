"""GPU buffers of one process as an HDF5 file (h5py), readable with h5dump/h5ls.

One dataset per GPU allocation, named `alloc-<va in hex>`, 1-D uint8 of the
allocation's size, with attributes `va` (virtual address the shim maps it back
to), `size` and `device` (ordinal at checkpoint time; the device's UUID is in
the file attribute `device_uuids`). Datasets are contiguous and unfiltered, so
writing and reading run at file system speed.

`save_process` / `load_process` move the host arena of a live, checkpointed
process (shim) to and from such a file; datasets written that way also carry
`handle` (the shim's id of the allocation, matched on restore) and `host`
(its address in the arena), and are named `handle-<id>` when not mapped whole.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import hashlib
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import h5py
import numpy as np

from gpucr_hpc import config
from gpucr_hpc.shim.protocol import Blob
from gpucr_hpc.store import writeback
from gpucr_hpc.store.mounts import in_node_memory

GROUP = "allocations"


@dataclass
class Buffer:
    va: int
    size: int
    device: int
    data: object  # bytes-like or numpy uint8 array of `size` bytes


def _dataset_name(va: int) -> str:
    return f"alloc-{va:016x}"


def write(path: Path, buffers: Iterable[Buffer], *, attrs: dict | None = None) -> int:
    """Write buffers to a new HDF5 file; returns the number of payload bytes."""
    total = 0
    with h5py.File(path, "w-", libver="latest") as f:
        for k, v in (attrs or {}).items():
            f.attrs[k] = v
        g = f.create_group(GROUP)
        for b in buffers:
            if isinstance(b.data, np.ndarray):
                arr = b.data.view(np.uint8).reshape(-1)
            else:
                arr = np.frombuffer(b.data, dtype=np.uint8)  # type: ignore[call-overload]  # any buffer
            if arr.size != b.size:
                raise ValueError(f"buffer at {b.va:#x}: {arr.size} bytes, expected {b.size}")
            ds = g.create_dataset(_dataset_name(b.va), shape=(b.size,), dtype=np.uint8)
            if b.size:
                ds.write_direct(np.ascontiguousarray(arr))
            ds.attrs["va"] = np.uint64(b.va)
            ds.attrs["size"] = np.uint64(b.size)
            ds.attrs["device"] = np.int32(b.device)
            total += b.size
    return total


def list_buffers(path: Path) -> list[tuple[int, int, int]]:
    """(va, size, device) of every allocation in the file, by address."""
    with h5py.File(path, "r") as f:
        out = [(int(ds.attrs["va"]), int(ds.attrs["size"]), int(ds.attrs["device"]))
               for ds in f[GROUP].values()]
    return sorted(out)


def read(path: Path) -> Iterable[Buffer]:
    """Yield every buffer with its data as a numpy uint8 array."""
    with h5py.File(path, "r") as f:
        for name in sorted(f[GROUP]):
            ds = f[GROUP][name]
            size = int(ds.attrs["size"])
            arr = np.empty(size, dtype=np.uint8)
            if size:
                ds.read_direct(arr)
            yield Buffer(va=int(ds.attrs["va"]), size=size, device=int(ds.attrs["device"]), data=arr)


def read_into(path: Path, va: int, out) -> None:
    """Read one allocation straight into a writable buffer (e.g. the shim's host arena)."""
    with h5py.File(path, "r") as f:
        ds = f[GROUP][_dataset_name(va)]
        arr = np.frombuffer(out, dtype=np.uint8)
        if arr.size != ds.shape[0]:
            raise ValueError(f"allocation {va:#x}: {ds.shape[0]} bytes, target holds {arr.size}")
        if arr.size:
            ds.read_direct(arr)


def string_array(values: list[str]) -> np.ndarray:
    """A list of strings as an HDF5 attribute value (variable-length UTF-8)."""
    return np.array(values, dtype=h5py.string_dtype())


def file_attrs(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in f.attrs.items()}


# -- a live process's arena <-> one HDF5 file ------------------------------------
#
# A whole-process image saves the shim's arena (where the GPU data of a
# checkpointed process lies) straight from the process's memory: the file's
# layout is made first with h5py (contiguous datasets, storage allocated, no
# fill), then the bytes are copied between the process (process_vm_readv /
# process_vm_writev: the same permission CRIU needs) and the datasets' file
# offsets, in large pieces, by several threads.

COPY_CHUNK = 64 << 20
COPY_WORKERS = 4
# A checked load's worker reads a block, then hashes and copies it with no read
# in flight: 8 keep the disk busy (4 left it idle ~30 % of the time on the H100
# machine: 0.75 of the file system's read rate).
LOAD_WORKERS = 8
# GPUCR_LOAD_DIRECT=1: the checked load reads with O_DIRECT where the file system
# allows it (no page cache copy). Off by default: on the H100 machine's virtual
# disk, 8 threads read 0.76 of the file system's rate so and 0.90 through the
# page cache, side by side (bench/results/image-read-h100-8g-run1.json); parallel
# file systems may differ. Read at each load (config).
DIRECT_ALIGN = 4096
ALIGN = 1 << 20
# A file in node memory (a job's staging tier) is mapped, and the process's bytes
# go straight between its pages and the process: one copy instead of two, and
# more threads, as no disk is waited on. Unhashed: the drain checksums it.
MEMORY_WORKERS = 16


def _blob_name(b: Blob) -> str:
    return _dataset_name(b.va) if b.va else f"handle-{b.handle:016x}"


def _create_layout(path: Path, blobs: list[Blob], attrs: dict) -> list[int | None]:
    """A new HDF5 file with one allocated, unfilled dataset per blob; their file offsets."""
    offsets = []
    try:
        f = h5py.File(path, "w-", libver="latest", alignment_threshold=ALIGN, alignment_interval=ALIGN)
    except TypeError:  # h5py < 3.5
        f = h5py.File(path, "w-", libver="latest")
    with f:
        for k, v in attrs.items():
            f.attrs[k] = v
        g = f.create_group(GROUP)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.CONTIGUOUS)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        for b in blobs:
            ds = g.create_dataset(_blob_name(b), shape=(b.size,), dtype=np.uint8, dcpl=dcpl)
            for k, v in (("va", b.va), ("size", b.size), ("handle", b.handle), ("host", b.host)):
                ds.attrs[k] = np.uint64(v)
            ds.attrs["device"] = np.int32(b.device)
            offsets.append(ds.id.get_offset() if b.size else None)
    return offsets


def _layout(path: Path) -> dict[int, tuple[int, int | None]]:
    """handle -> (size, file offset) of every dataset of a file written by save_process."""
    return {b.handle: (b.size, off) for b, off in placed_blobs(path)}


def placed_blobs(path: Path) -> list[tuple[Blob, int | None]]:
    """Each allocation of a file written by save_process, as the shim placed it in its
    arena at the checkpoint (`host`), with its dataset's file offset (None: no bytes)."""
    out = []
    with h5py.File(path, "r") as f:
        for ds in f[GROUP].values():
            size = int(ds.attrs["size"])
            blob = Blob(handle=int(ds.attrs["handle"]), va=int(ds.attrs["va"]), size=size,
                        device=int(ds.attrs["device"]), host=int(ds.attrs["host"]))
            out.append((blob, ds.id.get_offset() if size else None))
    return sorted(out, key=lambda p: p[0].handle)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("process_vm_readv", "process_vm_writev"):
            fn = getattr(libc, name)
            fn.restype = ctypes.c_ssize_t
            fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                           ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
        _LIBC = libc
    return _LIBC


def _vm_copy_at(pid: int, base: int, remote: int, n: int, write: bool) -> None:
    """n bytes between our address `base` and the process's address `remote` (ctypes
    drops the GIL)."""
    fn = _libc().process_vm_writev if write else _libc().process_vm_readv
    done = 0
    while done < n:
        lv = _Iovec(base + done, n - done)
        rv = _Iovec(remote + done, n - done)
        got = fn(pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise OSError(err or errno.EIO, f"process_vm_{'writev' if write else 'readv'} of process "
                                            f"{pid} at {remote + done:#x}: {os.strerror(err or errno.EIO)}")
        done += got


# Where loaded bytes go: put(our address, arena address, n) writes n bytes from our
# address to that address of the arena (a process's, or its files filled ahead).
Put = Callable[[int, int, int], None]


def into_process(pid: int) -> Put:
    """Into process pid's arena, at the addresses the blobs have there."""
    return lambda ours, host, n: _vm_copy_at(pid, ours, host, n, write=True)


def _in_threads(items, workers: int, buf_bytes: int, one) -> int:
    """one(buf, item) for each item, `workers` threads taking the items in order, each
    with its own buffer of buf_bytes (ctypes, os.pread/pwrite and hashlib release the
    GIL); returns the sum of what `one` returned. The first error stops all and is raised."""
    items = iter(items)
    lock = threading.Lock()
    failed = threading.Event()

    def worker() -> int:
        # page-aligned (an anonymous mapping), as O_DIRECT reads need; none for buf_bytes 0
        buf = np.frombuffer(mmap.mmap(-1, buf_bytes), dtype=np.uint8) if buf_bytes else None
        done = 0
        while not failed.is_set():
            with lock:
                item = next(items, None)
            if item is None:
                break
            try:
                done += one(buf, item)
            except BaseException:
                failed.set()
                raise
        return done

    with ThreadPoolExecutor(max_workers=workers) as ex:
        futures = [ex.submit(worker) for _ in range(workers)]
        return sum(f.result() for f in futures)


def _copy(jobs, read_into, write_from, workers: int = COPY_WORKERS) -> int:
    """Copy (src_off, dst_off, size) jobs in COPY_CHUNK pieces, each read into a
    worker's buffer and written out from it."""
    pieces = [(src + off, dst + off, min(COPY_CHUNK, size - off))
              for src, dst, size in jobs for off in range(0, size, COPY_CHUNK)]

    def one(buf, piece) -> int:
        src, dst, n = piece
        read_into(buf, src, n)
        write_from(buf, dst, n)
        return n

    return _in_threads(pieces, workers, COPY_CHUNK, one)


def _pread_all(fd: int, buf: np.ndarray, off: int, n: int) -> None:
    view = buf.data[:n]
    while view:
        got = os.preadv(fd, [view], off)
        if got <= 0:
            raise OSError(errno.EIO, f"short read at offset {off}")
        view, off = view[got:], off + got


def _pread_direct(fd: int, buf: np.ndarray, off: int, n: int) -> None:
    """_pread_all on an O_DIRECT descriptor: off is aligned, the length is rounded up
    to DIRECT_ALIGN (buf has room: n is a whole piece, or the file's last one)."""
    want = -(-n // DIRECT_ALIGN) * DIRECT_ALIGN
    done = 0
    while done < n:
        got = os.preadv(fd, [buf.data[done:want]], off + done)
        if got <= 0:
            raise OSError(errno.EIO, f"short read at offset {off + done}")
        done += got


def _open_direct(path: Path) -> int | None:
    """An O_DIRECT descriptor of path, or None where its file system refuses one."""
    if not (config.value("GPUCR_LOAD_DIRECT") and hasattr(os, "O_DIRECT")):
        return None
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise


def _pwrite_all(fd: int, buf: np.ndarray, off: int, n: int) -> None:
    view = buf.data[:n]
    while view:
        got = os.pwrite(fd, view, off)
        view, off = view[got:], off + got


def _payload(blobs: list[Blob], offsets: list[int | None]) -> list[tuple[int, int, int]]:
    """(file offset, size, address in the process) of each blob's bytes, in file order."""
    # every blob with bytes has an offset (the writer placed it)
    return sorted((cast(int, off), b.size, b.host) for b, off in zip(blobs, offsets) if b.size)


def _payload_of(jobs) -> list[tuple[int, int, int]]:
    """load_process's (file offset, address, size) jobs as _payload orders them."""
    return sorted((off, size, host) for off, host, size in jobs)


def _overlaps(payload, start: int, end: int):
    """(lo, hi, address of lo in the process) of each payload piece inside the file
    range [start, end), in file order; payload as _payload makes it (sorted, disjoint)."""
    first = max(0, bisect.bisect_right(payload, start, key=lambda p: p[0]) - 1)
    for off, size, host in payload[first:]:
        if off >= end:
            break
        lo, hi = max(off, start), min(off + size, end)
        if lo < hi:
            yield lo, hi, host + lo - off


# Where saved bytes come from: get(our address, arena address, n) reads n bytes of
# the arena at that address (a live process's, or its files in node memory).
Get = Callable[[int, int, int], None]


def from_process(pid: int) -> Get:
    return lambda ours, host, n: _vm_copy_at(pid, ours, host, n, write=False)


def _fill(fd: int, get: Get, buf: np.ndarray, start: int, n: int, payload) -> list[tuple[int, int]]:
    """buf[:n] = bytes [start, start + n) of the file as it will be: the blobs' bytes from
    the arena, the rest (HDF5 metadata, alignment gaps) from the file `fd`. Returns
    the (buffer offset, size) pieces that came from the arena: those still to be written."""
    pos, end, parts = start, start + n, []
    for lo, hi, addr in _overlaps(payload, start, end):
        if lo > pos:
            _pread_all(fd, buf[pos - start:], pos, lo - pos)
        get(buf[lo - start:].ctypes.data, addr, hi - lo)
        parts.append((lo - start, hi - lo))
        pos = hi
    if pos < end:
        _pread_all(fd, buf[pos - start:], pos, end - pos)
    return parts


def _by_blocks(size: int, block_bytes: int, workers: int, chunk) -> tuple[int, list[str]]:
    """Every `block_bytes` block of a `size`-byte file, `workers` threads each taking
    whole blocks in file order: chunk(buf, start, n) is called for each COPY_CHUNK
    piece [start, start + n) of the block and returns the payload bytes it moved,
    with buf[:n] then holding the file's bytes there, which are hashed. Returns the
    bytes moved and the sha256 of each block; the first error stops all and is raised."""
    digests: list[str] = [""] * ((size + block_bytes - 1) // block_bytes)

    def one(buf, i: int) -> int:
        h = hashlib.sha256()
        done = 0
        for start in range(i * block_bytes, min(size, (i + 1) * block_bytes), buf.size):
            n = min(buf.size, size - start, (i + 1) * block_bytes - start)
            done += chunk(buf, start, n)
            h.update(buf.data[:n])
        digests[i] = h.hexdigest()
        return done

    return _in_threads(range(len(digests)), workers, min(COPY_CHUNK, block_bytes), one), digests


def save_process(path: Path, pid: int, blobs: list[Blob], *, attrs: dict | None = None,
                 block_bytes: int = 64 << 20, hashed: bool = True) -> dict:
    """Write the blobs of process `pid`'s arena to a new HDF5 file, fsync'd, with the
    sha256 of each `block_bytes` block of the file (image_store's per-block checksums).

    Each worker takes whole blocks: it reads a block's bytes from the process (and
    the file's own metadata from the file), hashes them, writes them and hands them
    to the disk at once, so hashing runs beside the disk instead of after it and the
    final fsync waits for little. Returns bytes, file size, the block digests
    (`checksum`) and seconds of each part. hashed=False (a file in node memory,
    checksummed later by the drain): the file is mapped and filled straight from
    the process, with no digests (`checksum` None)."""
    t0 = time.monotonic()
    offsets = _create_layout(path, blobs, {"pid": pid, **(attrs or {})})
    t1 = time.monotonic()
    payload = _payload(blobs, offsets)
    if not hashed:
        total, size = _mapped(path, payload, lambda ours, host, n: _vm_copy_at(pid, ours, host, n, write=False),
                              writable=True)
        return {"bytes": total, "allocations": len(blobs), "file_size": size, "checksum": None,
                "block_bytes": block_bytes, "layout_s": t1 - t0, "copy_s": time.monotonic() - t1, "fsync_s": 0.0}
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size

        def chunk(buf, start: int, n: int) -> int:
            parts = _fill(fd, from_process(pid), buf, start, n, payload)
            for off, k in parts:
                _pwrite_all(fd, buf[off:], start + off, k)
            writeback.start(fd, start, n)
            return sum(k for _, k in parts)

        total, digests = _by_blocks(size, block_bytes, COPY_WORKERS, chunk)
        t2 = time.monotonic()
        os.fsync(fd)
        if os.fstat(fd).st_size != size:
            raise OSError(errno.EIO, f"{path} changed size while it was written")
    finally:
        os.close(fd)
    t3 = time.monotonic()
    return {"bytes": total, "allocations": len(blobs), "file_size": size, "checksum": digests,
            "block_bytes": block_bytes, "layout_s": t1 - t0, "copy_s": t2 - t1, "fsync_s": t3 - t2}


def save_layout(path: Path, pid: int, blobs: list[Blob], *, attrs: dict | None = None) -> dict:
    """The HDF5 file save_process would write, without the blobs' bytes: its metadata,
    with a hole where each blob goes (no memory, in node memory). What a checkpoint
    stages when the arena's own files hold the bytes (`compose` joins the two)."""
    t0 = time.monotonic()
    _create_layout(path, blobs, {"pid": pid, **(attrs or {})})
    return {"bytes": sum(b.size for b in blobs), "allocations": len(blobs), "file_size": path.stat().st_size,
            "checksum": None, "layout_s": time.monotonic() - t0, "copy_s": 0.0, "fsync_s": 0.0}


def compose(layout: Path, segments: list[tuple[Path, int, int]], dest: Path,
            block_bytes: int = 64 << 20) -> tuple[int, list[str]]:
    """The file save_process would have written, at the new path dest, fsync'd: the
    metadata of `layout` (save_layout's) and each blob's bytes from the arena's
    files, segments (file, address, size) as the shim had them mapped. Returns its
    size and the sha256 of each block_bytes block. A blob outside the segments, or
    a segment file of another size, is a ValueError, and dest is not left behind."""
    placed = placed_blobs(layout)
    payload = _payload([b for b, _ in placed], [off for _, off in placed])
    maps: list[mmap.mmap] = []
    bases: list[tuple[int, int, int]] = []  # (address, size, our address), by address
    try:
        for path, base, size in segments:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size != size:
                    raise ValueError(f"{path} has {os.fstat(f.fileno()).st_size} bytes, the arena's "
                                     f"segment {size}")
                maps.append(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else mmap.mmap(-1, 1))
            view = np.frombuffer(maps[-1], dtype=np.uint8)
            bases.append((base, size, view.ctypes.data))
            del view  # no buffer exported, so that the mapping can close
        bases.sort()
        starts = [b for b, _, _ in bases]

        def get(ours: int, host: int, n: int) -> None:
            i = bisect.bisect_right(starts, host) - 1
            if i < 0 or host + n > bases[i][0] + bases[i][1]:
                raise ValueError(f"allocation bytes at {host:#x} lie outside the arena's segments")
            ctypes.memmove(ours, bases[i][2] + host - bases[i][0], n)

        meta = os.open(layout, os.O_RDONLY)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(meta).st_size
            os.ftruncate(fd, size)

            def chunk(buf, start: int, n: int) -> int:
                _fill(meta, get, buf, start, n, payload)
                _pwrite_all(fd, buf, start, n)
                writeback.start(fd, start, n)
                return n

            _, digests = _by_blocks(size, block_bytes, COPY_WORKERS, chunk)
            os.fsync(fd)
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
            os.close(meta)
    finally:
        for mm in maps:
            mm.close()
    return size, digests


def _mapped(path: Path, payload, move, writable: bool, workers: int = MEMORY_WORKERS) -> tuple[int, int]:
    """The payload's bytes between the file, mapped, and an arena: move(address in the
    mapping, arena address, n) for each COPY_CHUNK piece, by `workers` threads;
    writable: the arena's bytes go into the file, whose size is fixed already (its
    layout is made). Returns the bytes moved and the file's size."""
    pieces = [(off + k, host + k, min(COPY_CHUNK, size - k))
              for off, size, host in payload for k in range(0, size, COPY_CHUNK)]
    with open(path, "r+b" if writable else "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not pieces:
            return 0, size
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    view = np.frombuffer(mm, dtype=np.uint8)
    base = view.ctypes.data  # the mapping's address: mm stays open until the copy is done
    del view  # no buffer exported, so that mm can close

    def one(_buf, piece) -> int:
        off, addr, n = piece
        move(base + off, addr, n)
        return n

    try:
        return _in_threads(pieces, workers, 0, one), size
    finally:
        mm.close()


def load_process(path: Path, pid: int, blobs: list[Blob], *, block_digests: list[str] | None = None,
                 block_bytes: int = 64 << 20) -> dict:
    """Copy a file written by save_process into process `pid`'s arena at the blobs' addresses.

    The blobs are what the restored shim reports; each must be in the file with
    its size (matched by handle), else ValueError and nothing is written.
    block_digests: the file's per-block sha256 (save_process's `checksum`): each
    block is checked as it is read, so the file is read from the disk once, not
    once to check it and again to load it; a mismatch is a ValueError, and the
    process, whose arena now holds bad bytes, must not run on. Unchecked, a file in
    node memory is mapped and copied straight into the process (`mapped`)."""
    return load_arena(path, blobs, into_process(pid), f"process {pid}",
                      block_digests=block_digests, block_bytes=block_bytes)


def load_arena(path: Path, blobs: list[Blob], put: Put, whose: str, *,
               block_digests: list[str] | None = None, block_bytes: int = 64 << 20,
               workers: int = MEMORY_WORKERS) -> dict:
    """load_process into any arena: `put` writes the bytes there, `whose` names it;
    workers: threads of a copy from node memory."""
    layout = _layout(path)
    jobs = []
    for b in blobs:
        if b.handle not in layout:
            raise ValueError(f"allocation {b.handle:#x} ({b.size} bytes) of {whose} is not in {path}")
        size, off = layout[b.handle]
        if size != b.size:
            raise ValueError(f"allocation {b.handle:#x}: {size} bytes in {path}, {whose} has {b.size}")
        if size:
            jobs.append((off, b.host, size))
    if len(layout) != len(blobs):
        raise ValueError(f"{path} holds {len(layout)} allocations, {whose} has {len(blobs)}")
    t0 = time.monotonic()
    if block_digests is None and in_node_memory(path):
        total, _ = _mapped(path, _payload_of(jobs), put, writable=False, workers=workers)
        return {"bytes": total, "allocations": len(blobs), "copy_s": time.monotonic() - t0,
                "checked": False, "direct": False, "mapped": True}
    fd = os.open(path, os.O_RDONLY)
    try:
        direct = False
        if block_digests is None:
            total = _copy(jobs, lambda buf, src, n: _pread_all(fd, buf, src, n),
                          lambda buf, dst, n: put(buf.ctypes.data, dst, n))
        else:
            total, direct = _load_checked(fd, path, put, jobs, block_digests, block_bytes)
    finally:
        os.close(fd)
    return {"bytes": total, "allocations": len(blobs), "copy_s": time.monotonic() - t0,
            "checked": block_digests is not None, "direct": direct}


def _load_checked(fd: int, path: Path, put: Put, jobs, digests: list[str], block_bytes: int) -> tuple[int, bool]:
    """load_process with each block of the file hashed as it is read: the file's
    every byte (metadata included) is read, the payload parts go into the process,
    and each block's sha256 must be its digest. Returns the payload bytes and
    whether the reads bypassed the page cache (O_DIRECT)."""
    size = os.fstat(fd).st_size
    if len(digests) != (size + block_bytes - 1) // block_bytes:
        raise ValueError(f"{path} has {size} bytes, its checksums are for another size (truncated or corrupt)")
    payload = _payload_of(jobs)
    aligned = block_bytes % DIRECT_ALIGN == 0 and min(COPY_CHUNK, block_bytes) % DIRECT_ALIGN == 0
    dfd = _open_direct(path) if aligned else None
    cached = threading.Event()  # some read went through the page cache after all

    def read(buf, start: int, n: int) -> None:
        if dfd is not None and not cached.is_set():
            try:
                return _pread_direct(dfd, buf, start, n)
            except OSError as e:  # a file system that took the flag but not the read
                if e.errno != errno.EINVAL:
                    raise
                cached.set()
        _pread_all(fd, buf, start, n)

    def chunk(buf, start: int, n: int) -> int:
        read(buf, start, n)
        moved = 0
        for lo, hi, addr in _overlaps(payload, start, start + n):
            put(buf.ctypes.data + lo - start, addr, hi - lo)
            moved += hi - lo
        return moved

    try:
        total, got = _by_blocks(size, block_bytes, LOAD_WORKERS, chunk)
    finally:
        if dfd is not None:
            os.close(dfd)
    bad = next((i for i, (g, w) in enumerate(zip(got, digests)) if g != w), None)
    if bad is not None:
        raise ValueError(f"checksum mismatch in {path.name}, block {bad} (corrupt image)")
    return total, dfd is not None and not cached.is_set()
