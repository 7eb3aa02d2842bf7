"""On a GPU machine: what gpucr cannot checkpoint is refused, and a quiesce that
cannot finish aborts — each with one line naming the cause, a non-zero exit,
and the process running on untouched (it keeps making progress and every
result it prints is exact). Programs: tests/shim_workloads/refusal_workload.cu.
Skipped without a GPU."""

import os
import shutil
import subprocess
import threading
import time

import pytest
from shim_helpers import REPO, SHIM, build_shim, gpucr_cli, wait_for

pytestmark = pytest.mark.gpu

N = 1 << 20
STEP_SUM = (N // 7) * 28 + sum(range(1, N % 7 + 1))  # sum_k (k % 7 + 1)
IMPORTED_SUM = (N // 5) * 10 + sum(range(N % 5))  # sum_k (k % 5)


@pytest.fixture(scope="module")
def workload_bin(tmp_path_factory):
    build_shim()
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        pytest.skip("nvcc not found (needed to build tests/shim_workloads/refusal_workload.cu)")
    out = tmp_path_factory.mktemp("bin") / "refusal_workload"
    subprocess.run([nvcc, "-O2", "-o", str(out), str(REPO / "tests/shim_workloads/refusal_workload.cu")], check=True)
    return out


def base_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["GPUCR_SHIM"] = str(SHIM)
    env.update(extra)
    return env


class Workload:
    """refusal_workload MODE STEPS PACE_MS [ARG], under the shim (gpucr-hpc run) or not."""

    def __init__(self, binary, mode, steps, pace_ms, arg="", run_dir=None, env=None):
        cmd = [str(binary), mode, str(steps), str(pace_ms), str(arg)]
        if run_dir is not None:
            cmd = gpucr_cli() + ["run", "--run-dir", str(run_dir), "--"] + cmd
        self.mode, self.total, self.run_dir = mode, steps, run_dir
        self.p = subprocess.Popen(cmd, env=env or base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=REPO)
        self.pid = self.p.pid
        self.lines: list[str] = []
        self.err = ""
        threading.Thread(target=self._out, daemon=True).start()
        threading.Thread(target=self._err, daemon=True).start()

    def _out(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def _err(self):
        self.err = self.p.stderr.read()

    def steps(self) -> int:
        return sum(1 for ln in self.lines if ln.startswith("step "))

    def wait_steps(self, n: int, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while self.steps() < n:
            assert self.p.poll() is None or self.steps() >= n, f"{self.mode} exited: {self.lines[-5:]} {self.err}"
            assert time.monotonic() < deadline, f"{self.mode}: {self.steps()} of {n} steps: {self.lines[-5:]}"
            time.sleep(0.01)
        if self.run_dir is not None:
            assert wait_for(self.run_dir / f"{self.pid}.sock")

    def finish_exact(self, imported=False):
        """Runs to its end; exit 0 and every step's result exact."""
        rc = self.p.wait(timeout=120)
        time.sleep(0.1)
        assert rc == 0, f"{self.mode} rc={rc}: {self.lines[-5:]} {self.err[-1000:]}"
        assert self.lines[-1] == "done", self.lines[-5:]
        steps = [ln.split() for ln in self.lines if ln.startswith("step ")]
        assert len(steps) == self.total
        for i, f in enumerate(steps):
            assert int(f[1]) == i and int(f[2]) == (i + 1) * STEP_SUM, f"wrong result at step {i}: {f}"
            if imported:
                assert int(f[3]) == IMPORTED_SUM, f"wrong imported sum at step {i}: {f}"

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


@pytest.fixture
def procs():
    started = []
    yield started
    for w in started:
        w.kill()


def checkpoint(pid, run_dir, *extra):
    t0 = time.monotonic()
    r = subprocess.run(gpucr_cli() + ["checkpoint", "--pid", str(pid), "--run-dir", str(run_dir), *extra],
                       capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=180)
    r.elapsed = time.monotonic() - t0
    return r


def assert_refused(r, *phrases) -> str:
    assert r.returncode != 0, f"checkpoint was not refused: {r.stdout}{r.stderr}"
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("gpucr-hpc: error: "), line
    for p in phrases:
        assert p in line, line
    print(f"refusal ({r.elapsed:.2f} s): {line}")
    return line


def assert_untouched(w: Workload, more_steps: int = 10):
    """Running, gate open, nothing moved off the GPU, and still making progress."""
    from gpucr_hpc.shim.client import ShimClient

    st = ShimClient(w.pid, w.run_dir).status()
    assert st.state == "running" and not st.gate_closed, st
    assert st.checkpointed_bytes == 0 and st.arena_used == 0, st
    n = w.steps()
    w.wait_steps(min(n + more_steps, w.total))
    return st


def test_managed_memory_refused(workload_bin, tmp_path, procs):
    w = Workload(workload_bin, "managed", 150, 20, run_dir=tmp_path / "run")
    procs.append(w)
    w.wait_steps(5)
    assert_refused(checkpoint(w.pid, w.run_dir), f"process {w.pid}: checkpoint refused", "managed (UVM) memory")
    st = assert_untouched(w)
    assert st.managed_allocations == 1
    w.finish_exact()


@pytest.mark.parametrize("mode", ["ipc_export", "vmm_export"])
def test_ipc_exporter_refused(mode, workload_bin, tmp_path, procs):
    w = Workload(workload_bin, mode, 150, 20, tmp_path / "handle", run_dir=tmp_path / "run")
    procs.append(w)
    w.wait_steps(5)
    assert_refused(checkpoint(w.pid, w.run_dir), "checkpoint refused", "exports GPU memory to other processes")
    st = assert_untouched(w)
    assert st.ipc_in_use >= 1
    w.finish_exact()


@pytest.mark.parametrize("exporter", ["under_shim", "without_shim"])
def test_ipc_importer_refused(exporter, workload_bin, tmp_path, procs):
    """Legacy IPC between two processes; with both under the shim the handle is
    the shim's own (the memory is VMM-backed) and must still work."""
    run_dir = tmp_path / "run"
    handle = tmp_path / "handle"
    ex = Workload(workload_bin, "ipc_export", 400, 20, handle, run_dir=run_dir if exporter == "under_shim" else None)
    procs.append(ex)
    im = Workload(workload_bin, "ipc_import", 150, 20, handle, run_dir=run_dir)
    procs.append(im)
    im.wait_steps(5)
    assert_refused(checkpoint(im.pid, run_dir), "checkpoint refused", "maps GPU memory of another process")
    assert_untouched(im)
    if exporter == "under_shim":
        assert_refused(checkpoint(ex.pid, run_dir), "checkpoint refused", "exports GPU memory")
        assert_untouched(ex)
    im.finish_exact(imported=True)
    ex.finish_exact()


@pytest.fixture
def mps(tmp_path):
    """A private MPS control daemon (its own pipe/log dirs: no other process of
    the machine becomes its client), quit at the end."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl:
        pytest.skip("nvidia-cuda-mps-control is not installed on this machine: no MPS to test")
    env = base_env(CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "mps-pipe"), CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "mps-log"))
    for d in ("mps-pipe", "mps-log"):
        (tmp_path / d).mkdir()
    r = subprocess.run([ctl, "-d"], env=env, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"the MPS control daemon did not start: {(r.stdout + r.stderr).strip()[:300]}")
    yield env
    subprocess.run([ctl], input="quit\n", env=env, capture_output=True, text=True, timeout=30)


def test_mps_client_refused(mps, workload_bin, tmp_path, procs):
    pre = subprocess.run([str(workload_bin), "plain", "3", "0"], env=mps, capture_output=True, text=True, timeout=120)
    if pre.returncode != 0:
        log = tmp_path / "mps-log" / "control.log"
        pytest.skip(f"MPS does not serve clients here: {pre.stdout.strip()[-200:]} "
                    f"{log.read_text()[-300:] if log.exists() else ''}")
    w = Workload(workload_bin, "plain", 150, 20, run_dir=tmp_path / "run", env=mps)
    procs.append(w)
    w.wait_steps(5)
    assert_refused(checkpoint(w.pid, w.run_dir), "checkpoint refused", "MPS client")
    assert_untouched(w)
    w.finish_exact()


@pytest.mark.parametrize("mode,cause", [
    ("spin_block", "calls still in the driver"),       # the gate cannot drain
    ("spin_poll", "waiting for GPU work to finish"),   # the context sync cannot finish
])
def test_quiesce_timeout_aborts_cleanly(mode, cause, workload_bin, tmp_path, procs):
    """Each step spins 1.5 s on the GPU; a 300 ms quiesce timeout aborts the
    checkpoint, the process runs on, and a later checkpoint with room succeeds."""
    w = Workload(workload_bin, mode, 6, 0, 1500, run_dir=tmp_path / "run")
    procs.append(w)
    w.wait_steps(1)
    time.sleep(0.3)  # inside the next step's spin
    assert_refused(checkpoint(w.pid, w.run_dir, "--timeout", "300"),
                   "quiesce timed out after 300 ms", cause, "checkpoint aborted", "--timeout")
    assert_untouched(w, more_steps=1)
    ok = checkpoint(w.pid, w.run_dir, "--timeout", "20000")
    assert ok.returncode == 0, ok.stderr
    print(f"then with --timeout 20000 ({ok.elapsed:.2f} s): {ok.stdout.strip()}")
    rs = subprocess.run(gpucr_cli() + ["restore", "--pid", str(w.pid), "--run-dir", str(w.run_dir)],
                        capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=180)
    assert rs.returncode == 0, rs.stderr
    w.finish_exact()
