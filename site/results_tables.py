#!/usr/bin/env python3
"""The tables of site/docs/results.md, generated from the committed JSON in bench/results/.

    python3 site/results_tables.py          rewrite every generated block in results.md
                                            and copy the plots it shows to site/docs/img/
    python3 site/results_tables.py --check  exit 1 if a block or a plot is not current

A generated block sits between `<!-- BEGIN name -->` and `<!-- END name -->`;
the prose around it is written by hand and left alone. A figure a JSON file
does not have is shown as "—", never guessed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parent
REPO = SITE.parent
RESULTS = REPO / "bench" / "results"
DOC = SITE / "docs" / "results.md"
IMG = SITE / "docs" / "img"
PLOTS = ["shim-vs-driver-h100.png", "steady-state-h100.png", "steady-state-h100-launch-bound.png"]
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


def mbps(v) -> str:
    return MISSING if v is None else f"{v:.0f} MB/s"


def yes(v) -> str:
    return MISSING if v is None else ("yes" if v else "**no**")


def pct(v) -> str:
    return MISSING if v is None else f"{v:+.2f} %"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def measured(d: dict, name: str) -> str:
    return (f"Measured on {d.get('device', MISSING)}, driver {d.get('driver', MISSING)}, "
            f"{d.get('date', MISSING)}; from `bench/results/{name}`.")


# -- the blocks -------------------------------------------------------------------

def job_gpu_slurm() -> str:
    name = "job-gpu-slurm-h100.json"
    d = load(name)
    cols = [("preempt", "root, `gpucr-hpc preempt`"),
            ("user_preempt", "ordinary user, `gpucr-hpc preempt`"),
            ("urgent", "urgent job, no command")]
    w = d.get("workload", {})
    head = [measured(d, name) + f" PyTorch {d.get('torch', MISSING)}.",
            "",
            f"Workload: `{w.get('script')}`, {w.get('steps')} steps, {w.get('ballast_gib')} GiB of "
            f"ballast on the GPU, {w.get('pace_s')} s pause per step, preempted at step "
            f"{w.get('preempt_at_step')} or later. The same run without gpucr-hpc took "
            f"{s(d.get('reference_s'))}.",
            ""]

    def rows(spec):
        return [[label] + [fmt(get(d.get(k, {}), path)) for k, _ in cols] for label, path, fmt in spec]

    ckpt = [
        ("job owner", "user", lambda v: v or MISSING),
        ("image size", "image_bytes", gib),
        ("`gpucr-hpc preempt`, wall time", "preempt_cli_s", s),
        ("checkpoint, all agents", "checkpoint_total_s", s),
        ("GPU data into the host arena", "units.batch.gpu_data_s", s),
        ("GPU data written to the image (.h5)", "units.batch.gpu_h5_write_s", s),
        ("driver checkpoint (control state)", "units.batch.gpu_control_s", s),
        ("GPU memory handed back after", "units.batch.gpu_released_s", s),
        ("CRIU dump", "units.batch.dump_s", s),
        ("process held (until the dump ended)", "units.batch.released_s", s),
        ("GPU state put back into the running job", "units.batch.gpu_resume_s", s),
        ("CRIU files written to the image store", "units.batch.persist_s", s),
        ("`scontrol requeue`", "requeue_s", s),
    ]
    restart = [
        ("requeued after", "requeued_after_s", s),
        ("running again after", "running_again_after_s", s),
        ("restored after", "restored_after_s", s),
        ("training again after", "training_again_after_s", s),
        ("restore of the batch tree", "restore_s", s),
        ("&nbsp;&nbsp;checksums verified", "restore_timings.verify_s", s),
        ("&nbsp;&nbsp;CRIU restore", "restore_timings.criu_restore_s", s),
        ("&nbsp;&nbsp;driver restore", "restore_timings.gpu_control_s", s),
        ("&nbsp;&nbsp;host arena re-created", "restore_timings.gpu_attach_s", s),
        ("&nbsp;&nbsp;.h5 read into the arena", "restore_timings.gpu_h5_read_s", s),
        ("&nbsp;&nbsp;data back to the GPU", "restore_timings.gpu_data_s", s),
        ("output bit-identical to the uninterrupted run", "bit_identical", yes),
        ("every step exactly once", "steps_once", yes),
    ]
    vram = [
        ("GPU idle, before the job", "vram_mib_idle", mib),
        ("job running, before the checkpoint", "vram_mib_before", mib),
        ("lowest during the checkpoint", "vram_min_mib_during_checkpoint", mib),
        ("lowest while the job was requeued", "vram_min_mib_while_requeued", mib),
        ("after the restore", "vram_mib_after_restore", mib),
    ]
    header = [""] + [c for _, c in cols]
    return "\n".join(head + [
        "Checkpoint (the phases are those of the job's one unit, `batch`):", "",
        table(header, rows(ckpt)), "",
        "Requeue and restore (\"after\": from the start of `gpucr-hpc preempt`, or from the "
        "submission of the urgent job):", "",
        table(header, rows(restart)), "",
        "GPU memory in use (`nvidia-smi`, GPU 0, sampled every 100 ms):", "",
        table(header, rows(vram))])


def migration() -> str:
    files = [("migrate-gpu-h100-2g.json", "root"),
             ("nonroot-gpu-h100.json", "ordinary user"),
             ("migrate-gpu-h100-8g-hugetlbfs.json", "root"),
             ("migrate-gpu-h100-8g-shm-first-version.json", "root, first version")]
    data = [(f, who, load(f)) for f, who in files]
    lines = []
    for f, _, d in data:
        lines.append(f"* `bench/results/{f}`: {d.get('device', MISSING)}, driver "
                     f"{d.get('driver', MISSING)}, {d.get('date', MISSING)}, PyTorch {d.get('torch', MISSING)}.")

    def arena(d):
        a = get(d, "args.arena") or "/dev/shm"
        size = get(d, "args.arena_size")
        return f"{a}, {size} preallocated" if size else a

    header = [""] + [f"{get(d, 'args.ballast_gib')} GiB, {who}" for _, who, d in data]
    spec = [
        ("arena", lambda d: arena(d)),
        ("images written to", lambda d: f"`{d.get('image_root')}`" if d.get("image_root") else MISSING),
        ("image size", lambda d: gib(get(d, "kill.checkpoint.bytes"))),
        ("&nbsp;&nbsp;GPU data (.h5)", lambda d: gib(get(d, "kill.checkpoint.gpu_bytes"))),
        ("&nbsp;&nbsp;CRIU files", lambda d: gib(get(d, "kill.checkpoint.criu_bytes"))),
        ("VRAM before / after the checkpoint",
         lambda d: f"{mib(get(d, 'kill.gpu_used_mib_before'))} / {mib(get(d, 'kill.gpu_used_mib_after_checkpoint'))}"),
        ("`checkpoint --pid --to`, wall time", lambda d: s(get(d, "kill.checkpoint.cli_wall_s"))),
        ("&nbsp;&nbsp;GPU data into the host arena", lambda d: s(get(d, "kill.checkpoint.timings.gpu_data_s"))),
        ("&nbsp;&nbsp;GPU data written to the image (.h5)",
         lambda d: f"{s(get(d, 'kill.checkpoint.timings.gpu_h5_write_s'))} "
                   f"({mbps(get(d, 'kill.checkpoint.timings.gpu_h5_MBps'))})"),
        ("&nbsp;&nbsp;arena out of the address space", lambda d: s(get(d, "kill.checkpoint.timings.gpu_detach_s"))),
        ("&nbsp;&nbsp;driver checkpoint", lambda d: s(get(d, "kill.checkpoint.timings.gpu_control_s"))),
        ("&nbsp;&nbsp;GPU memory handed back after", lambda d: s(get(d, "kill.checkpoint.timings.gpu_released_s"))),
        ("&nbsp;&nbsp;CRIU dump", lambda d: s(get(d, "kill.checkpoint.timings.dump_s"))),
        ("&nbsp;&nbsp;process gone after", lambda d: s(get(d, "kill.checkpoint.timings.released_s"))),
        ("&nbsp;&nbsp;CRIU files to the image", lambda d: s(get(d, "kill.checkpoint.timings.persist_s"))),
        ("&nbsp;&nbsp;total", lambda d: s(get(d, "kill.checkpoint.timings.total_s"))),
        ("file system's own write rate there", lambda d: mbps(get(d, "fs_write.MBps"))),
        (".h5 write rate / file system's", lambda d: MISSING if d.get("h5_write_vs_fs_write") is None
         else f"{d['h5_write_vs_fs_write']:.2f}"),
        ("`restore --from`, wall time", lambda d: s(get(d, "kill.restore.cli_wall_s"))),
        ("&nbsp;&nbsp;checksums verified", lambda d: s(get(d, "kill.restore.timings.verify_s"))),
        ("&nbsp;&nbsp;CRIU restore", lambda d: s(get(d, "kill.restore.timings.criu_restore_s"))),
        ("&nbsp;&nbsp;driver restore", lambda d: s(get(d, "kill.restore.timings.gpu_control_s"))),
        ("&nbsp;&nbsp;host arena re-created", lambda d: s(get(d, "kill.restore.timings.gpu_attach_s"))),
        ("&nbsp;&nbsp;.h5 read into the arena",
         lambda d: f"{s(get(d, 'kill.restore.timings.gpu_h5_read_s'))} "
                   f"({mbps(get(d, 'kill.restore.timings.gpu_h5_read_MBps'))})"),
        ("&nbsp;&nbsp;data back to the GPU", lambda d: s(get(d, "kill.restore.timings.gpu_data_s"))),
        ("&nbsp;&nbsp;total", lambda d: s(get(d, "kill.restore.timings.total_s"))),
        ("file system's own read rate there (page cache dropped)", lambda d: mbps(get(d, "fs_read.MBps"))),
        (".h5 read rate / file system's", lambda d: MISSING if d.get("h5_read_vs_fs_read") is None
         else f"{d['h5_read_vs_fs_read']:.2f}"),
        ("restored output bit-identical", lambda d: yes(get(d, "checks.kill_restored_bit_identical"))),
        ("image unchanged by the restore", lambda d: yes(get(d, "checks.kill_image_unchanged_by_restore"))),
    ]
    kill = table(header, [[label] + [fn(d) for _, _, d in data] for label, fn in spec])

    d = load("migrate-gpu-h100-2g.json")
    lr = d.get("leave_running") or {}
    again = lr.get("restore_again_new_pidns") or {}
    leave = table(["`--leave-running`, 2 GiB, root", ""], [
        ["`checkpoint --pid --to --leave-running`, wall time", s(get(lr, "checkpoint.cli_wall_s"))],
        ["GPU memory handed back after", s(get(lr, "checkpoint.timings.gpu_released_s"))],
        ["process held (until the dump ended)", s(get(lr, "checkpoint.timings.released_s"))],
        ["GPU state put back into the process", s(get(lr, "checkpoint.timings.gpu_resume_s"))],
        ["total", s(get(lr, "checkpoint.timings.total_s"))],
        ["the original ran to its end bit-identical", yes(get(d, "checks.leave_original_bit_identical"))],
        ["`restore --from --rewind-files`, total", s(get(lr, "restore.timings.total_s"))],
        ["&nbsp;&nbsp;restored output bit-identical", yes(get(d, "checks.leave_restored_bit_identical"))],
        ["restored again, `--pidns new`, total", s(get(again, "timings.total_s"))],
        ["&nbsp;&nbsp;PID namespace / PID inside",
         f"{again.get('pidns', MISSING)} / {again.get('ns_pid', MISSING)}"],
        ["&nbsp;&nbsp;restored output bit-identical", yes(get(d, "checks.again_new_pidns_bit_identical"))],
        ["&nbsp;&nbsp;image unchanged", yes(get(d, "checks.again_image_unchanged"))],
    ])
    return "\n".join(lines + ["", "Checkpoint to an image, process ended, restored from the image:", "",
                              kill, "", leave])


def share(v) -> str:
    return MISSING if v is None else f"{100 * v:.1f} %"


def gbps(v) -> str:
    return MISSING if v is None else f"{v:.1f} GB/s"


def ratio(v) -> str:
    """gpucr-hpc's time as a fraction of the driver-only time, and its inverse."""
    return MISSING if not v else f"{v:.3f} (1/{1 / v:.1f})"


