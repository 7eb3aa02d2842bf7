"""Restoring a requeued job inside its new batch step.

When a `--gpucr=on` job starts and its own submission has a committed
checkpoint (whatever its restart count; job_images.start_target), or it was
submitted again from one (GPUCR_RESTORE_FROM), the plugin sets
GPUCR_RESTORE_BATCH=1 and the
batch supervisor (batch_supervisor.py) calls this instead of starting the
script (the original script's path is in GPUCR_BATCH_SCRIPT).

1. put the job's output files back as they were at the checkpoint (the new
   batch step truncated them), so the restored processes find them unchanged;
2. restore the batch script's tree with CRIU, in a new PID namespace;
3. restore the ranks of the `srun` step that was running, as a new step with
   the same layout; when it ends, hand its exit status to the restored srun
   wrapper, so the script continues after `srun` as if it had returned;
4. the supervisor waits for the restored script and exits with its status.

If no checkpoint can be restored, the job is requeued and held with the
reason, and the image is left as it was (never deleted, never modified).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpucr_hpc import image_store, job_images, migrate, slurm
from gpucr_hpc import manifest as mf
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.site import load_site


LOG_NAME = "restore.log"
_log_path: Path | None = None


def open_log(job_dir: Path) -> None:
    global _log_path
    _log_path = job_dir / LOG_NAME


def log(msg: str) -> None:
    """Into <image root>/<jobid>/restore.log: the job's own output must stay
    byte-identical to the checkpoint until the processes are back."""
    if _log_path is None:
        return
    try:
        with open(_log_path, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {os.environ.get('SLURMD_NODENAME', '')} {msg}\n")
    except OSError:
        pass


def check_generation(gen: Path, jobid: str) -> dict:
    """Every unit image is committed and intact before anything is touched."""
    older = (f"restore an older generation: gpucr-hpc restore {jobid} --from N "
             f"(gpucr-hpc ls {jobid} lists them)")
    try:
        m = mf.load(gen)
        image_store.verify(gen, m)
    except GpucrError as e:
        raise GpucrError(f"{gen.name} is not usable: {e.cause}", older) from e
    for name in m.get("units", {}):
        try:
            image_store.open_image(gen / name)
        except GpucrError as e:
            raise GpucrError(f"{gen.name} has no usable image of {name}: {e.cause}", older) from e
    return m


def put_back_outputs(gen: Path, m: dict) -> None:
    for u in m["units"].values():
        for path, rec in (u.get("saved_output") or {}).items():
            with open(gen / rec["file"], "rb") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def register(run_dir: Path, unit: dict, pid: int) -> None:
    """Record a restored unit in this node's task registry, as the plugin does for tasks."""
    tasks = run_dir / "tasks"
    tasks.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = f"{unit['step']}.{unit['rank']}"
    tmp = tasks / f".{name}.tmp"
    tmp.write_text(f"pid={pid}\nrank={unit['rank']}\nlocal_id={unit['rank']}\nstep={unit['step']}\n")
    tmp.rename(tasks / name)


def provide_batch_script(gen: Path, unit: dict) -> list[Path]:
    """bash keeps its script open: the restored shell needs it at its old path.

    On a cluster that path (slurmd's spool) is the same on every node and the
    restarted job's identical script is there; on another node of a test
    cluster sharing one machine it differs, so the new copy is put there.
    Returns what was created: it must go once the shell has it open, since
    that is another slurmd's spool (it would refuse to launch the job there).
    """
    script = os.environ.get("GPUCR_BATCH_SCRIPT")
    created: list[Path] = []
    if not script:
        return created
    for rec in mf.load(gen / unit["name"]).get("open_files") or []:
        old = Path(rec["path"])
        if old.name == Path(script).name and not old.exists():
            if not old.parent.exists():
                old.parent.mkdir(parents=True, mode=0o700)
                created.append(old.parent)
            shutil.copy2(script, old)
            created.insert(0, old)
    return created


def remove_created(paths: list[Path]) -> None:
    for p in paths:  # files first, then their directories
        try:
            p.rmdir() if p.is_dir() else p.unlink()
        except OSError:
            pass


