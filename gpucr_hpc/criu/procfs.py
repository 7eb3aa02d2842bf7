"""What /proc says of a process's open files and sockets."""

from __future__ import annotations

import os

from gpucr_hpc.tcp import end as tcp_end

ESTABLISHED, LISTEN = "01", "0A"  # /proc/net/tcp states


def is_open(fd: int) -> bool:
    """Whether this process has descriptor fd open."""
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


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


def tcp_sockets(pid: int | str = "self") -> list[tuple[str, str, str, int]]:
    """The TCP sockets of pid's network namespace: (local, remote, state, inode)."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{pid}/net/{name}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9:
                out.append((tcp_end.from_proc(f[1]), tcp_end.from_proc(f[2]), f[3], int(f[9])))
    return out
