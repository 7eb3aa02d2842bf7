"""Issue 16, items 3 and 4, on a GPU machine (marked gpu, skipped elsewhere), driven by
gpu-checks/gpu_yield_jax_verify.py; every check it makes is asserted here.

* A PyTorch decode loop restored from an image in a new PID namespace (as a Slurm
  restore does) yields like a fresh process: `checkpoint --pid` goes through its
  shim, the SIGTSTP that follows reports no failed yield, and a plain SIGTSTP
  yields its GPU memory; its output equals an uninterrupted run's.
* A JAX loop, with XLA's preallocation and without, checkpointed in place and
  through an image, survives its restore and its output equals an uninterrupted run's.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from shim_helpers import REPO, build_shim, root_criu_or_skip

pytestmark = pytest.mark.gpu


def _verify(tmp_path, *only) -> dict:
    results = Path(os.environ.get("GPUCR_RESULTS_DIR") or tmp_path)
    out = results / f"gpu-yield-jax-{'-'.join(only)}.json"
    r = subprocess.run([sys.executable, str(REPO / "gpu-checks/gpu_yield_jax_verify.py"), "--out", str(out),
                        "--work", str(tmp_path / "work"), "--only", *only],
                       capture_output=True, text=True, timeout=900)
    assert out.exists(), f"no result written: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    return json.loads(out.read_text())["scenarios"]


def _assert_checks(res: dict) -> None:
    failed = [k for k, ok in res["checks"].items() if not ok]
    assert not failed, (f"{failed} failed; error: {res.get('error')}\n"
                        f"{json.dumps({k: v for k, v in res.items() if k != 'checks'}, indent=1)[-6000:]}")


def test_restored_pytorch_process_yields_like_a_fresh_one(tmp_path):
    pytest.importorskip("torch")
    root_criu_or_skip()
    build_shim()
    _assert_checks(_verify(tmp_path, "restored_torch")["restored_torch"])


@pytest.mark.parametrize("scenario", ["jax_prealloc_in_place", "jax_no_prealloc_in_place",
                                      "jax_prealloc_image", "jax_no_prealloc_image"])
def test_jax_checkpoint_restore(tmp_path, scenario):
    pytest.importorskip("jax")
    if scenario.endswith("image"):
        root_criu_or_skip()
    build_shim()
    _assert_checks(_verify(tmp_path, scenario)[scenario])
