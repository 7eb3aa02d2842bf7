"""A job's whole life: preempted, requeued and restored again and again, suspended
and resumed, and still counting every step exactly once.

Real Slurm, real CRIU. The long runs carry the `soak` marker.
"""

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
    gpucr,
    numbers,
    suspended_then_resumed,
    wait_for,
)

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}


def nodes_of(cluster, jobid: str) -> set[str]:
    info = cluster.job(jobid)
    return set(cluster.run("scontrol", "show", "hostnames", info["NodeList"]).stdout.split())


def detail(cluster, jobid: str, out):
    return lambda: (f"job: {cluster.job(jobid)}\noutput:\n"
                    f"{out.read_text() if out.exists() else '(none)'}\n"
                    f"restore.log:\n{cluster.restore_log(jobid)}")


def preempt_and_wait_restored(cluster, jobid: str, restarts: int, logs, out) -> None:
    """One cycle: preempt, wait for run `restarts` to be restored and counting on."""
    gpucr(cluster, "preempt", jobid)
    wait_for(lambda: cluster.job(jobid).get("Restarts") == str(restarts)
             and cluster.job(jobid).get("JobState") == "RUNNING",
             timeout=120, what=f"restart {restarts}", detail=detail(cluster, jobid, out))
    counts = [len(numbers(p)) for p in logs]
    wait_for(lambda: all(len(numbers(p)) > n + 3 for p, n in zip(logs, counts)),
             timeout=90, what=f"the ranks to count on after restart {restarts}",
             detail=detail(cluster, jobid, out))


def test_restored_job_is_checkpointed_preempted_and_restored_again(slurm_cluster, workdir):
    """After a restore the job is a job like any other: checkpointed in place (it runs
    on), preempted and restored, three times over; every step counted once."""
    steps = 1200
    log = workdir / "count.txt"
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, steps), "--gpucr=on", "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
    try:
        for cycle in range(1, 4):
            preempt_and_wait_restored(slurm_cluster, jobid, cycle, [log], out)
            ck = gpucr(slurm_cluster, "checkpoint", jobid, check=False)
            assert ck.returncode == 0, (cycle, ck.stderr, slurm_cluster.restore_log(jobid))
        info = slurm_cluster.wait_state(jobid, FINAL, timeout=180)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
    assert info["JobState"] == "COMPLETED", detail(slurm_cluster, jobid, out)()
    assert_counted_once(log, steps)
    assert out.read_text().count("start restart=0") == 1


