"""Faults during job checkpoint and restore, on the real test cluster: nothing is lost.

* a node agent killed in the middle of a checkpoint: aborted, the job runs on;
* the image store full: aborted, the previous generation intact, the job runs on;
* a rank's image missing at restore: the job is held with the reason, the image untouched;
* the generation LATEST names gone at a requeue: held the same way, never run from the top;
* a rank whose restore fails on its node: the same, and the script does not go on past srun;
* a node that fails while the job is restored on it: restored again elsewhere, once;
* a restore step that outlived its restart (its launch crossed a requeue): restores nothing;
* a preempt whose requeue fails: the checkpoint is committed, the job runs on;
* a preempt of a job that cannot be requeued: refused before anything happens;
* a restore asked while the job still completes (held by a requeue): waits, then restores.
"""

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)

from job_helpers import gpucr, numbers, ranks_count_on, wait_for  # noqa: E402

from gpucr_hpc.store.files import tree_digest  # noqa: E402


def start_counting_job(cluster, workdir, ntasks=1, steps=100000, extra=()):
    script = workdir / "job.sh"
    if ntasks == 1:
        body = f"{sys.executable} {workdir}/counter.py {workdir}/rank-0.txt {steps}"
    else:
        body = (f"srun --ntasks={ntasks} bash -c 'exec {sys.executable} {workdir}/counter.py "
                f"{workdir}/rank-$SLURM_PROCID.txt {steps}'")
    script.write_text(f"#!/bin/bash\n{body}\n")
    jobid = cluster.sbatch(script, "--gpucr=on", "-N1", f"--ntasks={ntasks}",
                           "-o", str(workdir / "job.out"), *extra)
    cluster.wait_state(jobid, "RUNNING")
    logs = [workdir / f"rank-{r}.txt" for r in range(ntasks)]
    wait_for(lambda: all(len(numbers(p)) > 10 for p in logs), what="the job to count")
    return jobid, logs


def still_counting(cluster, jobid, logs):
    n = [len(numbers(p)) for p in logs]
    wait_for(lambda: all(len(numbers(p)) > k + 5 for p, k in zip(logs, n)),
             what="the job to keep running")
    assert cluster.job(jobid)["JobState"] == "RUNNING"


def agent_pids(jobid: str) -> list[int]:
    """The node agents of this job's checkpoint: other workers' clusters run agents too."""
    out = subprocess.run(["pgrep", "-f", "gpucr_hpc.job.checkpoint.agent checkpoint"], capture_output=True, text=True)
    mine = []
    for pid in map(int, out.stdout.split()):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={jobid}".encode() in env:
            mine.append(pid)
    return mine


def test_agent_killed_mid_checkpoint_aborts_and_job_runs_on(slurm_cluster, workdir):
    jobid, logs = start_counting_job(slurm_cluster, workdir)
    job_dir = slurm_cluster.state / "images" / jobid
    try:
        ck = subprocess.Popen([sys.executable, "-m", "gpucr_hpc", "checkpoint", jobid],
                              env=slurm_cluster.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        wait_for(lambda: agent_pids(jobid), timeout=30, what="the node agent to start")
        for pid in agent_pids(jobid):
            os.kill(pid, 9)
        _, err = ck.communicate(timeout=120)
        assert ck.returncode != 0
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "aborted" in lines[0] and "left running" in lines[0], err
        assert not (job_dir / "LATEST").exists()
        assert not [p for p in job_dir.glob("gen-*")], list(job_dir.iterdir())
        still_counting(slurm_cluster, jobid, logs)
        # And the next checkpoint works.
        assert "gen-" in gpucr(slurm_cluster, "checkpoint", jobid).stdout
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_preempt_of_a_job_that_cannot_be_requeued_is_refused(slurm_cluster, workdir):
    jobid, logs = start_counting_job(slurm_cluster, workdir, extra=("--no-requeue",))
    try:
        r = gpucr(slurm_cluster, "preempt", jobid, check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert "cannot be requeued" in lines[0] and f"gpucr-hpc checkpoint {jobid}" in lines[0]
        assert not list((slurm_cluster.state / "images" / jobid).glob("gen-*"))
        still_counting(slurm_cluster, jobid, logs)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_preempt_whose_requeue_fails_commits_and_job_runs_on(slurm_cluster, workdir):
    """scontrol refuses the requeue (a stand-in first in PATH fails `scontrol requeue`
    only): the checkpoint stays committed, the agents give back what they held, and
    the job runs on."""
    jobid, logs = start_counting_job(slurm_cluster, workdir)
    real = subprocess.run(["which", "scontrol"], capture_output=True, text=True,
                          env=slurm_cluster.env).stdout.strip()
    bindir = workdir / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f"""#!/bin/sh
[ "$1" = requeue ] && {{ echo "scontrol: error: Requested operation is presently disabled" >&2; exit 1; }}
exec {real} "$@"
""")
    (bindir / "scontrol").chmod(0o755)
    env = dict(slurm_cluster.env, PATH=f"{bindir}:{slurm_cluster.env['PATH']}")
    try:
        r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "preempt", jobid], env=env,
                           capture_output=True, text=True, timeout=300)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert f"requeue of job {jobid} failed" in lines[0] and "presently disabled" in lines[0], lines[0]
        assert "gen-1 is committed and the job runs on" in lines[0], lines[0]
        job_dir = slurm_cluster.state / "images" / jobid
        assert (job_dir / "LATEST").read_text().split()[0] == "gen-1"  # then its submission
        still_counting(slurm_cluster, jobid, logs)
        assert slurm_cluster.job(jobid)["Restarts"] == "0"
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


