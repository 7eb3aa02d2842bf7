"""What driver calls do while a process is yielded (shim/tools/driver_calls.py):
every entry point of cuda.h is in one class, hooked as its class says, and
each class behaves so while the process is checkpointed in place.

The behaviour test runs the shim against a small stand-in libcuda.so.1 built
here (this machine has no GPU); the GPU tests run the same classes against the
real driver (test_driver_calls_gpu.py)."""

import re
import subprocess
import sys
import textwrap

import pytest
from shim_helpers import CUDA_HOME, SHIM_DIR, build_shim, shim_env

sys.path.insert(0, str(SHIM_DIR / "tools"))
import driver_calls  # noqa: E402
import gen_hooks  # noqa: E402

CUDA_H = CUDA_HOME / "include" / "cuda.h"


def _exported(lib) -> set:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines()}


def test_every_entry_point_is_hooked_as_its_class_says():
    lib = build_shim()
    if not CUDA_H.is_file():
        pytest.skip(f"no cuda.h in {CUDA_H.parent}")
    exported = _exported(lib)
    points = gen_hooks.entry_points(CUDA_H.read_text())
    classes = {}
    for name, api, _, _ in points:
        cls, _ = driver_calls.classify(api)
        classes.setdefault(cls, []).append(name)
        if name in ("cuGetProcAddress", "cuGetProcAddress_v2"):
            assert name in exported  # passes, but the answer gets our hooks
        elif cls == driver_calls.PASSES:
            assert name not in exported, f"{name} passes but is hooked"
        else:
            assert name in exported, f"{name} {cls} but is not hooked"
    assert len(points) > 400
    # the calls real programs were seen to make while yielded, in their class
    waits = set(classes[driver_calls.WAITS])
    assert {"cuPointerGetAttribute", "cuPointerGetAttributes", "cuMemGetAddressRange_v2", "cuLaunchKernel",
            "cuLaunchKernel_ptsz", "cuModuleLoadData", "cuMemHostRegister_v2", "cuStreamQuery_ptsz"} <= waits
    assert set(classes[driver_calls.ANSWERED]) == {"cuMemGetInfo_v2"}
    assert {"cuDeviceGetAttribute", "cuCtxGetCurrent", "cuCheckpointProcessLock",
            "cuStreamGetCaptureInfo_v3"} <= set(classes[driver_calls.PASSES])


def test_an_entry_point_nobody_classified_waits():
    assert driver_calls.classify("cuSomethingNewInCuda14")[0] == driver_calls.WAITS


FAKE_DRIVER = r"""
/* a stand-in libcuda.so.1: answers and counts what reaches it */
#include <stddef.h>
unsigned long reached_attribute, reached_pointer, reached_meminfo;
int cuCtxGetCurrent(void **c) { *c = (void *)0x1; return 0; }
int cuCtxGetDevice(int *d) { *d = 0; return 0; }
int cuDeviceGetAttribute(int *v, int a, int d) { (void)a; (void)d; reached_attribute++; *v = 7; return 0; }
int cuPointerGetAttribute(void *data, int a, unsigned long long p)
{ (void)a; reached_pointer++; *(unsigned long long *)data = p; return 0; }
int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = 100 + reached_meminfo++; *t = 1000; return 0; }
"""

PROGRAM = r"""
import ctypes, json, os, socket, threading, time
fake = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(None)
lib.cuStreamQuery(None)  # the shim takes the driver on
def control(cmd):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.path.join(os.environ["GPUCR_RUN_DIR"], f"{os.getpid()}.sock"))
    s.sendall(json.dumps({"cmd": cmd}).encode() + b"\n")
    return json.loads(s.makefile().readline())
def reached(name):
    return ctypes.c_ulong.in_dll(fake, name).value
free, total = ctypes.c_size_t(), ctypes.c_size_t()
out = {"before": lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "free_before": free.value}
out["checkpoint"] = control("checkpoint")["ok"]
v = ctypes.c_int()
out["passes"] = [lib.cuDeviceGetAttribute(ctypes.byref(v), 1, 0), v.value, reached("reached_attribute")]
free.value = 0
out["answered"] = [lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), free.value, total.value,
                   reached("reached_meminfo")]
got = ctypes.c_ulonglong()
waiter = threading.Thread(target=lambda: out.__setitem__(
    "waited", lib.cuPointerGetAttribute(ctypes.byref(got), 1, ctypes.c_ulonglong(0x7000))))
waiter.start()
waiter.join(1.0)
out["waiting_while_yielded"] = [waiter.is_alive(), reached("reached_pointer")]
out["restore"] = control("restore")["ok"]
waiter.join(10)
out["after_restore"] = [waiter.is_alive(), out.get("waited"), got.value, reached("reached_pointer")]
free.value = 0
lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
out["free_after"] = free.value
print(json.dumps(out))
"""


def test_each_class_while_the_process_is_checkpointed_in_place(tmp_path):
    """passes: reaches the driver at once; answered: the driver's answer from
    before the yield, without reaching it; waits: held until the restore, then
    the driver answers."""
    build_shim()
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "fake.c").write_text(FAKE_DRIVER)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(driver / "libcuda.so.1"), str(driver / "fake.c")], check=True)
    env = shim_env(tmp_path / "run", LD_LIBRARY_PATH=driver)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM)], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout)
    assert out["before"] == 0 and out["free_before"] == 100 and out["checkpoint"] is True
    assert out["passes"] == [0, 7, 1]                       # reached the driver while yielded
    assert out["answered"] == [0, 100, 1000, 1]              # the answer from before; the driver not asked
    assert out["waiting_while_yielded"] == [True, 0]         # held; the driver not asked
    assert out["restore"] is True
    assert out["after_restore"] == [False, 0, 0x7000, 1]     # then answered by the driver
    assert out["free_after"] == 101                          # and the driver answers again


def test_the_docs_table_lists_every_class():
    doc = (SHIM_DIR.parent / "site" / "docs" / "driver-calls.md").read_text()
    rows = [ln for ln in doc.splitlines() if re.match(r"\| (passes|waits|answered) \|", ln)]
    assert {r.split("|")[1].strip() for r in rows} == {"passes", "waits", "answered"}
    assert len(rows) == len(driver_calls.RULES)