def last_cycle(fp: dict) -> dict:
    return (get(fp, "gpucr.cycles") or [{}])[-1]


def first_cycle(fp: dict) -> dict:
    return (get(fp, "gpucr.cycles") or [{}])[0]


def setup_parts(fp: dict) -> tuple:
    """(create + pre-fault s, staging ring or pin s) from the line `gpucr-hpc run` printed."""
    for line in get(fp, "gpucr.one_time.run_stderr") or []:
        m = re.search(r"create \+ pre-fault ([0-9.]+) s, (?:staging ring|pin) ([0-9.]+) s", line)
        if m:
            return float(m.group(1)), float(m.group(2))
    return None, None


def threads_of(fp: dict):
    return get(last_cycle(fp), "checkpoint.shim.copy_threads")


def data_path() -> str:
    name = "shim-vs-driver-h100.json"
    d = load(name)
    raw = d.get("raw_pinned") or {}
    fps = d.get("footprints", [])
    opt = d.get("options") or {}
    threads = sorted({threads_of(fp) for fp in fps if threads_of(fp) is not None})
    pinned = sorted({get(fp, "gpucr.one_time.arena_pinned") for fp in fps} - {None})
    head = [measured(d, name) + f" {d.get('cpus', MISSING)} CPUs usable.",
            "",
            f"gpucr-hpc: arena in `{opt.get('arena', MISSING)}` "
            f"({'pinned' if pinned == [True] else 'not pinned' if pinned == [False] else MISSING}), "
            f"{', '.join(map(str, threads)) or MISSING} copy threads, "
            f"{opt.get('cycles', MISSING)} checkpoint/restore cycles per footprint: the table shows the last, "
            "and the first cycle's totals in their own rows. "
            f"Raw pinned copy rate, measured in the same run with {raw.get('gib', MISSING)} GiB: "
            f"device to host {gbps(raw.get('d2h_GBps'))}, host to device {gbps(raw.get('h2d_GBps'))}.",
            ""]
    spec = [
        ("GPU data moved", lambda fp, c: MISSING if c.get("bytes") is None
         else f"{gib(c['bytes'])} ({c['bytes'] / 1e9:.1f} GB)"),
        ("**checkpoint**, gpucr-hpc", lambda fp, c: s(get(c, "checkpoint.total_s"))),
        ("&nbsp;&nbsp;quiesce", lambda fp, c: s(get(c, "checkpoint.quiesce_s"), 4)),
        ("&nbsp;&nbsp;data: GPU to host arena, GPU memory released",
         lambda fp, c: s(get(c, "checkpoint.data_s"))),
        ("&nbsp;&nbsp;control: driver checkpoint", lambda fp, c: s(get(c, "checkpoint.control_s"))),
        ("checkpoint, driver only", lambda fp, c: s(get(fp, "driver_only.checkpoint_s"))),
        ("gpucr-hpc / driver only", lambda fp, c: ratio(get(fp, "ratios.checkpoint_total_vs_driver"))),
        ("first cycle: checkpoint, gpucr-hpc", lambda fp, c: s(get(first_cycle(fp), "checkpoint.total_s"))),
        ("VRAM in use after the checkpoint, gpucr-hpc / driver only",
         lambda fp, c: f"{mib(c.get('used_mib_after_checkpoint'))} / "
                       f"{mib(get(fp, 'driver_only.used_mib_after_checkpoint'))}"),
        ("**restore**, gpucr-hpc", lambda fp, c: s(get(c, "restore.total_s"))),
        ("&nbsp;&nbsp;control: driver restore", lambda fp, c: s(get(c, "restore.control_s"))),
        ("&nbsp;&nbsp;data: host arena to GPU", lambda fp, c: s(get(c, "restore.data_s"))),
        ("restore, driver only", lambda fp, c: s(get(fp, "driver_only.restore_s"))),
        ("gpucr-hpc / driver only", lambda fp, c: ratio(get(fp, "ratios.restore_total_vs_driver"))),
        ("first cycle: restore, gpucr-hpc", lambda fp, c: s(get(first_cycle(fp), "restore.total_s"))),
        ("**data rate** out (GPU to host), share of raw pinned",
         lambda fp, c: f"{gbps(get(fp, 'ratios.data_out_GBps'))}, {share(get(fp, 'ratios.data_out_vs_raw'))}"),
        ("data rate in (host to GPU), share of raw pinned",
         lambda fp, c: f"{gbps(get(fp, 'ratios.data_in_GBps'))}, {share(get(fp, 'ratios.data_in_vs_raw'))}"),
        ("the bytes at raw pinned bandwidth, out / in",
         lambda fp, c: f"{s(get(fp, 'ratios.physics_floor_out_s'))} / {s(get(fp, 'ratios.physics_floor_in_s'))}"),
        ("output identical to the driver-only run's", lambda fp, c: yes(fp.get("bit_identical"))),
        ("**one-time**, at start: arena set-up", lambda fp, c: s(get(fp, "gpucr.one_time.arena_setup_s"))),
        ("&nbsp;&nbsp;create + pre-fault / staging ring",
         lambda fp, c: " / ".join(s(v) for v in setup_parts(fp))),
        ("arena / staging ring size",
         lambda fp, c: f"{gib(get(fp, 'gpucr.one_time.arena_bytes'))} / "
                       f"{gib(get(fp, 'gpucr.one_time.staging_bytes'))}"),
    ]
    rows = [[label] + [fn(fp, last_cycle(fp)) for fp in fps] for label, fn in spec]
    return "\n".join(head + [table([""] + [f"{fp['gib']:g} GiB" for fp in fps], rows)])


