#!/usr/bin/env python3
"""GPU checks of a restored process's yield and of JAX, in one run on a GPU machine.

restored_torch: a PyTorch decode loop (tests/shim_workloads/decode_torch.py) under
  `gpucr-hpc run` is checkpointed to an image and restored in a new PID namespace
  (as a Slurm restore does); then, on the restored process:
    - `checkpoint --pid` in place must go through its shim (data moved by the shim,
      not by the driver alone), then SIGTSTP as `scontrol suspend` sends it after
      `gpucr-hpc suspend`: the shim must not report a yield that failed;
    - `restore --pid`;
    - a plain SIGTSTP yield (the shim's own): GPU memory yielded while stopped;
  and the output equals an uninterrupted run's.
jax_*: a JAX loop (tests/shim_workloads/jax_loop.py) with XLA's preallocation or
  XLA_PYTHON_CLIENT_PREALLOCATE=false, checkpointed in place (`checkpoint --pid` /
  `restore --pid`) or through an image (`--to` / `--from`); the process must
  survive and its output equal an uninterrupted run's.

Writes one JSON with every scenario's figures and checks (and, where a process
died, the kernel's last lines and its stderr); exits non-zero if a check failed.

    python3 gpu-checks/gpu_yield_jax_verify.py --out RESULT.json [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # common: what the benchmarks and the GPU checks share
WL = REPO / "tests" / "shim_workloads"

from common.gpucr_cli import run_gpucr  # noqa: E402
from common.machine import gpu_line, gpu_used_mib  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402
from common.timing import wait_until  # noqa: E402
from migrate_gpu_verify import out_lines, steps  # noqa: E402 - the workloads' step and checksum lines

from gpucr_hpc.criu.run import is_alive as alive  # noqa: E402

JAX_SCENARIOS = {
    # name: (extra environment, through an image)
    "jax_prealloc_in_place": ({}, False),
    "jax_no_prealloc_in_place": ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, False),
    # an image holds all of the preallocated arena: a smaller one keeps it off the disk's limits
    "jax_prealloc_image": ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2"}, True),
    "jax_no_prealloc_image": ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, True),
}
SCENARIOS = ["restored_torch", *JAX_SCENARIOS]


def stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def kernel_tail(n: int = 12) -> list[str]:
    """The kernel's lines that say what killed a process: a segfault line (names the
    library and offset) and the GPU's Xid errors; then its last few lines."""
    r = subprocess.run(["dmesg"], capture_output=True, text=True)
    if r.returncode != 0:
        return [f"dmesg: {r.stderr.strip()}"]
    lines = r.stdout.splitlines()
    said = [ln for ln in lines if any(w in ln for w in ("segfault", "traps:", "Xid", "general protection"))]
    return said[-n:] + lines[-4:]


def thread_states(pid: int) -> list[dict]:
    """Each thread's name, kernel wait channel and syscall (where a call is stuck)."""
    out = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        row = {"tid": int(task.name)}
        for key in ("comm", "wchan", "syscall"):
            try:
                row[key] = (task / key).read_text().strip()
            except OSError:
                pass
        out.append(row)
    return out


