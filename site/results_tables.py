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
PLOTS = ["shim-vs-driver-h100.png", "shim-vs-driver-h100-helper-run3.png", "shim-vs-driver-h100-helper-run5.png", "shim-vs-driver-h100-helper-run7.png", "steady-state-h100.png", "steady-state-h100-launch-bound.png"]
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
    name, fast = "job-gpu-slurm-h100.json", "job-gpu-slurm-fast-path-h100.json"
    d, f = load(name), load(fast)
    cols = [(d, "preempt", "root, `gpucr-hpc preempt`"),
            (d, "user_preempt", "ordinary user, `gpucr-hpc preempt`"),
            (d, "urgent", "urgent job, no command"),
            (f, "fast_path", "root, `gpucr-hpc preempt`, site fast path")]
    w = d.get("workload", {})
    head = [measured(d, name) + f" PyTorch {d.get('torch', MISSING)}.",
            "",
            "The last column: " + measured(f, fast)[0].lower() + measured(f, fast)[1:]
            + f" PyTorch {f.get('torch', MISSING)}.",
            "",
            f"Workload: `{w.get('script')}`, {w.get('steps')} steps, {w.get('ballast_gib')} GiB of "
            f"ballast on the GPU, {w.get('pace_s')} s pause per step, preempted at step "
            f"{w.get('preempt_at_step')} or later. The same run without gpucr-hpc took "
            f"{s(d.get('reference_s'))} (last column's run: {s(f.get('reference_s'))}).",
            ""]

    def rows(spec):
        return [[label] + [fmt(get(src.get(k, {}), path)) for src, k, _ in cols] for label, path, fmt in spec]

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
    header = [""] + [c for _, _, c in cols]
    return "\n".join(head + [
        "Checkpoint (the phases are those of the job's one unit, `batch`):", "",
        table(header, rows(ckpt)), "",
        "Requeue and restore (\"after\": from the start of `gpucr-hpc preempt`, or from the "
        "submission of the urgent job):", "",
        table(header, rows(restart)), "",
        "GPU memory in use (`nvidia-smi`, GPU 0, sampled every 100 ms):", "",
        table(header, rows(vram))])


MIGRATION_FILES = [("migrate-gpu-h100-2g.json", "root"),
                   ("nonroot-gpu-h100.json", "ordinary user"),
                   ("migrate-gpu-h100-8g-shm.json", "root"),
                   ("migrate-gpu-h100-8g-hugetlbfs.json", "root, hugetlbfs"),
                   ("migrate-gpu-h100-8g-shm-first-version.json", "root, first version")]


def before_after(d: dict, key: str) -> str:
    """The file system's rate measured before the scenario / between checkpoint and
    restore (where measured) / after it ("—" where not measured)."""
    a, m, b = get(d, f"{key}.MBps"), get(d, f"{key}_between.MBps"), get(d, f"{key}_after.MBps")
    if a is None and b is None:
        return MISSING
    return " / ".join(mbps(v) for v in ((a, m, b) if m is not None else (a, b)))


def migration() -> str:
    data = [(f, who, load(f)) for f, who in MIGRATION_FILES]
    lines = []
    for f, _, d in data:
        lines.append(f"* `bench/results/{f}`: {d.get('device', MISSING)}, driver "
                     f"{d.get('driver', MISSING)}, {d.get('date', MISSING)}, PyTorch {d.get('torch', MISSING)}.")

    def arena(d):
        a = get(d, "args.arena") or "/dev/shm"
        size = get(d, "args.arena_size")
        return f"{a}, {size} preallocated" if size else a

    def vs(d, key):
        return MISSING if d.get(key) is None else f"{d[key]:.2f}"

    header = [""] + [f"{get(d, 'args.ballast_gib')} GiB, {who}" for _, who, d in data]
    spec = [
        ("measured on", lambda d: (d.get("date") or MISSING)[:10]),
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
        ("file system's own write rate there, before / [between checkpoint and restore /] after the scenario", lambda d: before_after(d, "fs_write")),
        (".h5 write rate / file system's (the faster of the two around the write)", lambda d: vs(d, "h5_write_vs_fs_write")),
        ("`restore --from`, wall time", lambda d: s(get(d, "kill.restore.cli_wall_s"))),
        ("&nbsp;&nbsp;checksums verified first", lambda d: s(get(d, "kill.restore.timings.verify_s"))),
        ("&nbsp;&nbsp;CRIU restore", lambda d: s(get(d, "kill.restore.timings.criu_restore_s"))),
        ("&nbsp;&nbsp;driver restore", lambda d: s(get(d, "kill.restore.timings.gpu_control_s"))),
        ("&nbsp;&nbsp;host arena re-created", lambda d: s(get(d, "kill.restore.timings.gpu_attach_s"))),
        ("&nbsp;&nbsp;.h5 read into the arena",
         lambda d: f"{s(get(d, 'kill.restore.timings.gpu_h5_read_s'))} "
                   f"({mbps(get(d, 'kill.restore.timings.gpu_h5_read_MBps'))})"),
        ("&nbsp;&nbsp;data back to the GPU", lambda d: s(get(d, "kill.restore.timings.gpu_data_s"))),
        ("&nbsp;&nbsp;total", lambda d: s(get(d, "kill.restore.timings.total_s"))),
        ("file system's own read rate there (page cache dropped), before / [between /] after the scenario",
         lambda d: before_after(d, "fs_read")),
        (".h5 read rate / file system's (the faster of the two around the read)", lambda d: vs(d, "h5_read_vs_fs_read")),
        ("restored output bit-identical", lambda d: yes(get(d, "checks.kill_restored_bit_identical"))),
        ("image unchanged by the restore", lambda d: yes(get(d, "checks.kill_image_unchanged_by_restore"))),
    ]
    kill = table(header, [[label] + [fn(d) for _, _, d in data] for label, fn in spec])

    d = load("migrate-gpu-h100-2g.json")
    lr = d.get("leave_running") or {}
    again = lr.get("restore_again_new_pidns") or {}
    leave = table([f"`--leave-running`, {get(d, 'args.ballast_gib')} GiB, root", ""], [
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
                              kill, "", f"From `bench/results/migrate-gpu-h100-2g.json`, the same run:", "", leave])


def share(v) -> str:
    return MISSING if v is None else f"{100 * v:.1f} %"


def gbps(v) -> str:
    return MISSING if v is None else f"{v:.1f} GB/s"


def ratio(v) -> str:
    """gpucr-hpc's time as a fraction of the driver-only time, and its inverse."""
    return MISSING if not v else f"{v:.3f} (1/{1 / v:.1f})"


