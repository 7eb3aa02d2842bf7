#!/usr/bin/env python3
"""Where the driver checkpoint's time goes (issue 4): runs pinprobe (a CUDA
process with a host arena and device memory) and times the driver checkpoint
API on it with the arena pinned whole, in pieces, or not at all; and how fast
pinning/unpinning is with 1..8 threads.  Prints one JSON object.

    pinprobe.py BIN DIR ARENA_GIB DEV_GIB
"""
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gpucr_hpc.gpu.driver_nvidia import NvidiaDriver  # noqa: E402

binary, arena_dir, arena_gib, dev_gib = sys.argv[1:5]
p = subprocess.Popen([binary, arena_dir, arena_gib, dev_gib], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
out = {"arena_dir": arena_dir, "arena_gib": float(arena_gib), "dev_gib": float(dev_gib), "steps": []}


def cmd(line):
    p.stdin.write(line + "\n")
    p.stdin.flush()
    r = json.loads(p.stdout.readline())
    r["line"] = line
    out["steps"].append(r)
    print(json.dumps(r), file=sys.stderr, flush=True)
    if "error" in r:
        raise SystemExit(json.dumps(out))
    return r


drv = NvidiaDriver()


def cycle(label):
    t = [time.monotonic()]
    drv.lock(p.pid, 30000)
    t.append(time.monotonic())
    drv.checkpoint(p.pid)
    t.append(time.monotonic())
    drv.restore(p.pid)
    t.append(time.monotonic())
    drv.unlock(p.pid)
    t.append(time.monotonic())
    r = {"cycle": label, "lock_s": t[1] - t[0], "checkpoint_s": t[2] - t[1],
         "restore_s": t[3] - t[2], "unlock_s": t[4] - t[3]}
    out["steps"].append(r)
    print(json.dumps(r), file=sys.stderr, flush=True)


assert json.loads(p.stdout.readline()).get("ready")
cycle("context only")
cmd("pop 8")
cycle("arena populated, not pinned")
cmd("reg 1 0")
cmd("dev")
cmd("d2h")
cmd("h2d")
cmd("release")
cycle("arena pinned whole")
cycle("arena pinned whole, again")
# the first copies after a driver restore:
cmd("recreate")
cmd("h2d")
cmd("d2h")
cmd("release")
cmd("unreg 1")
for t in (1, 2, 4, 8):
    cmd(f"reg {t} 256")
    cmd(f"unreg {t}")
cmd("reg 8 1024")
cmd("unreg 8")
cmd("reg 8 256")
cycle("arena pinned in 256 MiB pieces")
cmd("recreate")
cmd("overlap")
cmd("release")
cmd("unreg 8")
cmd("reserve 64")
cycle("arena unpinned, 64 GiB more VA reserved")
cmd("memcpy")
p.stdin.write("quit\n")
p.stdin.flush()
p.wait(30)
print(json.dumps(out))
