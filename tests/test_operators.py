"""Root acting on an ordinary user's job: checkpoint, preempt, suspend, resume and
restore, with the node agents running as the job's user (CRIU through the root
helper, so the images stay the user's); and the user's own suspend, which Slurm
reserves to operators, refused in one line that says whom to ask.

The test cluster has no slurmdbd, so Slurm itself knows no operator but root and
SlurmUser (root here). An operator who is not root acts on another user's job
through the operator door (sudo, privileged/operator.py): the site's sudo rule
names who may; here a test rule names the second test user.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from job_helpers import assert_counted_once, gpucr, numbers, wait_for
from user_helpers import as_user, gpucr_as

from gpucr_hpc.cli.operator_door import door_path

pytestmark = [pytest.mark.slurm, pytest.mark.criu]


def users_job(cluster, user, d: Path, steps: int) -> tuple[str, Path, Path]:
    """A --gpucr=on job of `user` counting to `steps`; the script says its uid before
    and after the counter, so a restored script shows whose it is."""
    log, out, script = d / "count.txt", d / "job.out", d / "job.sh"
    script.write_text(f"""#!/bin/bash
echo "start restart=${{SLURM_RESTART_COUNT:-0}} uid=$(id -u)"
{sys.executable} {d}/counter.py {log} {steps}
echo "after python uid=$(id -u)"
""")
    r = as_user(user, "sbatch", "--parsable", "--gpucr=on", "-o", str(out), str(script), env=cluster.env)
    assert r.returncode == 0, r.stderr
    jobid = r.stdout.strip().split(";")[0]
    cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
    return jobid, log, out


def finished_as(cluster, user, jobid: str, out: Path, log: Path, steps: int) -> str:
    info = cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", (text, info, cluster.restore_log(jobid))
    assert_counted_once(log, steps)
    assert text.count("start restart=0") == 1 and "start restart=1" not in text, text
    assert text.count("after python") == 1 and f"after python uid={user.pw_uid}" in text, text
    return text


def owned_by(path: Path, uid: int) -> list[Path]:
    """What under path is NOT owned by uid."""
    return [p for p in [path, *path.rglob("*")] if p.lstat().st_uid != uid]


def test_root_checkpoints_and_preempts_a_users_job(slurm_cluster, users, jobdir):
    a = users[0]
    steps = 300
    jobid, log, out = users_job(slurm_cluster, a, jobdir, steps)
    images = Path(slurm_cluster.state) / "images" / jobid
    try:
        ck = gpucr(slurm_cluster, "checkpoint", jobid, check=False)  # the test runs as root
        assert ck.returncode == 0, ck.stderr
        n = len(numbers(log))
        wait_for(lambda: len(numbers(log)) > n + 5, what="the job to run on after root's checkpoint")
        pre = gpucr(slurm_cluster, "preempt", jobid, check=False)
        assert pre.returncode == 0, pre.stderr
        assert "gen-2" in pre.stdout
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", what="the requeue")
        finished_as(slurm_cluster, a, jobid, out, log, steps)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
    assert owned_by(images, a.pw_uid) == [], "root's checkpoint left files the user does not own"


def test_users_suspend_is_refused_and_roots_suspend_resume_restore_work(slurm_cluster, users, jobdir):
    a = users[0]
    steps = 400
    jobid, log, out = users_job(slurm_cluster, a, jobdir, steps)
    env = slurm_cluster.env
    try:
        # Slurm lets only operators suspend: the owner gets one line saying whom to ask.
        r = gpucr_as(a, "suspend", jobid, env=env)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert "only Slurm operators and administrators may suspend" in lines[0], lines[0]
        assert f"gpucr-hpc suspend {jobid}" in lines[0] and f"gpucr-hpc preempt {jobid}" in lines[0]
        assert slurm_cluster.job(jobid)["JobState"] == "RUNNING"

        s = gpucr(slurm_cluster, "suspend", jobid, check=False)
        assert s.returncode == 0, s.stderr
        assert slurm_cluster.job(jobid)["JobState"] == "SUSPENDED"
        r = gpucr_as(a, "resume", jobid, env=env)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"gpucr-hpc resume {jobid}" in r.stderr
        assert slurm_cluster.job(jobid)["JobState"] == "SUSPENDED"
        s = gpucr(slurm_cluster, "resume", jobid, check=False)
        assert s.returncode == 0, s.stderr
        n = len(numbers(log))
        wait_for(lambda: len(numbers(log)) > n + 5, what="the job to count again after resume")

        # Root checkpoints it, the job ends (scancel), and root restores it: it goes on
        # from the checkpoint as its user.
        assert gpucr(slurm_cluster, "checkpoint", jobid, check=False).returncode == 0
        slurm_cluster.run("scancel", jobid)
        slurm_cluster.wait_state(jobid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=60)
        r = gpucr(slurm_cluster, "restore", jobid, check=False)
        assert r.returncode == 0 and "restoring from gen-1" in r.stdout, r.stderr
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", what="the requeue")
        finished_as(slurm_cluster, a, jobid, out, log, steps)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


@pytest.fixture
def operator(users):
    """The second test user, let through the operator door by a sudo rule of the test's
    (SLURM_CONF kept: the test cluster's config is not where Slurm looks by default)."""
    door = door_path()
    if not os.access(door, os.X_OK):
        pytest.skip(f"the operator door {door} is not installed: make install")
    rule = Path("/etc/sudoers.d/gpucr-test-operator")
    rule.write_text(f'Defaults!{door} env_keep += "SLURM_CONF"\n'
                    f"Defaults!{door} !use_pty\n"
                    f"{users[1].pw_name} ALL=(root) NOPASSWD: {door}\n")
    rule.chmod(0o440)
    assert subprocess.run(["visudo", "-cqf", str(rule)]).returncode == 0
    yield users[1]
    rule.unlink()


def test_an_operator_acts_on_another_users_job_through_the_door(slurm_cluster, users, operator, jobdir):
    a, op = users[0], operator
    steps = 400
    jobid, log, out = users_job(slurm_cluster, a, jobdir, steps)
    env = slurm_cluster.env
    images = Path(slurm_cluster.state) / "images" / jobid
    try:
        r = gpucr_as(op, "checkpoint", jobid, env=env)
        assert r.returncode == 0, r.stderr
        assert "as a Slurm operator" in r.stderr and "checkpointed job" in r.stdout, (r.stdout, r.stderr)
        assert not owned_by(images, a.pw_uid)  # the agents acted as the job's user
        r = gpucr_as(op, "suspend", jobid, env=env)
        assert r.returncode == 0 and slurm_cluster.job(jobid)["JobState"] == "SUSPENDED", r.stderr
        r = gpucr_as(op, "resume", jobid, env=env)
        assert r.returncode == 0 and slurm_cluster.job(jobid)["JobState"] == "RUNNING", r.stderr
        r = gpucr_as(op, "preempt", jobid, env=env)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", what="the requeue")
        # The door runs those commands and nothing else: one line each, exit 2.
        door = door_path()
        for args in (("checkpoint", "--pid", "1"), ("ls",), ("restore", jobid, "--to", "/tmp"),
                     ("checkpoint", f"{jobid};id")):
            r = as_user(op, "sudo", "-n", door, *args, env=env)
            assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        finished_as(slurm_cluster, a, jobid, out, log, steps)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