def size(v) -> str:
    """Bytes as GiB, or as MiB below 1 GiB."""
    if v is None:
        return MISSING
    return f"{v / 2**30:.2f} GiB" if v >= 2**30 else f"{v / 2**20:.0f} MiB"


def cycles_of(fp: dict) -> list:
    return get(fp, "gpucr.cycles") or []


def last_cycle(fp: dict) -> dict:
    return (cycles_of(fp) or [{}])[-1]


def first_cycle(fp: dict) -> dict:
    return (cycles_of(fp) or [{}])[0]


def setup_parts(fp: dict) -> tuple:
    """(create + pre-fault s, staging ring or pin s) from the lines `gpucr-hpc run` printed:
    summed, since an arena grown in the background reports each growth."""
    found = [tuple(map(float, m.groups())) for line in get(fp, "gpucr.one_time.run_stderr") or []
             for m in [re.search(r"create \+ pre-fault ([0-9.]+) s, (?:staging ring|pin) ([0-9.]+) s", line)] if m]
    if not found:
        return None, None
    return sum(a for a, _ in found), sum(b for _, b in found)


def threads_of(fp: dict):
    return get(last_cycle(fp), "checkpoint.shim.copy_threads")


def slot_mib_of(fp: dict):
    """The staging slot: the ring holds two slots per copy thread (shim/datapath.c)."""
    ring, t = get(fp, "gpucr.one_time.staging_bytes"), threads_of(fp)
    return None if not ring or not t else ring / (2 * t) / 2**20


# GPUCR_COPY_NT: the stores of the copy (out: into the arena, in: into the ring)
NT_STORES = {"out": ("streaming", "cached"), "in": ("cached", "streaming"), "both": ("streaming", "streaming"),
             "1": ("streaming", "streaming"), "0": ("cached", "cached")}
# the bounce path's knobs, in the order of datapath_ab.py's THREADS:SLOT_MIB:NT:WAIT
KNOBS = ("GPUCR_COPY_THREADS", "GPUCR_COPY_SLOT_MIB", "GPUCR_COPY_NT", "GPUCR_COPY_WAIT")


def rate_of(c: dict, way: str):
    n, t = c.get("bytes"), get(c, f"{way}.data_s")
    return None if n is None or not t else n / t / 1e9


def copy_config(d: dict, fps: list | None = None) -> dict:
    """How the bounce path copied in a bench_shim_vs_driver.py file: copy threads and
    slot from the shim's replies and the ring's size; stores and waits from the
    replies where they carry them, else from the GPUCR_COPY_* the run set."""
    fps = d.get("footprints", []) if fps is None else fps
    env = get(d, "options.env") or {}
    cyc = [c for fp in fps for c in cycles_of(fp)]

    def one(vals):
        vals = sorted(set(vals) - {None}, key=str)
        return None if not vals else ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in vals)

    threads = one(threads_of(fp) for fp in fps)
    slot = one(slot_mib_of(fp) for fp in fps)
    ring = one(size(get(fp, "gpucr.one_time.staging_bytes")) for fp in fps)
    out = one(get(c, "checkpoint.shim.copy_stores") for c in cyc)
    inn = one(get(c, "restore.shim.copy_stores") for c in cyc)
    wait = one([get(c, "checkpoint.shim.copy_wait") for c in cyc] + [get(c, "restore.shim.copy_wait") for c in cyc])
    nt, w = env.get("GPUCR_COPY_NT"), env.get("GPUCR_COPY_WAIT")
    if out or inn:
        stores = f"{out or MISSING} out, {inn or MISSING} in"
    elif nt in NT_STORES:
        stores = f"{NT_STORES[nt][0]} out, {NT_STORES[nt][1]} in"
    else:
        stores = MISSING
    copy_env = {k: v for k, v in env.items() if k.startswith("GPUCR_COPY_")}
    set_ = (ab_config(copy_env) if all(k in copy_env for k in KNOBS)
            else " ".join(f"`{k}={v}`" for k, v in copy_env.items()))
    return {"threads": threads, "slot": slot, "ring": ring, "stores": stores, "waits": wait or w or MISSING,
            "set": set_, "recorded": bool(out or inn or wait)}


def config_text(cfg: dict) -> str:
    text = (f"{cfg['threads'] or MISSING} copy threads, {cfg['slot'] or MISSING} MiB slots "
            f"(a {cfg['ring'] or MISSING} ring), stores: {cfg['stores']}; waits: {cfg['waits']}")
    if cfg["set"]:
        return text + f" (set: {cfg['set']})"
    if not cfg["recorded"]:
        return text + " (stores and waits not recorded; no `GPUCR_` variable set: the defaults of its shim)"
    return text


