"""Periodic checkpoints (--gpucr-interval, plugstack interval=): the job is
checkpointed in place every N seconds and runs on; each one says so in the
job's output and restore.log, and a preemption restores the newest."""

import os
import re

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)

from job_helpers import assert_counted_once, counting_script, gpucr, numbers, output_of, wait_for  # noqa: E402


def test_a_job_with_an_interval_is_checkpointed_every_interval(slurm_cluster, workdir):
    steps = 500
    log, out = workdir / "count.txt", workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, steps), "--gpucr=on", "--gpucr-interval=4s",
                                 "-o", str(out))
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        periodic = lambda: re.findall(r"periodic checkpoint of job \d+: (gen-\d+)", output_of(out))  # noqa: E731
        wait_for(lambda: len(periodic()) >= 2, timeout=90, what="two periodic checkpoints",
                 detail=lambda: (output_of(out), slurm_cluster.restore_log(jobid)))
        assert periodic()[:2] == ["gen-1", "gen-2"], out.read_text()
        assert "periodic checkpoint gen-1 in" in slurm_cluster.restore_log(jobid)
        gpucr(slurm_cluster, "preempt", jobid)
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (out.read_text(), info)
        assert out.read_text().count("after python") == 1
        assert_counted_once(log, steps)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


@pytest.mark.parametrize("bad", ["soon", "5d", "-3", "10mm"])
def test_a_bad_interval_is_refused_by_sbatch(slurm_cluster, workdir, bad):
    script = workdir / "true.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    r = slurm_cluster.run("sbatch", "--gpucr=on", f"--gpucr-interval={bad}", str(script), check=False)
    assert r.returncode != 0 and "gpucr-interval" in r.stderr, r.stderr


def test_without_an_interval_nothing_is_checkpointed(slurm_cluster, workdir):
    log, out = workdir / "count.txt", workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, 120), "--gpucr=on", "-o", str(out))
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
    assert info["JobState"] == "COMPLETED" and "periodic checkpoint" not in out.read_text()
    assert len(numbers(log)) == 120
