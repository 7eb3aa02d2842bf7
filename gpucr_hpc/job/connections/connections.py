"""The TCP sockets of a job's units, and which connections stay inside the job.

Every agent lists the TCP sockets of its node's units (established and
listening); the lists of all nodes together decide, before anything is dumped:

* a connection whose two ends are in one unit moves with it (CRIU restores
  both ends of the tree);
* a connection between two units of the job (two ranks, on one node or two)
  moves too, if both ends are dumped while the job's connections are locked
  on every node (tcp/lock) and restored before they are unlocked;
* a connection to anything else (a server elsewhere, another job's process)
  cannot move. Its unit's policy (GPUCR_OUTSIDE, the job's --gpucr-outside or
  the site's outside=) decides: `refuse` (the default) refuses the checkpoint,
  naming both ends; `close` lets the checkpoint go on, and a restore gives the
  program that socket closed, so its client reconnects (as with CRIU's
  --tcp-close, for these connections alone). A checkpoint the job runs on from
  leaves the connection as it was.

A loopback address names a socket only in its own network namespace, so its
ends are matched in that namespace alone (one machine may run several nodes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from gpucr_hpc.criu import procfs
from gpucr_hpc.tcp import end as tcp_end

REFUSE, CLOSE = "refuse", "close"  # the policies for a connection to outside the job


@dataclass(frozen=True)
class Socket:
    """One TCP socket of a unit: its ends as "addr:port" ("[v6]:port" for IPv6)."""

    unit: str
    node: str
    local: str
    remote: str
    listening: bool = False
    netns: str = ""  # the network namespace it lives in: machine boot id / namespace inode
    outside: str = REFUSE  # its unit's policy for a connection to outside the job

    def as_dict(self) -> dict:
        return asdict(self)


def _netns(pid: int) -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{Path(f'/proc/{pid}/ns/net').readlink()}"
    except OSError:
        return ""


def unit_sockets(unit: str, node: str, tree: list[int], outside: str = REFUSE) -> list[Socket]:
    """The established and listening TCP sockets the processes of `tree` hold;
    `outside`: the unit's policy for those whose peer is not in the job."""
    if not tree:
        return []
    mine = set().union(*(procfs.socket_inodes(p) for p in tree))
    netns = _netns(tree[0])
    found = []
    for local, remote, state, inode in procfs.tcp_sockets(tree[0]):  # the tree's own network namespace
        if state in (procfs.ESTABLISHED, procfs.LISTEN) and inode in mine:
            found.append(Socket(unit, node, local, remote, state == procfs.LISTEN, netns, outside))
    return found


def _loopback(end: str) -> bool:
    return tcp_end.parse(end)[0].is_loopback


def _key(netns: str, local: str, remote: str) -> tuple:
    return (netns if _loopback(local) else "", local, remote)


@dataclass
class Cut:
    """What the job's sockets need at a checkpoint."""

    between_units: list[tuple[Socket, Socket]]  # connections from one unit to another
    foreign: list[Socket]                       # ends whose peer is not in the job: refused
    closed: list[Socket]                        # such ends whose unit's policy is close

    def refusal(self) -> str | None:
        if not self.foreign:
            return None
        s = self.foreign[0]
        more = f" (and {len(self.foreign) - 1} more)" if len(self.foreign) > 1 else ""
        return (f"{s.unit} on {s.node} has a network connection that cannot move: TCP {s.local} -> "
                f"{s.remote}, whose other end is not a process of this job{more}; "
                f"with --gpucr-outside=close a restore gives it back closed and the program reconnects")


def cut(sockets: list[Socket]) -> Cut:
    """Match the established ends of all the job's units (every node's list)."""
    ends = {_key(s.netns, s.local, s.remote): s for s in sockets if not s.listening}
    between: list[tuple[Socket, Socket]] = []
    foreign: list[Socket] = []
    closed: list[Socket] = []
    for s in sockets:
        if s.listening:
            continue
        peer = ends.get(_key(s.netns, s.remote, s.local))
        if peer is None:
            (closed if s.outside == CLOSE else foreign).append(s)
        elif peer.unit != s.unit and (s.unit, s.local) < (peer.unit, peer.local):
            between.append((s, peer))
    return Cut(between, foreign, closed)
