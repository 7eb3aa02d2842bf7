#!/usr/bin/env python3
"""What handling the TCP connections between ranks adds to a job's checkpoint and restore.

On the project's local test cluster (scripts/testcluster), in one run, the same
job shape (2 nodes x 2 ranks, --gpucr=on) alternates between two variants:

  connected    a torch.distributed gloo job (env:// rendezvous on the first
               node; an all-reduce and a TCP-store set/get every step, as in
               tests/test_job_tcp.py): the agents list its sockets, lock its
               connections with nftables, dump them with --tcp-established, and
               a restore moves their ends to the new nodes' addresses;
  unconnected  the same 4 ranks, the same `import torch`, the same local
               compute, pace and ballast, no torch.distributed and no sockets.

Each rank holds --ballast-mib of resident memory, so CRIU dumps about as much
in both. Per run: `gpucr-hpc checkpoint JOBID --json` in place (wall time and
its figures), then, with the job's first node drained (--no-move: not) so the
restore lands on another node set, `gpucr-hpc preempt JOBID --json` (wall
time); then the time from the preempt command's end until the job is RUNNING
again, and until every rank logs a step again (each step line carries its wall
time). The rank restores log no duration of their own in restore.log (only the
batch tree's does: "batch tree restored in X s"), so each rank's is measured
from the job's restart to its first new step line. For the connected job, the
generation's manifest says how many connections between ranks and listening
sockets each checkpoint handled (units[...]["tcp"]).

Reported: medians per variant and the difference (connected - unconnected);
saved: every run's raw figures, machine, CRIU version, cluster mode, load.

The cluster is the one $GPUCR_TESTCLUSTER_DIR/$GPUCR_TESTCLUSTER_PORT name;
it is brought up if it is not, and then taken down at the end. As root:

    GPUCR_TESTCLUSTER_DIR=/tmp/gpucr-tc-bench GPUCR_TESTCLUSTER_PORT=18117 \\
        python3 bench/bench_tcp_job.py --repeat 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_cluster import REPO, TESTCLUSTER, BenchError, Cluster, cluster_env, cluster_is_up, cluster_up, steps_of
from common.record import utc_now, write_record
from common.stats import median
from common.timing import wait_until

PREFIX = Path(os.environ.get("GPUCR_PREFIX", "/opt/gpucr-hpc"))
SHIM = PREFIX / "lib" / "gpucr" / "libgpucr-cuda.so"
VARIANTS = ("connected", "unconnected")
METRICS = (  # summary key, what the table calls it
    ("checkpoint_s", "checkpoint in place (command)"),
    ("preempt_s", "preempt (command)"),
    ("restore_to_running_s", "preempt end -> RUNNING again"),
    ("restore_to_stepping_s", "preempt end -> every rank steps"),
)

RANK = r"""
import os, sys, time
import torch
out, mode, steps, pace, ballast_mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
ballast = torch.rand(ballast_mib * 2**20 // 4)  # resident: every page written
connected = mode == "connected"
if connected:
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)
    store = dist.distributed_c10d._get_default_store()
log = open(f"{out}/rank-{rank}.txt", "a", buffering=1)
for step in range(steps):
    t = torch.full((1024,), float((rank + 1) * (step + 1)), dtype=torch.float64)
    if connected:
        dist.all_reduce(t)
        store.set(f"s{step}r{rank}", str(step))
        store.get(f"s{step}r{(rank + 1) % world}")
    else:
        t = t * world  # the same local work, alone
    log.write(f"{step} {time.time():.6f} {t[0].item()}\n")
    time.sleep(pace)
log.write("done\n")
"""

SCRIPT = """#!/bin/bash
export MASTER_ADDR=$(getent hosts $(scontrol show hostnames $SLURM_JOB_NODELIST | head -1) | awk '{{print $1}}')
export MASTER_PORT={port} OMP_NUM_THREADS=1
srun --ntasks=4 --ntasks-per-node=2 {python} {workdir}/rank.py {rundir} {mode} {steps} {pace} {ballast}
"""


def shim_answers_io_uring() -> bool:
    """The gloo job needs the installed shim to export syscall (io_uring_setup: ENOSYS)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(SHIM)], capture_output=True, text=True)
    return any(ln.split()[-1:] == ["syscall"] for ln in out.stdout.splitlines())


# --------------------------------------------------------------- one run ---

