"""Which submission a checkpoint belongs to, across slurmctld losing or rolling back its state.

Real Slurm, real CRIU. slurmctld is stopped and started again with its state
directory changed the way a crash or a lost disk changes it: the job records
removed (Slurm forgets every job and hands their ids out again), or put back
as they were saved earlier (a job starts again with Restarts=0).
"""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from job_helpers import assert_counted_once, counting_script, gpucr, numbers, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)


def state_dir(cluster) -> Path:
    return cluster.state / "ctld" / "state"


def stop_slurmctld(cluster) -> None:
    pid = int((cluster.state / "ctld" / "slurmctld.pid").read_text().split()[0])
    os.kill(pid, signal.SIGTERM)  # a clean stop saves the state first
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), what="slurmctld to stop")


def start_slurmctld(cluster) -> None:
    subprocess.run(["slurmctld", "-f", str(cluster.conf)], env=cluster.env, check=True, timeout=60)
    wait_for(lambda: cluster.run("scontrol", "ping", check=False).stdout.count("UP") > 0,
             what="slurmctld to answer")
    wait_for(lambda: "idle" in cluster.run("sinfo", "-h", "-o", "%T", check=False).stdout,
             what="a node to be idle again")


def forget_all_jobs(cluster, workdir: Path, first_id: int | None = None) -> None:
    """slurmctld restarted without its job records (the state disk was lost):
    every job is forgotten and job ids are handed out again from FirstJobId,
    `first_id`, or by default past every id used so far (later tests then
    meet no image directory of an earlier job)."""
    if first_id is None:
        used = [int(p.name) for p in (cluster.state / "images").iterdir() if p.name.isdigit()]
        first_id = max([next_job_id(cluster, workdir), *(n + 1 for n in used)])
    stop_slurmctld(cluster)
    for p in state_dir(cluster).iterdir():
        if p.name.startswith(("job_state", "hash.", "resv_state", "trigger_state")):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    conf = cluster.conf.read_text()
    cluster.conf.write_text(conf + f"FirstJobId={first_id}\n")
    try:
        start_slurmctld(cluster)
    finally:
        # What the nodes read. (No `scontrol reconfigure` to match them: before its
        # first state save, it would make this slurmctld forget its jobs again.)
        cluster.conf.write_text(conf)


def next_job_id(cluster, workdir: Path) -> int:
    dummy = workdir / "dummy.sh"
    dummy.write_text("#!/bin/bash\ntrue\n")
    got = int(cluster.sbatch(dummy, "--hold", "-o", "/dev/null"))
    cluster.run("scancel", str(got))
    return got + 1


def test_new_job_with_an_old_jobs_id_is_never_restored_from_its_images(slurm_cluster, workdir):
    """Job A checkpointed, then slurmctld loses its state and gives A's id to job
    B (same output file pattern, as slurm-%j.out would be). B is requeued: it
    must run its own script from the top, with its own output, and A's
    processes must not come back. A's generation stays, shown as another
    submission's."""
    log_a, log_b = workdir / "a.txt", workdir / "b.txt"
    out = str(workdir / "job-%j.out")
    script_a = counting_script(workdir, log_a, 2000)
    jobid = slurm_cluster.sbatch(script_a, "--gpucr=on", "-o", out)
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log_a)) > 10, what="job A to count")
    # The id may have been used before in this cluster: A's generation need not be gen-1.
    gen_a = json.loads(gpucr(slurm_cluster, "checkpoint", jobid, "--json").stdout)["generation"]
    slurm_cluster.run("scancel", jobid)
    slurm_cluster.wait_state(jobid, {"CANCELLED", "COMPLETED", "FAILED"})
    wait_for(lambda: not _counting(log_a), what="job A's counter to stop")
    a_counted = numbers(log_a)
    gen_1 = slurm_cluster.state / "images" / jobid / gen_a
    assert (gen_1 / "COMMITTED").exists()

    forget_all_jobs(slurm_cluster, workdir, first_id=int(jobid))
    script_b = counting_script(workdir, log_b, 100)
    assert slurm_cluster.sbatch(script_b, "--gpucr=on", "-o", out) == jobid
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log_b)) > 5, what="job B to count")
    slurm_cluster.run("scontrol", "requeue", jobid)
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    text = Path(out.replace("%j", jobid)).read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (text, info)
    assert "start restart=1" in text and text.count("after python") == 1, text
    assert numbers(log_a) == a_counted, "job A's processes came back in job B"
    assert numbers(log_b)[-100:] == list(range(100))

    assert (gen_1 / "COMMITTED").exists(), "job A's generation was removed"
    rows = json.loads(gpucr(slurm_cluster, "ls", jobid, "--json").stdout)["generations"]
    assert [r["other_submission"] for r in rows if r["generation"] == gen_a] == [True], rows
    table = gpucr(slurm_cluster, "ls", jobid).stdout  # the cell may wrap at a narrow terminal
    assert "(other" in table and "submission)" in table, table

    # Job B may not take A's generation; A comes back as a job of its own.
    n_a = gen_a[4:]
    r = gpucr(slurm_cluster, "restore", jobid, "--from", n_a, check=False)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"gpucr-hpc restore {jobid} --from {n_a} --resubmit" in r.stderr
    r = gpucr(slurm_cluster, "restore", jobid, "--from", n_a, "--resubmit", "--json")
    again = json.loads(r.stdout)["resubmitted_as"]
    slurm_cluster.wait_state(again, "RUNNING")
    n = len(a_counted)
    wait_for(lambda: len(numbers(log_a)) > n + 10, what="job A to count on under its new id",
             detail=lambda: slurm_cluster.restore_log(again))
    got = numbers(log_a)
    assert got == list(range(len(got))), "job A repeated or skipped values"
    slurm_cluster.run("scancel", again)


