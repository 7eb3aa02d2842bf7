#!/usr/bin/env python3
"""In-place checkpoint speed of several commits side by side, on one GPU machine,
in one run: the 47 GB LLM check (bench/inplace_ab_llm.py: an 8B model's bf16
weights and a 30 GiB serving cache, decoding) under each commit's own
`gpucr-hpc run`, checkpointed in place (`checkpoint --pid`, `restore --pid`)
CYCLES times with that commit's defaults; one process at a time (the machine's
memory holds one arena of this size), the commits alternating A B C A B C ...

    bench/bench_inplace_ab.py --trees build/inplace-ab --names then was head \\
        --rounds 3 --cycles 3 --deadline 460 --out result.json

Each tree (bench/inplace-ab-prepare makes them) holds a commit's gpucr_hpc and
its built shim; its CLI runs from the tree (PYTHONPATH), as a user would run it.
Recorded per cycle: the CLI's wall time and phases (quiesce, data, control,
total), the shim's reply fields (prepare, copy, release, create, data path,
threads, stores, arena setup) and GB/s; per process: the arena's status before
the first cycle (how long `auto` took to make it), and whether the weights came
back whole; per run: the machine, GPUCR_* settings, raw pinned bandwidth before
and after. All processes must decode the same tokens (deterministic workload)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from common.gpucr_cli import run_gpucr
from common.machine import numa_of, settings, smi
from common.pinned import pinned_bandwidth
from common.record import utc_now, write_record
from common.stats import median

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "inplace_ab_llm.py"
SHIM_FIELDS = ("quiesce_s", "data_s", "prepare_s", "copy_s", "release_s", "create_s", "data_path", "copy_threads",
               "copy_stores", "copy_wait", "arena_setup_s", "allocations", "driver_path_bytes", "helper_fallback")
STATUS_FIELDS = ("arena_bytes", "arena_segments", "arena_dir", "arena_hugetlb", "arena_ready", "arena_prealloc",
                 "arena_pinned", "arena_setup_s", "staging_bytes", "numa_node", "numa_error", "allocations",
                 "gpu_bytes", "vmm_backing")


def sh(cmd: str) -> str:
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
    return (r.stdout + r.stderr).strip()


def machine() -> dict:
    return {"gpu": sh("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader"),
            "cpus": len(os.sched_getaffinity(0)), "kernel": sh("uname -r"),
            "lscpu": sh("lscpu | grep -E 'Model name|Socket|NUMA|L3|Thread'"),
            "numa_nodes": sh("ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l"),
            "gpu_numa_node": numa_of(smi("pci.bus_id")[0]),
            "memory": sh("free -g | head -2"), "dev_shm": sh("df -h /dev/shm | tail -1"),
            "thp": sh("cat /sys/kernel/mm/transparent_hugepage/enabled "
                      "/sys/kernel/mm/transparent_hugepage/shmem_enabled 2>&1"),
            "gpucr_env": settings("GPUCR_", "NCCL_")}


def shim_call(run_dir: Path, pid: int, cmd: str, timeout: float = 10.0) -> dict:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(run_dir / f"{pid}.sock"))
        s.sendall((json.dumps({"cmd": cmd}) + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return json.loads(buf)
    finally:
        s.close()


def find_phases(doc):
    """The object holding "phases" in a CLI answer (its layout changed between commits)."""
    if isinstance(doc, dict):
        if "phases" in doc:
            return doc
        for v in doc.values():
            got = find_phases(v)
            if got:
                return got
    return None


class Variant:
    def __init__(self, name: str, tree: Path):
        self.name, self.tree = name, tree.resolve()
        self.commit = (tree / "COMMIT").read_text().strip()
        self.env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
        self.env.update(PYTHONPATH=str(self.tree), GPUCR_SHIM=str(self.tree / "shim" / "libgpucr-cuda.so"),
                        NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")

    def cli(self, *args: str, timeout: float = 120) -> tuple[float, dict | None, str]:
        """This commit's gpucr-hpc ARGS, run from its tree: wall time, --json report, stderr if it failed."""
        run = run_gpucr(*args, env=self.env, cwd=str(self.tree), timeout=timeout)
        return run.wall_s, run.doc, (run.stderr[-800:] if run.rc else "")


def one_cycle(v: Variant, pid: int, run_dir: Path) -> dict:
    env_dir = ["--run-dir", str(run_dir)]
    c = {}
    for what, args in (("out", ["checkpoint", "--pid", str(pid), "--json"]),
                       ("back", ["restore", "--pid", str(pid), "--json"])):
        wall, doc, err = v.cli(*args, *env_dir)
        got = find_phases(doc) if doc else None
        if not got:
            raise RuntimeError(f"{v.name} {what}: {err or doc}")
        shim = got["processes"][0]
        gb = got["bytes"] / 1e9
        c[what] = {"wall_s": wall, **got["phases"], "GBps_data": gb / got["phases"]["data_s"],
                   "GBps_copy": gb / shim["copy_s"] if shim.get("copy_s") else None,
                   "shim": {k: shim[k] for k in SHIM_FIELDS if k in shim}, "bytes": got["bytes"]}
    c["control_s"] = c["out"]["control_s"] + c["back"]["control_s"]
    return c


