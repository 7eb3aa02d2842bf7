"""A real `sbatch --gpucr=on` job on the real local cluster: the plugin acts, the shim is loaded."""

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

PREFIX = Path("/opt/gpucr-hpc")

JOB = """#!/bin/bash
echo "LD_PRELOAD=$LD_PRELOAD"
env | grep '^GPUCR_' | sort
grep -c libgpucr-cuda.so /proc/self/maps || true
"""


def run_job(cluster, tmp_path, *args):
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    out = tmp_path / "job.out"
    jobid = cluster.sbatch(script, "-o", str(out), *args)
    info = cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
    for _ in range(50):  # the output file is flushed as the step ends
        if out.exists() and out.stat().st_size:
            break
        time.sleep(0.1)
    return jobid, info, out.read_text()


def parse_env(text):
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_gpucr_job_gets_shim_and_settings(slurm_cluster, tmp_path):
    jobid, info, text = run_job(slurm_cluster, tmp_path, "--gpucr=on")
    assert info["JobState"] == "COMPLETED", text
    env = parse_env(text)
    preload = env["LD_PRELOAD"].split(":")
    assert preload.count(str(PREFIX / "lib/gpucr/libgpucr-cuda.so")) == 1
    assert env["GPUCR_JOB_ID"] == jobid
    # The node's run dir (the path every node sees its own at, else the per-node one), of this job.
    roots = (slurm_cluster.state / "node-local" / "run", slurm_cluster.state / "run" / info["NodeList"])
    assert Path(env["GPUCR_RUN_DIR"]).parent in roots and Path(env["GPUCR_RUN_DIR"]).name == jobid
    # The last line counts the shim's mappings in the job's own process: it was really preloaded.
    assert int(text.strip().splitlines()[-1]) >= 1


def test_job_without_option_is_untouched(slurm_cluster, tmp_path):
    _, info, text = run_job(slurm_cluster, tmp_path)
    assert info["JobState"] == "COMPLETED", text
    env = parse_env(text)
    assert "libgpucr" not in env.get("LD_PRELOAD", "")
    assert not [k for k in env if k.startswith("GPUCR_")]
    assert text.strip().splitlines()[-1] == "0"
