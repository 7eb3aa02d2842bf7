"""The drain of a job's staged generations on one node: from node memory to the image root.

    gpucr-hpc drain JOBID      (run by the plugin's job epilog as the job's user, detached)

A preemption on a site with a staging tier (plugstack.conf stage=) writes each
unit into node memory, <stage>/<jobid>/gen-N/<unit>, so the job ends as soon
as its data is out of the GPU and off the processes. When the job has ended
on the node, the plugin's epilog starts this, outside the job: every staged
unit is drained to the image root (store/drain.py: checked against its
checksums, durable), this node's drained/ mark is written, and the node that
drains last commits the generation (generations.finish_drain). A restore of the job on this node
reads the staged copies meanwhile (job/restore/unit_source.py); they go once it is done.
The drain is the job's user (spank/drain_spawn.c), never root: it works only
in the user's own directories, <stage>/<jobid> and <image root>/<jobid>, and
refuses a staging dir that is not its own (root included), so what it reads
and writes is what the user may. The plugin removes <stage>/<jobid> after it.
The drains of one job on a node take turns, and a generation a checkpoint is
still writing (the job back here and preempted again) is left to its own; one
whose checkpoint is gone (nobody holds the job's lock) loses its staged copies.

A drain that fails (a full or missing image root, a damaged staged file): the
generation gets DRAIN_FAILED with the reason, LATEST goes back to the previous
committed generation, and restore.log and the job's events say so. Either
way the staged copies go: node memory is the next job's.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import dirs as job_dirs
from gpucr_hpc.job import events, generations, restore_log
from gpucr_hpc.job import lock as job_lock
from gpucr_hpc.job.storage import staging
from gpucr_hpc.slurm.site import load_site, node_name
from gpucr_hpc.store import drain as store_drain
from gpucr_hpc.store import manifest as mf


def drain_generation(staged: Path, gen_dir: Path, node: str) -> dict:
    """Every unit of one staged generation on this node to the image root."""
    t0 = time.monotonic()
    total = 0
    with beating(gen_dir, node):
        for unit in sorted(p for p in staged.iterdir() if p.is_dir()):
            if config.fault("drain_fails"):
                raise GpucrError(f"draining {unit} failed: injected (GPUCR_FAULTS=drain_fails)",
                                 "free space on the image root (or fix it); the job restores from its previous "
                                 "generation")
            total += store_drain.drain_image(unit, gen_dir / unit.name)
        committed = generations.finish_drain(gen_dir, node)
    return {"bytes": total, "drain_s": time.monotonic() - t0, "committed": committed}


@contextmanager
def beating(gen_dir: Path, node: str) -> Iterator[None]:
    """generations.heartbeat while the drain runs: a start waiting for it can tell
    a slow drain from a node lost with its memory."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                generations.heartbeat(gen_dir, node)
            except OSError:
                pass  # the image root hiccups: the copy itself will say so
            if stop.wait(generations.HEARTBEAT_S):
                return

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def give_back(staged: Path) -> None:
    """The staged copies go, once no restore on this node reads them (staging.held)."""
    try:
        with staging.held(staged, exclusive=True):
            shutil.rmtree(staged, ignore_errors=True)
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)


def drain_job(jobid: str) -> list[str]:
    """Drain every staged generation of the job on this node; one line per failure."""
    site = load_site()
    node = node_name()
    root = staging.job_stage(site, jobid)
    if root is None or not os.path.lexists(root):
        return []
    mine(root)
    job_dir = site.job_image_dir(jobid)
    uid = os.geteuid()
    job_dirs.check(job_dir, uid)  # the user's alone, or refused (never written through)
    restore_log.open_log(job_dir)
    with staging.held(root, exclusive=True):  # one drain of the job at a time on a node
        errors = _drain_staged(root, job_dir, uid, node, jobid)
    # <stage>/<jobid> itself is the plugin's: it removes it once this has ended, unless
    # the job is back on the node (it stages there again).
    return errors


def mine(root: Path) -> None:
    """The drain runs only as the owner of <stage>/<jobid>: root too is refused one
    it does not own (a drain as root in a user's directory is what let a user's
    links make root write and read where the user may not)."""
    why = staging.refusal(root)
    if why is not None:
        raise why


def in_flight(gen_dir: Path) -> bool:
    """A generation a checkpoint is still writing: on the image root, neither staged
    nor committed nor failed yet (an aborted one is removed from there)."""
    return gen_dir.is_dir() and not any((gen_dir / marker).exists() for marker in (
        generations.STAGED, mf.COMMITTED, generations.DRAIN_FAILED))


def abandoned(job_dir: Path, jobid: str, uid: int) -> bool:
    """Whether an in-flight generation's checkpoint is gone (killed, its node agent
    crashed): every checkpoint holds the job's lock until it is done, so nobody
    holds it now. Held by anything, it is left for a later drain."""
    try:
        with job_lock.held(job_dir, jobid, uid, what="gpucr-hpc drain (clearing a checkpoint that is gone)"):
            return True
    except GpucrError:
        return False


def _drain_staged(root: Path, job_dir: Path, uid: int, node: str, jobid: str) -> list[str]:
    errors = []
    for staged in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: generations.number(p.name)):
        gen_dir = job_dir / staged.name
        if in_flight(gen_dir):
            if abandoned(job_dir, jobid, uid):  # never a restore point: its memory is the next job's
                restore_log.log(f"gpucr: {gen_dir.name} was left unfinished on {node} by a checkpoint "
                                  f"that is gone; its copies in node memory are removed")
                give_back(staged)
            continue  # else the job, back on this node, is being preempted again: its own drain follows
        try:
            if not generations.is_staged(gen_dir):
                continue  # committed by another node's drain already, failed, or aborted: stale
            try:
                rep = drain_generation(staged, gen_dir, node)
            except (GpucrError, OSError) as e:
                why = e.one_line() if isinstance(e, GpucrError) else str(e)
                earlier = generations.fail_drain(gen_dir, node, why)
                back = f"the job restores {earlier.name} instead" if earlier else "the job has no earlier checkpoint"
                restore_log.log(f"gpucr: drain of {gen_dir.name} on {node} failed: {why}; {back}")
                events.record(job_dir, uid, what="drain", ok=False, generation=gen_dir.name, nodes=[node],
                              error=f"{why}; {back}")
                errors.append(f"{gen_dir.name}: {why}")
                continue
            restore_log.log(f"{gen_dir.name}: {rep['bytes'] / 2**30:.2f} GiB drained from {node}'s memory "
                              f"in {rep['drain_s']:.1f} s" + ("; committed" if rep["committed"] else ""))
            events.record(job_dir, uid, what="drain", ok=True, generation=gen_dir.name, nodes=[node],
                          took_s=rep["drain_s"])
        finally:
            give_back(staged)
    return errors
