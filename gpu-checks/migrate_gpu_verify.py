#!/usr/bin/env python3
"""GPU verification of whole-process migration, on a GPU machine.

A deterministic PyTorch training loop (tests/shim_workloads/train_torch.py) is run
  0. without the shim, uninterrupted: the reference output (loss per step, checksum);
  1. kill:          under `gpucr-hpc run`, `checkpoint --pid --to IMG` at step K (the
                    process is gone), `restore --from IMG`: the output must equal the
                    reference bit for bit;
  2. leave_running: `checkpoint --pid --to IMG --leave-running` at step K: the original
                    must finish identical to the reference; then `restore --from IMG
                    --rewind-files` (the output file is cut back to its checkpoint size)
                    must finish identical too;
  3. again_new_pidns (with --again): the image of 2 restored once more, into a new
                    PID namespace: the image is reusable and stays untouched.
Also measured: the file system's sequential write bandwidth where the images go
(same size as the GPU data, fsync'd), to compare with the image's write rate.
Writes one JSON (device, timings, checks) and exits non-zero if a check failed.

    python3 gpu-checks/migrate_gpu_verify.py --out bench/results/migrate-gpu.json
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # fs_rates, and common: what the benchmarks and the GPU checks share
TRAIN = REPO / "tests" / "shim_workloads" / "train_torch.py"

from common.gpucr_cli import run_gpucr  # noqa: E402
from common.machine import gpu_used_mib, smi  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402
from common.timing import wait_until  # noqa: E402
from fs_rates import drop_cache, rates  # noqa: E402

from gpucr_hpc.criu.run import is_alive as alive  # noqa: E402
from gpucr_hpc.store import gpu_data  # noqa: E402


def out_lines(path: Path) -> list[str]:
    text = path.read_text(errors="replace") if path.exists() else ""
    return [ln for ln in text.splitlines() if ln.startswith(("step ", "checksum "))]


def steps(path: Path) -> int:
    return sum(1 for ln in out_lines(path) if ln.startswith("step "))


def cli(env: dict, *args) -> dict:
    """gpucr-hpc ARGS --json: its report, with the command's wall time (cli_wall_s)."""
    run = run_gpucr(*args, "--json", env=env, timeout=900)
    if run.rc != 0 or run.doc is None:
        raise RuntimeError(f"gpucr-hpc {' '.join(args)} failed (rc {run.rc}): "
                           f"{(run.stderr or run.stdout).strip()[-1500:]}")
    run.doc["cli_wall_s"] = round(run.wall_s, 3)
    return run.doc


