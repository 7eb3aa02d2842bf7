"""On a GPU machine: the copy helper path (GPUCR_COPY_HELPER, shim/helper.c,
gpucr_hpc/shim/copy_helper.py) under real GPU programs, driven by
gpu-checks/shim_gpu_verify.py --copy-helper, every check asserted: the helper moved
the data both ways in every cycle, every other restore was prefilled beside the
driver restore, the program's output is bit-identical to an uninterrupted run,
the GPU memory was yielded and nothing leaked. And when the helper dies
between cycles, the next checkpoints fall back to the bounce path, say why, and
lose nothing; when its copies back to the GPU fail, that restore falls back
the same way. Skipped without a GPU."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shim_helpers import REPO

pytestmark = pytest.mark.gpu


def verify(tmp_path, cuda_bin, workload, *extra):
    out = tmp_path / "verify.json"
    r = subprocess.run([sys.executable, str(REPO / "gpu-checks/shim_gpu_verify.py"), "--out", str(out),
                        "--only", workload, "--leak-cycles", "4", "--cycles", "4", "--ballast-gib", "4",
                        "--cuda-bin", str(cuda_bin), "--run-dir", str(tmp_path / "run"), "--copy-helper", *extra],
                       capture_output=True, text=True, timeout=900)
    result = json.loads(out.read_text())["workloads"][0]
    assert "error" not in result, result.get("error")
    for check, ok in result["checks"].items():
        assert ok, f"{check} failed: {r.stdout[-2000:]}"
    return result


@pytest.mark.parametrize("workload", ["torch_default", "torch_expandable_segments", "cuda_c_cudaMalloc"])
def test_copy_helper_moves_the_data(workload, cuda_bin, tmp_path):  # noqa: F811
    if workload.startswith("torch"):
        pytest.importorskip("torch")
    result = verify(tmp_path, cuda_bin, workload)
    assert "helper_moved_the_data" in result["checks"] and "helper_prefilled" in result["checks"]


def test_copy_helper_dies_bounce_path_takes_over(cuda_bin, tmp_path):  # noqa: F811
    # slower steps: the program must outlast killing the helper and the cycles after it
    result = verify(tmp_path, cuda_bin, "cuda_c_cudaMalloc", "--kill-helper-at", "2", "--pace-ms", "100")
    assert result["checks"]["without_helper_bounce_path_says_why"]
    assert result["cycles"][2]["checkpoint_path"]["helper_fallback"]


def test_copy_helper_copy_fails_during_restore_bounce_path_takes_over(cuda_bin, tmp_path):  # noqa: F811
    """The helper's copies back to the GPU fail after the process imported and
    mapped its allocations (they overlap): the restore undoes that and takes
    the bounce path, says why, and the output stays bit-identical."""
    result = verify(tmp_path, cuda_bin, "cuda_c_cudaMalloc", "--helper-fails-copy")
    assert result["checks"]["failed_helper_copy_bounce_path_says_why"]
    assert result["cycles"][1]["restore_path"]["data_path"] == "helper"


def _gpucr(run, *args) -> dict:
    r = subprocess.run([sys.executable, "-m", "gpucr_hpc", *args, "--run-dir", str(run), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def test_run_starts_the_users_helper_once_and_it_goes_when_idle(cuda_bin, tmp_path):  # noqa: F811
    """`gpucr-hpc run --copy-helper`: the first run starts the helper, outside
    its process tree; the second finds it; both move their data through it; it
    exits once no process has been connected for GPUCR_COPY_HELPER_IDLE s."""
    run = tmp_path / "run"
    env = dict(os.environ, GPUCR_COPY_HELPER_IDLE="3")
    procs, said = [], []
    try:
        for _ in range(2):
            p = subprocess.Popen([sys.executable, "-m", "gpucr_hpc", "run", "--copy-helper", "--run-dir", str(run),
                                  "--", str(cuda_bin), "100000", "0.5", "20"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
            procs.append(p)
            said.append(p.stderr.readline())
            assert p.stdout.readline().startswith("step "), said[-1]
        assert "copy helper started (pid" in said[0] and "already serving" in said[1], said
        helper = int(said[0].split("(pid ")[1].split(")")[0])
        for p in procs:
            assert helper not in [int(c) for c in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()]
            cp = _gpucr(run, "checkpoint", "--pid", str(p.pid))
            rs = _gpucr(run, "restore", "--pid", str(p.pid))
            assert cp["processes"][0]["data_path"] == "helper" and rs["processes"][0]["data_path"] == "helper", (cp, rs)
            assert rs["phases"].get("prefill")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    deadline = time.monotonic() + 30
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(helper), "the idle helper did not exit"
    assert not (run / "copy-helper.sock").exists()


def test_site_fast_path_arena_follows_the_footprint_and_the_shim_starts_the_helper(cuda_bin, tmp_path):  # noqa: F811
    """As a Slurm job runs with plugstack copy_helper=on arena_prealloc=auto: the
    shim starts the helper itself (GPUCR_COPY_HELPER_START, outside the program's
    process tree) and grows the arena to the GPU footprint in the background,
    handing each new segment to the helper. So the checkpoint creates and pins
    nothing, the data goes through the helper both ways, and the program ends
    with the output of an uninterrupted run."""
    from shim_helpers import shim_env
    from test_shim_socket import ask

    ref = subprocess.run([str(cuda_bin), "400", "2", "0"], capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stdout[-500:]
    run = tmp_path / "run"
    cli = tmp_path / "gpucr-hpc"
    cli.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m gpucr_hpc "$@"\n')
    cli.chmod(0o755)
    env = shim_env(run, GPUCR_ARENA_PREALLOC="auto", GPUCR_COPY_HELPER=run / "copy-helper.sock",
                   GPUCR_COPY_HELPER_START=cli, GPUCR_COPY_HELPER_IDLE="3")
    p = subprocess.Popen([str(cuda_bin), "400", "2", "40"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    helper = None
    try:
        sock = run / f"{p.pid}.sock"
        deadline, st = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            if sock.exists():
                (st,) = ask(sock, {"cmd": "status"})
                if st["arena_ready"] and st["gpu_bytes"] > 2 << 30 and st["arena_bytes"] >= st["gpu_bytes"] \
                        and st["arena_segments"] > 0 and st["helper_segments"] == st["arena_segments"]:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"the arena did not follow the footprint with the helper: {st}")
        log = (run / "copy-helper.sock.log").read_text()
        helper = int(log.split("(pid ")[1].split(")")[0])
        assert helper not in [int(c) for c in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()]
        cp = _gpucr(run, "checkpoint", "--pid", str(p.pid))
        rs = _gpucr(run, "restore", "--pid", str(p.pid))
        assert cp["processes"][0]["data_path"] == "helper" and rs["processes"][0]["data_path"] == "helper", (cp, rs)
        (after,) = ask(sock, {"cmd": "status"})
        for k in ("arena_bytes", "arena_segments", "helper_segments", "helper_setup_s"):  # nothing made or pinned
            assert after[k] == st[k], (k, st, after)
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out == ref.stdout, err[-2000:]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    deadline = time.monotonic() + 30
    while helper and _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert helper and not _alive(helper), "the idle helper did not exit"