def data_path(name: str = "shim-vs-driver-h100.json") -> str:
    d = load(name)
    raw = d.get("raw_pinned") or {}
    fps = d.get("footprints", [])
    opt = d.get("options") or {}
    pinned = sorted({get(fp, "gpucr.one_time.arena_pinned") for fp in fps} - {None})
    head = [measured(d, name) + f" {d.get('cpus', MISSING)} CPUs usable.",
            "",
            f"gpucr-hpc: arena in `{opt.get('arena', MISSING)}` "
            f"({'pinned' if pinned == [True] else 'not pinned' if pinned == [False] else MISSING}); "
            f"{config_text(copy_config(d))}. "
            f"{opt.get('cycles', MISSING)} checkpoint/restore cycles per footprint: the table shows the last, "
            "and the first cycle's totals in their own rows. "
            f"Raw pinned copy rate, measured in the same run with {raw.get('gib', MISSING)} GiB: "
            f"device to host {gbps(raw.get('d2h_GBps'))}, host to device {gbps(raw.get('h2d_GBps'))}.",
            ""]
    helper = bool(opt.get("copy_helper"))
    if helper:
        paths = [get(c, f"{way}.shim.data_path") for fp in fps
                 for c in (get(fp, "gpucr.cycles") or []) + (get(fp, "gpucr.prefilled") or []) for way in ("checkpoint", "restore")]
        head[2] = (f"gpucr-hpc with the copy helper (`GPUCR_COPY_HELPER`): arena in `{opt.get('arena', MISSING)}`, "
                   + ("grown in the background as the program's GPU memory grew (`--arena-auto`), each new "
                      "segment pinned by the helper as it came; " if opt.get("arena_auto") else
                      "pinned by the helper once at start-up; ")
                   + f"the data moved through the helper in "
                   f"{sum(p == 'helper' for p in paths)} of {len(paths)} checkpoints and restores. "
                   f"{opt.get('cycles', MISSING)} cycles per footprint restored without prefill (the table shows "
                   f"the last: each phase on its own), then {opt.get('prefill_cycles', MISSING)} restored with the "
                   f"prefill (the helper fills the GPU beside the driver restore): their restore total in its own rows. "
                   f"Raw pinned copy rate, measured in the same run with {raw.get('gib', MISSING)} GiB: "
                   f"device to host {gbps(raw.get('d2h_GBps'))}, host to device {gbps(raw.get('h2d_GBps'))}.")
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
        ("GPU memory handed back (sampled), gpucr-hpc: the data / everything",
         lambda fp, c: f"{s(get(c, 'vram.data_handed_back_s'))} / {s(get(c, 'vram.all_handed_back_s'))}"),
        ("GPU memory handed back (sampled), driver only: everything",
         lambda fp, c: s(get(fp, "driver_only.vram.all_handed_back_s"))),
        ("VRAM in use after the checkpoint (`nvidia-smi`), gpucr-hpc / driver only",
         lambda fp, c: f"{mib(c.get('used_mib_after_checkpoint'))} / "
                       f"{mib(get(fp, 'driver_only.used_mib_after_checkpoint'))}"),
        ("**restore**, gpucr-hpc", lambda fp, c: s(get(c, "restore.total_s"))),
        ("&nbsp;&nbsp;control: driver restore", lambda fp, c: s(get(c, "restore.control_s"))),
        ("&nbsp;&nbsp;data: host arena to GPU", lambda fp, c: s(get(c, "restore.data_s"))),
        ("restore, driver only", lambda fp, c: s(get(fp, "driver_only.restore_s"))),
        ("gpucr-hpc / driver only", lambda fp, c: ratio(get(fp, "ratios.restore_total_vs_driver"))),
        ("first cycle: restore, gpucr-hpc", lambda fp, c: s(get(first_cycle(fp), "restore.total_s"))),
    ] + ([
        ("**restore, prefilled** (helper beside the driver restore)", lambda fp, c: s(get(fp, "ratios.restore_prefilled_s"))),
        ("&nbsp;&nbsp;/ driver only", lambda fp, c: ratio(get(fp, "ratios.restore_prefilled_vs_driver"))),
    ] if helper else []) + [
        ("**data rate** out (GPU to host), share of raw pinned",
         lambda fp, c: f"{gbps(get(fp, 'ratios.data_out_GBps'))}, {share(get(fp, 'ratios.data_out_vs_raw'))}"),
        ("data rate in (host to GPU), share of raw pinned",
         lambda fp, c: f"{gbps(get(fp, 'ratios.data_in_GBps'))}, {share(get(fp, 'ratios.data_in_vs_raw'))}"),
        ("the bytes at raw pinned bandwidth, out / in",
         lambda fp, c: f"{s(get(fp, 'ratios.physics_floor_out_s'))} / {s(get(fp, 'ratios.physics_floor_in_s'))}"),
        ("output identical to the driver-only run's", lambda fp, c: yes(fp.get("bit_identical"))),
        ("**one-time**, " + ("while the program ran: arena growth" if opt.get("arena_auto") else "at start: arena set-up"),
         lambda fp, c: s(get(fp, "gpucr.one_time.arena_setup_s"))),
        ("&nbsp;&nbsp;create + pre-fault / staging ring",
         lambda fp, c: " / ".join(s(v) for v in setup_parts(fp))),
    ] + ([
        ("&nbsp;&nbsp;of which: arena pinned by the copy helper", lambda fp, c: s(get(fp, "gpucr.one_time.helper_setup_s"))),
    ] if helper else []) + [
        ("arena / staging ring size",
         lambda fp, c: f"{size(get(fp, 'gpucr.one_time.arena_bytes'))} / "
                       f"{size(get(fp, 'gpucr.one_time.staging_bytes'))}"),
    ]
    rows = [[label] + [fn(fp, last_cycle(fp)) for fp in fps] for label, fn in spec]
    return "\n".join(head + [table([""] + [f"{fp['gib']:g} GiB" for fp in fps], rows)])


def _list(items: list[str]) -> str:
    return ", ".join(items) if items else "none"


# the three full runs of 2026-11-25 and the previous defaults' run, in the order they ran
RUNS = [("shim-vs-driver-h100-run1-nt-both.json", "run 1"),
        ("shim-vs-driver-h100-run2-nt-out.json", "run 2"),
        ("datapath-previous-defaults-h100.json", "previous defaults"),
        ("shim-vs-driver-h100.json", "main run")]
AB_FILES = ["datapath-ab-h100-16g.json", "datapath-ab-h100-32g.json"]


def raw_share(d: dict, c: dict, way: str):
    """A cycle's data rate as a share of its run's raw pinned rate (None where not measured)."""
    v, raw = rate_of(c, way), get(d, "raw_pinned." + ("d2h_GBps" if way == "checkpoint" else "h2d_GBps"))
    return None if v is None or not raw else v / raw


def data_path_runs() -> str:
    data = [(f, label, load(f)) for f, label in RUNS]
    lines = []
    for f, label, d in data:
        raw = d.get("raw_pinned") or {}
        drv = any(fp.get("driver_only") for fp in d.get("footprints", []))
        lines.append(
            f"* **{label}**: `bench/results/{f}`, {d.get('device', MISSING)}, driver {d.get('driver', MISSING)}, "
            f"{d.get('date', MISSING)}; {get(d, 'options.cycles') or MISSING} cycles per footprint; "
            f"{config_text(copy_config(d))}. "
            + (f"Raw pinned out / in: {gbps(raw.get('d2h_GBps'))} / {gbps(raw.get('h2d_GBps'))}."
               if raw.get("d2h_GBps") else "No raw pinned rate measured.")
            + ("" if drv else " No driver-only runs (`--no-driver`)."))
    sizes = sorted({fp["gib"] for _, _, d in data for fp in d.get("footprints", [])})

    def fp_of(d, g):
        return next((fp for fp in d.get("footprints", []) if fp.get("gib") == g), None)

    def rate(d, fp, way):
        c = last_cycle(fp)
        return f"{gbps(rate_of(c, way))}, {share(raw_share(d, c, way))}"

    def total(d, fp, way, key):
        t = get(last_cycle(fp), f"{way}.total_s")
        r = get(fp, f"ratios.{key}")
        return s(t) + ("" if not r else f" (1/{1 / r:.1f})")

    spec = [
        ("data out, share of raw pinned", lambda d, fp: rate(d, fp, "checkpoint")),
        ("data in, share of raw pinned", lambda d, fp: rate(d, fp, "restore")),
        ("checkpoint (as a fraction of driver only)",
         lambda d, fp: total(d, fp, "checkpoint", "checkpoint_total_vs_driver")),
        ("restore (as a fraction of driver only)", lambda d, fp: total(d, fp, "restore", "restore_total_vs_driver")),
        ("GPU memory handed back: the data / everything",
         lambda d, fp: f"{s(get(last_cycle(fp), 'vram.data_handed_back_s'))} / "
                       f"{s(get(last_cycle(fp), 'vram.all_handed_back_s'))}"),
        ("driver only: checkpoint / restore",
         lambda d, fp: f"{s(get(fp, 'driver_only.checkpoint_s'))} / {s(get(fp, 'driver_only.restore_s'))}"),
    ]
    out = lines + ["", "Last cycle of each run; \"—\": not measured in that run."]
    header = ["", *[label for _, label, _ in data]]
    for g in sizes:
        rows = [[label] + [MISSING if fp_of(d, g) is None else fn(d, fp_of(d, g)) for _, _, d in data]
                for label, fn in spec]
        nbytes = next((last_cycle(fp_of(d, g)).get("bytes") for _, _, d in data if fp_of(d, g)), None)
        out += ["", f"**{g:g} GiB**" + ("" if nbytes is None else f" ({nbytes / 1e9:.1f} GB of GPU data)") + ":",
                "", table(header, rows)]
    return "\n".join(out)


