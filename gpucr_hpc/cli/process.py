"""`gpucr-hpc run / checkpoint --pid / restore --pid / status`: one machine, no Slurm."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import click

from gpucr_hpc import config, figures
from gpucr_hpc.cli import job_id, output, process_image
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.process.in_place import DEFAULT_TIMEOUT_MS, checkpoint_tree, restore_tree, status_all
from gpucr_hpc.shim.client import default_run_dir, shim_library
from gpucr_hpc.shim.protocol import Reply


def _phases_line(phases: dict) -> str:
    return figures.timings_line(phases, ("quiesce_s", "data_s", "control_s", "total_s"))


def shim_environment(env: Mapping[str, str], arena: str | None = None, run_dir: str | None = None,
                     arena_size: str | None = None) -> dict:
    """env with the shim first in LD_PRELOAD (once) and the GPUCR_* settings."""
    env = dict(env)
    lib = str(shim_library())
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split()
               if p and os.path.basename(p) != "libgpucr-cuda.so"]
    env["LD_PRELOAD"] = " ".join([lib] + preload)
    if arena:
        env["GPUCR_ARENA_DIR"] = arena
    if arena_size:
        env["GPUCR_ARENA_PREALLOC"] = arena_size
    env["GPUCR_RUN_DIR"] = str(run_dir or default_run_dir())
    return env


def _start_helper(run_dir: Path) -> Path:
    """The user's copy helper on this node, at RUN_DIR/copy-helper.sock: the one
    serving there, or one started now. Its socket."""
    from gpucr_hpc.shim import copy_helper as helper

    idle = config.value("GPUCR_COPY_HELPER_IDLE")
    sock = run_dir / "copy-helper.sock"
    pid = helper.ensure(sock, idle_exit=idle)
    state = f"started (pid {pid})" if pid else "already serving"
    click.echo(f"gpucr: copy helper {state} on {sock}", err=True)
    return sock


run_dir_option = click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                              help="Where the control sockets are (default: $GPUCR_RUN_DIR, "
                                   "$XDG_RUNTIME_DIR/gpucr or /tmp/gpucr-UID).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--arena", type=click.Path(exists=True, file_okay=False), default=None,
              help="Directory for the host arena: a hugetlbfs mount for huge pages "
                   "(default: /dev/shm).")
@click.option("--arena-size", default=None, metavar="SIZE|auto|off",
              help="The host arena made ahead, so the first checkpoint costs what a later one does. "
                   "auto (the default, unless GPUCR_ARENA_PREALLOC says otherwise): grown in the background "
                   "as the program's GPU memory grows, where the job's memory limit leaves room; SIZE (e.g. "
                   "80G): created and pre-faulted at start; off: made by the first checkpoint. Given here, "
                   "the one-time costs are printed on stderr.")
@click.option("--copy-helper", "use_helper", is_flag=True,
              help="Move the GPU data through `gpucr-hpc copy-helper` (started now unless one serves "
                   "this user here; it exits after GPUCR_COPY_HELPER_IDLE seconds, default 600, without "
                   "a process): the copy engines' full rate both ways, for about 0.5 GiB of GPU memory "
                   "per GPU.")
@run_dir_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(arena, arena_size, use_helper, run_dir, cmd):
    """Run CMD under the shim (it keeps this PID), ready for checkpoint --pid."""
    if arena_size is not None and not re.fullmatch(r"\d+(\.\d+)?[KMGkmg]?|auto|off", arena_size):
        raise GpucrError(f"bad --arena-size {arena_size!r}", "give bytes, a size like 512M or 80G, auto or off")
    ahead = arena_size or config.value("GPUCR_ARENA_PREALLOC") or "auto"
    env = shim_environment(os.environ, arena, str(run_dir) if run_dir else None,
                           None if ahead == "off" else ahead)
    if ahead == "off":
        env.pop("GPUCR_ARENA_PREALLOC", None)
    if use_helper:
        env["GPUCR_COPY_HELPER"] = str(_start_helper(Path(env["GPUCR_RUN_DIR"])))
    if arena_size and arena_size != "off":
        env["GPUCR_ARENA_REPORT"] = "1"  # asked for: the shim tells the one-time setup cost on stderr
    try:
        os.execvpe(cmd[0], list(cmd), env)
    except FileNotFoundError:
        raise GpucrError(f"command not found: {cmd[0]}", "check the command after --")
    except PermissionError:
        raise GpucrError(f"cannot execute {cmd[0]}", "check its permissions")


@click.command()
@click.argument("jobid", required=False, callback=job_id.argument)
@click.option("--pid", type=int, default=None, help="The process (and its children) to checkpoint.")
@click.option("--timeout", "timeout_ms", type=click.IntRange(min=1), default=None, metavar="MS",
              help=f"With --pid: how long the shims wait for GPU work in flight, and the driver "
                   f"for its lock, in milliseconds (default {DEFAULT_TIMEOUT_MS}).")
@run_dir_option
@process_image.checkpoint_options
def checkpoint(jobid, pid, timeout_ms, run_dir, as_json, to_dir, leave_running):
    """Checkpoint a Slurm job (JOBID: every rank on every node, the job keeps running),
    a running process in place (--pid: its GPU memory is yielded), or a process
    to a whole-process image (--pid PID --to DIR)."""
    if jobid is not None:
        if pid is not None:
            raise GpucrError("give either JOBID or --pid, not both", "drop one of them")
        _refuse_for_job(to_dir=to_dir, leave_running=leave_running, timeout_ms=timeout_ms,
                        run_dir=run_dir)
        from gpucr_hpc.cli.job import checkpoint_job

        return checkpoint_job(jobid, as_json)
    if pid is None:
        raise GpucrError("checkpoint needs JOBID, or --pid PID", "add one of them")
    timeout_ms = DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms
    if to_dir:
        return process_image.run_checkpoint(pid, to_dir, leave_running, as_json, timeout_ms, run_dir)
    if leave_running:
        raise GpucrError("--leave-running only applies with --to DIR", "add --to DIR or drop --leave-running")
    with output.working(f"yielding the GPU memory of process {pid}"):
        result = checkpoint_tree(pid, timeout_ms=timeout_ms, run_dir=run_dir)
    if as_json:
        output.print_json("process-checkpoint", result)
        return
    n = len([p for p in result["processes"] if p["shim"] or p["cuda"]])
    click.echo(f"checkpointed {pid} ({n} process{'es' if n != 1 else ''}, {figures.size(result['bytes'])}): "
               f"{_phases_line(result['phases'])}")


# Why an option of the process forms means nothing for a job (checkpoint/restore JOBID).
_NOT_FOR_JOB = {
    "to_dir": ("--to DIR applies to checkpoint --pid PID: a job's checkpoints go to the site's image store",
               "drop --to (gpucr-hpc ls JOBID lists them)"),
    "leave_running": ("--leave-running does not apply to a job: checkpoint JOBID always leaves the job running",
                      "drop --leave-running (gpucr-hpc preempt JOBID checkpoints and requeues it)"),
    "timeout_ms": (f"--timeout applies to checkpoint --pid only: a job checkpoint waits up to "
                   f"{DEFAULT_TIMEOUT_MS // 1000} s for each GPU process, which is fixed",
                   "drop --timeout"),
    "run_dir": ("--run-dir applies to --pid only: a job's control sockets are in the site's run dir "
                "(plugstack.conf rundir=)", "drop --run-dir"),
    "pidns": ("--pidns applies to restore --from DIR only: a job's processes are restored in a new PID "
              "namespace", "drop --pidns"),
    "rewind_files": ("--rewind-files applies to restore --from DIR only: a job restore cuts grown files "
                     "back itself", "drop --rewind-files"),
}


def _refuse_for_job(**given) -> None:
    for name, value in given.items():
        if value not in (None, False):
            raise GpucrError(*_NOT_FOR_JOB[name])


@click.command()
@click.argument("jobid", required=False, callback=job_id.argument)
@click.option("--pid", type=int, default=None, help="The process (and its children) checkpointed in place.")
@click.option("--from", "source", metavar="N|DIR", default=None,
              help="With JOBID: the generation to restore, N or gen-N (default: the newest committed "
                   "one; `gpucr-hpc ls JOBID` lists them). Without JOBID: the directory of a "
                   "whole-process image, as checkpoint --pid PID --to DIR wrote it.")
@click.option("--resubmit", is_flag=True,
              help="With JOBID: submit the job again from its checkpoint as a new job (a new id), "
                   "also when Slurm knows another job of that id (slurmctld gave it out again).")
@run_dir_option
@process_image.restore_options
def restore(jobid, pid, source, resubmit, run_dir, as_json, pidns, rewind_files, gpus):
    """Restore a Slurm job that is not running from its checkpoint (JOBID; --from N
    picks a generation; a job Slurm no longer knows is submitted again as its
    user, with a new id, and restored from it), a process checkpointed in place
    (--pid PID; it continues where it stopped), or a whole-process image
    (--from DIR; --gpu picks the GPUs)."""
    if gpus is not None and (jobid is not None or not source):
        raise GpucrError("--gpu applies to restore --from DIR only (a job goes onto the GPUs Slurm "
                         "gives it, a process checkpointed in place stays on its own)", "drop --gpu")
    if jobid is not None:
        if pid is not None:
            raise GpucrError("give either JOBID or --pid, not both", "drop one of them")
        _refuse_for_job(run_dir=run_dir, pidns=pidns, rewind_files=rewind_files)
        from gpucr_hpc.cli.job import parse_generation, restore_job

        return restore_job(jobid, parse_generation(source), as_json, resubmit)
    if resubmit:
        raise GpucrError("--resubmit applies to restore JOBID only", "give the job id, or drop --resubmit")
    if source:
        if pid is not None:
            raise GpucrError("give either --pid or --from, not both", "drop one of them")
        if run_dir is not None:
            raise GpucrError("--run-dir applies to restore --pid only: the processes of an image keep "
                             "their control sockets where they first ran", "drop --run-dir")
        return process_image.run_restore(image_dir(source), pidns or "auto", rewind_files, as_json, gpus)
    if pid is None:
        raise GpucrError("restore needs JOBID, --pid PID (in place) or --from DIR (image)", "add one of them")
    if pidns:
        raise GpucrError("--pidns applies to restore --from DIR only: a process restored in place keeps "
                         "its PIDs", "drop --pidns")
    if rewind_files:
        raise GpucrError("--rewind-files applies to restore --from DIR only: a process restored in place "
                         "kept its files open all along", "drop --rewind-files")
    with output.working(f"restoring the GPU memory of process {pid}"):
        result = restore_tree(pid, run_dir=run_dir)
    if as_json:
        output.print_json("process-restore", result)
        return
    click.echo(f"restored {pid} ({figures.size(result['bytes'])}): {_phases_line(result['phases'])}")


def image_dir(source: str) -> str:
    """--from of the process form: a directory (a generation number needs JOBID)."""
    if os.path.isdir(source):
        return source
    if os.path.exists(source):
        raise GpucrError(f"--from {source} is a file, not an image directory",
                         "give the directory that checkpoint --to wrote")
    if re.fullmatch(r"(gen-)?\d+", source):
        raise GpucrError(f"no image directory {source}; a generation number needs a job",
                         f"restore JOBID --from {source}, or give the directory that checkpoint --to wrote")
    return source  # restore_from says that there is no image there


@click.command()
@click.argument("jobid", required=False, callback=job_id.argument)
@run_dir_option
@json_option
def status(jobid, run_dir, as_json):
    """A Slurm job's state and checkpoints (JOBID), or the processes running under
    the shim on this machine: state, GPU bytes, arena bytes."""
    if jobid is not None:
        from gpucr_hpc.cli import job as cmd_job

        cmd_job.show_job_status(jobid, as_json)
        return
    rows = status_all(run_dir)
    if as_json:
        output.print_json("status", {"processes": [r.as_json() for r in rows]})
        return
    if not rows:
        click.echo(f"no process runs under the shim (run dir {run_dir or default_run_dir()})")
        return
    click.echo(f"{'PID':>8}  {'STATE':<13} {'GPU':>10} {'ARENA':>10}  {'NCCL':<12} CMD")
    for row in rows:
        st = row.status
        if not st.ok:
            click.echo(f"{row.pid:>8}  {'unreachable':<13} {'-':>10} {'-':>10}  {'-':<12} {row.cmd[:60]}")
            continue
        gpu = st.gpu_bytes + st.checkpointed_bytes + st.async_bytes
        state = st.state if st.cuda or st.state != "running" else "running(cpu)"
        click.echo(f"{row.pid:>8}  {state:<13} {figures.size(gpu):>10} {figures.size(st.arena_bytes):>10}  "
                   f"{nccl_column(st):<12} {row.cmd[:60]}")


def nccl_column(st: Reply) -> str:
    """The process's NCCL communicators, and where its cut is when one runs."""
    n = st.nccl_comms
    cut = st.nccl_cut or "none"
    if not n:
        return "-"
    return str(n) if cut == "none" else f"{n} {cut}"


