"""What /proc/self/mountinfo says of a path: the file system it is on, and
whether that is node memory (a staging tier, an arena) rather than a disk."""

from __future__ import annotations

import os
from pathlib import Path

# File systems whose files are pages of the node's memory.
MEMORY_FS = frozenset({"tmpfs", "hugetlbfs", "ramfs"})
# Of those, hugetlbfs takes no write(2) (only mappings): no image can be written there.
UNWRITABLE_FS = frozenset({"hugetlbfs"})


def fs_type(path: Path | str) -> str:
    """The type of the file system `path` is on (the deepest mount above it)."""
    best, kind = "", "unknown"
    real = os.path.realpath(path)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        left, _, right = line.partition(" - ")
        mount = left.split()[4].replace("\\040", " ")
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


def in_node_memory(path: Path | str) -> bool:
    return fs_type(path) in MEMORY_FS
