"""Job-level checkpoint -> requeue -> restore on the real test cluster, with real CRIU.

CPU workloads: every piece (plugin, srun wrapper, node agents in an MPI
world, CRIU, the restorer that replaces the requeued script) is the real one.
"""

import json
import os
import sys
import time

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)

from job_helpers import (  # noqa: E402
    assert_counted_once,
    counting_script,
    finished_after_one_restart,
    gpucr,
    numbers,
    plugstack_args,
    wait_for,
)


def test_single_node_job_checkpoint_preempt_restore(slurm_cluster, workdir):
    """A script that runs Python directly: checkpoint (job runs on), preempt, restored, continues."""
    steps = 120
    log = workdir / "count.txt"
    script = counting_script(workdir, log, steps)
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")

    ck = gpucr(slurm_cluster, "checkpoint", jobid)
    assert "checkpointed job" in ck.stdout and "gen-1" in ck.stdout
    n_before = len(numbers(log))
    wait_for(lambda: len(numbers(log)) > n_before + 5, what="the job to keep running")
    assert slurm_cluster.job(jobid)["JobState"] == "RUNNING"

    pre = gpucr(slurm_cluster, "preempt", jobid)
    assert "gen-2" in pre.stdout
    text = finished_after_one_restart(slurm_cluster, jobid, out, log, steps)
    assert text.count("after python") == 1, text

    ls = gpucr(slurm_cluster, "ls", jobid, "--json")
    assert '"gen-2"' in ls.stdout and '"committed": true' in ls.stdout


def test_requeued_gpu_job_is_steered_to_its_gpu_model(slurm_cluster, workdir):
    """plugstack gpu_feature= names the features of GPU models (the test cluster's:
    gpu_nvidia,gpu_fake,gpu_h100): a preempted job that asked for GPUs is requeued
    with those its node has added to its constraint, and restored as before."""
    steps = 200
    log = workdir / "count.txt"
    script = counting_script(workdir, log, steps)
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "--gres=gpu:1", "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
    node = slurm_cluster.job(jobid)["NodeList"]
    have = slurm_cluster.run("scontrol", "show", "node", "-o", node).stdout
    want = [f for f in ("gpu_nvidia", "gpu_fake", "gpu_h100") if f in have.split("AvailableFeatures=")[1].split()[0]]

    pre = gpucr(slurm_cluster, "preempt", jobid, "--json")
    doc = json.loads(pre.stdout)
    assert doc["gpu_steering"] == "&".join(want), pre.stdout
    assert doc["schema"] == "gpucr-hpc.preempt/1" and doc["job"] == jobid, pre.stdout  # once "42 "
    assert slurm_cluster.job(jobid)["Features"] == "&".join(want)
    finished_after_one_restart(slurm_cluster, jobid, out, log, steps)


def test_checkpoint_of_a_job_not_running_is_refused(slurm_cluster, workdir):
    script = workdir / "quick.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-o", str(workdir / "q.out"))
    slurm_cluster.wait_state(jobid, "COMPLETED")
    r = gpucr(slurm_cluster, "checkpoint", jobid, check=False)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        f"gpucr-hpc: error: job {jobid} is COMPLETED, not RUNNING; only a running job can be checkpointed"]


def test_bad_job_id_is_one_line(slurm_cluster):
    r = gpucr(slurm_cluster, "checkpoint", "12x", check=False)
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1
    assert "'12x' is not a job id" in r.stderr


