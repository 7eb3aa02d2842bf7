#!/usr/bin/env python3
"""The tables of site/docs/results.md, generated from the committed JSON in bench/results/.

    python3 site/results_tables.py          rewrite every generated block in results.md
                                            and copy the plots it shows to site/docs/img/
    python3 site/results_tables.py --check  exit 1 if a block or a plot is not current

A generated block sits between `<!-- BEGIN name -->` and `<!-- END name -->`;
the prose around it is written by hand and left alone. A figure a JSON file
does not have is shown as "—", never guessed. Every JSON file of every run
stays in bench/results/; the page shows the headline runs only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import doc_blocks  # beside this script

SITE = Path(__file__).resolve().parent
REPO = SITE.parent
RESULTS = REPO / "bench" / "results"
DOC = SITE / "docs" / "results.md"
IMG = SITE / "docs" / "img"
BOUNCE = "shim-vs-driver-h100.json"             # the default data path
HELPER = "shim-vs-driver-h100-helper-run7.json"  # the copy helper, the run whose plot is shown
HELPER_RUNS = [("run 7", HELPER), ("run 8", "shim-vs-driver-h100-helper-run8.json"),
               ("run 9", "shim-vs-driver-h100-helper-run9.json"),
               ("run 10", "shim-vs-driver-h100-helper-run10.json")]
PLOTS = ["shim-vs-driver-h100.png", "shim-vs-driver-h100-helper-run7.png", "steady-state-h100.png"]
MISSING = "—"


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def get(d, path: str):
    """d["a"]["b"] for "a.b"; None where any part is missing."""
    for key in path.split("."):
        if not isinstance(d, dict) or key not in d or d[key] is None:
            return None
        d = d[key]
    return d


def s(v, digits=2) -> str:
    return MISSING if v is None else f"{v:.{digits}f} s"


def mib(v) -> str:
    return MISSING if v is None else f"{v} MiB"


def gib(v) -> str:
    return MISSING if v is None else f"{v / 2**30:.2f} GiB"


def yes(v) -> str:
    return MISSING if v is None else ("yes" if v else "**no**")


def pct(v) -> str:
    return MISSING if v is None else f"{v:+.2f} %"


def share(v) -> str:
    return MISSING if v is None else f"{100 * v:.0f} %"


def gbps(v) -> str:
    return MISSING if v is None else f"{v:.1f} GB/s"


def times(v) -> str:
    """How many times faster than the driver-only path, from gpucr-hpc's time / driver-only time."""
    return MISSING if not v else f"{1 / v:.1f}×"


def ratio2(v) -> str:
    return MISSING if v is None else f"{v:.2f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def measured(d: dict, name: str) -> str:
    return (f"{d.get('device', MISSING)}, driver {d.get('driver', MISSING)}, "
            f"{(d.get('date') or MISSING)[:16].replace('T', ' ')}: `bench/results/{name}`")


def last_cycle(fp: dict) -> dict:
    return (get(fp, "gpucr.cycles") or [{}])[-1]


# -- the blocks -------------------------------------------------------------------