def ab_raw(d: dict) -> dict:
    """The faster of the raw pinned rates measured before and after an A/B run."""
    return {k: max([v for v in (get(d, f"raw_pinned_before.{k}"), get(d, f"raw_pinned_after.{k}")) if v]
                   or [None], key=lambda x: x or 0) for k in ("d2h_GBps", "h2d_GBps")}


def ab_config(env: dict) -> str:
    """THREADS:SLOT_MIB:NT:WAIT as set."""
    if not env:
        return "none set: the defaults"
    return "`" + ":".join(str(env.get(k, MISSING)) for k in KNOBS) + "`"


def data_path_ab() -> str:
    out = []
    for f in AB_FILES:
        d = load(f)
        raw = ab_raw(d)
        res = d.get("results") or {}
        names = list(res)
        rounds = sorted({len(r.get("cycles") or []) for r in res.values()})

        def mm(v, fmt):
            if not v:
                return MISSING
            return f"{fmt(v.get('median'))} ({fmt(v.get('min')).split(' ')[0]}–{fmt(v.get('max'))})"

        def s3(v):
            return s(v, 3)

        def rate_share(r, key, raw_key):
            m = get(r, f"summary.{key}.median")
            return MISSING if m is None or not raw.get(raw_key) else share(m / raw[raw_key])

        def threads(r):
            v = sorted({get(c, "shim_out.copy_threads") for c in r.get("cycles") or []} - {None})
            return ", ".join(map(str, v)) or MISSING

        spec = [
            ("`GPUCR_COPY_` THREADS:SLOT_MIB:NT:WAIT", lambda n, r: ab_config((d.get("configs") or {}).get(n) or {})),
            ("copy threads (the shim's reply)", lambda n, r: threads(r)),
            ("**data out**, median (min–max)", lambda n, r: mm(get(r, "summary.out_GBps"), gbps)),
            ("&nbsp;&nbsp;median, share of raw pinned", lambda n, r: rate_share(r, "out_GBps", "d2h_GBps")),
            ("**data in**, median (min–max)", lambda n, r: mm(get(r, "summary.in_GBps"), gbps)),
            ("&nbsp;&nbsp;median, share of raw pinned", lambda n, r: rate_share(r, "in_GBps", "h2d_GBps")),
            ("**checkpoint**, median (min–max)", lambda n, r: mm(get(r, "summary.checkpoint_s"), s3)),
            ("&nbsp;&nbsp;control: driver checkpoint", lambda n, r: mm(get(r, "summary.checkpoint_control_s"), s3)),
            ("**restore**, median (min–max)", lambda n, r: mm(get(r, "summary.restore_s"), s3)),
            ("&nbsp;&nbsp;control: driver restore", lambda n, r: mm(get(r, "summary.restore_control_s"), s3)),
        ]
        rb, ra = d.get("raw_pinned_before") or {}, d.get("raw_pinned_after") or {}
        out += [f"* `bench/results/{f}`: {d.get('device', MISSING)}, driver {d.get('driver', MISSING)}, "
                f"{d.get('date', MISSING)}, {d.get('cpus', MISSING)} CPUs usable; "
                f"{d.get('gib', 0):g} GiB per process, {', '.join(map(str, rounds)) or MISSING} rounds; "
                f"raw pinned before / after: out {gbps(rb.get('d2h_GBps'))} / {gbps(ra.get('d2h_GBps'))}, "
                f"in {gbps(rb.get('h2d_GBps'))} / {gbps(ra.get('h2d_GBps'))} (the shares are of the faster); "
                f"the outputs of all processes identical: {yes(d.get('outputs_identical'))}.", ""]
        out += [table(["", *[f"`{n}`" for n in names]], [[label] + [fn(n, res[n]) for n in names]
                                                          for label, fn in spec]), ""]
        if "previous" in res and "tuned" in res:
            parts = []
            for key, what, fmt in (("out_GBps", "data out", gbps), ("in_GBps", "data in", gbps),
                                   ("checkpoint_s", "checkpoint", s3), ("restore_s", "restore", s3),
                                   ("restore_control_s", "driver restore", s3)):
                a, b = get(res["tuned"], f"summary.{key}"), get(res["previous"], f"summary.{key}")
                if not a or not b:
                    continue
                apart = a["min"] > b["max"] or b["min"] > a["max"]
                parts.append(f"{what} {fmt(a['median'])} against {fmt(b['median'])} "
                             f"({'ranges apart' if apart else 'ranges overlap'})")
            out += [f"At {d.get('gib', 0):g} GiB, `tuned` against `previous`, medians: " + "; ".join(parts) + ".",
                    ""]
    return "\n".join(out).rstrip()


