#!/usr/bin/env python3
"""GPU verification of restore onto another GPU, on a machine
with two GPUs of one model.

The deterministic PyTorch loop of gpu-checks/migrate_gpu_verify.py (its workload, CLI
calls and output comparison are reused) is run
  0. reference: without the shim, uninterrupted, on GPU 0;
  1. forced: under the shim, seeing GPU 0 only (CUDA_VISIBLE_DEVICES=0), checkpointed
             to disk at step K (`checkpoint --pid --to IMG`, the process is gone), and
             restored with `restore --from IMG --gpu 1`;
  2. auto:   the same, restored without --gpu by a command that may use GPU 1 only
             (CUDA_VISIBLE_DEVICES=1, as a Slurm step given the other GPU): the plan
             must move it by itself;
  3. swap:   the loop sees both GPUs (CUDA_VISIBLE_DEVICES=0,1; it works on ordinal 0)
             and is restored with `--gpu 1,0`: both GPUs mapped, ordinals kept.
Each restored run must go on bit-identical to the reference; its GPU memory must be on
GPU 1 (nvidia-smi right after the restore, while it runs) and none of it on GPU 0;
the restore report must name GPU 1; the image must record the GPUs the process saw.
Writes one JSON (device, checkpoint and restore times, GPU before/after, checks) after
every scenario, prints each step, exits 1 if a check failed and 2 if this machine has
no two GPUs of one model.

    python3 gpu-checks/gpu_remap_verify.py --out bench/results/gpu-remap.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "bench"))  # common: what the benchmarks and the GPU checks share
import migrate_gpu_verify as mv  # noqa: E402 - workload, CLI calls, restore + output comparison
from common.machine import smi_rows  # noqa: E402
from common.record import utc_now, write_record  # noqa: E402
from common.timing import wait_until  # noqa: E402

from gpucr_hpc.store import gpu_data  # noqa: E402

SCENARIOS = {
    # workload's CUDA_VISIBLE_DEVICES, restore options, restore command's environment
    "forced": ("0", ["--gpu", "1"], {}),
    "auto": ("0", [], {"CUDA_VISIBLE_DEVICES": "1"}),
    "swap": ("0,1", ["--gpu", "1,0"], {}),
}


def log(msg: str) -> None:
    print(f"== {time.strftime('%H:%M:%S')} {msg}", flush=True)


def gpus() -> list[dict]:
    """index, uuid, model and memory used (MiB) of every GPU, by index."""
    try:
        listed = smi_rows("index,uuid,name,memory.used")
    except OSError:
        return []
    rows = []
    for cells in listed:
        if len(cells) >= 4:
            rows.append({"index": int(cells[0]), "uuid": cells[1], "model": ", ".join(cells[2:-1]),
                         "used_mib": int(cells[-1])})
    return sorted(rows, key=lambda g: g["index"])


def compute_apps() -> dict[int, list[str]]:
    """PID -> UUIDs of the GPUs nvidia-smi sees it on (empty where it cannot see PIDs)."""
    r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=60)
    out: dict[int, list[str]] = {}
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[0].isdigit():
            out.setdefault(int(cells[0]), []).append(cells[1])
    return out


def growth(idle: list[dict], now: list[dict]) -> list[int]:
    """MiB used per GPU above the idle baseline."""
    return [n["used_mib"] - i["used_mib"] for i, n in zip(idle, now)]


def scenario(ctx: mv.Ctx, name: str, idle: list[dict]) -> dict:
    visible, restore_args, restore_env = SCENARIOS[name]
    res: dict = {"workload_cuda_visible_devices": visible, "restore_args": restore_args,
                 "restore_env": restore_env}
    p, out, err = ctx.start(name, shim=True, env={"CUDA_VISIBLE_DEVICES": visible})
    restored: list[int] = []
    try:
        wait_until(lambda: mv.steps(out) >= ctx.args.checkpoint_at or p.poll() is not None,
                   ctx.args.timeout, "the shimmed run to reach the checkpoint step")
        before = growth(idle, gpus())
        res["gpu_mib_before"] = before
        res["gpu_before"] = before.index(max(before))
        log(f"{name}: step {mv.steps(out)}, GPU memory above idle {before} MiB: checkpoint --to")
        img = ctx.root / f"img-{name}"
        cp = mv.cli(ctx.cli_env, "checkpoint", "--pid", str(p.pid), "--to", str(img))
        p.wait(timeout=30)  # reaped: its PID is free for the restore
        m = json.loads((img / "manifest.json").read_text())
        res["image_gpu_uuids"] = [r.get("gpu_uuids") for r in m["gpu_processes"] if r.get("cuda")]
        res["h5_device_uuids"] = [gpu_data.file_attrs(img / r["h5"]).get("device_uuids")
                                  for r in m["gpu_processes"] if r.get("h5")]
        res["checkpoint"] = {k: cp[k] for k in ("timings", "cli_wall_s", "bytes", "gpu_bytes")}
        res["gpu_mib_after_checkpoint"] = growth(idle, gpus())
        log(f"{name}: checkpointed in {cp['timings']['total_s']:.2f} s ({cp['gpu_bytes'] / 2**30:.2f} GiB GPU "
            f"data), GPU memory above idle now {res['gpu_mib_after_checkpoint']} MiB; "
            f"restore --from {' '.join(restore_args)} {restore_env or ''}")

        def running(rep):
            restored.append(rep["pid"])
            now = growth(idle, gpus())
            res["gpu_mib_after_restore"] = now
            res["gpu_after"] = now.index(max(now))
            res["compute_apps_of_restored"] = compute_apps().get(rep["pid"])

        rr = mv.restore(ctx, img, out, *restore_args, env=restore_env, running=running)
        res["restore"] = {k: rr[k] for k in ("timings", "cli_wall_s", "gpus", "gpu_moved", "pid",
                                             "output_identical", "image_unchanged") if k in rr}
        if "first_difference" in rr:
            res["restore"]["first_difference"] = rr["first_difference"]
        log(f"{name}: restored in {rr['timings']['total_s']:.2f} s onto {rr.get('gpus')}, GPU memory above "
            f"idle {res.get('gpu_mib_after_restore')} MiB; bit-identical: {rr['output_identical']}")
    except Exception as e:  # noqa: BLE001 - reported with the process's stderr
        res["error"] = f"{type(e).__name__}: {e}"
        log(f"{name}: FAILED: {res['error']}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in restored:  # a restored run left behind by a failure
            if mv.alive(pid):
                os.kill(pid, 9)
    res["stderr_tail"] = err.read_text(errors="replace")[-1500:]
    return res


def checks(res: dict) -> dict:
    ck = {"reference_ok": "error" not in res["reference"]}
    uuid = [g["uuid"] for g in res["gpus"]]
    ballast_mib = res["args"]["ballast_gib"] * 1024
    for name in SCENARIOS:
        s = res.get(name)
        if s is None:
            continue
        rr = s.get("restore") or {}
        dev0 = ((rr.get("gpus") or [{}])[0].get("gpus") or [{}])[0]
        sees = [uuid[int(i)] for i in SCENARIOS[name][0].split(",")]
        after = s.get("gpu_mib_after_restore") or [0, 0]
        ck[f"{name}_no_error"] = "error" not in s
        ck[f"{name}_ran_on_gpu0_before"] = s.get("gpu_before") == 0
        ck[f"{name}_image_records_its_gpus"] = (s.get("image_gpu_uuids") == [sees]
                                                 and s.get("h5_device_uuids") == [sees])
        ck[f"{name}_report_says_gpu1"] = (dev0.get("index") == 1 and dev0.get("uuid") == uuid[1]
                                          and bool(dev0.get("moved")))
        ck[f"{name}_memory_on_gpu1_not_gpu0"] = (s.get("gpu_after") == 1 and after[1] >= 0.9 * ballast_mib
                                                 and after[0] < 0.25 * ballast_mib)
        ck[f"{name}_bit_identical"] = bool(rr.get("output_identical"))
        ck[f"{name}_image_unchanged"] = bool(rr.get("image_unchanged"))
    return ck


def figures(res: dict) -> dict:
    out = {}
    for name in SCENARIOS:
        s = res.get(name) or {}
        cp, rr = s.get("checkpoint") or {}, s.get("restore") or {}
        if cp and rr:
            out[name] = {"gpu_before": s.get("gpu_before"), "gpu_after": s.get("gpu_after"),
                         "gpu_bytes": cp.get("gpu_bytes"), "checkpoint_s": cp["timings"].get("total_s"),
                         "gpu_released_s": cp["timings"].get("gpu_released_s"),
                         "restore_s": rr["timings"].get("total_s"),
                         "restore_driver_s": rr["timings"].get("gpu_control_s"),
                         "restore_gpu_s": rr["timings"].get("gpu_restore_s"),
                         "bit_identical": rr.get("output_identical")}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--image-root", default=None, help="where images go (default: a new dir in /var/tmp)")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--checkpoint-at", type=int, default=15)
    ap.add_argument("--ballast-gib", type=float, default=2.0)
    ap.add_argument("--pace", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--only", nargs="*", default=None, choices=list(SCENARIOS))
    ap.add_argument("--keep", action="store_true", help="keep the images")
    ap.set_defaults(arena=None, arena_size=None)
    args = ap.parse_args()
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # each run says which GPUs it sees
    here = gpus()
    res = {"date": utc_now(),
           "gpus": here, "args": vars(args)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    def save():  # after each part, so a run cut short still says how far it got
        res["checks"] = checks(res) if "reference" in res else {}
        res["figures"] = figures(res)
        write_record(args.out, res, indent=2, sort_keys=True)

    if len(here) < 2 or here[0]["model"] != here[1]["model"]:
        res["skipped"] = f"needs two GPUs of one model, nvidia-smi lists {[g['model'] for g in here]}"
        save()
        log(res["skipped"])
        sys.exit(2)
    log(f"GPUs: {[(g['index'], g['model'], g['uuid'], g['used_mib']) for g in here]}")
    ctx = mv.Ctx(args)
    try:
        import torch
        res["torch"] = torch.__version__
    except ImportError:
        pass
    log(f"reference run ({args.steps} steps, {args.ballast_gib} GiB ballast, no shim)")
    res["reference"] = mv.reference(ctx)
    log(f"reference: {res['reference'].get('seconds')} s, {res['reference'].get('checksum')}")
    save()
    idle = gpus()
    for name in args.only or list(SCENARIOS):
        res[name] = scenario(ctx, name, idle)
        save()
    if not args.keep:
        shutil.rmtree(ctx.root, ignore_errors=True)
    bad = [k for k, v in res["checks"].items() if not v]
    print(json.dumps({"figures": res["figures"], "checks": res["checks"]}, indent=1))
    log("FAILED: " + ", ".join(bad) if bad else "all checks passed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
