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


def data_path() -> str:
    name = "shim-vs-driver-h100.json"
    d = load(name)
    raw = d.get("raw_pinned") or {}
    head = [measured(d, name),
            f"Pinned copy rate measured in the same run ({raw.get('gib', MISSING)} GiB): "
            f"device to host {raw.get('d2h_GBps', 0):.1f} GB/s, host to device {raw.get('h2d_GBps', 0):.1f} GB/s.", ""]
    rows = []
    for fp in d.get("footprints", []):
        cyc = (get(fp, "gpucr.cycles") or [{}])[-1]
        rows.append([
            f"{fp['gib']:g} GiB",
            s(get(cyc, "checkpoint.total_s")),
            s(get(cyc, "checkpoint.data_s")),
            s(get(cyc, "checkpoint.control_s")),
            s(get(fp, "driver_only.checkpoint_s")),
            s(get(cyc, "restore.total_s")),
            s(get(fp, "driver_only.restore_s")),
            MISSING if get(fp, "ratios.data_out_GBps") is None else
            f"{fp['ratios']['data_out_GBps']:.1f} / {fp['ratios']['data_in_GBps']:.1f}",
            mib(get(cyc, "used_mib_after_checkpoint")),
            s(get(fp, "gpucr.arena_setup_s"), 1),
        ])
    return "\n".join(head + [table(
        ["footprint", "gpucr-hpc checkpoint", "of which data", "of which control", "driver only",
         "gpucr-hpc restore", "driver only", "data out / in, GB/s", "VRAM after", "arena set-up at start"],
        rows)])


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
    spec = [
        ("`fs_write`", "plain sequential write, fsync'd", "fs_write", None),
        ("`fs_read`", "plain sequential read, page cache dropped", "fs_read", None),
        ("`sha256`", "sha256 over memory (one stream)", "sha256", None),
        ("`image_h5_write`", "GPU buffers to a .h5 file, with checksums and fsync", "image_h5_write",
         "image_h5_write/fs_write"),
        ("`image_copy_write`", "a staged file copied into the image with its checksum", "image_copy_write",
         "image_copy_write/fs_write"),
        ("`image_verify_read`", "every file of an image re-read and checked", "image_verify_read",
         "image_verify_read/fs_read"),
        ("`image_h5_read`", "GPU buffers read back from the .h5", "image_h5_read", "image_h5_read/fs_read"),
    ]
    rows = [[k, what, mbps(m.get(key)), MISSING if ratio is None or r.get(ratio) is None
             else f"{r[ratio]:.2f} of `{ratio.split('/')[1]}`"] for k, what, key, ratio in spec]
    return "\n".join(head + [table(["figure", "what", "rate", "share of the file system's"], rows)])


BLOCKS = {
    "job-gpu-slurm": job_gpu_slurm,
    "migration": migration,
    "data-path": data_path,
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
