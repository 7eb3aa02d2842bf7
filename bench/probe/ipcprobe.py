#!/usr/bin/env python3
"""Can GPU memory of another process come and go around the driver checkpoint?
(issue 4's restore target; DESIGN's IPC goal). The driver refuses, or loses, a
process that holds exported or imported GPU memory when it is checkpointed
(FACTS). Measured here, with ipcprobe.c's target and helper processes:

  1. the target imports memory a helper made and filled, uses it; the helper
     drops its handle and exits: is the memory still the target's?
  2. the target releases it: does the driver now checkpoint and restore the
     target, and does its context work after?
  3. the restore with the data path beside it: while the driver restores the
     target, a second helper creates memory and fills it at full rate; the
     target then imports it at its old addresses. Time of both at once against
     one after the other.
  4. once more released, another driver cycle.
  5. the checkpoint direction: the target exports memory of its own, a helper
     imports it and copies it out; once both let go, a driver cycle.

Every step is recorded with its error, if any; a step that would hang is
abandoned after a timeout. Prints one JSON object.

    ipcprobe.py BIN GIB
"""
import json
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gpucr_hpc.gpu.driver_nvidia import NvidiaDriver  # noqa: E402

binary, gib = sys.argv[1], sys.argv[2]
out = {"gib": float(gib), "steps": []}


class Proc:
    def __init__(self, role):
        self.role = role
        self.p = subprocess.Popen([binary, role, gib], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.p.pid
        self.read(60)

    def read(self, timeout):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not r:
            raise TimeoutError(f"{self.role}: no answer in {timeout} s")
        line = self.p.stdout.readline()
        if not line:
            raise EOFError(f"{self.role}: exited ({self.p.poll()})")
        return json.loads(line)

    def cmd(self, line, timeout=120):
        t0 = time.monotonic()
        try:
            self.p.stdin.write(line + "\n")
            self.p.stdin.flush()
            r = self.read(timeout)
        except Exception as e:  # noqa: BLE001 - recorded
            r = {"error": f"{type(e).__name__}: {e}"}
        r.update(who=self.role, line=line, wall_s=round(time.monotonic() - t0, 4))
        out["steps"].append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
        return r

    def quit(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.wait(30)
        except Exception:  # noqa: BLE001
            self.p.kill()


def used_mib():
    r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    return int(r.stdout.split()[0]) if r.returncode == 0 else None


drv = NvidiaDriver()


def driver(step, fn, *a):
    t0 = time.monotonic()
    box = {}

    def run():
        try:
            fn(*a)
            box["ok"] = True
        except Exception as e:  # noqa: BLE001 - recorded
            box["error"] = str(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(120)
    r = {"who": "driver", "line": step, "s": round(time.monotonic() - t0, 4),
         **(box if box else {"error": "no answer in 120 s"})}
    out["steps"].append(r)
    print(json.dumps(r), file=sys.stderr, flush=True)
    return "ok" in r


def cycle(label, pid):
    ok = driver(f"{label}: lock", drv.lock, pid, 30000) and driver(f"{label}: checkpoint", drv.checkpoint, pid)
    out["steps"].append({"who": "smi", "line": f"{label}: used MiB while checkpointed", "mib": used_mib()})
    return ok and driver(f"{label}: restore", drv.restore, pid) and driver(f"{label}: unlock", drv.unlock, pid)


T = Proc("target")
out["used_mib_start"] = used_mib()
answers = {}
try:
    # 1. import, use; the exporter drops its handle, then exits
    H = Proc("helper")
    fd = H.cmd("create").get("fd")
    answers["helper_fill"] = H.cmd("h2d 286331153")  # 0x11111111
    answers["import"] = T.cmd(f"import {H.pid} {fd}")
    answers["check_imported"] = T.cmd("check 286331153").get("ok")
    T.cmd("fill 572662306")  # 0x22222222
    H.cmd("drop")
    answers["valid_after_exporter_dropped"] = T.cmd("check 572662306").get("ok")
    H.quit()
    answers["valid_after_exporter_exited"] = T.cmd("check 572662306").get("ok")
    out["used_mib_imported_exporter_gone"] = used_mib()
    # 2. released, then the driver cycle
    T.cmd("release")
    out["used_mib_released"] = used_mib()
    answers["cycle_after_import_released"] = cycle("cycle 1 (imported memory released)", T.pid)
    answers["context_works_after_cycle_1"] = T.cmd("compute").get("ok")
    # 3. checkpointed; restore and the data path at once
    H2 = Proc("helper")
    H2.cmd("create")  # a warm-up round: the pinned buffer is written here, not in the timing
    H2.cmd("h2d 1")
    H2.cmd("drop")
    if driver("cycle 2: lock", drv.lock, T.pid, 30000) and driver("cycle 2: checkpoint", drv.checkpoint, T.pid):
        box = {}
        t0 = time.monotonic()

        def restore_and_unlock():
            t = time.monotonic()
            box["ok"] = driver("cycle 2: restore (beside the fill)", drv.restore, T.pid) and \
                driver("cycle 2: unlock (beside the fill)", drv.unlock, T.pid)
            box["s"] = time.monotonic() - t

        th = threading.Thread(target=restore_and_unlock)
        th.start()
        c = H2.cmd("create")
        f = H2.cmd("h2d 1")
        th.join(130)
        t_both = time.monotonic() - t0
        imp = T.cmd(f"import {H2.pid} {c.get('fd')}")
        t_all = time.monotonic() - t0
        answers["overlap"] = {
            "driver_restore_unlock_s": box.get("s"), "driver_ok": box.get("ok"),
            "create_s": c.get("s"), "fill_s": f.get("s"), "fill_GBps": f.get("GBps"),
            "both_s": round(t_both, 4), "import_map_s": imp.get("s"), "restored_with_data_s": round(t_all, 4),
            "one_after_the_other_s": round((box.get("s") or 0) + (c.get("s") or 0) + (f.get("s") or 0)
                                           + (imp.get("s") or 0), 4)}
        answers["data_after_overlapped_restore"] = T.cmd("check 1").get("ok")
        H2.cmd("drop")
        H2.quit()
        answers["valid_after_second_exporter_exited"] = T.cmd("check 1").get("ok")
        T.cmd("release")
        answers["cycle_after_second_import_released"] = cycle("cycle 3", T.pid)
        answers["context_works_after_cycle_3"] = T.cmd("compute").get("ok")
    # 5. the checkpoint direction: the target exports its own memory, a helper
    #    copies it out at full rate; both let go; then the driver cycle
    H3 = Proc("helper")
    own = T.cmd("own")
    T.cmd("fill 1145324612")  # 0x44444444
    answers["helper_imports_targets_memory"] = H3.cmd(f"import {T.pid} {own.get('fd')}")
    H3.cmd("d2h 0")  # warm-up
    answers["helper_copy_out"] = H3.cmd("d2h 1145324612")
    H3.cmd("drop")
    H3.quit()
    T.cmd("release")
    T.cmd("unexport")
    answers["cycle_after_export_released"] = cycle("cycle 4 (exported memory released)", T.pid)
    answers["context_works_after_cycle_4"] = T.cmd("compute").get("ok")
finally:
    out["answers"] = answers
    T.quit()
    print(json.dumps(out, indent=1))
