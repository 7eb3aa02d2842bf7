"""Job-level checkpoint, preempt and restore: what `gpucr-hpc checkpoint JOBID` runs.

The work happens in the node agents (job/checkpoint/agent.py), one per node, started inside
the job's own allocation; this side picks the generation, launches them and
reads their reports.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import threading
import time
from dataclasses import asdict

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.gpu import steer as gpu_steer
from gpucr_hpc.job import dirs as job_dirs
from gpucr_hpc.job import events, generations
from gpucr_hpc.job import lock as job_lock
from gpucr_hpc.job.checkpoint import progress
from gpucr_hpc.regular_file import NOT_REGULAR, open_regular
from gpucr_hpc.slurm import commands as slurm
from gpucr_hpc.slurm.site import load_site, require_plugin
from gpucr_hpc.store import manifest as mf

AGENT_TIMEOUT_S = 600


def _job_for_action(jobid: str, settled: bool = False) -> slurm.Job:
    job = slurm.show_job(jobid)
    slurm.check_access(job)
    return slurm.settled(job) if settled else job


def launch_agents(job: slurm.Job, agent_args: list[str]) -> tuple[dict | None, list[dict], str]:
    """One agent per node of the job, as an overlapping step, in one MPI world.

    Returns rank 0's result (None when the agents broke), the node reports, and
    the last line the agents wrote to stderr (why they broke)."""
    argv = ["srun", f"--jobid={job.id}", "--overlap", f"--nodes={len(job.nodes)}",
            f"--ntasks={len(job.nodes)}", "--ntasks-per-node=1",
            "--mpi=pmix" if len(job.nodes) > 1 else "--mpi=none",
            # An agent that dies would leave the others waiting in the vote forever.
            "--gpucr=off", "--kill-on-bad-exit=1", "--job-name=gpucr-agent",
            sys.executable, "-m", "gpucr_hpc.job.checkpoint.agent", *agent_args, "--job-json", _job_json(job)]
    argv = as_job_user(job, argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_SPANK_")}
    try:
        stdout, stderr, rc = _run_streaming(argv, env)
    except subprocess.TimeoutExpired as e:
        raise GpucrError(f"the node agents of job {job.id} did not finish in {AGENT_TIMEOUT_S} s",
                         "see the slurmd logs of the job's nodes; the job was left running") from e
    except FileNotFoundError as e:  # srun, or runuser for root
        raise GpucrError(f"{argv[0]} not found, which starts the node agents of job {job.id}",
                         "install the Slurm client commands (and util-linux's runuser, with which root "
                         "starts them as the job's user), or fix PATH") from e
    result = next((line["result"] for line in stdout if "result" in line), None)
    reports = [line["node_report"] for line in stdout if "node_report" in line]
    why = stderr.strip().splitlines()[-1] if stderr.strip() else f"srun exit {rc}"
    return result, reports, why


def _run_streaming(argv: list[str], env: dict) -> tuple[list[dict], str, int]:
    """The agents' step: their JSON lines as they come (progress lines go to the
    listeners at once), their stderr, and srun's exit status."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
    reader.start()
    timer = threading.Timer(AGENT_TIMEOUT_S, proc.kill)
    timer.start()
    lines = []
    try:
        for text in proc.stdout or ():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if isinstance(line, dict) and progress.KEY in line:
                progress.heard(line[progress.KEY])
            elif isinstance(line, dict):
                lines.append(line)
        rc = proc.wait()
    finally:
        expired = not timer.is_alive()
        timer.cancel()
    reader.join()
    if expired and rc != 0:
        raise subprocess.TimeoutExpired(argv, AGENT_TIMEOUT_S)
    return lines, "".join(err), rc


def as_job_user(job: slurm.Job, argv: list[str]) -> list[str]:
    """Root starts the agents as the job's user: Slurm lets only the job's owner
    create a step in it (root too gets Access/permission denied), and the agents
    must act with the user's rights (CRIU through the root helper, files the user's)."""
    if os.geteuid() == 0 and job.uid > 0:
        return ["runuser", "-u", job.user, "--", *argv]
    return argv


def _job_json(job: slurm.Job) -> str:
    return json.dumps({k: v for k, v in asdict(job).items() if k != "raw"})


def _running_job(jobid: str, verb: str) -> slurm.Job:
    job = _job_for_action(jobid)
    if not job.running:
        raise GpucrError(f"job {jobid} is {job.state}, not RUNNING",
                         f"only a running job can be {verb}")
    return job


