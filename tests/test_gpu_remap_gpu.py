"""Restore onto the other GPU, on a machine with two GPUs of one model (marked gpu,
skipped elsewhere).

A PyTorch training process under the shim, on GPU 0, is checkpointed to disk, killed,
and restored with `restore --from IMG --gpu 1`, again by a restore that may use GPU 1
only (no --gpu: the plan moves it), and, seeing both GPUs, with `--gpu 1,0`. Each time
it must run on GPU 1 (nvidia-smi and the restore report) and finish bit-identical to an
uninterrupted run. Driven by gpu-checks/gpu_remap_verify.py; every check it makes is
asserted here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from shim_helpers import REPO, build_shim, root_criu_or_skip

from gpucr_hpc.gpu import inventory as gpu_inventory


@pytest.mark.gpu
def test_pytorch_process_restores_onto_the_other_gpu(tmp_path):
    pytest.importorskip("torch")
    here = gpu_inventory.node_gpus()
    if len(here) < 2 or here[0].model != here[1].model:
        pytest.skip(f"needs two GPUs of one model, this machine has {[g.model for g in here]}")
    root_criu_or_skip()
    build_shim()
    results = Path(os.environ.get("GPUCR_RESULTS_DIR") or tmp_path)
    out = results / "gpu-remap-test.json"
    r = subprocess.run([sys.executable, str(REPO / "gpu-checks/gpu_remap_verify.py"), "--out", str(out),
                        "--image-root", str(tmp_path / "images")],
                       capture_output=True, text=True, timeout=900)
    (results / "gpu-remap-verify.log").write_text(r.stdout + r.stderr)  # its step-by-step log
    assert out.exists(), f"no result written: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    res = json.loads(out.read_text())
    for scenario in ("forced", "auto", "swap"):
        got = res.get(scenario, {"error": "not run", "stderr_tail": r.stdout[-2000:] + r.stderr[-2000:]})
        assert "error" not in got, f"{scenario}: {got['error']}\n{got['stderr_tail']}"
    assert res["checks"], r.stdout[-2000:]
    for check, ok in res["checks"].items():
        assert ok, f"{check} failed: {r.stdout[-3000:]}"
