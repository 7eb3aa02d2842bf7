"""On a GPU machine: checkpoint/restore in place of real GPU programs under the
shim (scripts/shim_gpu_verify.py), each check asserted. Skipped without a GPU."""

import json
import subprocess
import sys

import pytest
from shim_helpers import REPO

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("workload", ["torch_default", "torch_expandable_segments", "torch_cudaMallocAsync",
                                      "cupy", "cuda_c_cudaMalloc"])
def test_checkpoint_restore_in_place(workload, cuda_bin, tmp_path):
    if workload.startswith("torch"):
        pytest.importorskip("torch")
    if workload == "cupy":
        pytest.importorskip("cupy")
    out = tmp_path / "verify.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts/shim_gpu_verify.py"), "--out", str(out),
                        "--only", workload, "--leak-cycles", "3", "--cycles", "3", "--ballast-gib", "4",
                        "--cuda-bin", str(cuda_bin), "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=900)
    result = json.loads(out.read_text())["workloads"][0]
    assert "error" not in result, result.get("error")
    for check, ok in result["checks"].items():
        assert ok, f"{check} failed: {r.stdout[-2000:]}"
