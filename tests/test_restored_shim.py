"""A process restored from an image is still reached through its shim.

A restore in a new PID namespace (what every Slurm restore does) gives the process
another PID here than the one its control socket is named after. Without a GPU: a
CPU process under the real shim, checkpointed with real CRIU and restored in a new
PID namespace, is then checkpointed and restored in place through its shim, and
`gpucr-hpc status` does not throw its socket away. (On a GPU machine the same for a
PyTorch process, with its yield: tests/test_gpu_yield_jax.py.)
"""

import json
import os
import subprocess
import sys

import pytest
from migrate_workload import _write_workload, alive, kill_tree, lines, wait_lines
from shim_helpers import SHIM, build_shim, gpucr_cli

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError

pytestmark = pytest.mark.criu


@pytest.fixture
def env(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("CRIU dump/restore of a process tree needs root here")
    try:
        criu_mod.find_criu()
    except GpucrError as e:
        pytest.skip(f"CRIU >= 4.1 not available: {e.one_line()}")
    build_shim()
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    return dict(os.environ, GPUCR_RUN_DIR=str(run), GPUCR_SHIM=str(SHIM))


def cli(env, *args, check=True):
    r = subprocess.run(gpucr_cli() + list(args), capture_output=True, text=True, env=env, timeout=300,
                       stdin=subprocess.DEVNULL)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_process_restored_in_a_new_pid_namespace_is_checkpointed_through_its_shim(env, tmp_path):
    argv, out = _write_workload(tmp_path)
    proc = subprocess.Popen(gpucr_cli() + ["run", "--"] + argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    restored = None
    try:
        wait_lines(out, 10)
        cli(env, "checkpoint", "--pid", str(proc.pid), "--to", str(tmp_path / "img"))
        proc.wait(timeout=10)
        rep = json.loads(cli(env, "restore", "--from", str(tmp_path / "img"), "--pidns", "new", "--json").stdout)
        restored = rep["pid"]
        assert rep["pidns"] == "new" and rep["ns_pid"] == proc.pid and restored != proc.pid
        wait_lines(out, len(lines(out)) + 5)

        # status lists it by the PID it has inside its namespace, and keeps its socket
        rows = json.loads(cli(env, "status", "--json").stdout)["processes"]
        assert [r["pid"] for r in rows if r.get("ok", True)].count(proc.pid) == 1, rows
        cp = json.loads(cli(env, "checkpoint", "--pid", str(restored), "--json").stdout)
        root = next(p for p in cp["processes"] if p["pid"] == restored)
        assert root["shim"], cp  # reached through its shim, not around it
        states = [r["state"] for r in json.loads(cli(env, "status", "--json").stdout)["processes"]
                  if r["pid"] == proc.pid]
        assert states == ["checkpointed"]
        n = len(lines(out))
        cli(env, "restore", "--pid", str(restored))
        wait_lines(out, n + 5)
        assert alive(restored)
    finally:
        for pid in (restored, proc.pid):
            if pid and alive(pid):
                kill_tree(pid)
        if proc.poll() is None:
            proc.wait(timeout=10)


def test_a_gpu_process_whose_shim_cannot_be_reached_is_refused(env, tmp_path):
    """Its socket file removed: the shim cannot quiesce it, so it is not checkpointed by
    the driver alone (whose lock would catch its next CUDA call); one line says so.
    A CPU process stands in for the GPU one: it maps a file named libcuda.so.1, which
    is all this check looks at."""
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\0" * 4096)
    code = (f"import mmap, sys, time; f = open({str(lib)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, "
            "prot=mmap.PROT_READ); print('up', flush=True); time.sleep(600)")
    p = subprocess.Popen(gpucr_cli() + ["run", "--", sys.executable, "-c", code], env=env,
                         stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert p.stdout.readline().strip() == "up"
        sock = tmp_path / "run" / f"{p.pid}.sock"
        assert sock.exists()
        sock.unlink()
        r = cli(env, "checkpoint", "--pid", str(p.pid), check=False)
        assert r.returncode != 0
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"process {p.pid} runs under the gpucr shim but its control socket cannot be found" in r.stderr
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()
