"""One task of the step that restores a job's ranks.

The batch restorer starts this as a new `srun` step with the layout of the
step that was running; task N restores the N-th rank of the checkpoint on its
node, hands it this task's stdio (so its output flows through the new step as
it did through the old one), and exits with the rank's exit status.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.criu import procfs
from gpucr_hpc.criu.run import end_tree
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import generations, nccl_ranks
from gpucr_hpc.job.connections import rank_connections
from gpucr_hpc.job.restore.batch_restore import RANKS_BACK, give_up, rank_back, restore_unit
from gpucr_hpc.job.restore.placement import ranks_of
from gpucr_hpc.job.restore_log import log, open_log
from gpucr_hpc.job.restore_log import say as kept_say
from gpucr_hpc.slurm import commands as slurm
from gpucr_hpc.slurm.signals import ENDING_SIGNALS, TASK_SIGNALS
from gpucr_hpc.slurm.site import load_site
from gpucr_hpc.tcp import lock as netlock

LAUNCH_SETTLE_S = 3.0


def stdio_inherit(unit: dict) -> dict[int, str]:
    """Our fd for each stdio pipe or socket the rank had (regular files reopen by path).

    stdout and stderr only: CRIU's --shell-job (a task is no session leader)
    needs its own fd 0, so a rank's old stdin pipe comes back without a writer
    (it reads end-of-file, as a task other than 0 of srun always does).
    """
    return {fd: key for fd, key in ((int(k), v) for k, v in (unit.get("stdio") or {}).items())
            if fd in (1, 2) and key.startswith(("pipe:", "socket:")) and procfs.is_open(fd)}


class StepSignals:
    """Slurm's signals to this task, noted instead of fatal.

    The restored rank is this task's descendant, so Slurm's signals reach it
    directly. This task must outlive them: dying would reparent the rank away from
    the step (where Slurm's SIGKILL after KillWait no longer finds it), and a
    SIGTERM that ends the step while CRIU restores would leave a rank running that
    was never signalled. `ended` says whether the step was told to end."""

    def __init__(self):
        self.ended = False
        for sig in TASK_SIGNALS:  # a handler, not SIG_IGN, which CRIU's processes would inherit
            signal.signal(sig, self._note)

    def _note(self, signum, _frame):
        self.ended = self.ended or signum in ENDING_SIGNALS


def superseded(jobid: str) -> str | None:
    """Why this step no longer belongs to the job, or None.

    A restore step whose launch crosses the job's requeue (its node set DOWN, the
    job preempted while it restores) can start its tasks after Slurm has killed
    the job on this node, and Slurm then sends them no signal: a rank restored
    here would run beside the one restored after the requeue, both writing the
    rank's files. The step's restart count is the job's while it is ours."""
    try:
        job = slurm.show_job(jobid)
    except GpucrError:
        return None  # slurmctld out of reach: Slurm's own kill of the step still holds
    ours = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if job.state in ("RUNNING", "SUSPENDED") and job.restart_count == ours:
        return None
    return (f"job {jobid} is {job.state} at restart {job.restart_count}, "
            f"this step was started for restart {ours}")


