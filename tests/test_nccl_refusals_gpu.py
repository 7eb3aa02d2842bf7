"""On two GPUs: a job whose NCCL calls are captured in a CUDA graph is refused in
one line, and its ranks run on to the end with every result exact. (NVLS, the
other refusal of NCCL state, is tested on the CPU: the lent GPU machines must
never make a multicast object.) Skipped without two GPUs."""

import os
import re
import subprocess
import sys
import time

import pytest
from job_helpers import wait_for
from shim_helpers import REPO, build_shim

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.process import in_place

pytestmark = pytest.mark.gpu

WORKLOAD = REPO / "tests" / "shim_workloads" / "graph_nccl.py"


def gpus() -> int:
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len(r.stdout.splitlines()) if r.returncode == 0 else 0


def steps(out) -> dict[int, int]:
    found = re.findall(r"^rank (\d) step \d+ (\S+)$", out.read_text(), re.M)
    assert all(v == "2" for _, v in found), "a step's sum is wrong"
    return {r: sum(1 for k, _ in found if int(k) == r) for r in (0, 1)}


def test_nccl_calls_captured_in_a_cuda_graph_are_refused_and_the_ranks_run_on(tmp_path):
    if gpus() < 2:
        pytest.skip("needs 2 GPUs")
    build_shim()
    out, run_dir = tmp_path / "out", tmp_path / "run"
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    with open(out, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "gpucr_hpc", "run", "--run-dir", str(run_dir), "--",
                              "torchrun", "--standalone", "--nproc-per-node=2", str(WORKLOAD), "600", "0.02"],
                             stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        wait_for(lambda: min(steps(out).values()) >= 20, timeout=120, what="both ranks to step",
                 detail=lambda: out.read_text()[-3000:])
        t = time.monotonic()
        with pytest.raises(GpucrError, match="inside a CUDA graph") as e:
            in_place.checkpoint_tree(p.pid, run_dir=run_dir, timeout_ms=30000)
        print(f"refused in {time.monotonic() - t:.2f} s: {e.value.one_line()}")
        assert "\n" not in e.value.one_line()
        at = min(steps(out).values())
        wait_for(lambda: min(steps(out).values()) >= at + 20, timeout=60, what="steps after the refusal")
        try:
            rc = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job did not end; steps {steps(out)}; its output ends:\n{out.read_text()[-3000:]}")
        assert rc == 0, out.read_text()[-3000:]
        assert steps(out) == {0: 600, 1: 600}
    finally:
        if p.poll() is None:
            p.kill()