@pytest.fixture
def small_store(slurm_cluster):
    """The job's image dir on a 48 MiB tmpfs, so that it can fill up."""
    mounts = []

    def make(jobid):
        d = slurm_cluster.state / "images" / jobid
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m,mode=0755", "tmpfs", str(d)],
                       check=True)
        mounts.append(d)
        return d

    yield make
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_image_store_full_aborts_and_keeps_previous_generation(slurm_cluster, workdir,
                                                                small_store):
    jobid, logs = start_counting_job(slurm_cluster, workdir)
    try:
        job_dir = small_store(jobid)
        gpucr(slurm_cluster, "checkpoint", jobid)
        gen1 = tree_digest(job_dir / "gen-1")
        st = os.statvfs(job_dir)
        free = st.f_bavail * st.f_frsize
        with open(job_dir / "filler", "wb") as f:  # leave 1 MiB
            f.truncate(0)
            f.write(b"\0" * max(0, free - (1 << 20)))
        r = gpucr(slurm_cluster, "checkpoint", jobid, check=False)
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "aborted" in lines[0], r.stderr
        assert "No space left" in lines[0] or "space" in lines[0].lower(), lines[0]
        assert (job_dir / "LATEST").read_text().split()[0] == "gen-1"  # then its submission
        assert tree_digest(job_dir / "gen-1") == gen1
        assert not (job_dir / "gen-2").exists()
        still_counting(slurm_cluster, jobid, logs)
        rows = gpucr(slurm_cluster, "ls", jobid, "--json").stdout
        assert '"committed": true' in rows and "damaged" not in rows
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_missing_rank_image_holds_job_with_reason_and_keeps_image(slurm_cluster, workdir):
    jobid, logs = start_counting_job(slurm_cluster, workdir, ntasks=2)
    gpucr(slurm_cluster, "checkpoint", jobid)
    slurm_cluster.run("scancel", jobid)
    slurm_cluster.wait_state(jobid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=60)
    gen = slurm_cluster.state / "images" / jobid / "gen-1"
    rank = next(p for p in gen.iterdir() if p.name.startswith("rank-"))
    hidden = gen.parent / f".{rank.name}.moved-by-test"
    rank.rename(hidden)  # a rank's image lost
    before = tree_digest(gen)
    try:
        r = gpucr(slurm_cluster, "restore", jobid)
        assert "restoring from gen-1" in r.stdout
        comment = lambda: slurm_cluster.run("scontrol", "show", "job", jobid).stdout  # noqa: E731
        wait_for(lambda: "Comment=gpucr: cannot restore" in comment(), timeout=120,
                 what="the job to be held with the reason",
                 detail=lambda: comment() + (workdir / "job.out").read_text(errors="replace")
                 + slurm_cluster.restore_log(jobid))
        info = slurm_cluster.wait_state(jobid, "PENDING", timeout=60)
        assert "held" in info["Reason"], info
        assert f"gen-1 has no usable image of {rank.name}" in comment()
        assert f"gpucr-hpc restore {jobid} --from N" in comment()
        assert rank.name in (gen.parent / "restore.log").read_text()
        assert tree_digest(gen) == before, "the failed restore changed the image"
        for p in logs:
            got = numbers(p)
            assert got == list(range(len(got))), "a rank ran from the top"
        # The image back in place, a restore of the same generation releases the job.
        hidden.rename(rank)
        r = gpucr(slurm_cluster, "restore", jobid, "--from", "1")
        assert "restoring from gen-1" in r.stdout
        ranks_count_on(slurm_cluster, jobid, logs)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
        if hidden.exists():
            hidden.rename(rank)