def four_ranks_script(workdir, steps: int, shown: str = ""):
    """A batch script: a line (with `shown` expanded), 4 counting ranks under srun
    on 2 nodes, a line after srun."""
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
echo "start restart=${{SLURM_RESTART_COUNT:-0}}{shown}"
srun --ntasks=4 --ntasks-per-node=2 \
bash -c 'exec {sys.executable} {workdir}/counter.py {workdir}/rank-$SLURM_PROCID.txt {steps}'
echo "after srun rc=$?"
""")
    return script


def test_two_nodes_two_tasks_requeued_onto_other_nodes(slurm_cluster, workdir):
    """2 nodes x 2 tasks under srun, a command after srun; preempted, requeued onto a
    different node set, restored: every rank continues, the command after srun runs once."""
    steps = 150
    script = four_ranks_script(workdir, steps)
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N2", "--ntasks-per-node=2", "-o", str(out))
    info = slurm_cluster.wait_state(jobid, "RUNNING")
    first_nodes = set(slurm_cluster.run("scontrol", "show", "hostnames",
                                        info["NodeList"]).stdout.split())
    ranks = [workdir / f"rank-{r}.txt" for r in range(4)]
    wait_for(lambda: all(len(numbers(p)) > 10 for p in ranks), what="all ranks to count")

    # Keep one of the job's nodes busy: the restarted job must land elsewhere.
    drained = sorted(first_nodes)[0]
    slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN",
                      "Reason=gpucr-test")
    try:
        pre = gpucr(slurm_cluster, "preempt", jobid)
        assert "4 unit(s)" in pre.stdout or "5 unit(s)" in pre.stdout, pre.stdout
        # The restarted run, not the old one still being torn down.
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", what="the requeue")
        info = slurm_cluster.wait_state(jobid, "RUNNING", timeout=120)
        second_nodes = set(slurm_cluster.run("scontrol", "show", "hostnames",
                                             info["NodeList"]).stdout.split())
        assert second_nodes != first_nodes and drained not in second_nodes
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    finally:
        slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", (text, info)
    for p in ranks:
        assert_counted_once(p, steps)
    assert text.count("start restart=") == 1, text
    assert text.count("after srun rc=0") == 1, text


@pytest.fixture
def site_fast_path(slurm_cluster):
    """plugstack copy_helper=on arena_prealloc=auto, as a GPU site would set them."""
    with plugstack_args(slurm_cluster, "copy_helper=on arena_prealloc=auto"):
        yield


def test_site_fast_path_leaves_cpu_ranks_as_they_were(slurm_cluster, workdir, site_fast_path):
    """With the site's fast path on, every process of the job runs the shim's
    arena thread (it waits for CUDA, which these never use): 2 nodes x 2 ranks
    under srun are checkpointed, preempted, requeued and restored with it, count
    once, and no copy helper is started for them."""
    steps = 150
    script = four_ranks_script(workdir, steps, " helper=$GPUCR_COPY_HELPER arena=$GPUCR_ARENA_PREALLOC")
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N2", "--ntasks-per-node=2", "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    ranks = [workdir / f"rank-{r}.txt" for r in range(4)]
    wait_for(lambda: all(len(numbers(p)) > 10 for p in ranks), what="all ranks to count")
    gpucr(slurm_cluster, "checkpoint", jobid)
    gpucr(slurm_cluster, "preempt", jobid)
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (text, info)
    for p in ranks:
        assert_counted_once(p, steps)
    assert text.count("start restart=") == 1 and text.count("after srun rc=0") == 1, text
    assert "copy-helper.sock arena=auto" in text, text  # the settings reached the job
    assert "copy helper" not in text.replace("copy-helper.sock", ""), text

def test_preempted_by_higher_priority_job_is_checkpointed_automatically(slurm_cluster, workdir):
    """No gpucr-hpc command at all: Slurm preempts the job for an urgent one. Its warning
    signal (PreemptParameters / SlurmctldParameters=preempt_send_user_signal) makes the
    batch supervisor checkpoint and requeue it within the grace time; it runs again
    and goes on from the checkpoint, with the user's script unchanged."""
    steps = 200
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
echo "start restart=${{SLURM_RESTART_COUNT:-0}}"
srun --ntasks=2 bash -c 'exec {sys.executable} {workdir}/counter.py {workdir}/rank-$SLURM_PROCID.txt {steps}'
echo "after srun rc=$?"
""")
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N1", "--ntasks=2", "-o", str(out))
    info = slurm_cluster.wait_state(jobid, "RUNNING")
    ranks = [workdir / f"rank-{r}.txt" for r in range(2)]
    wait_for(lambda: all(len(numbers(p)) > 10 for p in ranks), what="both ranks to count")

    urgent_sh = workdir / "urgent.sh"
    urgent_sh.write_text("#!/bin/bash\nsleep 3\necho urgent done\n")
    urgent = slurm_cluster.sbatch(urgent_sh, "-p", "urgent", "-w", info["NodeList"],
                                  "--exclusive", "-o", str(workdir / "urgent.out"))
    wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", timeout=60,
             what="the preempted job to be requeued")
    slurm_cluster.wait_state(urgent, "COMPLETED", timeout=120)
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", (text, info)
    assert f"gpucr: checkpointing job {jobid} before preemption" in text, text
    for p in ranks:
        assert_counted_once(p, steps)
    assert text.count("start restart=") == 1, text
    assert text.count("after srun rc=0") == 1, text
    assert "urgent done" in (workdir / "urgent.out").read_text()


@pytest.fixture
def short_lead(slurm_cluster):
    """A 50 s checkpoint lead (plugstack signal=USR2@50), so a 2-minute job gets warned."""
    with plugstack_args(slurm_cluster, "signal=USR2@50"):
        yield


def test_job_near_its_time_limit_is_checkpointed_and_goes_on(slurm_cluster, workdir, short_lead):
    """A 2-minute job whose work takes longer: warned before its time limit, it
    checkpoints and requeues itself, and finishes its count in the next run(s)."""
    steps = 1800  # 90 s of counting
    log = workdir / "count.txt"
    script = counting_script(workdir, log, steps)
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "--time=2", "-o", str(out))
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"},
                                    timeout=400)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", (text, info)
    assert int(info["Restarts"]) >= 1, info
    assert f"gpucr: checkpointing job {jobid} before the time limit" in text, text
    assert_counted_once(log, steps)
    assert text.count("start restart=") == 1 and text.count("after python") == 1, text


def test_time_limit_shorter_than_twice_the_lead_is_not_checkpointed(slurm_cluster, workdir,
                                                                   short_lead):
    """A 1-minute job with a 50 s lead would be warned at every start and requeue
    forever: it says so and runs on to its end instead."""
    log = workdir / "count.txt"
    script = workdir / "job.sh"
    script.write_text(f"#!/bin/bash\n{sys.executable} {workdir}/counter.py {log} 900\n")
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "--time=1", "-o", str(out))
    wait_for(lambda: "requeue forever" in (out.read_text() if out.exists() else ""),
             timeout=90, what="the supervisor to decline the checkpoint")
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"},
                                    timeout=120)
    text = out.read_text()
    assert info["Restarts"] == "0" and "checkpointing job" not in text, (text, info)
    assert len([ln for ln in text.splitlines() if ln.startswith("gpucr:")]) == 1, text
    assert_counted_once(log, 900)


def test_suspend_and_resume(slurm_cluster, workdir):
    """gpucr-hpc suspend: GPU state in place (none here), then scontrol suspend: the
    ranks stop; resume: they go on. A second resume only retries the GPU part."""
    steps = 200
    log = workdir / "count.txt"
    script = workdir / "job.sh"
    script.write_text(f"#!/bin/bash\n{sys.executable} {workdir}/counter.py {log} {steps}\n")
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-o", str(workdir / "job.out"))
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
    r = gpucr(slurm_cluster, "suspend", jobid)
    assert f"suspended job {jobid}" in r.stdout and "no GPU process" in r.stdout, r.stdout
    assert slurm_cluster.job(jobid)["JobState"] == "SUSPENDED"
    n = len(numbers(log))
    time.sleep(2)
    assert len(numbers(log)) == n, "the job ran on while suspended"
    again = gpucr(slurm_cluster, "suspend", jobid, check=False)
    assert again.returncode != 0 and "not RUNNING" in again.stderr
    gpucr(slurm_cluster, "resume", jobid)
    wait_for(lambda: len(numbers(log)) > n + 5, what="the job to go on")
    st = gpucr(slurm_cluster, "resume", jobid, "--json")
    assert '"ok": true' in st.stdout
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
    assert info["JobState"] == "COMPLETED", info
    assert_counted_once(log, steps)


def test_status_of_a_job(slurm_cluster, workdir):
    """status JOBID: Slurm's view and the image store's, as a table or JSON."""
    import json

    log = workdir / "count.txt"
    script = workdir / "job.sh"
    script.write_text(f"#!/bin/bash\n{sys.executable} {workdir}/counter.py {log} 100000\n")
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-o", str(workdir / "job.out"))
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 5, what="the counter to start")
        before = json.loads(gpucr(slurm_cluster, "status", jobid, "--json").stdout)
        assert before["state"] == "RUNNING" and before["generations"] == [] and before["latest"] is None
        gpucr(slurm_cluster, "checkpoint", jobid)
        st = json.loads(gpucr(slurm_cluster, "status", jobid, "--json").stdout)
        assert st["latest"] == "gen-1" and st["generations"][0]["committed"] is True
        assert st["generations"][0]["bytes"] > 0 and st["nodes"] == st["generations"][0]["nodes"]
        table = gpucr(slurm_cluster, "status", jobid).stdout
        assert "gen-1" in table and "RUNNING" in table and "committed" in table
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
    bad = gpucr(slurm_cluster, "status", "../etc", check=False)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        "gpucr-hpc: error: '../etc' is not a job id; give a job id (1234), an array task (1234_5) "
        "or a heterogeneous job's component (1234+0)"]


def test_signal_to_the_batch_step_reaches_the_restored_script(slurm_cluster, workdir):
    """After a restore, `scancel --batch --signal` is passed on to the restored script
    itself (not to the init of its PID namespace), and its trap runs."""
    steps = 200
    log = workdir / "count.txt"
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
trap 'echo "got USR1"' USR1
{sys.executable} {workdir}/counter.py {log} {steps}
echo "after python"
""")
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
    gpucr(slurm_cluster, "preempt", jobid)
    wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", what="the requeue")
    slurm_cluster.wait_state(jobid, "RUNNING", timeout=60)
    wait_for(lambda: "restored" in (slurm_cluster.state / "images" / jobid / "restore.log").read_text(),
             what="the restore")
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", jobid)
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", (text, info)
    assert text.count("got USR1") == 1 and text.count("after python") == 1, text
    assert_counted_once(log, steps)
