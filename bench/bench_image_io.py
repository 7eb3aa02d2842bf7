#!/usr/bin/env python3
"""The image store's write and checked read of a GPU image (.h5) against the file
system's own write and read, side by side, in rotating order.

    bench/bench_image_io.py [--dir DIR] [--gib N] [--rounds R] [--loader how:N ...] [--out FILE.json]

This process's own memory stands in for a checkpointed process's arena. Each
round measures, in an order that rotates every round (a virtual disk's rate
drifts from minute to minute, and measuring one thing after the other would
compare minutes):
  fs_write_K        a plain N GiB file written by K streams, fsync'd (fs_rates)
  save              the arena written as an image with gpu_data.save_process
                    (block sha256s, fsync), as a migration's drain writes it
  fs_read[_direct]_K  the plain file read by K streams, page cache dropped,
                    through the page cache or with O_DIRECT
  load_HOW:W        the image read back with its block digests checked
                    (gpu_data.load_process), W threads, through the page
                    cache (cached) or with O_DIRECT (direct)
Each image figure's ratio is against the fastest file system figure of the
same kind in its own round. Prints JSON after every round; no thresholds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from common.machine import gpu_identity  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402
from common.stats import per_key  # noqa: E402
from fs_rates import direct_ok, drop_cache, read_seconds, write_seconds  # noqa: E402

from gpucr_hpc.store import files as image_store  # noqa: E402
from gpucr_hpc.store import gpu_data

LOADERS = ("direct:8", "direct:4", "direct:16", "cached:8")


def _loader(spec: str) -> tuple[bool, int]:
    """'direct:8' -> (O_DIRECT, 8 workers); 'cached:8' reads through the page cache."""
    how, _, workers = spec.partition(":")
    if how not in ("direct", "cached") or not workers.isdigit() or int(workers) < 1:
        raise SystemExit(f"bench_image_io: loader {spec!r} is not direct:N or cached:N")
    return how == "direct", int(workers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loader", action="append", help=f"loader configurations (default {', '.join(LOADERS)})")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    loaders = a.loader or list(LOADERS)
    for spec in loaders:
        _loader(spec)

    out = Path(a.out or f"bench/results/image-io-{platform.node()}.json")
    size = int(a.gib * (1 << 30)) // 4096 * 4096
    root = Path(tempfile.mkdtemp(prefix="gpucr-io-", dir=a.dir))
    arena = np.empty(size, dtype=np.uint8)
    # distinct bytes per 16 MiB without holding a second copy of the whole arena
    pattern = np.random.default_rng(1).integers(0, 256, 16 << 20, dtype=np.uint8)
    for off in range(0, size, pattern.size):
        n = min(pattern.size, size - off)
        arena[off:off + n] = pattern[:n] ^ np.uint8((off >> 24) & 0xFF)
    quarter = size // 4
    blobs = [gpu_data.Blob(handle=i + 1, va=0x7F0000000000 + i * quarter, size=quarter, device=0,
                            host=arena.ctypes.data + i * quarter) for i in range(4)]
    gpu = gpu_identity()  # the machine's GPU and driver where nvidia-smi answers (the GPU itself is not used)
    res: dict = {"date": utc_now(), "host": platform.node(),
                 **{k: gpu[k] for k in ("device", "driver") if k in gpu},
                 "cpus": os.cpu_count(), "dir": str(a.dir), "bytes": size, "rounds": [], "loaders": loaders}
    try:
        image = root / "process-1.h5"
        t = time.perf_counter()
        rep = gpu_data.save_process(image, os.getpid(), blobs, block_bytes=image_store.HASH_BLOCK)
        res["image_write_MBps"] = round(size / (time.perf_counter() - t) / 1e6, 1)
        plain = root / "plain.bin"
        res["fs_write_MBps"] = round(size / write_seconds(plain, size, streams=1) / 1e6, 1)
        fs_kinds = [(k, d) for k in (1, 4) for d in ((False, True) if direct_ok(plain) else (False,))]
        items = [("fs_write", k, None) for k in (1, 4)] + [("save", 0, None)] + \
            [("fs", k, d) for k, d in fs_kinds] + [("load", s, None) for s in loaders]
        print(f"{size / 2**30:.1f} GiB in {a.dir}: image written at {res['image_write_MBps']} MB/s, "
              f"plain file at {res['fs_write_MBps']} MB/s", flush=True)
        for r in range(a.rounds):
            order = items[r % len(items):] + items[:r % len(items)]
            row: dict = {}
            for kind, x, d in order:
                if kind == "fs_write":
                    row[f"fs_write_{x}"] = round(size / write_seconds(plain, size, streams=x) / 1e6, 1)
                elif kind == "save":
                    again = root / "again.h5"
                    t = time.perf_counter()
                    got = gpu_data.save_process(again, os.getpid(), blobs, block_bytes=image_store.HASH_BLOCK)
                    row["save"] = round(got["file_size"] / (time.perf_counter() - t) / 1e6, 1)
                    again.unlink()
                elif kind == "fs":
                    name = f"fs_read_{'direct_' if d else ''}{x}"
                    row[name] = round(size / read_seconds(plain, streams=x, direct=d) / 1e6, 1)
                else:
                    direct, workers = _loader(x)
                    os.environ["GPUCR_LOAD_DIRECT"] = "1" if direct else "0"
                    gpu_data.LOAD_WORKERS = workers
                    drop_cache(image)
                    t = time.perf_counter()
                    got = gpu_data.load_process(image, os.getpid(), blobs, block_digests=rep["checksum"],
                                                 block_bytes=image_store.HASH_BLOCK)
                    el = time.perf_counter() - t
                    if got["direct"] != direct:
                        print(f"note: {x} read {'with' if got['direct'] else 'without'} O_DIRECT", flush=True)
                    row[f"load_{x}"] = round(rep["file_size"] / el / 1e6, 1)
            ref = max(v for k, v in row.items() if k.startswith("fs_read_"))
            row["fs_read_best"] = ref
            row["fs_write_best"] = max(v for k, v in row.items() if k.startswith("fs_write_"))
            row["save_vs_fs"] = round(row["save"] / row["fs_write_best"], 3)
            for x in loaders:
                row[f"load_{x}_vs_fs"] = round(row[f"load_{x}"] / ref, 3)
            res["rounds"].append(row)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
            res["median"] = per_key(res["rounds"])
            res["min"] = per_key(res["rounds"], min)
            write_record(out, res)  # after every round: a run cut short keeps what it measured
        print("median: " + json.dumps(res["median"]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