def tcp_counts(manifest: dict) -> dict:
    """The TCP sockets a checkpoint handled, from the generation's manifest. A link
    is one end of a connection between two units (ranks): each such connection
    has both its ends there. The other ends are listening sockets and the ends of
    connections inside one rank (a rank's own client of its TCP store): the
    manifest keeps only their local address, which does not tell them apart."""
    ends = links = 0
    per_unit = {}
    for name, u in manifest.get("units", {}).items():
        tcp = u.get("tcp")
        if not tcp:
            continue
        per_unit[name] = {"ends": len(tcp.get("ends", [])), "peers": len(tcp.get("peers", {})),
                          "links": len(tcp.get("links", []))}
        ends += per_unit[name]["ends"]
        links += per_unit[name]["links"]
    return {"connections_between_ranks": links // 2, "ends": ends, "linked_ends": links,
            "listening_or_within_a_rank_ends": ends - links, "units_with_tcp": len(per_unit),
            "per_unit": per_unit}


def unit_timings(result: dict) -> dict:
    return {u["name"]: {k: round(v, 4) for k, v in (u.get("timings") or {}).items() if isinstance(v, (int, float))}
            for r in result.get("node_reports", []) for u in r.get("units", [])}


def figures(result: dict, wall: float) -> dict:
    keep = ("total_s", "prepare_s", "requeue_s", "bytes", "generation", "nodes", "units")
    return {"wall_s": round(wall, 4), **{k: result[k] for k in keep if k in result},
            "unit_timings": unit_timings(result)}


def restore_log_lines(cluster: Cluster, jobid: str, offset: int) -> tuple[list[str], int]:
    log = cluster.state / "images" / jobid / "restore.log"
    if not log.exists():
        return [], 0
    data = log.read_bytes()
    return data[offset:].decode(errors="replace").splitlines(), len(data)