def _list(items: list[str]) -> str:
    return ", ".join(items) if items else "none"


def data_path_targets() -> str:
    d = load("shim-vs-driver-h100.json")
    fps = [fp for fp in d.get("footprints", []) if fp.get("ratios")]
    out = []

    # 1. data at >= 80 % of raw pinned bandwidth
    hit, miss = [], []
    for fp in fps:
        for key, way in (("data_out_vs_raw", "checkpoint"), ("data_in_vs_raw", "restore")):
            v = get(fp, f"ratios.{key}")
            if v is not None:
                (hit if v >= 0.8 else miss).append((fp["gib"], way, v))
    big = [v for g, _, v in miss if g >= 8]
    out.append(
        "* **Data at 80 % or more of the raw pinned bandwidth**, in each direction: "
        + ("reached at " + _list([f"{g:g} GiB {w} ({share(v)})" for g, w, v in hit]) if hit else "not reached")
        + (" only" if hit and miss else "") + ". "
        + ("Not reached: " + _list([f"{g:g} GiB {w} ({share(v)})" for g, w, v in miss]) + ". " if miss else "")
        + (f"From 8 GiB up the misses are {share(min(big))} to {share(max(big))}." if big else ""))

    # 2. and 3. checkpoint and restore <= 1/10 of driver only, at >= 32 GiB
    large = [fp for fp in fps if fp["gib"] >= 32]
    for key, what in (("checkpoint_total_vs_driver", "Checkpoint"), ("restore_total_vs_driver", "Restore")):
        vals = [(fp["gib"], get(fp, f"ratios.{key}")) for fp in large]
        met = bool(vals) and all(v is not None and v <= 0.1 for _, v in vals)
        out.append(f"* **{what} in 1/10 of the driver-only time or less, from 32 GiB up**: "
                   f"{'met' if met else 'not met'}: "
                   + _list([f"{ratio(v)} at {g:g} GiB" for g, v in vals]) + ".")
    floors, over = [], True
    for fp in large:
        fl, drv = get(fp, "ratios.physics_floor_in_s"), get(fp, "driver_only.restore_s")
        ctl = [v for v in (get(c, "restore.control_s") for c in get(fp, "gpucr.cycles") or []) if v is not None]
        if fl is None or drv is None or not ctl:
            continue
        over = over and fl + min(ctl) > drv / 10
        floors.append(f"At {fp['gib']:g} GiB, {fl:.2f} s for the data at the raw host-to-device rate "
                      f"+ {ctl[-1]:.2f} s control = {fl + ctl[-1]:.2f} s, against 1/10 of the driver-only "
                      f"restore, {drv / 10:.2f} s"
                      + (f" (with the faster control phase of the {len(ctl)} cycles, {min(ctl):.2f} s: "
                         f"{fl + min(ctl):.2f} s)" if min(ctl) != ctl[-1] else ""))
    if floors:
        out.append("  The restore's floor: the driver restore (control) comes first, then the data goes back "
                   "to the GPU, and the data cannot move faster than the raw pinned bandwidth. "
                   + ". ".join(floors) + ". "
                   + ("So even a data step at the full raw bandwidth, after the control phase as measured, "
                      "would take longer than 1/10 of the driver-only restore." if over else
                      "So the target is within reach of a faster data step."))

    # 4. 70 GB handed back within 2 s
    top = max(fps, key=lambda fp: fp["gib"], default=None)
    if top is not None:
        c, c0 = last_cycle(top), first_cycle(top)
        tot, tot0 = get(c, "checkpoint.total_s"), get(c0, "checkpoint.total_s")
        rel = [get(x, "checkpoint.quiesce_s") + get(x, "checkpoint.data_s") for x in (c, c0)
               if get(x, "checkpoint.quiesce_s") is not None and get(x, "checkpoint.data_s") is not None]
        met = tot is not None and tot <= 2.0 and (tot0 is None or tot0 <= 2.0)
        out.append(
            f"* **70 GB handed back within 2 s**: {'met' if met else 'not met'} as measured. At "
            f"{top['gib']:g} GiB ({c.get('bytes', 0) / 1e9:.1f} GB of GPU data) the GPU was down to "
            f"{mib(c.get('used_mib_after_checkpoint'))} after the whole checkpoint, {s(tot)} "
            f"(first cycle {s(tot0)}). The shim releases the buffers' GPU memory at the end of its data step, "
            + (f"{rel[0]:.2f} s in (first cycle {rel[1]:.2f} s)" if len(rel) == 2 else "")
            + ", before the driver checkpoint; the benchmark did not sample the GPU memory at that point, "
            "so that is not a measured hand-back time.")

    # 5. small footprint not worse than driver only
    small = min(fps, key=lambda fp: fp["gib"], default=None)
    if small is not None:
        pairs = []
        ok = True
        for key, dkey, what in (("checkpoint", "checkpoint_s", "checkpoint"), ("restore", "restore_s", "restore")):
            drv = get(small, f"driver_only.{dkey}")
            mine = [get(x, f"{key}.total_s") for x in get(small, "gpucr.cycles") or []]
            mine = [v for v in mine if v is not None]
            if drv is None or not mine:
                ok = False
                continue
            ok = ok and max(mine) <= drv
            pairs.append(f"{what} {' and '.join(f'{v:.2f}' for v in mine)} s (its {len(mine)} cycles) "
                         f"against {drv:.2f} s")
        out.append(f"* **A small footprint ({small['gib']:g} GiB) not slower than driver only**: "
                   f"{'met' if ok and pairs else 'not met'}: " + "; ".join(pairs) + ".")
    return "\n".join(out)


