"""A requeued GPU job starts again on nodes with the GPUs it had.

A site names the node features that say which GPUs a node has, once, in
plugstack.conf (`gpu_feature=gpu_h100,gpu_a100,...`). When gpucr-hpc requeues a
job that asked for GPUs, the features of that list which every node of the job
has are added to its constraints (`--constraint`, Slurm's Features), so Slurm
starts it where its image can be restored. A job whose own constraint has an OR
in it is left as it is: adding to it could change what the user meant.
"""

from __future__ import annotations

import re

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.slurm import commands as slurm

_TRES_KEYS = ("TresPerNode", "TresPerJob", "TresPerTask", "TresPerSocket", "TRES")


def uses_gpus(job: slurm.Job) -> bool:
    return any(re.search(r"\bgres[:/]gpu\b", job.raw.get(k, "")) for k in _TRES_KEYS)


def node_features(node: str) -> set[str]:
    d = slurm.parse_one_line(slurm.run("scontrol", "show", "node", "-o", node).stdout)
    return {f for f in re.split(r"[,\s]+", d.get("AvailableFeatures", "")) if f and f != "(null)"}


def wanted(gpu_feature: str, job: slurm.Job, features_of=node_features) -> list[str]:
    """The site's GPU features that every node of the job has, in the site's order."""
    names = [f for f in re.split(r"[,&\s]+", gpu_feature) if f]
    if not names or not job.nodes or not uses_gpus(job):
        return []
    have = [features_of(n) for n in job.nodes]
    return [f for f in names if all(f in h for h in have)]


def constraint(current: str, want: list[str]) -> str | None:
    """The job's new Features, or None when nothing is to change."""
    current = "" if current in ("", "(null)") else current
    if not want or "|" in current:
        return None
    mine = set(re.split(r"[&,\s()\[\]]+", current))
    missing = [f for f in want if f not in mine]
    if not missing:
        return None
    return "&".join(([current] if current else []) + missing)


def steer(job: slurm.Job, gpu_feature: str) -> str | None:
    """After the requeue (the job is pending): add the GPU features. Returns what was
    added; a refusal by Slurm is one line for the caller to report, not an error."""
    try:
        want = wanted(gpu_feature, job)
        new = constraint(job.raw.get("Features", ""), want)
        if new is None:
            return None
        slurm.run("scontrol", "update", f"JobId={job.id}", f"Features={new}")
    except GpucrError as e:
        return f"not steered to its GPU model: {e.one_line()}"
    return "&".join(want)
