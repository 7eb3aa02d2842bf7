#!/usr/bin/env python3
"""On a machine with 2+ GPUs: a PyTorch DDP (or FSDP) job over NCCL, checkpointed
in place and restored CYCLES times, against an uninterrupted run of the same job.

  1. the reference: `torchrun --nproc-per-node N tests/shim_workloads/{ddp,fsdp}_nccl.py`;
  2. the same job, measured, along one of two paths:
     --path shim (default): under `gpucr-hpc run`, with CYCLES in-place checkpoints
       (the NCCL cut, teardown, the shims' copy-out and the driver checkpoint of
       every rank) and restores (driver, shims, communicators rebuilt);
     --path driver: plain torchrun, no shim; each cycle applies the driver API
       (NvidiaDriver, in a helper process) to every rank: lock all, checkpoint
       all, then restore all, unlock all. With NCCL's default transports this
       is expected to fail or hang (FACTS.md): the cycle's outcome says which,
       bounded by --cycle-timeout;
     each cycle timed, with the GPU memory in use per GPU after each checkpoint,
     and the time from the end of each restore to the first new step of every
     rank (`first_step_after_restore_s`; `step_period_s` is the same figure
     between two ordinary steps);
  3. checks: bit-identical per-step losses and final checksums on every rank,
     GPU memory given back, no step while checkpointed, the NCCL transport in
     use (its INFO log: P2P with --transport default, NET with p2p-off), every
     cycle done.
--transport p2p-off sets NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 for both runs.
Writes --out (JSON; every failure lands there with its reason) and prints one
line per cycle. Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # common: what the benchmarks and the GPU checks share

from common.machine import used_mib_per_gpu  # noqa: E402
from common.record import write_record  # noqa: E402
from common.stats import median  # noqa: E402

from gpucr_hpc.criu.run import process_tree  # noqa: E402

WORKLOADS = {"ddp": REPO / "tests" / "shim_workloads" / "ddp_nccl.py",
             "fsdp": REPO / "tests" / "shim_workloads" / "fsdp_nccl.py"}
WORKLOAD = WORKLOADS["ddp"]
TRANSPORT_ENV = {"default": {}, "p2p-off": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}}
# NCCL's INFO log (stdout): "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", "... via NET/Socket/0"
TRANSPORT_RE = re.compile(r"\bvia ((P2P|SHM|NET|COLLNET)(?:/\S*)?)")
TRANSPORT_ORDER = ("P2P", "SHM", "NET", "COLLNET")
STEP_RE = re.compile(r"^rank (\d+) step (\d+) ")
DRIVER_LOCK_MS = 20_000


class Failed(Exception):
    """A step of the verification that did not work; its message goes to the JSON."""


class Terminated(BaseException):
    """SIGTERM (the benchmark's time limit): clean up and write what we have."""


# -- pure helpers (tests/test_bench_nccl_parse.py) -------------------------------

def transports(lines) -> list[str]:
    """The transports NCCL's INFO log names ("P2P/CUMEM/read", "NET/Socket/0"), sorted."""
    return sorted({m.group(1) for ln in lines for m in [TRANSPORT_RE.search(ln)] if m})


def transport_of(lines) -> str | None:
    """The leading word of the transport NCCL used most ("P2P", "SHM", "NET"), None when
    the log names none (NCCL_DEBUG=INFO not honoured, or no channel connected)."""
    counts: dict[str, int] = {}
    for ln in lines:
        m = TRANSPORT_RE.search(ln)
        if m:
            counts[m.group(2)] = counts.get(m.group(2), 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda k: (counts[k], -TRANSPORT_ORDER.index(k)))


def parse_step(line: str) -> tuple[int, int] | None:
    m = STEP_RE.match(line)
    return (int(m.group(1)), int(m.group(2))) if m else None


def first_step_after(arrivals: dict[int, dict[int, float]], t_end: float, ranks: int):
    """From t_end to the first step line of every rank that came after it: (the
    slowest rank's delay, each rank's), None where a rank printed none."""
    per = []
    for r in range(ranks):
        after = [t for t in arrivals.get(r, {}).values() if t >= t_end]
        per.append(round(min(after) - t_end, 6) if after else None)
    done = [x for x in per if x is not None]
    worst = max(done) if done and len(done) == len(per) else None
    return worst, per


def step_period(arrivals: dict[int, dict[int, float]], ranks: int, gaps=(), skip: int = 3) -> float | None:
    """The median time between two ordinary steps: step i is done when every rank
    printed it; intervals that hold a checkpoint (gaps: (start, end)) or that are among
    the first `skip` steps (start-up, communicators made lazily) do not count."""
    common = set.intersection(*(set(arrivals.get(r, {})) for r in range(ranks))) if ranks else set()
    done = {i: max(arrivals[r][i] for r in range(ranks)) for i in common}
    out = []
    for i in sorted(done):
        if i < skip or i - 1 not in done:
            continue
        a, b = done[i - 1], done[i]
        if any(g0 <= b and g1 >= a for g0, g1 in gaps):
            continue
        out.append(b - a)
    return median(out, digits=6)  # seconds, to the microsecond


def first_difference(ref: list[str], got: list[str]) -> int | None:
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return i
    return None if len(ref) == len(got) else min(len(ref), len(got))


# -- processes ------------------------------------------------------------------

def descendants(pid: int) -> list[int]:
    """pid's descendants, parents first."""
    return process_tree(pid)[1:]


def uses_cuda(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return any("libcuda.so" in line for line in maps)
    except OSError:
        return False


def kill_pids(pids) -> None:
    for p in reversed(list(pids)):  # leaves first
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def used_mib() -> list[int]:
    """GPU memory in use per GPU; [] where nvidia-smi cannot say (a cycle is recorded all the same)."""
    try:
        return used_mib_per_gpu()
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


class Proc:
    """A launched job whose output lines are collected as they come, each with its
    arrival time (time.monotonic()); step lines are indexed per rank."""

    def __init__(self, cmd, env):
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.times: list[float] = []
        self.err: list[str] = []
        self.arrivals: dict[int, dict[int, float]] = {}  # rank -> step -> arrival
        self.lock = threading.Lock()
        self.pumps = [threading.Thread(target=self._pump, args=(self.p.stdout, self.lines, True), daemon=True),
                      threading.Thread(target=self._pump, args=(self.p.stderr, self.err, False), daemon=True)]
        for t in self.pumps:
            t.start()

    def _pump(self, stream, into, timed):
        for line in stream:
            now = time.monotonic()
            line = line.rstrip("\n")
            if timed:
                self.times.append(now)
                rs = parse_step(line)
                if rs:
                    with self.lock:
                        self.arrivals.setdefault(rs[0], {})[rs[1]] = now
            into.append(line)

    def snapshot(self) -> dict[int, dict[int, float]]:
        with self.lock:
            return {r: dict(d) for r, d in self.arrivals.items()}

    def steps(self, rank: int) -> int:
        with self.lock:
            return len(self.arrivals.get(rank, {}))

    def min_steps(self, ranks: int) -> int:
        return min(self.steps(r) for r in range(ranks))

    def wait_steps(self, n: int, ranks: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(self.steps(r) >= n for r in range(ranks)):
                return True
            if self.p.poll() is not None:
                return False
            time.sleep(0.01)
        return False

    def wait_after(self, t: float, ranks: int, timeout: float) -> bool:
        """Until every rank printed a step after t."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if first_step_after(self.snapshot(), t, ranks)[0] is not None:
                return True
            if self.p.poll() is not None:
                return False
            time.sleep(0.01)
        return False

    def kill_tree(self) -> None:
        if self.p.poll() is None:
            kill_pids([self.p.pid] + descendants(self.p.pid))  # torchrun's workers have their own session
        else:
            kill_pids(descendants(self.p.pid))

    def finish(self, timeout: float) -> int | None:
        """The exit status; on timeout the whole tree is killed (None if it would not die)."""
        try:
            rc: int | None = self.p.wait(max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            self.kill_tree()
            try:
                rc = self.p.wait(15)
            except subprocess.TimeoutExpired:
                rc = None
        for t in self.pumps:
            t.join(10)
        return rc

    def results(self, ranks: int) -> dict[int, list[str]]:
        return {r: [ln for ln in self.lines if ln.startswith(f"rank {r} ")] for r in range(ranks)}

    def err_tail(self, n: int = 30) -> list[str]:
        return [ln for ln in self.err if "NCCL INFO" not in ln][-n:]


def call_with_timeout(fn, timeout: float, what: str):
    """fn() in a thread; Failed when it raises or has not returned within timeout."""
    box: dict = {}

    def go():
        try:
            box["value"] = fn()
        except BaseException as ex:  # noqa: BLE001 - handed to the caller
            box["error"] = ex

    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        raise Failed(f"{what} hung: no return within {timeout:.0f} s")
    if "error" in box:
        ex = box["error"]
        raise Failed(f"{what} failed: {type(ex).__name__}: {ex}")
    return box["value"]


# -- the two paths of a cycle ------------------------------------------------------

class ShimCycler:
    """gpucr: in_place.checkpoint_tree / restore_tree on the `gpucr-hpc run` tree."""

    def __init__(self, proc: Proc, run_dir: Path, timeout: float):
        from gpucr_hpc.process import in_place

        self.in_place, self.pid, self.run_dir, self.timeout = in_place, proc.p.pid, run_dir, timeout

    def checkpoint(self, e: dict) -> None:
        t0 = time.monotonic()
        cp = call_with_timeout(lambda: self.in_place.checkpoint_tree(self.pid, timeout_ms=30000,
                                                                     run_dir=self.run_dir),
                               self.timeout, "checkpoint")
        e["checkpoint_s"] = round(time.monotonic() - t0, 3)
        e["checkpoint"] = cp["phases"]
        e["checkpoint_bytes"] = cp["bytes"]

    def restore(self, e: dict) -> float:
        t0 = time.monotonic()
        rs = call_with_timeout(lambda: self.in_place.restore_tree(self.pid, run_dir=self.run_dir),
                               self.timeout, "restore")
        t_end = time.monotonic()
        e["restore_s"] = round(t_end - t0, 3)
        e["restore"] = rs["phases"]
        return t_end

    def close(self) -> None:
        pass


class DriverCycler:
    """The driver API alone on every rank, from a helper process (this script's
    `_driver_helper`): a call that hangs in the driver is bounded by a timeout and
    the helper killed, rather than this script hanging with it."""

    def __init__(self, proc: Proc, ranks: int, timeout: float, env: dict):
        self.timeout = timeout
        self.pids = [p for p in descendants(proc.p.pid) if uses_cuda(p)]
        if len(self.pids) != ranks:
            raise Failed(f"found {len(self.pids)} CUDA processes under torchrun ({self.pids}), expected {ranks}")
        self.h = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_driver_helper",
                                   *map(str, self.pids)], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.q: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()
        try:
            m = self.get("driver API start-up")
            if m.get("event") != "ready":
                raise Failed(f"driver API unavailable: {m.get('error')}")
        except Failed:
            self.close()
            raise

    def _pump_err(self):
        assert self.h.stderr is not None
        for line in self.h.stderr:
            self.err.append(line)

    def _pump(self):
        assert self.h.stdout is not None
        for line in self.h.stdout:
            self.q.put(line)
        self.q.put(None)

    def get(self, what: str) -> dict:
        try:
            line = self.q.get(timeout=self.timeout)
        except queue.Empty:
            raise Failed(f"{what} hung: no answer from the driver within {self.timeout:.0f} s")
        if line is None:
            raise Failed(f"{what}: the driver helper ended: {''.join(self.err[-10:])}")
        return json.loads(line)

    def send(self, cmd: str) -> None:
        assert self.h.stdin is not None
        try:
            self.h.stdin.write(cmd + "\n")
            self.h.stdin.flush()
        except OSError as ex:
            raise Failed(f"the driver helper is gone ({ex}): {''.join(self.err[-10:])}")

    def checkpoint(self, e: dict) -> None:
        e["pids"] = self.pids
        self.send("checkpoint")
        m = self.get("lock + checkpoint")
        e["checkpoint"] = m["phases"]
        e["checkpoint_s"] = round(m["phases"]["total_s"], 3)
        e["driver_states"] = m.get("states")
        if m["errors"]:
            e["undo"] = m.get("undo")
            raise Failed(f"driver checkpoint failed: {m['errors']}")

    def restore(self, e: dict) -> float:
        self.send("restore")
        m = self.get("restore + unlock")
        e["restore"] = m["phases"]
        e["restore_s"] = round(m["phases"]["total_s"], 3)
        e["driver_states_after_restore"] = m.get("states")
        if m["errors"]:
            raise Failed(f"driver restore failed: {m['errors']}")
        return m["t_end"]

    def close(self) -> None:
        if self.h.poll() is None:
            try:
                self.send("quit")
                self.h.wait(5)
            except (Failed, subprocess.TimeoutExpired):
                self.h.kill()
                try:
                    self.h.wait(5)
                except subprocess.TimeoutExpired:
                    pass


def driver_helper(pids: list[int]) -> int:
    """Commands on stdin (checkpoint, restore, quit), one JSON line per answer."""
    def emit(d):
        print(json.dumps(d), flush=True)

    def parallel(fn, what):
        errors: dict[str, str] = {}

        def one(p):
            try:
                fn(p)
            except Exception as ex:  # noqa: BLE001 - reported
                errors[f"{what} {p}"] = f"{type(ex).__name__}: {ex}"
        threads = [threading.Thread(target=one, args=(p,)) for p in pids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors

    try:
        from gpucr_hpc.gpu.driver_nvidia import NvidiaDriver

        drv = NvidiaDriver()
    except Exception as ex:  # noqa: BLE001 - reported
        emit({"event": "error", "error": f"{type(ex).__name__}: {ex}"})
        return 1

    def states():
        out = {}
        for p in pids:
            try:
                out[str(p)] = drv.state(p)
            except Exception as ex:  # noqa: BLE001 - reported
                out[str(p)] = f"{type(ex).__name__}: {ex}"
        return out

    def undo_checkpoint(st: dict) -> dict[str, str]:
        out = parallel(lambda p: drv.restore(p) if st[str(p)] == "checkpointed" else None, "restore")
        out.update(parallel(lambda p: drv.unlock(p) if st[str(p)] in ("checkpointed", "locked") else None, "unlock"))
        return out

    emit({"event": "ready"})
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "checkpoint":
            t0 = time.monotonic()
            errors = parallel(lambda p: drv.lock(p, DRIVER_LOCK_MS), "lock")
            t1 = time.monotonic()
            if not errors:
                errors = parallel(drv.checkpoint, "checkpoint")
            t2 = time.monotonic()
            undo: dict[str, str] = {}
            if errors:  # as in_place.driver_checkpoint: back to running where it can
                undo = undo_checkpoint(states())
            emit({"event": "checkpointed", "errors": errors, "undo": undo, "states": states(),
                  "phases": {"lock_s": t1 - t0, "checkpoint_s": t2 - t1, "total_s": t2 - t0}})
        elif cmd == "restore":
            t0 = time.monotonic()
            errors = parallel(drv.restore, "restore")
            t1 = time.monotonic()
            errors.update(parallel(drv.unlock, "unlock"))  # tried even after a failed restore
            t2 = time.monotonic()
            emit({"event": "restored", "errors": errors, "states": states(), "t_end": t2,
                  "phases": {"restore_s": t1 - t0, "unlock_s": t2 - t1, "total_s": t2 - t0}})
        elif cmd == "quit":
            break
    return 0


# -- the verification ---------------------------------------------------------------

class Clock:
    def __init__(self, budget_s: float | None):
        self.end = time.monotonic() + budget_s if budget_s else math.inf

    def left(self, want: float) -> float:
        return max(1.0, min(want, self.end - time.monotonic()))


def launch(args, steps: int) -> list[str]:
    return ["torchrun", "--standalone", f"--nproc-per-node={args.ranks}", str(WORKLOADS[args.workload]), str(steps),
            str(args.ballast_gib), str(args.pace), str(args.subgroup_from)]


def reference_key(args, steps: int) -> dict:
    return {"workload": args.workload, "transport": args.transport, "ranks": args.ranks, "steps": steps,
            "ballast_gib": args.ballast_gib, "pace": args.pace, "subgroup_from": args.subgroup_from}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="ddp")
    ap.add_argument("--transport", choices=sorted(TRANSPORT_ENV), default="default",
                    help="p2p-off: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (both runs)")
    ap.add_argument("--path", choices=("shim", "driver"), default="shim",
                    help="shim: gpucr-hpc run + in-place checkpoint/restore; driver: the driver API alone")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--steps-per-cycle", type=int, default=20)
    ap.add_argument("--ballast-gib", type=float, default=2.0)
    ap.add_argument("--pace", type=float, default=0.02)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds each checkpoint is held")
    ap.add_argument("--subgroup-from", type=int, default=-1)
    ap.add_argument("--run-dir", default="/tmp/gpucr-nccl-run")
    ap.add_argument("--timeout", type=float, default=400, help="seconds each run may take to finish")
    ap.add_argument("--cycle-timeout", type=float, default=60,
                    help="seconds a checkpoint or a restore may take before the cycle counts as hung")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="the whole verification ends within about this many seconds (waits are cut short)")
    ap.add_argument("--reference", help="a reference saved by --reference-out (same settings), instead of a run")
    ap.add_argument("--reference-out", help="save the reference run's output here")
    ap.add_argument("--logs", help="folder for both runs' whole stdout + stderr")
    return ap.parse_args(argv)


def get_reference(args, env, steps, clock, res, jobs) -> dict[int, list[str]]:
    key = reference_key(args, steps)
    if args.reference:
        try:
            saved = json.loads(Path(args.reference).read_text())
        except (OSError, ValueError):
            saved = None
        if saved and saved.get("key") == key:
            res["reference_from"] = args.reference
            res["reference_step_period_s"] = saved.get("step_period_s")
            res["reference_nccl_transport"] = saved.get("nccl_transport")
            return {int(r): v for r, v in saved["lines"].items()}
        res["reference_note"] = f"{args.reference} missing or made with other settings: the reference was run"
    t = time.monotonic()
    ref = Proc(launch(args, steps), env)
    jobs["reference"] = ref
    rc = ref.finish(clock.left(args.timeout))
    res["reference_s"] = round(time.monotonic() - t, 2)
    res["reference_rc"] = rc
    res["reference_step_period_s"] = step_period(ref.snapshot(), args.ranks)
    res["reference_nccl_transport"] = transport_of(ref.lines + ref.err)
    if rc != 0:
        raise Failed(f"reference run failed rc={rc}: {ref.err_tail()}")
    lines = ref.results(args.ranks)
    if args.reference_out:
        write_record(args.reference_out, {"key": key, "lines": lines, "step_period_s": res["reference_step_period_s"],
                                          "nccl_transport": res["reference_nccl_transport"]}, indent=None)
    return lines


def run_cycles(args, proc: Proc, cycler, cycles: list, gaps: list, baseline: list[int], clock: Clock) -> None:
    for c in range(args.cycles):
        if not proc.wait_steps(proc.min_steps(args.ranks) + args.steps_per_cycle // 2, args.ranks, clock.left(120)):
            raise Failed(f"no progress before cycle {c}")
        e: dict = {"cycle": c, "used_mib_before": used_mib(), "outcome": "checkpoint"}
        cycles.append(e)
        t0 = time.monotonic()
        e["t_checkpoint_start_s"] = round(t0 - proc.t0, 3)
        gaps.append((t0, math.inf))  # until the restore ends
        try:
            cycler.checkpoint(e)
        except Failed as ex:
            e["outcome"] = str(ex)
            raise
        e["used_mib_after_checkpoint"] = after = used_mib()
        e["vram_freed_bytes"] = sum(max(b - a, 0) for b, a in zip(e["used_mib_before"], after)) * 2**20
        at = [proc.steps(r) for r in range(args.ranks)]
        time.sleep(args.pause)
        e["steps_while_checkpointed"] = sum(proc.steps(r) for r in range(args.ranks)) - sum(at)
        e["outcome"] = "restore"
        try:
            t_end = cycler.restore(e)
        except Failed as ex:
            e["outcome"] = str(ex)
            raise
        gaps[-1] = (t0, t_end)
        e["t_restore_end_s"] = round(t_end - proc.t0, 3)
        e["used_mib_after_restore"] = used_mib()
        if not proc.wait_after(t_end, args.ranks, clock.left(args.cycle_timeout)):
            e["outcome"] = f"no step of every rank within {args.cycle_timeout:.0f} s of the restore"
            raise Failed(f"cycle {c}: {e['outcome']}")
        e["first_step_after_restore_s"], e["first_step_after_restore_per_rank_s"] = \
            first_step_after(proc.snapshot(), t_end, args.ranks)
        e["outcome"] = "ok"
        print(f"cycle {c}: steps {at}, used {e['used_mib_before']} -> {e['used_mib_after_checkpoint']} -> "
              f"{e['used_mib_after_restore']} MiB; checkpoint {e['checkpoint_s']} s {e['checkpoint']}; "
              f"restore {e['restore_s']} s {e['restore']}; first step after {e['first_step_after_restore_s']} s",
              flush=True)


def verify(args, res: dict, jobs: dict) -> None:
    clock = Clock(args.budget_s)
    steps = res["steps"]
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", NCCL_NVLS_ENABLE="0", NCCL_DEBUG="INFO",
               PYTHONPATH=str(REPO), **TRANSPORT_ENV[args.transport])
    env.pop("LD_PRELOAD", None)
    baseline = used_mib()
    res["baseline_mib"] = baseline
    ref_out = get_reference(args, env, steps, clock, res, jobs)
    run_dir = Path(args.run_dir)
    cmd = launch(args, steps)
    if args.path == "shim":
        shim_env = dict(env, GPUCR_RUN_DIR=str(run_dir), GPUCR_SHIM=str(REPO / "shim" / "libgpucr-cuda.so"))
        proc = Proc([sys.executable, "-m", "gpucr_hpc", "run", "--"] + cmd, shim_env)
    else:
        proc = Proc(cmd, env)
    jobs["measured"] = proc
    cycles: list[dict] = []
    gaps: list[tuple[float, float]] = []
    res["cycles"] = cycles
    cycler: ShimCycler | DriverCycler | None = None
    try:
        if not proc.wait_steps(3, args.ranks, clock.left(180)):
            raise Failed(f"the measured run made no progress: {proc.err_tail()}")
        if args.path == "shim":
            cycler = ShimCycler(proc, run_dir, args.cycle_timeout)
        else:
            cycler = DriverCycler(proc, args.ranks, args.cycle_timeout, env)
        run_cycles(args, proc, cycler, cycles, gaps, baseline, clock)
    except Exception as ex:  # noqa: BLE001 - the report says what broke
        res["error"] = str(ex) if isinstance(ex, Failed) else f"{type(ex).__name__}: {ex}"
        print(res["error"], flush=True)
    except Terminated:
        res["error"] = "terminated (SIGTERM: the caller's time limit)"
        proc.kill_tree()
        raise
    finally:
        if cycler:
            cycler.close()
        # a job whose cycle failed may hang for good (the driver path with P2P): a short wait
        rc = proc.finish(clock.left(30 if "error" in res else args.timeout))
    res["shim_rc" if args.path == "shim" else "job_rc"] = rc
    res["job_rc"] = rc
    res["shim_stderr_tail" if args.path == "shim" else "job_stderr_tail"] = proc.err_tail(40)
    res["nccl_transports"] = transports(proc.lines + proc.err)
    res["nccl_transport"] = transport_of(proc.lines + proc.err)
    res["step_period_s"] = step_period(proc.snapshot(), args.ranks, gaps)
    shim_out = proc.results(args.ranks)
    ck = res["checks"]
    ck["completed"] = rc == 0 and "error" not in res
    ck["bit_identical"] = all(ref_out.get(r) == shim_out[r] and len(shim_out[r]) == steps + 1
                              for r in range(args.ranks))
    for r in range(args.ranks):
        diff = first_difference(ref_out.get(r, []), shim_out[r])
        if diff is not None:
            a, b = ref_out.get(r, []), shim_out[r]
            res.setdefault("first_difference", {})[r] = {"line": diff, "reference": a[diff] if diff < len(a) else None,
                                                         "measured": b[diff] if diff < len(b) else None}
    if args.transport == "default":
        ck["p2p_in_use"] = any(x.startswith("P2P/") for x in res["nccl_transports"])
    else:
        ck["p2p_shm_off"] = res["nccl_transport"] == "NET"
    ck["all_cycles_done"] = len(cycles) == args.cycles and all(e.get("outcome") == "ok" for e in cycles)
    if cycles and baseline:
        ck["vram_after_checkpoint_le_64MiB"] = all(u - b <= 64 for e in cycles if "used_mib_after_checkpoint" in e
                                                   for u, b in zip(e["used_mib_after_checkpoint"], baseline))
        ck["no_progress_while_checkpointed"] = all(e.get("steps_while_checkpointed", 0) == 0 for e in cycles)


def summarize(res: dict) -> None:
    cycles = res.get("cycles", [])
    ck = res["checks"]
    res["restored"] = bool(ck.get("completed") and ck.get("all_cycles_done"))
    res["identical"] = bool(ck.get("bit_identical"))
    for key in ("checkpoint_s", "restore_s", "first_step_after_restore_s"):
        res[f"{key.removesuffix('_s')}_median_s"] = median((e.get(key) for e in cycles if e.get("outcome") == "ok"),
                                                           digits=6)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_driver_helper":
        return driver_helper([int(p) for p in argv[1:]])
    args = parse_args(argv)
    steps = args.cycles * args.steps_per_cycle + 10
    res: dict = {"workload": args.workload, "transport": args.transport, "path": args.path, "ranks": args.ranks,
                 "steps": steps, "cycles_planned": args.cycles, "ballast_gib": args.ballast_gib, "checks": {},
                 "subgroup_from": args.subgroup_from}

    def terminate(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)  # given back at the end: a caller's, or a test's
    jobs: dict[str, Proc] = {}
    t0 = time.monotonic()
    try:
        verify(args, res, jobs)
    except (Exception, Terminated, KeyboardInterrupt) as ex:
        why = "terminated (SIGTERM: the caller's time limit)" if isinstance(ex, Terminated) else \
            f"{type(ex).__name__}: {ex}"
        res["error"] = res.get("error") or why
        print(res["error"], flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for p in jobs.values():
            if p.p.poll() is None:
                p.kill_tree()
        res["wall_s"] = round(time.monotonic() - t0, 2)
        try:
            summarize(res)
        except Exception as ex:  # noqa: BLE001 - the JSON is written anyway
            res["summary_error"] = f"{type(ex).__name__}: {ex}"
        if args.logs:
            try:
                Path(args.logs).mkdir(parents=True, exist_ok=True)
                for name, p in jobs.items():
                    name = "shim" if name == "measured" and args.path == "shim" else name
                    name = "driver" if name == "measured" else name
                    Path(args.logs, f"{Path(args.out).stem}-{name}.log").write_text("\n".join(p.lines + p.err))
            except OSError as ex:
                res["logs_error"] = str(ex)
        write_record(args.out, res)
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps(res["checks"]), flush=True)
    return 0 if res["checks"] and all(res["checks"].values()) and "error" not in res else 1


if __name__ == "__main__":
    sys.exit(main())