def data_path_threads() -> str:
    files = [f"datapath-tune-h100-{n}-threads.json" for n in (8, 12, 16)]
    data = [(f, load(f)) for f in files]
    lines = [f"* `bench/results/{f}`: {d.get('device', MISSING)}, driver {d.get('driver', MISSING)}, "
             f"{d.get('date', MISSING)}, {d.get('cpus', MISSING)} CPUs usable, "
             f"`{' '.join(f'{k}={v}' for k, v in (get(d, 'options.env') or {}).items()) or 'default'}`."
             for f, d in data]
    fps = [(d.get("footprints") or [{}])[0] for _, d in data]

    def both(fp):
        c = last_cycle(fp)
        a, b = get(c, "checkpoint.total_s"), get(c, "restore.total_s")
        return MISSING if a is None or b is None else f"{a + b:.2f} s"

    def rate(fp, way):
        c = last_cycle(fp)
        n, t = c.get("bytes"), get(c, f"{way}.data_s")
        return MISSING if n is None or not t else gbps(n / t / 1e9)

    spec = [
        ("footprint", lambda fp: MISSING if fp.get("gib") is None else f"{fp['gib']:g} GiB"),
        ("staging ring", lambda fp: gib(get(fp, "gpucr.one_time.staging_bytes"))),
        ("checkpoint, total", lambda fp: s(get(last_cycle(fp), "checkpoint.total_s"))),
        ("&nbsp;&nbsp;data / control",
         lambda fp: f"{s(get(last_cycle(fp), 'checkpoint.data_s'))} / {s(get(last_cycle(fp), 'checkpoint.control_s'))}"),
        ("restore, total", lambda fp: s(get(last_cycle(fp), "restore.total_s"))),
        ("&nbsp;&nbsp;control / data",
         lambda fp: f"{s(get(last_cycle(fp), 'restore.control_s'))} / {s(get(last_cycle(fp), 'restore.data_s'))}"),
        ("checkpoint + restore", both),
        ("data rate out / in", lambda fp: f"{rate(fp, 'checkpoint')} / {rate(fp, 'restore')}"),
        ("first cycle: checkpoint / restore",
         lambda fp: f"{s(get(first_cycle(fp), 'checkpoint.total_s'))} / {s(get(first_cycle(fp), 'restore.total_s'))}"),
        ("arena set-up at start", lambda fp: s(get(fp, "gpucr.one_time.arena_setup_s"))),
    ]
    header = [""] + [f"{threads_of(fp) if threads_of(fp) is not None else MISSING} copy threads" for fp in fps]
    rows = [[label] + [fn(fp) for fp in fps] for label, fn in spec]
    return "\n".join(lines + ["", table(header, rows)])


