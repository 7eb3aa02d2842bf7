"""Which namespaces the root helper may act in: none a caller made.

A dump of a tree in a PID namespace below ours runs CRIU inside that namespace
and the mount namespace that mounts its /proc (criu/run.enter_pidns_of): CRIU,
its shell and its libraries are then looked up in that mount namespace. So it
must be one root made, and made for this purpose: the namespaces of a tree the
helper restored (`restore --new-pidns`: unshare as root, our pidns_init as the
namespace's init). A process in a user namespace is refused outright: the
helper never makes one, and in one a caller can mount over any path.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpucr_hpc.criu import pidns_init, processes
from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError

FIX = "checkpoint processes that run in no namespace of their own, or in one gpucr-hpc restored them into"


def ns_id(pid: int | str, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def check_user_ns(tree: list[int]) -> None:
    """Every process of the tree in our user namespace (the host's, for sudo's root)."""
    ours = ns_id("self", "user")
    for p in tree:
        try:
            theirs = ns_id(p, "user")
        except OSError:
            continue  # gone: CRIU says so if it matters
        if theirs != ours:
            raise GpucrError(f"PID {p} runs in a user namespace of its own", FIX)


def check_made_by_us(pid: int) -> None:
    """For a target in a PID namespace below ours: that namespace's init is our
    pidns_init, run by root, and the target shares its mount namespace."""
    depth = len(criu_mod.nspid(pid))
    if depth <= len(criu_mod.nspid(os.getpid())):
        return
    init = namespace_init(pid, depth)
    if init is None or not _ours(init) or ns_id(init, "mnt") != ns_id(pid, "mnt") \
            or ns_id(init, "pid") != ns_id(pid, "pid"):
        raise GpucrError(f"PID {pid} runs in a PID or mount namespace that gpucr-hpc did not make", FIX)


def namespace_init(pid: int, depth: int) -> int | None:
    """PID 1 of pid's namespace, found among its ancestors."""
    p = pid
    while p > 1:
        try:
            ids = criu_mod.nspid(p)
            if len(ids) == depth and ids[-1] == 1:
                return p
            if len(ids) < depth:
                return None
            p = int(processes.proc_status(p)["PPid"])
        except (OSError, KeyError, ValueError):
            return None
    return None


def _ours(init: int) -> bool:
    """Root's, in our user namespace, running our pidns_init."""
    try:
        uids = {int(x) for x in processes.proc_status(init)["Uid"].split()}
        argv = Path(f"/proc/{init}/cmdline").read_bytes().split(b"\0")
    except (OSError, KeyError, ValueError):
        return False
    ours = {os.fsencode(os.path.realpath(pidns_init.__file__)), b"gpucr_hpc.criu.pidns_init"}  # by path; by -m before
    return uids == {0} and ns_id(init, "user") == ns_id("self", "user") and bool(ours & set(argv[:4]))
