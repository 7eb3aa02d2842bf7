"""A job's checkpoints in the image store: generations, commit, LATEST.

    <image root>/<jobid>/
        gen-<N>/
            batch/             the batch script's process tree (a process image)
            rank-<step>.<r>/   one task of an srun step (a process image)
            output/            the job's stdout/stderr as they were at checkpoint
            manifest.json      the job manifest (kind "job"): units, nodes, sizes
            COMMITTED          written last, by rank 0, once every node voted yes
        LATEST                 "gen-<N>": the newest committed generation
        RESTORE                "gen-<N>": the generation the next restart restores
                               (written by `restore --from`; LATEST when absent)

A generation is complete only with COMMITTED. The previous committed
generation is kept until a newer one commits; older ones are pruned then.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from gpucr_hpc import job_dirs
from gpucr_hpc import manifest as mf
from gpucr_hpc.errors import GpucrError

LATEST = "LATEST"
RESTORE = "RESTORE"
KEEP_COMMITTED = 2


def gen_name(n: int) -> str:
    return f"gen-{n}"


def generations(job_dir: Path) -> list[tuple[int, Path, bool]]:
    """(N, path, committed) of every generation, oldest first."""
    out = []
    try:
        entries = list(Path(job_dir).iterdir())
    except OSError:
        return []
    for p in entries:
        m = re.fullmatch(r"gen-(\d+)", p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p, (p / mf.COMMITTED).exists()))
    return sorted(out)


def new_generation(job_dir: Path, owner_uid: int) -> Path:
    """Create gen-<N+1>; N counts every generation ever started, committed or not."""
    job_dir = job_dirs.ensure(Path(job_dir), owner_uid)  # the job user's alone, or refused
    gens = generations(job_dir)
    n = gens[-1][0] + 1 if gens else 1
    path = job_dir / gen_name(n)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError as e:  # the job's lock keeps gpucr-hpc commands apart; anything else
        raise GpucrError(f"{path} appeared while this checkpoint began",
                         "something outside gpucr-hpc writes into the job's directory; "
                         "the job was left running") from e
    if os.geteuid() == 0:
        os.chown(path, owner_uid, -1)
    return path


def read_pointer(job_dir: Path, name: str) -> Path | None:
    try:
        target = (Path(job_dir) / name).read_text().strip()
    except OSError:
        return None
    if not re.fullmatch(r"gen-\d+", target):
        return None
    return Path(job_dir) / target


def commit_generation(gen_dir: Path, manifest: dict) -> None:
    """manifest + COMMITTED (atomic), then LATEST, then prune old generations."""
    mf.commit(gen_dir, manifest)
    job_dir = gen_dir.parent
    mf.write_atomic(job_dir / LATEST, f"{gen_dir.name}\n".encode(), mode=0o644)
    uid = manifest.get("owner_uid")
    if os.geteuid() == 0 and uid is not None:
        for p in (gen_dir, gen_dir / mf.MANIFEST, gen_dir / mf.COMMITTED, job_dir / LATEST):
            os.chown(p, uid, -1)
    prune(job_dir)


def prune(job_dir: Path, keep: int = KEEP_COMMITTED) -> None:
    """Keep the newest `keep` committed generations and any newer uncommitted one in flight."""
    committed = [g for g in generations(job_dir) if g[2]]
    pinned = read_pointer(job_dir, RESTORE)
    for n, path, _ in committed[:-keep]:
        if path != pinned:
            shutil.rmtree(path, ignore_errors=True)


def discard(gen_dir: Path) -> None:
    """Remove an uncommitted generation (an aborted checkpoint); never a committed one."""
    if (Path(gen_dir) / mf.COMMITTED).exists():
        raise GpucrError(f"{gen_dir} is committed", "committed generations are never discarded")
    shutil.rmtree(gen_dir, ignore_errors=True)


def restore_target(job_dir: Path, gen: int | None = None) -> Path:
    """The committed generation to restore: `gen`, else RESTORE, else LATEST."""
    job_dir = Path(job_dir)
    if gen is not None:
        path = job_dir / gen_name(gen)
    else:
        path = read_pointer(job_dir, RESTORE) or read_pointer(job_dir, LATEST)
    if path is None:
        raise GpucrError(f"no committed checkpoint under {job_dir}",
                         "checkpoint the job first (gpucr-hpc checkpoint JOBID)")
    if not (path / mf.COMMITTED).exists():
        raise GpucrError(f"{path} is not a committed checkpoint",
                         f"pick one of: {', '.join(p.name for _, p, c in generations(job_dir) if c) or 'none'}")
    return path
