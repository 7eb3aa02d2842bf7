"""On a GPU machine: each class of driver calls (shim/tools/driver_calls.py)
against the real driver, while the process is checkpointed in place (the shim's
yield and the driver's checkpoint): passes answers at once and as before,
answered gives the answer from before without the driver, waits is held until
the restore and then answers as before. Skipped without a GPU."""

import json
import os
import subprocess
import sys
import time

import pytest
from shim_helpers import build_shim, gpucr_cli

from gpucr_hpc.process import in_place

pytestmark = pytest.mark.gpu

PROGRAM = r"""
import ctypes, json, sys, threading, time
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(None)  # the shim's hooks come first, the driver's other entry points after
def ok(rc, what):
    if rc:
        sys.exit(f"{what}: CUresult {rc}")
ok(lib.cuInit(0), "cuInit")
dev, ctx, ptr = c_int(), c_void_p(), c_uint64()
ok(lib.cuDeviceGet(byref(dev), 0), "cuDeviceGet")
ok(lib.cuDevicePrimaryCtxRetain(byref(ctx), dev), "retain")
ok(lib.cuCtxSetCurrent(ctx), "set current")
SIZE = 256 << 20
ok(lib.cuMemAlloc_v2(byref(ptr), c_size_t(SIZE)), "alloc")
ok(lib.cuMemsetD8_v2(ptr, 7, c_size_t(SIZE)), "memset")
ok(lib.cuCtxSynchronize(), "sync")
def ask():
    sms, free, total, mtype = c_int(), c_size_t(), c_size_t(), c_int()
    r = [lib.cuDeviceGetAttribute(byref(sms), 16, dev), lib.cuMemGetInfo_v2(byref(free), byref(total)),
         lib.cuPointerGetAttribute(byref(mtype), 2, ptr)]
    return {"rc": r, "sms": sms.value, "free": free.value, "total": total.value, "memory_type": mtype.value}
before = ask()
print(json.dumps({"ready": True}), flush=True)
sys.stdin.readline()  # checkpointed in place
out = {"before": before}
t = time.monotonic()
sms = c_int()
out["passes"] = [lib.cuDeviceGetAttribute(byref(sms), 16, dev), sms.value, round(time.monotonic() - t, 3)]
free, total = c_size_t(), c_size_t()
t = time.monotonic()
out["answered"] = [lib.cuMemGetInfo_v2(byref(free), byref(total)), free.value, total.value,
                   round(time.monotonic() - t, 3)]
mtype = c_int()
waiter = threading.Thread(target=lambda: out.__setitem__("waited", lib.cuPointerGetAttribute(byref(mtype), 2, ptr)))
waiter.start()
waiter.join(2.0)
out["held_while_yielded"] = waiter.is_alive()
print(json.dumps({"asked": True}), flush=True)
sys.stdin.readline()  # restored
waiter.join(30)
out["after_restore"] = [waiter.is_alive(), out.get("waited"), mtype.value]
host = (ctypes.c_ubyte * SIZE)()
ok(lib.cuMemcpyDtoH_v2(host, ptr, c_size_t(SIZE)), "copy back")
out["data_kept"] = bytes(host).count(7) == SIZE
out["after"] = ask()
print(json.dumps(out), flush=True)
"""


def _line(p) -> dict:
    line = p.stdout.readline()
    assert line, p.stderr.read()
    return json.loads(line)


def test_each_class_against_the_real_driver_while_checkpointed_in_place(tmp_path):
    build_shim()
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    env = dict(os.environ, GPUCR_RUN_DIR=str(run_dir))
    env.pop("LD_PRELOAD", None)
    p = subprocess.Popen([*gpucr_cli(), "run", "--", sys.executable, "-c", PROGRAM], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _line(p) == {"ready": True}
        t = time.monotonic()
        cp = in_place.checkpoint_tree(p.pid, timeout_ms=20000, run_dir=run_dir)
        assert cp["processes"], cp
        p.stdin.write("go\n")
        p.stdin.flush()
        assert _line(p) == {"asked": True}
        in_place.restore_tree(p.pid, run_dir=run_dir)
        held_s = time.monotonic() - t
        p.stdin.write("go\n")
        p.stdin.flush()
        out = _line(p)
        assert p.wait(60) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    before = out["before"]
    assert before["rc"] == [0, 0, 0] and before["memory_type"] == 2  # CU_MEMORYTYPE_DEVICE
    assert out["passes"][:2] == [0, before["sms"]] and out["passes"][2] < 1.0
    assert out["answered"][:3] == [0, before["free"], before["total"]] and out["answered"][3] < 1.0
    assert out["held_while_yielded"] is True
    assert out["after_restore"] == [False, 0, 2]
    assert out["data_kept"] is True
    assert out["after"]["rc"] == [0, 0, 0] and out["after"]["memory_type"] == 2
    print(json.dumps({"checkpointed_for_s": round(held_s, 2), **out}))