def two_node_job(cluster, workdir, steps: int):
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
echo "start restart=${{SLURM_RESTART_COUNT:-0}}"
srun --ntasks=4 --ntasks-per-node=2 \
bash -c 'exec {sys.executable} {workdir}/counter.py {workdir}/rank-$SLURM_PROCID.txt {steps}'
echo "after srun rc=$?"
""")
    out = workdir / "job.out"
    jobid = cluster.sbatch(script, "--gpucr=on", "-N2", "--ntasks-per-node=2", "-o", str(out))
    cluster.wait_state(jobid, "RUNNING")
    logs = [workdir / f"rank-{r}.txt" for r in range(4)]
    wait_for(lambda: all(len(numbers(p)) > 10 for p in logs), what="all ranks to count")
    return jobid, logs, out


def finished_once(cluster, jobid, logs, out, steps, restarts):
    info = cluster.wait_state(jobid, FINAL, timeout=600)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", detail(cluster, jobid, out)()
    assert info["Restarts"] == str(restarts), info
    for p in logs:
        assert_counted_once(p, steps)
    assert text.count("start restart=") == 1, text
    assert text.count("after srun rc=0") == 1, text


def preemptions_and_suspends(slurm_cluster, workdir, cycles: int, steps: int) -> None:
    """2 nodes x 2 ranks through `cycles` preempt -> requeue -> restore cycles (every
    other cycle one of the job's nodes is drained, so the job moves), and after each
    restore suspended and resumed twice (gpucr-hpc, then scontrol); it ends
    COMPLETED with every rank counted once."""
    jobid, logs, out = two_node_job(slurm_cluster, workdir, steps)
    drained = None
    try:
        for cycle in range(1, cycles + 1):
            if cycle % 2 == 0:
                drained = sorted(nodes_of(slurm_cluster, jobid))[0]
                slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN",
                                  "Reason=gpucr-test")
            before = nodes_of(slurm_cluster, jobid)
            preempt_and_wait_restored(slurm_cluster, jobid, cycle, logs, out)
            if drained:
                assert drained not in nodes_of(slurm_cluster, jobid), (cycle, before)
                slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME")
                drained = None
            gpucr(slurm_cluster, "suspend", jobid)
            suspended_then_resumed(slurm_cluster, jobid, logs, lambda: gpucr(slurm_cluster, "resume", jobid))
            slurm_cluster.run("scontrol", "suspend", jobid)
            suspended_then_resumed(slurm_cluster, jobid, logs,
                                   lambda: slurm_cluster.run("scontrol", "resume", jobid))
        finished_once(slurm_cluster, jobid, logs, out, steps, cycles)
    finally:
        if drained:
            slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
        slurm_cluster.run("scancel", jobid, check=False)


def test_two_node_job_through_three_preemptions_and_six_suspends(slurm_cluster, workdir):
    """In every run: a restored job preempted again, once after moving off a drained
    node, suspended and resumed both ways after each restore."""
    preemptions_and_suspends(slurm_cluster, workdir, cycles=3, steps=2000)


@pytest.mark.soak
def test_two_node_job_through_ten_preemptions_and_twenty_suspends(slurm_cluster, workdir):
    """The soak (scripts/run-tests -m soak): ten cycles, the job moving every other one."""
    preemptions_and_suspends(slurm_cluster, workdir, cycles=10, steps=5000)


@pytest.mark.soak
def test_two_node_job_through_twenty_suspends(slurm_cluster, workdir):
    """10 suspend/resume cycles with gpucr-hpc and 10 with scontrol: the job keeps
    running and counts every step once."""
    steps = 2500
    jobid, logs, out = two_node_job(slurm_cluster, workdir, steps)
    try:
        for cycle in range(20):
            if cycle % 2 == 0:
                gpucr(slurm_cluster, "suspend", jobid)
                suspended_then_resumed(slurm_cluster, jobid, logs,
                                       lambda: gpucr(slurm_cluster, "resume", jobid))
            else:
                slurm_cluster.run("scontrol", "suspend", jobid)
                suspended_then_resumed(slurm_cluster, jobid, logs,
                                       lambda: slurm_cluster.run("scontrol", "resume", jobid))
        finished_once(slurm_cluster, jobid, logs, out, steps, 0)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def job_processes(jobid: str, marker: str) -> list[int]:
    """PIDs of live processes whose environment says job `jobid` and whose command
    line names `marker`."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{d}/cmdline", "rb").read()
            state = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"SLURM_JOB_ID={jobid}".encode() in env and marker.encode() in cmd and state != "Z":
            found.append(int(d))
    return found


def supervisor_of(jobid: str) -> int:
    pids = [p for p in job_processes(jobid, "gpucr-hpc")
            if b"GPUCR_BATCH_SUPERVISE=1" in open(f"/proc/{p}/environ", "rb").read().split(b"\0")]
    assert len(pids) == 1, pids
    return pids[0]


