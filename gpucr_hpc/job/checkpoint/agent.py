"""The node agent: one per node of a job, started inside the job's allocation.

    srun --jobid=J --overlap --ntasks-per-node=1 --mpi=pmix \
        python -m gpucr_hpc.job.checkpoint.agent checkpoint --job J --gen-dir DIR

The agents form an MPI world (a one-node job's single agent needs none) and
run the two-phase checkpoint:

1. prepare: each agent checkpoints every unit on its node in parallel into the
   (uncommitted) generation, leaving the processes running;
2. vote: an allreduce of success;
3. commit: rank 0 writes the job manifest and COMMITTED; or abort: every agent
   deletes what it wrote, and the job runs on as before.

Rank 0 alone prints, one JSON line each: every node's report (gathered over
MPI), then the job's result last, as `{"result": ...}`. (srun interleaves
the output of several tasks within long lines.)

`yield` and `reclaim` (for `gpucr-hpc suspend/resume JOBID`) checkpoint the
GPU state of every unit in place (VRAM yielded, processes kept) and
reclaim it; a yield that fails on any node is undone on every node.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError, NoGpuState, NotCheckpointed
from gpucr_hpc.job import generations, nccl_ranks
from gpucr_hpc.job.checkpoint import progress
from gpucr_hpc.job.connections import connections
from gpucr_hpc.job.connections.connections import Socket
from gpucr_hpc.job.storage import staging
from gpucr_hpc.job.units import Unit, local_units, mpi_process
from gpucr_hpc.process import image as process_image
from gpucr_hpc.slurm.site import load_site, node_name
from gpucr_hpc.store import files as image_files
from gpucr_hpc.store import manifest as mf
from gpucr_hpc.tcp import lock as netlock


def save_output(path: str, size: int, dest: Path) -> None:
    """The job's output file as it was at the dump (its first `size` bytes)."""
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "rb") as src, open(dest, "wb") as out:
        left = size
        while left:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)
        out.flush()
        os.fsync(out.fileno())


