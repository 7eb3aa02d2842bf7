"""`gpucr-hpc run / checkpoint --pid / restore --pid / status`: one machine, no Slurm."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.process_cr import DEFAULT_TIMEOUT_MS, checkpoint_tree, restore_tree, status_all
from gpucr_hpc.shim_client import default_run_dir, shim_library


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _phases_line(phases: dict) -> str:
    order = ["quiesce_s", "data_s", "control_s", "total_s"]
    return ", ".join(f"{k[:-2]} {phases[k]:.3f} s" for k in order if k in phases)


def shim_environment(env: dict, arena: str | None = None, run_dir: str | None = None,
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


run_dir_option = click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                              help="Where the control sockets are (default: $GPUCR_RUN_DIR, "
                                   "$XDG_RUNTIME_DIR/gpucr or /tmp/gpucr-UID).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--arena", type=click.Path(exists=True, file_okay=False), default=None,
              help="Directory for the host arena: a hugetlbfs mount for huge pages "
                   "(default: /dev/shm).")
@click.option("--arena-size", default=None, metavar="SIZE",
              help="Create and pre-fault this much arena at start (e.g. 80G), and its pinned staging "
                   "ring once the program uses CUDA, so the first checkpoint does not pay for it; "
                   "the one-time cost is printed on stderr.")
@run_dir_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(arena, arena_size, run_dir, cmd):
    """Run CMD under the shim (it keeps this PID), ready for checkpoint --pid."""
    if arena_size is not None and not re.fullmatch(r"\d+(\.\d+)?[KMGkmg]?", arena_size):
        raise GpucrError(f"bad --arena-size {arena_size!r}", "give bytes or a size like 512M or 80G")
    env = shim_environment(os.environ, arena, str(run_dir) if run_dir else None, arena_size)
    if arena_size:
        env["GPUCR_ARENA_REPORT"] = "1"  # the shim tells the one-time setup cost on stderr
    try:
        os.execvpe(cmd[0], list(cmd), env)
    except FileNotFoundError:
        raise GpucrError(f"command not found: {cmd[0]}", "check the command after --")
    except PermissionError:
        raise GpucrError(f"cannot execute {cmd[0]}", "check its permissions")


def _migrate():
    """The whole-process migration options (--to/--from), when that part is present."""
    try:
        from gpucr_hpc import migrate
    except ImportError:
        return None
    return migrate


_m = _migrate()
_checkpoint_options = _m.checkpoint_options if _m else json_option
_restore_options = _m.restore_options if _m else json_option


@click.command()
@click.argument("jobid", required=False)
@click.option("--pid", type=int, default=None, help="The process (and its children) to checkpoint.")
@click.option("--timeout", "timeout_ms", type=int, default=DEFAULT_TIMEOUT_MS, show_default=True,
              help="Quiesce / driver lock timeout in milliseconds.")
@run_dir_option
@_checkpoint_options
def checkpoint(jobid, pid, timeout_ms, run_dir, as_json, to_dir=None, leave_running=False):
    """Checkpoint a Slurm job (JOBID: every rank on every node, the job keeps running),
    a running process in place (--pid: its GPU memory is handed back), or a process
    to a whole-process image (--pid PID --to DIR)."""
    if jobid is not None:
        if pid is not None or to_dir:
            raise GpucrError("give either JOBID or --pid, not both", "drop one of them")
        from gpucr_hpc.cmd_job import checkpoint_job

        return checkpoint_job(jobid, as_json)
    if pid is None:
        raise GpucrError("checkpoint needs JOBID, or --pid PID", "add one of them")
    if to_dir:
        return _m.run_checkpoint(pid, to_dir, leave_running, as_json)
    if leave_running:
        raise GpucrError("--leave-running only applies with --to DIR", "add --to DIR or drop --leave-running")
    result = checkpoint_tree(pid, timeout_ms=timeout_ms, run_dir=run_dir)
    if as_json:
        click.echo(json.dumps(result))
        return
    n = len([p for p in result["processes"] if p["shim"] or p["cuda"]])
    click.echo(f"checkpointed {pid} ({n} process{'es' if n != 1 else ''}, {_gib(result['bytes'])}): "
               f"{_phases_line(result['phases'])}")


@click.command()
@click.argument("jobid", required=False)
@click.option("--pid", type=int, default=None, help="The process (and its children) checkpointed in place.")
@run_dir_option
@_restore_options
def restore(jobid, pid, run_dir, as_json, from_dir=None, pidns="auto", rewind_files=False, gpus=None):
    """Restore a Slurm job that is not running from its checkpoint (JOBID; --from GEN
    picks a generation), a process checkpointed in place (--pid PID; it continues
    where it stopped), or a whole-process image (--from DIR; --gpu picks the GPUs)."""
    if gpus is not None and (jobid is not None or not from_dir):
        raise GpucrError("--gpu applies to restore --from DIR only (a job goes onto the GPUs Slurm "
                         "gives it, a process checkpointed in place stays on its own)", "drop --gpu")
    if jobid is not None:
        if pid is not None:
            raise GpucrError("give either JOBID or --pid, not both", "drop one of them")
        from gpucr_hpc.cmd_job import parse_generation, restore_job

        return restore_job(jobid, parse_generation(from_dir), as_json)
    if from_dir:
        if pid is not None:
            raise GpucrError("give either --pid or --from, not both", "drop one of them")
        return _m.run_restore(from_dir, pidns, rewind_files, as_json, gpus)
    if pid is None:
        raise GpucrError("restore needs --pid PID (in place) or --from DIR (image)", "add one of them")
    result = restore_tree(pid, run_dir=run_dir)
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"restored {pid} ({_gib(result['bytes'])}): {_phases_line(result['phases'])}")


@click.command()
@click.argument("jobid", required=False)
@run_dir_option
@json_option
def status(jobid, run_dir, as_json):
    """A Slurm job's state and checkpoints (JOBID), or the processes running under
    the shim on this machine: state, GPU bytes, arena bytes."""
    if jobid is not None:
        from gpucr_hpc import cmd_job

        cmd_job.show_job_status(jobid, as_json)
        return
    rows = status_all(run_dir)
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo(f"no process runs under the shim (run dir {run_dir or default_run_dir()})")
        return
    click.echo(f"{'PID':>8}  {'STATE':<13} {'GPU':>10} {'ARENA':>10}  CMD")
    for r in rows:
        if not r.get("ok"):
            click.echo(f"{r['pid']:>8}  {'unreachable':<13} {'-':>10} {'-':>10}  {r.get('cmd', '')[:60]}")
            continue
        gpu = r.get("gpu_bytes", 0) + r.get("checkpointed_bytes", 0) + r.get("async_bytes", 0)
        state = r["state"] if r.get("cuda") or r["state"] != "running" else "running(cpu)"
        click.echo(f"{r['pid']:>8}  {state:<13} {_gib(gpu):>10} {_gib(r.get('arena_bytes', 0)):>10}  "
                   f"{r.get('cmd', '')[:60]}")