@click.command("copy-helper")
@click.option("--socket", "sock", required=True, type=click.Path(dir_okay=False),
              help="where to listen; processes find it through GPUCR_COPY_HELPER=SOCKET")
@click.option("--idle-exit", type=click.FloatRange(min=0), default=0, metavar="SECONDS",
              help="Exit after this long without a connected process (default 0: run until killed).")
@click.option("--ensure", is_flag=True,
              help="Start the helper in the background unless one serves at --socket, wait until it "
                   "listens, then return (what the shim runs for GPUCR_COPY_HELPER_START).")
def copy_helper(sock, idle_exit, ensure):
    """Serve GPU copies for shimmed processes (GPUCR_COPY_HELPER): their GPU data
    moves between the GPU and their arena at the copy engines' full rate, from
    memory pinned here once, not in the process the driver checkpoints. One per
    node and user (its socket is the user's alone); `gpucr-hpc run --copy-helper`
    starts one when none is there."""
    from gpucr_hpc.shim import copy_helper as helper

    if ensure:
        pid = helper.ensure(Path(sock), idle_exit=idle_exit)
        if pid:  # quiet when another rank of the node started it
            click.echo(f"gpucr: copy helper started (pid {pid}) on {sock}", err=True)
        return
    helper.serve(Path(sock), idle_exit=idle_exit,
                 ready=lambda: click.echo(f"gpucr-hpc copy-helper: serving on {sock} (pid {os.getpid()})", err=True))
