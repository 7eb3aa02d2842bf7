#!/usr/bin/env python3
"""Issue 4 benchmark: VRAM yield with gpucr (shim data path + driver control) vs
the driver checkpoint API alone, for several GPU footprints, in one run.

For each footprint (GiB) the same CUDA C program (cudaMalloc'ed buffers) is
  - run under the shim with its arena created at start-up (one-time cost,
    reported apart), then checkpointed/restored in place with gpucr (quiesce,
    data, control per direction, and the shim's own breakdown of data; several
    cycles, the last is reported as steady), and
  - checkpointed/restored in place with the driver API only.
Both runs then finish their steps and print the ballast checksum: their whole
output must be identical (`bit_identical`). Raw pinned D2H/H2D bandwidth is
measured in the same run. Writes JSON (+ PNG when matplotlib is there).

    python3 bench/bench_shim_vs_driver.py --sizes 1 8 32 70 --out bench/results/x.json
    --no-driver: gpucr only (to compare data paths: --pin, --copy-threads N)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "gpu-checks"))  # shim_gpu_verify's Proc: the workload and its output

from common.machine import gpu_used_mib, settings, smi  # noqa: E402
from common.pinned import pinned_bandwidth  # noqa: E402
from common.plots import pyplot  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402
from shim_gpu_verify import Proc  # noqa: E402
from vram_sampler import VramSampler  # noqa: E402

from gpucr_hpc.gpu.driver_nvidia import NvidiaDriver  # noqa: E402
from gpucr_hpc.process import in_place  # noqa: E402
from gpucr_hpc.shim.client import ShimClient  # noqa: E402

STEPS, PACE_MS = 600, 200  # paced while measured; SIGUSR1 lets it finish


def start(args, gib, shim: bool, run_dir: Path, extra_env: dict | None = None):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(extra_env or {})
    cmd = [args.cuda_bin, str(STEPS), str(gib), str(PACE_MS)]
    if shim:
        env.update(GPUCR_RUN_DIR=str(run_dir))
        if args.pin:
            env["GPUCR_ARENA_PIN"] = "1"
        if args.copy_threads:
            env["GPUCR_COPY_THREADS"] = str(args.copy_threads)
        extra = ["--arena", args.arena] if args.arena else []
        size = "auto" if args.arena_auto else f"{gib + 0.25}G"
        extra += [] if args.arena_at_checkpoint else ["--arena-size", size]
        cmd = [sys.executable, "-m", "gpucr_hpc", "run", *extra, "--"] + cmd
    p = Proc(cmd, env)
    if not p.wait_steps(2, 300):
        p.p.kill()
        raise RuntimeError(f"workload did not start: {p.err[-500:]}")
    return p


def finish(p: Proc) -> list[str]:
    """Lets the workload run its last steps unpaced; its output lines."""
    os.kill(p.p.pid, signal.SIGUSR1)
    rc = p.finish(120)
    return p.lines if rc == 0 else p.lines + [f"exit {rc}"]


def hand_back(s: VramSampler, data_bytes: int) -> dict:
    """When the GPU memory went, from the first sample: the data (all of the
    footprint's bytes gone from the GPU) and everything (the lowest level seen)."""
    if not s.samples:
        return {"error": s.error or "no samples"}
    used_before, low = s.samples[0][1], s.lowest()
    return {"used_mib_at_start": used_before,
            "data_handed_back_s": s.first_at_or_below(used_before - 0.99 * data_bytes / 2**20),
            "all_handed_back_s": s.first_at_or_below(low + 8), "lowest_mib": low,
            "sample_period_s": s.period_s, "samples": len(s.samples)}


def driver_only(args, gib) -> dict:
    p = start(args, gib, False, Path("/tmp"))
    try:
        drv = NvidiaDriver()
        used = gpu_used_mib()
        with VramSampler() as vs:
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
        lines = finish(p)
        return {"used_mib_before": used, "used_mib_after_checkpoint": after, "lock_s": t1 - t0,
                "vram": hand_back(vs, int(gib * 2**30)),
                "checkpoint_s": t_cp - t0, "restore_s": t4 - t2, "unlock_s": t4 - t3, "continued": ok,
                "_lines": lines}
    finally:
        if p.p.poll() is None:
            p.p.kill()
            p.finish(30)


HELPER_SOCKET = Path("/tmp/gpucr-bench-copy-helper.sock")
SHIM_KEYS = ("prepare_s", "copy_s", "release_s", "create_s", "data_path", "helper_fallback", "helper_steps",
             "copy_threads", "copy_stores", "copy_wait", "arena_setup_s")


def ready(st: dict, args) -> bool:
    """The arena is made (auto: grown to the footprint, and with the helper
    every segment pinned by it): what a checkpoint would otherwise pay."""
    if args.arena_at_checkpoint:
        return st.get("gpu_bytes", 0) > 0
    if not st.get("arena_ready"):
        return False
    if not args.arena_auto:
        return True
    grown = st.get("gpu_bytes", 0) > 0 and st.get("arena_bytes", 0) >= st["gpu_bytes"]
    return grown and (not args.copy_helper or st.get("helper_segments") == st.get("arena_segments"))


def gpucr(args, gib) -> dict:
    run_dir = Path("/tmp/gpucr-bench-run")
    t_start = time.monotonic()
    p = start(args, gib, True, run_dir)
    pid = p.p.pid
    try:
        c = ShimClient(pid, run_dir)
        deadline = time.monotonic() + 300
        while not ready(dict(c.status().raw), args) and time.monotonic() < deadline:
            time.sleep(0.1)
        ready_after_s = time.monotonic() - t_start  # the program's start, its data, and (auto) the arena
        st = c.status().raw
        one_time = {k: st.get(k) for k in ("arena_ready", "arena_setup_s", "helper_setup_s", "arena_bytes", "arena_dir",
                                            "arena_hugetlb", "arena_pinned", "staging_bytes", "arena_prealloc",
                                            "helper_segments", "arena_segments")}
        cycles, prefilled = [], []
        # The cycles measure each phase on its own; with the copy helper, the
        # prefilled cycles after them restore with the data moving beside the
        # driver restore: their restore total counts, their data phase does not.
        for prefill in [False] * args.cycles + [True] * (args.prefill_cycles if args.copy_helper else 0):
            used = gpu_used_mib()
            with VramSampler() as vs:
                cp = in_place.checkpoint_tree(pid, timeout_ms=60000, run_dir=run_dir)
            after = gpu_used_mib()
            rs = in_place.restore_tree(pid, run_dir=run_dir, prefill=prefill)
            shim_cp, shim_rs = cp["processes"][0], rs["processes"][0]
            (prefilled if prefill else cycles).append({
                "used_mib_before": used, "used_mib_after_checkpoint": after, "bytes": cp["bytes"],
                "vram": hand_back(vs, cp["bytes"]),
                "checkpoint": {**cp["phases"], "shim": {k: shim_cp[k] for k in SHIM_KEYS if k in shim_cp}},
                "restore": {**rs["phases"], "shim": {k: shim_rs[k] for k in SHIM_KEYS if k in shim_rs}}})
        ok = p.wait_steps(p.steps() + 2, 60)
        lines = finish(p)
        # what `gpucr-hpc run` printed (stderr is read to its end)
        one_time["run_stderr"] = [ln for ln in p.err.splitlines() if ln.startswith("gpucr:")]
        one_time["ready_after_s"] = ready_after_s
        return {"one_time": one_time, "cycles": cycles, "prefilled": prefilled, "continued": ok, "_lines": lines}
    finally:
        if p.p.poll() is None:
            p.p.kill()
            p.finish(30)


def ratios(row, raw) -> dict:
    s = row["gpucr"]["cycles"][-1]
    cp, rs = s["checkpoint"], s["restore"]
    gb = s["bytes"] / 1e9
    out = {
        "data_out_GBps": gb / cp["data_s"], "data_in_GBps": gb / rs["data_s"],
        "copy_out_GBps": gb / cp["shim"]["copy_s"], "copy_in_GBps": gb / rs["shim"]["copy_s"],
        "physics_floor_out_s": gb / raw["d2h_GBps"], "physics_floor_in_s": gb / raw["h2d_GBps"],
    }
    out["data_out_vs_raw"] = out["data_out_GBps"] / raw["d2h_GBps"]
    out["data_in_vs_raw"] = out["data_in_GBps"] / raw["h2d_GBps"]
    if "checkpoint_s" in row.get("driver_only", {}):
        d = row["driver_only"]
        out["checkpoint_total_vs_driver"] = cp["total_s"] / d["checkpoint_s"]
        out["restore_total_vs_driver"] = rs["total_s"] / d["restore_s"]
        out["checkpoint_speedup"] = d["checkpoint_s"] / cp["total_s"]
        out["restore_speedup"] = d["restore_s"] / rs["total_s"]
        pre = [c["restore"]["total_s"] for c in row["gpucr"].get("prefilled", []) if c["restore"].get("prefill")]
        if pre:
            out["restore_prefilled_s"] = min(pre)
            out["restore_prefilled_vs_driver"] = min(pre) / d["restore_s"]
    return out


def plot(results, path):
    plt = pyplot()
    if plt is None:
        return False
    rows = [r for r in results["footprints"]
            if "cycles" in r.get("gpucr", {}) and "checkpoint_s" in r.get("driver_only", {})]
    if not rows:
        return False
    x = [r["gib"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (key, drv_key, floor, title) in enumerate((
            ("checkpoint", "checkpoint_s", "physics_floor_out_s", "VRAM yield (checkpoint)"),
            ("restore", "restore_s", "physics_floor_in_s", "restore (data back on the GPU)"))):
        steady = [r["gpucr"]["cycles"][-1][key] for r in rows]
        ax[i].plot(x, [r["driver_only"][drv_key] for r in rows], "o-", color="tab:red", label="driver API only")
        ax[i].plot(x, [s["total_s"] for s in steady], "o-", color="tab:blue", label="gpucr-hpc total")
        ax[i].plot(x, [s["data_s"] for s in steady], "s--", color="tab:blue", alpha=0.6, label="gpucr data phase")
        ax[i].plot(x, [s["control_s"] for s in steady], "^:", color="tab:green", label="gpucr control (driver)")
        ax[i].plot(x, [r["ratios"][floor] for r in rows], "k:", alpha=0.5, label="bytes / raw pinned bandwidth")
        ax[i].plot(x, [r["driver_only"][drv_key] / 10 for r in rows], "--", color="tab:red", alpha=0.35,
                   label="1/10 of driver only")
        ax[i].set_xlabel("GPU footprint (GiB)")
        ax[i].set_ylabel("seconds")
        ax[i].set_title(title)
        ax[i].set_xscale("log", base=2)
        ax[i].set_yscale("log")
        ax[i].grid(True, which="both", alpha=0.3)
    ax[0].legend(fontsize=8)
    fig.suptitle(f"{results['device']}, driver {results['driver']}, {results['date'][:10]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 8, 32, 70])
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arena", default=None, help="arena dir (default /dev/shm)")
    ap.add_argument("--pin", action="store_true", help="GPUCR_ARENA_PIN=1: pinned arena, direct DMA")
    ap.add_argument("--copy-threads", type=int, default=0)
    ap.add_argument("--no-driver", action="store_true", help="skip the driver-only runs")
    ap.add_argument("--raw-gib", type=float, default=8.0)
    ap.add_argument("--cuda-bin", default="/tmp/gpucr_cuda_malloc")
    ap.add_argument("--copy-helper", action="store_true",
                    help="move the data through `gpucr-hpc copy-helper` (GPUCR_COPY_HELPER), started here")
    ap.add_argument("--arena-at-checkpoint", action="store_true",
                    help="no arena made ahead: the first checkpoint makes it (arena_prealloc=off)")
    ap.add_argument("--arena-auto", action="store_true",
                    help="gpucr-hpc run --arena-size auto: the arena grows in the background as the GPU memory "
                         "does (a Slurm job's arena_prealloc=auto); the cycles start once it has")
    ap.add_argument("--prefill-cycles", type=int, default=2,
                    help="with --copy-helper: cycles more whose restore is prefilled (default 2)")
    args = ap.parse_args()
    helper = None
    if args.copy_helper:
        from gpucr_hpc.shim import copy_helper
        helper = copy_helper.spawn(HELPER_SOCKET)
        os.environ["GPUCR_COPY_HELPER"] = str(HELPER_SOCKET)
    try:
        run(args)
    finally:
        if helper:
            helper.kill()
            helper.wait()


def run(args):
    name, driver = smi("name,driver_version")
    res = {"device": name, "driver": driver, "cpus": len(os.sched_getaffinity(0)),
           "date": utc_now(),
           "options": {"arena": args.arena or "/dev/shm", "pin": args.pin, "copy_threads": args.copy_threads or None,
                       "cycles": args.cycles, "copy_helper": args.copy_helper, "arena_auto": args.arena_auto,
                       "arena_at_checkpoint": args.arena_at_checkpoint,
                       "prefill_cycles": args.prefill_cycles if args.copy_helper else 0,
                       "env": settings("GPUCR_")},
           "raw_pinned": pinned_bandwidth(args.raw_gib) if args.raw_gib else {}, "footprints": []}
    out = Path(args.out)
    write_record(out, res)
    for gib in args.sizes:
        row = {"gib": gib}
        for label, fn in (("gpucr", gpucr), ("driver_only", driver_only)):
            if label == "driver_only" and args.no_driver:
                continue
            try:
                row[label] = fn(args, gib)
            except Exception as e:  # noqa: BLE001 - record and go on
                row[label] = {"error": f"{type(e).__name__}: {e}"}
            print(gib, label, json.dumps({k: v for k, v in row[label].items() if k != "_lines"})[:900], flush=True)
        lines = [row[k].pop("_lines", None) for k in ("gpucr", "driver_only") if k in row]
        if len(lines) == 2 and all(lines):
            row["bit_identical"] = lines[0] == lines[1] and any(ln.startswith("checksum") for ln in lines[0])
        if row.get("gpucr", {}).get("cycles"):
            totals = [c["checkpoint"]["total_s"] for c in row["gpucr"]["cycles"]]
            row["first_checkpoint_s"] = totals[0]  # the one a preemption usually brings
            row["steady_checkpoint_s"] = min(totals[1:]) if len(totals) > 1 else None
        if "cycles" in row.get("gpucr", {}) and "d2h_GBps" in res["raw_pinned"]:
            row["ratios"] = ratios(row, res["raw_pinned"])
        res["footprints"].append(row)
        write_record(out, res)
    res["plot"] = plot(res, out.with_suffix(".png"))
    write_record(out, res)


if __name__ == "__main__":
    main()
