"""Jobs of ordinary users, as on every real cluster: the whole checkpoint -> requeue
-> restore flow runs as the job's user (CRIU through the root helper), and another
user can neither checkpoint, restore, signal nor read that job or its images.
"""

import json
import sys
from pathlib import Path

import pytest
from job_helpers import assert_counted_once, finished_after_one_restart, numbers, wait_for
from user_helpers import as_user, gpucr_as

pytestmark = [pytest.mark.slurm, pytest.mark.criu]




def submit_as(cluster, user, script: Path, *args) -> str:
    """Pinned to one node where the test cluster's nodes have per-node run and spool
    dirs (%n, no mounts on this machine): an ordinary user's job restored on another
    node cannot recreate the old node's (one line and a held job, see batch_restore)."""
    pin = () if cluster.node_local else ("-w", "n1")
    r = as_user(user, "sbatch", "--parsable", *pin, *args, str(script), env=cluster.env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def counting_job(d: Path, steps: int) -> tuple[Path, Path]:
    log = d / "count.txt"
    script = d / "job.sh"
    script.write_text(f"""#!/bin/bash
echo "start restart=${{SLURM_RESTART_COUNT:-0}} uid=$(id -u)"
{sys.executable} {d}/counter.py {log} {steps}
echo "after python"
""")
    return script, log


def test_ordinary_users_job_is_checkpointed_requeued_and_restored(slurm_cluster, users, jobdir):
    a, b = users
    steps = 400  # 20 s: the refusals and a first checkpoint come before the preempt
    script, log = counting_job(jobdir, steps)
    out = jobdir / "job.out"
    env = slurm_cluster.env
    jobid = submit_as(slurm_cluster, a, script, "--gpucr=on", "-o", str(out))
    first_node = slurm_cluster.wait_state(jobid, "RUNNING")["NodeList"]
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")

    # Another user: no checkpoint, no restore, no signal, no look at its images.
    for args in (("checkpoint", jobid), ("preempt", jobid), ("suspend", jobid), ("restore", jobid),
                 ("status", jobid)):
        r = gpucr_as(b, *args, env=env)
        assert r.returncode != 0, (args, r.stdout)
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    sig = as_user(b, "scancel", "--signal=USR1", jobid, env=env)
    assert sig.returncode != 0
    assert slurm_cluster.job(jobid)["JobState"] == "RUNNING"

    ck = gpucr_as(a, "checkpoint", jobid, env=env)
    assert ck.returncode == 0, ck.stderr
    images = Path(slurm_cluster.state) / "images" / jobid
    assert images.stat().st_uid == a.pw_uid and images.stat().st_mode & 0o077 == 0
    assert as_user(b, "ls", str(images), env=env).returncode != 0
    for args in (("status", jobid), ("ls", jobid)):
        r = gpucr_as(b, *args, env=env)
        assert r.returncode != 0 and "only the job's owner or root" in r.stderr, (args, r.stderr)
    assert jobid not in gpucr_as(b, "ls", "--json", env=env).stdout

    # Its node kept busy: the job is restored on another node, where its spool and
    # run dirs are that node's own (the test cluster gives every node one path).
    moves = slurm_cluster.node_local
    if moves:
        slurm_cluster.run("scontrol", "update", f"NodeName={first_node}", "State=DRAIN", "Reason=gpucr-test")
    try:
        pre = gpucr_as(a, "preempt", jobid, env=env)
        assert pre.returncode == 0, pre.stderr
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", what="the requeue")
        second_node = slurm_cluster.wait_state(jobid, "RUNNING", timeout=120)["NodeList"]
        assert (second_node != first_node) == moves, (first_node, second_node)
        text = finished_after_one_restart(slurm_cluster, jobid, out, log, steps)
    finally:
        slurm_cluster.run("scontrol", "update", f"NodeName={first_node}", "State=RESUME", check=False)
    assert f"uid={a.pw_uid}" in text and text.count("after python") == 1, text
    ls = gpucr_as(a, "ls", jobid, "--json", env=env)
    assert ls.returncode == 0 and '"gen-2"' in ls.stdout
    for p in images.rglob("*"):
        assert p.lstat().st_uid == a.pw_uid, p


def test_ordinary_users_job_is_preempted_automatically(slurm_cluster, users, jobdir):
    """Preempted by a higher-priority job of root's: checkpointed within the grace
    time by the job's own supervisor (running as the user), requeued, restored."""
    a = users[0]
    steps = 300
    script, log = counting_job(jobdir, steps)
    out = jobdir / "job.out"
    jobid = submit_as(slurm_cluster, a, script, "--gpucr=on", "-o", str(out))
    info = slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")

    urgent = jobdir.parent / "urgent.sh"
    urgent.write_text("#!/bin/bash\nsleep 3\n")
    slurm_cluster.sbatch(urgent, "-p", "urgent", "-w", info["NodeList"], "--exclusive", "-o", "/dev/null")
    wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", timeout=60,
             what="the preempted job to be requeued")
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", (text, info)
    assert f"gpucr: checkpointing job {jobid} before preemption" in text, text
    assert_counted_once(log, steps)
    ls = json.loads(gpucr_as(a, "ls", jobid, "--json", env=slurm_cluster.env).stdout)["generations"]
    assert ls, "no generation was written"


def test_ordinary_users_job_is_restored_again_and_again(slurm_cluster, users, jobdir):
    """Three preemptions in a row: each restored tree (which the root helper made, in
    a PID namespace of its own) is checkpointed and restored like a fresh one."""
    a = users[0]
    steps = 600
    script, log = counting_job(jobdir, steps)
    out = jobdir / "job.out"
    jobid = submit_as(slurm_cluster, a, script, "--gpucr=on", "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
    for n in (1, 2, 3):
        pre = gpucr_as(a, "preempt", jobid, env=slurm_cluster.env)
        assert pre.returncode == 0, (n, pre.stderr, slurm_cluster.restore_log(jobid))
        wait_for(lambda n=n: slurm_cluster.job(jobid).get("Restarts") == str(n)
                 and slurm_cluster.job(jobid).get("JobState") == "RUNNING", timeout=120,
                 what=f"restore {n}", detail=lambda: (slurm_cluster.job(jobid), slurm_cluster.restore_log(jobid)))
        at = len(numbers(log))
        wait_for(lambda at=at: len(numbers(log)) > at + 5, what=f"counting after restore {n}",
                 detail=lambda: (out.read_text(), slurm_cluster.restore_log(jobid)))
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "3", (text, info)
    assert text.count("after python") == 1, text
    assert_counted_once(log, steps)
