"""Jobs whose ranks talk through NCCL, on the test cluster (CPU): two ranks, one
per node, of a program built against the stand-in libnccl (tests/nccl_fake: NCCL's
exported names, no GPU; it aborts on any use of a destroyed communicator). The
node agents bring both ranks to one cut, tear their communicators down, and
rebuild them after a suspend, a checkpoint, and a preemption with its requeue and
CRIU restore. The real NCCL runs in gpu-checks/nccl_gpu_verify.py on GPUs."""

import os
import subprocess

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)

from job_helpers import assert_counted_once, gpucr, numbers, output_of, wait_for  # noqa: E402
from shim_helpers import REPO  # noqa: E402

from gpucr_hpc.store.files import tree_digest  # noqa: E402

FAKE = REPO / "tests" / "nccl_fake"


def nccl_job(workdir, steps: int, in_batch: bool = False):
    """in_batch: the script starts both ranks itself (one node, no srun step)."""
    for cmd in (["cc", "-O2", "-shared", "-fPIC", "-o", str(workdir / "libnccl.so.2"), str(FAKE / "fake_nccl.c")],
                ["cc", "-O2", "-pthread", "-o", str(workdir / "ranks"), str(FAKE / "ranks.c"), f"-L{workdir}",
                 "-l:libnccl.so.2", f"-Wl,-rpath,{workdir}"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    script = workdir / "job.sh"
    rank = f"{workdir}/ranks {{}} 2 {workdir} {steps} 20000"
    ranks = (f"{rank.format(0)} & {rank.format(1)} & wait" if in_batch else
             f"srun --ntasks=2 --ntasks-per-node=1 bash -c 'exec {rank.format('$SLURM_PROCID')}'")
    script.write_text(f"""#!/bin/bash
export FAKE_NCCL_LOG={workdir}/nccl.log FAKE_NCCL_BROKEN={workdir}/broken
echo "start restart=${{SLURM_RESTART_COUNT:-0}}"
{ranks}
echo "after srun rc=$?"
""")
    return script


def logged(workdir, what: str) -> int:
    p = workdir / "nccl.log"
    return sum(1 for line in p.read_text().splitlines() if line.startswith(what + " ")) if p.exists() else 0


def start(slurm_cluster, workdir, steps, in_batch: bool = False):
    out = workdir / "job.out"
    layout = ["-N1"] if in_batch else ["-N2", "--ntasks-per-node=1"]
    jobid = slurm_cluster.sbatch(nccl_job(workdir, steps, in_batch), "--gpucr=on", *layout, "-o", str(out))
    slurm_cluster.wait_state(jobid, "RUNNING")
    ranks = [workdir / f"rank-{r}.txt" for r in range(2)]
    wait_for(lambda: all(len(numbers(p)) > 10 for p in ranks), timeout=60, what="both ranks to step",
             detail=lambda: output_of(out))
    return jobid, out, ranks


def stepping(ranks, what, out):
    at = [len(numbers(p)) for p in ranks]
    wait_for(lambda: all(len(numbers(p)) > a + 5 for p, a in zip(ranks, at)), timeout=60, what=what,
             detail=lambda: output_of(out))


def finished(slurm_cluster, jobid, out, ranks, steps, restarts="0"):
    info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    text = output_of(out)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == restarts, (text, info)
    for p in ranks:
        assert_counted_once(p, steps)
    assert text.count("after srun rc=0") == 1, text


def test_suspend_resume_and_checkpoint_of_a_two_node_nccl_job(slurm_cluster, workdir):
    steps = 600
    jobid, out, ranks = start(slurm_cluster, workdir, steps)
    try:
        for n in (1, 2):
            gpucr(slurm_cluster, "suspend", jobid)
            assert slurm_cluster.job(jobid)["JobState"] == "SUSPENDED"
            assert logged(workdir, "destroy") == 4 * n  # both communicators of both ranks
            gpucr(slurm_cluster, "resume", jobid)
            stepping(ranks, f"stepping after resume {n}", out)
            # made by the program: world once per rank (its child is a split); rebuilt: both per rank
            assert logged(workdir, "init") == 2 + 4 * n and logged(workdir, "register") == 2 * (n + 1)
        gpucr(slurm_cluster, "checkpoint", jobid)
        assert logged(workdir, "destroy") == 4 * 3
        stepping(ranks, "stepping after the checkpoint", out)
        finished(slurm_cluster, jobid, out, ranks, steps)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_a_preempted_nccl_job_is_restored_with_its_communicators_rebuilt(slurm_cluster, workdir):
    """The second time, one of its nodes drained: its ranks move, and NCCL's host
    state (the stand-in keeps its first host, as NCCL does) must be made anew.
    Then suspended and resumed: a restored job is cut and rebuilt like any other."""
    steps = 500
    jobid, out, ranks = start(slurm_cluster, workdir, steps)
    drained = None
    try:
        for n in (1, 2):
            if n == 2:
                drained = slurm_cluster.job(jobid)["BatchHost"]
                slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=gpucr-test")
            gpucr(slurm_cluster, "preempt", jobid)
            wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == str(n)  # noqa: B023
                     and slurm_cluster.job(jobid).get("JobState") == "RUNNING", timeout=120,
                     what=f"restore {n}", detail=lambda: (output_of(out), slurm_cluster.restore_log(jobid)))
            stepping(ranks, f"stepping after restore {n}", out)
        assert drained not in slurm_cluster.run("scontrol", "show", "hostnames",
                                                slurm_cluster.job(jobid)["NodeList"]).stdout.split()
        assert logged(workdir, "destroy") >= 4 * 2
        # restored by CRIU, its NCCL a fresh copy: the ranks are cut and rebuilt as before
        destroyed = logged(workdir, "destroy")
        gpucr(slurm_cluster, "suspend", jobid)
        assert logged(workdir, "destroy") == destroyed + 4
        gpucr(slurm_cluster, "resume", jobid)
        stepping(ranks, "stepping after a suspend of the restored job", out)
        finished(slurm_cluster, jobid, out, ranks, steps, restarts="2")
    finally:
        if drained:
            slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
        slurm_cluster.run("scancel", jobid, check=False)


def preempted_while_nccl_is_broken(slurm_cluster, jobid, out, broken) -> str:
    """Preempted with the stand-in's flag file there: the restore cannot make the
    communicators and holds the job. Its `scontrol show job`."""
    broken.touch()
    gpucr(slurm_cluster, "preempt", jobid)
    comment = lambda: slurm_cluster.run("scontrol", "show", "job", jobid).stdout  # noqa: E731
    wait_for(lambda: "Comment=gpucr: cannot restore" in comment(), timeout=120,
             what="the job to be held with the reason", detail=lambda: comment() + output_of(out))
    info = slurm_cluster.wait_state(jobid, "PENDING", timeout=180)
    assert "held" in info["Reason"], info
    return comment()


def test_communicators_that_cannot_be_rebuilt_hold_the_job_and_a_later_restore_runs_it(slurm_cluster, workdir):
    """A restore whose ranks cannot make their communicators (NCCL broken on the
    nodes, here by the stand-in's flag file): the job is held with the reason,
    its image unchanged, no rank run from the top; once NCCL works again,
    `gpucr-hpc restore` brings it back and every step counts once."""
    steps = 400
    jobid, out, ranks = start(slurm_cluster, workdir, steps)
    broken = workdir / "broken"
    try:
        comment = preempted_while_nccl_is_broken(slurm_cluster, jobid, out, broken)
        assert "NCCL" in comment or "ncclGetUniqueId" in comment, comment
        gen = slurm_cluster.state / "images" / jobid / "gen-1"
        before = tree_digest(gen)
        for p in ranks:
            got = numbers(p)
            assert got == list(range(len(got))), "a rank ran from the top"
        broken.unlink()
        r = gpucr(slurm_cluster, "restore", jobid, "--from", "1")
        assert "restoring from gen-1" in r.stdout
        stepping(ranks, "stepping after the restore", out)
        assert tree_digest(gen) == before, "the failed restore changed the image"
        finished(slurm_cluster, jobid, out, ranks, steps, restarts="2")
    finally:
        broken.unlink(missing_ok=True)
        slurm_cluster.run("scancel", jobid, check=False)


def running_ranks(workdir) -> list[str]:
    r = subprocess.run(["pgrep", "-af", f"{workdir}/ranks "], capture_output=True, text=True)
    return r.stdout.splitlines()


def test_ranks_of_the_batch_script_itself_are_rebuilt_or_ended_and_held(slurm_cluster, workdir):
    """Both ranks started by the script itself, in the batch unit: a preemption
    whose restore cannot rebuild their communicators ends the restored tree and
    holds the job (no rank left running, the image unchanged); a later restore
    rebuilds them and every step counts once."""
    steps = 400
    jobid, out, ranks = start(slurm_cluster, workdir, steps, in_batch=True)
    broken = workdir / "broken"
    try:
        preempted_while_nccl_is_broken(slurm_cluster, jobid, out, broken)
        wait_for(lambda: not running_ranks(workdir), timeout=30, what="the restored ranks to end",
                 detail=lambda: running_ranks(workdir))
        gen = slurm_cluster.state / "images" / jobid / "gen-1"
        before = tree_digest(gen)
        broken.unlink()
        gpucr(slurm_cluster, "restore", jobid, "--from", "1")
        stepping(ranks, "stepping after the restore", out)
        assert tree_digest(gen) == before, "the failed restore changed the image"
        finished(slurm_cluster, jobid, out, ranks, steps, restarts="2")
    finally:
        broken.unlink(missing_ok=True)
        slurm_cluster.run("scancel", jobid, check=False)