class Ctx:
    def __init__(self, args):
        self.args = args
        self.root = Path(args.work or tempfile.mkdtemp(prefix="gpucr-yield-jax-", dir="/var/tmp"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir = self.root / "run"
        self.run_dir.mkdir(mode=0o700, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        base.update(CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONFAULTHANDLER="1", NCCL_NVLS_ENABLE="0",
                    XLA_FLAGS=base.get("XLA_FLAGS", "--xla_gpu_autotune_level=0"),
                    PYTHONPATH=str(REPO) + os.pathsep + base.get("PYTHONPATH", ""))
        self.env = base
        self.cli_env = dict(base, GPUCR_RUN_DIR=str(self.run_dir))

    def cli(self, *args) -> tuple[int, dict, str]:
        """gpucr-hpc ARGS --json: (exit status, report or {}, its stderr)."""
        run = run_gpucr(*args, "--json", env=self.cli_env, timeout=600)
        if run.rc != 0:
            rep: dict = {}
        elif run.doc is None:
            rep = {"stdout": run.stdout[-500:]}
        else:
            rep = run.doc
        rep["cli_wall_s"] = round(run.wall_s, 3)
        return run.rc, rep, run.stderr.strip()[-1500:]

    def start(self, name: str, argv: list[str], shim: bool, env: dict):
        out, err = self.root / f"{name}.out", self.root / f"{name}.err"
        cmd = [sys.executable, *argv[:1], *argv[1:], str(out)]
        if shim:
            cmd = [sys.executable, "-m", "gpucr_hpc", "run", "--"] + cmd
        with open(err, "w") as fe:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fe, stderr=fe,
                                 env={**(self.cli_env if shim else self.env), **env},
                                 start_new_session=True)  # CRIU dumps a session leader
        return p, out, err

    def reference(self, name: str, argv: list[str], env: dict) -> list[str]:
        p, out, err = self.start(f"{name}-reference", argv, False, env)
        rc = p.wait(timeout=self.args.timeout)
        if rc != 0:
            raise RuntimeError(f"reference run failed (rc {rc}): {err.read_text()[-800:]}")
        return out_lines(out)


def finish(ctx: Ctx, pid: int, out: Path, reference: list[str], res: dict) -> None:
    wait_until(lambda: any(ln.startswith("checksum ") for ln in out_lines(out)) or not alive(pid),
               ctx.args.timeout, "the run to finish")
    got = out_lines(out)
    res["output_identical"] = got == reference
    if got != reference:
        res["first_difference"] = next(({"line": i, "reference": a, "got": b}
                                        for i, (a, b) in enumerate(zip(reference, got)) if a != b),
                                       {"reference_lines": len(reference), "got_lines": len(got)})


def gpucr_lines(err: Path) -> list[str]:
    return [ln for ln in err.read_text(errors="replace").splitlines() if ln.startswith("gpucr:")]


def scenario_restored_torch(ctx: Ctx) -> dict:
    argv = [str(WL / "decode_torch.py"), str(ctx.args.steps), str(ctx.args.cache_gib)]
    env = {"GPUCR_QUIESCE_TIMEOUT_MS": "3000"}  # a quiesce that cannot finish says so sooner
    res: dict = {"reference_lines": 0}
    reference = ctx.reference("torch", argv, env)
    res["reference_lines"] = len(reference)
    p, out, err = ctx.start("torch", argv, True, env)
    pid = None
    try:
        wait_until(lambda: steps(out) >= 15 or p.poll() is not None, ctx.args.timeout, "step 15")
        img = ctx.root / "img-torch"
        rc, rep, why = ctx.cli("checkpoint", "--pid", str(p.pid), "--to", str(img))
        p.wait(timeout=30)
        if rc:
            raise RuntimeError(f"checkpoint --to failed: {why}")
        rc, rep, why = ctx.cli("restore", "--from", str(img), "--pidns", "new")
        if rc:
            raise RuntimeError(f"restore --from failed: {why}")
        pid = rep["pid"]
        res["restored"] = {"pid": pid, "ns_pid": rep["ns_pid"], "pidns": rep["pidns"]}
        at = steps(out)
        wait_until(lambda: steps(out) >= at + 10 or not alive(pid), 60, "the restored run to go on")

        # gpucr-hpc suspend's yield (in place), then the SIGTSTP of scontrol suspend
        used = gpu_used_mib()
        rc, rep, why = ctx.cli("checkpoint", "--pid", str(pid))
        procs = rep.get("processes", [])
        res["in_place"] = {"rc": rc, "error": why, "processes": procs, "bytes": rep.get("bytes"),
                           "phases": rep.get("phases"), "gpu_used_mib_before": used,
                           "gpu_used_mib_after": gpu_used_mib()}
        lines_before = len(gpucr_lines(err))
        os.kill(pid, signal.SIGTSTP)
        time.sleep(1.5)
        res["in_place"]["threads_after_tstp"] = thread_states(pid)
        wait_until(lambda: stopped(pid), 15, "the process to stop on SIGTSTP")
        time.sleep(2.5)  # past the quiesce timeout of a shim that waits for a call in the driver
        res["in_place"]["tstp_lines"] = gpucr_lines(err)[lines_before:]
        os.kill(pid, signal.SIGCONT)
        rc, rep, why = ctx.cli("restore", "--pid", str(pid))
        res["in_place"]["restore"] = {"rc": rc, "error": why, "phases": rep.get("phases")}
        at = steps(out)
        wait_until(lambda: steps(out) >= at + 10 or not alive(pid), 60, "the run to go on after restore --pid")

        # a plain SIGTSTP: the shim yields on its own, as for a fresh process
        used = gpu_used_mib()
        lines_before = len(gpucr_lines(err))
        t = time.monotonic()
        os.kill(pid, signal.SIGTSTP)
        wait_until(lambda: stopped(pid), 30, "the process to stop on SIGTSTP")
        stop_s = time.monotonic() - t
        time.sleep(0.5)
        res["tstp"] = {"gpu_used_mib_before": used, "gpu_used_mib_stopped": gpu_used_mib(),
                       "stopped_after_s": round(stop_s, 3)}
        os.kill(pid, signal.SIGCONT)
        at = steps(out)
        wait_until(lambda: steps(out) >= at + 5 or not alive(pid), 60, "the run to go on after SIGCONT")
        res["tstp"]["lines"] = gpucr_lines(err)[lines_before:]
        finish(ctx, pid, out, reference, res)
    except Exception as e:  # noqa: BLE001 - reported with the process's stderr
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        for q in (pid, p.pid):
            if q and alive(q):
                os.kill(q, signal.SIGKILL)
        if p.poll() is None:
            p.wait()
    cache_mib = ctx.args.cache_gib * 1024
    ip = res.get("in_place", {})
    cuda = [x for x in ip.get("processes", []) if x.get("cuda")]
    res["checks"] = {
        "restored_in_place_checkpoint_ok": ip.get("rc") == 0,
        "restored_in_place_through_shim": bool(cuda) and all(x.get("shim") and x.get("bytes", 0) >= cache_mib * 2**20
                                                             for x in cuda),
        "restored_in_place_released": ip.get("gpu_used_mib_before", 0) - ip.get("gpu_used_mib_after", 1 << 30)
        >= 0.9 * cache_mib,
        "no_failed_yield_reported": not any("not yielded" in ln for ln in ip.get("tstp_lines", [])),
        "restored_in_place_restore_ok": ip.get("restore", {}).get("rc") == 0,
        "restored_tstp_released": res.get("tstp", {}).get("gpu_used_mib_before", 0)
        - res.get("tstp", {}).get("gpu_used_mib_stopped", 1 << 30) >= 0.9 * cache_mib,
        "restored_tstp_silent": res.get("tstp", {}).get("lines") == [],
        "output_identical": bool(res.get("output_identical")),
    }
    res["stderr_tail"] = err.read_text(errors="replace")[-2500:]
    return res


def scenario_jax(ctx: Ctx, name: str) -> dict:
    extra, image = JAX_SCENARIOS[name]
    argv = [str(WL / "jax_loop.py"), str(ctx.args.steps)]
    res: dict = {"env": extra, "image": image}
    reference = ctx.reference(name, argv, extra)
    res["reference_lines"] = len(reference)
    p, out, err = ctx.start(name, argv, True, {**extra, "GPUCR_DEBUG": "1"})
    pid = p.pid
    try:
        wait_until(lambda: steps(out) >= 20 or p.poll() is not None, ctx.args.timeout, "step 20")
        used = gpu_used_mib()
        if image:
            img = ctx.root / f"img-{name}"
            rc, rep, why = ctx.cli("checkpoint", "--pid", str(pid), "--to", str(img))
            p.wait(timeout=60)
        else:
            rc, rep, why = ctx.cli("checkpoint", "--pid", str(pid))
        res["checkpoint"] = {"rc": rc, "error": why, "bytes": rep.get("bytes"),
                             "phases": rep.get("phases") or rep.get("timings"),
                             "gpu_used_mib_before": used, "gpu_used_mib_after": gpu_used_mib()}
        if rc:
            raise RuntimeError(f"checkpoint failed: {why}")
        time.sleep(1.0)
        if image:
            rc, rep, why = ctx.cli("restore", "--from", str(img))
            pid = rep.get("pid", pid)
        else:
            res["checkpoint"]["alive_before_restore"] = alive(pid)
            rc, rep, why = ctx.cli("restore", "--pid", str(pid))
        res["restore"] = {"rc": rc, "error": why, "phases": rep.get("phases") or rep.get("timings"),
                          "gpu_used_mib_after": gpu_used_mib()}
        if rc:
            raise RuntimeError(f"restore failed: {why}")
        finish(ctx, pid, out, reference, res)
    except Exception as e:  # noqa: BLE001 - reported with the process's stderr and the kernel's lines
        res["error"] = f"{type(e).__name__}: {e}"
        res["alive"] = alive(pid)
        res["kernel_tail"] = kernel_tail()
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
            p.wait()
    res["checks"] = {"checkpoint_ok": res.get("checkpoint", {}).get("rc") == 0,
                     "restore_ok": res.get("restore", {}).get("rc") == 0,
                     "output_identical": bool(res.get("output_identical"))}
    res["stderr_tail"] = err.read_text(errors="replace")[-4000:]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*", choices=SCENARIOS)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--cache-gib", type=float, default=2.0)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--work", help="work directory (default: a new one under /var/tmp)")
    args = ap.parse_args()
    ctx = Ctx(args)
    result = {"date": utc_now(), "gpu": gpu_line(), "scenarios": {}}
    for name in args.only or SCENARIOS:
        t = time.monotonic()
        res = scenario_restored_torch(ctx) if name == "restored_torch" else scenario_jax(ctx, name)
        res["seconds"] = round(time.monotonic() - t, 1)
        result["scenarios"][name] = res
        write_record(args.out, result, indent=2)
        print(name, "PASS" if all(res["checks"].values()) else "FAIL",
              {k: v for k, v in res["checks"].items() if not v}, res.get("error", ""), flush=True)
    return 0 if all(all(r["checks"].values()) for r in result["scenarios"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