def data_path_hugetlbfs() -> str:
    shm_name, huge_name = "shim-vs-driver-h100.json", "datapath-hugetlbfs-h100-32g.json"
    huge = load(huge_name)
    hfp = (huge.get("footprints") or [{}])[0]
    shm = load(shm_name)
    sfp = next((fp for fp in shm.get("footprints", []) if fp.get("gib") == hfp.get("gib")), {})
    runs = [(shm_name, shm, sfp), (huge_name, huge, hfp)]
    lines = [f"* `bench/results/{f}`: {d.get('device', MISSING)}, driver {d.get('driver', MISSING)}, "
             f"{d.get('date', MISSING)}." for f, d, _ in runs]

    def rate(d, fp, c, way, raw_key):
        n, t = c.get("bytes"), get(c, f"{way}.data_s")
        raw = get(d, f"raw_pinned.{raw_key}")
        if n is None or not t:
            return MISSING
        v = n / t / 1e9
        return gbps(v) + ("" if raw is None else f", {share(v / raw)}")

    spec = [
        ("arena", lambda d, fp: f"`{get(fp, 'gpucr.one_time.arena_dir') or MISSING}`, "
                                f"{'hugetlbfs' if get(fp, 'gpucr.one_time.arena_hugetlb') else 'not hugetlbfs'}, "
                                f"{'pinned' if get(fp, 'gpucr.one_time.arena_pinned') else 'not pinned'}"),
        ("footprint", lambda d, fp: MISSING if fp.get("gib") is None else f"{fp['gib']:g} GiB"),
        ("**one-time** arena set-up at start", lambda d, fp: s(get(fp, "gpucr.one_time.arena_setup_s"))),
        ("&nbsp;&nbsp;create + pre-fault / staging ring", lambda d, fp: " / ".join(s(v) for v in setup_parts(fp))),
        ("raw pinned rate of the run, out / in",
         lambda d, fp: f"{gbps(get(d, 'raw_pinned.d2h_GBps'))} / {gbps(get(d, 'raw_pinned.h2d_GBps'))}"),
    ]
    for i, label in ((-1, "last"), (0, "first")):
        spec += [
            (f"{label} cycle: checkpoint, total (data / control)",
             lambda d, fp, i=i: (lambda c: f"{s(get(c, 'checkpoint.total_s'))} ({s(get(c, 'checkpoint.data_s'))} / "
                                           f"{s(get(c, 'checkpoint.control_s'))})")((get(fp, "gpucr.cycles") or [{}])[i])),
            (f"{label} cycle: restore, total (control / data)",
             lambda d, fp, i=i: (lambda c: f"{s(get(c, 'restore.total_s'))} ({s(get(c, 'restore.control_s'))} / "
                                           f"{s(get(c, 'restore.data_s'))})")((get(fp, "gpucr.cycles") or [{}])[i])),
            (f"{label} cycle: data out, share of raw pinned",
             lambda d, fp, i=i: rate(d, fp, (get(fp, "gpucr.cycles") or [{}])[i], "checkpoint", "d2h_GBps")),
            (f"{label} cycle: data in, share of raw pinned",
             lambda d, fp, i=i: rate(d, fp, (get(fp, "gpucr.cycles") or [{}])[i], "restore", "h2d_GBps")),
        ]
    header = ["", "`/dev/shm`", "hugetlbfs"]
    rows = [[label] + [fn(d, fp) for _, d, fp in runs] for label, fn in spec]
    return "\n".join(lines + ["", table(header, rows)])