def data_path_targets() -> str:
    d = load("shim-vs-driver-h100.json")
    fps = [fp for fp in d.get("footprints", []) if fp.get("ratios")]
    runs = {label: load(f) for f, label in RUNS}
    abs_ = [load(f) for f in AB_FILES]
    out = []

    # 1. data at >= 80 % of raw pinned bandwidth
    hit, miss = [], []
    for fp in fps:
        for key, way in (("data_out_vs_raw", "checkpoint"), ("data_in_vs_raw", "restore")):
            v = get(fp, f"ratios.{key}")
            if v is not None:
                (hit if v >= 0.8 else miss).append((fp["gib"], way, v))
    big = [v for g, _, v in miss if g >= 8]
    ab = []
    for a in abs_:
        raw = ab_raw(a)
        if not raw.get("d2h_GBps") or not raw.get("h2d_GBps"):
            continue
        shares = []
        for name in ("tuned", "previous"):
            m = get(a, f"results.{name}.summary")
            if m:
                shares.append(f"`{name}` out {share(m['out_GBps']['median'] / raw['d2h_GBps'])}, "
                              f"in {share(m['in_GBps']['median'] / raw['h2d_GBps'])}")
        n = sorted({len(get(a, f"results.{k}.cycles") or []) for k in (a.get("results") or {})})
        if shares:
            ab.append(f"at {a.get('gib', 0):g} GiB ({', '.join(map(str, n))} rounds) " + " against ".join(shares))
    ins = []
    for label, r in runs.items():
        for fp in r.get("footprints", []):
            v = raw_share(r, last_cycle(fp), "restore")
            if v is not None:
                ins.append((v, label, fp["gib"]))
    for a in abs_:
        raw = ab_raw(a)
        for name, res in (a.get("results") or {}).items():
            m = get(res, "summary.in_GBps.median")
            if m and raw.get("h2d_GBps"):
                ins.append((m / raw["h2d_GBps"], f"side by side, `{name}`", a.get("gib", 0)))
    r1 = runs.get("run 1") or {}
    r1_out = [(fp["gib"], raw_share(r1, last_cycle(fp), "checkpoint")) for fp in r1.get("footprints", [])]
    out.append(
        "* **Data at 80 % or more of the raw pinned bandwidth**, in each direction: in the main run "
        + ("reached at " + _list([f"{g:g} GiB {w} ({share(v)})" for g, w, v in hit]) if hit else "not reached")
        + (" only" if hit and miss else "") + ". "
        + ("Not reached: " + _list([f"{g:g} GiB {w} ({share(v)})" for g, w, v in miss]) + ". " if miss else "")
        + (f"From 8 GiB up the misses are {share(min(big))} to {share(max(big))}. " if big else "")
        + ("Side by side, medians: " + "; ".join(ab) + ". " if ab else "")
        + ("Run 1 (streaming stores both ways), data out: "
           + ", ".join(f"{share(v)} at {g:g} GiB" for g, v in r1_out if v is not None) + ". " if r1_out else "")
        + (f"The data in reached 80 % in none of these runs (last cycles, and the side-by-side medians); "
           f"the highest was {share(max(ins)[0])} ({max(ins)[1]}, {max(ins)[2]:g} GiB)."
           if ins and max(ins)[0] < 0.8 else ""))

    # 2. and 3. checkpoint and restore <= 1/10 of driver only, at >= 32 GiB
    large = [fp for fp in fps if fp["gib"] >= 32]
    for key, what in (("checkpoint_total_vs_driver", "Checkpoint"), ("restore_total_vs_driver", "Restore")):
        vals = [(fp["gib"], get(fp, f"ratios.{key}")) for fp in large]
        met = bool(vals) and all(v is not None and v <= 0.1 for _, v in vals)
        others = []
        for label in ("run 1", "run 2"):
            ov = [(fp["gib"], get(fp, f"ratios.{key}")) for fp in (runs.get(label) or {}).get("footprints", [])
                  if fp.get("gib", 0) >= 32 and get(fp, f"ratios.{key}") is not None]
            if ov:
                others.append(f"{label} " + ", ".join(f"{ratio(v)} at {g:g} GiB" for g, v in ov))
        out.append(f"* **{what} in 1/10 of the driver-only time or less, from 32 GiB up**: "
                   f"{'met' if met else 'not met'} in the main run: "
                   + _list([f"{ratio(v)} at {g:g} GiB" for g, v in vals]) + "."
                   + (" Also: " + "; ".join(others) + "." if others else ""))
    floors, over = [], True
    for fp in large:
        fl, drv = get(fp, "ratios.physics_floor_in_s"), get(fp, "driver_only.restore_s")
        ctl = [v for v in (get(c, "restore.control_s") for c in cycles_of(fp)) if v is not None]
        if fl is None or drv is None or not ctl:
            continue
        over = over and fl + min(ctl) > drv / 10
        floors.append(f"At {fp['gib']:g} GiB, {fl:.2f} s for the data at the raw host-to-device rate "
                      f"+ {ctl[-1]:.2f} s control = {fl + ctl[-1]:.2f} s, against 1/10 of the driver-only "
                      f"restore, {drv / 10:.2f} s"
                      + (f" (with the fastest control phase of the {len(ctl)} cycles, {min(ctl):.2f} s: "
                         f"{fl + min(ctl):.2f} s)" if min(ctl) != ctl[-1] else ""))
    if floors:
        out.append("  The restore's floor: the driver restore (control) comes first, then the data goes back "
                   "to the GPU, and the data cannot move faster than the raw pinned bandwidth. "
                   + ". ".join(floors) + ". "
                   + ("So even a data step at the full raw bandwidth, after the control phase as measured, "
                      "would take longer than 1/10 of the driver-only restore." if over else
                      "So the target is within reach of a faster data step."))

    # 4. 70 GB handed back within 2 s: the GPU memory sampled through NVML every few ms
    top = max(fps, key=lambda fp: fp["gib"], default=None)
    if top is not None:
        cyc = cycles_of(top)
        data_t = [get(c, "vram.data_handed_back_s") for c in cyc]
        all_t = [get(c, "vram.all_handed_back_s") for c in cyc]
        c = last_cycle(top)
        if cyc and None not in data_t + all_t:
            data_ok = sum(v <= 2.0 for v in data_t)
            all_ok = sum(v <= 2.0 for v in all_t)
            off = [get(x, "vram.used_mib_at_start") - x["used_mib_before"] for x in cyc
                   if get(x, "vram.used_mib_at_start") is not None and x.get("used_mib_before") is not None]
            verdict = ("met" if all_ok == len(cyc) else
                       "met for the data" if data_ok == len(cyc) else "not met")
            others = []
            for label in ("run 1", "run 2", "previous defaults"):
                ofp = next((fp for fp in (runs.get(label) or {}).get("footprints", [])
                            if fp.get("gib") == top["gib"]), None)
                if ofp:
                    others.append(f"{label} " + ", ".join(
                        f"{s(get(x, 'vram.data_handed_back_s'))} / {s(get(x, 'vram.all_handed_back_s'))}"
                        for x in cycles_of(ofp)))
            out.append(
                f"* **70 GB handed back within 2 s**: {verdict} in the main run. At {top['gib']:g} GiB "
                f"({c.get('bytes', 0) / 1e9:.1f} GB of GPU data), GPU memory sampled every "
                f"{1000 * (get(c, 'vram.sample_period_s') or 0):.0f} ms through NVML from the start of the "
                f"checkpoint: the data was handed back after {', '.join(f'{v:.2f}' for v in data_t)} s "
                f"(its {len(cyc)} cycles: {data_ok} of {len(cyc)} within 2 s), everything (the lowest level seen, "
                f"{mib(get(c, 'vram.lowest_mib'))} as NVML counts) after "
                f"{', '.join(f'{v:.2f}' for v in all_t)} s ({all_ok} of {len(cyc)} within 2 s). "
                + (f"NVML counted {min(off)}" + (f" to {max(off)}" if max(off) != min(off) else "")
                   + f" MiB more than `nvidia-smi` before each checkpoint; `nvidia-smi` showed "
                   f"{mib(c.get('used_mib_after_checkpoint'))} after it. " if off else "")
                + "The data goes at the end of the shim's data step, everything else with the driver checkpoint. "
                + (f"Data / everything in the other runs: {'; '.join(others)}. " if others else "")
                + f"Driver only: everything after {s(get(top, 'driver_only.vram.all_handed_back_s'))}.")

    # 5. small footprint not worse than driver only
    small = min(fps, key=lambda fp: fp["gib"], default=None)
    if small is not None:
        pairs = []
        ok = True
        for key, dkey, what in (("checkpoint", "checkpoint_s", "checkpoint"), ("restore", "restore_s", "restore")):
            drv = get(small, f"driver_only.{dkey}")
            mine = [get(x, f"{key}.total_s") for x in cycles_of(small)]
            mine = [v for v in mine if v is not None]
            if drv is None or not mine:
                ok = False
                continue
            ok = ok and max(mine) <= drv
            pairs.append(f"{what} {', '.join(f'{v:.2f}' for v in mine)} s (its {len(mine)} cycles) "
                         f"against {drv:.2f} s")
        out.append(f"* **A small footprint ({small['gib']:g} GiB) not slower than driver only**: "
                   f"{'met' if ok and pairs else 'not met'}: " + "; ".join(pairs) + ".")
    return "\n".join(out)


