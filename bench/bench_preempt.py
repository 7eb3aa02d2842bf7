#!/usr/bin/env python3
"""How long a preempted job holds its node: `node_free_s`, beside the rates that bound it.

On the project's local test cluster (scripts/testcluster), one `--gpucr=on` job
per size, one node, one task holding GIB of memory (host memory, every page
written; with --gpu, GPU memory through PyTorch) and logging a step every 0.1 s.
Per size, in one run:

  preempt_s      `gpucr-hpc preempt JOBID` from its start to its return;
  node_free_s    from the same start until no process of the job is left on
                 the node (none whose environment carries its SLURM_JOB_ID:
                 script, ranks, agents), polled every 20 ms;
  back_s         from the same start until the job, restarted, logs a new step (with
                 --gpu each step reads the GPU: its data is back);
  image_gib      the generation's bytes (manifest), and image_write_GBps those
                 bytes over preempt_s; unit_dump_s, unit_persist_s: the slowest
                 unit's CRIU dump (to node memory where it fits) and its write
                 to the image root (unit_gpu_released_s: its GPU data out);
  raw_write_GBps the image root's file system: GIB written in 64 MiB blocks and
                 fsync'ed, in the same run; raw_shm_GBps the same into /dev/shm
                 (what a node-local staging tier would take).

With --tiers each size runs twice, side by side: "direct" (the units written
to the image root before the job ends) and "staged" (plugstack.conf stage= in
/dev/shm: the units go to node memory, the job ends, the epilog's drain moves
them to the image root); a staged record adds drained_s, from the preempt to
the generation committed on the image root.

With --restore each size runs three ways, all staged but the first, to time the
restore itself (`restore_s`, the script's tree read and restored, from
restore.log, and `restore_from`, where it was read): "direct, same node" (the
job pinned to its node, the image root read back from the page cache),
"staged, same node" (pinned: node memory, where the job is back before the
drain is done; --drain-delay S starts its drain S seconds late, as behind an
image root slower than the restart) and "staged, moved" (the job held until the drain is done, the
page cache dropped and its node drained, so that another node reads the image
root cold); beside them `raw_read_GBps`, the image root read cold in 64 MiB
blocks in the same run, and `restore_GBps`, the image's bytes over restore_s.
The "direct, same node" run first suspends and resumes the job in place
(`gpucr-hpc suspend/resume`): `inplace_checkpoint_s` and `inplace_restore_s`,
the agents' in-place checkpoint and restore of its units, the baseline of a
restore from node memory.

With --gpu each job is preempted only once its arena holds its GPU memory
(`arena_ready_s` after it first stepped), as a job that ran a while is.
--raw-gib caps the bytes of the raw rate measurements (their rate, not the
job's size, is what they are for); each job's image folder is removed after its
record, so that the largest sizes fit the disk.

Saved: JSON (every record carries gib, tier and node_free_s) and, where
matplotlib is found, a plot beside it. As root:

    GPUCR_TESTCLUSTER_DIR=/tmp/gpucr-tc-bench GPUCR_TESTCLUSTER_PORT=18117 \\
        python3 bench/bench_preempt.py --gib 1 4 [--gpu] [--tiers | --restore]
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
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench_cluster import REPO, TESTCLUSTER, BenchError, Cluster, cluster_env, cluster_is_up, cluster_up
from common.gpucr_cli import run_gpucr
from common.machine import gpu_line
from common.plots import pyplot
from common.record import write_record
from common.timing import wait_until

BLOCK = 64 << 20

WORKLOAD = r"""
import mmap, os, sys, time
out, gib, where = sys.argv[1], float(sys.argv[2]), sys.argv[3]
n = int(gib * 2**30)
if where == "gpu":
    import torch
    ballast = torch.empty(n // 4, dtype=torch.float32, device="cuda")
    ballast.uniform_()
    torch.cuda.synchronize()
else:
    ballast = mmap.mmap(-1, n)
    block = os.urandom(1 << 20)
    for off in range(0, n, 1 << 20):
        ballast[off:off + (1 << 20)] = block[:min(1 << 20, n - off)]
log = open(os.path.join(out, "steps.txt"), "a", buffering=1)
step = 0
while True:
    step += 1
    if where == "gpu":  # a step reads the GPU: after a restore, once its data is back
        ballast[(step * 4099) % ballast.numel()].item()
    log.write(f"{step} {time.time():.3f}\n")
    time.sleep(0.1)
"""


def job_pids(jobid: str) -> list[int]:
    """Processes on this machine whose environment names the job (its script,
    ranks and agents; slurmstepd carries none)."""
    mark = f"SLURM_JOB_ID={jobid}\0".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if env.startswith(mark) or b"\0" + mark in env:
            found.append(int(entry.name))
    return found


def rate(path: Path, gib: float, sync: bool) -> float:
    """GB/s of writing gib GiB to path in 64 MiB blocks (fsync'ed when sync)."""
    block = os.urandom(BLOCK)
    total = int(gib * 2**30)
    t0 = time.monotonic()
    with open(path, "wb") as f:
        done = 0
        while done < total:
            done += f.write(block[:min(BLOCK, total - done)])
        if sync:
            f.flush()
            os.fsync(f.fileno())
    took = time.monotonic() - t0
    path.unlink()
    return round(total / took / 1e9, 2)


def read_rate(path: Path, gib: float) -> float:
    """GB/s of reading gib GiB back from path's file system cold (the page cache dropped)."""
    block = os.urandom(BLOCK)
    total = int(gib * 2**30)
    with open(path, "wb") as f:
        done = 0
        while done < total:
            done += f.write(block[:min(BLOCK, total - done)])
        os.fsync(f.fileno())
    drop_page_cache()
    t0 = time.monotonic()
    with open(path, "rb", buffering=0) as f:
        while f.read(BLOCK):
            pass
    took = time.monotonic() - t0
    path.unlink()
    return round(total / took / 1e9, 2)


ARENA_PROBE = """
import json, sys
from pathlib import Path
from gpucr_hpc.process.in_place import status_all
from gpucr_hpc.slurm.site import load_site
jobid, node, seen_outside = sys.argv[1:4]
run_dir = Path(seen_outside) if Path(seen_outside).is_dir() else load_site().job_run_dir(jobid, node)
print(json.dumps([r.status.raw for r in status_all(run_dir) if r.status.ok]))
"""


def shim_states(cluster: Cluster, jobid: str, node: str) -> list[dict]:
    """The shim's status of every process of the job on node. The test cluster keeps
    each node's run dir under STATE/run/NODE (its jobs see it at the site's path)."""
    outside = cluster.state / "run" / node / jobid
    p = subprocess.run([sys.executable, "-c", ARENA_PROBE, jobid, node, str(outside)], env=cluster.env,
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise BenchError(f"the shim status of job {jobid} on {node}: {p.stderr.strip()[-1000:]}")
    return json.loads(p.stdout)


def arena_holds_gpu_memory(cluster: Cluster, jobid: str, node: str) -> bool:
    """Every GPU process of the job has its arena made and as large as its GPU memory."""
    procs = [st for st in shim_states(cluster, jobid, node) if st.get("gpu_bytes")]
    return bool(procs) and all(st.get("arena_ready") and st.get("arena_bytes", 0) >= st["gpu_bytes"] for st in procs)


def in_place_cycle(cluster: Cluster, jobid: str) -> dict:
    """suspend, then resume: the in-place checkpoint and restore of the job's units
    (the agents' seconds) and the commands' walls."""
    t_sus, sus = cluster.gpucr("suspend", jobid, timeout=600)
    t_res, res = cluster.gpucr("resume", jobid, timeout=600)
    return {"inplace_checkpoint_s": slowest_unit(sus), "inplace_restore_s": slowest_unit(res),
            "inplace_agents_checkpoint_s": round(sus["seconds"], 3),
            "inplace_agents_restore_s": round(res["seconds"], 3),
            "suspend_s": round(t_sus, 3), "resume_s": round(t_res, 3), "inplace_bytes": res.get("bytes")}


def slowest_unit(result: dict) -> float | None:
    """The longest in-place checkpoint or restore of one unit (its process tree), as
    the node agents report it; None when no unit had GPU state."""
    took = [u["phases"]["total_s"] for r in result.get("node_reports") or [] for u in r.get("units") or []
            if "total_s" in (u.get("phases") or {})]
    return round(max(took), 3) if took else None


def drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def restore_record(cluster: Cluster, jobid: str, gen: str) -> dict:
    """The script's tree's restore as restore.log tells it: where it was read, and how long."""
    log = cluster.state / "images" / jobid / "restore.log"

    def said() -> re.Match | None:
        text = log.read_text() if log.exists() else ""
        return re.search(rf"batch of {gen} read from (.+?) on (\S+), restored in ([\d.]+) s", text)

    try:  # a large image's restore may still be loading the GPU data
        m = wait_until(said, timeout=600, what=f"restore.log of job {jobid} to say how {gen} was restored")
    except TimeoutError as e:
        tail = " | ".join(log.read_text().strip().splitlines()[-6:]) if log.exists() else "no restore.log"
        raise BenchError(f"{e}: {tail}") from e
    return {"restore_from": m.group(1), "restore_node": m.group(2), "restore_s": float(m.group(3))}


def last_step_time(log: Path) -> float:
    try:
        lines = log.read_text().split("\n")
    except OSError:
        return 0.0
    for ln in reversed(lines):
        parts = ln.split()
        if len(parts) == 2:
            return float(parts[1])
    return 0.0


def generation(cluster: Cluster, jobid: str, gen: str) -> tuple[int, dict]:
    """The generation's bytes, and the slowest unit's phases (its image manifest's
    timings: dump_s, CRIU's dump to node memory; persist_s, the write to the image)."""
    gen_dir = cluster.state / "images" / jobid / gen
    manifest = json.loads((gen_dir / "manifest.json").read_text())
    phases: dict = {}
    for name in manifest["units"]:
        timings = json.loads((gen_dir / name / "manifest.json").read_text()).get("timings") or {}
        for k in ("gpu_released_s", "dump_s", "persist_s"):
            if k in timings:
                phases[k] = round(max(phases.get(k, 0.0), timings[k]), 3)
    return sum(int(u.get("bytes") or 0) for u in manifest["units"].values()), phases


def one_size(cluster: Cluster, gib: float, on_gpu: bool, work: Path, tier: str = "direct",
             place: str = "", drain_delay_s: float = 0.0, raw_gib: float | None = None,
             in_place: bool = False) -> dict:
    """in_place: the job is also suspended and resumed first, for the in-place figures
    of its size; place: "" (anywhere), "same" (pinned to its node), "moved" (held until durable,
    the page cache dropped, restored on another node); drain_delay_s: staging_tier's;
    raw_gib: the most bytes the raw rates are measured with."""
    d = work / f"gib-{gib:g}-{tier}{'-' + place if place else ''}"
    d.mkdir(parents=True)
    d.chmod(0o755)
    (d / "ballast.py").write_text(WORKLOAD)
    script = d / "job.sh"
    script.write_text(f"#!/bin/bash\nexec {sys.executable} {d}/ballast.py {d} {gib} {'gpu' if on_gpu else 'host'}\n")
    script.chmod(0o755)
    extra = ["--gres=gpu:1"] if on_gpu else []
    first = cluster.run("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").stdout.split()[:1]
    if place == "same" and first:
        extra += ["-w", first[0]]
    jobid = cluster.run("sbatch", "--parsable", "--gpucr=on", "-N1", "-n1", "-o", str(d / "job.out"), *extra,
                        str(script)).stdout.strip().split(";")[0]
    log = d / "steps.txt"
    try:
        wait_until(lambda: cluster.job(jobid).get("JobState") == "RUNNING" and last_step_time(log) > 0,
                   timeout=300, what=f"job {jobid} to step")
        rec: dict = {"gib": gib, "tier": tier, "where": "gpu" if on_gpu else "host", "jobid": jobid,
                     **({"place": place} if place else {}),
                     **({"drain_delay_s": drain_delay_s} if drain_delay_s else {})}
        ran_on = cluster.nodes(jobid)
        if on_gpu:
            t = time.monotonic()
            wait_until(lambda: arena_holds_gpu_memory(cluster, jobid, ran_on[0]), timeout=300,
                       what=f"the arena of job {jobid} to hold its GPU memory")
            rec["arena_ready_s"] = round(time.monotonic() - t, 3)
        if in_place:
            rec.update(in_place_cycle(cluster, jobid))
        if place == "moved":  # held at its requeue until the bench lets it go, cold, elsewhere
            cluster.run("scontrol", "update", f"NodeName={ran_on[0]}", "State=DRAIN", "Reason=gpucr-bench")
        returned: list = []  # the preempt command's CliRun, once it returned

        t0, wall0 = time.monotonic(), time.time()
        th = threading.Thread(target=lambda: returned.append(
            run_gpucr("preempt", jobid, "--json", env=cluster.env, timeout=600)))
        th.start()
        while job_pids(jobid):
            if returned and returned[0].rc:
                break  # refused or failed: the job runs on, reported below
            if time.monotonic() - t0 > 600:
                raise BenchError(f"job {jobid} still has processes 600 s after the preempt began")
            time.sleep(0.02)
        rec["node_free_s"] = round(time.monotonic() - t0, 3)
        th.join()
        if not returned or returned[0].rc != 0 or returned[0].doc is None:
            why = (returned[0].stderr or returned[0].stdout).strip()[-2000:] if returned else "no answer in 600 s"
            raise BenchError(f"preempt of job {jobid} failed: {why}")
        rec["preempt_s"] = round(returned[0].wall_s, 3)
        result = returned[0].doc
        if place == "moved":
            cluster.run("scontrol", "hold", jobid)
        committed = cluster.state / "images" / jobid / str(result["generation"]) / "COMMITTED"
        if tier == "staged":
            wait_until(committed.exists, timeout=900, what=f"the drain of job {jobid}")
            rec["drained_s"] = round(time.monotonic() - t0, 3)
        if place == "moved":
            drop_page_cache()
            cluster.run("scontrol", "release", jobid)
        wait_until(lambda: last_step_time(log) > wall0 + rec["preempt_s"], timeout=600, what=f"job {jobid} back")
        rec["back_s"] = round(time.monotonic() - t0, 3)
        rec["restored"] = True
        rec["generation"] = result.get("generation")
        nbytes, phases = generation(cluster, jobid, str(result["generation"]))
        rec.update({f"unit_{k}": v for k, v in phases.items()})
        rec["image_gib"] = round(nbytes / 2**30, 3)
        rec["image_write_GBps"] = round(nbytes / rec["preempt_s"] / 1e9, 2)
        for k in ("total_s", "requeue_s"):
            if isinstance(result.get(k), (int, float)):
                rec[f"preempt_{k}"] = round(result[k], 3)
        images = cluster.state / "images"
        raw = min(gib, raw_gib or gib)
        rec["raw_gib"] = raw
        rec["raw_write_GBps"] = rate(images / f".bench-{jobid}", raw, sync=True)
        rec["raw_shm_GBps"] = rate(Path("/dev/shm") / f".gpucr-bench-{jobid}", raw, sync=False)
        if place:
            rec.update(restore_record(cluster, jobid, str(result["generation"])))
            rec["restore_GBps"] = round(nbytes / rec["restore_s"] / 1e9, 2)
            rec["raw_read_GBps"] = read_rate(images / f".bench-read-{jobid}", raw)
        return rec
    finally:
        cluster.run("scancel", jobid, check=False)
        if place == "moved":
            cluster.run("scontrol", "update", f"NodeName={ran_on[0]}", "State=RESUME", check=False)
        try:  # its files gone before the next size's job needs the disk
            wait_until(lambda: not job_pids(jobid), timeout=120, what=f"job {jobid} to end")
        except TimeoutError:
            pass
        images = cluster.state / "images" / jobid
        if (images / "restore.log").exists():  # what the restore said, kept beside the job's files
            shutil.copy(images / "restore.log", d / "restore.log")
        shutil.rmtree(images, ignore_errors=True)


@contextmanager
def huge_node_memory(cluster: Cluster, gib: float) -> Iterator[Path]:
    """A tmpfs of 2 MiB pages (huge=always), mounted here for the run, holding the
    arena (plugstack arena=) and the staging tier: a fresh 4 KiB page of /dev/shm
    costs its allocation at first touch (bench/bench_node_memory.py)."""
    # under the cluster's state folder: a mount there reaches the nodes' mount namespaces
    where = Path(tempfile.mkdtemp(prefix="gpucr-bench-huge-", dir=cluster.state))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"huge=always,size={int(gib)}G,mode=0755", "none", str(where)],
                   check=True, capture_output=True)
    try:
        (where / "arena").mkdir()
        (where / "arena").chmod(0o1777)
        with cluster.plugstack_args(f"arena={where / 'arena'}"):
            yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextmanager
def staging_tier(cluster: Cluster, drain_delay_s: float = 0.0, memory: Path = Path("/dev/shm")) -> Iterator[None]:
    """plugstack.conf stage= in node memory (memory: /dev/shm, or --huge's tmpfs), one
    folder per node as an admin makes them (root's, 0755). drain_delay_s: each drain starts that much
    later (an image root slower than the job's restart, as at 17 GiB and more), through
    a cli= that waits before it."""
    root = Path(tempfile.mkdtemp(prefix="gpucr-bench-stage-", dir=memory))
    root.chmod(0o755)
    for node in cluster.run("sinfo", "-h", "-N", "-o", "%N").stdout.split():
        (root / node).mkdir(exist_ok=True)
        (root / node).chmod(0o755)  # root's: the plugin makes each job's dir in it
    args = f"stage={root}/%n"
    if drain_delay_s:
        cli = next(w[4:] for w in (cluster.state / "etc" / "plugstack.conf").read_text().split()
                   if w.startswith("cli="))
        late = root / "late-drain"
        late.write_text(f'#!/bin/sh\n[ "$1" = drain ] && sleep {drain_delay_s:g}\nexec {cli} "$@"\n')
        late.chmod(0o755)
        args += f" cli={late}"
    try:
        with cluster.plugstack_args(args):
            yield
    finally:
        shutil.rmtree(root, ignore_errors=True)


def way_of(rec: dict) -> str:
    return rec.get("tier", "direct") + (f", {rec['place']} node" if rec.get("place") else "")


def plot(records: list[dict], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    if len({r["gib"] for r in records}) == 1 and "restore_s" in records[0]:
        return bars(records, path, fig, ax)
    for way in dict.fromkeys(way_of(r) for r in records):
        mine = [r for r in records if way_of(r) == way]
        sizes = [r["gib"] for r in mine]
        keys = (("restore_s", "restore"),) if "restore_s" in mine[0] else (
            ("node_free_s", "node free"), ("back_s", "stepping again"), ("drained_s", "drained"))
        for key, label in keys:
            if all(key in r for r in mine):
                ax.plot(sizes, [r[key] for r in mine], marker="o",
                        linestyle="-" if mine[0].get("tier", "direct") == "direct" else "--", label=f"{way}: {label}")
    base = [r for r in records if r.get("tier", "direct") == "direct"]
    sizes = [r["gib"] for r in base]
    rate_key = "raw_read_GBps" if "raw_read_GBps" in base[0] else "raw_write_GBps"
    ax.plot(sizes, [r["gib"] * 2**30 / 1e9 / r[rate_key] for r in base], linestyle=":", color="gray",
            label=f"the bytes at the image root's raw {rate_key.split('_')[1]} rate")
    ax.set_xlabel("GiB held by the job")
    ax.set_ylabel("seconds of the script's tree's restore" if "restore_s" in records[0]
                  else "seconds from `gpucr-hpc preempt`")
    ax.set_title(f"Preempt and restore of a job ({records[0]['where']} memory)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def bars(records: list[dict], path: Path, fig, ax) -> bool:
    """One size restored three ways: the node's time held and the restore of each, beside
    the in-place restore and the bytes at the raw cold read rate."""
    ways = [way_of(r) for r in records]
    xs = range(len(records))
    ax.bar([x - 0.2 for x in xs], [r["node_free_s"] for r in records], 0.4, label="preempt until the node is free")
    ax.bar([x + 0.2 for x in xs], [r["restore_s"] for r in records], 0.4, label="restore (restore.log)")
    inplace = next((r["inplace_restore_s"] for r in records if r.get("inplace_restore_s")), None)
    if inplace:
        ax.axhline(inplace, color="gray", linestyle="--", label=f"in-place restore, {inplace:.2f} s")
    raw = records[0]["image_gib"] * 2**30 / 1e9 / records[0]["raw_read_GBps"]
    ax.axhline(raw, color="gray", linestyle=":", label=f"the image at the raw cold read rate, {raw:.1f} s")
    ax.set_xticks(list(xs), ways)
    ax.set_ylabel("seconds")
    ax.set_title(f"A {records[0]['gib']:g} GiB job ({records[0]['where']} memory): preempt and restore")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def runs(args) -> list[tuple[str, str]]:
    """(tier, place) of each run per size."""
    if args.restore:
        every = [("direct", "same"), ("staged", "same"), ("staged", "moved")]
        return [r for r in every if not args.only or "-".join(r) in args.only]
    return [("direct", ""), ("staged", "")] if args.tiers else [("direct", "")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, nargs="+", default=[1.0, 4.0], help="sizes the job holds, GiB")
    ap.add_argument("--gpu", action="store_true", help="hold GPU memory (PyTorch) instead of host memory")
    ap.add_argument("--tiers", action="store_true", help="each size also with a staging tier in /dev/shm")
    ap.add_argument("--restore", action="store_true",
                    help="each size restored on its node from the image root and from node memory, and moved")
    ap.add_argument("--only", nargs="+", choices=["direct-same", "staged-same", "staged-moved"],
                    help="with --restore: only these of the runs of each size")
    ap.add_argument("--drain-delay", type=float, default=0.0,
                    help="with --restore: the staged same-node run's drain starts this many seconds late, so "
                         "that the job is back before it is done (a slower image root)")
    ap.add_argument("--huge", type=float, default=0.0, metavar="GIB",
                    help="the arena and the staging tier on a tmpfs of 2 MiB pages of this size, mounted for the run")
    ap.add_argument("--raw-gib", type=float, default=None,
                    help="the raw rates measured with at most this many GiB (default: the job's size)")
    ap.add_argument("--out", type=Path, help="the JSON (default: bench/results/preempt-node-free-DATE.json)")
    ap.add_argument("--replot", type=Path, help="only draw the plot of a saved JSON, beside it")
    args = ap.parse_args(argv)
    if args.replot:
        return 0 if plot(json.loads(args.replot.read_text())["records"], args.replot.with_suffix(".png")) else 1
    if os.geteuid() != 0:
        print("bench_preempt: the test cluster needs root; run it as root", file=sys.stderr)
        return 2
    started = datetime.datetime.now(datetime.timezone.utc)
    tmp = Path(tempfile.mkdtemp(prefix="gpucr-bench-preempt-"))
    tmp.chmod(0o755)
    env = cluster_env(tmp)
    started_it = not cluster_is_up(env)
    records = []
    stack = ExitStack()
    try:
        cluster = cluster_up(env)
        memory = stack.enter_context(huge_node_memory(cluster, args.huge)) if args.huge else Path("/dev/shm")
        for gib in args.gib:
            for k, (tier, place) in enumerate(runs(args)):
                first_same = place == "same" and all(p != "same" for _, p in runs(args)[:k])
                if tier == "staged":
                    delay = args.drain_delay if place == "same" else 0.0
                    with staging_tier(cluster, delay, memory):
                        rec = one_size(cluster, gib, args.gpu, tmp, tier, place, delay, args.raw_gib,
                                       in_place=first_same)
                else:
                    rec = one_size(cluster, gib, args.gpu, tmp, tier, place, raw_gib=args.raw_gib,
                                   in_place=first_same)
                records.append(rec)
                print(json.dumps(rec), flush=True)
    except (BenchError, TimeoutError) as e:
        print(f"bench_preempt: {e}", file=sys.stderr)
        failed = str(e)
    else:
        failed = ""
    finally:
        stack.close()
        if started_it:
            subprocess.run([str(TESTCLUSTER), "down"], capture_output=True, timeout=180, env=env)
    if failed and not records:
        return 1
    out_path = args.out or REPO / "bench" / "results" / f"preempt-node-free-{started:%Y-%m-%d}.json"
    doc = {"date": started.isoformat(timespec="seconds"), "machine": platform.node(), "cpus": os.cpu_count(),
           **({"gpu": gpu_line()} if args.gpu else {}),
           "cluster_mode": cluster.mode(), **({"huge_tmpfs_gib": args.huge} if args.huge else {}),
           "records": records, **({"failed": failed} if failed else {})}
    write_record(out_path, doc)
    print(f"{'GiB':>5} {'tier':>7} {'preempt':>8} {'node free':>10} {'drained':>8} {'back':>7} {'raw disk':>9} "
          f"{'raw shm':>8}")
    for r in records:
        drained = f"{r['drained_s']:>7.2f}s" if "drained_s" in r else f"{'-':>8}"
        inplace = f"  in place {r['inplace_restore_s']}s" if "inplace_restore_s" in r else ""
        restored = inplace + (f"  restore {r['restore_s']:.2f}s from {r['restore_from']} on {r['restore_node']} "
                    f"({r['restore_GBps']} GB/s; raw cold read {r['raw_read_GBps']} GB/s)") if "restore_s" in r else ""
        print(f"{r['gib']:>5g} {r['tier']:>7} {r['preempt_s']:>7.2f}s {r['node_free_s']:>9.2f}s {drained} "
              f"{r['back_s']:>6.2f}s {r['raw_write_GBps']:>9.2f} {r['raw_shm_GBps']:>8.2f}{restored}")
    if records and plot(records, out_path.with_suffix(".png")):
        print(f"plot: {out_path.with_suffix('.png')}")
    print(f"saved: {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
