"""Helpers of the job-level tests: a counter workload, the CLI, waiting."""

import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

# Always counts from 0: a run restarted from the top would repeat values.
COUNTER = r"""
import sys, time
path, steps = sys.argv[1], int(sys.argv[2])
out = open(path, "a", buffering=1)
for i in range(steps):
    out.write(f"{i}\n")
    time.sleep(0.05)
"""


def gpucr(cluster, *args, check=True):
    out = subprocess.run([sys.executable, "-m", "gpucr_hpc", *args], env=cluster.env,
                         capture_output=True, text=True, timeout=300)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def wait_for(pred, timeout=60, what="condition", detail=None):
    """`detail`: called on a timeout, what it returns goes into the failure (the
    job's state and output: a failure in CI must say what happened)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{detail()}" if detail else ""))


def output_of(path: Path) -> str:
    """A job's output so far: slurmd makes the file a moment after RUNNING."""
    return path.read_text(errors="replace") if path.exists() else ""


def numbers(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def assert_counted_once(path: Path, steps: int):
    got = numbers(path)
    assert got == list(range(steps)), f"{path}: repeated or skipped values: {got[:5]}...{got[-5:]}"


def finished_after_one_restart(cluster, jobid: str, out: Path, log: Path, steps: int) -> str:
    """The job ran to completion through exactly one requeue and restore: counted
    once from 0 to steps, its script started once. Returns the job's output."""
    info = cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    assert info["JobState"] == "COMPLETED", (out.read_text(), info)
    assert info["Restarts"] == "1"
    assert_counted_once(log, steps)
    text = out.read_text()
    assert text.count("start restart=0") == 1 and "start restart=1" not in text, text
    return text


def ranks_count_on(cluster, jobid: str, logs: list[Path]):
    """The job's restored ranks run and count on, none from the top, none skipping."""
    cluster.wait_state(jobid, "RUNNING", timeout=60)
    n = [len(numbers(p)) for p in logs]
    wait_for(lambda: all(len(numbers(p)) > k + 5 for p, k in zip(logs, n)),
             what="the restored ranks to count on")
    for p in logs:
        got = numbers(p)
        assert got == list(range(len(got))), "a rank repeated or skipped values"


def counting_script(workdir: Path, log: Path, steps: int) -> Path:
    """A batch script that runs the counter directly (no srun), with a line before and after."""
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
echo "start restart=${{SLURM_RESTART_COUNT:-0}}"
{sys.executable} {workdir}/counter.py {log} {steps}
echo "after python"
""")
    return script


@contextmanager
def plugstack_args(cluster, args: str):
    """The cluster's plugstack.conf line with these arguments added, for the
    duration (the plugin re-reads it for every step)."""
    conf = cluster.state / "etc" / "plugstack.conf"
    original = conf.read_text()
    conf.write_text(original.rstrip("\n") + f" {args}\n")
    try:
        yield
    finally:
        conf.write_text(original)


@contextmanager
def node_memory_stage(cluster, more_args: str = ""):
    """A staging tier in each node's own folder in /dev/shm, made by the admin (root's,
    0755: the plugin makes each job's dir in it), on the plugin's line (with
    more_args) for the duration."""
    root = Path(tempfile.mkdtemp(prefix="gpucr-stage-", dir="/dev/shm"))
    root.chmod(0o755)
    for node in ("n1", "n2", "n3"):
        (root / node).mkdir(mode=0o755)
        (root / node).chmod(0o755)
    try:
        with plugstack_args(cluster, f"stage={root}/%n stage_cap=50% {more_args}".rstrip()):
            yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def drain_cli(cluster, name: str, before_drain: str) -> Path:
    """A cli= for the plugin that runs `before_drain` (shell) ahead of a drain, then
    the test cluster's own: a drain made late, or one that never runs on a node."""
    cli = next(w[4:] for w in (cluster.state / "etc" / "plugstack.conf").read_text().split() if w.startswith("cli="))
    path = cluster.state / "etc" / name
    path.write_text(f'#!/bin/sh\nif [ "$1" = drain ]; then {before_drain}; fi\nexec {cli} "$@"\n')
    path.chmod(0o755)
    return path


def suspended_then_resumed(cluster, jobid, logs, resume) -> None:
    """The job stops counting while suspended and counts on once resumed.

    Slurm sends SIGTSTP, then SIGSTOP about 2 s later; a process in an orphaned
    process group (a session leader's) lets SIGTSTP pass, so the counts must settle
    within a few seconds and then stay put."""
    cluster.wait_state(jobid, "SUSPENDED", timeout=30)
    counts = lambda: [len(numbers(p)) for p in logs]  # noqa: E731
    seen = [counts()]

    def settled():
        time.sleep(0.5)  # longer than a count step; 1 s in all: the supervisor's old wait
        seen.append(counts())
        return seen[-1] == seen[-2] == seen[-3] if len(seen) > 2 else False

    wait_for(settled, timeout=15, what="the suspended job to stop counting", detail=lambda: seen)
    time.sleep(1.0)
    assert counts() == seen[-1], "the job ran on while suspended"
    resume()
    assert cluster.job(jobid)["JobState"] == "RUNNING"
    wait_for(lambda: all(len(numbers(p)) > n + 3 for p, n in zip(logs, seen[-1])),
             what="the job to count on after resume")
