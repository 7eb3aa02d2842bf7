#!/usr/bin/env python3
"""Issue 22 benchmark: a whole node's GPUs checkpointed in place together against
one GPU alone, same footprint per GPU, same run.

One `gpucr-hpc run` of a launcher that starts one CUDA program per GPU
(tests/shim_workloads/cuda_malloc.cu, CUDA_VISIBLE_DEVICES=i, each holding --gib
GiB), its arenas made ahead (--arena-size auto), checkpointed and restored in
place as one tree (in_place.checkpoint_tree: every process at once), CYCLES
times. First with one GPU, while an uninterrupted run of the same program on a
second GPU writes the reference output; then with N GPUs. Every program's
output must equal the reference (`identical`). Raw pinned bandwidth is measured
for one GPU alone and for all N at once (the node's host-memory limit), with
each GPU's NUMA node and the shims' own placement (`numa_node`).

    python3 bench/bench_node_gpus.py --gib 40 --out bench/results/node-gpus.json
Writes JSON (+ PNG when matplotlib is there): `n_gpus`, `node_vs_one_gpu` (the
node's median checkpoint time over one GPU's) and its restore twin.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.machine import numa_of, settings, smi_rows  # noqa: E402
from common.pinned import copy_rates, start_copies  # noqa: E402
from common.plots import pyplot  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402
from common.stats import median  # noqa: E402

from gpucr_hpc.criu.run import process_tree  # noqa: E402
from gpucr_hpc.process import in_place  # noqa: E402
from gpucr_hpc.shim.client import ShimClient  # noqa: E402

STEPS, PACE_MS = 20000, 50  # paced while measured; SIGUSR1 lifts the pacing (see Node.finish)


def topology() -> dict:
    gpus = [{"index": int(i), "name": n, "bus_id": b, "numa_node": numa_of(b)}
            for i, n, b in smi_rows("index,name,pci.bus_id")]
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60).stdout
    shm = os.statvfs("/dev/shm")
    return {"gpus": gpus, "numa_nodes": {n.name: (n / "cpulist").read_text().strip() for n in nodes},
            "cpus": os.cpu_count(), "dev_shm_gib": round(shm.f_blocks * shm.f_frsize / 2**30, 1),
            "mem_total_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1),
            "nvidia_smi_topo": topo.splitlines()}


def raw_bandwidth(gpus: list[int], gib: float) -> dict:
    """Pinned copies on every GPU of `gpus` at once (they start together): each
    GPU's rates and their sum, the node's ceiling for a checkpoint of all of them."""
    start = time.time() + 15  # every process has its buffers by then
    procs = [start_copies(gib, gpu=g, start=start) for g in gpus]
    rates = [copy_rates(p, timeout=300) for p in procs]
    failed = next((f"GPU {g}: {r['error']}" for g, r in zip(gpus, rates) if "error" in r), None)
    if failed:
        return {"error": failed}
    per = [{"gpu": g, **r} for g, r in zip(gpus, rates)]
    return {"gpus": gpus, "gib_per_gpu": gib, "per_gpu": per,
            "sum_d2h_GBps": round(sum(p["d2h_GBps"] for p in per), 2),
            "sum_h2d_GBps": round(sum(p["h2d_GBps"] for p in per), 2)}


def exe_name(pid: int) -> str:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return ""


class Node:
    """`gpucr-hpc run` of a launcher with one program per GPU of `gpus`."""

    def __init__(self, args, gpus: list[int], run_dir: Path, work: Path):
        self.gpus, self.run_dir, self.work = gpus, run_dir, work
        self.program = Path(args.cuda_bin).name
        self.helper = bool(args.copy_helper)  # then every segment pinned by it first
        prog = " ".join(shlex.quote(x) for x in (args.cuda_bin, str(STEPS), str(args.gib), str(PACE_MS)))
        body = " ".join(f"CUDA_VISIBLE_DEVICES={g} {prog} >{work}/out.{g} 2>{work}/err.{g} &" for g in gpus)
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env.update(GPUCR_RUN_DIR=str(run_dir), GPUCR_SHIM=str(REPO / "shim" / "libgpucr-cuda.so"), PYTHONPATH=str(REPO))
        self.p = subprocess.Popen([sys.executable, "-m", "gpucr_hpc", "run", "--arena-size", "auto", "--",
                                   "bash", "-c", f"{body} wait"], env=env, stderr=subprocess.PIPE, text=True)

    def programs(self) -> list[int]:
        """The launcher's children (the CUDA programs)."""
        kids = process_tree(self.p.pid)[1:]
        return [k for k in kids if exe_name(k) == self.program]

    def steps(self, g: int) -> int:
        return sum(1 for ln in self.output(g) if ln.startswith("step "))

    def ready(self, timeout: float) -> list[dict]:
        """Each program's shim status once its arena is grown to its data."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.p.poll() is not None:
                raise RuntimeError(f"the node run ended early: {self.p.stderr.read()[-800:] if self.p.stderr else ''}")
            pids = self.programs()
            if len(pids) == len(self.gpus):
                try:
                    st = [dict(ShimClient(pid, self.run_dir).status().raw) for pid in pids]
                except Exception:  # noqa: BLE001 - not listening yet
                    st = []
                if st and all(s.get("arena_ready") and s.get("gpu_bytes", 0) > 0
                              and s.get("arena_bytes", 0) >= s["gpu_bytes"] for s in st) and all(
                        s.get("helper_segments") == s.get("arena_segments") for s in st if self.helper):
                    return st
            time.sleep(0.2)
        raise RuntimeError("the programs' arenas were not ready in time")

    def finish(self) -> dict[int, list[str]]:
        for pid in self.programs():
            os.kill(pid, signal.SIGUSR1)
        try:
            self.p.wait(600)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        return {g: self.output(g) for g in self.gpus}

    def output(self, g: int) -> list[str]:
        p = self.work / f"out.{g}"
        return p.read_text().splitlines() if p.exists() else []


PROCESS_KEYS = ("pid", "bytes", "prepare_s", "copy_s", "release_s", "copy_threads", "data_path")


def cycles(node: Node, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        at = [node.steps(g) for g in node.gpus]
        while any(node.steps(g) < a + 3 for g, a in zip(node.gpus, at)):  # every program steps between cycles
            time.sleep(0.05)
        t = time.monotonic()
        cp = in_place.checkpoint_tree(node.p.pid, timeout_ms=120000, run_dir=node.run_dir)
        cp_s = time.monotonic() - t
        t = time.monotonic()
        rs = in_place.restore_tree(node.p.pid, run_dir=node.run_dir)
        rs_s = time.monotonic() - t
        out.append({"checkpoint_s": round(cp_s, 3), "restore_s": round(rs_s, 3), "bytes": cp["bytes"],
                    "checkpoint": cp["phases"], "restore": rs["phases"],
                    "per_process": [{k: c.get(k) for k in PROCESS_KEYS} for c in cp["processes"] if c.get("cuda")]})
        print(f"  {len(node.gpus)} GPU(s): checkpoint {cp_s:.2f} s {cp['phases']}, restore {rs_s:.2f} s", flush=True)
    return out


def measure(args, gpus: list[int], reference_gpu: int | None) -> dict:
    """The node of `gpus` measured; with reference_gpu, an uninterrupted run of the
    same program there meanwhile writes the reference output. `_lines`: each
    program's output by GPU."""
    work = Path(tempfile.mkdtemp(prefix=f"gpucr-node-{len(gpus)}-"))
    node = Node(args, gpus, Path(f"/tmp/gpucr-node-run-{len(gpus)}"), work)
    rec: dict = {"gpus": gpus}
    ref = None
    try:
        if reference_gpu is not None:
            ref = subprocess.Popen([args.cuda_bin, str(STEPS), str(args.gib), "0"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True,
                                   env=dict(os.environ, CUDA_VISIBLE_DEVICES=str(reference_gpu)))
        t = time.monotonic()
        status = node.ready(args.ready_timeout)
        rec.update(ready_after_s=round(time.monotonic() - t, 2), numa_node=[s.get("numa_node") for s in status],
                   arena_setup_s=[s.get("arena_setup_s") for s in status])
        rec["cycles"] = cycles(node, args.cycles)
        if ref is not None:
            out, err = ref.communicate(timeout=600)
            rec["reference"] = out.splitlines() if ref.returncode == 0 else None
            rec["reference_error"] = err[-500:] if ref.returncode else None
    except Exception as e:  # noqa: BLE001 - recorded; the programs are still finished below
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        rec["_lines"] = node.finish()
        if ref is not None and ref.poll() is None:
            ref.kill()
    return rec


def same_as(reference: list[str] | None, lines: list[str]) -> bool:
    """Every step and the final checksum as in the uninterrupted run."""
    return bool(reference) and lines == reference and lines[-1].startswith("checksum")


def steady(cycles: list[dict], key: str) -> float:
    """The median of a part's cycles after its first: the first pays one-time
    costs (the driver's first checkpoint, a pinned arena's first use)."""
    return median(c[key] for c in (cycles[1:] if len(cycles) > 1 else cycles))


def derive(res: dict) -> None:
    """The record's comparisons, from its cycles and raw bandwidth."""
    one, node = res["one_gpu"].get("cycles"), res["node"].get("cycles")
    if not (one and node):
        return
    for key, cs in (("one_gpu", one), ("node", node)):
        res[key].update(first_checkpoint_s=cs[0]["checkpoint_s"], steady_checkpoint_s=steady(cs, "checkpoint_s"),
                        steady_restore_s=steady(cs, "restore_s"))
    res["node_vs_one_gpu"] = round(steady(node, "checkpoint_s") / steady(one, "checkpoint_s"), 3)
    res["node_vs_one_gpu_restore"] = round(steady(node, "restore_s") / steady(one, "restore_s"), 3)
    raw = res["raw_pinned"]
    if "sum_d2h_GBps" in raw["node"] and "sum_d2h_GBps" in raw["one_gpu"]:
        gb_node, gb_one = node[-1]["bytes"] / 1e9, one[-1]["bytes"] / 1e9
        res["floor_s"] = {"node_out_s": round(gb_node / raw["node"]["sum_d2h_GBps"], 3),
                          "node_in_s": round(gb_node / raw["node"]["sum_h2d_GBps"], 3),
                          "one_out_s": round(gb_one / raw["one_gpu"]["sum_d2h_GBps"], 3),
                          "one_in_s": round(gb_one / raw["one_gpu"]["sum_h2d_GBps"], 3)}
        f = res["floor_s"]  # what the hardware allows the node against one GPU, data alone
        res["floor_node_vs_one_gpu"] = round(f["node_out_s"] / f["one_out_s"], 3)
        res["floor_node_vs_one_gpu_restore"] = round(f["node_in_s"] / f["one_in_s"], 3)


def plot(res: dict, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    one, node = res["one_gpu"], res["node"]
    if not one.get("cycles") or not node.get("cycles"):
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    labels = ["checkpoint", "restore"]
    x = range(len(labels))
    for off, (rec, name) in enumerate(((one, "1 GPU"), (node, f"{res['n_gpus']} GPUs together"))):
        vals = [steady(rec["cycles"], "checkpoint_s"), steady(rec["cycles"], "restore_s")]
        ax.bar([i + off * 0.38 for i in x], vals, 0.36, label=name)
    floor = res.get("floor_s") or {}
    if floor:
        ax.hlines([floor["node_out_s"], floor["node_in_s"]], [-0.2, 0.8], [0.6, 1.6], colors="k", linestyles=":",
                  label="node bytes / summed raw pinned bandwidth")
    ax.set_xticks([i + 0.19 for i in x], labels)
    ax.set_ylabel("seconds (median of the cycles after the first)")
    env = res.get("env", {})
    path_name = ("copy helper" if env.get("GPUCR_COPY_HELPER") else
                 "pinned arena, direct DMA" if env.get("GPUCR_ARENA_PIN") == "1" else "bounce path")
    ax.set_title(f"{res['n_gpus']} GPUs x {res['gib']:g} GiB, {path_name}: node / one GPU = "
                 f"{res.get('node_vs_one_gpu')} (raw floor {res.get('floor_node_vs_one_gpu')})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=40.0, help="GPU data per GPU")
    ap.add_argument("--gpus", type=int, default=0, help="how many GPUs make the node (default: all)")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--raw-gib", type=float, default=8.0)
    ap.add_argument("--ready-timeout", type=float, default=300)
    ap.add_argument("--cuda-bin", default="/tmp/gpucr_cuda_malloc")
    ap.add_argument("--out", required=True)
    ap.add_argument("--copy-helper", action="store_true",
                    help="one copy helper for the node moves every program's data (GPUCR_COPY_HELPER)")
    ap.add_argument("--replot", help="a record this wrote: derive its comparisons and plot it again, to --out")
    args = ap.parse_args()
    if args.replot:
        rec: dict = json.loads(Path(args.replot).read_text())
        derive(rec)
        rec["plot"] = plot(rec, Path(args.out).with_suffix(".png"))
        write_record(args.out, rec)
        return 0
    helper = None
    if args.copy_helper:
        from gpucr_hpc.shim import copy_helper
        helper = copy_helper.spawn(HELPER_SOCKET)
        os.environ["GPUCR_COPY_HELPER"] = str(HELPER_SOCKET)
    try:
        return run(args)
    finally:
        if helper:
            helper.kill()
            helper.wait()


HELPER_SOCKET = Path("/tmp/gpucr-node-copy-helper.sock")


def run(args) -> int:
    topo = topology()
    n = args.gpus or len(topo["gpus"])
    gpus = list(range(n))
    res: dict = {"device": topo["gpus"][0]["name"], "driver": smi_rows("driver_version")[0][0], "n_gpus": n,
                 "gib": args.gib, "cycles_planned": args.cycles, "topology": topo,
                 "date": utc_now(), "env": settings("GPUCR_", "NCCL_")}
    out = Path(args.out)
    res["raw_pinned"] = {"one_gpu": raw_bandwidth([0], args.raw_gib), "node": raw_bandwidth(gpus, args.raw_gib)}
    write_record(out, res)
    print("raw pinned:", json.dumps(res["raw_pinned"])[:600], flush=True)
    lines = {}
    for key, use, ref_gpu in (("one_gpu", [0], 1 if n > 1 else None), ("node", gpus, None)):
        res[key] = measure(args, use, ref_gpu)
        lines[key] = res[key].pop("_lines")
        res[key]["outputs_tail"] = {g: ln[-2:] for g, ln in lines[key].items()}
        brief = {k: v for k, v in res[key].items() if k not in ("reference", "cycles")}
        print(key, json.dumps(brief)[:800], flush=True)
        write_record(out, res)
    reference = res["one_gpu"].pop("reference", None)
    res["reference_steps"] = len(reference or [])
    res["identical"] = {f"{key}/gpu{g}": same_as(reference, ln) for key in lines for g, ln in lines[key].items()}
    derive(res)
    res["plot"] = plot(res, out.with_suffix(".png"))
    write_record(out, res)
    print(json.dumps({k: res.get(k) for k in ("n_gpus", "gib", "node_vs_one_gpu", "node_vs_one_gpu_restore",
                                               "identical", "floor_s")}), flush=True)
    ok = res.get("node_vs_one_gpu") is not None and all(res["identical"].values()) and res["identical"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
