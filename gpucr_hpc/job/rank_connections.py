"""A restored rank's TCP connections: where their ends are now, and the hold.

The checkpoint recorded, per rank, the local ends of its connections and, for
each connection to another rank, which rank holds the other end. The restore
step places rank N on the node of its task N (block distribution, as the
step that ran), so every task knows where every rank goes without asking:

* an end on a node address moves to the new node's address (ports stay),
  listening ones too; an end on a loopback address stays, since its peer
  shares the namespace, and so does one bound to any address;
* a rank with connections to other ranks is restored with them locked
  (criu/netlock) and they are let go only once every rank is back: a packet
  reaching a peer that is not restored yet would reset the connection. A
  rank that is not back in GPUCR_RANKS_BACK_TIMEOUT seconds: the job is held.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

from gpucr_hpc import tcp_end
from gpucr_hpc.criu import netlock
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.slurm import commands as slurm

POLL_S = 0.1


def step_nodes(n_tasks: int) -> list[str]:
    """The node of each task of this step, by task id (block distribution)."""
    nodes = slurm.hostnames(os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", ""))
    counts: list[int] = []
    for part in (os.environ.get("SLURM_STEP_TASKS_PER_NODE") or "").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    out = [node for node, k in zip(nodes, counts) for _ in range(k)]
    if len(out) != n_tasks:
        raise GpucrError(f"cannot tell where the {n_tasks} ranks are restored from this step's layout "
                         f"({os.environ.get('SLURM_STEP_NODELIST')}, {os.environ.get('SLURM_STEP_TASKS_PER_NODE')})",
                         "restore the job on as many tasks as it had")
    return out


def _address(node: str) -> str:
    try:
        return socket.gethostbyname(node)
    except OSError as e:
        raise GpucrError(f"node {node} has no address this node can resolve: {e}",
                         "make node names resolve on every node (DNS or /etc/hosts)") from e


def _stays(end: str) -> bool:
    """A loopback end (its peer shares the namespace) or a wildcard one (any address)."""
    ip = tcp_end.parse(end)[0]
    return ip.is_loopback or ip.is_unspecified


def moves(unit: dict, ranks: list[dict], nodes: list[str]) -> dict[str, str]:
    """The unit's TCP ends ("addr:port") that are elsewhere now -> their new address."""
    tcp = unit.get("tcp") or {}
    where = {r["name"]: nodes[i] for i, r in enumerate(ranks)}
    moved: dict[str, str] = {}
    for end in tcp.get("ends", []):
        if not _stays(end):  # names are resolved only where an end moves
            moved[end] = _address(where[unit["name"]])
    for remote, peer in (tcp.get("peers") or {}).items():
        if not _stays(remote) and peer in where:
            moved[remote] = _address(where[peer])
    return moved


def flows(unit: dict, moved: dict[str, str]) -> list[netlock.Flow]:
    """The unit's connections to other ranks, with their ends where they are now."""

    def now(end: str) -> str:
        addr, port = tcp_end.parse(end)
        return tcp_end.text(moved.get(end, addr), port)

    return [netlock.Flow(now(local), now(remote)) for local, remote in (unit.get("tcp") or {}).get("links", [])]


def lock_name(jobid: str, unit: dict) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", f"job{jobid}_{unit['name']}")


def hold_until_all_back(back_dir: Path, n_ranks: int, timeout: float) -> None:
    """Returns once every rank of the step said it is back (batch_restore.rank_back)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            back = len(os.listdir(back_dir))
        except OSError:
            back = 0
        if back >= n_ranks:
            return
        if time.monotonic() > deadline:
            raise GpucrError(f"only {back} of {n_ranks} ranks were restored within {timeout:.0f} s, "
                             f"so their connections could not be let go",
                             "see restore.log for the rank that failed")
        time.sleep(POLL_S)
