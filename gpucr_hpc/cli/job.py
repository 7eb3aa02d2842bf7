"""Job-level commands: preempt, ls, and the JOBID forms of checkpoint/restore/status.

The logic is in coordinator.py; this is the click surface and the output.
"""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.table import Table

from gpucr_hpc import figures
from gpucr_hpc.cli import job_id, output
from gpucr_hpc.cli.operator_door import through_door_if_not_mine
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import dirs as job_dirs
from gpucr_hpc.job import events, generations, listing
from gpucr_hpc.job.checkpoint import coordinator
from gpucr_hpc.job.storage import retention
from gpucr_hpc.slurm.site import load_site


def print_job_result(kind: str, result: dict, as_json: bool) -> None:
    if as_json:
        output.print_json(kind, result)
        return
    done = {"checkpoint": "checkpointed", "preempt": "preempted"}[kind]
    click.echo(f"{done} job {result['job']} {result['generation']}: "
               f"{len(result.get('units', []))} unit(s) on {', '.join(result.get('nodes', []))}, "
               f"{figures.size(result.get('bytes', 0))} in {result.get('total_s', 0):.2f} s "
               f"(prepare {result.get('prepare_s', 0):.2f} s)")
    click.echo(f"image: {result['image']}")


def checkpoint_job(jobid: str, as_json: bool) -> None:
    through_door_if_not_mine("checkpoint", jobid, *["--json"] * as_json)
    with output.working(f"checkpointing job {jobid} on its nodes"):
        result = coordinator.checkpoint(jobid)
    result["job"] = jobid
    print_job_result("checkpoint", result, as_json)


def parse_generation(value: str | None) -> int | None:
    """`--from 3` or `--from gen-3` for a job restore."""
    if value is None:
        return None
    text = value[4:] if value.startswith("gen-") else value
    if not text.isdigit():
        raise GpucrError(f"'{value}' is not a generation", "give --from N or --from gen-N "
                         "(gpucr-hpc ls JOBID lists them)")
    return int(text)


def restore_job(jobid: str, gen: int | None, as_json: bool, resubmit: bool = False) -> None:
    if not resubmit:
        through_door_if_not_mine("restore", jobid, *(["--from", str(gen)] if gen is not None else []),
                                 *["--json"] * as_json)
    result = coordinator.resubmit(jobid, gen) if resubmit else coordinator.restore(jobid, gen)
    if as_json:
        output.print_json("restore", result)
    elif result.get("resubmitted_as"):
        click.echo(f"job {jobid} submitted again as job {result['resubmitted_as']}, "
                   f"which restores {result['generation']} when it starts")
    else:
        what = "requeued" if result["requeued"] else "will restore when it starts"
        click.echo(f"job {jobid}: restoring from {result['generation']}; {what}")


@click.command()
@click.argument("jobid", callback=job_id.argument)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def preempt(jobid, as_json):
    """Checkpoint a running --gpucr=on job, then requeue it.

    When the job starts again it is restored from this checkpoint instead of
    running its script from the top.
    """
    through_door_if_not_mine("preempt", jobid, *["--json"] * as_json)
    with output.working(f"checkpointing job {jobid} on its nodes, then requeueing it"):
        result = coordinator.preempt(jobid)
    result["job"] = jobid
    print_job_result("preempt", result, as_json)


@click.command(hidden=True)
@click.argument("jobid", callback=job_dirs.job_id_argument)  # the epilog's SLURM_JOB_ID: digits
def drain(jobid):
    """Drain the job's staged checkpoints on this node to the image root (the job
    epilog runs this, as the job's user, once the job has ended on the node)."""
    from gpucr_hpc.job.storage import drain as job_drain

    errors = job_drain.drain_job(jobid)
    if errors:
        raise GpucrError(f"drain of job {jobid} failed: {'; '.join(errors)}",
                         "see `gpucr-hpc status JOBID`; the job restores from its previous checkpoint")