def stdio_of(pid: int) -> dict[str, str]:
    """What fds 0-2 of the unit's root were: a restore hands the new step's in their place."""
    out = {}
    for fd in (0, 1, 2):
        try:
            out[str(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return out


def checkpoint_unit(unit: Unit, gen_dir: Path, outputs: list[str], run_dir: Path, stay_yielded: bool = False,
                    tcp: dict | None = None, nccl: int = 0, stage: Path | None = None) -> dict:
    """run_dir: where the job's shims on this node have their sockets; tcp: the
    unit's TCP connections as the cut found them ("lock": who locks them;
    "ends", "peers": what a restore elsewhere needs to move them); nccl: its NCCL
    ranks, whose communicators a restore rebuilds; stage: the generation's folder in
    node memory, where the unit's image goes instead (staging.py)."""
    image_dir = (stage or gen_dir) / unit.name
    rep = process_image.checkpoint_to(unit.pid, image_dir, leave_running=True, stay_yielded=stay_yielded,
                                      run_dir=run_dir, tcp_lock=(tcp or {}).get("lock"), checksums=stage is None,
                                      on_phase=lambda phase, n: progress.emit(unit.node, unit.name, phase, n))
    progress.emit(unit.node, unit.name, "done", rep["bytes"])
    saved, script = {}, None
    if unit.name == "batch":
        m = mf.load(image_dir)
        sizes = {r["path"]: r["size"] for r in m.get("open_files") or []}
        script = save_script(unit.pid, sizes, gen_dir)
        for i, path in enumerate(dict.fromkeys(p for p in outputs if p)):
            if path in sizes:
                rel = f"output/{i}"
                save_output(path, sizes[path], gen_dir / rel)
                saved[path] = {"file": rel, "size": sizes[path]}
    return {**unit.as_dict(), "bytes": rep["bytes"], "timings": rep["timings"], "gpu_held": rep["gpu_held"],
            "saved_output": saved, "saved_script": script, "stdio": stdio_of(unit.pid), "nccl": nccl,
            **({"staged": True} if stage else {}),
            **({"arena_copied": rep["arena_copied"]} if rep.get("arena_copied") else {}),  # why not kept as is
            **({"tcp": {k: v for k, v in tcp.items() if k != "lock"}} if tcp else {})}


def save_script(pid: int, sizes: dict, gen_dir: Path) -> dict | None:
    """A copy of the batch script the shell has open (an argument of the unit's
    root that is among its open files): the job can then be submitted again
    from this generation once Slurm has forgotten it (job_cr.resubmit)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    path = next((a for a in args[1:] if a in sizes), None)
    if path is None:
        return None
    save_output(path, sizes[path], gen_dir / "script")
    return {"file": "script", "path": path, "size": sizes[path]}


def unit_image(gen_dir: Path, unit: dict, jobid: str) -> Path:
    """Where a unit's image of this generation is: node memory if it was staged."""
    stage = staging.job_stage(load_site(), jobid) if unit.get("staged") else None
    return (stage / gen_dir.name if stage else gen_dir) / unit["name"]


def resume_held(gen_dir: Path, units: list[dict], jobid: str) -> list[str]:
    """The GPU state back into this node's units that a checkpoint left holding none
    (a preemption whose vote or requeue failed): the job runs on. Errors, one line each."""
    from gpucr_hpc.process import image_gpu

    errors = []
    for u in units:
        if not u.get("gpu_held"):
            continue
        try:
            image_gpu.resume_held(unit_image(gen_dir, u, jobid))
        except GpucrError as e:
            errors.append(f"{u['name']} on {u['node']}: giving its GPU state back failed: {e.one_line()}")
    return errors


def survey(job: dict) -> tuple[Path, list[Unit]]:
    """This node's run dir and units, each one checkpointable."""
    site = load_site()
    node = node_name()
    run_dir = site.job_run_dir(job["id"], node)  # where the job's shims have their sockets
    units = local_units(run_dir, node)
    for u in units:
        mpi = mpi_process(criu_mod.process_tree(u.pid))
        if mpi is not None:
            raise GpucrError(f"{u.name} on {node} is an MPI program (process {mpi} has libmpi loaded): "
                             f"MPI jobs cannot be checkpointed", "run it without --gpucr=on")
    return run_dir, units


def unit_sockets(units: list[Unit]) -> list[Socket]:
    """The TCP sockets of these units' processes."""
    node = node_name()
    return [s for u in units
            for s in connections.unit_sockets(u.name, node, criu_mod.process_tree(u.pid), u.outside)]


def tcp_plans(sockets: list[Socket], c: connections.Cut) -> dict[str, dict]:
    """Per unit with TCP sockets: its ends (which a restore elsewhere moves), its
    established connections ("links", local end first: the lock a restore takes),
    which unit holds each peer end outside it ("peers"), and how its dump locks
    them: "skip", since the agents hold the lock on every one (None: only
    listening sockets). CRIU's own lock is never used: restoring a connection with
    data still unsent under it fails (EPIPE) where both ends are restored by one
    CRIU run. A connection to outside the job under the close policy is dumped
    like the others (the program runs on with it) and listed apart ("closed"):
    a restore gives it back closed, and neither moves nor locks it."""
    plans: dict[str, dict] = {}
    closing = {(s.unit, s.local, s.remote) for s in c.closed}
    for s in sockets:
        plan = plans.setdefault(s.unit, {"lock": None, "ends": [], "peers": {}, "links": [], "closed": []})
        if not s.listening:
            plan["lock"] = "skip"
        if (s.unit, s.local, s.remote) in closing:
            plan["closed"].append([s.local, s.remote])
            continue
        plan["ends"].append(s.local)
        if not s.listening:
            plan["links"].append([s.local, s.remote])
    for a, b in c.between_units:
        for mine, peer in ((a, b), (b, a)):
            if mine.unit in plans:
                plans[mine.unit]["peers"][mine.remote] = peer.unit
    return plans


def prepare(job: dict, gen_dir: Path, units: list[Unit], run_dir: Path,
            tcp: dict[str, dict] | None = None, stay_yielded: bool = False, nccl: list[int] | None = None) -> dict:
    """nccl: this node's NCCL ranks (torn down): each unit records how many are its own."""
    node = node_name()
    t0 = time.monotonic()
    outputs = [job.get("std_out", ""), job.get("std_err", "")]
    tcp = tcp or {}
    trees = {u.name: criu_mod.process_tree(u.pid) for u in units}
    stages = stage_units(job, gen_dir, units, trees) if stay_yielded else {}
    with ThreadPoolExecutor(max_workers=max(1, len(units))) as ex:
        futures = [ex.submit(checkpoint_unit, u, gen_dir, outputs, run_dir, stay_yielded, tcp.get(u.name),
                             len(set(nccl or []) & set(trees[u.name])), stages.get(u.name))
                   for u in units]
        done, errors = [], []
        for u, f in zip(units, futures):
            try:
                done.append(f.result())
            except GpucrError as e:
                errors.append(e.one_line())
            except Exception as e:  # noqa: BLE001 - any failure is a "no" vote
                full = image_files.full_disk(e, stages.get(u.name) or gen_dir)
                errors.append(f"{u.name} on {node}: {full.one_line() if full else f'{type(e).__name__}: {e}'}")
    return {"node": node, "ok": not errors, "units": done, "errors": errors,
            "prepare_s": time.monotonic() - t0, "submission": submission_of(run_dir)}


def stage_units(job: dict, gen_dir: Path, units: list[Unit], trees: dict[str, list[int]]) -> dict[str, Path]:
    """The units a preemption writes to node memory first (staging.py), by name ->
    the generation's folder there; the others go straight to the image root.
    trees: each unit's processes."""
    budget = staging.Budget(load_site(), str(job["id"]))
    chosen = [u for u in sorted(units, key=lambda u: u.name) if budget.take(staging.image_bytes(trees[u.name]))]
    if not chosen or budget.dir is None:
        return {}
    folder = budget.dir / gen_dir.name  # budget.dir: the plugin made it, this user's alone
    try:
        folder.mkdir(mode=0o700)
    except OSError:
        return {}  # not ours to write: straight to the image root
    return {u.name: folder for u in chosen}


def submission_of(run_dir: Path) -> str | None:
    """The job's submission, as the plugin recorded it on this node (spank/submission.h):
    never a unit's own environment, which a restore brings back from an older job."""
    try:
        return (run_dir / "submission").read_text().strip() or None
    except OSError:
        return None


def job_submission(job: dict, reports: list[dict]) -> str | None:
    """The batch host's record first: its batch step wrote it at this run's start."""
    ordered = sorted(reports, key=lambda r: r["node"] != job.get("batch_host"))
    return next((r["submission"] for r in ordered if r.get("submission")), None)


def job_manifest(job: dict, gen_dir: Path, reports: list[dict]) -> dict:
    m = mf.new_manifest(kind="job", vendor=None, gpu=None)
    units = [u for r in reports for u in r["units"]]
    m.update({
        "job": {k: job.get(k) for k in ("id", "user", "uid", "nodes", "batch_host", "std_out",
                                        "std_err", "restart_count", "partition")},
        "generation": gen_dir.name,
        "owner_uid": job["uid"],
        # which submission of the job id this generation belongs to (generations.py)
        "submission": job_submission(job, reports),
        "units": {u["name"]: {k: v for k, v in u.items() if k != "timings"} for u in units},
        "nodes": [r["node"] for r in reports],
        "prepare_s": max(r["prepare_s"] for r in reports),
    })
    for u in units:
        for rec in [*u.get("saved_output", {}).values(), *filter(None, [u.get("saved_script")])]:
            rel = rec["file"]
            mf.add_file(m, rel, rec["size"], mf.sha256_file(gen_dir / rel))
    m["total_bytes"] = sum(u["bytes"] for u in units) + sum(
        f["size"] for f in m["files"].values())
    return m


class _Alone:
    """The world of a one-node job's only agent: its vote is its own."""
    rank, size = 0, 1

    def allreduce(self, value, op=None):
        return value

    def gather(self, value, root=0):
        return [value]

    def bcast(self, value, root=0):
        return value

    def allgather(self, value):
        return [value]


def world():
    """(communicator, MIN) of the agents. A one-node job needs no MPI, nor an MPI
    library on its node (launch_agents starts its agent with --mpi=none)."""
    if os.environ.get("SLURM_STEP_NUM_TASKS") == "1":
        return _Alone(), None
    from mpi4py import MPI

    return MPI.COMM_WORLD, MPI.MIN


def run_checkpoint(args) -> int:
    comm, MIN = world()
    job = json.loads(args.job_json)
    gen_dir = Path(args.gen_dir)
    node = node_name()
    lock_name = f"job{job['id']}"
    failed = {"node": node, "ok": False, "units": [], "prepare_s": 0.0}
    units: list[Unit] = []
    mine: list[Socket] = []
    try:
        run_dir, units = survey(job)
        rep: dict = {"ok": True}
    except GpucrError as e:
        rep = {**failed, "errors": [e.one_line()]}
    # The NCCL ranks of every node stop at one cut and tear their communicators
    # down first: NCCL's finalize talks to the peers over the ranks' own
    # connections, which the lock below stops.
    nccl: list[int] = []
    parked = False
    if comm.allreduce(1 if rep["ok"] else 0, op=MIN):
        nccl = nccl_ranks.ranks_in([u.pid for u in units], run_dir)
        why = nccl_ranks.park(comm, nccl, run_dir)
        parked = not why
        if why:
            rep = {**failed, "errors": [why] if comm.rank == 0 else []}
    elif rep["ok"]:
        rep = {**failed, "errors": []}  # another node said why
    if rep["ok"]:
        try:  # after the teardown: NCCL's own connections are closed by then
            mine = unit_sockets(units)
        except GpucrError as e:
            rep = {**failed, "errors": [e.one_line()]}
    # Every agent sees every unit's sockets, so all decide alike and none dumps
    # anything before the job's connections between units are locked everywhere.
    every = [connections.Socket(**d) for sent in comm.allgather([s.as_dict() for s in mine]) for d in sent]
    cut = connections.cut(every)
    refusal = cut.refusal()
    names_it = any(s.node == node for s in cut.foreign)  # one node names the refusal: the foreign end's
    if rep["ok"] and refusal and names_it:
        rep = {**failed, "errors": [refusal]}
    flows = [netlock.Flow(s.local, s.remote) for s in mine if not s.listening]
    lease = ExitStack()  # the lock on this node's connections, while we live
    if rep["ok"] and flows:
        try:
            lease.enter_context(netlock.Lease(lock_name, flows, float(config.value("GPUCR_LOCK_LEASE"))))
        except GpucrError as e:
            rep = {**failed, "errors": [e.one_line()]}
        if comm.rank == 1 and config.fault("agent_dies_after_lock"):
            os.kill(os.getpid(), signal.SIGKILL)
    with lease:
        if comm.allreduce(1 if rep["ok"] else 0, op=MIN) and not refusal:
            rep = prepare(job, gen_dir, units, run_dir, tcp_plans(mine, cut), stay_yielded=args.stay_yielded,
                          nccl=nccl)
        elif rep["ok"]:
            rep = {**failed, "errors": []}  # another node said why
        if parked and not args.stay_yielded:  # the job runs on: its communicators again
            why = nccl_ranks.rebuild(comm, nccl, run_dir)
            rep["errors"] += [why] if why else []
        return _vote_and_commit(comm, MIN, job, gen_dir, rep, nccl if parked and args.stay_yielded else [])


def _print_reports(reports: list[dict], result: dict) -> None:
    """Rank 0 alone prints: srun interleaves the output of several tasks within
    long lines, so the reports reach rank 0 through MPI and leave it one per line."""
    for r in reports:
        print(json.dumps({"node_report": r}), flush=True)
    print(json.dumps({"result": result}), flush=True)


def _vote_and_commit(comm, MIN, job: dict, gen_dir: Path, rep: dict, nccl: list[int] | None = None) -> int:
    """nccl: ranks whose communicators are torn down, rebuilt if the job runs on."""
    yes = comm.allreduce(1 if rep["ok"] else 0, op=MIN)
    reports = comm.gather(rep, root=0)
    committed = False
    if comm.rank == 0:
        if yes and not any(r["units"] for r in reports):
            yes, reports[0]["errors"] = 0, ["no process of the job was found on its nodes"]
        if yes:
            try:
                m = job_manifest(job, gen_dir, reports)
                if generations.staged_nodes(m):  # durable once drained (job/storage/drain.py)
                    generations.stage_generation(gen_dir, m)
                else:
                    generations.commit_generation(gen_dir, m)
                committed = True
            except (GpucrError, OSError) as e:
                reports[0]["errors"].append(f"commit failed: {e}")
    committed = comm.bcast(committed, root=0)
    if not committed:
        rep["errors"] += resume_held(gen_dir, rep["units"], str(job["id"]))  # before the .h5 files go
        stage = staging.job_stage(load_site(), str(job["id"]))
        if stage is not None:
            shutil.rmtree(stage / gen_dir.name, ignore_errors=True)
        why = nccl_ranks.rebuild(comm, nccl or [], _run_dir(job))
        rep["errors"] += [why] if why else []
        comm.allreduce(1, op=MIN)
        if comm.rank == 0:
            generations.discard(gen_dir)  # the processes never stopped: nothing else to undo
    if comm.rank == 0:
        errors = [e for r in reports for e in r["errors"]]
        _print_reports(reports, {
            "committed": committed, "generation": gen_dir.name, "image": str(gen_dir),
            "errors": errors, "nodes": [r["node"] for r in reports],
            "units": [u["name"] for r in reports for u in r["units"]],
            "bytes": sum(u["bytes"] for r in reports for u in r["units"]),
            "prepare_s": max(r["prepare_s"] for r in reports)})
    return 0  # the outcome is in the result line; non-zero means an agent broke


def _run_dir(job: dict) -> Path:
    return load_site().job_run_dir(job["id"], node_name())


def _in_place(comm, job: dict, action: str) -> dict:
    """Checkpoint (action "checkpoint") or restore every unit of this node in place.
    Every agent calls it: the job's NCCL ranks are cut and rebuilt together."""
    from gpucr_hpc.process import in_place

    node = node_name()
    run_dir = _run_dir(job)
    t0 = time.monotonic()
    done, errors = [], []
    units = local_units(run_dir, node)
    nccl = nccl_ranks.ranks_in([u.pid for u in units], run_dir)
    if action == "checkpoint":
        why = nccl_ranks.park(comm, nccl, run_dir)
        if why:
            return {"node": node, "ok": False, "units": [], "errors": [why] if comm.rank == 0 else [],
                    "seconds": time.monotonic() - t0}
    for u in units:
        try:
            progress.emit(node, u.name, action, 0)
            if action == "checkpoint":
                rep = in_place.checkpoint_tree(u.pid, run_dir=run_dir)
            else:
                rep = in_place.restore_tree(u.pid, run_dir=run_dir, rebuild=False)
            progress.emit(node, u.name, "done", rep["bytes"])
            done.append({"unit": u.name, "bytes": rep["bytes"], "processes": len(rep["processes"]),
                         "gpu_processes": sum(1 for p in rep["processes"] if p["cuda"]),
                         "phases": rep["phases"]})
        except (NoGpuState, NotCheckpointed):
            continue  # nothing on a GPU in this unit, or nothing left to restore
        except GpucrError as e:
            errors.append(f"{u.name} on {node}: {e.one_line()}")
    if action == "restore":
        why = nccl_ranks.rebuild(comm, nccl, run_dir)
        errors += [why] if why else []
    return {"node": node, "ok": not errors, "units": done, "errors": errors,
            "seconds": time.monotonic() - t0}


def run_yield(args) -> int:
    comm, MIN = world()
    job = json.loads(args.job_json)
    rep = _in_place(comm, job, "checkpoint")
    yes = comm.allreduce(1 if rep["ok"] else 0, op=MIN)
    if not yes:  # every agent: the suspend is off, reclaim the GPU (and rebuild together)
        rep["undone"] = _in_place(comm, job, "restore")["ok"]
    reports = comm.gather(rep, root=0)
    if comm.rank == 0:
        _print_reports(reports, _in_place_result(reports, bool(yes)))
    return 0


def run_reclaim(args) -> int:
    comm, MIN = world()
    return _report_in_place(comm, MIN, _in_place(comm, json.loads(args.job_json), "restore"))


def _report_in_place(comm, MIN, rep: dict) -> int:
    """Every node's report, then the job's result (rank 0): ok only if every node's is."""
    reports = comm.gather(rep, root=0)
    ok = comm.allreduce(1 if rep["ok"] else 0, op=MIN)
    if comm.rank == 0:
        _print_reports(reports, _in_place_result(reports, bool(ok)))
    return 0


def run_resume_held(args) -> int:
    """After a failed requeue: every node's held units get their GPU state back."""
    comm, MIN = world()
    t0 = time.monotonic()
    gen_dir = Path(args.gen_dir)
    node = node_name()
    try:
        m = generations.manifest_of(gen_dir)
        units = [u for u in m["units"].values() if u.get("node") == node]
    except GpucrError as e:
        units, early = [], [f"{node}: {e.one_line()}"]
    else:
        early = []
    mine = [u for u in units if u.get("gpu_held")]
    errors = early + resume_held(gen_dir, mine, str(json.loads(args.job_json)["id"]))
    rep = {"node": node, "ok": not errors, "errors": errors, "seconds": time.monotonic() - t0,
           "units": [{"unit": u["name"], "bytes": u.get("bytes", 0), "gpu_processes": 1} for u in mine]}
    return _report_in_place(comm, MIN, rep)


def _in_place_result(reports: list[dict], ok: bool) -> dict:
    units = [u for r in reports for u in r["units"]]
    return {"ok": ok, "errors": [e for r in reports for e in r["errors"]],
            "nodes": [r["node"] for r in reports], "units": [u["unit"] for u in units],
            "bytes": sum(u["bytes"] for u in units),
            "gpu_processes": sum(u["gpu_processes"] for u in units),
            "seconds": max(r["seconds"] for r in reports)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpucr_hpc.job.checkpoint.agent")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("checkpoint")
    c.add_argument("--job-json", required=True)
    c.add_argument("--gen-dir", required=True)
    c.add_argument("--stay-yielded", action="store_true", help="leave the GPU memory yielded (preempt)")
    for name in ("yield", "reclaim"):
        sub.add_parser(name).add_argument("--job-json", required=True)
    r = sub.add_parser("resume-held")
    r.add_argument("--job-json", required=True)
    r.add_argument("--gen-dir", required=True)
    args = p.parse_args(argv)
    return {"checkpoint": run_checkpoint, "yield": run_yield, "reclaim": run_reclaim,
            "resume-held": run_resume_held}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