def say(msg: str) -> None:
    """To the step's stderr (kept, and written again after the next restore cuts the
    job's output back) and to restore.log."""
    kept_say(msg)
    log(msg)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpucr_hpc.job.restore.rank_restore")
    p.add_argument("--gen-dir", required=True)
    p.add_argument("--unchecked", action="store_true",
                   help="the batch restore began before the drain: check this rank's image here")
    args = p.parse_args(argv)
    started = time.monotonic()
    gen = Path(args.gen_dir)
    procid = int(os.environ["SLURM_PROCID"])
    jobid = os.environ["SLURM_JOB_ID"]
    signals = StepSignals()
    lease = ExitStack()  # the lock on the rank's connections, until every rank is back
    held = False  # the lease is taken
    open_log(gen.parent)
    stale = superseded(jobid)
    if stale:
        say(f"gpucr: rank {procid} not restored: {stale}")
        return 1
    try:
        m = generations.manifest_of(gen)
        ranks = ranks_of(m)
        unit = ranks[procid]
        moved: dict[str, str] = {}
        spec = None
        if unit.get("tcp"):
            moved = rank_connections.moves(unit, rank_connections.where_now(ranks))
            if unit["tcp"].get("links"):  # taken by the restore; let go once every peer rank is back
                spec = lease.enter_context(netlock.Lease(rank_connections.lock_name(jobid, unit),
                                                         rank_connections.flows(unit, moved),
                                                         float(config.value("GPUCR_LOCK_LEASE")), taken=True)).spec
                held = bool(unit["tcp"].get("peers"))
        rep = restore_unit(gen, unit, load_site(), jobid, inherit=stdio_inherit(unit), moved=moved, lock=spec,
                           verified=not args.unchecked)
    except (GpucrError, IndexError) as e:
        lease.close()
        msg = e.one_line() if isinstance(e, GpucrError) else f"no rank {procid} in {gen}"
        # Not a failed step after which the script would run on without the ranks'
        # work: the job is requeued and held, the image kept, as for the script's tree.
        # A kill that reaches slurmd (22.05) while this step's tasks are still being
        # launched can be lost, and the job then stays COMPLETING: let the launch end.
        time.sleep(max(0.0, LAUNCH_SETTLE_S - (time.monotonic() - started)))
        stale = superseded(jobid)  # the job has moved on: a hold would stop its new run
        if stale or signals.ended:
            say(f"gpucr: rank {procid} not restored ({msg}): {stale or 'the step was ended'}")
            return 1
        node = os.environ.get("SLURMD_NODENAME", "its node")
        try:
            give_up(jobid, f"gpucr: cannot restore job {jobid}: rank {procid} of {gen.name}: {msg}; "
                           f"fix that, then gpucr-hpc restore {jobid} --from N",
                    f"rank {procid} of {gen.name} did not restore on {node}",
                    f"fix that, gpucr-hpc restore {jobid} --from N")
        except GpucrError as hold:
            say(f"gpucr: error: holding job {jobid} failed: {hold.one_line()}")
        return 1
    # Requeued or ended while CRIU ran: the rank got no signal, and will get none.
    stale = "Slurm ended the step while the rank was restored" if signals.ended else superseded(jobid)
    if stale:
        end_tree(rep["pid"], rep["_launcher"])
        lease.close()
        say(f"gpucr: rank {procid} ended after its restore: {stale}")
        return 1
    if not (procid == 1 and config.fault("rank_not_back")):
        rank_back(gen.parent, procid)  # the batch step lets go of the job's lock once all are
    if any(u.get("nccl") for u in ranks):
        # the ranks' NCCL communicators, made anew with every rank of the step
        run_dir = load_site().job_run_dir(str(m["job"]["id"]), unit["node"])
        try:
            nccl_ranks.rebuild_by_files(gen.parent, procid, len(ranks), nccl_ranks.ranks_in([rep["pid"]], run_dir),
                                        run_dir, float(config.value("GPUCR_RANKS_BACK_TIMEOUT")))
        except GpucrError as e:
            return end_and_hold(jobid, procid, gen, rep, lease, e, f"the NCCL communicators of {gen.name} "
                                "were not rebuilt")
    if held:
        try:
            rank_connections.hold_until_all_back(gen.parent / RANKS_BACK, len(ranks),
                                                 float(config.value("GPUCR_RANKS_BACK_TIMEOUT")))
        except GpucrError as e:
            # Its peers are not all back: let go of the connections, and a packet
            # would reset them. Ended and held instead; the image stays as it was.
            return end_and_hold(jobid, procid, gen, rep, lease, e, f"not every rank of {gen.name} came back")
    lease.close()  # its own connections (both ends in the rank) are let go at once
    return rep["_launcher"].wait()


def end_and_hold(jobid: str, procid: int, gen: Path, rep: dict, lease: ExitStack, e: GpucrError,
                 reason: str) -> int:
    """A restored rank that cannot run on with its peers: ended, its connections let
    go, and the job held with the reason (the image stays as it was)."""
    end_tree(rep["pid"], rep["_launcher"])
    lease.close()
    try:
        give_up(jobid, f"gpucr: cannot restore job {jobid}: rank {procid} of {gen.name}: {e.one_line()}",
                reason, f"fix that, gpucr-hpc restore {jobid} --from N")
    except GpucrError as hold:
        say(f"gpucr: error: holding job {jobid} failed: {hold.one_line()}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