def test_generation_latest_names_gone_holds_job_and_an_earlier_one_restores(slurm_cluster, workdir):
    """A 2-node job with two committed generations loses the one LATEST names; a
    requeue must not run the script from the top (it did, saying nothing): the job is
    held, naming the lost generation and the one to restore; `--from 1` goes on."""
    jobid, logs = start_counting_job(slurm_cluster, workdir, ntasks=2, extra=("-N2", "--ntasks-per-node=1"))
    job_dir = slurm_cluster.state / "images" / jobid
    try:
        gpucr(slurm_cluster, "checkpoint", jobid)
        gpucr(slurm_cluster, "checkpoint", jobid)
        assert (job_dir / "LATEST").read_text().split()[0] == "gen-2"
        before = tree_digest(job_dir / "gen-1")
        shutil.rmtree(job_dir / "gen-2")
        slurm_cluster.run("scontrol", "requeue", jobid)
        comment = lambda: slurm_cluster.run("scontrol", "show", "job", jobid).stdout  # noqa: E731
        wait_for(lambda: "Comment=gpucr: cannot restore" in comment(), timeout=120,
                 what="the job to be held with the reason",
                 detail=lambda: comment() + (workdir / "job.out").read_text(errors="replace")
                 + slurm_cluster.restore_log(jobid))
        info = slurm_cluster.wait_state(jobid, "PENDING", timeout=60)
        assert "held" in info["Reason"], info
        assert "gen-2 (LATEST) is gone" in comment() and f"then: gpucr-hpc restore {jobid} --from 1" in comment()
        assert "gen-2, the checkpoint LATEST names, is gone" in slurm_cluster.restore_log(jobid)
        for p in logs:
            got = numbers(p)
            assert got == list(range(len(got))), "a rank ran from the top"
        assert tree_digest(job_dir / "gen-1") == before, "the failed restore changed the image"
        r = gpucr(slurm_cluster, "restore", jobid, "--from", "1")
        assert "restoring from gen-1" in r.stdout
        ranks_count_on(slurm_cluster, jobid, logs)
        assert (job_dir / "LATEST").read_text().split()[0] == "gen-1"  # a requeue restores it again
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_rank_that_cannot_be_restored_holds_the_job(slurm_cluster, workdir):
    """Rank 1's count file is gone at restore: its restore fails on its node. The
    job must not go on past `srun` without that rank's work: it is held with the
    reason, and once the file is back, restoring the same generation goes on."""
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
srun --ntasks=2 bash -c 'exec {sys.executable} {workdir}/counter.py {workdir}/rank-$SLURM_PROCID.txt 100000'
echo "after srun rc=$?"
""")
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N1", "--ntasks=2", "-o", str(workdir / "job.out"))
    slurm_cluster.wait_state(jobid, "RUNNING")
    logs = [workdir / f"rank-{r}.txt" for r in range(2)]
    wait_for(lambda: all(len(numbers(p)) > 10 for p in logs), what="the job to count")
    gen = slurm_cluster.state / "images" / jobid / "gen-1"
    moved = workdir / "rank-1.txt.moved-by-test"
    try:
        gpucr(slurm_cluster, "checkpoint", jobid)
        slurm_cluster.run("scancel", jobid)
        slurm_cluster.wait_state(jobid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=60)
        before = tree_digest(gen)
        logs[1].rename(moved)
        gpucr(slurm_cluster, "restore", jobid)
        comment = lambda: slurm_cluster.run("scontrol", "show", "job", jobid).stdout  # noqa: E731
        wait_for(lambda: "Comment=gpucr: cannot restore" in comment(), timeout=120,
                 what="the job to be held with the reason",
                 detail=lambda: comment() + (workdir / "job.out").read_text(errors="replace")
                 + slurm_cluster.restore_log(jobid))
        # Slurm ends the restored rank 0 and the script (KillWait) before the job is PENDING.
        info = slurm_cluster.wait_state(jobid, "PENDING", timeout=180)
        assert "held" in info["Reason"], info
        assert "rank 1 of gen-1" in comment(), comment()
        assert "rank-1.txt" in slurm_cluster.restore_log(jobid)  # the Comment stays short
        assert "after srun" not in (workdir / "job.out").read_text()
        assert tree_digest(gen) == before, "the failed restore changed the image"
        # The file back, the same generation restores, and every rank counts on.
        moved.rename(logs[1])
        gpucr(slurm_cluster, "restore", jobid, "--from", "1")
        ranks_count_on(slurm_cluster, jobid, logs)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
        if moved.exists():
            moved.rename(logs[1])


def test_node_failure_during_restore_restores_again_elsewhere(slurm_cluster, workdir):
    """The node a requeued job is being restored on fails (set DOWN): Slurm requeues the
    job again, and it is restored on another node from the same, untouched image."""
    steps = 300
    jobid, logs = start_counting_job(slurm_cluster, workdir, ntasks=2, steps=steps)
    gpucr(slurm_cluster, "preempt", jobid)
    job_dir = slurm_cluster.state / "images" / jobid
    wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", what="the requeue")
    info = slurm_cluster.wait_state(jobid, "RUNNING", timeout=60)
    failed = info["NodeList"]
    image = tree_digest(job_dir / "gen-1")
    # The node fails as the ranks' restore step starts on it: the step's launch can
    # cross the requeue (a rank restored there would run beside the new one).
    wait_for(lambda: f"{jobid}.0" in slurm_cluster.run("squeue", "-h", "-s", "-j", jobid, "-o", "%i",
                                                       check=False).stdout,
             timeout=30, what="the ranks' restore step")
    # DRAIN first: on its own, a DOWN node of this cluster (ReturnToService=2)
    # comes back as soon as its slurmd registers again.
    for state in ("DRAIN", "DOWN"):
        slurm_cluster.run("scontrol", "update", f"NodeName={failed}", f"State={state}",
                          "Reason=gpucr-test-node-failure")
    try:
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "2", timeout=90,
                 what="the job to be requeued after the node failure")
        info = slurm_cluster.wait_state(jobid, "RUNNING", timeout=90)
        assert info["NodeList"] != failed
        assert tree_digest(job_dir / "gen-1") == image, "a restore changed the image"
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    finally:
        slurm_cluster.run("scontrol", "update", f"NodeName={failed}", "State=RESUME", check=False)
        slurm_cluster.run("scancel", jobid, check=False)
    assert info["JobState"] == "COMPLETED", info
    for p in logs:
        got = numbers(p)
        # The run on the failed node may have counted past the checkpoint: those lines
        # were rewound by the second restore, so each value is still there once.
        assert got == list(range(steps)), f"{p}: {got[:5]}...{got[-5:]}"


def test_restore_step_of_an_earlier_restart_restores_nothing(slurm_cluster, workdir):
    """A restore step whose launch crossed a requeue of its job (the race the node
    failure above can hit: Slurm kills the job on the node before the step's tasks
    start, and never signals them) must not bring a rank back beside the one
    restored after the requeue. Here the step says it belongs to restart 3 of a
    job at restart 0: it restores nothing, holds nothing, and says why."""
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
SLURM_RESTART_COUNT=3 srun --ntasks=1 {sys.executable} -m gpucr_hpc.job.restore.rank_restore --gen-dir {workdir}/gen-1
echo "srun rc=$?"
""")
    jobid = slurm_cluster.sbatch(script, "-N1", "--ntasks=1", "-o", str(workdir / "job.out"))
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
    out = (workdir / "job.out").read_text()
    assert info["JobState"] == "COMPLETED" and "srun rc=1" in out, (info, out)
    assert (f"rank 0 not restored: job {jobid} is RUNNING at restart 0, "
            "this step was started for restart 3") in out, out
    assert "gpucr" not in info.get("Comment", ""), info


def test_restore_while_the_job_still_completes_waits_and_restores(slurm_cluster, workdir):
    """Held by a requeue, a job whose processes ignore SIGTERM stays COMPLETING for
    KillWait; a `restore --from 1` asked then waits for it to settle and restores it
    (it was refused: "scontrol requeue failed: Job is pending execution")."""
    script = workdir / "job.sh"
    script.write_text(f"#!/bin/bash\ntrap '' TERM\nexec {sys.executable} {workdir}/counter.py "
                      f"{workdir}/rank-0.txt 100000\n")
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N1", "-o", str(workdir / "job.out"))
    logs = [workdir / "rank-0.txt"]
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(logs[0])) > 10, what="the job to count")
        gpucr(slurm_cluster, "checkpoint", jobid)
        slurm_cluster.run("scontrol", "requeuehold", jobid)
        assert slurm_cluster.job(jobid)["JobState"] == "COMPLETING"
        r = gpucr(slurm_cluster, "restore", jobid, "--from", "1")
        assert "restoring from gen-1" in r.stdout
        ranks_count_on(slurm_cluster, jobid, logs)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
