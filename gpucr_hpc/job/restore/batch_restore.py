"""Restoring a requeued job inside its new batch step.

When a `--gpucr=on` job starts and its own submission has a committed
checkpoint (whatever its restart count; generations.start_target), or it was
submitted again from one (GPUCR_RESTORE_FROM), the plugin sets
GPUCR_RESTORE_BATCH=1 and the
batch supervisor (job/restore/batch_supervisor.py) calls this instead of starting the
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

The job's lock (job/lock.py) is held from step 1 until every rank is back:
a checkpoint taken meanwhile would find ranks missing and commit a
generation without them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.criu.run import end_tree
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import dirs as job_dirs
from gpucr_hpc.job import generations, nccl_ranks
from gpucr_hpc.job import lock as job_lock
from gpucr_hpc.job.connections import rank_connections
from gpucr_hpc.job.restore import restore_cap, unit_source
from gpucr_hpc.job.restore.placement import place, ranks_of
from gpucr_hpc.job.restore_log import log, open_log, say, say_again_after_rewind
from gpucr_hpc.process import image as process_image
from gpucr_hpc.process import nccl_cut
from gpucr_hpc.slurm import commands as slurm
from gpucr_hpc.slurm.site import load_site, node_name
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import manifest as mf
from gpucr_hpc.tcp import lock as netlock

RANKS_BACK = "ranks-back"  # one file per rank restored by the running restore step
LOCK_WAIT_S = 60.0  # a command that holds the job's lock as its next run starts
RANKS_POLL_S = 0.2


def restore_batch_tree(jobid: str, site, lock: ExitStack) -> tuple[dict, Path, dict | None]:
    """Steps 1 and 2: returns the job manifest, its generation and the report
    of the script tree's restore ("pid": the restored script, "_launcher": the
    process whose exit status is the script's), or None for a job that had no
    batch unit. Raises RestoreFailed."""
    job_dir = site.job_image_dir(jobid)
    try:
        job_dirs.check(job_dir, os.geteuid())  # the job's own, or never used (not even to log)
    except GpucrError as e:
        open_log(None)
        raise give_up(jobid, f"gpucr: cannot restore job {jobid}: {e.one_line()}",
                      "its image directory is not the job's own", "fix its owner and mode, "
                      f"gpucr-hpc restore {jobid}") from e
    open_log(job_dir)
    from_older = f"gpucr-hpc restore {jobid} --from N"
    try:
        lock.enter_context(job_lock.held(job_dir, jobid, os.geteuid(), f"the restore of job {jobid}",
                                         wait_s=LOCK_WAIT_S))
    except GpucrError as e:
        raise give_up(jobid, f"gpucr: cannot restore job {jobid}: {e.one_line()}",
                      "another command held the job", f"gpucr-hpc restore {jobid}") from e
    try:
        gen = unit_source.generation(job_dir)
        m = check_generation(gen, jobid)
    except UnusableGeneration as e:
        raise give_up(jobid, f"gpucr: cannot restore job {jobid}: {e.one_line()}", e.summary, from_older) from e
    except generations.LostCheckpoint as e:  # checkpointed, and the checkpoint is gone: never run from the top
        raise give_up(jobid, f"gpucr: cannot restore job {jobid}: {e.one_line()}", e.summary, e.then) from e
    except GpucrError as e:
        raise give_up(jobid, f"gpucr: cannot restore job {jobid}: {e.one_line()}",
                      "no committed checkpoint to restore", from_older) from e
    except OSError as e:
        raise give_up(jobid, f"gpucr: cannot restore job {jobid}: {unreadable(e)}",
                      "its checkpoint cannot be read", from_older) from e
    try:  # a job that fails right after each restore is held, not looped
        asked = (job_dir / generations.RESTORE).exists()  # gpucr-hpc restore pinned it
        restore_cap.count(job_dir, gen.name, asked, int(config.value("GPUCR_RESTORE_CAP")))
    except GpucrError as e:
        raise give_up(jobid, f"gpucr: cannot restore job {jobid}: {e.one_line()}",
                      f"{gen.name} restored again and again", f"fix that, gpucr-hpc restore {jobid}") from e
    log(f"restoring job {jobid} from {gen}")
    t0 = time.monotonic()
    put_back_outputs(gen, m)
    for u in m["units"].values():  # a stale status from before the checkpoint must not count
        if u.get("srun_status"):
            Path(u["srun_status"]).unlink(missing_ok=True)
    batch = None
    try:
        if "batch" in m["units"]:
            batch = restore_batch_unit(gen, m, site, jobid, lock)
        if asked and gen.parent == job_dir:  # the generation asked for in place of a lost LATEST is it now
            generations.mend_latest(job_dir, gen, config.value("GPUCR_SUBMISSION"))
        (job_dir / generations.RESTORE).unlink(missing_ok=True)
    except GpucrError as e:
        if batch is not None:
            batch["_launcher"].kill()
        raise give_up(jobid, f"gpucr: restore of job {jobid} from {gen.name} failed: {e.one_line()}",
                      f"the script's tree of {gen.name} did not restore",
                      f"fix that, gpucr-hpc restore {jobid}") from e
    say_again_after_rewind(gen)  # the restored tree holds the output at its checkpoint size
    steps = (batch or {}).get("timings") or {}  # CRIU and GPU parts: the figures of a restore
    took = time.monotonic() - t0
    log(f"batch tree restored in {took:.2f} s "
        + json.dumps({k: round(v, 3) for k, v in steps.items() if k.endswith("_s") or k == "gpu_arenas_kept"}))
    taken = m.get("created", "?").replace("T", " ").rstrip("Z")
    say(f"gpucr: job {jobid} restored from {gen.name} (checkpointed {taken} UTC) on {node_name()} "
        f"in {took:.1f} s" + (", its ranks next" if ranks_of(m) else ""))
    return m, gen, batch


def restore_batch_unit(gen: Path, m: dict, site, jobid: str, hold: ExitStack) -> dict:
    """The script's tree, its TCP connections locked while CRIU restores them and
    their ends moved to where they are now; the lock on those to ranks goes into
    `hold`, let go once every rank is back (restore_rank_step)."""
    unit = m["units"]["batch"]
    tcp = unit.get("tcp") or {}
    checked = m.get(UNITS_CHECKED, False)
    if not tcp:
        return restore_unit(gen, unit, site, jobid, verified=checked)
    moved = rank_connections.moves(unit, place(m))
    if not tcp.get("links"):
        return restore_unit(gen, unit, site, jobid, moved=moved, verified=checked)
    lease = netlock.Lease(rank_connections.lock_name(jobid, unit), rank_connections.flows(unit, moved),
                          float(config.value("GPUCR_LOCK_LEASE")), taken=True)
    with ExitStack() as mine:
        mine.enter_context(lease)
        rep = restore_unit(gen, unit, site, jobid, moved=moved, lock=lease.spec, verified=checked)
        if tcp.get("peers"):
            hold.push(mine.pop_all())
    return rep


def restore_unit(gen: Path, unit: dict, site, jobid: str,
                 inherit: dict[int, str] | None = None, moved: dict[str, str] | None = None,
                 lock: netlock.Spec | None = None, verified: bool = True) -> dict:
    """Restore one unit in a new PID namespace and record it in this node's registry.
    moved: its TCP ends that are elsewhere now (job/rank_connections); lock: the
    lock on its connections to other ranks, taken before CRIU runs; verified:
    check_generation checked the generation's images on the image root."""
    # The shim's control socket is bound under the run dir of the node it ran on
    # (of the job id it ran as: a resubmitted job has a new one).
    old_id = str(generations.manifest_of(gen)["job"]["id"])
    old_run_dir = site.job_run_dir(old_id, unit["node"])
    with ExitStack() as reading:  # node memory stays until CRIU and the GPU data are in
        source, checked, where = unit_source.locate(gen, unit, old_id, reading, verified)
        created = recreate_paths(source, unit, old_id, old_run_dir, jobid)
        t0 = time.monotonic()
        try:
            rep = process_image.restore_from(source, pidns="new", rewind_files=True, inherit=inherit,
                                             checksums_verified=checked, tied=True, moved=moved, lock=lock,
                                             closed=[tuple(c) for c in (unit.get("tcp") or {}).get("closed", [])])
        finally:
            remove_created(created)  # the restored shell holds it open by now
    log(f"{unit['name']} of {gen.name} read from {where} on {node_name()}, restored in "
        f"{time.monotonic() - t0:.2f} s{phases_said(rep.get('timings') or {})}")
    if unit["name"] == "batch" and unit.get("nccl"):  # the script's own ranks: all in this tree
        try:
            nccl_cut.rebuild(nccl_ranks.ranks_in([rep["pid"]], old_run_dir), old_run_dir, reload=True)
        except GpucrError:
            # ranks without communicators cannot run on; the job is held by the caller,
            # and its hold must not be what ends them (it may fail)
            end_tree(rep["pid"], rep["_launcher"])
            raise
    register(site.job_run_dir(jobid), unit, rep["pid"])
    return rep


