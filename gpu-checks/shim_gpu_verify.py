#!/usr/bin/env python3
"""GPU verification of the shim, in one run on a GPU machine.

For each workload — PyTorch (default caching allocator, expandable_segments,
cudaMallocAsync), CuPy, a CUDA C program calling cudaMalloc, a Triton kernel
launched by Triton's launcher, torch.compile (default and reduce-overhead) — it runs:
  1. a reference run without the shim;
  2. a run under `gpucr-hpc run`, checkpointed in place and restored CYCLES times
     while it trains, and checks:
       - GPU memory in use (nvidia-smi) after each checkpoint;
       - after the first checkpoint, another process can allocate the freed memory;
       - the output (loss per step + final checksum) equals the reference, bit for bit;
       - GPU memory after each restore and arena bytes do not grow over the cycles.
Writes one JSON (device, driver, date, per-workload figures) and exits non-zero
if a check failed.

    python3 gpu-checks/shim_gpu_verify.py --out bench/results/shim-gpu-verify.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # common: what the benchmarks and the GPU checks share
WL = REPO / "tests" / "shim_workloads"

# after sys.path above: the script runs from a checkout, the package need not be installed
from common.machine import gpu_used_mib, smi  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402

from gpucr_hpc.process import in_place  # noqa: E402
from gpucr_hpc.shim import copy_helper  # noqa: E402
from gpucr_hpc.shim.client import ShimClient  # noqa: E402


def workloads(args):
    py = sys.executable
    torch_cmd = [py, str(WL / "train_torch.py")]
    out = {
        "torch_default": (torch_cmd, {}),
        "torch_expandable_segments": (torch_cmd, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        "torch_cudaMallocAsync": (torch_cmd, {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
        "cupy": ([py, str(WL / "cupy_prog.py")], {}),
        "cuda_c_cudaMalloc": ([args.cuda_bin], {}),
        # launches through Triton's own launcher, and torch.compile's kernels
        "triton": ([py, str(WL / "triton_loop.py")], {}),
        "torch_compile": ([py, str(WL / "compile_loop.py")], {"COMPILE_MODE": "default"}),
        "torch_compile_reduce_overhead": ([py, str(WL / "compile_loop.py")], {"COMPILE_MODE": "reduce-overhead"}),
    }
    return {k: v for k, v in out.items() if not args.only or k in args.only}


class Proc:
    """A workload process whose stdout lines are collected as they come."""

    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.err = ""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def _read_err(self):
        self.err = self.p.stderr.read()

    def steps(self) -> int:
        return sum(1 for ln in self.lines if ln.startswith("step "))

    def wait_steps(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.steps() >= n:
                return True
            if self.p.poll() is not None:
                time.sleep(0.2)
                return self.steps() >= n
            time.sleep(0.01)
        return False

    def finish(self, timeout: float) -> int:
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        time.sleep(0.2)
        return rc


def other_process_alloc(gib: float) -> dict:
    code = ("import sys, torch; n = int(float(sys.argv[1]) * 2**30); x = torch.empty(n, dtype=torch.uint8, "
            "device='cuda'); x.fill_(7); torch.cuda.synchronize(); print('ALLOC_OK', x.numel())")
    r = subprocess.run([sys.executable, "-c", code, str(gib)], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    return {"gib": gib, "ok": "ALLOC_OK" in r.stdout, "stderr_tail": r.stderr[-300:]}


HELPER_SOCKET = Path("/tmp/gpucr-verify-copy-helper.sock")
PATH_KEYS = ("data_path", "helper_fallback", "helper_steps")  # which data path a shim took


def run_workload(name, cmd, extra_env, args, cycles) -> dict:
    steps = cycles * args.steps_per_cycle + 10
    wl_args = [str(steps), str(args.ballast_gib), str(args.pace_ms if "cuda_c" in name else args.pace_ms / 1000)]
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", **extra_env)
    env.pop("LD_PRELOAD", None)
    res = {"workload": name, "cycles_planned": cycles, "steps": steps, "checks": {}}
    t = time.monotonic()
    ref = Proc(cmd + wl_args, env)
    ref_rc = ref.finish(args.timeout)
    res["reference_s"] = round(time.monotonic() - t, 2)
    if ref_rc != 0:
        res["error"] = f"reference run failed rc={ref_rc}: {ref.err[-800:]}"
        return res

    run_dir = Path(args.run_dir)
    shim_env = dict(env, GPUCR_RUN_DIR=str(run_dir), GPUCR_SHIM=str(args.shim))
    if args.arena:
        shim_env["GPUCR_ARENA_DIR"] = args.arena
    if args.copy_helper:
        shim_env["GPUCR_COPY_HELPER"] = str(HELPER_SOCKET)
    proc = Proc([sys.executable, "-m", "gpucr_hpc", "run", "--"] + cmd + wl_args, shim_env)
    pid = proc.p.pid
    cyc = []
    try:
        if not proc.wait_steps(3, args.timeout):
            res["error"] = f"shimmed run made no progress: {proc.err[-800:]}"
            return res
        res["status_before"] = dict(ShimClient(pid, run_dir).status().raw)
        for c in range(cycles):
            target = proc.steps() + args.steps_per_cycle // 2
            if not proc.wait_steps(target, 120):
                res["error"] = f"no progress before cycle {c}: {proc.err[-800:]}"
                break
            entry = {"cycle": c, "step_at_checkpoint": proc.steps()}
            if args.copy_helper and c == args.kill_helper_at:
                args.helper.kill()  # the helper dies: the shim must go on without it
                args.helper.wait()
                entry["helper_killed"] = True
            entry["used_mib_before"] = gpu_used_mib()
            st = ShimClient(pid, run_dir).status()
            entry["tracked_gpu_bytes"] = st.gpu_bytes
            entry["async_bytes"] = st.async_bytes
            if args.shim_only:  # the shim's yield alone, as on a SIGTSTP suspend or before a dump
                t_cp = time.monotonic()
                one = dict(ShimClient(pid, run_dir).checkpoint(20000).raw)
                cp = {"phases": {"total_s": round(time.monotonic() - t_cp, 3)}, "processes": [one],
                      "bytes": one.get("bytes")}
            else:
                cp = in_place.checkpoint_tree(pid, timeout_ms=20000, run_dir=run_dir)
            entry["checkpoint"] = cp["phases"]
            entry["checkpoint_path"] = {k: cp["processes"][0].get(k) for k in PATH_KEYS}
            entry["checkpoint_bytes"] = cp["bytes"]
            entry["steps_while_checkpointed_start"] = proc.steps()
            entry["used_mib_after_checkpoint"] = gpu_used_mib()
            if c == 0:
                total_mib = int(smi("memory.total")[0])
                entry["other_process_alloc"] = other_process_alloc(round((total_mib - args.headroom_mib) / 1024, 1))
            time.sleep(args.hold_s)  # the program goes on and launches into the yield meanwhile
            entry["steps_while_checkpointed"] = proc.steps() - entry["steps_while_checkpointed_start"]
            # with the copy helper, every other restore is prefilled
            if args.shim_only:
                t_rs = time.monotonic()
                one = dict(ShimClient(pid, run_dir).restore().raw)
                rs = {"phases": {"total_s": round(time.monotonic() - t_rs, 3)}, "processes": [one]}
            else:
                rs = in_place.restore_tree(pid, run_dir=run_dir, prefill=bool(args.copy_helper and c % 2))
            entry["restore"] = rs["phases"]
            entry["restore_path"] = {k: rs["processes"][0].get(k) for k in PATH_KEYS}
            entry["used_mib_after_restore"] = gpu_used_mib()
            st = ShimClient(pid, run_dir).status()
            entry["arena_bytes"] = st.arena_bytes
            entry["arena_used_after_restore"] = st.arena_used
            cyc.append(entry)
            print(f"  {name} cycle {c}: used {entry['used_mib_before']} -> {entry['used_mib_after_checkpoint']} "
                  f"-> {entry['used_mib_after_restore']} MiB, cp {cp['phases']}, rs {rs['phases']}", flush=True)
        res["status_after_cycles"] = dict(ShimClient(pid, run_dir).status().raw)
    except Exception as e:  # noqa: BLE001 - keep going with the other workloads
        res["error"] = f"{type(e).__name__}: {e}; stderr: {proc.err[-800:]}"
    finally:
        rc = proc.finish(args.timeout)
    res["cycles"] = cyc
    res["shim_rc"] = rc
    res["shim_stderr_tail"] = proc.err[-1500:]
    ref_out = [ln for ln in ref.lines if ln.startswith(("step ", "checksum "))]
    shim_out = [ln for ln in proc.lines if ln.startswith(("step ", "checksum "))]
    first_diff = next((i for i, (a, b) in enumerate(zip(ref_out, shim_out)) if a != b), None)
    ck = res["checks"]
    ck["completed"] = rc == 0 and "error" not in res
    ck["bit_identical"] = ref_out == shim_out and len(ref_out) == steps + 1
    if first_diff is not None:
        res["first_difference"] = {"reference": ref_out[first_diff], "shim": shim_out[first_diff]}
    res["reference_checksum"] = ref_out[-1] if ref_out else None
    res["shim_checksum"] = shim_out[-1] if shim_out else None
    if cyc:
        # what was in use before any workload (the copy helper's own contexts)
        if not args.shim_only:  # the shim's yield alone leaves the CUDA context on the GPU
            ck["vram_after_checkpoint_le_64MiB"] = all(e["used_mib_after_checkpoint"] - args.baseline_mib <= 64
                                                       for e in cyc)
        ck["no_progress_while_checkpointed"] = all(e["steps_while_checkpointed"] == 0 for e in cyc)
        if "other_process_alloc" in cyc[0]:
            ck["other_process_allocates_freed_memory"] = cyc[0]["other_process_alloc"]["ok"]
        # caching allocators may grow a little early on; a killed copy helper takes its
        # own contexts with it: the cycles before and after it are compared apart
        groups = [[e["used_mib_after_restore"] for e in cyc if e["cycle"] < args.kill_helper_at],
                  [e["used_mib_after_restore"] for e in cyc if e["cycle"] >= args.kill_helper_at]]
        arena = [e["arena_bytes"] for e in cyc]
        ck["no_gpu_leak"] = all(max(g) - min(g) <= 64 for g in groups if g)
        ck["no_arena_growth"] = (len(set(arena[1:] or arena)) == 1
                                 and all(e["arena_used_after_restore"] == 0 for e in cyc))
        ck["all_cycles_done"] = len(cyc) == cycles
        if args.copy_helper:
            alive = [e for e in cyc if e["cycle"] < args.kill_helper_at]
            dead = [e for e in cyc if e["cycle"] >= args.kill_helper_at]
            # with --helper-fails-copy the helper says cycle 0's restore copies failed
            failed = [e for e in alive if args.helper_fails_copy and e["cycle"] == 0]
            ck["helper_moved_the_data"] = all(e["checkpoint_path"]["data_path"] == "helper" and
                                              (e in failed or e["restore_path"]["data_path"] == "helper")
                                              for e in alive)
            if args.helper_fails_copy:
                ck["failed_helper_copy_bounce_path_says_why"] = bool(failed) and all(
                    e["restore_path"]["data_path"] == "bounce" and
                    "a copy failed" in (e["restore_path"]["helper_fallback"] or "") for e in failed)
            # the helper's own timing of its steps reaches the shim's replies
            ck["helper_steps_reported"] = all(
                "wait_s" in (e["checkpoint_path"]["helper_steps"] or {}) and
                (e in failed or {"create_s", "prefill_create_s"} & set(e["restore_path"]["helper_steps"] or {}))
                for e in alive)
            ck["helper_prefilled"] = any(e["restore"].get("prefill") for e in alive) if len(alive) > 1 else True
            if dead:
                ck["without_helper_bounce_path_says_why"] = all(
                    e["checkpoint_path"]["data_path"] == "bounce" and e["checkpoint_path"]["helper_fallback"]
                    for e in dead)
        res["max_used_mib_after_checkpoint"] = max(e["used_mib_after_checkpoint"] for e in cyc)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--leak-cycles", type=int, default=20, help="cycles for the first workload")
    ap.add_argument("--steps-per-cycle", type=int, default=6)
    ap.add_argument("--ballast-gib", type=float, default=8.0)
    ap.add_argument("--pace-ms", type=int, default=20)
    ap.add_argument("--headroom-mib", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--shim-only", action="store_true",
                    help="yield through the shim alone (no driver checkpoint), as a SIGTSTP suspend does")
    ap.add_argument("--shim", default=str(REPO / "shim" / "libgpucr-cuda.so"), help="the shim to run under")
    ap.add_argument("--hold-s", type=float, default=0.2, help="how long each checkpoint is held before the restore")
    ap.add_argument("--arena", default=None)
    ap.add_argument("--run-dir", default="/tmp/gpucr-verify-run")
    ap.add_argument("--cuda-bin", default="/tmp/gpucr_cuda_malloc")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--copy-helper", action="store_true",
                    help="the shim moves the data through `gpucr-hpc copy-helper`, started here")
    ap.add_argument("--kill-helper-at", type=int, default=1 << 30,
                    help="with --copy-helper: kill the helper before this cycle (0-based)")
    ap.add_argument("--helper-fails-copy", action="store_true",
                    help="with --copy-helper: the helper reports the first restore's copies failed "
                         "(GPUCR_FAULTS=copy_helper_in_done): that restore must take the bounce path")
    args = ap.parse_args()
    args.helper = (copy_helper.spawn(HELPER_SOCKET, faults="copy_helper_in_done" if args.helper_fails_copy else "")
                   if args.copy_helper else None)
    args.baseline_mib = gpu_used_mib()
    try:
        return verify(args)
    finally:
        if args.helper and args.helper.poll() is None:
            args.helper.kill()
            args.helper.wait()


def verify(args):
    name, driver, total = smi("name,driver_version,memory.total")
    results = {"device": name, "driver": driver, "gpu_memory_mib": int(total),
               "date": utc_now(),
               "ballast_gib": args.ballast_gib, "copy_helper": args.copy_helper, "used_mib_at_start": args.baseline_mib,
               "kill_helper_at": args.kill_helper_at if args.copy_helper and args.kill_helper_at < 1 << 30 else None,
               "workloads": []}
    try:
        import cuda.bindings
        results["cuda_bindings"] = cuda.bindings.__version__
    except Exception:  # noqa: BLE001
        pass
    ok = True
    for i, (wname, (cmd, extra)) in enumerate(workloads(args).items()):
        cycles = args.leak_cycles if i == 0 else args.cycles
        print(f"== {wname} ({cycles} cycles)", flush=True)
        r = run_workload(wname, cmd, extra, args, cycles)
        results["workloads"].append(r)
        ok = ok and all(r["checks"].values()) and "error" not in r
        print(f"   checks: {r['checks']} {r.get('error', '')}", flush=True)
        write_record(args.out, results)
    results["all_ok"] = ok
    write_record(args.out, results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
