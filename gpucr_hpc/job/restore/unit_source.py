"""Where a restore reads its generation and each unit's image from: node memory
or the image root. The one place that decides it.

A generation a preemption staged (job/storage/staging.py) can be restored before
its drain ends, when the job is back on the nodes that staged it: each unit
restored on the node that staged it reads its image from that node's memory,
under a shared lock that keeps the drain from removing it meanwhile; its files
are checked by size, as their checksums are made by the drain. A job that moved
waits until the drain has made the generation durable and reads the image root
(no restore mixes the two); a drain that failed, or a node lost before its
drain, leaves it nothing to read, and the restore fails with the reason (the
job is held).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import generations
from gpucr_hpc.job.restore.placement import place
from gpucr_hpc.job.restore_log import log
from gpucr_hpc.job.storage import staging
from gpucr_hpc.slurm import commands as slurm
from gpucr_hpc.slurm.site import load_site, node_name
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import manifest as mf

MEMORY = "node memory"
IMAGE_ROOT = "image root"


def generation(job_dir: Path) -> Path:
    """The generation this start restores: a staged one read from node memory at
    once, or else, once every drain has settled, the one generations.start_target
    names (GPUCR_RESTORE_FROM for a job submitted again from another's image)."""
    gen = staged_start_here(job_dir)
    if gen is not None:
        return gen
    drained = generations.await_drain(job_dir, config.value("GPUCR_SUBMISSION"),
                                      float(config.value("GPUCR_DRAIN_WAIT")), lost=slurm.node_lost)
    if drained:
        log(drained)
    return generations.start_target(job_dir, config.value("GPUCR_SUBMISSION"), config.value("GPUCR_RESTORE_FROM"))


def staged_start_here(job_dir: Path) -> Path | None:
    """The staged generation the job restores at once, before its drain ends: the
    job is back on the nodes that staged it, and each of its staged units is read
    from the memory of the node it is restored on. None: the start waits for the
    drain, as a job that moved must."""
    gen = generations.staged_start(job_dir, config.value("GPUCR_SUBMISSION"))
    if gen is None:
        return None
    m = generations.manifest_of(gen)
    batch = m["units"].get("batch")
    if batch is None or in_memory_here(gen, batch, str(m["job"]["id"])) is None:
        return None
    try:
        where = place(m)
    except GpucrError:
        return None  # not as many nodes as it had: the restore says so after the drain
    elsewhere = sorted(u["name"] for u in m["units"].values() if u.get("staged") and where.get(u["name"]) != u["node"])
    if elsewhere:
        log(f"{gen.name} is still draining and {', '.join(elsewhere)} restore on other nodes now: "
            "the job waits for the drain")
        return None
    log(f"{gen.name} is still draining; the job is back on the nodes that staged it and reads their memory")
    return gen


def locate(gen: Path, unit: dict, staged_as: str, reading: ExitStack, verified: bool) -> tuple[Path, bool, str]:
    """(image dir, whether its checksums are already checked, where it is) of one
    unit. `reading` holds node memory until the caller's restore is done.
    verified: the caller checked the generation's checksums at the image root
    (batch_restore.check_generation)."""
    copy = in_memory_here(gen, unit, staged_as)
    if copy is not None:
        try:
            reading.enter_context(staging.held(copy.parent, exclusive=False))
        except OSError:
            copy = None  # the drain removed it just now
    if copy is not None and copy.is_dir():
        image_store.verify(copy, mf.load(copy), sizes_only=True)
        return copy, True, MEMORY
    if generations.is_staged(gen):
        generations.await_settled(gen, float(config.value("GPUCR_DRAIN_WAIT")), lost=slurm.node_lost)
        verified = False  # drained after the caller's check_generation
    why = generations.drain_failure(gen)
    if why is not None:
        raise GpucrError(f"{gen.name} is not on the image root: its drain failed ({why})",
                         f"gpucr-hpc restore {gen.parent.name} --from N restores an earlier checkpoint")
    return gen / unit["name"], verified, IMAGE_ROOT


def in_memory_here(gen: Path, unit: dict, staged_as: str) -> Path | None:
    """The unit's staged image on this node, where it still is (staged_as: the
    job id it was checkpointed under)."""
    if not unit.get("staged") or unit["node"] != node_name() or not generations.is_staged(gen):
        return None
    folder = staging.job_stage(load_site(), staged_as)
    if not staging.usable(folder):  # only this user's own staging dir, as the plugin made it
        return None
    assert folder is not None
    copy = folder / gen.name / unit["name"]
    return copy if copy.is_dir() else None
