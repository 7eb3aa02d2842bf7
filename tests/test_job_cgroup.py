"""A test cluster that tracks jobs as most sites do, by cgroups (proctrack/cgroup,
cgroup v1 hierarchies): a job restored on another node lives in its new step's
cgroups (so Slurm's freezer suspends it and its limits hold), and the drain of a
staged preemption outlives the job's cgroups.

Its own cluster (GPUCR_TESTCLUSTER_PROCTRACK=cgroup, another state folder and
port), started for this module. Skipped where /sys/fs/cgroup/freezer is no
cgroup v1 hierarchy. Real Slurm, real CRIU.
"""

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)

from conftest import TESTCLUSTER, SlurmCluster  # noqa: E402
from job_helpers import (  # noqa: E402
    assert_counted_once,
    counting_script,
    drain_cli,
    gpucr,
    node_memory_stage,
    numbers,
    suspended_then_resumed,
    wait_for,
)

FREEZER = Path("/sys/fs/cgroup/freezer")


def freezer_v1() -> bool:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if left.split()[4] == str(FREEZER) and right.split()[0] == "cgroup":
            return True
    return False


@pytest.fixture(scope="module")
def cgroup_cluster():
    if not freezer_v1():
        pytest.skip("no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer")
    state = Path(tempfile.mkdtemp(prefix="gpucr-tc-cgroup-"))
    env = dict(os.environ, GPUCR_TESTCLUSTER_DIR=str(state), GPUCR_TESTCLUSTER_PORT="16827",
               GPUCR_TESTCLUSTER_PROCTRACK="cgroup")
    up = subprocess.run([str(TESTCLUSTER), "up"], capture_output=True, text=True, timeout=120, env=env)
    assert up.returncode == 0, f"testcluster up failed: {up.stderr.strip() or up.stdout}"
    cluster = SlurmCluster(Path(up.stdout.strip().splitlines()[-1]))
    try:
        assert "ProctrackType=proctrack/cgroup" in cluster.conf.read_text()
        yield cluster
    finally:
        subprocess.run([str(TESTCLUSTER), "down"], capture_output=True, timeout=120, env=env)


def freezer_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(","):
            return path
    return ""


def counter_pids(log: Path) -> list[int]:
    """The counting processes writing to log (the workload's own argument)."""
    out = subprocess.run(["pgrep", "-f", f"counter.py {log}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def counting_on_a_drained_node(cluster, workdir: Path, log: Path, steps: int) -> tuple[str, str]:
    """A counting --gpucr=on job, counting; its node then drained, so that its next
    start is on another node (the caller sets the node back). Its id and first node."""
    jobid = cluster.sbatch(counting_script(workdir, log, steps), "--gpucr=on", "-o", str(log.with_suffix(".out")))
    cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the job to count")
    first = cluster.job(jobid)["NodeList"]
    cluster.run("scontrol", "update", f"NodeName={first}", "State=DRAIN", "Reason=gpucr-test")
    return jobid, first


def test_a_job_restored_on_another_node_is_in_its_new_steps_cgroup(cgroup_cluster, workdir):
    """CRIU put the restored tree back into the cgroups it had on the old node: Slurm's
    freezer then left it running while the job was SUSPENDED."""
    cluster, steps = cgroup_cluster, 900
    log = workdir / "cg-count.txt"
    jobid, first = counting_on_a_drained_node(cluster, workdir, log, steps)
    try:
        gpucr(cluster, "preempt", jobid)
        wait_for(lambda: cluster.job(jobid).get("Restarts") == "1" and cluster.job(jobid).get("JobState") == "RUNNING",
                 timeout=120, what="the restart", detail=lambda: cluster.restore_log(jobid))
        now = cluster.job(jobid)["NodeList"]
        assert now != first
        n = len(numbers(log))
        wait_for(lambda: len(numbers(log)) > n + 3, timeout=90, what="the restored job to count",
                 detail=lambda: cluster.restore_log(jobid))
        cgroups = {freezer_cgroup(p) for p in counter_pids(log)}
        assert cgroups and all(f"job_{jobid}/" in c and first not in c for c in cgroups), cgroups
        gpucr(cluster, "suspend", jobid)
        suspended_then_resumed(cluster, jobid, [log], lambda: gpucr(cluster, "resume", jobid))
    finally:
        cluster.run("scontrol", "update", f"NodeName={first}", "State=RESUME", check=False)
    info = cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
    assert info["JobState"] == "COMPLETED", cluster.restore_log(jobid)
    assert_counted_once(log, steps)


@pytest.fixture
def late_drain_stage(cgroup_cluster):
    """A staging tier per node, and a drain that starts 8 s late (cli= wrapper): long
    after Slurm has ended what was in the job's cgroups."""
    late = drain_cli(cgroup_cluster, "late-drain", "sleep 8")
    with node_memory_stage(cgroup_cluster, f"cli={late}") as root:
        yield root


def drain_pids(jobid: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"drain {jobid}$"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_the_drain_of_a_staged_preemption_outlives_the_jobs_cgroups(cgroup_cluster, workdir, late_drain_stage):
    cluster, steps = cgroup_cluster, 400
    log = workdir / "cg-drain-count.txt"
    jobid, first = counting_on_a_drained_node(cluster, workdir, log, steps)
    try:
        gpucr(cluster, "preempt", jobid)
        wait_for(lambda: drain_pids(jobid), timeout=60, what="the drain to start")
        assert all(f"job_{jobid}/" not in freezer_cgroup(p) for p in drain_pids(jobid))
        gen = cluster.state / "images" / jobid / "gen-1"
        wait_for(lambda: (gen / "COMMITTED").exists(), timeout=120, what="the drain to commit gen-1",
                 detail=lambda: cluster.restore_log(jobid))
        info = cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    finally:
        cluster.run("scontrol", "update", f"NodeName={first}", "State=RESUME", check=False)
    assert info["JobState"] == "COMPLETED", cluster.restore_log(jobid)
    assert "read from image root" in cluster.restore_log(jobid)
    assert_counted_once(log, steps)
