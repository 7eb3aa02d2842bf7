"""The copy helper's CPU-side behaviour (the GPU side: test_copy_helper_gpu.py):
the shim's prefill command, a bad GPUCR_COPY_HELPER, and the helper command on a
machine without a usable GPU."""

import os
import shutil
import subprocess
import sys
import time

import pytest
from shim_helpers import REPO, shim_env, wait_for
from test_shim_socket import ask


def test_prefill_needs_a_checkpointed_gpu_process(tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen(["sleep", "60"], env=shim_env(run, GPUCR_COPY_HELPER=tmp_path / "none.sock"))
    try:
        sock = run / f"{p.pid}.sock"
        assert wait_for(sock), "no control socket appeared"
        (running,) = ask(sock, {"cmd": "prefill"})
        assert not running["ok"] and "not checkpointed" in running["error"]
        # a CPU process: its checkpoint holds no GPU data, so there is nothing for a helper
        cp, pre, rs = ask(sock, {"cmd": "checkpoint"}, {"cmd": "prefill"}, {"cmd": "restore"})
        assert cp["ok"] and not cp["cuda"] and rs["ok"]
        assert not pre["ok"] and "nothing to prefill" in pre["error"]
    finally:
        p.kill()
        p.wait()


def test_a_helper_socket_path_too_long_is_one_line_and_ignored(tmp_path):
    r = subprocess.run(["true"], env=shim_env(tmp_path / "run", GPUCR_COPY_HELPER="/x" * 80),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    lines = [ln for ln in r.stderr.splitlines() if "GPUCR_COPY_HELPER" in ln]
    assert len(lines) == 1 and "not using a copy helper" in lines[0]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: the helper would start")
def test_copy_helper_without_a_gpu_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "copy-helper", "--socket", str(tmp_path / "h.sock")],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpucr-hpc: error:"), r.stderr
    assert not (tmp_path / "h.sock").exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: the helper would start")
def test_run_with_a_helper_that_cannot_start_is_one_line(tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "run", "--copy-helper", "--run-dir", str(run), "--",
                        "touch", str(tmp_path / "ran")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpucr-hpc: error: the copy helper did not start:"), r.stderr
    assert "copy-helper.sock.log" in lines[0]
    assert not (tmp_path / "ran").exists() and not (run / "copy-helper.sock").exists()


def test_bad_helper_idle_setting_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "run", "--copy-helper", "--run-dir", str(tmp_path), "--",
                        "true"], capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={**os.environ, "GPUCR_COPY_HELPER_IDLE": "soon"})
    assert r.returncode != 0 and r.stderr.strip() == \
        "gpucr-hpc: error: bad GPUCR_COPY_HELPER_IDLE='soon'; give seconds, e.g. 600"


def test_a_helper_never_runs_under_the_shim():
    from gpucr_hpc.shim.copy_helper import helper_env

    env = helper_env({"LD_PRELOAD": "/opt/gpucr-hpc/lib/libgpucr-cuda.so:/usr/lib/libjemalloc.so",
                      "GPUCR_RUN_DIR": "/run/gpucr/job", "GPUCR_COPY_HELPER": "/x.sock", "PATH": "/usr/bin"})
    assert env == {"LD_PRELOAD": "/usr/lib/libjemalloc.so", "PATH": "/usr/bin"}
    assert "LD_PRELOAD" not in helper_env({"LD_PRELOAD": "/lib/libgpucr-cuda.so"})


def test_arena_prealloc_that_is_no_size_is_one_line(tmp_path):
    r = subprocess.run(["true"], env=shim_env(tmp_path / "run", GPUCR_ARENA_PREALLOC="lots"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert r.stderr.strip() == ("gpucr: GPUCR_ARENA_PREALLOC=lots is neither a size (e.g. 80G) nor auto; "
                                "the arena is created at the first checkpoint"), r.stderr


def test_site_fast_path_in_a_process_without_cuda(tmp_path):
    """A Slurm job's settings with copy_helper=on (and arena_prealloc=auto, or
    not): a process that never uses CUDA (most of a batch script) makes no
    arena and starts no helper; the job's GPUCR_COPY_HELPER=off turns the
    helper off."""
    run = tmp_path / "run"
    started = tmp_path / "started"
    start = tmp_path / "start-helper"
    start.write_text(f"#!/bin/sh\ntouch {started}\n")
    start.chmod(0o755)
    helper = run / "copy-helper.sock"
    for prealloc, sock, expect in (("auto", helper, str(helper)), ("auto", "off", ""), (None, helper, str(helper))):
        extra = {"GPUCR_ARENA_PREALLOC": prealloc} if prealloc else {}
        p = subprocess.Popen(["sleep", "60"], env=shim_env(run, GPUCR_COPY_HELPER=sock, GPUCR_COPY_HELPER_START=start,
                                                           **extra))
        try:
            ctl = run / f"{p.pid}.sock"
            assert wait_for(ctl), "no control socket appeared"
            time.sleep(1.0)  # a few of the arena thread's looks at the footprint
            (st,) = ask(ctl, {"cmd": "status"})
            assert st["arena_prealloc"] == (prealloc or "off") and st["copy_helper"] == expect, st
            assert st["arena_bytes"] == 0 and st["arena_segments"] == 0 and not st["arena_ready"], st
            cp, rs = ask(ctl, {"cmd": "checkpoint"}, {"cmd": "restore"})
            assert cp["ok"] and not cp["cuda"] and rs["ok"]
        finally:
            p.kill()
            p.wait()
    assert not started.exists(), "a helper was started for a process without CUDA"


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: the helper would start")
def test_ensure_a_helper_without_a_gpu_is_one_line(tmp_path):
    """What the shim runs for GPUCR_COPY_HELPER_START, on a node where no helper can start."""
    sock = tmp_path / "h.sock"
    r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "copy-helper", "--ensure", "--socket", str(sock),
                        "--idle-exit", "5"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpucr-hpc: error: the copy helper did not start:"), r.stderr
    assert not sock.exists()
