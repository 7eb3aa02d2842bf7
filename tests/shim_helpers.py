"""Building the shim once per test session, and running processes under it."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHIM_DIR = REPO / "shim"
SHIM = SHIM_DIR / "libgpucr-cuda.so"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))

_built = None


def build_shim() -> Path:
    """make -C shim; skips the test when the CUDA headers are not installed."""
    global _built
    if _built is None:
        if not (CUDA_HOME / "include" / "cuda.h").is_file():
            pytest.skip(f"CUDA headers not found in {CUDA_HOME}/include (needed to build the shim)")
        r = subprocess.run(["make", "-s", "-C", str(SHIM_DIR)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        _built = SHIM
    return _built


def root_criu_or_skip():
    """The CRIU to use, as root; the test is skipped without root or CRIU >= 4.1."""
    from gpucr_hpc.criu import run as criu_mod
    from gpucr_hpc.errors import GpucrError

    if os.geteuid() != 0:
        pytest.skip("CRIU dump/restore of a process tree needs root here")
    try:
        return criu_mod.find_criu()
    except GpucrError as e:
        pytest.skip(f"CRIU >= 4.1 not available: {e.one_line()}")


def shim_env(run_dir: Path, **extra) -> dict:
    env = dict(os.environ)
    env["LD_PRELOAD"] = str(build_shim())
    env["GPUCR_RUN_DIR"] = str(run_dir)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def wait_for(path: Path, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


def gpucr_cli() -> list:
    """The CLI of the Python running the tests (PATH may hold another, or none)."""
    return [sys.executable, "-m", "gpucr_hpc"]
