"""Where each unit of a generation restores: the batch unit on this node, each
rank on the node of the new allocation rank_connections.placement gives it."""

from __future__ import annotations

import os

from gpucr_hpc.job.connections import rank_connections
from gpucr_hpc.slurm import commands as slurm
from gpucr_hpc.slurm.site import node_name


def ranks_of(m: dict) -> list[dict]:
    """The manifest's rank units, in rank order."""
    return sorted((u for u in m["units"].values() if u["name"].startswith("rank-")), key=lambda u: u["rank"])


def place(m: dict) -> dict[str, str]:
    """Unit name -> its node in this restore."""
    ranks = ranks_of(m)
    nodes = rank_connections.placement(ranks, slurm.hostnames(os.environ.get("SLURM_JOB_NODELIST", "")))
    return {**{r["name"]: n for r, n in zip(ranks, nodes)}, "batch": node_name()}