def gpu_remap() -> str:
    name = "gpu-remap-h200x2.json"
    d = load(name)
    idx = {g["uuid"]: g["index"] for g in d.get("gpus", []) if "uuid" in g}
    a = d.get("args") or {}
    ref = d.get("reference") or {}
    models = sorted({g.get("model") for g in d.get("gpus", [])} - {None})
    head = [f"Measured on {len(d.get('gpus', []))} GPUs ({', '.join(models) or MISSING}; the file does not record "
            f"the driver), {d.get('date', MISSING)}, PyTorch {d.get('torch', MISSING)}; from `bench/results/{name}`.",
            "",
            f"Workload: {a.get('steps', MISSING)} steps, {a.get('ballast_gib', MISSING)} GiB of ballast on the GPU, "
            f"{a.get('pace', MISSING)} s pause per step, checkpointed at step {a.get('checkpoint_at', MISSING)}. "
            f"The uninterrupted reference run took {s(ref.get('seconds'))}.",
            ""]
    cols = [("forced", "forced: `--gpu 1`"), ("auto", "automatic: only GPU 1 usable"),
            ("swap", "swapped: `--gpu 1,0`")]

    def gpu(u):
        return MISSING if u not in idx else f"GPU {idx[u]}"

    def per_gpu(v):
        return MISSING if not v else " / ".join(mib(x) for x in v)

    def command(x):
        parts = ["`restore --from IMG" + "".join(" " + y for y in x.get("restore_args") or []) + "`"]
        parts += [f"with `{k}={v}`" for k, v in (x.get("restore_env") or {}).items()]
        return " ".join(parts)

    def report(x):
        out = []
        for proc in get(x, "restore.gpus") or []:
            for g in proc.get("gpus", []):
                out.append(f"device {g.get('ordinal', MISSING)}: {gpu(g.get('image_uuid'))} → "
                           f"GPU {g.get('index', MISSING)}")
        return "; ".join(out) or MISSING

    checks = d.get("checks") or {}
    spec = [
        ("the process sees (`CUDA_VISIBLE_DEVICES`)", lambda k, x: f"`{x.get('workload_cuda_visible_devices', MISSING)}`"),
        ("GPUs recorded in the image", lambda k, x: "; ".join(", ".join(gpu(u) for u in p)
                                                            for p in x.get("image_gpu_uuids") or []) or MISSING),
        ("GPU data", lambda k, x: gib(get(x, "checkpoint.gpu_bytes"))),
        ("image size", lambda k, x: gib(get(x, "checkpoint.bytes"))),
        ("GPU memory in use before, GPU 0 / GPU 1", lambda k, x: per_gpu(x.get("gpu_mib_before"))),
        ("`checkpoint --pid --to`, total", lambda k, x: s(get(x, "checkpoint.timings.total_s"))),
        ("&nbsp;&nbsp;GPU memory handed back after", lambda k, x: s(get(x, "checkpoint.timings.gpu_released_s"))),
        ("GPU memory in use after the checkpoint", lambda k, x: per_gpu(x.get("gpu_mib_after_checkpoint"))),
        ("restore command", lambda k, x: command(x)),
        ("`restore --from`, total", lambda k, x: s(get(x, "restore.timings.total_s"))),
        ("&nbsp;&nbsp;checksums verified", lambda k, x: s(get(x, "restore.timings.verify_s"))),
        ("&nbsp;&nbsp;CRIU restore", lambda k, x: s(get(x, "restore.timings.criu_restore_s"))),
        ("&nbsp;&nbsp;GPU state back (driver, arena, data)", lambda k, x: s(get(x, "restore.timings.gpu_restore_s"))),
        ("&nbsp;&nbsp;&nbsp;&nbsp;of which the driver restore", lambda k, x: s(get(x, "restore.timings.gpu_control_s"))),
        ("the restore report: CUDA device, GPU of the image → GPU here", lambda k, x: report(x)),
        ("GPU memory in use after the restore", lambda k, x: per_gpu(x.get("gpu_mib_after_restore"))),
        ("the restored process runs on (`nvidia-smi`)",
         lambda k, x: ", ".join(gpu(u) for u in x.get("compute_apps_of_restored") or []) or MISSING),
        ("output bit-identical to the uninterrupted run", lambda k, x: yes(checks.get(f"{k}_bit_identical"))),
        ("image unchanged by the restore", lambda k, x: yes(checks.get(f"{k}_image_unchanged"))),
        ("checks passed", lambda k, x: (lambda c: f"{sum(1 for v in c if v)} of {len(c)}" if c else MISSING)(
            [v for n, v in checks.items() if n.startswith(k + "_")])),
    ]
    rows = [[label] + [fn(k, d.get(k) or {}) for k, _ in cols] for label, fn in spec]
    bad = [n for n, v in checks.items() if not v]
    tail = [f"All {len(checks)} checks of the run passed." if checks and not bad
            else f"Failed checks: {', '.join(f'`{n}`' for n in bad)}." if bad else "The file records no checks."]
    return "\n".join(head + [table([""] + [c for _, c in cols], rows), ""] + tail)