def data_path() -> str:
    """One process in place, gpucr-hpc against the driver-only path and the raw copy rate:
    the default path and the copy helper, each against the driver-only run of its own file."""
    b, h = load(BOUNCE), load(HELPER)
    hb = {fp["gib"]: fp for fp in h.get("footprints", [])}
    head = [f"* default path: {measured(b, BOUNCE)}",
            f"* copy helper: {measured(h, HELPER)}",
            f"* raw pinned copy, 8 GiB, same runs: {gbps(get(b, 'raw_pinned.d2h_GBps'))} out, "
            f"{gbps(get(b, 'raw_pinned.h2d_GBps'))} in; {gbps(get(h, 'raw_pinned.d2h_GBps'))} out, "
            f"{gbps(get(h, 'raw_pinned.h2d_GBps'))} in", ""]

    def row(fp, way):
        g = hb.get(fp["gib"], {})
        c, ch = last_cycle(fp), last_cycle(g)
        if way == "checkpoint":
            ours, drv, rel = get(c, "checkpoint.total_s"), get(fp, "driver_only.checkpoint_s"), \
                get(fp, "ratios.checkpoint_total_vs_driver")
            hours, hdrv, hrel = get(ch, "checkpoint.total_s"), get(g, "driver_only.checkpoint_s"), \
                get(g, "ratios.checkpoint_total_vs_driver")
            floor, rate = get(fp, "ratios.physics_floor_out_s"), get(g, "ratios.data_out_vs_raw")
            back = f"{s(get(c, 'vram.data_handed_back_s'))} · {s(get(ch, 'vram.data_handed_back_s'))}"
        else:
            ours, drv, rel = get(c, "restore.total_s"), get(fp, "driver_only.restore_s"), \
                get(fp, "ratios.restore_total_vs_driver")
            hours, hdrv, hrel = get(g, "ratios.restore_prefilled_s"), get(g, "driver_only.restore_s"), \
                get(g, "ratios.restore_prefilled_vs_driver")
            floor, rate = get(fp, "ratios.physics_floor_in_s"), get(g, "ratios.data_in_vs_raw")
            back = None
        cells = [f"{fp['gib']:g} GiB", s(floor), f"{s(drv)} · {s(hdrv)}", f"{s(ours)} ({times(rel)})",
                 f"{s(hours)} ({times(hrel)})", share(rate)]
        return cells + ([back] if back is not None else [])

    fps = b.get("footprints", [])
    ck = table(["GPU data", "the bytes at raw rate", "driver only", "gpucr-hpc, default",
                "gpucr-hpc, copy helper", "helper's data step, share of raw", "GPU data off the GPU after"],
               [row(fp, "checkpoint") for fp in fps])
    rs = table(["GPU data", "the bytes at raw rate", "driver only", "gpucr-hpc, default",
                "gpucr-hpc, copy helper (prefilled)", "helper's data step, share of raw"],
               [row(fp, "restore") for fp in fps])
    ident = all(fp.get("bit_identical") for d in (b, h) for fp in d.get("footprints", []))
    tail = [f"Program output identical to the driver-only run's at every footprint of both runs: {yes(ident)}."]
    return "\n".join(head + ["Checkpoint in place:", "", ck, "", "Restore in place:", "", rs, ""] + tail)


def helper_runs() -> str:
    """The copy helper runs of the same code, back to back: how much they vary."""
    rows = []
    for label, name in HELPER_RUNS:
        d = load(name)
        for fp in d.get("footprints", []):
            if fp.get("gib") != 70:
                continue
            rows.append([f"{label}, {(d.get('date') or '')[11:16]}", s(get(fp, "driver_only.checkpoint_s")),
                         s(get(last_cycle(fp), "checkpoint.total_s")), s(get(fp, "driver_only.restore_s")),
                         s(get(fp, "ratios.restore_prefilled_s")), share(get(fp, "ratios.data_out_vs_raw")),
                         share(get(fp, "ratios.data_in_vs_raw"))])
    return table(["run (2026-11-25, UTC)", "checkpoint, driver only", "checkpoint, gpucr-hpc",
                  "restore, driver only", "restore, gpucr-hpc", "data out, share of raw", "data in, share of raw"],
                 rows)


def job_gpu_slurm() -> str:
    name, fast = "job-gpu-slurm-h100.json", "job-gpu-slurm-fast-path-h100.json"
    d, f = load(name), load(fast)
    cols = [(d, "preempt", "root, `preempt`"), (d, "user_preempt", "ordinary user, `preempt`"),
            (d, "urgent", "urgent job, no command"), (f, "fast_path", "root, `preempt`, fast path")]
    w = d.get("workload", {})
    head = [f"* first three columns: {measured(d, name)}",
            f"* last column: {measured(f, fast)}",
            f"* workload: `{w.get('script')}`, {w.get('ballast_gib')} GiB of ballast on the GPU; "
            f"the same run without gpucr-hpc took {s(d.get('reference_s'))}", ""]
    spec = [
        ("image size", "image_bytes", gib),
        ("`gpucr-hpc preempt`, wall time", "preempt_cli_s", s),
        ("GPU data out of the GPU", "units.batch.gpu_data_s", s),
        ("GPU memory yielded after", "units.batch.gpu_released_s", s),
        ("GPU memory in use while requeued", "vram_min_mib_while_requeued", mib),
        ("running again after", "running_again_after_s", s),
        ("restore of the batch tree", "restore_s", s),
        ("training again after", "training_again_after_s", s),
        ("output bit-identical to the uninterrupted run", "bit_identical", yes),
        ("every step exactly once", "steps_once", yes),
    ]
    rows = [[label] + [fmt(get(src.get(k, {}), path)) for src, k, _ in cols] for label, path, fmt in spec]
    return "\n".join(head + [table([""] + [c for _, _, c in cols], rows)])


MIGRATION_FILES = [("migrate-gpu-h100-2g.json", "root"), ("nonroot-gpu-h100.json", "ordinary user"),
                   ("migrate-gpu-h100-8g-shm.json", "root")]


