#!/usr/bin/env python3
"""Tunes the shim's bounce data path on a GPU machine, in stages,
each measured with bench/bench_shim_vs_driver.py (gpucr only, one footprint):

  1. stores x waits from the previous defaults (16 threads, 32 MiB slots):
     GPUCR_COPY_NT (0, out, both) x GPUCR_COPY_WAIT (spin, block);
  2. the best of stage 1 with other slot sizes (GPUCR_COPY_SLOT_MIB);
  3. the best so far with other copy thread counts (GPUCR_COPY_THREADS).

"Best" is the smallest checkpoint + restore time of the last cycle: a smaller
ring also makes the driver's control step cheaper (it is pinned memory), so
the data rate alone is not the score. Writes every run and the choice to
OUT/tune.json and `export ...` lines to OUT/tuned.env for the bench after it.

    bench/datapath_tune.py --gib 16 --out DIR [--deadline SECONDS]
    bench/datapath_tune.py --grid "15:8:out:block 15:8:both:block" ...   (named configurations only)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common.record import write_record

BENCH = Path(__file__).resolve().parent / "bench_shim_vs_driver.py"
KNOBS = ("GPUCR_COPY_THREADS", "GPUCR_COPY_SLOT_MIB", "GPUCR_COPY_NT", "GPUCR_COPY_WAIT")
# where stage 1 starts: the shim's defaults before this tune (16 threads, 32 MiB slots)
STAGE1_BASE = dict(zip(KNOBS, ("16", "32", "0", "spin")))


def knob_env(spec: str) -> dict:
    """THREADS:SLOT_MIB:NT:WAIT as the GPUCR_COPY_ variables (also datapath_ab.py's --config)."""
    parts = spec.split(":")
    if len(parts) != len(KNOBS):
        raise SystemExit(f"{spec}: want THREADS:SLOT_MIB:NT:WAIT, e.g. 15:8:out:block")
    return dict(zip(KNOBS, parts))


def measure(env_over: dict, gib: float, out: Path, log) -> dict:
    tag = "-".join(f"{k.split('_')[-1].lower()}{v}" for k, v in sorted(env_over.items()))
    path = out / f"tune-{tag}.json"
    env = {**os.environ, **env_over}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(BENCH), "--sizes", str(gib),
                        "--no-driver", "--raw-gib", "0", "--out", str(path)],
                       env=env, capture_output=True, text=True, timeout=240)
    row = {"env": env_over, "wall_s": round(time.monotonic() - t0, 1)}
    try:
        fp = json.loads(path.read_text())["footprints"][0]["gpucr"]
        c = fp["cycles"][-1]
        ck, rs = c["checkpoint"], c["restore"]
        gb = c["bytes"] / 1e9
        row.update(checkpoint_s=ck["total_s"], checkpoint_data_s=ck["data_s"], checkpoint_control_s=ck["control_s"],
                   restore_s=rs["total_s"], restore_data_s=rs["data_s"], restore_control_s=rs["control_s"],
                   out_GBps=round(gb / ck["data_s"], 2), in_GBps=round(gb / rs["data_s"], 2),
                   staging_bytes=fp["one_time"].get("staging_bytes"), shim=ck["shim"],
                   score_s=round(ck["total_s"] + rs["total_s"], 4))
    except (OSError, KeyError, IndexError, ValueError) as e:
        row["error"] = f"{type(e).__name__}: {e}; {r.stderr[-400:]}"
    log(row)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=16)
    ap.add_argument("--out", required=True)
    ap.add_argument("--slots", default="2 4 8 64", help="stage 2: slot sizes in MiB besides the default")
    ap.add_argument("--threads", default="12 15", help="stage 3: thread counts besides the default")
    ap.add_argument("--deadline", type=float, default=300, help="seconds: no new run starts after this")
    ap.add_argument("--grid", default="", help="instead of the stages: THREADS:SLOT_MIB:NT:WAIT ...")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_end = time.monotonic() + args.deadline
    runs: list[dict] = []

    def log(row):
        keys = ("checkpoint_s", "restore_s", "out_GBps", "in_GBps", "checkpoint_control_s", "restore_control_s")
        print(json.dumps(row["env"]), " ".join(f"{k}={row.get(k)}" for k in keys), row.get("error", ""), flush=True)

    def run(over):
        if time.monotonic() > t_end:
            return None
        row = measure(over, args.gib, out, log)
        runs.append(row)
        return row

    def best():
        ok = [r for r in runs if "score_s" in r]
        return min(ok, key=lambda r: r["score_s"]) if ok else None

    if args.grid:
        for spec in args.grid.split():
            run(knob_env(spec))
    else:
        for nt in ("0", "out", "both"):
            for wait in ("spin", "block"):
                run({**STAGE1_BASE, "GPUCR_COPY_NT": nt, "GPUCR_COPY_WAIT": wait})
        for slot in args.slots.split():
            b = best()
            if b:
                run({**b["env"], "GPUCR_COPY_SLOT_MIB": slot})
        for th in args.threads.split():
            b = best()
            if b:
                run({**b["env"], "GPUCR_COPY_THREADS": th})
    b = best()
    write_record(out / "tune.json", {"gib": args.gib, "default": STAGE1_BASE, "runs": runs,
                                     "best": b["env"] if b else None})
    if not b:
        print("tune: no run succeeded", file=sys.stderr)
        return 1
    (out / "tuned.env").write_text("export " + " ".join(f"{k}={v}" for k, v in b["env"].items()) + "\n")
    print("best:", json.dumps(b["env"]), f"checkpoint {b['checkpoint_s']:.3f} s, restore {b['restore_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