def run_process(v: Variant, tag: str, cycles: int, cache_gib: float, args_wait: float = 120) -> dict:
    run_dir = Path(f"/tmp/gpucr-inplace-ab/{tag}")
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "decode.out"
    out.unlink(missing_ok=True)
    rec = {"variant": v.name, "commit": v.commit, "tag": tag}
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "gpucr_hpc", "run", "--run-dir", str(run_dir), "--",
                          sys.executable, str(WORKLOAD), str(out), "--cache-gib", str(cache_gib)],
                         cwd=v.tree, env=v.env, stdout=subprocess.DEVNULL, stderr=open(run_dir / "decode.err", "w"))
    try:
        while not (out.exists() and out.read_text().startswith("ready") and "\n" in out.read_text()):
            if p.poll() is not None or time.monotonic() - t0 > 180:
                raise RuntimeError(f"{tag}: workload not ready (rc {p.poll()}): "
                                   + (run_dir / "decode.err").read_text()[-1500:])
            time.sleep(0.2)
        rec["ready_s"] = time.monotonic() - t0
        ready = out.read_text().split("\n", 1)[0].split()
        rec["gpu_bytes"], rec["weights_at_start"] = int(ready[1]), ready[2]
        st = shim_call(run_dir, p.pid, "status")
        # the install's defaults: where they make the arena ahead (auto), wait until it holds the
        # footprint (arena_ready only says that it follows it: a checkpoint in the ~10 s an arena
        # of this size takes to grow waits for the growth, as the first run of 2026-11-28 did)
        t1 = time.monotonic()
        while st.get("arena_prealloc") not in (None, "off") and time.monotonic() - t1 < args_wait \
                and not (st.get("arena_ready") and st.get("arena_bytes", 0) >= st.get("gpu_bytes", 1)):
            time.sleep(0.25)
            st = shim_call(run_dir, p.pid, "status")
        rec["arena_wait_s"] = time.monotonic() - t1
        rec["status_before"] = {k: st[k] for k in STATUS_FIELDS if k in st}
        time.sleep(1.0)  # a few decode steps
        rec["cycles"] = []
        for i in range(cycles):
            c = one_cycle(v, p.pid, run_dir)
            c["cycle"] = i + 1
            rec["cycles"].append(c)
            print(f"  {tag} cycle {i + 1}: out {c['out']['total_s']:.3f} s (data {c['out']['data_s']:.3f}, "
                  f"copy {c['out']['shim'].get('copy_s', 0):.3f}, prepare {c['out']['shim'].get('prepare_s', 0):.3f}, "
                  f"control {c['out']['control_s']:.3f}) back {c['back']['total_s']:.3f} s "
                  f"(data {c['back']['data_s']:.3f}, copy {c['back']['shim'].get('copy_s', 0):.3f}, "
                  f"control {c['back']['control_s']:.3f}) {c['out']['GBps_copy'] or 0:.1f}/"
                  f"{c['back']['GBps_copy'] or 0:.1f} GB/s copy", flush=True)
            time.sleep(0.5)
        st = shim_call(run_dir, p.pid, "status")
        rec["status_after"] = {k: st[k] for k in STATUS_FIELDS if k in st}
        p.send_signal(signal.SIGUSR1)
        p.wait(timeout=60)
        lines = out.read_text().splitlines()
        rec["weights_at_end"] = next((ln.split()[1] for ln in lines if ln.startswith("weights ")), None)
        rec["weights_whole"] = rec["weights_at_end"] == rec["weights_at_start"]
        rec["tokens"] = [ln.split()[2] + ":" + ln.split()[3] for ln in lines if ln.startswith("step ")]
        rec["rc"] = p.returncode
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)
        rec["process_s"] = time.monotonic() - t0
    return rec


def summarize(records: list[dict], names: list[str]) -> dict:
    out = {}
    for n in names:
        rs = [r for r in records if r["variant"] == n and r.get("cycles")]
        s = {"processes": len(rs)}
        for label, pick in (("first", lambda cs: cs[:1]), ("later", lambda cs: cs[1:])):
            cs = [c for r in rs for c in pick(r["cycles"])]
            if not cs:
                continue
            s[label] = {"cycles": len(cs), **{
                f"{d}_{k}": median([c[d].get(k, c[d]["shim"].get(k)) for c in cs])
                for d in ("out", "back")
                for k in ("total_s", "wall_s", "quiesce_s", "data_s", "control_s", "prepare_s", "copy_s",
                          "release_s", "create_s", "arena_setup_s", "GBps_copy", "GBps_data")},
                "control_s": median([c["control_s"] for c in cs])}
        s["arena_wait_s"] = median([r.get("arena_wait_s") for r in rs])
        s["weights_whole"] = all(r.get("weights_whole") for r in rs)
        out[n] = s
    return out