def generation_state(r: dict) -> str:
    if r.get("error"):
        return "damaged"
    if r.get("drain_failed"):
        return f"drain failed: {r['drain_failed']}"
    if r.get("staged"):
        return "staged in node memory, draining" + (" (latest)" if r.get("latest") else "")
    if r.get("other_submission"):
        return "committed (other submission)"
    return ("committed" if r["committed"] else "incomplete") + (" (latest)" if r.get("latest") else "")


def generation_cells(r: dict) -> list[str]:
    """generation, state, size, nodes, units, created: one row of the ls/status tables."""
    return [r["generation"], generation_state(r), figures.size(r.get("bytes", 0)),
            ",".join(r.get("nodes", [])), str(len(r.get("units", []))), r.get("created") or ""]


@click.command("ls")
@click.argument("jobid", required=False, callback=job_id.argument)
@click.option("--json", "as_json", is_flag=True, help="Print the generations as JSON.")
def ls(jobid, as_json):
    """List the checkpoints in the image store: jobs, generations, sizes, nodes."""
    rows = listing.job_rows(jobid)
    job_dir = load_site().job_image_dir(jobid) if jobid else None
    if job_dir is not None and not job_dir.exists():  # not a --gpucr=on job of this store
        raise GpucrError(f"the image store has no job {jobid} ({job_dir})",
                         "`gpucr-hpc ls` lists the jobs it has; `gpucr-hpc status JOBID` says what happened "
                         "to the job")
    if as_json:
        output.print_json("ls", {"job": jobid, "generations": rows})
        return
    if not rows:
        click.echo(f"no checkpoint of job {jobid} yet" if jobid else
                   f"no checkpoints in the image store ({load_site().imageroot})")
        return
    t = output.table("gpucr-hpc checkpoints", ("job", "generation", "state", "size", "nodes", "units", "created"))
    for r in rows:
        t.add_row(r["job"], *generation_cells(r))
    output.console().print(t)


@click.command()
@click.argument("jobid", required=False, callback=job_id.argument)
@click.option("--keep", type=click.IntRange(min=1), default=generations.KEEP_COMMITTED, show_default=True,
              help="Committed generations to keep per job (the newest; never fewer than a restore needs).")
@click.option("--ended", is_flag=True,
              help="Also remove whole jobs that Slurm reports COMPLETED or CANCELLED.")
@click.option("--dry-run", is_flag=True, help="Say what would go; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the actions as JSON.")
def prune(jobid, keep, ended, dry_run, as_json):
    """Remove old checkpoints from the image store: generations beyond the newest
    --keep of each job (yours; root: everyone's), ones whose checkpoint died, and
    with --ended the jobs that will not be restored. Never the generation a pending
    or held restore reads, nor a job a command is acting on."""
    root = Path(load_site().imageroot)
    dirs = retention.job_dirs(root, jobid)
    states = retention.job_states() if ended else None
    actions = [a.as_dict() for d in dirs for a in retention.prune_job(d, keep, states, dry_run)]
    if as_json:
        output.print_json("prune", {"dry_run": dry_run, "actions": actions})
        return
    if not actions:
        click.echo("nothing to prune")
        return
    t = output.table("gpucr-hpc prune" + (" (dry run: nothing removed)" if dry_run else ""),
                     ("job", "generation", "action", "why"))
    for a in actions:
        t.add_row(a["job"], a["generation"] or "(whole job)", a["action"], a["why"])
    output.console().print(t)


def print_in_place(verb: str, jobid: str, result: dict, as_json: bool) -> None:
    if as_json:
        output.print_json({"suspended": "suspend", "resumed": "resume"}[verb], {"job": jobid, **result})
        return
    gpu = (f"GPU memory of {result['gpu_processes']} process(es), {figures.size(result['bytes'])}"
           if result["gpu_processes"] else "no GPU process")
    click.echo(f"{verb} job {jobid} on {', '.join(result['nodes'])}: {gpu}, "
               f"in {result.get('total_s', 0):.2f} s")


