"""The checkpoints of jobs as `ls` and `status` list them: one row per
generation, for whom may see them (a job's owner and root; another user gets
one line naming the owner when asking for the job, and nothing in a listing)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import dirs as job_dirs
from gpucr_hpc.job import generations
from gpucr_hpc.slurm.site import load_site


def job_rows(jobid: str | None = None) -> list[dict]:
    site = load_site()
    root = Path(site.imageroot)
    if jobid:
        job_dir = site.job_image_dir(jobid)
        dirs = [job_dir] if listable(job_dir, jobid) else []
    elif root.is_dir():
        # Other users' jobs are theirs alone: listed only for root.
        dirs = sorted((p for p in root.iterdir() if p.name.isdigit() and listable(p)),
                      key=lambda p: int(p.name))
    else:
        dirs = []
    rows = []
    for job_dir in dirs:
        try:
            rows += generation_rows(job_dir)
        except OSError as e:
            raise GpucrError(f"cannot read the checkpoints of job {job_dir.name}: "
                             f"{e.strerror} ({e.filename})", "only the job's owner or root can read them")
    return rows


def generation_rows(job_dir: Path) -> list[dict]:
    rows = []
    latest = generations.read_pointer(job_dir, generations.LATEST)
    current = generations.current_submission(job_dir)
    for _, path, committed in generations.generations(job_dir):
        row = {"job": job_dir.name, "generation": path.name, "committed": committed,
               "latest": path == latest, "path": str(path), "staged": generations.is_staged(path)}
        failed = generations.drain_failure(path)
        if failed:
            row["drain_failed"] = failed
        if committed or row["staged"]:
            try:
                m = generations.manifest_of(path)
                row.update(bytes=m.get("total_bytes", 0), nodes=m.get("nodes", []),
                           units=sorted(m.get("units", {})), created=m.get("created"),
                           submission=m.get("submission"),
                           # an earlier job that had this id: kept, never restored for this one
                           other_submission=m.get("submission") != current)
            except GpucrError as e:
                row.update(error=e.one_line())
            except OSError as e:  # unreadable: shown as damaged, like a bad checksum
                row.update(error=f"cannot read {e.filename}: {e.strerror}")
        rows.append(row)
    return rows


def listable(job_dir: Path, jobid: str | None = None) -> bool:
    """Whether this user may list the job's checkpoints: its owner and root may,
    whatever the mode; another user gets one line (jobid given) or nothing."""
    try:
        st = job_dir.lstat()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise GpucrError(f"cannot read {job_dir}: {e.strerror}", "check the image root's permissions") from e
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):  # a symlink planted in the image root is never followed
        if jobid is None:
            return False
        raise GpucrError(f"{job_dir} is not a directory", job_dirs.NOT_OURS_FIX)
    if me == 0 or (st.st_uid == me and os.access(job_dir, os.R_OK | os.X_OK)):
        return True
    if jobid is None:
        return False
    raise GpucrError(f"the checkpoints of job {jobid} belong to uid {st.st_uid}, you are uid {me}",
                     "only the job's owner or root can read them")