def one_run(cluster: Cluster, variant: str, index: int, args, workdir: Path) -> dict:
    rundir = workdir / f"{index:02d}-{variant}"
    rundir.mkdir()
    os.chmod(rundir, 0o755)
    script = rundir / "job.sh"
    script.write_text(SCRIPT.format(port=args.port + index, python=sys.executable, workdir=workdir,
                                    rundir=rundir, mode=variant, steps=args.steps, pace=args.pace,
                                    ballast=args.ballast_mib))
    logs = [rundir / f"rank-{r}.txt" for r in range(4)]
    out = cluster.run("sbatch", "--parsable", "--gpucr=on", "-N2", "--ntasks-per-node=2",
                      "-J", f"bench-{variant}", "-o", str(rundir / "job.out"), str(script))
    jobid = out.stdout.strip().split(";")[0]
    rec: dict = {"variant": variant, "index": index, "job": jobid}
    drained = None
    try:
        wait_until(lambda: cluster.job(jobid).get("JobState") == "RUNNING", 120, f"job {jobid} to run")
        wait_until(lambda: all(len(steps_of(p)) > 5 for p in logs), 180, f"every rank of {jobid} to step")
        rec["nodes"] = cluster.nodes(jobid)
        time.sleep(args.settle)

        wall, res = cluster.gpucr("checkpoint", jobid)
        rec["checkpoint"] = figures(res, wall)
        if variant == "connected":
            sys.path.insert(0, str(REPO))
            from gpucr_hpc.store import manifest as mf
            rec["checkpoint"]["tcp"] = tcp_counts(mf.load(Path(res["image"])))
        at = [len(steps_of(p)) for p in logs]
        wait_until(lambda: all(len(steps_of(p)) > k + 5 for p, k in zip(logs, at)), 120,
                   "every rank to step on after the checkpoint")

        if args.move:
            drained = rec["nodes"][0]
            cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=gpucr-bench")
        _, log_at = restore_log_lines(cluster, jobid, 0)
        wall, res = cluster.gpucr("preempt", jobid)
        t_end = time.time()
        rec["preempt"] = figures(res, wall)
        if variant == "connected":
            rec["preempt"]["tcp"] = tcp_counts(mf.load(Path(res["image"])))

        def running_again():
            j = cluster.job(jobid)
            return j.get("Restarts") == "1" and j.get("JobState") == "RUNNING"
        wait_until(running_again, 180, f"job {jobid} to run again")
        t_running = time.time()

        def first_new():
            firsts = [next((ts for _, ts in steps_of(p) if ts > t_end), None) for p in logs]
            return firsts if all(f is not None for f in firsts) else None
        firsts = wait_until(first_new, 180, f"every rank of {jobid} to step after its restore")
        rec["nodes_after"] = cluster.nodes(jobid)
        lines, _ = restore_log_lines(cluster, jobid, log_at)
        batch = [ln for ln in lines if "batch tree restored in" in ln]
        m = re.search(r"restored in ([\d.]+) s (\{.*\})?", batch[-1]) if batch else None
        rec["restore"] = {
            "to_running_s": round(t_running - t_end, 4),
            "to_stepping_s": round(max(firsts) - t_end, 4),
            "rank_first_step_after_running_s": [round(f - t_running, 4) for f in firsts],
            "batch_tree_s": float(m.group(1)) if m else None,
            "batch_tree_timings": json.loads(m.group(2)) if m and m.group(2) else None,
            "restore_log": lines,
        }
        steps = [[s for s, _ in steps_of(p)] for p in logs]
        rec["steps_in_order"] = all(s == list(range(len(s))) for s in steps)
    except (BenchError, TimeoutError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        # what a failed run needs to be understood, before its images go
        j = cluster.job(jobid)
        rec.update({"error": str(e), "job_state": {k: j.get(k) for k in ("JobState", "Reason", "Restarts", "NodeList")},
                    "restore_log_all": restore_log_lines(cluster, jobid, 0)[0],
                    "job_out": (rundir / "job.out").read_text(errors="replace")[-4000:]
                    if (rundir / "job.out").exists() else None,
                    "rank_tails": [p.read_text(errors="replace").splitlines()[-3:] if p.exists() else None
                                   for p in logs]})
    finally:
        if drained:
            cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
        cluster.run("scancel", jobid, check=False)
        try:
            wait_until(lambda: cluster.job(jobid).get("JobState") in ("CANCELLED", "COMPLETED", "FAILED", None)
                       or not cluster.job(jobid), 60, f"job {jobid} to end")
        except TimeoutError as e:
            rec.setdefault("warnings", []).append(str(e))
        if not args.keep_images:  # about 1.7 GB a run (two generations)
            shutil.rmtree(cluster.state / "images" / jobid, ignore_errors=True)
    return rec


# ----------------------------------------------------------------- report ---

EXTRA = ("checkpoint_total_s", "checkpoint_prepare_s", "preempt_prepare_s", "batch_tree_restore_s")


def metric(rec: dict, key: str) -> float | None:
    return {"checkpoint_s": rec.get("checkpoint", {}).get("wall_s"),
            "checkpoint_total_s": rec.get("checkpoint", {}).get("total_s"),
            "checkpoint_prepare_s": rec.get("checkpoint", {}).get("prepare_s"),
            "preempt_prepare_s": rec.get("preempt", {}).get("prepare_s"),
            "batch_tree_restore_s": rec.get("restore", {}).get("batch_tree_s"),
            "preempt_s": rec.get("preempt", {}).get("wall_s"),
            "restore_to_running_s": rec.get("restore", {}).get("to_running_s"),
            "restore_to_stepping_s": rec.get("restore", {}).get("to_stepping_s")}[key]


def summarize(runs: list[dict]) -> dict:
    summary: dict = {}
    for key in [k for k, _ in METRICS] + list(EXTRA):
        med = {v: median((metric(r, key) for r in runs if r["variant"] == v and "error" not in r), digits=4)
               for v in VARIANTS}
        diff = (round(med["connected"] - med["unconnected"], 4)
                if None not in (med["connected"], med["unconnected"]) else None)
        summary[key] = {**{f"{v}_median": med[v] for v in VARIANTS}, "difference": diff,
                        "n": {v: sum(1 for r in runs if r["variant"] == v and "error" not in r)
                              for v in VARIANTS}}
    tcp = [r["checkpoint"]["tcp"] for r in runs if r.get("checkpoint", {}).get("tcp")]
    if tcp:
        summary["connected_tcp_per_checkpoint"] = {
            k: sorted({t[k] for t in tcp})
            for k in ("connections_between_ranks", "ends", "listening_or_within_a_rank_ends", "units_with_tcp")}
    return summary


def print_table(summary: dict) -> None:
    def f(x):
        return "-" if x is None else f"{x:.2f} s"
    rows = [("median", "connected", "unconnected", "connected - unconnected")]
    rows += [(label, f(summary[k]["connected_median"]), f(summary[k]["unconnected_median"]),
              ("-" if summary[k]["difference"] is None else f"{summary[k]['difference']:+.2f} s"))
             for k, label in METRICS]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    tcp = {k: "/".join(map(str, v)) for k, v in (summary.get("connected_tcp_per_checkpoint") or {}).items()}
    if tcp:
        print(f"connected job, per checkpoint: {tcp['connections_between_ranks']} connection(s) between ranks; "
              f"{tcp['ends']} TCP ends in {tcp['units_with_tcp']} unit(s), of which "
              f"{tcp['listening_or_within_a_rank_ends']} listening or of a connection inside one rank")


def criu_version() -> str:
    try:
        out = subprocess.run([str(PREFIX / "bin" / "criu"), "--version"], capture_output=True, text=True)
        return " ".join(out.stdout.split()) or out.stderr.strip()
    except OSError as e:
        return f"unknown ({e})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3, help="runs of each variant (default 3)")
    p.add_argument("--ballast-mib", type=int, default=64, help="resident memory per rank (default 64)")
    p.add_argument("--pace", type=float, default=0.05, help="sleep per step, s (default 0.05)")
    p.add_argument("--steps", type=int, default=100000, help="steps per rank (the job is cancelled first)")
    p.add_argument("--settle", type=float, default=1.0, help="s of running before the checkpoint")
    p.add_argument("--port", type=int, default=23100, help="first rendezvous port (one per run)")
    p.add_argument("--no-move", dest="move", action="store_false",
                   help="do not drain the job's first node before the preempt (it may restore in place)")
    p.add_argument("--variant", choices=VARIANTS, action="append",
                   help="run only this variant (repeatable; default both, alternating)")
    p.add_argument("--keep-images", action="store_true",
                   help="keep each job's generations in the cluster's image root (default: removed)")
    p.add_argument("--out", type=Path, help="JSON (default bench/results/tcp-job-<date>.json)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_tcp_job: error: the test cluster and CRIU need root", file=sys.stderr)
        return 1
    variants = tuple(v for v in VARIANTS if v in (args.variant or VARIANTS))
    if "connected" in variants and not shim_answers_io_uring():
        print(f"bench_tcp_job: error: {SHIM} does not export syscall (the gloo job's libuv would use "
              "io_uring); install the current shim (make install)", file=sys.stderr)
        return 1
    started = datetime.datetime.now(datetime.timezone.utc)
    out_path = args.out or REPO / "bench" / "results" / f"tcp-job-{started:%Y-%m-%d}.json"
    doc: dict = {
        "benchmark": "tcp-job", "date": started.isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
        "criu": criu_version(), "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "load_start": os.getloadavg(), "runs": [],
    }
    try:
        import torch
        doc["machine"]["torch"] = torch.__version__
    except ImportError:
        pass
    tmp = Path(tempfile.mkdtemp(prefix="gpucr-bench-tcp-"))
    os.chmod(tmp, 0o755)
    (tmp / "rank.py").write_text(RANK)
    env = cluster_env(tmp)
    started_it = not cluster_is_up(env)  # then taken down at the end
    rc = 0
    try:
        cluster = cluster_up(env)
        doc["cluster"] = {"mode": cluster.mode(), "state": str(cluster.state), "gpucr_cli": cluster.env["GPUCR_CLI"]}
        print(f"cluster: {cluster.state} ({doc['cluster']['mode']}); load {doc['load_start']}", flush=True)
        index = 0
        for _ in range(args.repeat):
            for variant in variants:
                t0 = time.monotonic()
                try:
                    rec = one_run(cluster, variant, index, args, tmp)
                except BenchError as e:  # sbatch failed: no job
                    rec = {"variant": variant, "index": index, "error": str(e)}
                rc |= "error" in rec
                rec["run_s"] = round(time.monotonic() - t0, 2)
                doc["runs"].append(rec)
                print(f"run {index} {variant}: " + (f"error: {rec['error']}" if "error" in rec else
                      "checkpoint {:.2f} s, preempt {:.2f} s, running {:.2f} s, stepping {:.2f} s".format(
                          *(metric(rec, k) for k, _ in METRICS))), flush=True)
                index += 1
    except BenchError as e:
        print(f"bench_tcp_job: error: {e}", file=sys.stderr)
        doc["error"] = str(e)
        rc = 1
    finally:
        if started_it:
            subprocess.run([str(TESTCLUSTER), "down"], capture_output=True, timeout=180, env=env)
        shutil.rmtree(tmp, ignore_errors=True)
    doc["finished"] = utc_now()
    doc["load_end"] = os.getloadavg()
    doc["summary"] = summarize(doc["runs"])
    print_table(doc["summary"])
    write_record(out_path, doc, indent=2)
    print(f"saved {out_path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