TUNE_FILES = [("datapath-tune-h100-stage1.json", "stages"), ("datapath-tune-h100-grid.json", "grid")]
def tune_stage(env: dict, default: dict) -> str:
    """Which stage of scripts/datapath_tune.py a run belongs to: stage 1 keeps the
    default threads and slot, stage 2 changes the slot only, stage 3 the threads."""
    if env.get("GPUCR_COPY_THREADS") != default.get("GPUCR_COPY_THREADS"):
        return "3: threads"
    if env.get("GPUCR_COPY_SLOT_MIB") != default.get("GPUCR_COPY_SLOT_MIB"):
        return "2: slot"
    return "1: stores × waits"


def data_path_tune() -> str:
    out = []
    for f, kind in TUNE_FILES:
        d = load(f)
        default, best = d.get("default") or {}, d.get("best") or {}
        runs = d.get("runs") or []
        out += [f"* `bench/results/{f}`: {kind}, {len(runs)} runs at {d.get('gib', 0):g} GiB, one after the other; "
                f"the file records no device, driver or date. Previous defaults `{ab_config(default).strip('`')}`, "
                f"chosen: {ab_config(best)}.", ""]
        rows = []
        for r in runs:
            env = r.get("env") or {}
            mark = "**" if env == best else ""
            row = [f"{mark}{ab_config(env)}{mark}",
                   size(r.get("staging_bytes")),
                   f"{s(r.get('checkpoint_s'), 3)} ({s(r.get('checkpoint_data_s'), 3)} / "
                   f"{s(r.get('checkpoint_control_s'), 3)})",
                   f"{s(r.get('restore_s'), 3)} ({s(r.get('restore_control_s'), 3)} / "
                   f"{s(r.get('restore_data_s'), 3)})",
                   f"{gbps(r.get('out_GBps'))} / {gbps(r.get('in_GBps'))}",
                   f"{mark}{s(r.get('score_s'), 3)}{mark}" if "error" not in r else f"**failed**: {r['error']}"]
            if kind == "stages":
                row.insert(0, tune_stage(env, default))
            rows.append(row)
        header = ["THREADS:SLOT_MIB:NT:WAIT", "staging ring", "checkpoint (data / control)",
                  "restore (control / data)", "data out / in", "checkpoint + restore"]
        if kind == "stages":
            header.insert(0, "stage")
        out += [table(header, rows), ""]
    return "\n".join(out).rstrip()


