"""What on one node makes up a job: its units, found through the plugin's task registry.

A unit is a process tree that is checkpointed and restored as one:

* `batch`: the batch script and everything under it (on the batch host);
* `rank-<step>.<rank>`: one task of an `srun` step, on the node that runs it.

Inside a `--gpucr=on` batch script, `srun` is our wrapper (shim/../srun-wrapper):
the real srun client runs outside the batch tree (its connections cannot be
restored), so the batch tree holds only the wrapper, waiting for the step's
exit status in a file. The step's tasks carry that file's path in
`GPUCR_SRUN_STATUS`; a restore writes it once the restored ranks have ended.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError


@dataclass
class Unit:
    name: str
    step: str
    rank: int
    pid: int
    node: str
    srun_status: str = ""   # for srun tasks: the status file their wrapper waits on

    def as_dict(self) -> dict:
        return asdict(self)


def read_registry(run_dir: Path) -> list[dict]:
    """The task records the plugin wrote: pid, rank, local_id, step (one per line)."""
    tasks = Path(run_dir) / "tasks"
    if not Path(run_dir).is_dir():
        raise GpucrError(f"no gpucr run dir {run_dir} on this node",
                         "the job was not submitted with --gpucr=on (or its node was rebooted)")
    records = []
    for f in sorted(tasks.glob("*")):
        try:
            rec = dict(line.split("=", 1) for line in f.read_text().split("\n") if "=" in line)
            records.append({"step": rec["step"], "rank": int(rec["rank"]), "pid": int(rec["pid"])})
        except (OSError, KeyError, ValueError):
            continue  # a task that just ended removed its file
    return records


def environ_of(pid: int) -> dict:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(e.split("=", 1) for e in raw.decode(errors="replace").split("\0") if "=" in e)


def local_units(run_dir: Path, node: str) -> list[Unit]:
    units = []
    for rec in read_registry(run_dir):
        if not criu_mod.is_alive(rec["pid"]):
            continue
        if rec["step"] == "batch":
            if config.value("GPUCR_BATCH_SUPERVISE", environ_of(rec["pid"])):
                # The plugin records the batch step's task (the supervisor) until the
                # supervisor records the script it runs or restored; dumping it would
                # commit a generation that holds none of the job's work.
                raise GpucrError(f"the batch script of the job on {node} is not recorded yet "
                                 "(the job is starting, or its restore is under way)",
                                 "try again in a few seconds; the job was left running")
            units.append(Unit("batch", "batch", 0, rec["pid"], node))
        elif rec["step"].isdigit():
            status = config.value("GPUCR_SRUN_STATUS", environ_of(rec["pid"])) or ""
            units.append(Unit(f"rank-{rec['step']}.{rec['rank']}", rec["step"], rec["rank"],
                              rec["pid"], node, status))
    return units


# -- connections that cannot move ------------------------------------------------

def _socket_inodes(pid: int) -> set[int]:
    return {int(t[8:-1]) for t in criu_mod.fd_targets(pid) if t.startswith("socket:[")}


def _addr(hexaddr: str) -> str:
    ip_hex, port_hex = hexaddr.split(":")
    raw = bytes.fromhex(ip_hex)
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # /proc prints IPv6 as four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return f"{ip}:{int(port_hex, 16)}"


def _tcp_table(pid: int) -> list[tuple[str, str, int]]:
    """(local, remote, inode) of established TCP sockets in pid's network namespace."""
    rows = []
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "01":  # ESTABLISHED
                rows.append((_addr(f[1]), _addr(f[2]), int(f[9])))
    return rows


def foreign_connections(tree: list[int]) -> list[str]:
    """Established TCP connections from the tree to anything outside it.

    CRIU restores a connection only when both ends are in the restored tree
    (loopback inside one node's tree). A peer elsewhere — another rank, another
    node, a server — would find the connection gone: such ranks are refused.
    """
    if not tree:
        return []
    mine = set().union(*(_socket_inodes(p) for p in tree))
    table = _tcp_table(tree[0])
    by_local = {local: inode for local, _, inode in table}
    found = []
    for local, remote, inode in table:
        if inode not in mine:
            continue
        peer = by_local.get(remote)
        if peer is None or peer not in mine:
            found.append(f"TCP {local} -> {remote}")
    return found
