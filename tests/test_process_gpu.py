"""On a GPU machine: checkpoint/restore in place of real GPU programs under the
shim (gpu-checks/shim_gpu_verify.py), each check asserted. Skipped without a GPU."""

import json
import subprocess
import sys

import pytest
from shim_helpers import REPO

pytestmark = pytest.mark.gpu


FRAMEWORKS = ["triton", "torch_compile", "torch_compile_reduce_overhead"]


def test_triton_through_the_shims_yield_alone(tmp_path):
    """The yield of a SIGTSTP suspend, or of a preemption before its dump: the
    shim's alone, the driver not checkpointed. Triton's launcher asks the driver
    about every pointer first; it must wait, not be told the memory is gone."""
    pytest.importorskip("triton")
    out = tmp_path / "verify.json"
    r = subprocess.run([sys.executable, str(REPO / "gpu-checks/shim_gpu_verify.py"), "--out", str(out),
                        "--only", "triton", "--shim-only", "--leak-cycles", "3", "--hold-s", "2",
                        "--ballast-gib", "1", "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=600)
    result = json.loads(out.read_text())["workloads"][0]
    assert "error" not in result, result.get("error")
    for check, ok in result["checks"].items():
        assert ok, f"{check} failed: {r.stdout[-2000:]}"


@pytest.mark.parametrize("workload", ["torch_default", "torch_expandable_segments", "torch_cudaMallocAsync",
                                      "cupy", "cuda_c_cudaMalloc"] + FRAMEWORKS)
def test_checkpoint_restore_in_place(workload, cuda_bin, tmp_path):
    """The frameworks' programs keep running while checkpointed, 2 s each time,
    and launch into the yield: Triton's launcher asks the driver about every
    pointer first, torch.compile launches through PyTorch's launcher or CUDA graphs."""
    if workload.startswith(("torch", "triton")):
        pytest.importorskip("torch")
    if workload.startswith("triton"):
        pytest.importorskip("triton")
    if workload == "cupy":
        pytest.importorskip("cupy")
    out = tmp_path / "verify.json"
    hold = ["--hold-s", "2"] if workload in FRAMEWORKS else []
    r = subprocess.run([sys.executable, str(REPO / "gpu-checks/shim_gpu_verify.py"), "--out", str(out),
                        "--only", workload, "--leak-cycles", "3", "--cycles", "3", "--ballast-gib", "4",
                        "--cuda-bin", str(cuda_bin), "--run-dir", str(tmp_path / "run")] + hold,
                       capture_output=True, text=True, timeout=900)
    result = json.loads(out.read_text())["workloads"][0]
    assert "error" not in result, result.get("error")
    for check, ok in result["checks"].items():
        assert ok, f"{check} failed: {r.stdout[-2000:]}"