class Ctx:
    def __init__(self, args):
        self.args = args
        self.root = Path(args.image_root or tempfile.mkdtemp(prefix="gpucr-migrate-gpu-", dir="/var/tmp"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir = self.root / "run"
        self.run_dir.mkdir(mode=0o700, exist_ok=True)
        self.wl_args = [str(args.steps), str(args.ballast_gib), str(args.pace)]
        base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        base["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        base["PYTHONPATH"] = str(REPO) + os.pathsep + base.get("PYTHONPATH", "")
        self.env = base
        self.cli_env = dict(base, GPUCR_RUN_DIR=str(self.run_dir))
        self.reference: list[str] = []

    def start(self, name: str, shim: bool, env: dict | None = None):
        """The workload, under the shim or not; env: extra variables (e.g. CUDA_VISIBLE_DEVICES)."""
        out = self.root / f"{name}.out"
        err = self.root / f"{name}.err"
        cmd = [sys.executable, str(self.args.workload), *self.wl_args]
        if shim:
            arena = (["--arena", self.args.arena] if self.args.arena else []) + \
                    (["--arena-size", self.args.arena_size] if self.args.arena_size else [])
            cmd = [sys.executable, "-m", "gpucr_hpc", "run", *arena, "--"] + cmd
        with open(out, "w") as fo, open(err, "w") as fe:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                                 env={**(self.cli_env if shim else self.env), **(env or {})},
                                 start_new_session=True)
        return p, out, err


def reference(ctx: Ctx) -> dict:
    t = time.monotonic()
    p, out, err = ctx.start("reference", shim=False)
    rc = p.wait(timeout=ctx.args.timeout)
    ctx.reference = out_lines(out)
    ok = rc == 0 and len(ctx.reference) == ctx.args.steps + 1
    return {"rc": rc, "seconds": round(time.monotonic() - t, 2), "lines": len(ctx.reference),
            "checksum": ctx.reference[-1] if ctx.reference else None,
            **({} if ok else {"error": err.read_text()[-1500:]})}


def image_facts(img: Path) -> dict:
    m = json.loads((img / "manifest.json").read_text())
    h5 = sorted(img.glob("process-*.h5"))
    facts = {"h5_files": [p.name for p in h5], "gpu_bytes": m.get("gpu_bytes"),
             "criu_bytes": (m.get("criu") or {}).get("bytes"), "total_bytes": m.get("total_bytes"),
             "gpu_processes": m.get("gpu_processes"), "vendor": m.get("vendor"), "gpu": m.get("gpu"),
             "data_paths": [r.get("data_path") for r in m.get("gpu_processes") or [] if r.get("shim")]}
    if h5:
        bufs = gpu_data.list_buffers(h5[0])
        facts["h5_allocations"] = len(bufs)
        facts["h5_payload_bytes"] = sum(b[1] for b in bufs)
        if shutil.which("h5ls"):
            r = subprocess.run(["h5ls", "-r", str(h5[0])], capture_output=True, text=True)
            facts["h5ls_ok"] = r.returncode == 0 and "/allocations/" in r.stdout
    return facts


def image_state(img: Path) -> list:
    """Name, size, mode and mtime of every file of the image (a restore only reads it)."""
    return sorted((str(p.relative_to(img)), st.st_size, st.st_mode, st.st_mtime_ns)
                  for p in img.rglob("*") for st in [p.lstat()])


def restore(ctx: Ctx, img: Path, out: Path, *extra, env: dict | None = None, running=None) -> dict:
    """restore --from IMG, then wait for the restored run to finish and compare its output.
    env: extra variables for the restore command; running(rep): called as soon as the
    restore returned, while the restored process runs (to look at it)."""
    digest = image_state(img)
    rep = cli({**ctx.cli_env, **(env or {})}, "restore", "--from", str(img), *extra)
    pid = rep["pid"]
    if running:
        running(rep)
    wait_until(lambda: any(ln.startswith("checksum ") for ln in out_lines(out)) or not alive(pid),
               ctx.args.timeout, "the restored process to finish")
    wait_until(lambda: not alive(pid), 60, "the restored process to exit")
    got = out_lines(out)
    rep["output_identical"] = got == ctx.reference
    rep["image_unchanged"] = image_state(img) == digest
    if not rep["output_identical"]:
        rep["first_difference"] = next(({"line": i, "reference": a, "restored": b}
                                         for i, (a, b) in enumerate(zip(ctx.reference, got)) if a != b),
                                        {"reference_lines": len(ctx.reference), "restored_lines": len(got)})
    return rep


def scenario_kill(ctx: Ctx, between=None) -> dict:
    """between(): called once the image is written, before the restore (the file
    system's rates measured right after the write and right before the read)."""
    p, out, err = ctx.start("kill", shim=True)
    res: dict = {}
    try:
        wait_until(lambda: steps(out) >= ctx.args.checkpoint_at or p.poll() is not None, ctx.args.timeout,
                   "the shimmed run to reach the checkpoint step")
        img = ctx.root / "img-kill"
        used_before = gpu_used_mib()
        cp = cli(ctx.cli_env, "checkpoint", "--pid", str(p.pid), "--to", str(img))
        p.wait(timeout=30)  # reap: its PID is free for the restore
        at = steps(out)
        time.sleep(0.5)
        res.update(checkpoint=cp, steps_at_checkpoint=at, gpu_used_mib_before=used_before,
                   gpu_used_mib_after_checkpoint=gpu_used_mib(),
                   no_progress_after_checkpoint=steps(out) == at, process_gone=not alive(p.pid),
                   image=image_facts(img))
        if between:
            between()
        drop_cache(img)  # the restore reads the image from the disk, not from memory
        res["restore"] = restore(ctx, img, out)
    except Exception as e:  # noqa: BLE001 - reported, with the process's stderr
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    res["stderr_tail"] = err.read_text(errors="replace")[-1500:]
    return res


def scenario_leave_running(ctx: Ctx, again: bool) -> dict:
    p, out, err = ctx.start("leave", shim=True)
    res: dict = {}
    try:
        wait_until(lambda: steps(out) >= ctx.args.checkpoint_at or p.poll() is not None, ctx.args.timeout,
                   "the shimmed run to reach the checkpoint step")
        img = ctx.root / "img-leave"
        cp = cli(ctx.cli_env, "checkpoint", "--pid", str(p.pid), "--to", str(img), "--leave-running")
        res.update(checkpoint=cp, steps_at_checkpoint=steps(out), image=image_facts(img))
        rc = p.wait(timeout=ctx.args.timeout)
        res["original_rc"] = rc
        res["original_output_identical"] = out_lines(out) == ctx.reference
        res["restore"] = restore(ctx, img, out, "--rewind-files")
        if again:
            res["restore_again_new_pidns"] = restore(ctx, img, out, "--rewind-files", "--pidns", "new")
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    res["stderr_tail"] = err.read_text(errors="replace")[-1500:]
    return res


def faster_fs(res: dict, key: str) -> float:
    """The file system's faster rate of the two measurements on either side of the
    image's write (before the scenario, and between checkpoint and restore) or of
    its read (between, and after the restore): a shared disk drifts by tens of
    percent within minutes, so the image's rate is held against the faster, and
    the ratio never flatters. Runs without the middle measurement: before and
    after. 0 when not measured."""
    sides = {"fs_write": (key, key + "_between"), "fs_read": (key + "_between", key + "_after")}[key]
    if not res.get(key + "_between"):
        sides = (key, key + "_after")
    return max([res[k]["MBps"] for k in sides if res.get(k)] or [0])


def checks(res: dict) -> dict:
    ck = {"reference_ok": "error" not in res["reference"]}
    k = res.get("kill")
    if k is not None:
        ck["kill_no_error"] = "error" not in k
        ck["kill_process_gone"] = bool(k.get("process_gone"))
        ck["kill_no_progress_while_checkpointed"] = bool(k.get("no_progress_after_checkpoint"))
        img = k.get("image") or {}
        ck["kill_h5_holds_gpu_data"] = (img.get("h5_payload_bytes") or 0) >= res["args"]["ballast_gib"] * 2**30
        ck["kill_restored_bit_identical"] = bool((k.get("restore") or {}).get("output_identical"))
        ck["kill_image_unchanged_by_restore"] = bool((k.get("restore") or {}).get("image_unchanged"))
        if res["args"].get("copy_helper"):  # the helper moved the data out, and back in after the move
            ck["kill_helper_moved_the_data"] = img.get("data_paths") == ["helper"] and \
                [g.get("data_path") for g in (k.get("restore") or {}).get("gpus") or []] == ["helper"]
    fs_w, fs_r = faster_fs(res, "fs_write"), faster_fs(res, "fs_read")
    if k is not None and "checkpoint" in k and fs_w:
        res["h5_write_vs_fs_write"] = round(k["checkpoint"]["timings"].get("gpu_h5_MBps", 0) / fs_w, 3)
    read = ((k or {}).get("restore") or {}).get("timings", {}).get("gpu_h5_read_MBps")
    if read and fs_r:
        res["h5_read_vs_fs_read"] = round(read / fs_r, 3)
    lr = res.get("leave_running")
    if lr is not None:
        ck["leave_no_error"] = "error" not in lr
        ck["leave_original_bit_identical"] = bool(lr.get("original_output_identical")) and lr.get("original_rc") == 0
        ck["leave_restored_bit_identical"] = bool((lr.get("restore") or {}).get("output_identical"))
        if "restore_again_new_pidns" in lr or res["args"]["again"]:
            again = lr.get("restore_again_new_pidns") or {}
            ck["again_new_pidns_bit_identical"] = bool(again.get("output_identical"))
            ck["again_image_unchanged"] = bool(again.get("image_unchanged"))
    return ck


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--image-root", default=None, help="where images go (default: a new dir in /var/tmp)")
    ap.add_argument("--workload", default=str(TRAIN),
                    help="the program: STEPS BALLAST_GIB PACE_S, prints `step I ...` and `checksum ...` "
                         "(tests/shim_workloads: train_torch.py, triton_loop.py, compile_loop.py)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--checkpoint-at", type=int, default=20)
    ap.add_argument("--ballast-gib", type=float, default=2.0)
    ap.add_argument("--pace", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--only", nargs="*", default=None, help="kill, leave_running")
    ap.add_argument("--again", action="store_true", help="restore the leave-running image again, new PID ns")
    ap.add_argument("--keep", action="store_true", help="keep the images")
    ap.add_argument("--arena", default=None, help="gpucr-hpc run --arena (e.g. a hugetlbfs mount)")
    ap.add_argument("--arena-size", default=None, help="gpucr-hpc run --arena-size (preallocated arena)")
    ap.add_argument("--copy-helper", action="store_true",
                    help="the shim moves the data through `gpucr-hpc copy-helper`, started here")
    args = ap.parse_args()
    ctx = Ctx(args)
    if args.copy_helper:
        from gpucr_hpc.shim import copy_helper
        sock = ctx.root / "copy-helper.sock"
        helper = copy_helper.spawn(sock)
        atexit.register(helper.kill)
        ctx.cli_env["GPUCR_COPY_HELPER"] = str(sock)
    res = {"date": utc_now(),
           "device": smi("name")[0], "driver": smi("driver_version")[0], "image_root": str(ctx.root),
           "args": vars(args), "compile_mode": os.environ.get("COMPILE_MODE")}
    try:
        import torch
        res["torch"] = torch.__version__
    except ImportError:
        pass
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    def save():  # after each part, so a run cut short still says how far it got
        res["checks"] = checks(res)
        write_record(args.out, res, indent=2, sort_keys=True)

    res["reference"] = reference(ctx)

    def fs_rates(suffix=""):  # as much as the GPU data
        fs = rates(ctx.root, int(args.ballast_gib * 2**30) + (256 << 20))
        res["fs_write" + suffix] = {"bytes": fs["bytes"], "MBps": fs["write_MBps"],
                                    **{k: v for k, v in fs.items() if k.startswith("write_")}}
        res["fs_read" + suffix] = {"bytes": fs["bytes"], "MBps": fs["read_MBps"], "page_cache": "dropped",
                                   **{k: v for k, v in fs.items() if k.startswith("read_")}}

    fs_rates()
    save()
    only = set(args.only or ["kill", "leave_running"])
    if "kill" in only:
        res["kill"] = scenario_kill(ctx, between=lambda: fs_rates("_between"))
        fs_rates("_after")
        save()
    if "leave_running" in only:
        res["leave_running"] = scenario_leave_running(ctx, args.again)
        save()
    if not args.keep:
        shutil.rmtree(ctx.root, ignore_errors=True)
    bad = [k for k, v in res["checks"].items() if not v]
    print(json.dumps(res["checks"], indent=1))
    print("FAILED: " + ", ".join(bad) if bad else "all checks passed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