def restore_ranks(jobid: str, m: dict, gen: Path, launcher: subprocess.Popen | None,
                  lock: ExitStack | None = None) -> int | None:
    """Step 3: the srun step's ranks; their status goes to the restored srun
    wrapper. Returns the step's exit status (None: there was no step)."""
    try:
        rc = restore_rank_step(gen, m, jobid, lock)
    except GpucrError as e:
        if launcher is not None:
            launcher.kill()
        raise give_up(jobid, f"gpucr: restore of job {jobid} from {gen.name} failed: {e.one_line()}",
                      f"the ranks of {gen.name} did not restore", f"fix that, gpucr-hpc restore {jobid}") from e
    if rc is not None:
        hand_status(m, rc)
    return rc


def restore_rank_step(gen: Path, m: dict, jobid: str, lock: ExitStack | None = None) -> int | None:
    """The srun step that was running: restored as a new step of the same layout.
    `lock` (the job's) is let go once every rank is back, or the step has ended."""
    ranks = ranks_of(m)
    lock = lock or ExitStack()
    if not ranks:
        lock.close()
        return None
    job_dirs.fresh_folder(gen.parent / RANKS_BACK)
    if any(u.get("nccl") for u in ranks):
        nccl_ranks.fresh_ids_folder(gen.parent)
    where = place(m)
    placed = [where[u["name"]] for u in ranks]
    hostfile = gen.parent / "rank-nodes"  # the layout the ranks are restored to, one line per rank
    hostfile.write_text("".join(f"{n}\n" for n in placed))
    argv = ["srun", f"--nodes={len(set(placed))}", f"--ntasks={len(ranks)}", "--gpucr=off",
            "--kill-on-bad-exit=0", "--job-name=gpucr-restore",
            "--distribution=arbitrary", sys.executable, "-m", "gpucr_hpc.job.restore.rank_restore",
            "--gen-dir", str(gen)] + ["--unchecked"] * (not m.get(UNITS_CHECKED, False))
    # The job's submission token stays: the plugin makes the job's run dir for this
    # --gpucr=off step only in a --gpucr=on job, which the token tells.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_SPANK_", "GPUCR_RESTORE")) or k == "SLURM_SPANK_GPUCR_SUBMISSION"}
    # The real srun: the wrapper is first in PATH in the batch step.
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if p != load_site().bindir)
    env.update({"SLURM_HOSTFILE": str(hostfile), rank_connections.RANK_NODES_ENV: ",".join(placed),
                rank_connections.BATCH_NODE_ENV: where["batch"]})
    step = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    while step.poll() is None and _ranks_back(gen.parent) < len(ranks):
        time.sleep(RANKS_POLL_S)
    lock.close()
    return step.wait()