# the GPU pairs each variant of bench/probe/remap_probe.py gives the driver
PROBE_VARIANTS = {
    "only_visible_0to1": "GPU 0 → GPU 1 (only the GPU the process sees)",
    "permutation_0to1_1to0": "GPU 0 → GPU 1, GPU 1 → GPU 0",
    "identity_both": "GPU 0 → GPU 0, GPU 1 → GPU 1",
}


def gpu_remap_probe() -> str:
    name = "gpu-remap-probe-h200x2.json"
    d = load(name)
    head = [f"From `bench/results/{name}`. The file records no device, driver or date; it was committed "
            "together with the two-GPU run above.", ""]
    rows = []
    for key, rec in d.items():
        mem = " / ".join(m.split(",", 1)[1].strip() for m in rec.get("mem") or []) or MISSING
        if rec.get("error"):
            result = f"**failed**: {rec['error']}"
        else:
            result = f"restored in {s(rec.get('restore_s'), 3)}"
        same = MISSING if "after" not in rec else yes(rec.get("after") == rec.get("before"))
        rows.append([f"`{key}`", PROBE_VARIANTS.get(key, MISSING), result, same, mem])
    return "\n".join(head + [table(["variant", "GPU pairs given to the driver", "driver restore",
                                    "computes on, same sum", "GPU memory after, GPU 0 / GPU 1"], rows)])


