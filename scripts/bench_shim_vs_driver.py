#!/usr/bin/env python3
"""Issue 4 benchmark: VRAM yield with gpucr (shim data path + driver control) vs
the driver checkpoint API alone, for several GPU footprints, in one run.

For each footprint (GiB) the same CUDA C program (cudaMalloc'ed buffers) is
  - checkpointed/restored in place with the driver API only (lock+checkpoint,
    restore+unlock), and
  - run under the shim with its arena preallocated at start-up (one-time cost,
    reported apart), then checkpointed/restored with gpucr (quiesce, data,
    control, total per direction; two cycles, the second is reported as steady).
Raw pinned D2H/H2D bandwidth is measured in the same run. Writes JSON (+ PNG
when matplotlib is there).

    python3 scripts/bench_shim_vs_driver.py --sizes 1 8 32 70 --out bench/results/x.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from gpucr_hpc import process_cr  # noqa: E402
from gpucr_hpc.driver_nvidia import NvidiaDriver  # noqa: E402
from gpucr_hpc.shim_client import ShimClient  # noqa: E402
from shim_gpu_verify import Proc, gpu_used_mib, smi  # noqa: E402


def raw_bandwidth(gib: float = 8.0) -> dict:
    code = f"""
import json, time, torch
n = int({gib} * 2**30)
h = torch.empty(n, dtype=torch.uint8, pin_memory=True); d = torch.empty(n, dtype=torch.uint8, device='cuda')
h.fill_(1); d.fill_(2); torch.cuda.synchronize()
def best(f):
    t = []
    for _ in range(3):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(); torch.cuda.synchronize(); t.append(time.perf_counter() - t0)
    return n / min(t) / 1e9
print(json.dumps({{"d2h_GBps": best(lambda: h.copy_(d, non_blocking=True)), "h2d_GBps": best(lambda: d.copy_(h, non_blocking=True)), "gib": {gib}}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-500:]}


def start(args, gib, shim: bool, run_dir: Path):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    cmd = [args.cuda_bin, "100000", str(gib), "200"]
    if shim:
        env.update(GPUCR_RUN_DIR=str(run_dir), GPUCR_ARENA_PREALLOC=f"{gib + 0.25}G")
        if args.arena:
            env["GPUCR_ARENA_DIR"] = args.arena
        cmd = [sys.executable, "-m", "gpucr_hpc", "run", "--"] + cmd
    p = Proc(cmd, env)
    if not p.wait_steps(2, 300):
        p.p.kill()
        raise RuntimeError(f"workload did not start: {p.err[-500:]}")
    return p


def driver_only(args, gib) -> dict:
    p = start(args, gib, False, Path("/tmp"))
    try:
        drv = NvidiaDriver()
        used = gpu_used_mib()
        t0 = time.monotonic()
        drv.lock(p.p.pid, 60000)
        t1 = time.monotonic()
        drv.checkpoint(p.p.pid)
        t_cp = time.monotonic()
        after = gpu_used_mib()
        t2 = time.monotonic()
        drv.restore(p.p.pid)
        t3 = time.monotonic()
        drv.unlock(p.p.pid)
        t4 = time.monotonic()
        ok = p.wait_steps(p.steps() + 2, 60)
        return {"used_mib_before": used, "used_mib_after_checkpoint": after, "lock_s": t1 - t0,
                "checkpoint_s": t1 - t0 + (t_cp - t1), "restore_s": t4 - t2, "unlock_s": t4 - t3, "continued": ok}
    finally:
        p.p.kill()
        p.finish(30)


def gpucr(args, gib) -> dict:
    run_dir = Path("/tmp/gpucr-bench-run")
    p = start(args, gib, True, run_dir)
    pid = p.p.pid
    try:
        c = ShimClient(pid, run_dir)
        deadline = time.monotonic() + 600
        while c.status()["arena_bytes"] < gib * 2**30 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2 + gib / 16)  # pinning follows the first CUDA context
        setup = c.status()["arena_setup_s"]
        cycles = []
        for _ in range(args.cycles):
            used = gpu_used_mib()
            cp = process_cr.checkpoint_tree(pid, timeout_ms=60000, run_dir=run_dir)
            after = gpu_used_mib()
            rs = process_cr.restore_tree(pid, run_dir=run_dir)
            cycles.append({"used_mib_before": used, "used_mib_after_checkpoint": after, "bytes": cp["bytes"],
                           "checkpoint": cp["phases"], "restore": rs["phases"],
                           "arena_setup_s_in_checkpoint": cp["processes"][0].get("arena_setup_s", 0.0)})
        ok = p.wait_steps(p.steps() + 2, 60)
        return {"arena_setup_s": setup, "cycles": cycles, "continued": ok}
    finally:
        p.p.kill()
        p.finish(30)


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in results["footprints"] if "gpucr" in r and "driver_only" in r]
    x = [r["gib"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for i, (key, drv_key, title) in enumerate((("checkpoint", "checkpoint_s", "VRAM yield (checkpoint)"),
                                               ("restore", "restore_s", "restore"))):
        ax[i].plot(x, [r["driver_only"][drv_key] for r in rows], "o-", label="driver API only")
        ax[i].plot(x, [r["gpucr"]["cycles"][-1][key]["total_s"] for r in rows], "o-", label="gpucr-hpc")
        ax[i].set_xlabel("GPU footprint (GiB)")
        ax[i].set_ylabel("seconds")
        ax[i].set_title(title)
        ax[i].set_xscale("log", base=2)
        ax[i].set_yscale("log")
        ax[i].legend()
    fig.suptitle(f"{results['device']}, driver {results['driver']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 8, 32, 70])
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arena", default=None)
    ap.add_argument("--cuda-bin", default="/tmp/gpucr_cuda_malloc")
    args = ap.parse_args()
    name, driver = smi("name,driver_version")
    res = {"device": name, "driver": driver,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "raw_pinned": raw_bandwidth(), "footprints": []}
    Path(args.out).write_text(json.dumps(res, indent=1))
    for gib in args.sizes:
        row = {"gib": gib}
        for label, fn in (("gpucr", gpucr), ("driver_only", driver_only)):
            try:
                row[label] = fn(args, gib)
            except Exception as e:  # noqa: BLE001 - record and go on
                row[label] = {"error": f"{type(e).__name__}: {e}"}
            print(gib, label, json.dumps(row[label])[:600], flush=True)
        if "cycles" in row.get("gpucr", {}) and "checkpoint_s" in row.get("driver_only", {}):
            steady = row["gpucr"]["cycles"][-1]
            gb = steady["bytes"] / 1e9
            row["ratios"] = {
                "data_out_GBps": gb / steady["checkpoint"]["data_s"] if steady["checkpoint"]["data_s"] else None,
                "data_in_GBps": gb / steady["restore"]["data_s"] if steady["restore"]["data_s"] else None,
                "checkpoint_speedup": row["driver_only"]["checkpoint_s"] / steady["checkpoint"]["total_s"],
                "restore_speedup": row["driver_only"]["restore_s"] / steady["restore"]["total_s"],
            }
        res["footprints"].append(row)
        Path(args.out).write_text(json.dumps(res, indent=1))
    res["plot"] = plot(res, Path(args.out).with_suffix(".png"))
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
