"""A restored rank's TCP connections: where their ends are now, and the hold.

The checkpoint recorded, per unit (rank or batch script), the local ends of its
connections and, for each connection to another unit, which unit holds the
other end. The restore decides where each rank goes before anything is
restored (placement: the ranks of the job's k-th node go to the k-th node of
the new allocation, the batch script where the job's batch step now runs), and
the rank step is launched to that layout (srun --distribution=arbitrary), so
every unit knows where every peer goes without asking:

* an end on a node address moves to the new node's address (ports stay),
  listening ones too; an end on a loopback address stays, since its peer
  shares the namespace, and so does one bound to any address;
* a rank with connections to other ranks is restored with them locked
  (tcp/lock) and they are let go only once every rank is back: a packet
  reaching a peer that is not restored yet would reset the connection. A
  rank that is not back in GPUCR_RANKS_BACK_TIMEOUT seconds: the job is held.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import time
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.slurm import commands as slurm
from gpucr_hpc.tcp import end as tcp_end
from gpucr_hpc.tcp import lock as netlock

POLL_S = 0.1


RANK_NODES_ENV = "GPUCR_RANK_NODES"   # the rank step's placement, one node per rank
BATCH_NODE_ENV = "GPUCR_BATCH_NODE"   # where the batch script is restored


def placement(ranks: list[dict], job_nodes: list[str]) -> list[str]:
    """The node of each rank (by rank) in the new allocation: the k-th node the
    ranks ran on (in rank order) becomes the allocation's k-th."""
    old = list(dict.fromkeys(r["node"] for r in ranks))
    if len(job_nodes) < len(old):
        raise GpucrError(f"the job's ranks ran on {len(old)} nodes and it now has {len(job_nodes)}",
                         "restore the job on as many nodes as it had")
    return [job_nodes[old.index(r["node"])] for r in ranks]


def where_now(ranks: list[dict]) -> dict[str, str]:
    """Unit name -> its node in this restore, as the batch restore placed them."""
    nodes = [n for n in (config.value(RANK_NODES_ENV) or "").split(",") if n]
    if len(nodes) != len(ranks):
        raise GpucrError(f"this restore step places {len(nodes)} ranks ({RANK_NODES_ENV}) and the "
                         f"image has {len(ranks)}", "restore the job with gpucr-hpc restore, not by hand")
    where = {r["name"]: n for r, n in zip(ranks, nodes)}
    if config.value(BATCH_NODE_ENV):
        where["batch"] = config.value(BATCH_NODE_ENV)
    return where


@functools.cache
def _address(node: str) -> str:
    """Where Slurm reaches the node (NodeAddr): a node's name need not resolve
    where its address is set in slurm.conf (cloud nodes, sites without DNS)."""
    name = slurm.node_address(node) or node
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        raise GpucrError(f"node {node} has no address this node can resolve ({name}): {e}",
                         "give the node its NodeAddr in slurm.conf, or make its name resolve (DNS or /etc/hosts)"
                         ) from e


def _stays(end: str) -> bool:
    """A loopback end (its peer shares the namespace) or a wildcard one (any address)."""
    ip = tcp_end.parse(end)[0]
    return ip.is_loopback or ip.is_unspecified


def moves(unit: dict, where: dict[str, str]) -> dict[str, str]:
    """The unit's TCP ends ("addr:port") that are elsewhere now -> their new address;
    `where`: unit name -> its node now."""
    tcp = unit.get("tcp") or {}
    moved: dict[str, str] = {}
    for end in tcp.get("ends", []):
        if not _stays(end):  # names are resolved only where an end moves
            moved[end] = _address(where[unit["name"]])
    for remote, peer in (tcp.get("peers") or {}).items():
        if not _stays(remote) and peer in where:
            moved[remote] = _address(where[peer])
    return moved


def flows(unit: dict, moved: dict[str, str]) -> list[netlock.Flow]:
    """The unit's established connections, with their ends where they are now."""

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