def _counting(log: Path) -> bool:
    n = len(numbers(log))
    time.sleep(0.5)
    return len(numbers(log)) != n


def test_start_with_restarts_zero_restores_its_own_checkpoint(slurm_cluster, workdir):
    """slurmctld comes back with the state it saved before the job's first start
    (submitted held): the job, checkpointed meanwhile, starts again with
    Restarts=0 and must be restored, not run from the top."""
    steps = 300
    log = workdir / "count.txt"
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, steps), "--gpucr=on", "--hold", "-o", str(out))
    stop_slurmctld(slurm_cluster)
    saved = workdir / "ctld-state"
    shutil.copytree(state_dir(slurm_cluster), saved, symlinks=True)
    start_slurmctld(slurm_cluster)
    slurm_cluster.run("scontrol", "release", jobid)
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 20, what="the counter to start")
    gpucr(slurm_cluster, "checkpoint", jobid)
    slurm_cluster.run("scancel", jobid)
    slurm_cluster.wait_state(jobid, {"CANCELLED"})
    wait_for(lambda: not _counting(log), what="the counter to stop")
    assert len(numbers(log)) < steps

    stop_slurmctld(slurm_cluster)
    shutil.rmtree(state_dir(slurm_cluster))
    shutil.copytree(saved, state_dir(slurm_cluster), symlinks=True)
    start_slurmctld(slurm_cluster)
    assert slurm_cluster.job(jobid)["Restarts"] == "0"
    slurm_cluster.run("scontrol", "release", jobid)
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", (text, info)
    assert text.count("start restart=0") == 1 and text.count("after python") == 1, text
    assert_counted_once(log, steps)


def test_job_slurm_forgot_is_brought_back_by_restore(slurm_cluster, workdir):
    """slurmctld loses its state while a checkpointed job is pending its restart:
    `gpucr-hpc restore JOBID` submits it again (a new id) and the new job
    restores the checkpoint and counts on, each value once."""
    steps = 300
    log = workdir / "count.txt"
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, steps), "--gpucr=on", "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 20, what="the counter to start")
    gpucr(slurm_cluster, "checkpoint", jobid)
    slurm_cluster.run("scancel", jobid)
    slurm_cluster.wait_state(jobid, {"CANCELLED"})
    wait_for(lambda: not _counting(log), what="the counter to stop")

    forget_all_jobs(slurm_cluster, workdir)
    r = gpucr(slurm_cluster, "restore", jobid, "--json")
    new_id = json.loads(r.stdout)["resubmitted_as"]
    info = slurm_cluster.wait_state(new_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", (text, info, slurm_cluster.restore_log(new_id))
    assert text.count("start restart=0") == 1 and text.count("after python") == 1, text
    assert_counted_once(log, steps)


def test_two_node_job_slurm_forgot_is_brought_back_with_its_ranks(slurm_cluster, workdir):
    """The same with 4 ranks under srun on 2 nodes: the new job restores the script
    and the step's ranks; every rank counts once and the script goes on after srun once."""
    from test_job_cr import four_ranks_script

    steps = 150
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(four_ranks_script(workdir, steps), "--gpucr=on", "-N2",
                                 "--ntasks-per-node=2", "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    ranks = [workdir / f"rank-{r}.txt" for r in range(4)]
    wait_for(lambda: all(len(numbers(p)) > 10 for p in ranks), what="all ranks to count")
    gpucr(slurm_cluster, "checkpoint", jobid)
    slurm_cluster.run("scancel", jobid)
    slurm_cluster.wait_state(jobid, {"CANCELLED"})
    wait_for(lambda: not any(_counting(p) for p in ranks), what="the ranks to stop")

    forget_all_jobs(slurm_cluster, workdir)
    new_id = json.loads(gpucr(slurm_cluster, "restore", jobid, "--json").stdout)["resubmitted_as"]
    info = slurm_cluster.wait_state(new_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", (text, info, slurm_cluster.restore_log(new_id))
    for p in ranks:
        assert_counted_once(p, steps)
    assert text.count("start restart=") == 1 and text.count("after srun rc=0") == 1, text
