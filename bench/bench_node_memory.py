#!/usr/bin/env python3
"""How fast a process's memory goes into node memory (the staging tier), and why.

The staged checkpoint copies the GPU data from the process's arena into a file
in a tmpfs (store/gpu_data.save_process, hashed=False: process_vm_readv into
the mapped file, several threads). On the H100 machine that copy ran at about
4 GB/s, far below the memory bus. This measures, side by side in one run, the
same copy (from this process's own memory, pre-faulted, by process_vm_readv
into a mapped file, COPY_CHUNK pieces) into:

  fresh        a new file on /dev/shm: every page is allocated and zeroed as
               the copy first touches it (what a staged preempt pays today);
  huge         a new file on a tmpfs mounted here with huge=always (2 MiB pages);
  allocated    a file on /dev/shm whose pages were allocated before the clock
               starts (fallocate): what a stage reserved ahead would pay;
  mapped       the same, also mapped before (MAP_POPULATE): no fault left;
  anon         pre-faulted anonymous memory: the copy alone, the floor;

each with 4 and 16 threads, and fallocate's own rate (the allocation alone).
JSON to --out. As root (the huge mount):

    python3 bench/bench_node_memory.py --gib 8 --out bench/results/node-memory-DATE.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common.record import utc_now, write_record

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpucr_hpc.store import gpu_data  # noqa: E402


def copy_into(dst_addr: int, src_addr: int, size: int, threads: int) -> float:
    """Seconds to copy size bytes from src_addr to dst_addr (both in this process)
    with process_vm_readv, as the staged save does, `threads` at a time."""
    chunk = gpu_data.COPY_CHUNK
    pieces = [(off, min(chunk, size - off)) for off in range(0, size, chunk)]

    def one(_buf, piece) -> int:
        off, n = piece
        gpu_data._vm_copy_at(os.getpid(), dst_addr + off, src_addr + off, n, write=False)
        return n

    t0 = time.monotonic()
    gpu_data._in_threads(pieces, threads, 0, one)
    return time.monotonic() - t0


def address(m: mmap.mmap) -> int:
    """The mapping's address, with no buffer left exported (so that it can close)."""
    view = np.frombuffer(m, dtype=np.uint8)
    addr = view.ctypes.data
    del view
    return addr


def into_file(folder: Path, size: int, src_addr: int, threads: int, allocate: bool, populate: bool = False) -> dict:
    fd, name = tempfile.mkstemp(dir=folder, prefix="gpucr-bench-")
    try:
        os.ftruncate(fd, size)
        alloc_s = None
        if allocate:
            t = time.monotonic()
            os.posix_fallocate(fd, 0, size)
            alloc_s = time.monotonic() - t
        t = time.monotonic()
        m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0))
        map_s = time.monotonic() - t
        s = copy_into(address(m), src_addr, size, threads)
        m.close()
    finally:
        os.close(fd)
        os.unlink(name)
    out = {"GBps": round(size / s / 1e9, 2), "s": round(s, 3)}
    if alloc_s is not None:
        out["fallocate_GBps"] = round(size / alloc_s / 1e9, 2)
    if populate:
        out["populate_GBps"] = round(size / map_s / 1e9, 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--threads", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    size = int(args.gib * 2**30)
    src = mmap.mmap(-1, size)
    for off in range(0, size, 1 << 20):  # pre-faulted and not zero pages
        src[off:off + 8] = off.to_bytes(8, "little")
    src_addr = address(src)
    huge = Path(tempfile.mkdtemp(prefix="gpucr-bench-huge-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"huge=always,size={int(args.gib) + 2}G", "none",
                              str(huge)], capture_output=True).returncode == 0
    records = []
    try:
        for threads in args.threads:
            rec: dict = {"threads": threads}
            rec["fresh"] = into_file(Path("/dev/shm"), size, src_addr, threads, allocate=False)
            if mounted:
                rec["huge"] = into_file(huge, size, src_addr, threads, allocate=False)
            rec["allocated"] = into_file(Path("/dev/shm"), size, src_addr, threads, allocate=True)
            rec["mapped"] = into_file(Path("/dev/shm"), size, src_addr, threads, allocate=True, populate=True)
            anon = mmap.mmap(-1, size)
            anon_addr = address(anon)
            copy_into(anon_addr, src_addr, size, threads)  # faulted in
            s = copy_into(anon_addr, src_addr, size, threads)
            rec["anon"] = {"GBps": round(size / s / 1e9, 2), "s": round(s, 3)}
            records.append(rec)
            print(json.dumps(rec), flush=True)
    finally:
        if mounted:
            subprocess.run(["umount", str(huge)], capture_output=True)
        huge.rmdir()
    thp = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    doc = {"date": utc_now(),
           "machine": platform.node(), "cpus": os.cpu_count(), "gib": args.gib,
           "shmem_thp": thp.read_text().strip() if thp.exists() else None, "huge_mounted": mounted,
           "records": records}
    write_record(args.out, doc)
    print(f"saved: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
