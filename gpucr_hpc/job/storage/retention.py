"""What `gpucr-hpc prune` removes from the image store, and what it never does.

Per job directory, under the job's lock (a job a command is acting on is
skipped, said so):

* generations of the job's current submission beyond the newest `keep`
  committed ones go, never the one RESTORE names nor the newest (LATEST): a
  pending or held restore reads one of those;
* a generation without COMMITTED goes: its checkpoint died (one that runs
  holds the lock), or its drain failed; a staged one whose drain is to come
  stays;
* with `ended`, the whole directory of a job Slurm reports COMPLETED or
  CANCELLED goes (a FAILED or TIMEOUT job, or one Slurm forgot, may still be
  restored or resubmitted from it: kept);
* another submission's generations (an earlier job that had this id) are kept.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import generations
from gpucr_hpc.job import lock as job_lock
from gpucr_hpc.slurm import commands as slurm

GONE_STATES = {"COMPLETED", "CANCELLED"}  # a job that will never be restored


@dataclass
class Action:
    job: str
    generation: str  # "" for the whole job directory
    action: str      # "removed", "kept" or "skipped"
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def job_states() -> dict[str, str]:
    """Every job Slurm knows, by id: its state (one question for the whole store)."""
    out = slurm.run("scontrol", "show", "job", "-o", check=False, timeout=120)
    if out.returncode != 0:
        raise GpucrError(f"Slurm does not answer ({(out.stderr.strip().splitlines() or ['no output'])[-1]}), "
                         "so which jobs ended is unknown", "prune without --ended, or once slurmctld answers")
    states = {}
    for line in out.stdout.splitlines():
        d = slurm.parse_one_line(line)
        if d.get("JobId"):
            states[d["JobId"]] = d.get("JobState", "")
    return states


def prune_job(job_dir: Path, keep: int, states: dict[str, str] | None, dry_run: bool) -> list[Action]:
    """states: every job Slurm knows (job_states) to remove the jobs that ended; None: keep them."""
    jobid = job_dir.name
    uid = job_dir.stat().st_uid
    try:
        with job_lock.held(job_dir, jobid, uid, what="gpucr-hpc prune"):
            return _prune_locked(job_dir, keep, states, dry_run)
    except GpucrError as e:
        return [Action(jobid, "", "skipped", e.cause)]


def _remove(path: Path, dry_run: bool) -> None:
    if not dry_run:
        shutil.rmtree(path)


def _prune_locked(job_dir: Path, keep: int, states: dict[str, str] | None, dry_run: bool) -> list[Action]:
    jobid = job_dir.name
    state = (states or {}).get(jobid)
    if state in GONE_STATES:
        # The lock file is inside: the directory goes with it, still locked by us.
        _remove(job_dir, dry_run)
        return [Action(jobid, "", "removed", f"the job ended {state}")]
    submission = generations.current_submission(job_dir)
    mine = generations.committed_of(job_dir, submission)
    pinned = {generations.read_pointer(job_dir, generations.RESTORE),
              generations.read_pointer(job_dir, generations.LATEST)}
    out = []
    for _, path, committed in generations.generations(job_dir):
        if not committed and generations.is_staged(path):
            out.append(Action(jobid, path.name, "kept", "staged in node memory, its drain to come"))
        elif not committed:
            _remove(path, dry_run)
            out.append(Action(jobid, path.name, "removed", "never committed: its checkpoint died"))
        elif path not in mine:
            out.append(Action(jobid, path.name, "kept", "an earlier submission's (another job that had this id)"))
        elif path in pinned:
            out.append(Action(jobid, path.name, "kept", "the generation a restore of the job reads"))
        elif path in mine[-keep:]:
            out.append(Action(jobid, path.name, "kept", f"one of the newest {keep}"))
        else:
            _remove(path, dry_run)
            out.append(Action(jobid, path.name, "removed", f"older than the newest {keep}"))
    if states is not None:
        out.append(Action(jobid, "", "kept", f"the job is {state}" if state else
                          "Slurm no longer knows the job: it may be resubmitted from its checkpoint"))
    return out


def job_dirs(root: Path, jobid: str | None) -> list[Path]:
    """The job directories this user may prune: their own (root: all)."""
    if jobid:
        dirs = [root / jobid]
    elif root.is_dir():
        dirs = sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    else:
        dirs = []
    me = os.geteuid()
    out = []
    for d in dirs:
        try:
            st = d.lstat()
        except FileNotFoundError:
            continue
        if d.is_symlink() or not d.is_dir():
            continue  # never followed
        if me in (0, st.st_uid):
            out.append(d)
    if jobid and not out:
        raise GpucrError(f"the image store has no job {jobid} of yours ({root / jobid})",
                         "`gpucr-hpc ls` lists the jobs it has")
    return out
