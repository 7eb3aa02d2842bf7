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
    outside: str = "refuse"  # its connections to outside the job: refused, or closed at a restore

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


def _outside(pid: int) -> str:
    """The task's policy for connections to outside the job, as the plugin set it
    in its environment (the job's --gpucr-outside, else the site's outside=)."""
    return config.value("GPUCR_OUTSIDE", environ_of(pid)) or "refuse"


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
            units.append(Unit("batch", "batch", 0, rec["pid"], node, outside=_outside(rec["pid"])))
        elif rec["step"].isdigit():
            status = config.value("GPUCR_SRUN_STATUS", environ_of(rec["pid"])) or ""
            units.append(Unit(f"rank-{rec['step']}.{rec['rank']}", rec["step"], rec["rank"],
                              rec["pid"], node, status, _outside(rec["pid"])))
    return units


def mpi_process(tree: list[int]) -> int | None:
    """A process of the tree that has an MPI library loaded, or None.

    An MPI rank's connections go to its launcher's PMIx server and its peers
    through MPI's own transports, which CRIU cannot restore: such a unit is
    refused by name, before its sockets are looked at."""
    for pid in tree:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        if any(Path(line.split()[-1]).name.startswith("libmpi.so") for line in maps.splitlines()
               if line.count(" ") >= 5 and "/" in line):
            return pid
    return None
