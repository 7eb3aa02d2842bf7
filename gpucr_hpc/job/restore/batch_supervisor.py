"""The batch step of a `--gpucr=on` job: the script runs under this supervisor.

The plugin makes the gpucr-hpc command the batch step's task (spank/restart.c)
and sets GPUCR_BATCH_SUPERVISE=1. The supervisor

1. starts the script as its child, or, for a requeued job with a committed
   checkpoint, restores the script's tree and the running step's ranks
   (job/restore/batch_restore.py); a job checkpointed before whose checkpoint is gone
   (generations.lost) is held with the reason, never run from the top;
2. records the script's pid in the task registry, so that node agents
   checkpoint the script's tree, never this process;
3. on the job's warning signal (GPUCR_CHECKPOINT_SIGNAL: Slurm sends it at the
   start of a preemption's grace time, and before the time limit; see
   spank/warn_signal.c) checkpoints the whole job and requeues it, so that it
   goes on from there when it runs again;
4. hands the other signals sent to it alone (`scancel --batch --signal`) on to
   the script;
5. every GPUCR_CHECKPOINT_INTERVAL seconds (`--gpucr-interval`, plugstack
   `interval=`), checkpoints the job in place, against node failures; one that
   finds another checkpoint running is skipped;
6. says in the job's output what commands did to the job meanwhile (job/events.py);
7. exits with the script's status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Set
from contextlib import ExitStack

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import events, generations, restore_log
from gpucr_hpc.job.checkpoint import coordinator
from gpucr_hpc.job.restore import batch_restore
from gpucr_hpc.slurm import commands as slurm
from gpucr_hpc.slurm.signals import TASK_SIGNALS
from gpucr_hpc.slurm.site import load_site

# Ours only: read here, never passed to the script (a gpucr-hpc command in it
# must not think it is the supervisor).
OWN_ENV = ("GPUCR_BATCH_SUPERVISE", "GPUCR_RESTORE_BATCH", "GPUCR_BATCH_SCRIPT",
           "GPUCR_BATCH_ARGV", "GPUCR_CHECKPOINT_SIGNAL", "GPUCR_CHECKPOINT_LEAD")
FORWARDED = TASK_SIGNALS


def say(msg: str) -> None:
    restore_log.say(f"gpucr: {msg}")  # kept: a later restore's rewind must not erase it


def checkpoint_signal(name: str | None) -> signal.Signals | None:
    if not name or name == "off":
        return None
    try:
        return signal.Signals[f"SIG{name}"]
    except KeyError:
        say(f"unknown checkpoint signal {name!r} (plugstack.conf signal=); "
            "no automatic checkpoint for this job")
        return None


def script_argv(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """Slurm 22.05: argv[0] (the script) was replaced by us; 23.02+: we were put before it."""
    if config.value("GPUCR_BATCH_ARGV", env) == "prepended":
        return argv[1:]
    return [config.value("GPUCR_BATCH_SCRIPT", env, required=True), *argv[1:]]


def split_env(bindir: str) -> dict:
    """The script's environment (the job's, shim included); this process keeps
    one without the shim and without the srun wrapper, for what it starts."""
    child_env = {k: v for k, v in os.environ.items() if k not in OWN_ENV}
    os.environ.pop("LD_PRELOAD", None)
    os.environ["PATH"] = ":".join(p for p in os.environ.get("PATH", "").split(":") if p != bindir)
    return child_env


def seconds(limit: str) -> int | None:
    """Slurm's TimeLimit ([D-]HH:MM:SS, MM:SS, UNLIMITED) in seconds."""
    days, _, hms = limit.rpartition("-")
    try:
        parts = [int(x) for x in hms.split(":")]
    except ValueError:
        return None
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def checkpoint_and_requeue(jobid: str, lead: int) -> None:
    try:
        job = slurm.show_job(jobid)
    except GpucrError as e:
        say(f"automatic checkpoint of job {jobid} skipped: {e.one_line()}")
        return
    preempted = job.raw.get("PreemptTime", "None") != "None"
    why = "preemption" if preempted else "the time limit"
    limit = seconds(job.raw.get("TimeLimit", ""))
    if not preempted and limit is not None and limit < 2 * lead:
        # Else every run would be warned right at its start and requeued again.
        say(f"job {jobid}'s time limit ({job.raw['TimeLimit']}) is shorter than twice the "
            f"checkpoint lead ({lead} s): not checkpointing before it, so that it cannot "
            "requeue forever; ask for a longer --time")
        return
    if not job.requeue:  # it could only be checkpointed, never brought back by a requeue
        say(f"job {jobid} was submitted with --no-requeue: not checkpointing it before {why}; "
            "submit it without --no-requeue to have it checkpointed, requeued and restored")
        return
    say(f"checkpointing job {jobid} before {why}")
    try:
        # A command on the job (a user's checkpoint) may be running: wait for it, up to half the lead.
        result = coordinator.preempt(jobid, lock_wait_s=lead / 2)
    except GpucrError as e:
        say(f"automatic checkpoint of job {jobid} failed: {e.one_line()}; "
            + after_failed_checkpoint(jobid, preempted, _next_restore(jobid)))
        return
    restore_log.log(f"checkpointed {result.get('generation', '')} before {why}; requeued")


