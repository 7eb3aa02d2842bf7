"""What /proc/self/mountinfo says of a path: the file system it is on, and
whether that is node memory (a staging tier, an arena) rather than a disk."""

from __future__ import annotations

import os
from pathlib import Path

# File systems whose files are pages of the node's memory.
MEMORY_FS = frozenset({"tmpfs", "hugetlbfs", "ramfs"})
# Of those, hugetlbfs takes no write(2) (only mappings): no image can be written there.
UNWRITABLE_FS = frozenset({"hugetlbfs"})


def _mount_of(path: Path | str) -> tuple[str, list[str]]:
    """(file system type, super options) of the deepest mount above `path`."""
    best = ""
    found: tuple[str, list[str]] = ("unknown", [])
    real = os.path.realpath(path)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        mount = left.split()[4].replace("\\040", " ")
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            fields = right.split()
            best, found = mount, (fields[0], fields[2].split(",") if len(fields) > 2 else [])
    return found


def fs_type(path: Path | str) -> str:
    """The type of the file system `path` is on (the deepest mount above it)."""
    return _mount_of(path)[0]


def huge_pages(path: Path | str) -> bool:
    """Whether `path` is on 2 MiB pages: hugetlbfs, or a tmpfs mounted huge=always or
    huge=within_size. A fresh 4 KiB page of a tmpfs costs its allocation at first
    touch, which bounded a staged checkpoint at about 3 GB/s on the H100 machine
    against 25 GB/s on huge pages (bench/results/node-memory-2026-11-27-h100.json)."""
    kind, options = _mount_of(path)
    return kind == "hugetlbfs" or (kind == "tmpfs" and any(o in ("huge=always", "huge=within_size") for o in options))


def in_node_memory(path: Path | str) -> bool:
    return fs_type(path) in MEMORY_FS
