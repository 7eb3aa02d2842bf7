"""Two storage tiers on the real test cluster: with plugstack.conf stage= a
preemption writes the job's units into node memory, the job ends and its node
is free before anything reaches the image root; the job epilog starts the
drain, which makes the generation durable; the restarted job waits for that
and goes on exactly where it stopped: with two nodes and the job moved to
others, it reads what the drains wrote; back on the nodes that staged it
before the drains are done, it reads their memory (twice in a row)."""

import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)

from job_helpers import (  # noqa: E402
    assert_counted_once,
    counting_script,
    drain_cli,
    gpucr,
    node_memory_stage,
    numbers,
    output_of,
    plugstack_args,
    wait_for,
)


@pytest.fixture
def stage(slurm_cluster):
    """A staging tier in each node's own folder, made by the admin like /dev/shm."""
    with node_memory_stage(slurm_cluster) as root:
        yield root


def staged_units(stage: Path, jobid: str) -> list[str]:
    return sorted(str(p.relative_to(stage)) for p in stage.glob(f"*/{jobid}/gen-*/*") if p.is_dir())


def test_a_preempted_job_is_staged_in_node_memory_drained_and_restored(slurm_cluster, workdir, stage):
    steps = 200
    log = workdir / "count.txt"
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, steps), "--gpucr=on", "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
    job_dir = slurm_cluster.state / "images" / jobid

    pre = gpucr(slurm_cluster, "preempt", jobid, "--json")
    result = json.loads(pre.stdout)
    assert result["committed"] and result["generation"] == "gen-1", result
    manifest = json.loads((job_dir / "gen-1" / "manifest.json").read_text())
    assert all(u.get("staged") for u in manifest["units"].values()), manifest["units"]

    drained(slurm_cluster, stage, jobid, "gen-1")
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
    text = output_of(out)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (text, slurm_cluster.restore_log(jobid))
    assert_counted_once(log, steps)
    assert text.count("after python") == 1, text
    story = slurm_cluster.restore_log(jobid)
    assert "drained from" in story and "restoring job" in story, story
    status = json.loads(gpucr(slurm_cluster, "status", jobid, "--json").stdout)
    assert [g["generation"] for g in status["generations"] if g["committed"]] == ["gen-1"], status
    assert any(ev.get("what") == "drain" and ev.get("ok") for ev in status["story"]), status["story"]


def test_a_two_node_job_staged_on_both_nodes_moves_to_other_nodes(slurm_cluster, workdir, stage):
    steps = 200
    script, ranks = two_rank_job(workdir, steps)
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N2", "--ntasks-per-node=1", "-o", str(out))
    info = slurm_cluster.wait_state(jobid, "RUNNING")
    first = set(slurm_cluster.run("scontrol", "show", "hostnames", info["NodeList"]).stdout.split())
    wait_for(lambda: all(len(numbers(p)) > 10 for p in ranks), what="both ranks to count")
    drained = sorted(first)[0]
    slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=gpucr-test")
    try:
        gpucr(slurm_cluster, "preempt", jobid)
        job_dir = slurm_cluster.state / "images" / jobid
        manifest = json.loads((job_dir / "gen-1" / "manifest.json").read_text())
        assert {u["node"] for u in manifest["units"].values() if u.get("staged")} == first, manifest["units"]
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", what="the requeue")
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        second = set(slurm_cluster.run("scontrol", "show", "hostnames", info["NodeList"]).stdout.split())
    finally:
        slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
    text = output_of(out)
    assert info["JobState"] == "COMPLETED", (text, slurm_cluster.restore_log(jobid))
    assert drained not in second
    for p in ranks:
        assert_counted_once(p, steps)
    assert text.count("after srun rc=0") == 1, text
    assert sorted((job_dir / "gen-1" / "drained").iterdir()) and not staged_units(stage, jobid)