def test_restored_job_whose_supervisor_dies_leaves_nothing_running(slurm_cluster, workdir):
    """The batch step of a restored 2-node job dies unexpectedly: Slurm ends the job,
    and none of its restored processes (the script's tree, the ranks) runs on outside it."""
    jobid, logs, out = two_node_job(slurm_cluster, workdir, 100000)
    try:
        preempt_and_wait_restored(slurm_cluster, jobid, 1, logs, out)
        assert job_processes(jobid, "counter.py"), "no restored rank found"
        os.kill(supervisor_of(jobid), 9)
        slurm_cluster.wait_state(jobid, FINAL | {"PENDING"}, timeout=120)
        # counter.py: the ranks and the srun wrapper of the script's tree; slurm_script: the script
        left = lambda: job_processes(jobid, "counter.py") + job_processes(jobid, "slurm_script")  # noqa: E731
        wait_for(lambda: not left(), timeout=60, what="the job's processes to end",
                 detail=lambda: f"left running: {left()}")
        counts = [len(numbers(p)) for p in logs]
        time.sleep(1)
        assert [len(numbers(p)) for p in logs] == counts, "a rank still writes"
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_checkpoint_while_the_ranks_are_restored_waits_for_all_of_them(slurm_cluster, workdir):
    """Right after a requeued job starts, its script's tree is back before its ranks
    are: a checkpoint then must not commit a generation without them. Checkpoints
    are tried from the moment the job runs again; the first to commit has every unit."""
    jobid, logs, out = two_node_job(slurm_cluster, workdir, 100000)
    try:
        gpucr(slurm_cluster, "preempt", jobid)
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1"
                 and slurm_cluster.job(jobid).get("JobState") == "RUNNING",
                 timeout=120, what="the restart", detail=detail(slurm_cluster, jobid, out))
        tries = []
        while True:
            r = gpucr(slurm_cluster, "checkpoint", jobid, "--json", check=False)
            tries.append(r.stderr.strip())
            if r.returncode == 0:
                break
            assert len(tries) < 120, tries[-3:]
            time.sleep(0.2)
        import json
        assert sorted(json.loads(r.stdout)["units"]) == [
            "batch", "rank-0.0", "rank-0.1", "rank-0.2", "rank-0.3"], (r.stdout, tries)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_checkpoint_never_takes_the_supervisor_for_the_script(slurm_cluster, workdir):
    """The task registry names the batch supervisor (as the plugin records it before the
    supervisor records the script it runs or restored): a checkpoint then is refused
    with one line, the job runs on, and nothing is committed. Seen once on a GPU job
    after a restore: the supervisor's image was committed in place of the job's tree."""
    log = workdir / "count.txt"
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, 100000), "--gpucr=on", "-o", str(out))
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
        node = slurm_cluster.job(jobid)["NodeList"]
        record = slurm_cluster.state / "run" / node / jobid / "tasks" / "batch.0"
        if not record.exists():  # nodes without mount namespaces keep per-node run dirs
            record = next(slurm_cluster.state.glob(f"**/run/**/{jobid}/tasks/batch.0"))
        kept = record.read_text()
        record.write_text(kept.replace(kept.split()[0], f"pid={supervisor_of(jobid)}"))
        r = gpucr(slurm_cluster, "checkpoint", jobid, check=False)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "not recorded yet" in r.stderr, r.stderr
        assert not list((slurm_cluster.state / "images" / jobid).glob("gen-*/COMMITTED"))
        n = len(numbers(log))
        wait_for(lambda: len(numbers(log)) > n + 5, what="the job to run on")
        record.write_text(kept)
        gpucr(slurm_cluster, "checkpoint", jobid)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_a_job_requeued_right_after_each_restore_is_held_not_looped(slurm_cluster, workdir):
    """Checkpointed once, then requeued three times without a newer checkpoint (as
    a job that dies at the same point would be): each start restores gen-1, and
    the fourth is held with the reason (GPUCR_RESTORE_CAP, 3). gpucr-hpc restore
    starts the count again, and the job runs to its end, every step once."""
    steps = 500
    log, out = workdir / "count.txt", workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, steps), "--gpucr=on", "-o", str(out))
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 10, what="the job to count")
        gpucr(slurm_cluster, "checkpoint", jobid)
        for n in (1, 2, 3):
            slurm_cluster.run("scontrol", "requeue", jobid)
            wait_for(lambda n=n: slurm_cluster.restore_log(jobid).count("restoring job") == n
                     and slurm_cluster.job(jobid).get("JobState") == "RUNNING", timeout=120,
                     what=f"restore {n}", detail=detail(slurm_cluster, jobid, out))
        slurm_cluster.run("scontrol", "requeue", jobid)
        wait_for(lambda: "restored 3 times in a row" in slurm_cluster.restore_log(jobid)
                 and slurm_cluster.job(jobid).get("JobState") == "PENDING", timeout=120,
                 what="the fourth start to be held", detail=detail(slurm_cluster, jobid, out))
        shown = slurm_cluster.run("scontrol", "show", "job", jobid).stdout
        assert "gen-1 restored again and again" in shown, shown
        assert slurm_cluster.restore_log(jobid).count("restoring job") == 3
        r = gpucr(slurm_cluster, "restore", jobid)
        assert "restoring from gen-1" in r.stdout, r.stdout
        info = slurm_cluster.wait_state(jobid, FINAL, timeout=180)
        assert info["JobState"] == "COMPLETED", detail(slurm_cluster, jobid, out)()
        assert out.read_text().count("after python") == 1
        assert_counted_once(log, steps)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