@click.command()
@click.argument("jobid", callback=job_id.argument)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def suspend(jobid, as_json):
    """Yield a running --gpucr=on job's GPU memory, then suspend it (scontrol suspend).

    Every GPU process of every rank is checkpointed in place first; if that
    fails anywhere, the job is left running with its GPU memory.
    """
    through_door_if_not_mine("suspend", jobid, *["--json"] * as_json)
    with output.working(f"yielding the GPU memory of job {jobid}, then suspending it"):
        result = coordinator.suspend(jobid)
    print_in_place("suspended", jobid, result, as_json)


@click.command()
@click.argument("jobid", callback=job_id.argument)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def resume(jobid, as_json):
    """Resume a job suspended by `gpucr-hpc suspend`, and reclaim its GPU memory in place."""
    through_door_if_not_mine("resume", jobid, *["--json"] * as_json)
    with output.working(f"resuming job {jobid}, then reclaiming its GPU memory"):
        result = coordinator.resume(jobid)
    print_in_place("resumed", jobid, result, as_json)


def job_status(jobid: str) -> dict:
    """What Slurm says about the job, and what the image store holds for it."""
    from gpucr_hpc.slurm import commands as slurm

    if not jobid.isdigit():
        raise GpucrError(f"'{jobid}' is not a job id", "give the numeric Slurm job id")
    site = load_site()
    try:  # Slurm unreachable: that one line, never taken for a job it forgot
        job, unknown = slurm.show_job(jobid), None
    except slurm.JobUnknown as e:
        job, unknown = None, e
    if job is not None:
        slurm.check_access(job, "only the job's owner or root can see its checkpoints")
    out: dict = {"job": jobid, "known_to_slurm": job is not None, "state": None, "user": None, "nodes": [],
                 "partition": None, "restarts": None, "reason": None, "note": None,
                 "generations": listing.job_rows(jobid)}
    if job is not None:
        out.update(state=job.state, user=job.user, nodes=job.nodes, partition=job.partition,
                   restarts=job.restart_count, reason=job.raw.get("Reason", ""))
    elif not out["generations"] and unknown is not None:
        raise unknown
    elif unknown is not None:
        out.update(note=f"{unknown.cause}; `gpucr-hpc restore {jobid}` submits it again from its newest "
                        "checkpoint")
    latest = next((g for g in out["generations"] if g.get("latest")), None)
    out["latest"] = latest["generation"] if latest else None
    log = site.job_image_dir(jobid) / "restore.log"
    out["log"] = log.read_text().splitlines()[-5:] if log.exists() else []
    out["story"] = [{k: v for k, v in ev.items() if k != "pid"} for ev in events.read(site.job_image_dir(jobid))]
    return out


def show_job_status(jobid: str, as_json: bool) -> None:
    st = job_status(jobid)
    if as_json:
        output.print_json("job-status", st)
        return
    console = output.console()
    head = Table.grid(padding=(0, 2))
    for key in ("job", "state", "user", "partition", "nodes", "restarts", "latest"):
        if key == "state" and not st["known_to_slurm"]:
            head.add_row(key, "not known to Slurm")
        elif st.get(key) is not None:
            value = ",".join(st[key]) if isinstance(st[key], list) else str(st[key])
            head.add_row(key, value or "-")
    if st.get("note"):
        head.add_row("note", st["note"])
    console.print(head)
    if st["generations"]:
        t = output.table("checkpoints", ("generation", "state", "size", "nodes", "units", "created"))
        for r in st["generations"]:
            t.add_row(*generation_cells(r))
        console.print(t)
    else:
        console.print("no checkpoint yet")
    if st["story"]:
        t = output.table("what was done to it", ("when", "what", "by", "result"))
        for ev in st["story"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ev.get("at", 0)))
            result = (f"{ev.get('generation') or 'ok'} in {ev['took_s']:.1f} s" if ev.get("ok") and ev.get("took_s")
                      else "ok" if ev.get("ok") else f"failed: {ev.get('error', '')}")
            t.add_row(when, ev.get("what", "?"), ev.get("by", "?"), result)
        console.print(t)
    for line in st["log"]:
        console.print(f"log: {line}", markup=False, highlight=False)