def _locked(job: slurm.Job, wait_s: float = 0.0):
    """The job's lock (job/lock.py), in its directory: one command on a job at a time."""
    job_dir = job_dirs.ensure(load_site().job_image_dir(job.id), job.uid)
    return job_lock.held(job_dir, job.id, job.uid, wait_s=wait_s)


def _told(job: slurm.Job, what: str, run):
    """run() under the job's lock, recorded in the job's events (job/events.py)."""
    return events.told(load_site().job_image_dir(job.id), job.uid, what, run)


def checkpoint(jobid: str) -> dict:
    """Checkpoint every unit of a running job into a new generation; the job runs on."""
    require_plugin(load_site())
    job = _running_job(jobid, "checkpointed")
    with _locked(job):
        return _told(job, "checkpoint", lambda: _checkpoint(jobid, job))


def _checkpoint(jobid: str, job: slurm.Job, stay_yielded: bool = False) -> dict:
    """checkpoint, under the job's lock. stay_yielded (preempt): its GPU memory stays
    yielded, for the requeue that follows."""
    t0 = time.monotonic()
    site = load_site()
    gen_dir = generations.new_generation(site.job_image_dir(job.id), job.uid)
    args = ["checkpoint", "--gen-dir", str(gen_dir)] + ["--stay-yielded"] * stay_yielded
    try:
        result, reports, why = launch_agents(job, args)
    except GpucrError:
        _discard_uncommitted(gen_dir)
        raise
    if result is None:
        _discard_uncommitted(gen_dir)
        raise GpucrError(f"checkpoint of job {jobid} aborted: the node agents failed ({why})",
                         "the job was left running; see the slurmd logs of its nodes")
    result["total_s"] = time.monotonic() - t0
    result["node_reports"] = reports
    if not result["committed"]:
        raise GpucrError(f"checkpoint of job {jobid} aborted: {'; '.join(result['errors'])}",
                         "the job was left running and the previous checkpoint is intact")
    return result


def _discard_uncommitted(gen_dir) -> None:
    if gen_dir.exists() and not (gen_dir / mf.COMMITTED).exists():
        generations.discard(gen_dir)


def _in_place(job: slurm.Job, action: str) -> dict:
    result, reports, why = launch_agents(job, [action])
    if result is None:
        raise GpucrError(f"the node agents of job {job.id} failed ({why})",
                         "see the slurmd logs of its nodes")
    result["node_reports"] = reports
    return result


def suspend(jobid: str) -> dict:
    """GPU state of every rank checkpointed in place (VRAM yielded), then scontrol suspend."""
    t0 = time.monotonic()
    require_plugin(load_site())
    job = _running_job(jobid, "suspended")
    slurm.require_operator("suspend", jobid)  # before the GPU memory is yielded for nothing
    with _locked(job):
        return _told(job, "suspend", lambda: _suspend(jobid, job, t0))


def _suspend(jobid: str, job: slurm.Job, t0: float) -> dict:
    result = _in_place(job, "yield")
    if not result["ok"]:
        raise GpucrError(f"suspend of job {jobid} aborted: {'; '.join(result['errors'])}",
                         "the job was left running with its GPU memory")
    try:
        slurm.suspend(jobid)
    except GpucrError as e:
        back = _in_place(job, "reclaim")
        state = ("its GPU state is back" if back["ok"]
                 else f"its GPU state did not come back ({'; '.join(back['errors'])})")
        raise GpucrError(f"{e.cause}; the job was left running and {state}", e.fix) from e
    result["total_s"] = time.monotonic() - t0
    return result


def resume(jobid: str) -> dict:
    """scontrol resume, then the GPU state of every rank restored in place."""
    t0 = time.monotonic()
    require_plugin(load_site())
    job = _job_for_action(jobid)
    if job.state not in ("SUSPENDED", "RUNNING"):
        raise GpucrError(f"job {jobid} is {job.state}, not SUSPENDED", "only a suspended job can be resumed")
    with _locked(job):
        return _told(job, "resume", lambda: _resume(jobid, job, t0))


def _resume(jobid: str, job: slurm.Job, t0: float) -> dict:
    if job.state == "SUSPENDED":
        slurm.require_operator("resume", jobid)
        slurm.resume(jobid)  # RUNNING: a retry, only the GPU state is left to restore
    result = _in_place(job, "reclaim")  # the shim's gate holds GPU calls until this is done
    if not result["ok"]:
        raise GpucrError(f"job {jobid} resumed, but its GPU state was not restored: "
                         f"{'; '.join(result['errors'])}",
                         f"retry with `gpucr-hpc resume {jobid}` once the cause is fixed")
    result["total_s"] = time.monotonic() - t0
    return result