# Set on the manifest check_generation returns (never written to disk): its units'
# images on the image root were checked, so a restore need not read them twice.
UNITS_CHECKED = "units_checked"


def check_generation(gen: Path, jobid: str) -> dict:
    """Every unit image is committed and intact before anything is touched."""
    older = (f"restore an older generation: gpucr-hpc restore {jobid} --from N "
             f"(gpucr-hpc ls {jobid} lists them)")
    staged = generations.is_staged(gen)  # its units: checked where they are read (unit_source)
    try:
        m = generations.manifest_of(gen)
        image_store.verify(gen, m)
    except GpucrError as e:
        raise UnusableGeneration(f"{gen.name} is not usable", e.cause, older) from e
    except OSError as e:  # an unreadable file is a bad image like any other: the job is held
        raise UnusableGeneration(f"{gen.name} is not usable", unreadable(e), older) from e
    for name in m.get("units", {}) if not staged else ():
        try:
            image_store.open_image(gen / name)
        except GpucrError as e:
            raise UnusableGeneration(f"{gen.name} has no usable image of {name}", e.cause, older) from e
        except OSError as e:
            raise UnusableGeneration(f"{gen.name} has no usable image of {name}", unreadable(e), older) from e
    m[UNITS_CHECKED] = not staged
    return m


