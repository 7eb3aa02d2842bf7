"""`gpucr-hpc prune --ended` on the test cluster: a job that completed goes whole,
one that runs keeps its generations (the newest --keep), and ls agrees."""

import json
import os
import sys

import pytest
from job_helpers import gpucr, numbers, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)

COUNTER = ("import sys, time\nfor i in range(int(sys.argv[2])):\n"
           "    open(sys.argv[1], 'a').write(f'{i}\\n'); time.sleep(0.05)\n")


def counting_job(cluster, workdir, name, steps):
    (workdir / "count.py").write_text(COUNTER)
    script = workdir / f"{name}.sh"
    script.write_text(f"#!/bin/bash\n{sys.executable} {workdir}/count.py {workdir}/{name}.txt {steps}\n")
    jobid = cluster.sbatch(script, "--gpucr=on", "-o", str(workdir / f"{name}.out"))
    cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(workdir / f"{name}.txt")) > 3, what=f"{name} to count")
    return jobid


def test_prune_ended_removes_a_completed_job_and_keeps_a_running_ones_newest(slurm_cluster, workdir):
    done = counting_job(slurm_cluster, workdir, "done", 60)
    gpucr(slurm_cluster, "checkpoint", done)
    running = counting_job(slurm_cluster, workdir, "running", 3000)
    try:
        for _ in range(3):
            gpucr(slurm_cluster, "checkpoint", running)
        slurm_cluster.wait_state(done, "COMPLETED", timeout=120)
        r = gpucr(slurm_cluster, "prune", "--ended", "--keep", "1", "--json")
        acts = json.loads(r.stdout)["actions"]
        assert {"job": done, "generation": "", "action": "removed", "why": "the job ended COMPLETED"} in acts
        mine = {(a["generation"], a["action"]) for a in acts if a["job"] == running}
        assert ("gen-3", "kept") in mine and ("gen-2", "removed") in mine, acts
        assert not (slurm_cluster.state / "images" / done).exists()
        ls = json.loads(gpucr(slurm_cluster, "ls", running, "--json").stdout)["generations"]
        assert [g["generation"] for g in ls] == ["gen-3"]
        assert slurm_cluster.job(running)["JobState"] == "RUNNING"
    finally:
        slurm_cluster.run("scancel", running, check=False)
