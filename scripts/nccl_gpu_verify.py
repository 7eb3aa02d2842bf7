#!/usr/bin/env python3
"""On a machine with 2+ GPUs: a PyTorch DDP job over NCCL (default transports:
P2P over NVLink), checkpointed in place and restored CYCLES times, against an
uninterrupted run of the same job.

  1. the reference: `torchrun --nproc-per-node N tests/shim_workloads/ddp_nccl.py`;
  2. the same under `gpucr-hpc run`, with CYCLES in-place checkpoints (the NCCL
     cut, teardown, the shims' copy-out and the driver checkpoint of every rank)
     and restores (driver, shims, communicators rebuilt), each timed, with the
     GPU memory in use per GPU after each checkpoint;
  3. checks: bit-identical per-step losses and final checksums on every rank,
     GPU memory given back, no step while checkpointed, NCCL's P2P transport in
     use (its INFO log), every cycle done.
Writes --out (JSON) and prints one line per cycle.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpucr_hpc.process import in_place  # noqa: E402

WORKLOAD = REPO / "tests" / "shim_workloads" / "ddp_nccl.py"


def used_mib() -> list[int]:
    r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, check=True)
    return [int(x) for x in r.stdout.split()]


class Proc:
    """A launched job whose output lines are collected as they come."""

    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=self._pump, args=(self.p.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.p.stderr, self.err), daemon=True).start()

    @staticmethod
    def _pump(stream, into):
        for line in stream:
            into.append(line.rstrip("\n"))

    def steps(self, rank: int) -> int:
        return sum(1 for ln in self.lines if ln.startswith(f"rank {rank} step "))

    def wait_steps(self, n: int, ranks: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(self.steps(r) >= n for r in range(ranks)):
                return True
            if self.p.poll() is not None:
                return False
            time.sleep(0.01)
        return False

    def finish(self, timeout: float) -> int:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait()

    def results(self, ranks: int) -> dict[int, list[str]]:
        return {r: [ln for ln in self.lines if ln.startswith(f"rank {r} ")] for r in range(ranks)}


def launch(args, steps: int) -> list[str]:
    return ["torchrun", "--standalone", f"--nproc-per-node={args.ranks}", str(WORKLOAD), str(steps),
            str(args.ballast_gib), str(args.pace), str(args.subgroup_from)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--steps-per-cycle", type=int, default=20)
    ap.add_argument("--ballast-gib", type=float, default=2.0)
    ap.add_argument("--pace", type=float, default=0.02)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds each checkpoint is held")
    ap.add_argument("--subgroup-from", type=int, default=-1)
    ap.add_argument("--run-dir", default="/tmp/gpucr-nccl-run")
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--logs", help="folder for both runs' whole stderr")
    args = ap.parse_args()
    steps = args.cycles * args.steps_per_cycle + 10
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", NCCL_NVLS_ENABLE="0", NCCL_DEBUG="INFO",
               PYTHONPATH=str(REPO))
    env.pop("LD_PRELOAD", None)
    res: dict = {"ranks": args.ranks, "steps": steps, "cycles_planned": args.cycles, "checks": {},
                 "subgroup_from": args.subgroup_from}
    baseline = used_mib()
    res["baseline_mib"] = baseline
    t = time.monotonic()
    ref = Proc(launch(args, steps), env)
    rc = ref.finish(args.timeout)
    res["reference_s"] = round(time.monotonic() - t, 2)
    if rc != 0:
        res["error"] = f"reference run failed rc={rc}: {ref.err[-30:]}"
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(res["error"])
        return 1
    run_dir = Path(args.run_dir)
    shim_env = dict(env, GPUCR_RUN_DIR=str(run_dir), GPUCR_SHIM=str(REPO / "shim" / "libgpucr-cuda.so"))
    proc = Proc([sys.executable, "-m", "gpucr_hpc", "run", "--"] + launch(args, steps), shim_env)
    cycles = []
    try:
        if not proc.wait_steps(3, args.ranks, 180):
            raise RuntimeError("the shimmed run made no progress")
        for c in range(args.cycles):
            if not proc.wait_steps(proc.steps(0) + args.steps_per_cycle // 2, args.ranks, 120):
                raise RuntimeError(f"no progress before cycle {c}")
            e: dict = {"cycle": c, "used_mib_before": used_mib()}
            t0 = time.monotonic()
            cp = in_place.checkpoint_tree(proc.p.pid, timeout_ms=30000, run_dir=run_dir)
            e["checkpoint_s"] = round(time.monotonic() - t0, 3)
            e["checkpoint"] = cp["phases"]
            e["checkpoint_bytes"] = cp["bytes"]
            e["used_mib_after_checkpoint"] = used_mib()
            at = [proc.steps(r) for r in range(args.ranks)]
            time.sleep(args.pause)
            e["steps_while_checkpointed"] = sum(proc.steps(r) for r in range(args.ranks)) - sum(at)
            t0 = time.monotonic()
            rs = in_place.restore_tree(proc.p.pid, run_dir=run_dir)
            e["restore_s"] = round(time.monotonic() - t0, 3)
            e["restore"] = rs["phases"]
            e["used_mib_after_restore"] = used_mib()
            cycles.append(e)
            print(f"cycle {c}: steps {at}, used {e['used_mib_before']} -> {e['used_mib_after_checkpoint']} -> "
                  f"{e['used_mib_after_restore']} MiB; checkpoint {e['checkpoint_s']} s {cp['phases']}; "
                  f"restore {e['restore_s']} s {rs['phases']}", flush=True)
    except Exception as ex:  # noqa: BLE001 - the report says what broke
        res["error"] = f"{type(ex).__name__}: {ex}"
        print(res["error"], flush=True)
    finally:
        rc = proc.finish(args.timeout)
    res["cycles"] = cycles
    res["shim_rc"] = rc
    if args.logs:
        for name, p in (("reference", ref), ("shim", proc)):
            Path(args.logs, f"{Path(args.out).stem}-{name}.log").write_text("\n".join(p.lines + p.err))
    res["shim_stderr_tail"] = [ln for ln in proc.err if "NCCL INFO" not in ln][-40:]
    ref_out, shim_out = ref.results(args.ranks), proc.results(args.ranks)
    # NCCL's INFO log goes to stdout: "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
    transports = sorted({m.group(1) for ln in proc.lines + proc.err
                         for m in [re.search(r"via (P2P/\S+|SHM/\S+|NET/\S+)", ln)] if m})
    res["nccl_transports"] = transports
    ck = res["checks"]
    ck["completed"] = rc == 0 and "error" not in res
    ck["bit_identical"] = all(ref_out[r] == shim_out[r] and len(ref_out[r]) == steps + 1 for r in range(args.ranks))
    for r in range(args.ranks):
        diff = next((i for i, (a, b) in enumerate(zip(ref_out[r], shim_out[r])) if a != b), None)
        if diff is not None:
            res.setdefault("first_difference", {})[r] = {"reference": ref_out[r][diff], "shim": shim_out[r][diff]}
    ck["p2p_in_use"] = any(x.startswith("P2P/") for x in transports)
    ck["all_cycles_done"] = len(cycles) == args.cycles
    if cycles:
        ck["vram_after_checkpoint_le_64MiB"] = all(u - b <= 64 for e in cycles
                                                   for u, b in zip(e["used_mib_after_checkpoint"], baseline))
        ck["no_progress_while_checkpointed"] = all(e["steps_while_checkpointed"] == 0 for e in cycles)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(ck), flush=True)
    return 0 if all(ck.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
