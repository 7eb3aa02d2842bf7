#!/usr/bin/env python3
"""Steady-state cost of the shim: step time with and without it.

In one run, for each workload, fresh processes alternate between the two
variants, round after round (A B, B A, A B, ...: each variant goes first
equally often, so drift of clocks or temperature hits both):
  torch  a PyTorch training step (MLP 1024-4096-4096-1024, batch 512, AdamW),
         synchronized at the end of each step;
  cupy   a CuPy kernel loop (100 small elementwise kernels + one reduction per
         step, synchronized);
  cuda_c tests/shim_workloads/launch_loop.cu: 100 tiny kernel launches per
         step from C, synchronized - launch-bound, the worst case for the API
         gate, which every launch passes.
Each process runs WARMUP steps, then times STEPS steps, pinned to the same
CPUs (--cpus) in both variants. Reported: the median step time per variant
(all rounds pooled), the per-round medians, and the overhead in % (pooled, the
median of the per-round ratios, and their spread). A shimmed worker checks that
the shim is really in it (Python: its own control socket answers with hooked
driver entry points; C: the runtime's cuLaunchKernel is the shim's).
Writes JSON (device, driver, date) and a PNG.

    python3 bench/bench_steady_state.py --out-dir "$OUT" --name steady-state-h100
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.machine import settings, smi  # noqa: E402
from common.plots import pyplot  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402

# ---- worker: one process, one variant ----------------------------------------

def torch_loop(steps: int, warmup: int) -> list[float]:
    import torch

    torch.manual_seed(0)
    dev = "cuda"
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                                torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device=dev)
    y = torch.randn(512, 1024, device=dev)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def cupy_loop(steps: int, warmup: int) -> list[float]:
    import cupy as cp

    x = cp.arange(1 << 20, dtype=cp.float32) / (1 << 20)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        for _ in range(100):
            x = x * 0.999 + 0.001
        s = x.sum()
        cp.cuda.Device().synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    float(s)
    return times


def shim_self_check() -> dict:
    """In a shimmed worker: the shim's own status (its control thread answers)."""
    from gpucr_hpc.shim.client import ShimClient

    st = ShimClient(os.getpid()).status().raw
    return {k: st.get(k) for k in ("getproc_hooked", "dlsym_hooked", "gpu_bytes", "async_bytes", "allocations",
                                   "vmm_backing", "gate_waits")}


def parse_cpus(text: str) -> set[int]:
    cpus = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus & os.sched_getaffinity(0) or os.sched_getaffinity(0)


def build_cuda_c(tmp: str) -> str:
    out = os.path.join(tmp, "launch_loop")
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    subprocess.run([nvcc, "-O2", "-o", out, str(REPO / "tests/shim_workloads/launch_loop.cu")], check=True)
    return out


def worker(args) -> int:
    loop = {"torch": torch_loop, "cupy": cupy_loop}[args.worker]
    times = loop(args.steps, args.warmup)
    with open("/proc/self/maps") as f:
        shimmed = "libgpucr-cuda.so" in f.read()
    out = {"times": times, "shim_loaded": shimmed}
    if shimmed:
        out["shim"] = shim_self_check()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


# ---- driver: alternate the variants, summarise, plot -------------------------

def run_one(workload: str, variant: str, args, run_dir: str) -> dict:
    from gpucr_hpc.cli.process import shim_environment

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if variant == "shim":
        env = shim_environment(env, run_dir=run_dir)
    steps = args.steps * args.c_steps_factor if workload == "cuda_c" else args.steps
    if workload == "cuda_c":
        cmd = [args.cuda_c_bin, str(steps), str(args.warmup), "100"]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", workload,
               "--steps", str(steps), "--warmup", str(args.warmup)]
    cpus = args.cpu_set
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                       preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if r.returncode != 0 or not line:
        raise RuntimeError(f"{workload}/{variant} failed rc={r.returncode}: {r.stderr[-1500:]}")
    res = json.loads(line[len("RESULT "):])
    if res["shim_loaded"] != (variant == "shim"):
        raise RuntimeError(f"{workload}/{variant}: shim loaded = {res['shim_loaded']}")
    if workload == "cuda_c":
        if res["launch_hooked"] != (variant == "shim"):
            raise RuntimeError(f"cuda_c/{variant}: cuLaunchKernel hooked = {res['launch_hooked']}")
        res["shim"] = {"launch_hooked": res["launch_hooked"]}
    elif variant == "shim" and not (res["shim"]["getproc_hooked"] or res["shim"]["dlsym_hooked"]):
        raise RuntimeError(f"{workload}/shim: the shim hooked no driver entry point: {res['shim']}")
    return res


def pct(a: float, b: float) -> float:
    return (a / b - 1.0) * 100.0