def preempt(jobid: str, lock_wait_s: float = 0.0) -> dict:
    """Checkpoint, then requeue: the job restarts from this checkpoint. Its GPU memory
    is yielded at the checkpoint and stays so until the requeue ends the job; if
    the requeue fails, the GPU state goes back and the job runs on.
    lock_wait_s: how long to wait for another command on the job to end (the
    automatic checkpoint waits; a user's command is refused at once)."""
    require_plugin(load_site())
    job = _running_job(jobid, "preempted")
    if not job.requeue:
        raise GpucrError(f"job {jobid} cannot be requeued (submitted with --no-requeue)",
                         f"checkpoint it instead (gpucr-hpc checkpoint {jobid}), or let it be "
                         f"requeued: scontrol update JobId={jobid} Requeue=1")
    with _locked(job, lock_wait_s):
        return _told(job, "preempt", lambda: _preempt(jobid, job))


def _preempt(jobid: str, job: slurm.Job) -> dict:
    result = _checkpoint(jobid, job, stay_yielded=True)
    t = time.monotonic()
    try:
        steering = _requeue(job)
    except GpucrError as e:
        back, _, why = launch_agents(job, ["resume-held", "--gen-dir", result["image"]])
        state = ("the job runs on with its GPU state" if back and back["ok"] else
                 f"its GPU state did not come back ({'; '.join(back['errors']) if back else why})")
        raise GpucrError(f"requeue of job {jobid} failed ({e.cause}); checkpoint {result['generation']} "
                         f"is committed and {state}",
                         f"see `scontrol show job {jobid}`; restore it later with gpucr-hpc restore {jobid}")
    result["requeue_s"] = time.monotonic() - t
    return {**result, **steering}


def _requeue(job: slurm.Job) -> dict:
    """scontrol requeue, then the job steered to its GPU model (gpu_steer):
    {"gpu_steering": what was added, or why not} when there was anything to say."""
    slurm.requeue(job.id)
    steered = gpu_steer.steer(job, load_site().gpu_feature)
    return {"gpu_steering": steered} if steered else {}


def _read_script(target) -> str | None:
    """The generation's copy of the batch script: a regular file, never through a link."""
    try:
        fd = open_regular(target / "script")
    except FileNotFoundError:
        return None
    except OSError as e:
        what = (f"{target / 'script'} is not a regular file" if e.errno == NOT_REGULAR
                else f"cannot read {target / 'script'}: {e.strerror}")
        raise GpucrError(what, "bring back a checkpoint of your own") from e
    with os.fdopen(fd, errors="replace") as f:
        return f.read()