def test_a_job_back_on_the_node_that_staged_it_reads_node_memory_preempted_twice(slurm_cluster, workdir, stage):
    """The drain comes late here (as behind a slow image root): the job, pinned to
    its node, starts again before its generation is durable and reads it from that
    node's memory; the drain then commits it all the same, and a second preemption
    of the restored job goes the same way."""
    cli = drain_cli(slurm_cluster, "gpucr-late-drain", "sleep 20")
    steps = 500
    log = workdir / "count.txt"
    out = workdir / "job.out"
    with plugstack_args(slurm_cluster, f"cli={cli}"):
        jobid = slurm_cluster.sbatch(counting_script(workdir, log, steps), "--gpucr=on", "-w", "n1",
                                     "-o", str(out))
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
        job_dir = slurm_cluster.state / "images" / jobid
        for n in (1, 2):
            gen = job_dir / f"gen-{n}"
            gpucr(slurm_cluster, "preempt", jobid)
            wait_for(lambda n=n: slurm_cluster.job(jobid).get("Restarts") == str(n)
                     and slurm_cluster.job(jobid).get("JobState") == "RUNNING", timeout=120, what=f"restart {n}")
            at = len(numbers(log))
            wait_for(lambda at=at: len(numbers(log)) > at + 5, timeout=120, what=f"counting after restart {n}",
                     detail=lambda: (output_of(out), slurm_cluster.restore_log(jobid)))
            story = slurm_cluster.restore_log(jobid)
            assert f"batch of gen-{n} read from node memory on n1" in story, story
            drained(slurm_cluster, stage, jobid, gen.name)
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
    text = output_of(out)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", (text, slurm_cluster.restore_log(jobid))
    assert_counted_once(log, steps)
    assert text.count("after python") == 1, text
    status = json.loads(gpucr(slurm_cluster, "status", jobid, "--json").stdout)
    assert [g["generation"] for g in status["generations"] if g["committed"]] == ["gen-1", "gen-2"], status


def test_a_two_node_job_back_on_its_nodes_reads_each_nodes_memory(slurm_cluster, workdir, stage):
    """Its ranks too: each restored on the node that staged it, from that node's memory."""
    cli = drain_cli(slurm_cluster, "gpucr-late-drain", "sleep 20")
    steps = 300
    script, ranks = two_rank_job(workdir, steps)
    out = workdir / "job.out"
    with plugstack_args(slurm_cluster, f"cli={cli}"):
        jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-w", "n1,n2", "--ntasks-per-node=1", "-o", str(out))
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: all(len(numbers(p)) > 10 for p in ranks), what="both ranks to count")
        gpucr(slurm_cluster, "preempt", jobid)
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
    text = output_of(out)
    story = slurm_cluster.restore_log(jobid)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (text, story)
    for unit, node in (("batch", "n1"), ("rank-0.0", "n1"), ("rank-0.1", "n2")):
        assert f"{unit} of gen-1 read from node memory on {node}" in story, story
    for p in ranks:
        assert_counted_once(p, steps)
    assert text.count("after srun rc=0") == 1, text
    drained(slurm_cluster, stage, jobid, "gen-1")


