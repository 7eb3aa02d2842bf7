"""The batch supervisor's word when the automatic checkpoint fails: what then becomes
of the job, which differs between a preemption (Slurm requeues it) and the time
limit (Slurm ends it; `gpucr-hpc restore JOBID` brings it back).

The real supervisor code runs; Slurm is a stand-in `scontrol` first in PATH, and the
checkpoint fails for a real reason (the site has no gpucr plugin line), so no
cluster is touched.
"""

import os

import pytest

from gpucr_hpc.job.restore import batch_supervisor
from gpucr_hpc.store import manifest as mf

SCONTROL = """#!/bin/sh
case "$*" in
  "show job -o 42") echo "JobId=42 UserId=me({uid}) JobState=RUNNING NodeList=(null) TimeLimit=01:00:00 \
PreemptTime={preempt_time} Requeue={requeue}";;
  *) echo "scontrol: error: unexpected $*" >&2; exit 1;;
esac
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    def make(preempted: bool, generation: str | None, requeue: int = 1):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "scontrol").write_text(SCONTROL.format(
            uid=os.getuid(), preempt_time="2025-01-01T00:00:00" if preempted else "None", requeue=requeue))
        (bin_dir / "scontrol").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))  # no plugstack.conf beside it
        monkeypatch.setenv("GPUCR_IMAGE_ROOT", str(tmp_path / "images"))
        if generation:
            gen = tmp_path / "images" / "42" / generation
            gen.mkdir(parents=True)
            mf.commit(gen, mf.new_manifest(kind="job", vendor=None, gpu=None))
            (gen.parent / "LATEST").write_text(f"{generation}\n")
    return make


@pytest.mark.parametrize("preempted,generation,expect", [
    (True, "gen-3", "Slurm then requeues it (PreemptMode=REQUEUE) and it restarts from its checkpoint gen-3"),
    (True, None, "Slurm then requeues it (PreemptMode=REQUEUE) and it restarts from the top (it has no checkpoint)"),
    (False, "gen-3", "until its time limit, and Slurm does not requeue it then; "
                     "`gpucr-hpc restore 42` requeues it from its checkpoint gen-3"),
    (False, None, "until its time limit and then ends (it has no checkpoint to restore)"),
])
def test_failed_automatic_checkpoint_says_what_follows(site, capsys, preempted, generation, expect):
    site(preempted, generation)
    batch_supervisor.checkpoint_and_requeue("42", lead=120)
    lines = capsys.readouterr().err.splitlines()
    why = "preemption" if preempted else "the time limit"
    assert lines[0] == f"gpucr: checkpointing job 42 before {why}"
    assert len(lines) == 2, lines
    assert lines[1].startswith("gpucr: automatic checkpoint of job 42 failed: the gpucr SPANK plugin is not in ")
    assert "; the job keeps running until " in lines[1] and expect in lines[1], lines[1]
    assert "goes on from its last checkpoint" not in lines[1]


def test_job_that_cannot_be_requeued_is_not_checkpointed(site, capsys):
    site(True, None, requeue=0)
    batch_supervisor.checkpoint_and_requeue("42", lead=120)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["gpucr: job 42 was submitted with --no-requeue: not checkpointing it before preemption; "
                     "submit it without --no-requeue to have it checkpointed, requeued and restored"]


SUPERVISED = """
import signal, subprocess, sys
from gpucr_hpc.job.restore import batch_supervisor
waited = batch_supervisor.FORWARDED | {signal.SIGCHLD}
signal.pthread_sigmask(signal.SIG_BLOCK, waited)
script = subprocess.Popen(
    [sys.executable, "-c", "import signal, time\\n"
     "signal.signal(signal.SIGUSR1, lambda s, f: print('USR1', flush=True))\\n"
     "while True: time.sleep(1)"],
    preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, waited))
print(script.pid, flush=True)
sys.exit(batch_supervisor.supervise(script, script.pid, "42", None, 0, waited) == -signal.SIGTERM)
"""


def test_supervisor_survives_stops_longer_than_its_wait(tmp_path):
    """Slurm's suspend stops the supervisor; after a resume it forwarded a garbage
    signal number (EINVAL) and died, ending the job. It must forward each real signal
    once, and nothing else."""
    import signal
    import subprocess
    import sys
    import time

    sup = subprocess.Popen([sys.executable, "-c", SUPERVISED], stdout=subprocess.PIPE, text=True,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = int(sup.stdout.readline())
    time.sleep(0.5)  # the script's handler is set
    os.kill(sup.pid, signal.SIGUSR1)
    time.sleep(0.5)
    for _ in range(5):
        os.kill(sup.pid, signal.SIGSTOP)
        time.sleep(1.3)
        os.kill(sup.pid, signal.SIGCONT)
        time.sleep(0.3)
    alive = sup.poll() is None
    os.kill(sup.pid, signal.SIGUSR1)
    time.sleep(0.5)
    os.kill(script, signal.SIGTERM)
    out, _ = sup.communicate(timeout=30)
    assert alive, out
    assert out.split() == ["USR1", "USR1"], out
    assert sup.returncode == 1, "the supervisor did not return the script's status"
