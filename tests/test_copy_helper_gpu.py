"""On a GPU machine: the copy helper path (GPUCR_COPY_HELPER, shim/helper.c,
gpucr_hpc/copy_helper.py) under real GPU programs, driven by
scripts/shim_gpu_verify.py --copy-helper, every check asserted: the helper moved
the data both ways in every cycle, every other restore was prefilled beside the
driver restore, the program's output is bit-identical to an uninterrupted run,
the GPU memory was handed back and nothing leaked. And when the helper dies
between cycles, the next checkpoints fall back to the bounce path, say why, and
lose nothing. Skipped without a GPU."""

import json
import subprocess
import sys

import pytest

from shim_helpers import REPO
from test_process_gpu import cuda_bin  # noqa: F401 - the fixture

pytestmark = pytest.mark.gpu


def verify(tmp_path, cuda_bin, workload, *extra):
    out = tmp_path / "verify.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts/shim_gpu_verify.py"), "--out", str(out),
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
