"""No io_uring under the shim (shim/io_uring.c): CRIU cannot checkpoint one.

libuv, which PyTorch's TCP store and torchrun's rendezvous run on, opens an
io_uring as its loop starts unless the kernel says it has none; the shim says
so through libc's syscall(), and the program runs on epoll, which CRIU dumps.
"""

import os
import subprocess
import sys

import pytest
from shim_helpers import build_shim

SETUP = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)  # struct io_uring_params
fd = libc.syscall(425, 4, params)  # io_uring_setup
print(fd, errno.errorcode.get(ctypes.get_errno(), 0) if fd < 0 else "ok")
"""

STORE = r"""
import glob, os
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 1, True)  # libuv, PyTorch's default
store.set("k", "v")
kinds = []
for f in glob.glob("/proc/self/fd/*"):
    try:
        kinds.append(os.readlink(f))
    except OSError:
        pass
print("io_uring" if any("io_uring" in k for k in kinds) else "none", store.get("k").decode())
"""


def run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LD_PRELOAD": str(build_shim()), **env})


def test_io_uring_setup_is_told_enosys():
    r = run(SETUP)
    assert r.stdout.split() == ["-1", "ENOSYS"], r.stderr


def test_a_program_may_be_given_io_uring():
    r = run(SETUP, GPUCR_IO_URING="1")
    out = r.stdout.split()
    if out[-1] in ("ENOSYS", "EPERM"):  # the kernel's own answer (no io_uring, or it is off)
        pytest.skip(f"this kernel gives no io_uring: {out}")
    assert int(out[0]) >= 0, r.stderr


def test_pytorchs_tcp_store_runs_on_epoll():
    pytest.importorskip("torch")
    r = run(STORE)
    assert r.stdout.split() == ["none", "v"], r.stderr[-2000:]
