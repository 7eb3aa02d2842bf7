#!/usr/bin/env python3
"""Side-by-side data path configurations on one GPU machine, in one run.

The bounce data path is bound by host memory bandwidth, which a shared host
lends unevenly from minute to minute: runs of two configurations one after
the other compare the minutes as much as the configurations. So here every
configuration runs at once, one workload process each (the CUDA C program of
bench/bench_shim_vs_driver.py, same footprint), and each round checkpoints
and restores every process in place, one after the other, in an order that
rotates from round to round. Raw pinned bandwidth is measured before and after.
All processes must end with the same output (their data came back whole).

    bench/datapath_ab.py --gib 16 --rounds 6 --out ab.json \\
        --config previous=16:32:0:spin --config tuned=15:8:out:block \\
        --helper-config helper --prefill-config helper_prefill
    (THREADS:SLOT_MIB:NT:WAIT; a name alone takes the shim's defaults)

--helper-config NAME runs a process whose data moves through the copy helper
(GPUCR_COPY_HELPER; the script starts `gpucr-hpc copy-helper`), restored
without a prefill: its data phase is the helper's whole copy. --prefill-config
NAME the same, with the prefill: the helper fills the GPU while the driver
restores the process, so its restore total is the one to compare, not its
data phase (most of which runs inside the control phase).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench_shim_vs_driver as bench  # noqa: E402 - its workload: start() and finish()
from common.machine import smi  # noqa: E402
from common.pinned import pinned_bandwidth  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402
from datapath_tune import knob_env  # noqa: E402

from gpucr_hpc.process import in_place  # noqa: E402
from gpucr_hpc.shim import copy_helper  # noqa: E402
from gpucr_hpc.shim.client import ShimClient  # noqa: E402


def parse_config(spec: str) -> tuple[str, dict]:
    name, _, vals = spec.partition("=")
    return name, knob_env(vals) if vals else {}


HELPER_SOCKET = "/tmp/gpucr-ab-copy-helper.sock"
SHIM_PATH_KEYS = ("data_path", "helper_fallback", "copy_threads", "copy_stores", "copy_wait")


def one_cycle(pid: int, run_dir: Path, prefill: bool = False) -> dict:
    cp = in_place.checkpoint_tree(pid, timeout_ms=60000, run_dir=run_dir)
    rs = in_place.restore_tree(pid, run_dir=run_dir, prefill=prefill)
    gb = cp["bytes"] / 1e9
    shim_cp, shim_rs = cp["processes"][0], rs["processes"][0]
    return {"bytes": cp["bytes"], "checkpoint_s": cp["phases"]["total_s"], "restore_s": rs["phases"]["total_s"],
            "checkpoint_control_s": cp["phases"]["control_s"], "restore_control_s": rs["phases"]["control_s"],
            "out_GBps": gb / cp["phases"]["data_s"], "in_GBps": gb / rs["phases"]["data_s"],
            "prefill": bool(rs["phases"].get("prefill")),
            "shim_out": {k: shim_cp.get(k) for k in SHIM_PATH_KEYS},
            "shim_in": {k: shim_rs.get(k) for k in SHIM_PATH_KEYS}}


def summary(cycles: list[dict], raw: dict) -> dict:
    out = {}
    for key in ("out_GBps", "in_GBps", "checkpoint_s", "restore_s", "checkpoint_control_s", "restore_control_s"):
        v = [c[key] for c in cycles]
        out[key] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
    if raw.get("d2h_GBps"):
        out["out_vs_raw_median"] = out["out_GBps"]["median"] / raw["d2h_GBps"]
        out["in_vs_raw_median"] = out["in_GBps"]["median"] / raw["h2d_GBps"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--config", action="append", default=[], help="NAME=THREADS:SLOT_MIB:NT:WAIT, or NAME")
    ap.add_argument("--helper-config", action="append", default=[], help="NAME: through the copy helper")
    ap.add_argument("--prefill-config", action="append", default=[],
                    help="NAME: through the copy helper, prefilled beside the driver restore")
    ap.add_argument("--raw-gib", type=float, default=8.0)
    ap.add_argument("--cuda-bin", default="/tmp/gpucr_cuda_malloc")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    configs = [parse_config(c) for c in args.config]
    configs += [(n, {"GPUCR_COPY_HELPER": HELPER_SOCKET}) for n in args.helper_config + args.prefill_config]
    prefill = set(args.prefill_config)
    if not configs:
        raise SystemExit("datapath_ab: no configuration (--config, --helper-config, --prefill-config)")
    helper = copy_helper.spawn(HELPER_SOCKET) if args.helper_config or args.prefill_config else None
    name, driver = smi("name,driver_version")
    res = {"device": name, "driver": driver, "cpus": len(os.sched_getaffinity(0)), "gib": args.gib,
           "date": utc_now(),
           "configs": {n: env for n, env in configs}, "raw_pinned_before": pinned_bandwidth(args.raw_gib)}
    bench.STEPS = 3000  # paced: outlasts every round; SIGUSR1 ends it early
    # bench.start's options: the shim's defaults, the arena made at start-up
    opts = types.SimpleNamespace(pin=False, copy_threads=0, arena=None, cuda_bin=args.cuda_bin,
                                 arena_auto=False, arena_at_checkpoint=False)
    procs = {}
    try:
        for n, env in configs:
            run_dir = Path(f"/tmp/gpucr-ab-{n}")
            p = bench.start(opts, args.gib, True, run_dir, env)
            c = ShimClient(p.p.pid, run_dir)
            deadline = time.monotonic() + 300
            while not c.status().arena_ready and time.monotonic() < deadline:
                time.sleep(0.1)
            procs[n] = (p, run_dir)
        res["first_cycles"] = {}
        for n, (p, run_dir) in procs.items():  # first cycles pay first-touch costs: not counted
            res["first_cycles"][n] = one_cycle(p.p.pid, run_dir, n in prefill)
        names = list(procs)
        cycles: dict[str, list] = {n: [] for n in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                p, run_dir = procs[n]
                c = one_cycle(p.p.pid, run_dir, n in prefill)
                c["round"] = r
                cycles[n].append(c)
                print(f"round {r} {n}: out {c['out_GBps']:.1f} GB/s in {c['in_GBps']:.1f} GB/s "
                      f"checkpoint {c['checkpoint_s']:.3f} s restore {c['restore_s']:.3f} s", flush=True)
        res["raw_pinned_after"] = pinned_bandwidth(args.raw_gib)
        raw = {k: max(res["raw_pinned_before"].get(k, 0), res["raw_pinned_after"].get(k, 0))
               for k in ("d2h_GBps", "h2d_GBps")}
        outputs = {n: bench.finish(p) for n, (p, _) in procs.items()}
        first = outputs[names[0]]
        res["outputs_identical"] = all(o == first for o in outputs.values()) and any(
            ln.startswith("checksum") for ln in first)
        res["results"] = {n: {"cycles": cycles[n], "summary": summary(cycles[n], raw)} for n in names}
    finally:
        for p, _ in procs.values():
            if p.p.poll() is None:
                p.p.kill()
                p.finish(30)
        if helper:
            helper.kill()
            helper.wait()
        write_record(args.out, res)
    for n in procs:
        s = res.get("results", {}).get(n, {}).get("summary")
        if s:
            print(f"{n:>12}: out {s['out_GBps']['median']:.1f} GB/s ({s.get('out_vs_raw_median', 0):.0%} of raw), "
                  f"in {s['in_GBps']['median']:.1f} GB/s ({s.get('in_vs_raw_median', 0):.0%}), checkpoint "
                  f"{s['checkpoint_s']['median']:.3f} s, restore {s['restore_s']['median']:.3f} s (medians)")
    print("outputs identical:", res.get("outputs_identical"))
    return 0 if res.get("outputs_identical") else 1


if __name__ == "__main__":
    sys.exit(main())
