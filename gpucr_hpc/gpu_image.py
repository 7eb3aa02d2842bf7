"""GPU buffers of one process as an HDF5 file (h5py), readable with h5dump/h5ls.

One dataset per GPU allocation, named `alloc-<va in hex>`, 1-D uint8 of the
allocation's size, with attributes `va` (virtual address the shim maps it back
to), `size` and `device` (ordinal at checkpoint time; the device's UUID is in
the file attribute `device_uuids`). Datasets are contiguous and unfiltered, so
writing and reading run at file system speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import h5py
import numpy as np

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
            arr = np.frombuffer(b.data, dtype=np.uint8) if not isinstance(b.data, np.ndarray) else b.data.view(np.uint8).reshape(-1)
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


def file_attrs(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in f.attrs.items()}