def _next_restore(jobid: str) -> str | None:
    """The committed generation a restart or `gpucr-hpc restore JOBID` would restore; None if none."""
    job_dir = load_site().job_image_dir(jobid)
    try:
        return generations.restore_target(job_dir, submission=config.value("GPUCR_SUBMISSION")).name
    except GpucrError:
        return None


def after_failed_checkpoint(jobid: str, preempted: bool, gen: str | None) -> str:
    """What becomes of the job once its automatic checkpoint failed (it runs on until then)."""
    if preempted:  # PreemptMode=REQUEUE: a requeued job restores its checkpoint when it starts
        start = f"from its checkpoint {gen}" if gen else "from the top (it has no checkpoint)"
        return (f"the job keeps running until the preemption ends it; Slurm then requeues it "
                f"(PreemptMode=REQUEUE) and it restarts {start}")
    if gen:
        return (f"the job keeps running until its time limit, and Slurm does not requeue it then; "
                f"`gpucr-hpc restore {jobid}` requeues it from its checkpoint {gen} "
                "while Slurm still knows the job")
    return "the job keeps running until its time limit and then ends (it has no checkpoint to restore)"


def periodic(jobid: str, interval: int, stop: threading.Event) -> None:
    """In a thread: an in-place checkpoint every `interval` seconds until `stop`."""
    while not stop.wait(interval):
        try:
            result = coordinator.checkpoint(jobid)  # refused at once while another runs: skipped
        except GpucrError as e:
            say(f"periodic checkpoint of job {jobid} not taken: {e.one_line()}")
            continue
        except Exception as e:  # noqa: BLE001 - the job outlives anything unforeseen here
            say(f"periodic checkpoint of job {jobid} not taken ({type(e).__name__}: {e})")
            continue
        gen, took = result.get("generation", ""), result.get("total_s", 0.0)
        say(f"periodic checkpoint of job {jobid}: {gen} in {took:.1f} s; the job runs on")
        restore_log.log(f"periodic checkpoint {gen} in {took:.1f} s")


def exit_like(status: int) -> int:
    """The script's status as ours: a signal death is passed on as one."""
    if status < 0:
        sig = -status
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        return 128 + sig
    return status


def supervise(child: subprocess.Popen, script_pid: int, jobid: str,
              ckpt_sig: signal.Signals | None, lead: int, waited: Set[signal.Signals]) -> int:
    """Wait for `child` (the script, or the init of its restored PID namespace),
    answering signals; forwarded ones go to the script itself.

    sigwaitinfo, not sigtimedwait: CPython's sigtimedwait returns an unset
    siginfo when a stop (Slurm's suspend) outlasts its timeout, and the job died
    of forwarding that garbage. The child's end comes as SIGCHLD, so no timeout
    is needed. Nothing raised here may end the job: it is said, and the wait goes on."""
    while True:
        if child.poll() is not None:
            return child.returncode
        info = signal.sigwaitinfo(waited)
        try:
            answer(info.si_signo, waited, script_pid, jobid, ckpt_sig, lead)
        except Exception as e:  # noqa: BLE001 - the job outlives anything unforeseen here
            say(f"signal {info.si_signo} not handled ({type(e).__name__}: {e}); the job runs on")
            restore_log.log(f"supervisor: signal {info.si_signo} not handled: {type(e).__name__}: {e}")