class UnusableGeneration(GpucrError):
    """A generation that cannot be restored: `summary` is the short form (a job's Comment)."""

    def __init__(self, summary: str, why: str, fix: str):
        super().__init__(f"{summary}: {why}", fix)
        self.summary = summary


def unreadable(e: OSError) -> str:
    return f"cannot read {e.filename}: {e.strerror}" if e.filename else f"a file cannot be read: {e.strerror or e}"


def put_back_outputs(gen: Path, m: dict) -> None:
    for u in m["units"].values():
        for path, rec in (u.get("saved_output") or {}).items():
            with open(gen / rec["file"], "rb") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def recreate_paths(image: Path, unit: dict, old_id: str, old_run_dir: Path, jobid: str) -> list[Path]:
    """The unit's old run dir, and the batch script at its old path: what the
    restored processes find open. Returns what was created for the restore only."""
    try:
        old_run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return provide_batch_script(image) if unit["name"] == "batch" else []
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


def provide_batch_script(image: Path) -> list[Path]:
    """bash keeps its script open: the restored shell needs it at its old path.

    On a cluster that path (slurmd's spool) is the same on every node and the
    restarted job's identical script is there; on another node of a test
    cluster sharing one machine it differs, so the new copy is put there.
    Returns what was created: it must go once the shell has it open, since
    that is another slurmd's spool (it would refuse to launch the job there).
    """
    script = config.value("GPUCR_BATCH_SCRIPT")
    created: list[Path] = []
    if not script:
        return created
    for rec in mf.load(image).get("open_files") or []:
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


def register(run_dir: Path, unit: dict, pid: int) -> None:
    """Record a restored unit in this node's task registry, as the plugin does for tasks."""
    tasks = run_dir / "tasks"
    tasks.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = f"{unit['step']}.{unit['rank']}"
    tmp = tasks / f".{name}.tmp"
    tmp.write_text(f"pid={pid}\nrank={unit['rank']}\nlocal_id={unit['rank']}\nstep={unit['step']}\n")
    tmp.rename(tasks / name)


PHASES = (("checks_s", "checks"), ("criu_restore_s", "CRIU"), ("gpu_control_s", "driver"),
          ("gpu_attach_s", "arena"), ("gpu_h5_read_s", "GPU data read"), ("gpu_data_s", "to the GPU"),
          ("gpu_fill_s", "arena filled beside CRIU and the driver"))


def phases_said(timings: dict) -> str:
    """Where a restore's time went, for its restore.log line: ' (CRIU 0.61 s, arena 0.90 s, ...)'."""
    kept = timings.get("gpu_arenas_kept")  # mapped as the checkpoint left it in node memory: no fill
    said = [f"{name} {timings[key]:.2f} s" for key, name in PHASES
            if isinstance(timings.get(key), (int, float)) and not (kept and key == "gpu_fill_s")]
    if kept:
        said.append(f"{kept} arena(s) as the checkpoint left them in node memory")
    return f" ({', '.join(said)})" if said else ""


def rank_back(job_dir: Path, procid: int) -> None:
    """Said by a rank's restore task once its rank runs again."""
    (Path(job_dir) / RANKS_BACK / str(procid)).touch()


def _ranks_back(job_dir: Path) -> int:
    try:
        return len(os.listdir(Path(job_dir) / RANKS_BACK))
    except OSError:
        return 0


def hand_status(m: dict, rc: int) -> None:
    for path in {u.get("srun_status") for u in m["units"].values() if u.get("srun_status")}:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{rc}\n")
        os.rename(tmp, path)


class RestoreFailed(Exception):
    """The job could not be restored; it was requeued and held with the reason."""


def give_up(jobid: str, reason: str, summary: str, then: str) -> RestoreFailed:
    """The job requeued and held. `reason`, the whole line, goes to restore.log and the
    job's output; its Comment says `summary` (what failed, a few words) and `then` (the
    command that restores it once fixed): short and whole by construction, never cut."""
    log(reason)
    say(reason)
    slurm.requeue_hold(jobid, hold_comment(jobid, summary, then))
    return RestoreFailed(reason)


def hold_comment(jobid: str, summary: str, then: str) -> str:
    return f"gpucr: cannot restore job {jobid}: {summary}; why: gpucr-hpc status {jobid}; then: {then}"
