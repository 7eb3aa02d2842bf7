"""The root helper's checks on an ordinary user's TCP connections.

Locking flows (nftables) and restoring connections (CRIU's TCP repair) need
CAP_NET_ADMIN; with it unchecked, a user could stall anyone's connections or
send from an address that is not theirs. So the helper:

* locks only flows that are the caller's: a connection a process of theirs
  holds, one their sealed image holds (at its restore), or one their lock of
  that name already drops (a renewal), in a table named after their uid, so
  no user can lock, renew or unlock another's;
* moves only addresses, never ports (criu/tcp.parse_moves), and restores a
  connection only bound to an address of this node (or loopback or the wildcard): a moved image cannot
  send as another host.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from gpucr_hpc.criu import procfs
from gpucr_hpc.criu import tcp as criu_tcp
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.tcp import end as tcp_end
from gpucr_hpc.tcp import lock as netlock

NOT_YOURS_FIX = "lock only the connections of your own job's processes"


def table_name(uid: int, name: str) -> str:
    """The caller's lock `name`, as the helper names it: the caller's alone."""
    if not netlock._NAME.fullmatch(name or ""):
        raise GpucrError(f"bad lock name {name!r}: only letters, digits and _ are allowed",
                         "name the lock after the job, e.g. job123")
    return f"u{uid}_{name}"


def _held_by(uid: int) -> set[netlock.Flow]:
    """The established connections of this network namespace that a process whose
    real uid is `uid` holds."""
    inodes: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry.path).st_uid != uid:
                continue
        except OSError:
            continue
        inodes |= procfs.socket_inodes(int(entry.name))
    return {netlock.Flow(local, remote) for local, remote, state, inode in procfs.tcp_sockets()
            if state == procfs.ESTABLISHED and inode in inodes}


def check_own(flows: list[netlock.Flow], uid: int, table: str) -> None:
    """Raises unless every flow is held by a process of `uid` or already in `table`."""
    theirs = set(netlock.locked(table))
    missing = [f for f in flows if f not in theirs]
    if missing:
        held = _held_by(uid)
        missing = [f for f in missing if f not in held]
    if missing:
        f = missing[0]
        raise GpucrError(f"connection {f.local} -> {f.remote} is not one of yours", NOT_YOURS_FIX)


def image_flows(images: Path) -> set[netlock.Flow]:
    return {netlock.Flow(c.local, c.remote) for c in criu_tcp.connections(images) if not c.listening}


def check_in_image(flows: list[netlock.Flow], images: Path) -> None:
    theirs = image_flows(images)
    for f in flows:
        if f not in theirs:
            raise GpucrError(f"connection {f.local} -> {f.remote} is not one of the image's", NOT_YOURS_FIX)


def _here(addr: tcp_end.Address) -> bool:
    if addr.is_loopback or addr.is_unspecified:
        return True
    family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((str(addr), 0))  # no IP_FREEBIND: only an address of this node binds
        except OSError:
            return False
    return True


def check_sources(images: Path) -> None:
    """Every TCP socket of the images is bound to an address of this node."""
    for c in criu_tcp.connections(images):
        if not _here(tcp_end.parse(c.local)[0]):
            raise GpucrError(f"the image's TCP end {c.local} is not an address of this node",
                             "restore it where that address lives, or let the job's restore move it")