def _group_of(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def restore(jobid: str, gen: int | None = None) -> dict:
    """Restore a job that is not running from a committed generation (default: the newest).

    Marks the generation to restore and requeues the job; when it starts again,
    the plugin restores it from that generation instead of running the script.
    """
    site = load_site()
    require_plugin(site)
    try:
        job = _job_for_action(jobid, settled=True)  # a job still completing is requeued by then
    except slurm.JobUnknown:  # Slurm's own answer, never a failure to reach it (SlurmUnreachable)
        return resubmit(jobid, gen, forced=False)
    if job.running:
        raise GpucrError(f"job {jobid} is running", "preempt it instead (gpucr-hpc preempt JOBID)")
    job_dir = site.job_image_dir(job.id)
    if not job_dirs.check(job_dir, job.uid):
        generations.restore_target(job_dir, gen)  # says there is no checkpoint
    with job_lock.held(job_dir, job.id, job.uid):
        return _restore(job, job_dir, gen)


def _restore(job: slurm.Job, job_dir, gen: int | None) -> dict:
    jobid = job.id
    target = generations.restore_target(job_dir, gen)
    mf.load(target)  # committed and intact manifest, or a one-line error
    submission = generations.generation_submission(target)
    with job_dirs.as_owner(job.uid):  # root restoring a user's job: the job's restorer removes it
        generations.write_pointer(job_dir, generations.RESTORE, target, submission)
    if job.state == "PENDING":
        if job.held:
            slurm.release(jobid)  # held by a failed restore: try again with this generation
        return {"job": job.id, "generation": target.name, "requeued": False}
    return {"job": job.id, "generation": target.name, "requeued": True, **_requeue(job)}


def resubmit(jobid: str, gen: int | None = None, forced: bool = True) -> dict:
    """A job Slurm no longer knows (slurmctld lost it, or gave its id to another
    job: `restore JOBID --from N --resubmit`, forced), submitted again from its
    committed generation: as its user, with its output files, node count and
    partition, and GPUCR_RESTORE_FROM naming the generation, which the new job
    (a new id) restores when it starts (generations.start_target).

    Whose job it is comes from the job directory's owner (the plugin made it for
    the job's user), never from the manifest, which is the user's file: root reads
    the generation and the script as that user, and submits as that user.

    Never a second copy of a job that may still live: only under the job's lock
    (a command on it, or its own restore, holds it: refused), only once Slurm
    has answered again, under the lock, that it knows no job of this id (forced:
    that it answered at all), and not while an earlier resubmission of it is
    still a job Slurm knows (events)."""
    site = load_site()
    require_plugin(site)
    job_dir = site.job_image_dir(jobid)
    if not os.path.isdir(job_dir):
        generations.any_committed(job_dir, gen)  # says there is no checkpoint
    owner = job_dirs.owner(job_dir)
    if os.geteuid() not in (0, owner):
        raise GpucrError(f"the checkpoints of job {jobid} belong to uid {owner}, you are uid {os.geteuid()}",
                         "only the job's owner or root can bring it back")
    with job_lock.held(job_dir, jobid, owner):
        result = _resubmit(jobid, gen, job_dir, owner, forced)
    events.record(job_dir, owner, what="resubmit", ok=True, generation=result["generation"],
                  resubmitted_as=result["resubmitted_as"])
    return result


def _still_gone(jobid: str, job_dir, forced: bool) -> None:
    """Refuses a resubmission unless Slurm answers (SlurmUnreachable otherwise) that
    it knows no job `jobid` (forced: any answer) and that no earlier resubmission
    of it is still a live job."""
    try:
        job = slurm.show_job(jobid)
        if not forced:
            raise GpucrError(f"job {jobid} is known to Slurm again ({job.state}): not submitted again",
                             f"run gpucr-hpc restore {jobid} again")
    except slurm.JobUnknown:
        pass
    earlier = [ev for ev in events.read(job_dir) if ev.get("what") == "resubmit" and ev.get("ok")
               and str(ev.get("resubmitted_as", "")).isdigit()]
    if not earlier:
        return
    new_id = str(earlier[-1]["resubmitted_as"])
    try:
        again = slurm.show_job(new_id)
    except slurm.JobUnknown:
        return
    if again.state not in slurm.FINISHED:
        raise GpucrError(f"job {jobid} was already submitted again as job {new_id}, which is {again.state}",
                         f"that job is its copy (gpucr-hpc status {new_id}); to start over, "
                         f"scancel {new_id} first")


def _resubmit(jobid: str, gen: int | None, job_dir, owner: int, forced: bool) -> dict:
    with job_dirs.as_owner(owner):
        target = generations.any_committed(job_dir, gen)
        m = mf.load(target)
        script = _read_script(target)
    job = m.get("job") or {}
    if m.get("owner_uid") != owner:
        raise GpucrError(f"{target} names uid {m.get('owner_uid')} as its owner, but {job_dir} belongs to uid "
                         f"{owner}", "bring back only a job whose checkpoint its own user made")
    if script is None:
        raise GpucrError(f"job {jobid} is not known to Slurm and {target.name} holds no copy of its "
                         "batch script (checkpointed by an older gpucr-hpc)",
                         f"submit the same script again with sbatch --gpucr=on -N {len(m.get('nodes', []))} "
                         f"-o {job.get('std_out')} --export=ALL,GPUCR_RESTORE_FROM={target}")
    ranks = sum(1 for name in m.get("units", {}) if name.startswith("rank-"))
    argv = ["sbatch", "--parsable", "--gpucr=on", f"--nodes={len(m.get('nodes') or [1])}",
            f"--ntasks={max(ranks, 1)}",  # room for the restored step's ranks
            f"--output={job['std_out']}", f"--error={job.get('std_err') or job['std_out']}",
            f"--export=ALL,GPUCR_RESTORE_FROM={target}"]
    argv += [f"--partition={job['partition']}"] if job.get("partition") else []
    if os.geteuid() == 0 and owner != 0:
        argv += [f"--uid={owner}", f"--gid={_group_of(owner)}"]  # root brings a user's job back as that user
    _still_gone(jobid, job_dir, forced)  # asked last, under the lock: what Slurm says now
    out = slurm.run(*argv, stdin=script)
    new_id = out.stdout.strip().split(";")[0]
    return {"job": jobid, "generation": target.name, "requeued": False, "resubmitted_as": new_id}