def restore_unit(gen: Path, unit: dict, site, jobid: str,
                 inherit: dict[int, str] | None = None) -> dict:
    """Restore one unit in a new PID namespace and record it in this node's registry."""
    # The shim's control socket is bound under the run dir of the node it ran on
    # (of the job id it ran as: a resubmitted job has a new one).
    old_id = str(mf.load(gen)["job"]["id"])
    old_run_dir = site.job_run_dir(old_id, unit["node"])
    try:
        old_run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        created = provide_batch_script(gen, unit) if unit["name"] == "batch" else []
    except OSError as e:
        if old_id != str(jobid):
            raise GpucrError(f"cannot recreate {e.filename} of job {old_id}, which job {jobid} "
                             f"was submitted again from: {e.strerror}",
                             f"as root on {unit['node']}: mkdir -p -m 0700 {e.filename} and chown it "
                             f"to the job's user, then scontrol release {jobid}") from e
        # Only where node paths differ by node name (several slurmd on one machine, %n):
        # an ordinary user cannot create another node's run or spool dir.
        raise GpucrError(f"cannot recreate {e.filename} of node {unit['node']}: {e.strerror}",
                         f"give every node the same run dir and spool paths (no %n), or restore "
                         f"it on {unit['node']}: scontrol update jobid={jobid} nodelist={unit['node']}, "
                         f"then gpucr-hpc restore {jobid}") from e
    try:
        # check_generation verified every unit before the job's restore began.
        rep = migrate.restore_from(gen / unit["name"], pidns="new", rewind_files=True,
                                   inherit=inherit, checksums_verified=True)
    finally:
        remove_created(created)  # the restored shell holds it open by now
    register(site.job_run_dir(jobid), unit, rep["pid"])
    return rep


def restore_rank_step(gen: Path, m: dict, jobid: str) -> int | None:
    """The srun step that was running: restored as a new step of the same layout."""
    ranks = [u for u in m["units"].values() if u["name"].startswith("rank-")]
    if not ranks:
        return None
    nodes = sorted({u["node"] for u in ranks})
    argv = ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(ranks)}", "--gpucr=off",
            "--kill-on-bad-exit=0", "--job-name=gpucr-restore",
            "--distribution=block", sys.executable, "-m", "gpucr_hpc.rank_restore",
            "--gen-dir", str(gen)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_SPANK_", "GPUCR_RESTORE"))}
    # The real srun: the wrapper is first in PATH in the batch step.
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if p != load_site().bindir)
    return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL).returncode


def hand_status(m: dict, rc: int) -> None:
    for path in {u.get("srun_status") for u in m["units"].values() if u.get("srun_status")}:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{rc}\n")
        os.rename(tmp, path)


class RestoreFailed(Exception):
    """The job could not be restored; it was requeued and held with the reason."""


def give_up(jobid: str, reason: str) -> RestoreFailed:
    log(reason)
    print(reason, file=sys.stderr, flush=True)
    slurm.requeue_hold(jobid, reason)
    return RestoreFailed(reason)


def restore_batch_tree(jobid: str, site) -> tuple[dict, Path, dict | None]:
    """Steps 1 and 2: returns the job manifest, its generation and the report
    of the script tree's restore ("pid": the restored script, "_launcher": the
    process whose exit status is the script's), or None for a job that had no
    batch unit. Raises RestoreFailed."""
    job_dir = site.job_image_dir(jobid)
    open_log(job_dir)
    try:
        gen = job_images.start_target(job_dir, os.environ.get("GPUCR_SUBMISSION"),
                                      os.environ.get("GPUCR_RESTORE_FROM"))
        m = check_generation(gen, jobid)
    except GpucrError as e:
        raise give_up(jobid, f"gpucr: cannot restore job {jobid}: {e.one_line()}") from e
    log(f"restoring job {jobid} from {gen}")
    t0 = time.monotonic()
    put_back_outputs(gen, m)
    for u in m["units"].values():  # a stale status from before the checkpoint must not count
        if u.get("srun_status"):
            Path(u["srun_status"]).unlink(missing_ok=True)
    batch = None
    try:
        if "batch" in m["units"]:
            batch = restore_unit(gen, m["units"]["batch"], site, jobid)
        (job_dir / job_images.RESTORE).unlink(missing_ok=True)
    except GpucrError as e:
        if batch is not None:
            batch["_launcher"].kill()
        raise give_up(jobid, f"gpucr: restore of job {jobid} from {gen.name} failed: {e.one_line()}") from e
    steps = (batch or {}).get("timings") or {}  # CRIU and GPU parts: the figures of a restore
    log(f"batch tree restored in {time.monotonic() - t0:.2f} s "
        + json.dumps({k: round(v, 3) for k, v in steps.items() if k.endswith("_s")}))
    return m, gen, batch


def restore_ranks(jobid: str, m: dict, gen: Path, launcher: subprocess.Popen | None) -> int | None:
    """Step 3: the srun step's ranks; their status goes to the restored srun
    wrapper. Returns the step's exit status (None: there was no step)."""
    try:
        rc = restore_rank_step(gen, m, jobid)
    except GpucrError as e:
        if launcher is not None:
            launcher.kill()
        raise give_up(jobid, f"gpucr: restore of job {jobid} from {gen.name} failed: {e.one_line()}") from e
    if rc is not None:
        hand_status(m, rc)
    return rc
