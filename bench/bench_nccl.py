#!/usr/bin/env python3
"""NCCL jobs checkpointed in place, side by side, in one run on a 2+ GPU machine:

  shim-default     default NCCL transports (P2P over NVLink) through gpucr (the shim path);
  shim-p2p-off     NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 through gpucr;
  driver-p2p-off   P2P/SHM off, the driver API alone on every rank (no shim);
  driver-default   (not run by default) default transports, driver API alone: the job is
                   expected to be lost (FACTS.md), the case records how;
plus the raw pinned D2H/H2D bandwidth of GPU 0 and, per case, the floor: the bytes
checkpointed at that bandwidth (each GPU moving its share over its own link).

Each case is gpu-checks/nccl_gpu_verify.py in a subprocess (same workload settings,
its own JSON and logs next to --out), bounded by --case-timeout and by what is left
of --time-limit; a case that fails or times out is recorded with its reason. Cases
with the same transport share one reference run. Writes --out (JSON, a record per
case) and a PNG next to it when matplotlib is there.

    python3 bench/bench_nccl.py --out bench/results/nccl-bench.json
    python3 bench/bench_nccl.py --out x.json --workload fsdp --cases shim-default --cycles 2
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GPU_CHECKS = Path(__file__).resolve().parent.parent / "gpu-checks"
sys.path.insert(0, str(GPU_CHECKS))

from common.machine import gpu_identity  # noqa: E402
from common.pinned import pinned_bandwidth  # noqa: E402
from common.plots import pyplot  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402
from common.stats import median  # noqa: E402
from nccl_gpu_verify import WORKLOADS, Terminated, descendants, kill_pids  # noqa: E402

VERIFY = GPU_CHECKS / "nccl_gpu_verify.py"
CASES = {"shim-default": ("shim", "default"), "shim-p2p-off": ("shim", "p2p-off"),
         "driver-p2p-off": ("driver", "p2p-off"), "driver-default": ("driver", "default")}
DEFAULT_CASES = ["shim-default", "shim-p2p-off", "driver-p2p-off"]
MIN_CASE_S = 45  # a case given less than this is skipped, not started


def set_subreaper() -> bool:
    """Orphans of a killed case (torchrun's workers have their own session) become
    our children, so that they can be found and ended."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def sweep() -> list[int]:
    """Kill what is left below this process (after a case); the PIDs."""
    left = descendants(os.getpid())
    kill_pids(left)
    return left


def killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def floor(nbytes: int | None, ranks: int, raw: dict) -> dict | None:
    """The bytes at raw pinned bandwidth: `*_parallel_s` with each of the ranks' GPUs
    moving its share at once, `*_serial_s` all through one link."""
    if not nbytes or "d2h_GBps" not in raw or "h2d_GBps" not in raw:
        return None
    gb = nbytes / 1e9
    return {"checkpoint_parallel_s": round(gb / ranks / raw["d2h_GBps"], 4),
            "restore_parallel_s": round(gb / ranks / raw["h2d_GBps"], 4),
            "checkpoint_serial_s": round(gb / raw["d2h_GBps"], 4),
            "restore_serial_s": round(gb / raw["h2d_GBps"], 4)}


def case_record(name: str, v: dict, raw: dict, ranks: int) -> dict:
    """The figures of one case from nccl_gpu_verify.py's JSON."""
    cycles = v.get("cycles", [])
    rec: dict = {"case": name, "path": v.get("path"), "transport": v.get("transport"), "workload": v.get("workload")}
    for key in ("checkpoint_s", "restore_s", "first_step_after_restore_s"):
        rec[key] = [e.get(key) for e in cycles]  # every cycle, a failed one's too; the median: cycles done
        rec[f"{key.removesuffix('_s')}_median_s"] = median((e.get(key) for e in cycles if e.get("outcome") == "ok"),
                                                           digits=6)
    rec["cycle_outcomes"] = [e.get("outcome") for e in cycles]
    for key in ("step_period_s", "reference_step_period_s", "nccl_transport", "nccl_transports", "checks", "error"):
        if key in v:
            rec[key] = v[key]
    rec["restored"] = bool(v.get("restored"))
    rec["identical"] = bool(v.get("identical"))
    shim_bytes = [e["checkpoint_bytes"] for e in cycles if e.get("checkpoint_bytes")]
    freed = [e["vram_freed_bytes"] for e in cycles if e.get("vram_freed_bytes")]
    if shim_bytes:
        rec["bytes"], rec["bytes_source"] = int(median(shim_bytes) or 0), "shim (data copied out)"
    elif freed:
        rec["bytes"], rec["bytes_source"] = int(median(freed) or 0), "nvidia-smi (memory freed, all GPUs)"
    else:
        rec["bytes"], rec["bytes_source"] = None, None
    rec["floor"] = floor(rec["bytes"], ranks, raw)
    return rec


def verify_cmd(args, name: str, out: Path, budget: float, refs: Path) -> list[str]:
    path, transport = CASES[name]
    ref = refs / f"reference-{args.workload}-{transport}.json"
    cmd = [sys.executable, str(VERIFY), "--out", str(out), "--workload", args.workload, "--transport", transport,
           "--path", path, "--ranks", str(args.ranks), "--cycles", str(args.cycles),
           "--steps-per-cycle", str(args.steps_per_cycle), "--ballast-gib", str(args.ballast_gib),
           "--pace", str(args.pace), "--pause", str(args.pause), "--subgroup-from", str(args.subgroup_from),
           "--run-dir", f"/tmp/gpucr-nccl-bench-{name}", "--cycle-timeout", str(args.cycle_timeout),
           "--budget-s", str(round(budget, 1)), "--timeout", str(round(budget, 1)), "--logs", str(refs)]
    cmd += ["--reference", str(ref)] if ref.exists() else ["--reference-out", str(ref)]
    return cmd


def run_case(args, name: str, out: Path, timeout: float, raw: dict) -> dict:
    logs = out.parent / f"{out.stem}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    case_json = logs / f"{name}.json"
    case_json.unlink(missing_ok=True)
    # the case ends itself a little ahead of the hard limit, writing its JSON
    cmd = verify_cmd(args, name, case_json, max(timeout - 25, 20), logs)
    t0 = time.monotonic()
    rec: dict = {}
    with open(logs / f"{name}.verify.log", "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = p.wait(timeout)
        except (subprocess.TimeoutExpired, Terminated) as ex:
            rec["timeout"] = f"killed after {timeout:.0f} s" if isinstance(ex, subprocess.TimeoutExpired) \
                else "the benchmark was terminated (SIGTERM)"
            killpg(p.pid, signal.SIGTERM)  # it cleans up its jobs and writes its JSON
            try:
                rc = p.wait(20)
            except subprocess.TimeoutExpired:
                killpg(p.pid, signal.SIGKILL)
                try:
                    rc = p.wait(10)
                except subprocess.TimeoutExpired:
                    rc = None
    wall = round(time.monotonic() - t0, 1)
    left = sweep()
    try:
        v = json.loads(case_json.read_text())
    except (OSError, ValueError) as ex:
        v = {"error": f"no JSON from nccl_gpu_verify.py ({type(ex).__name__}): see {logs / (name + '.verify.log')}"}
    rec = {**case_record(name, v, raw, args.ranks), **rec, "rc": rc, "wall_s": wall, "json": str(case_json)}
    if left:
        rec["leftover_processes_killed"] = left
    try:
        rec["verify_log_tail"] = (logs / f"{name}.verify.log").read_text().splitlines()[-8:]
    except OSError:
        pass
    return rec


def plot(res: dict, path: Path) -> str:
    plt = pyplot()
    if plt is None:
        return "skipped: matplotlib is not installed"
    cases = res["cases"]
    if not cases:
        return "skipped: no case"
    bars = (("checkpoint_median_s", "checkpoint", "tab:blue"), ("restore_median_s", "restore", "tab:green"),
            ("first_step_after_restore_median_s", "first step after restore", "tab:orange"))
    width = 0.26
    fig, ax = plt.subplots(figsize=(max(6.5, 2.4 * len(cases)), 4.4))
    for i, c in enumerate(cases):
        for j, (key, label, color) in enumerate(bars):
            x = i + (j - 1) * width
            val = c.get(key)
            ax.bar(x, val or 0, width, color=color, label=label if i == 0 else None)
            if val is None:
                ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7)
        fl = c.get("floor") or {}
        for j, key in ((0, "checkpoint_parallel_s"), (1, "restore_parallel_s")):
            if key in fl:
                x = i + (j - 1) * width
                ax.hlines(fl[key], x - width / 2, x + width / 2, colors="k", linestyles="dashed",
                          label="bytes / raw pinned bandwidth" if i == 0 and j == 0 else None)
        if c.get("step_period_s"):
            x = i + width
            ax.hlines(c["step_period_s"], x - width / 2, x + width / 2, colors="tab:red", linestyles="dotted",
                      label="ordinary step period" if i == 0 else None)
        if not (c.get("restored") and c.get("identical")):
            ax.text(i, ax.get_ylim()[1] * 0.02, "restored" if c.get("restored") else "NOT restored",
                    ha="center", va="bottom", fontsize=8, color="tab:red")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{c['case']}\n{c.get('nccl_transport') or '?'}"
                        f"{'' if c.get('identical') else ', not identical'}" for c in cases], fontsize=8)
    ax.set_ylabel("seconds (median of the cycles)")
    o = res["options"]
    ax.set_title(f"{res.get('device', '?')} x{o['ranks']}, {o['workload']}, ballast {o['ballast_gib']} GiB/rank, "
                 f"{o['cycles']} cycles", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON; the PNG and per-case logs go next to it")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=DEFAULT_CASES)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="ddp")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--steps-per-cycle", type=int, default=20)
    ap.add_argument("--ballast-gib", type=float, default=2.0)
    ap.add_argument("--pace", type=float, default=0.02)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds each checkpoint is held")
    ap.add_argument("--subgroup-from", type=int, default=-1)
    ap.add_argument("--raw-gib", type=float, default=4.0, help="raw pinned bandwidth sample (0: skip)")
    ap.add_argument("--cycle-timeout", type=float, default=60,
                    help="seconds a checkpoint or restore may take before the cycle counts as hung")
    ap.add_argument("--case-timeout", type=float, default=150, help="seconds per case at most")
    ap.add_argument("--time-limit", type=float, default=340,
                    help="seconds for the whole benchmark; a case gets what is left (default 340)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    end = t_start + args.time_limit
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res: dict = {**gpu_identity(), "date": utc_now(),
                 "options": {k: v for k, v in vars(args).items() if k != "out"}, "subreaper": set_subreaper(),
                 "cases": []}
    write_record(out, res)

    def terminate(signum, frame):
        raise Terminated()

    # `timeout`: the running case is ended, the JSON written; the caller's handler is given back at the end
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        # bounded: a copy that hangs is killed after 90 s and recorded as an error
        res["raw_pinned"] = pinned_bandwidth(args.raw_gib, timeout=90) if args.raw_gib else {}
        print("raw pinned", json.dumps(res["raw_pinned"]), flush=True)
        for name in args.cases:
            left = end - time.monotonic()
            if left < MIN_CASE_S:
                res["cases"].append({"case": name, "skipped": f"time limit: {left:.0f} s left"})
                print(name, "skipped: time limit", flush=True)
                continue
            rec = run_case(args, name, out, min(args.case_timeout, left - 5), res.get("raw_pinned", {}))
            res["cases"].append(rec)
            print(name, json.dumps({k: rec.get(k) for k in ("checkpoint_median_s", "restore_median_s",
                                                             "first_step_after_restore_median_s", "step_period_s",
                                                             "nccl_transport", "restored", "identical", "bytes",
                                                             "floor", "error")}), flush=True)
            write_record(out, res)
            if rec.get("timeout", "").startswith("the benchmark was terminated"):
                raise Terminated()
    except (Terminated, KeyboardInterrupt):
        res["error"] = "terminated (SIGTERM) before the end: the cases not listed did not run"
        print(res["error"], flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sweep()
        signal.signal(signal.SIGTERM, previous)
    try:
        res["plot"] = plot(res, out.with_suffix(".png"))
    except Exception as ex:  # noqa: BLE001 - the JSON matters more
        res["plot"] = f"failed: {type(ex).__name__}: {ex}"
    res["wall_s"] = round(time.monotonic() - t_start, 1)
    write_record(out, res)
    print("plot:", res["plot"], "| wall", res["wall_s"], "s", flush=True)
    ran = [c for c in res["cases"] if "skipped" not in c]
    return 0 if ran and all(c["restored"] and c["identical"] for c in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
