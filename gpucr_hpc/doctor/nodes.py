"""The doctor's checks on every node of a partition, through Slurm."""

from __future__ import annotations

import json
import subprocess
import sys

from gpucr_hpc.doctor.checks import Check
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.slurm import commands as slurm

TIMEOUT_S = 600


def reports_of(labelled: str) -> list[dict]:
    """The tasks' JSON documents from `srun --label` output. srun sends a task's output
    in pieces of at most 1024 bytes and labels (and ends) each piece as a line of its
    own, interleaved with other tasks' pieces: a task's pieces (and the lines of an
    indented document) are joined until they make a JSON object."""
    pending: dict[str, str] = {}
    reports = []
    for line in labelled.splitlines():
        task, sep, text = line.partition(": ")
        if not sep or not task.strip().isdigit():
            continue
        pending[task] = pending.get(task, "") + text
        try:
            reports.append(json.loads(pending[task]))
        except ValueError:
            continue
        pending[task] = ""
    return reports


def run_on_partition(partition: str) -> list[dict]:
    """One doctor per responding node of the partition (an srun task each), its report."""
    out = slurm.run("sinfo", "-h", "-p", partition, "-t", "idle,mix,alloc", "-o", "%D")
    count = sum(int(x) for x in out.stdout.split() if x.isdigit())
    if count == 0:
        raise GpucrError(f"partition {partition} has no responding node",
                         "check it with sinfo -p " + partition)
    argv = ["srun", "-p", partition, f"--nodes={count}", "--ntasks-per-node=1", "--gpucr=off", "--label",
            "--job-name=gpucr-doctor", sys.executable, "-m", "gpucr_hpc", "doctor", "--json"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise GpucrError(f"the doctor's step on partition {partition} did not end in {TIMEOUT_S} s",
                         "is the partition busy? try when nodes are free") from e
    # Each node's `doctor --json` document holds its one report.
    reports = [rep for doc in reports_of(r.stdout) for rep in doc.get("nodes", [doc] if "checks" in doc else [])]
    if not reports:
        last = (r.stderr.strip().splitlines() or [f"srun exit {r.returncode}"])[-1]
        raise GpucrError(f"no node of partition {partition} answered: {last}",
                         "check that gpucr-hpc runs on the nodes (gpucr-hpc doctor there)")
    return sorted(reports, key=lambda rep: rep["node"])


def key_mismatch(reports: list[dict]) -> Check | None:
    """The node key must be one file on every node: a restore on another node checks
    the image's seal with it."""
    prints = {}
    for r in reports:
        for c in r["checks"]:
            if c["name"] == "node key" and c["ok"]:
                prints[r["node"]] = c["detail"].split()[1]
    if len(set(prints.values())) > 1:
        seen = ", ".join(f"{n} {p}" for n, p in sorted(prints.items()))
        return Check("node key", False, f"the nodes have different keys ({seen})",
                     "copy /etc/gpucr-hpc/image.key from one node to all (mode 0600, root)")
    return None