def data_path_hugetlbfs() -> str:
    huge_name = "datapath-hugetlbfs-h100-32g.json"
    huge = load(huge_name)
    hfp = (huge.get("footprints") or [{}])[0]

    def same_size(name):
        d = load(name)
        return d, next((fp for fp in d.get("footprints", []) if fp.get("gib") == hfp.get("gib")), {})

    runs = [(huge_name, huge, hfp), ("datapath-previous-defaults-h100.json", *same_size(
        "datapath-previous-defaults-h100.json")), ("shim-vs-driver-h100.json", *same_size("shim-vs-driver-h100.json"))]
    lines = [f"* `bench/results/{f}`: {d.get('device', MISSING)}, driver {d.get('driver', MISSING)}, "
             f"{d.get('date', MISSING)}; {config_text(copy_config(d, [fp]))}." for f, d, fp in runs]

    def rate(d, c, way):
        v = rate_of(c, way)
        return MISSING if v is None else gbps(v) + ("" if raw_share(d, c, way) is None
                                                   else f", {share(raw_share(d, c, way))}")

    def raw_rates(d):
        r = d.get("raw_pinned") or {}
        return MISSING if not r.get("d2h_GBps") else f"{gbps(r.get('d2h_GBps'))} / {gbps(r.get('h2d_GBps'))}"

    spec = [
        ("arena", lambda d, fp: f"`{get(fp, 'gpucr.one_time.arena_dir') or MISSING}`, "
                                f"{'hugetlbfs' if get(fp, 'gpucr.one_time.arena_hugetlb') else 'not hugetlbfs'}, "
                                f"{'pinned' if get(fp, 'gpucr.one_time.arena_pinned') else 'not pinned'}"),
        ("footprint", lambda d, fp: MISSING if fp.get("gib") is None else f"{fp['gib']:g} GiB"),
        ("copy threads / staging ring", lambda d, fp: f"{threads_of(fp) or MISSING} / "
                                                      f"{size(get(fp, 'gpucr.one_time.staging_bytes'))}"),
        ("**one-time** arena set-up at start", lambda d, fp: s(get(fp, "gpucr.one_time.arena_setup_s"))),
        ("&nbsp;&nbsp;create + pre-fault / staging ring", lambda d, fp: " / ".join(s(v) for v in setup_parts(fp))),
        ("raw pinned rate of the run, out / in", lambda d, fp: raw_rates(d)),
    ]
    for i, label in ((-1, "last"), (0, "first")):
        spec += [
            (f"{label} cycle: checkpoint, total (data / control)",
             lambda d, fp, i=i: (lambda c: f"{s(get(c, 'checkpoint.total_s'))} ({s(get(c, 'checkpoint.data_s'))} / "
                                           f"{s(get(c, 'checkpoint.control_s'))})")((cycles_of(fp) or [{}])[i])),
            (f"{label} cycle: restore, total (control / data)",
             lambda d, fp, i=i: (lambda c: f"{s(get(c, 'restore.total_s'))} ({s(get(c, 'restore.control_s'))} / "
                                           f"{s(get(c, 'restore.data_s'))})")((cycles_of(fp) or [{}])[i])),
            (f"{label} cycle: data out, share of raw pinned",
             lambda d, fp, i=i: rate(d, (cycles_of(fp) or [{}])[i], "checkpoint")),
            (f"{label} cycle: data in, share of raw pinned",
             lambda d, fp, i=i: rate(d, (cycles_of(fp) or [{}])[i], "restore")),
        ]
    header = ["", "hugetlbfs", "`/dev/shm`, previous defaults", "`/dev/shm`, main run"]
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


IPC_ANSWERS = [
    ("check_imported", "the target imports memory a helper made and filled: its data is there"),
    ("valid_after_exporter_dropped", "the helper drops its handle: the memory stays the target's"),
    ("valid_after_exporter_exited", "the helper exits: the memory stays the target's"),
    ("cycle_after_import_released", "the target releases it; driver lock, checkpoint, restore, unlock"),
    ("context_works_after_cycle_1", "the target's context works after that"),
    ("data_after_overlapped_restore", "memory filled by a second helper while the driver restored the target, "
                                      "mapped at the target's old addresses: its data is there"),
    ("cycle_after_second_import_released", "released again; another driver cycle"),
    ("cycle_after_export_released", "the target's own exported memory, copied out by a helper, released by "
                                    "both; a driver cycle"),
    ("context_works_after_cycle_4", "the target's context works after that"),
]


def ipc_probe() -> str:
    name = "ipcprobe-h100-16g.json"
    d = load(name)
    a = d["answers"]
    ov, out_copy = a.get("overlap") or {}, a.get("helper_copy_out") or {}
    head = [measured(d, name), ""]
    rows = [[text, yes(a.get(key)) if key in a else MISSING] for key, text in IPC_ANSWERS]
    gb = d["gib"] * 2**30 / 1e9
    figs = [
        ["a helper copies the target's exported memory out, into its own pinned memory",
         f"{s(out_copy.get('s'), 3)} ({gbps(out_copy.get('GBps'))})"],
        ["driver restore + unlock, with a helper filling new memory beside it",
         s(ov.get("driver_restore_unlock_s"), 3)],
        ["the helper: memory created + filled from its pinned memory",
         f"{s((ov.get('create_s') or 0) + (ov.get('fill_s') or 0), 3)} ({gbps(ov.get('fill_GBps'))})"],
        ["the target maps it at its old addresses", s(ov.get("import_map_s"), 4)],
        [f"**restored with its {gb:.1f} GB of data**, both at once", f"**{s(ov.get('restored_with_data_s'), 3)}**"],
        ["the same steps one after the other", s(ov.get("one_after_the_other_s"), 3)],
    ]
    return "\n".join(head + [table(["step", "worked"], rows), "", table(["", "seconds"], figs)])


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
        ("`image_h5_read`", "the .h5 read back into the process's arena, unchecked (a job restore's, after "
         "`image_verify_read`)", "image_h5_read", "image_h5_read/fs_read"),
        ("`image_h5_read_checked`", "the same, each block checked as it is read (`restore --from`'s one read)",
         "image_h5_read_checked", "image_h5_read_checked/fs_read"),
    ]
    rows = [[k, what, mbps(m.get(key)), MISSING if ratio is None or r.get(ratio) is None
             else f"{r[ratio]:.2f} of `{ratio.split('/')[1]}`"] for k, what, key, ratio in spec]
    return "\n".join(head + [table(["figure", "what", "rate", "share of the file system's"], rows)])


IMAGE_IO_FILES = ["image-io-h100-8g.json", "image-read-h100-8g-run1.json", "image-read-h100-8g-run2.json"]


def image_io() -> str:
    """Rounds of scripts/bench_image_io.py (and of its read-only first version)."""
    out = []
    for name in IMAGE_IO_FILES:
        d = load(name)
        rounds = d.get("rounds") or []
        out += [f"`bench/results/{name}`: {d.get('device', MISSING)}, driver {d.get('driver', MISSING)}, "
                f"{d.get('date', MISSING)}, {gib(d.get('bytes'))}, {len(rounds)} rounds.", ""]
        cols = [k for k in (rounds[0] if rounds else {}) if not k.endswith("_vs_fs") and not k.endswith("_best")]
        ratios = [k for k in (rounds[0] if rounds else {}) if k.endswith("_vs_fs")]
        header = ["round"] + [f"`{k}`" for k in cols] + [f"`{k}`" for k in ratios]
        rows = [[str(i + 1)] + [mbps(r.get(k)) for k in cols] + [f"**{r[k]:.2f}**" for k in ratios]
                for i, r in enumerate(rounds)]
        out += [table(header, rows), ""]
    return "\n".join(out).rstrip()


HELPER_RUNS = [("run 1", "shim-vs-driver-h100-helper.json"), ("run 2", "shim-vs-driver-h100-helper-run2.json"),
               ("run 3", "shim-vs-driver-h100-helper-run3.json"), ("run 4", "shim-vs-driver-h100-helper-run4.json"),
               ("run 5", "shim-vs-driver-h100-helper-run5.json"), ("run 6", "shim-vs-driver-h100-helper-run6.json"),
               ("run 7", "shim-vs-driver-h100-helper-run7.json"), ("run 8", "shim-vs-driver-h100-helper-run8.json"),
               ("auto arena", "shim-vs-driver-h100-helper-auto.json"),
               ("run 9", "shim-vs-driver-h100-helper-run9.json"), ("run 10", "shim-vs-driver-h100-helper-run10.json")]
