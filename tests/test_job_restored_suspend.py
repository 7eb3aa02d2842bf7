"""`gpucr-hpc suspend` of a job that was preempted and restored.

A restored unit runs in a new PID namespace: its shim's control socket is named
after its PID there, not after the PID the node agent sees. The agent must still
reach it through its shim (on a GPU node, a unit it misses keeps its GPU memory
while the job is suspended, or is handed to the driver alone) and must never skip
a unit because of the words of an error. CPU job on the real test cluster, real CRIU.
"""

import json
import os

import pytest
from job_helpers import counting_script, gpucr, numbers, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)


def test_suspend_of_a_restored_job_reaches_every_unit(slurm_cluster, workdir):
    log = workdir / "count.txt"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, 100000), "--gpucr=on",
                                 "-o", str(workdir / "job.out"))
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
        gpucr(slurm_cluster, "preempt", jobid)
        slurm_cluster.wait_state(jobid, "RUNNING", timeout=120)
        n = len(numbers(log))
        wait_for(lambda: len(numbers(log)) > n + 10, what="the restored job to count on",
                 detail=lambda: slurm_cluster.restore_log(jobid))

        r = gpucr(slurm_cluster, "suspend", jobid, "--json", check=False)
        assert r.returncode == 0, r.stderr
        restored = json.loads(r.stdout)
        # the restored batch unit was reached through its shim (a fresh job's suspend lists it too)
        assert restored["ok"] and restored["units"] == ["batch"], restored
        assert restored["errors"] == []
        assert slurm_cluster.job(jobid)["JobState"] == "SUSPENDED"
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