def test_a_node_lost_before_its_drain_leaves_the_previous_checkpoint_restored(slurm_cluster, workdir, stage):
    """The job's second node goes down with its memory before its drain runs (its
    drain never starts here): the restarted job, on other nodes, waits for the
    drain, sees from Slurm that the node is down and no drain runs for it, and
    restores the previous checkpoint."""
    steps = 300
    script, ranks = two_rank_job(workdir, steps)
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N2", "--ntasks-per-node=1", "-o", str(out))
    info = slurm_cluster.wait_state(jobid, "RUNNING")
    lost = slurm_cluster.run("scontrol", "show", "hostnames", info["NodeList"]).stdout.split()[1]
    cli = drain_cli(slurm_cluster, "gpucr-drain-lost", f'[ "$SLURMD_NODENAME" = {lost} ] && exit 0')
    try:
        with plugstack_args(slurm_cluster, f"cli={cli}"):
            wait_for(lambda: all(len(numbers(p)) > 10 for p in ranks), what="both ranks to count")
            gpucr(slurm_cluster, "checkpoint", jobid)  # gen-1, on the image root
            wait_for(lambda: all(len(numbers(p)) > 40 for p in ranks), what="the ranks to count on")
            slurm_cluster.run("scontrol", "update", f"NodeName={lost}", "State=DRAIN", "Reason=gpucr-test")
            gpucr(slurm_cluster, "preempt", jobid)  # gen-2, staged on both nodes
            # Down once the requeue is through: a node set DOWN while the job still
            # completes on it ends the job (Slurm: FAILED), which is not what is tested.
            wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1"
                     and slurm_cluster.job(jobid).get("JobState") in ("PENDING", "RUNNING"), what="the requeue")
            slurm_cluster.run("scontrol", "update", f"NodeName={lost}", "State=DOWN", "Reason=gpucr-test-lost")
            info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    finally:
        slurm_cluster.run("scontrol", "update", f"NodeName={lost}", "State=RESUME", check=False)
    text = output_of(out)
    story = slurm_cluster.restore_log(jobid)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (text, story)
    assert f"gen-2 was not drained ({lost}: node {lost} is DOWN" in story, story
    assert f"restoring job {jobid} from {slurm_cluster.state / 'images' / jobid / 'gen-1'}" in story, story
    for p in ranks:
        assert_counted_once(p, steps)  # the steps after gen-1 are done again, the files rewound to it
    assert text.count("after srun rc=0") == 1, text
    status = json.loads(gpucr(slurm_cluster, "status", jobid, "--json").stdout)
    gen2 = next(g for g in status["generations"] if g["generation"] == "gen-2")
    assert not gen2["committed"], status


def test_an_ordinary_users_job_is_read_back_from_node_memory(slurm_cluster, users, jobdir, stage):
    """The same as the job's user, CRIU through the root helper: the user's staged
    folder, read under the user's lock, given back by root's drain once read."""
    from user_helpers import as_user, gpucr_as

    a = users[0]
    cli = drain_cli(slurm_cluster, "gpucr-late-drain", "sleep 20")
    steps = 300
    log = jobdir / "count.txt"
    out = jobdir / "job.out"
    script = counting_script(jobdir, log, steps)
    with plugstack_args(slurm_cluster, f"cli={cli}"):
        r = as_user(a, "sbatch", "--parsable", "-w", "n1", "--gpucr=on", "-o", str(out), str(script),
                    env=slurm_cluster.env)
        assert r.returncode == 0, r.stderr
        jobid = r.stdout.strip().split(";")[0]
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
        pre = gpucr_as(a, "preempt", jobid, env=slurm_cluster.env)
        assert pre.returncode == 0, pre.stderr
        assert (stage / "n1" / jobid).stat().st_uid == a.pw_uid, "the staged folder is the user's"
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
    text = output_of(out)
    story = slurm_cluster.restore_log(jobid)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (text, story)
    assert "batch of gen-1 read from node memory on n1" in story, story
    assert_counted_once(log, steps)
    drained(slurm_cluster, stage, jobid, "gen-1")


def drained(cluster, stage: Path, jobid: str, gen: str) -> None:
    """The drains commit the generation, and give node memory back."""
    wait_for(lambda: (cluster.state / "images" / jobid / gen / "COMMITTED").exists(), timeout=120,
             what=f"the drain of {gen}", detail=lambda: cluster.restore_log(jobid))
    wait_for(lambda: not staged_units(stage, jobid), timeout=60, what="node memory to be given back")


def two_rank_job(workdir: Path, steps: int) -> tuple[Path, list[Path]]:
    """A batch script whose srun step runs two counting ranks, one per node; their logs."""
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
srun --ntasks=2 --ntasks-per-node=1 \
bash -c 'exec {sys.executable} {workdir}/counter.py {workdir}/rank-$SLURM_PROCID.txt {steps}'
echo "after srun rc=$?"
""")
    return script, [workdir / f"rank-{r}.txt" for r in range(2)]