def table(summary: dict, names: list[str]) -> str:
    rows = [("cycles", "cycles", "{}")] + [(t, k, "{:.1f}" if "GBps" in k else "{:.3f}") for t, k in (
        ("out total s", "out_total_s"), ("out CLI wall s", "out_wall_s"), ("  quiesce s", "out_quiesce_s"),
        ("  data s", "out_data_s"), ("    prepare s", "out_prepare_s"), ("    copy s", "out_copy_s"),
        ("    release s", "out_release_s"), ("    arena setup s", "out_arena_setup_s"),
        ("  control s", "out_control_s"), ("  copy GB/s", "out_GBps_copy"),
        ("back total s", "back_total_s"), ("back CLI wall s", "back_wall_s"), ("  control s", "back_control_s"),
        ("  data s", "back_data_s"), ("    create s", "back_create_s"), ("    copy s", "back_copy_s"),
        ("  copy GB/s", "back_GBps_copy"), ("control out+back s", "control_s"))]
    lines = []
    for label in ("first", "later"):
        lines.append(f"\n{label} cycles (medians)".ljust(22) + "".join(f"{n:>14}" for n in names))
        for title, key, fmt in rows:
            cells = []
            for n in names:
                s = summary.get(n, {}).get(label) or {}
                cells.append(fmt.format(s[key]) if s.get(key) is not None else "-")
            lines.append(f"{title:<22}" + "".join(f"{c:>14}" for c in cells))
    lines.append(f"{'arena wait (auto) s':<22}" + "".join(
        f"{(summary[n]['arena_wait_s'] or 0):>14.2f}" if n in summary else f"{'-':>14}" for n in names))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", type=Path, default=Path("build/inplace-ab"))
    ap.add_argument("--names", nargs="+", default=None, help="default: the tree's NAMES file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--cache-gib", type=float, default=30.0)
    ap.add_argument("--deadline", type=float, default=460, help="seconds: no process starts that may end after")
    ap.add_argument("--raw-gib", type=float, default=8.0)
    ap.add_argument("--no-arena-wait", action="store_true",
                    help="checkpoint as soon as the program is ready, also while an auto arena still grows")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t_start = time.monotonic()
    names = args.names or (args.trees / "NAMES").read_text().split()
    variants = [Variant(n, args.trees / n) for n in names]
    res = {"date": utc_now(),
           "what": "47 GB LLM check in place: 8B model bf16 + serving cache, one process at a time, "
                   "commits alternating",
           "cache_gib": args.cache_gib, "cycles_per_process": args.cycles, "machine": machine(),
           "arena_wait": not args.no_arena_wait,
           "variants": {v.name: v.commit for v in variants},
           "raw_pinned_before": pinned_bandwidth(args.raw_gib, timeout=120),
           "records": []}
    print(json.dumps(res["machine"], indent=1), "\nraw pinned before:", res["raw_pinned_before"], flush=True)
    longest = 0.0
    try:
        for r in range(args.rounds):
            for v in variants:
                left = args.deadline - (time.monotonic() - t_start)
                if left < max(longest * 1.15, 30):
                    print(f"deadline: round {r} {v.name} not started ({left:.0f} s left)", flush=True)
                    raise StopIteration
                print(f"round {r} {v.name} ({v.commit[:7]})", flush=True)
                try:
                    rec = run_process(v, f"{v.name}-{r}", args.cycles, args.cache_gib,
                                      0 if args.no_arena_wait else 120)
                except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
                    rec = {"variant": v.name, "tag": f"{v.name}-{r}", "error": str(e)[-2000:]}
                    print("  error:", rec["error"], flush=True)
                rec["round"] = r
                res["records"].append(rec)
                longest = max(longest, rec.get("process_s", 0))
    except StopIteration:
        pass
    finally:
        res["raw_pinned_after"] = pinned_bandwidth(args.raw_gib, timeout=120)
        toks = [r.get("tokens", []) for r in res["records"] if r.get("tokens")]
        n = min((len(t) for t in toks), default=0)
        res["tokens_compared"] = n
        res["tokens_identical"] = bool(toks) and all(t[:n] == toks[0][:n] for t in toks)
        for r in res["records"]:
            r.pop("tokens", None)
        res["summary"] = summarize(res["records"], names)
        res["elapsed_s"] = time.monotonic() - t_start
        write_record(args.out, res)
    print("raw pinned after:", res["raw_pinned_after"])
    print(table(res["summary"], names))
    print(f"tokens identical over {res['tokens_compared']} steps in every process: {res['tokens_identical']}; "
          f"weights whole: {all(r.get('weights_whole') for r in res['records'])}")
    return 0 if res["tokens_identical"] and all(r.get("weights_whole") for r in res["records"]) else 1


if __name__ == "__main__":
    sys.exit(main())
