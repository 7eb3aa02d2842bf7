"""The options and reports of `checkpoint --pid --to` and `restore --from`:
the click side of process/image.py (whole-process images)."""

from __future__ import annotations

from pathlib import Path

import click

from gpucr_hpc import figures
from gpucr_hpc.cli import output
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.process import image as process_image


def _print_report(kind: str, rep: dict, as_json: bool) -> None:
    rep = {k: v for k, v in rep.items() if not k.startswith("_")}
    if as_json:
        output.print_json(f"process-{kind}", rep)
        return
    t = rep["timings"]
    phases = figures.timings_line(t)
    if kind == "checkpoint":
        state = "left running" if rep["leave_running"] else "stopped"
        click.echo(f"checkpointed PID {rep['pid']} ({len(rep['pids'])} processes, {state}) "
                   f"to {rep['image']}: {figures.size(rep['bytes'])}")
    else:
        click.echo(f"restored {rep['image']} as PID {rep['pid']} "
                   f"({rep['pidns']} PID namespace, PID {rep['ns_pid']} inside)")
        for k in rep.get("rewound_files_kept_as") or []:
            click.echo(f"  rewound a grown file; its later content is kept in {k}")
        for proc in rep.get("gpus") or []:
            where = ", ".join(f"{g['ordinal']} -> GPU {g['index']} {g['uuid']}"
                              + (f" (was {g['image_uuid']})" if g["moved"] else "") for g in proc["gpus"])
            click.echo(f"  PID {proc['pid']} CUDA devices: {where or 'not recorded (the GPUs it had)'}")
    click.echo(f"  {phases}")


def checkpoint_options(f):
    f = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")(f)
    f = click.option("--leave-running", is_flag=True,
                     help="With --to: keep the process running after the image is written.")(f)
    f = click.option("--to", "to_dir", type=click.Path(file_okay=False),
                     help="Write a whole-process image (CRIU + GPU data) to this new directory.")(f)
    return f


def restore_options(f):
    f = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")(f)
    f = click.option("--rewind-files", is_flag=True,
                     help="With --from: truncate files the process had open that grew since the checkpoint "
                          "(a copy of each is kept beside it).")(f)
    f = click.option("--pidns", type=click.Choice(["auto", "host", "new"]), default=None,
                     help="With --from: host: the original PIDs here (refused if taken); new: a "
                          "new PID namespace, where the processes keep their original PIDs (ordinary "
                          "users get it through the root helper, like every CRIU restore); auto "
                          "(the default): host when the PIDs are free, else new.")(f)
    f = click.option("--gpu", "gpus", metavar="GPU[,GPU...]", default=None,
                     help="With --from: restore onto these GPUs of this node (nvidia-smi indices "
                          "or UUIDs), one for each GPU of the image, in its order. Default: the "
                          "GPUs it had when they are here with room, else other GPUs of the same "
                          "model with the most free memory (only those in CUDA_VISIBLE_DEVICES "
                          "when that is set).")(f)
    return f


def parse_gpus(value: str | None) -> list[str] | None:
    """--gpu 1 / --gpu 0,1 / --gpu GPU-8ca2...,GPU-11f0..."""
    if value is None:
        return None
    items = [x.strip() for x in value.split(",")]
    if not all(items):
        raise GpucrError(f"bad --gpu {value!r}", "give nvidia-smi indices or UUIDs separated by commas, e.g. --gpu 1")
    return items


def run_checkpoint(pid: int, to_dir: str, leave_running: bool, as_json: bool,
                   timeout_ms: int | None = None, run_dir: Path | None = None) -> None:
    rep = process_image.checkpoint_to(pid, to_dir, leave_running=leave_running, timeout_ms=timeout_ms, run_dir=run_dir)
    _print_report("checkpoint", rep, as_json)


def run_restore(from_dir: str, pidns: str, rewind_files: bool, as_json: bool, gpus: str | None = None) -> None:
    rep = process_image.restore_from(from_dir, pidns=pidns, rewind_files=rewind_files, gpus=parse_gpus(gpus))
    _print_report("restore", rep, as_json)