def steady_state() -> str:
    out = []
    for name in ("steady-state-h100.json", "steady-state-h100-launch-bound.json"):
        d = load(name)
        out += [measured(d, name) + f" PyTorch {d.get('torch_version', MISSING)}, "
                f"CuPy {d.get('cupy_version', MISSING)}; workers pinned to CPUs "
                f"{', '.join(map(str, d.get('cpus', [])))}; {d.get('warmup')} warm-up steps.", ""]
        rows = []
        for w in d.get("workloads", []):
            rows.append([
                f"`{w['workload']}`",
                str(len(w.get("rounds", []))),
                str(w.get("steps_per_process", MISSING)),
                MISSING if w.get("base_median_ms") is None else f"{w['base_median_ms']:.3f} ms",
                MISSING if w.get("shim_median_ms") is None else f"{w['shim_median_ms']:.3f} ms",
                pct(w.get("overhead_pct")),
                pct(w.get("overhead_pct_median_of_rounds")),
                f"{pct(w.get('overhead_pct_mean_of_rounds'))} "
                f"[{pct(w.get('overhead_pct_mean_ci95_low'))}, {pct(w.get('overhead_pct_mean_ci95_high'))}]",
            ])
        out += [table(["workload", "rounds", "timed steps per process", "median step, without shim",
                       "with shim", "overhead, pooled", "median of rounds", "mean of rounds [95 % CI]"],
                      rows), ""]
    return "\n".join(out).rstrip()


def image_store() -> str:
    name = "image-store-vm.json"
    d = load(name)
    head = [f"Measured on host \"{d.get('host', MISSING)}\", kernel {d.get('kernel', MISSING)}, "
            f"{d.get('cpus', MISSING)} CPUs, in `{d.get('dir', MISSING)}`, {d.get('size_mb', MISSING)} MB per "
            f"figure, best of {d.get('repeat', MISSING)}, {d.get('when', MISSING)}; from `bench/results/{name}`. "
            "No GPU is involved.", ""]
    m, r = d.get("MBps", {}), d.get("ratio", {})
    streams = [(f"`fs_{way}_{k}`", f"sequential {way}, {k} stream{'s' if k > 1 else ''}"
                + (", fsync'd" if way == "write" else ", page cache dropped"), f"fs_{way}_{k}", None)
               for way in ("write", "read") for k in (1, 4) if f"fs_{way}_{k}" in m]
    spec = streams + [
        ("`fs_write`", "the file system's write rate: " + ("the faster of the two" if streams else
                                                           "plain sequential write, fsync'd"), "fs_write", None),
        ("`fs_read`", "the file system's read rate: " + ("the faster of the two" if streams else
                                                         "plain sequential read, page cache dropped"), "fs_read", None),
        ("`sha256`", "sha256 over memory (one stream)", "sha256", None),
        ("`image_h5_write`", "a process's arena (the GPU data) to a .h5 file, with checksums and fsync",
         "image_h5_write", "image_h5_write/fs_write"),
        ("`image_copy_write`", "a staged file (CRIU's) copied into the image with its checksums", "image_copy_write",
         "image_copy_write/fs_write"),
        ("`image_verify_read`", "every file of an image re-read and checked", "image_verify_read",
         "image_verify_read/fs_read"),
        ("`image_h5_read`", "the .h5 read back into the process's arena", "image_h5_read", "image_h5_read/fs_read"),
    ]
    rows = [[k, what, mbps(m.get(key)), MISSING if ratio is None or r.get(ratio) is None
             else f"{r[ratio]:.2f} of `{ratio.split('/')[1]}`"] for k, what, key, ratio in spec]
    return "\n".join(head + [table(["figure", "what", "rate", "share of the file system's"], rows)])


BLOCKS = {
    "job-gpu-slurm": job_gpu_slurm,
    "migration": migration,
    "gpu-remap": gpu_remap,
    "gpu-remap-probe": gpu_remap_probe,
    "data-path": data_path,
    "data-path-targets": data_path_targets,
    "data-path-threads": data_path_threads,
    "data-path-hugetlbfs": data_path_hugetlbfs,
    "steady-state": steady_state,
    "image-store": image_store,
}


def render(text: str) -> str:
    for name, fn in BLOCKS.items():
        pat = re.compile(rf"(<!-- BEGIN {re.escape(name)} -->\n).*?(<!-- END {re.escape(name)} -->)", re.S)
        if not pat.search(text):
            raise SystemExit(f"results_tables: no block '{name}' in {DOC}")
        body = fn()
        text = pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
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
