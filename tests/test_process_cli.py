"""`gpucr-hpc run / status / checkpoint --pid / restore --pid` against real
processes under the real shim (CPU processes: no GPU needed)."""

import json
import os
import re
import subprocess
import sys

import pytest
from shim_helpers import SHIM, SHIM_DIR, build_shim, gpucr_cli, wait_for


def cli(*args, env=None, check=True):
    r = subprocess.run(gpucr_cli() + list(args), capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture
def env(tmp_path):
    build_shim()
    e = dict(os.environ)
    e["GPUCR_RUN_DIR"] = str(tmp_path / "run")
    e["GPUCR_SHIM"] = str(SHIM)
    return e


@pytest.fixture
def running(env, tmp_path):
    """`gpucr-hpc run -- sh -c 'sleep 60 & wait'`: a shimmed root with a shimmed child."""
    p = subprocess.Popen(gpucr_cli() + ["run", "--", "sh", "-c", "sleep 60 & wait"], env=env)
    assert wait_for(tmp_path / "run" / f"{p.pid}.sock")
    yield p
    from gpucr_hpc.criu.run import process_tree

    for pid in reversed(process_tree(p.pid)):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    p.wait()


def test_run_keeps_pid_and_preloads_shim_once(env, tmp_path):
    env = dict(env, LD_PRELOAD=f"{SHIM}")
    code = "import os; print(os.getpid()); print(os.environ['LD_PRELOAD']); print(os.environ['GPUCR_ARENA_DIR'])"
    p = subprocess.Popen(gpucr_cli() + ["run", "--arena", str(tmp_path), "--", sys.executable, "-c", code],
                         env=env, stdout=subprocess.PIPE, text=True)
    out = p.communicate(timeout=60)[0].split("\n")
    assert p.returncode == 0
    assert int(out[0]) == p.pid
    assert out[1].split() == [str(SHIM)]
    assert out[2] == str(tmp_path)


def test_run_unknown_command_one_line_error(env):
    r = cli("run", "--", "/nonexistent/program", env=env, check=False)
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "command not found" in r.stderr


def test_status_lists_shimmed_processes(running, env):
    rows = json.loads(cli("status", "--json", env=env).stdout)["processes"]
    pids = {r["pid"] for r in rows}
    assert running.pid in pids and len(pids) >= 2  # the shell and its sleep
    root = next(r for r in rows if r["pid"] == running.pid)
    assert root["state"] == "running" and root["gpu_bytes"] == 0 and "sleep 60" in root["cmd"]
    human = cli("status", env=env).stdout
    assert str(running.pid) in human and "running(cpu)" in human


def test_status_removes_stale_sockets(env, tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "999999999.sock").write_text("")
    assert "no process runs under the shim" in cli("status", env=env).stdout
    assert not (run / "999999999.sock").exists()


def test_checkpoint_restore_in_place_cpu_tree(running, env):
    cp = json.loads(cli("checkpoint", "--pid", str(running.pid), "--json", env=env).stdout)
    assert cp["pid"] == running.pid
    assert {"quiesce_s", "data_s", "control_s", "total_s"} <= set(cp["phases"])
    assert len([p for p in cp["processes"] if p["shim"]]) >= 2
    states = {r["pid"]: r["state"] for r in json.loads(cli("status", "--json", env=env).stdout)["processes"]}
    assert states[running.pid] == "checkpointed"
    again = cli("checkpoint", "--pid", str(running.pid), env=env, check=False)
    assert again.returncode != 0 and "already checkpointed" in again.stderr
    human = cli("restore", "--pid", str(running.pid), env=env).stdout
    assert human.startswith(f"restored {running.pid}") and "total" in human
    states = {r["pid"]: r["state"] for r in json.loads(cli("status", "--json", env=env).stdout)["processes"]}
    assert states[running.pid] == "running"
    twice = cli("restore", "--pid", str(running.pid), env=env, check=False)
    assert twice.returncode != 0 and "not checkpointed" in twice.stderr
    assert running.poll() is None


def test_checkpoint_of_unshimmed_process_refused(env):
    p = subprocess.Popen(["sleep", "60"])
    try:
        r = cli("checkpoint", "--pid", str(p.pid), env=env, check=False)
        assert r.returncode != 0
        assert r.stderr.count("\n") == 1 and "gpucr-hpc run" in r.stderr
    finally:
        p.kill()
        p.wait()


def test_checkpoint_missing_pid_refused(env):
    r = cli("checkpoint", "--pid", "999999999", env=env, check=False)
    assert r.returncode != 0 and "no process 999999999" in r.stderr


def test_run_arena_preallocation(env, tmp_path):
    """--arena-size creates the arena at start-up (in the --arena dir), before any checkpoint;
    its file is unlinked once mapped, so even a killed process leaves nothing behind."""
    arena = tmp_path / "arena"
    arena.mkdir()
    p = subprocess.Popen(gpucr_cli() + ["run", "--arena", str(arena), "--arena-size", "6M", "--", "sleep", "60"],
                         env=env)
    try:
        assert wait_for(tmp_path / "run" / f"{p.pid}.sock")
        for _ in range(100):
            row = next(r for r in json.loads(cli("status", "--json", env=env).stdout)["processes"] if r["pid"] == p.pid)
            if row["arena_bytes"]:
                break
            import time
            time.sleep(0.05)
        assert row["arena_bytes"] >= 6 << 20 and row["arena_dir"] == str(arena)
        maps = open(f"/proc/{p.pid}/maps").read()
        # a file there with no name (O_TMPFILE: `#inode`), gone with the process
        assert re.search(rf"{re.escape(str(arena))}/\S+ \(deleted\)", maps), maps
    finally:
        p.kill()
        p.wait()
    assert list(arena.iterdir()) == []


def test_run_bad_arena_size(env):
    r = cli("run", "--arena-size", "lots", "--", "true", env=env, check=False)
    assert r.returncode != 0 and "bad --arena-size" in r.stderr


# -- where `gpucr-hpc run` finds the shim without GPUCR_SHIM ---------------------------

def _preload_of_run(env):
    code = "import os; print(os.environ['LD_PRELOAD'])"
    r = cli("run", "--", sys.executable, "-c", code, env=env)
    return r.stdout.split()[0]


@pytest.fixture
def no_shim_env(env, tmp_path):
    """No GPUCR_SHIM, and a SLURM_CONF of our own (no plugstack.conf yet)."""
    e = {k: v for k, v in env.items() if k not in ("GPUCR_SHIM", "GPUCR_PREFIX")}
    e["SLURM_CONF"] = str(tmp_path / "slurm.conf")
    return e


def test_run_finds_the_shim_under_gpucr_prefix(no_shim_env, tmp_path):
    """`make install PREFIX=P` puts it in P/lib/gpucr; GPUCR_PREFIX=P names that install."""
    import shutil

    lib = tmp_path / "prefix" / "lib" / "gpucr"
    lib.mkdir(parents=True)
    shutil.copy(SHIM, lib / "libgpucr-cuda.so")
    assert _preload_of_run(dict(no_shim_env, GPUCR_PREFIX=str(tmp_path / "prefix"))) == \
        str(lib / "libgpucr-cuda.so")


def test_run_finds_the_sites_shim(no_shim_env, tmp_path):
    """The shim= of the plugstack.conf line is the one jobs get: `run` takes it too."""
    import shutil

    site_lib = tmp_path / "site-lib"
    site_lib.mkdir()
    shutil.copy(SHIM, site_lib / "libgpucr-cuda.so")
    (tmp_path / "plugstack.conf").write_text(
        f"optional /nowhere/spank_gpucr.so shim={site_lib}/libgpucr-cuda.so rundir=/run/gpucr\n")
    assert _preload_of_run(no_shim_env) == str(site_lib / "libgpucr-cuda.so")


def test_shim_install_locations_follow_the_makefiles(monkeypatch, tmp_path):
    """Without settings: the top-level Makefile's PREFIX, then the site default's (and
    shim/Makefile's) /usr/local, each as $(PREFIX)/lib/gpucr."""
    import re

    from gpucr_hpc.shim import client as shim_client
    from gpucr_hpc.slurm.site import Site

    for var in ("GPUCR_SHIM", "GPUCR_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    repo = SHIM_DIR.parent
    prefix = re.search(r"^PREFIX \?= (\S+)", (repo / "Makefile").read_text(), re.M).group(1)
    sub_prefix = re.search(r"^PREFIX \?= (\S+)", (SHIM_DIR / "Makefile").read_text(), re.M).group(1)
    found = [str(p) for p in shim_client.shim_candidates()]
    installed = [f"{prefix}/lib/gpucr/libgpucr-cuda.so", f"{sub_prefix}/lib/gpucr/libgpucr-cuda.so"]
    assert [p for p in found if p in installed] == installed
    assert found.index(installed[0]) < found.index(installed[1])
    assert Site(plugstack=None).shim in found