def answer(signo: int, waited: Set[signal.Signals], script_pid: int, jobid: str,
           ckpt_sig: signal.Signals | None, lead: int) -> None:
    """One signal: the checkpoint signal checkpoints, the others go to the script."""
    if signo not in waited or signo == signal.SIGCHLD:
        return  # only the signals we wait for are real; SIGCHLD only wakes the wait
    if ckpt_sig is not None and signo == ckpt_sig:
        checkpoint_and_requeue(jobid, lead)
        return
    try:
        os.kill(script_pid, signo)
    except ProcessLookupError:
        pass


def main() -> int:
    jobid = os.environ["SLURM_JOB_ID"]
    ckpt_sig = checkpoint_signal(config.value("GPUCR_CHECKPOINT_SIGNAL"))
    lead = config.value("GPUCR_CHECKPOINT_LEAD")
    restoring = config.value("GPUCR_RESTORE_BATCH")
    argv = script_argv(sys.argv, os.environ)
    site = load_site()
    child_env = split_env(site.bindir)
    for k in OWN_ENV:
        if k != "GPUCR_BATCH_SCRIPT":  # the restorer still needs it
            os.environ.pop(k, None)
    waited = FORWARDED | {signal.SIGCHLD} | ({ckpt_sig} if ckpt_sig else set())
    # Blocked before any thread or child exists; the child gets them back.
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    restore_log.open_log(site.job_image_dir(jobid))
    # The plugin restores a job with a checkpoint to restore (spank/restart.c); one that
    # was checkpointed and whose checkpoint is gone goes the same way, and is held with
    # the reason: never run from the top. Asked before the claim, which dates the traces.
    restoring = restoring or config.value("GPUCR_RESTORE_FROM") or lost_checkpoint(site.job_image_dir(jobid))
    generations.claim(site.job_image_dir(jobid), config.value("GPUCR_SUBMISSION"))
    if restoring:
        lock = ExitStack()  # the job's, until every rank is back (batch_restore)
        try:
            m, gen, batch = batch_restore.restore_batch_tree(jobid, site, lock)
        except batch_restore.RestoreFailed:
            return 1
        child = batch["_launcher"] if batch else None
        step_rc: list[int | None] = []
        ranks = threading.Thread(target=_restore_ranks, args=(jobid, m, gen, child, step_rc, lock),
                                 daemon=True)
        ranks.start()
        if child is None:  # no batch tree: the job's status is the step's
            ranks.join()
            return (step_rc or [1])[0] or 0
        assert batch is not None  # the child is the batch tree it reports
        script_pid = batch["pid"]
    else:
        child = subprocess.Popen(argv, env=child_env, close_fds=False,
                                 preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, waited))
        script_pid = child.pid
        batch_restore.register(site.job_run_dir(jobid), {"step": "batch", "rank": 0}, script_pid)
    stop = threading.Event()
    threading.Thread(target=events.relay, args=(site.job_image_dir(jobid), jobid, restore_log.say, stop),
                     daemon=True, name="events").start()  # commands by hand, into the job's output
    interval = int(config.value("GPUCR_CHECKPOINT_INTERVAL") or 0)
    if interval > 0:
        threading.Thread(target=periodic, args=(jobid, interval, stop), daemon=True, name="periodic").start()
    status = supervise(child, script_pid, jobid, ckpt_sig, lead, waited)
    stop.set()
    restore_log.log(f"batch script ended with status {status}")
    return exit_like(status)


def lost_checkpoint(job_dir) -> bool:
    """A trace of a checkpoint of this submission that cannot be restored (generations.lost)."""
    try:
        return generations.lost(job_dir, config.value("GPUCR_SUBMISSION")) is not None
    except Exception as e:  # noqa: BLE001 - what cannot be read is the restore's to hold with the reason
        restore_log.log(f"supervisor: the job's checkpoints could not be looked at ({type(e).__name__}: {e})")
        return False


def _restore_ranks(jobid, m, gen, child, step_rc: list, lock) -> None:
    """In a thread: the ranks run as long as the job, and signals must still be answered."""
    try:
        step_rc.append(batch_restore.restore_ranks(jobid, m, gen, child, lock))
    except batch_restore.RestoreFailed:
        step_rc.append(1)
    finally:
        lock.close()


if __name__ == "__main__":
    sys.exit(main())