# two-sided 95 % quantiles of Student's t, by degrees of freedom
_T95 = [12.71, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def round_stats(rounds: list[dict]) -> dict:
    """The per-round overheads (each round: fresh processes of both variants):
    median, range, mean and its 95 % confidence interval."""
    o = [e["overhead_pct"] for e in rounds]
    mean = statistics.fmean(o)
    half = (_T95[min(len(o) - 2, 29)] if len(o) <= 31 else 1.96) * statistics.stdev(o) / len(o) ** 0.5 \
        if len(o) > 1 else float("nan")
    return {k: round(v, 5) for k, v in {
        "overhead_pct_median_of_rounds": statistics.median(o), "overhead_pct_rounds_min": min(o),
        "overhead_pct_rounds_max": max(o), "overhead_pct_mean_of_rounds": mean,
        "overhead_pct_mean_ci95_low": mean - half, "overhead_pct_mean_ci95_high": mean + half}.items()}


def bench(workload: str, args, run_dir: str) -> dict:
    rounds = []
    for r in range(args.rounds * (args.c_rounds_factor if workload == "cuda_c" else 1)):
        order = ["base", "shim"] if r % 2 == 0 else ["shim", "base"]
        entry = {"round": r, "order": order}
        for v in order:
            res = run_one(workload, v, args, run_dir)
            entry[v] = res["times"]
            if v == "shim":
                entry["shim_status"] = res["shim"]
        entry["base_median_ms"] = statistics.median(entry["base"]) * 1e3
        entry["shim_median_ms"] = statistics.median(entry["shim"]) * 1e3
        entry["overhead_pct"] = pct(entry["shim_median_ms"], entry["base_median_ms"])
        print(f"  {workload} round {r} ({'/'.join(order)}): base {entry['base_median_ms']:.4f} ms, "
              f"shim {entry['shim_median_ms']:.4f} ms, {entry['overhead_pct']:+.2f} %", flush=True)
        rounds.append(entry)
    base = [t for e in rounds for t in e["base"]]
    shim = [t for e in rounds for t in e["shim"]]
    out = {
        "workload": workload,
        "base_median_ms": statistics.median(base) * 1e3,
        "shim_median_ms": statistics.median(shim) * 1e3,
        "overhead_pct": pct(statistics.median(shim), statistics.median(base)),
        **round_stats(rounds),
        "rounds": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in e.items()
                    if k not in ("base", "shim")} for e in rounds],
        "steps_per_process": args.steps * (args.c_steps_factor if workload == "cuda_c" else 1),
    }
    for k in ("base_median_ms", "shim_median_ms", "overhead_pct"):
        out[k] = round(out[k], 5)
    return out


def plot(results: dict, path: Path) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    wls = results["workloads"]
    fig, axes = plt.subplots(1, len(wls), figsize=(5.5 * len(wls), 4), squeeze=False)
    for ax, w in zip(axes[0], wls):
        r = [e["round"] for e in w["rounds"]]
        ax.plot(r, [e["base_median_ms"] for e in w["rounds"]], "o-", label="without shim")
        ax.plot(r, [e["shim_median_ms"] for e in w["rounds"]], "s-", label="with shim")
        ax.axhline(w["base_median_ms"], color="C0", ls=":", lw=1)
        ax.axhline(w["shim_median_ms"], color="C1", ls=":", lw=1)
        ax.set_xlabel("round (fresh processes, alternating order)")
        ax.set_ylabel("median step time (ms)")
        ax.set_title(f"{w['workload']}: overhead {w['overhead_pct']:+.2f} % (pooled median)\n"
                     f"per round: mean {w['overhead_pct_mean_of_rounds']:+.2f} %, 95 % CI "
                     f"[{w['overhead_pct_mean_ci95_low']:+.2f}, {w['overhead_pct_mean_ci95_high']:+.2f}] %", fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(f"gpucr shim steady-state cost - {results['device']}, driver {results['driver']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=["torch", "cupy"], help=argparse.SUPPRESS)
    ap.add_argument("--workloads", nargs="+", default=["torch", "cupy", "cuda_c"],
                    choices=["torch", "cupy", "cuda_c"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--c-rounds-factor", type=int, default=2, help="cuda_c processes start fast: more rounds")
    ap.add_argument("--c-steps-factor", type=int, default=4, help="and more (shorter) steps")
    ap.add_argument("--cpus", default="2-5", help="CPUs every worker is pinned to (both variants)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out-dir", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    ap.add_argument("--name", default="steady-state")
    ap.add_argument("--resummarize", metavar="JSON",
                    help="recompute the per-round statistics and the plot of an earlier result, then exit")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.resummarize:
        return resummarize(Path(args.resummarize))
    name, driver = smi("name,driver_version")
    results = {"device": name, "driver": driver,
               "date": utc_now(),
               "method": "fresh process per round and variant, order alternating (A B, B A, ...); "
                         "median of per-step wall times with a device sync per step",
               "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, "workloads": [],
               "env": settings("GPUCR_")}
    args.cpu_set = parse_cpus(args.cpus)
    results["cpus"] = sorted(args.cpu_set)
    for mod in ("torch", "cupy"):
        try:
            results[f"{mod}_version"] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - reported as absent
            results[f"{mod}_version"] = None
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpucr-bench-run-") as run_dir:
        if "cuda_c" in args.workloads:
            args.cuda_c_bin = build_cuda_c(run_dir)
        for w in args.workloads:
            print(f"== {w}", flush=True)
            results["workloads"].append(bench(w, args, run_dir))
            write_record(out_dir / f"{args.name}.json", results)
    results["plot"] = plot(results, out_dir / f"{args.name}.png")
    write_record(out_dir / f"{args.name}.json", results)
    report(results)
    return 0


def report(results: dict) -> None:
    for w in results["workloads"]:
        print(f"{w['workload']}: without {w['base_median_ms']:.4f} ms, with shim {w['shim_median_ms']:.4f} ms "
              f"-> {w['overhead_pct']:+.2f} %; per round ({len(w['rounds'])}): median "
              f"{w['overhead_pct_median_of_rounds']:+.2f} %, mean {w['overhead_pct_mean_of_rounds']:+.2f} % "
              f"[95 % CI {w['overhead_pct_mean_ci95_low']:+.2f}, {w['overhead_pct_mean_ci95_high']:+.2f}]")


def resummarize(path: Path) -> int:
    results = json.loads(path.read_text())
    for w in results["workloads"]:
        w.update(round_stats(w["rounds"]))
    results["plot"] = plot(results, path.with_suffix(".png")) or results.get("plot")
    write_record(path, results)
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
