"""What /proc says of a process's open files."""

from __future__ import annotations

import os


def fd_targets(pid: int) -> list[str]:
    """What each open fd of pid points at (`/dev/nvidia0`, `socket:[123]`, a path)."""
    out: list[str] = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for n in names:
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{n}"))
        except OSError:
            continue
    return out


def socket_inodes(pid: int) -> set[int]:
    """The inode numbers of the sockets pid holds open (none when /proc is not readable)."""
    return {int(t[8:-1]) for t in fd_targets(pid) if t.startswith("socket:[")}
