"""Job ids as Slurm takes them, on the real test cluster (issue 33, items 3 and 6):

* only slurmctld's answer "Invalid job id" makes a job unknown;
* an array task (1234_5) and a heterogeneous job's component (1234+0) name the
  job Slurm gave that id (its own job id, under which its checkpoints are);
* a task that has not started, one Slurm does not know, and a task of a job that
  is no array are refused by name, in one line.
"""

import json

import pytest
from job_helpers import gpucr, wait_for

pytestmark = pytest.mark.slurm


def one_line_error(r) -> str:
    assert r.returncode != 0, r.stdout
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("gpucr-hpc: error:"), err
    return err


def status_of(cluster, spec: str) -> dict:
    r = gpucr(cluster, "status", spec, "--json", check=False)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpucr-hpc.job-status/1", doc
    return doc


def records(cluster, jobid: str) -> list[dict]:
    out = cluster.run("scontrol", "show", "job", "-o", jobid).stdout
    return [dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in out.splitlines()]


def test_only_slurms_invalid_job_id_answer_is_an_unknown_job(slurm_cluster, monkeypatch):
    from gpucr_hpc.slurm import commands as slurm

    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    with pytest.raises(slurm.JobUnknown):
        slurm.show_job("999999")
    err = one_line_error(gpucr(slurm_cluster, "status", "999999", check=False))
    assert "no job 999999 known to Slurm" in err, err


def test_array_tasks_are_their_own_jobs(slurm_cluster, tmp_path):
    arr = slurm_cluster.run("sbatch", "--parsable", "--array=0-1", "-N1", "-o", "/dev/null",
                            "--wrap", "sleep 120").stdout.strip()
    pending = slurm_cluster.run("sbatch", "--parsable", "--array=0-3%1", "-N1", "-o", "/dev/null",
                                "--wrap", "sleep 120").stdout.strip()
    plain = slurm_cluster.run("sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap", "sleep 120").stdout.strip()
    try:
        wait_for(lambda: sum(r.get("JobState") == "RUNNING" for r in records(slurm_cluster, arr)) == 2,
                 what="both array tasks to run")
        task1 = next(r["JobId"] for r in records(slurm_cluster, arr) if r.get("ArrayTaskId") == "1")
        doc = status_of(slurm_cluster, f"{arr}_1")
        assert doc["job"] == task1 and doc["state"] == "RUNNING" and doc["known_to_slurm"] is True, doc
        err = one_line_error(gpucr(slurm_cluster, "status", f"{arr}_9", check=False))
        assert f"no array task {arr}_9 known to Slurm" in err, err
        err = one_line_error(gpucr(slurm_cluster, "checkpoint", f"{pending}_3", check=False))
        assert f"array task {pending}_3 has not started" in err, err
        err = one_line_error(gpucr(slurm_cluster, "ls", f"{plain}_1", check=False))
        assert f"job {plain} is not an array job" in err, err
        err = one_line_error(gpucr(slurm_cluster, "status", f"{arr}_[0-1]", check=False))
        assert f"'{arr}_[0-1]' is not a job id" in err and "1234_5" in err, err
    finally:
        slurm_cluster.run("scancel", arr, pending, plain, check=False)


def test_het_job_components_are_their_own_jobs(slurm_cluster):
    het = slurm_cluster.run("sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap", "sleep 120", ":",
                            "-N1", "--wrap", "sleep 120").stdout.strip()
    try:
        wait_for(lambda: all(r.get("JobState") == "RUNNING" for r in records(slurm_cluster, het)),
                 what="the het job to run")
        second = next(r["JobId"] for r in records(slurm_cluster, het) if r.get("HetJobOffset") == "1")
        assert second != het
        assert status_of(slurm_cluster, f"{het}+1")["job"] == second
        assert status_of(slurm_cluster, f"{het}+0")["job"] == het
        err = one_line_error(gpucr(slurm_cluster, "status", f"{het}+5", check=False))
        assert f"no component {het}+5 known to Slurm" in err, err
    finally:
        slurm_cluster.run("scancel", het, check=False)