# the runs of the code whose restore imports and maps while the helper's copies run
CURRENT_HELPER_RUNS = ("run 7", "run 8", "auto arena", "run 9", "run 10")


def data_path_helper_floor() -> str:
    """The prefilled restore of every copy helper run against 1/10 of the driver-only
    restore and against its floor: the bytes at the raw host-to-device rate."""
    header = ["run", "footprint", "driver-only restore", "1/10 of it", "the bytes at raw pinned",
              "prefilled restore (best / worst cycle)", "/ driver only", "/ the bytes at raw", "1/10 met"]
    rows = []
    for label, name in HELPER_RUNS:
        d = load(name)
        for fp in d.get("footprints", []):
            drv, fl = get(fp, "driver_only.restore_s"), get(fp, "ratios.physics_floor_in_s")
            pre = [t for t in (get(c, "restore.total_s") for c in get(fp, "gpucr.prefilled") or []) if t is not None]
            if fp.get("gib", 0) < 32 or drv is None or fl is None or not pre:
                continue
            rows.append([f"{label} ({d.get('date', '')[:16].replace('T', ' ')})", f"{fp['gib']:g} GiB", f"{drv:.2f} s",
                         f"{drv / 10:.2f} s", f"{fl:.2f} s", f"{min(pre):.2f} / {max(pre):.2f} s",
                         ratio(min(pre) / drv), f"{min(pre) / fl:.2f}",
                         "yes" if min(pre) <= drv / 10 else ("no: 1/10 is under the bytes at raw" if drv / 10 < fl
                                                              else "no")])
    return table(header, rows)


def data_path_helper_targets() -> str:
    """Each target of the data path, per copy helper run of the current code, from
    that run alone: the figures the benchmark's ratios take (the last cycle of
    each footprint; the restore is the prefilled one, what `restore` does)."""
    header = ["run", "data out, lowest share of raw", "data in, lowest share of raw",
              "checkpoint / driver only, from 32 GiB (worst)", "restore / driver only, from 32 GiB (worst)",
              "70 GB: data handed back (slowest cycle)", "1 GiB / driver only, checkpoint · restore (worst)",
              "all targets in this run"]
    rows = []
    for label, name in HELPER_RUNS:
        if label not in CURRENT_HELPER_RUNS:
            continue
        d = load(name)
        fps = [fp for fp in d.get("footprints", []) if fp.get("ratios")]
        if not fps:
            continue
        checks = []

        def worst(vals, pick, ok):
            vals = [(g, v) for g, v in vals if v is not None]
            if not vals:
                return "—"
            g, v = pick(vals, key=lambda x: x[1])
            checks.append(ok(v))
            return g, v

        out = worst([(fp["gib"], get(fp, "ratios.data_out_vs_raw")) for fp in fps], min, lambda v: v >= 0.8)
        inn = worst([(fp["gib"], get(fp, "ratios.data_in_vs_raw")) for fp in fps], min, lambda v: v >= 0.8)
        big = [fp for fp in fps if fp["gib"] >= 32]
        cp = worst([(fp["gib"], get(fp, "ratios.checkpoint_total_vs_driver")) for fp in big], max, lambda v: v <= 0.1)
        rs = worst([(fp["gib"], get(fp, "ratios.restore_prefilled_vs_driver")) for fp in big], max, lambda v: v <= 0.1)
        top = next((fp for fp in fps if fp["gib"] >= 70), None)
        hb = None
        if top:
            t = [get(c, "vram.data_handed_back_s") for c in cycles_of(top) + (get(top, "gpucr.prefilled") or [])]
            t = [v for v in t if v is not None]
            hb = max(t) if t else None
            if hb is not None:
                checks.append(hb <= 2.0)
        small = min(fps, key=lambda fp: fp["gib"])
        sm = [get(small, "ratios.checkpoint_total_vs_driver"), get(small, "ratios.restore_prefilled_vs_driver")]
        if None not in sm:
            checks.append(max(sm) <= 1.0)

        def pair(x, fmt):
            return x if isinstance(x, str) else f"{fmt(x[1])} ({x[0]:g} GiB)"

        rows.append([f"{label} ({d.get('date', '')[:16].replace('T', ' ')})", pair(out, share), pair(inn, share),
                     pair(cp, ratio), pair(rs, ratio),
                     f"{hb:.2f} s" if hb is not None else "not run (up to 32 GiB)",
                     " · ".join(f"{v:.2f}" for v in sm) if None not in sm else "—",
                     ("yes" if all(checks) else f"no: {len(checks) - sum(checks)} of {len(checks)} missed")
                     + ("" if top else " (no 70 GiB)")])
    return table(header, rows)


BLOCKS = {
    "job-gpu-slurm": job_gpu_slurm,
    "migration": migration,
    "gpu-remap": gpu_remap,
    "gpu-remap-probe": gpu_remap_probe,
    "data-path": data_path,
    "data-path-helper": lambda: data_path("shim-vs-driver-h100-helper.json"),
    "data-path-helper-run2": lambda: data_path("shim-vs-driver-h100-helper-run2.json"),
    "data-path-helper-run3": lambda: data_path("shim-vs-driver-h100-helper-run3.json"),
    "data-path-helper-run4": lambda: data_path("shim-vs-driver-h100-helper-run4.json"),
    "data-path-helper-run5": lambda: data_path("shim-vs-driver-h100-helper-run5.json"),
    "data-path-helper-run6": lambda: data_path("shim-vs-driver-h100-helper-run6.json"),
    "data-path-helper-run7": lambda: data_path("shim-vs-driver-h100-helper-run7.json"),
    "data-path-helper-auto": lambda: data_path("shim-vs-driver-h100-helper-auto.json"),
    "data-path-helper-floor": data_path_helper_floor,
    "data-path-helper-targets": data_path_helper_targets,
    "data-path-targets": data_path_targets,
    "data-path-runs": data_path_runs,
    "data-path-ab": data_path_ab,
    "data-path-tune": data_path_tune,
    "data-path-hugetlbfs": data_path_hugetlbfs,
    "ipc-probe": ipc_probe,
    "steady-state": steady_state,
    "image-store": image_store,
    "image-io": image_io,
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