def migration() -> str:
    data = [(f, who, load(f)) for f, who in MIGRATION_FILES]
    head = [f"* {measured(d, f)}" for f, _, d in data] + [""]
    spec = [
        ("image size", lambda d: gib(get(d, "kill.checkpoint.bytes"))),
        ("`checkpoint --pid --to`, total", lambda d: s(get(d, "kill.checkpoint.timings.total_s"))),
        ("&nbsp;&nbsp;GPU memory yielded after", lambda d: s(get(d, "kill.checkpoint.timings.gpu_released_s"))),
        ("`restore --from`, total", lambda d: s(get(d, "kill.restore.timings.total_s"))),
        ("restored output bit-identical", lambda d: yes(get(d, "checks.kill_restored_bit_identical"))),
        ("GPU data (.h5) write rate / the file system's", lambda d: ratio2(d.get("h5_write_vs_fs_write"))),
        ("GPU data (.h5) read rate / the file system's", lambda d: ratio2(d.get("h5_read_vs_fs_read"))),
    ]
    header = [""] + [f"{get(d, 'args.ballast_gib')} GiB, {who}" for _, who, d in data]
    return "\n".join(head + [table(header, [[label] + [fn(d) for _, _, d in data] for label, fn in spec])])


def gpu_remap() -> str:
    name = "gpu-remap-h200x2.json"
    d = load(name)
    models = sorted({g.get("model") for g in d.get("gpus", [])} - {None})
    cols = [("forced", "`--gpu 1`"), ("auto", "automatic, only GPU 1 usable"), ("swap", "`--gpu 1,0`")]
    checks = d.get("checks") or {}
    head = [f"* {len(d.get('gpus', []))} × {', '.join(models) or MISSING}, "
            f"{(d.get('date') or MISSING)[:16].replace('T', ' ')}: `bench/results/{name}`", ""]
    rows = [
        ["`checkpoint --pid --to`, total"] + [s(get(d, f"{k}.checkpoint.timings.total_s")) for k, _ in cols],
        ["`restore --from`, total"] + [s(get(d, f"{k}.restore.timings.total_s")) for k, _ in cols],
        ["output bit-identical"] + [yes(checks.get(f"{k}_bit_identical")) for k, _ in cols],
    ]
    return "\n".join(head + [table([""] + [c for _, c in cols], rows)])


def steady_state() -> str:
    """Both steady-state runs in one table: the first (three workloads) and the
    longer run of the launch-bound `cuda_c` alone."""
    names = ("steady-state-h100.json", "steady-state-h100-launch-bound.json")
    head, rows = [], []
    for name in names:
        d = load(name)
        head.append(f"* {measured(d, name)}; PyTorch {d.get('torch_version', MISSING)}, "
                    f"CuPy {d.get('cupy_version', MISSING)}")
        for w in d.get("workloads", []):
            rows.append([
                f"`{w['workload']}`",
                str(len(w.get("rounds", []))),
                MISSING if w.get("base_median_ms") is None else f"{w['base_median_ms']:.3f} ms",
                MISSING if w.get("shim_median_ms") is None else f"{w['shim_median_ms']:.3f} ms",
                f"{pct(w.get('overhead_pct_mean_of_rounds'))} "
                f"[{pct(w.get('overhead_pct_mean_ci95_low'))}, {pct(w.get('overhead_pct_mean_ci95_high'))}]",
            ])
    return "\n".join(head + ["", table(["workload", "rounds", "median step, without shim", "with shim",
                                        "overhead, mean of rounds [95 % CI]"], rows)])


BLOCKS = {
    "data-path": data_path,
    "helper-runs": helper_runs,
    "job-gpu-slurm": job_gpu_slurm,
    "migration": migration,
    "gpu-remap": gpu_remap,
    "steady-state": steady_state,
}


def render(text: str) -> str:
    for name, fn in BLOCKS.items():
        text = doc_blocks.fill(text, name, fn(), f"results_tables: {DOC}")
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check that results.md and the plots are current")
    a = ap.parse_args()
    old = DOC.read_text()
    new = render(old)
    stale = [f"{DOC.relative_to(REPO)}"] if new != old else []
    for p in PLOTS:
        src, dst = RESULTS / p, IMG / p
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            stale.append(str(dst.relative_to(REPO)))
            if not a.check:
                IMG.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
    if a.check:
        if stale:
            print(f"results_tables: not current: {', '.join(stale)}; run python3 site/results_tables.py",
                  file=sys.stderr)
            return 1
        return 0
    if new != old:
        DOC.write_text(new)
    print(f"results_tables: {'updated ' + ', '.join(stale) if stale else 'everything current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
