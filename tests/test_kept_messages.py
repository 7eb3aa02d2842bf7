"""Messages that keep what matters, on the real test cluster with real CRIU:

* a held job's Comment is short and whole: what failed, where to read why, and the
  command that restores the job once fixed; the full line is in restore.log;
* gpucr's own lines in a job's output (a failed automatic checkpoint, a held
  restore's reason) survive a later restore, which puts the output back as it
  was at the checkpoint;
* a process that goes away while a command waits on its control socket (the
  reset seen after a killed checkpoint) gives one line, never a traceback.
"""

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
from job_helpers import assert_counted_once, gpucr, numbers, output_of, ranks_count_on, wait_for
from shim_helpers import build_shim, gpucr_cli
from shim_helpers import wait_for as wait_for_path

from gpucr_hpc.slurm.commands import parse_one_line

# A scratch path as users have them: the full reason of a failed rank restore names
# the file, which makes it far longer than a Comment should be.
DEEP = "experiments/llama-finetune-lr3e-4-batch512-seed17/run-2026-11-25T20-00-00/checkpoints-and-logs"


def comment_of(cluster, jobid: str) -> str:
    out = cluster.run("scontrol", "show", "job", "-o", jobid, check=False).stdout
    return parse_one_line(out.splitlines()[0]).get("Comment", "").strip() if out.strip() else ""


@pytest.mark.slurm
@pytest.mark.criu
def test_held_jobs_comment_is_whole_and_its_reason_survives_the_next_restore(slurm_cluster, workdir):
    """Rank 1's count file is gone at restore: the job is held. Its Comment names
    what failed and the command to run, whole; restore.log has the full line with the
    file's path. Once the file is back, the restore goes on, and the held line is
    still in the job's output although the output was put back as at the checkpoint."""
    d = workdir / DEEP
    d.mkdir(parents=True)
    for p in [workdir, *d.relative_to(workdir).parents]:
        os.chmod(workdir / p, 0o755)
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
srun --ntasks=2 bash -c 'exec {sys.executable} {workdir}/counter.py {d}/rank-$SLURM_PROCID.txt 100000'
echo "after srun rc=$?"
""")
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N1", "--ntasks=2", "-o", str(out))
    logs = [d / f"rank-{r}.txt" for r in range(2)]
    moved = d / "rank-1.txt.moved-by-test"
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: all(len(numbers(p)) > 10 for p in logs), what="the job to count")
        gpucr(slurm_cluster, "checkpoint", jobid)
        slurm_cluster.run("scancel", jobid)
        slurm_cluster.wait_state(jobid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=60)
        logs[1].rename(moved)
        gpucr(slurm_cluster, "restore", jobid)
        wait_for(lambda: "held" in slurm_cluster.job(jobid).get("Reason", ""), timeout=180,
                 what="the job to be held", detail=lambda: slurm_cluster.restore_log(jobid))
        comment = comment_of(slurm_cluster, jobid)
        assert len(comment) <= 200, comment
        assert comment.startswith(f"gpucr: cannot restore job {jobid}: rank 1 of gen-1"), comment
        assert comment.endswith(f"gpucr-hpc restore {jobid} --from N"), comment
        assert f"gpucr-hpc status {jobid}" in comment, comment
        full = [line for line in slurm_cluster.restore_log(jobid).splitlines()
                if f"cannot restore job {jobid}: rank 1 of gen-1" in line]
        assert full and str(logs[1]) in full[0] and full[0].endswith(f"gpucr-hpc restore {jobid} --from N"), full
        held_line = full[0][full[0].index("gpucr: "):]
        assert held_line in out.read_text()

        moved.rename(logs[1])
        gpucr(slurm_cluster, "restore", jobid, "--from", "1")
        ranks_count_on(slurm_cluster, jobid, logs)
        assert out.read_text().count(held_line) == 1, out.read_text()
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
        if moved.exists():
            moved.rename(logs[1])


# In the batch script's tree: once `trigger` exists, a TCP connection to a server
# outside the job (which no checkpoint can take along) until the server closes it.
HOLDER = r"""
import os, socket, sys, time
addr, port, trigger = sys.argv[3], int(sys.argv[1]), sys.argv[2]
while not os.path.exists(trigger):
    time.sleep(0.05)
try:
    conn = socket.create_connection((addr, port))
    conn.recv(1)
except OSError:
    pass
"""


class OneClientServer:
    """A TCP server on addr (where the job's nodes reach this machine) that holds the
    one connection it accepts until closed."""

    def __init__(self, addr):
        self.addr = addr
        self.srv = socket.create_server((addr, 0))
        self.port = self.srv.getsockname()[1]
        self.conn = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        try:
            self.conn, _ = self.srv.accept()
        except OSError:
            pass

    def close(self):
        for s in (self.conn, self.srv):
            if s is not None:
                s.close()


@pytest.mark.slurm
@pytest.mark.criu
def test_failed_automatic_checkpoint_line_survives_the_restore(slurm_cluster, workdir):
    """gen-1 is taken; then the job's automatic checkpoint (its warning signal) fails,
    since its script holds a connection to a server; Slurm ends and requeues it, and
    it is restored from gen-1. The job's output is put back as it was at gen-1, and
    the line that said the automatic checkpoint failed must still be there."""
    steps = 300
    (workdir / "holder.py").write_text(HOLDER)
    trigger, log, out = workdir / "connect-now", workdir / "count.txt", workdir / "job.out"
    server = OneClientServer(slurm_cluster.outside_addr)
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
echo "start restart=${{SLURM_RESTART_COUNT:-0}}"
{sys.executable} {workdir}/holder.py {server.port} {trigger} {server.addr} &
{sys.executable} {workdir}/counter.py {log} {steps}
wait
echo "after python"
""")
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-o", str(out))
    failed = f"gpucr: automatic checkpoint of job {jobid} failed: "
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
        gpucr(slurm_cluster, "checkpoint", jobid)
        trigger.write_text("")
        wait_for(lambda: server.conn is not None, what="the script to connect to the server")
        slurm_cluster.run("scancel", "--batch", "--signal=USR2", jobid)
        wait_for(lambda: failed in output_of(out), timeout=120, what="the automatic checkpoint to fail",
                 detail=lambda: output_of(out))
        line = next(x for x in out.read_text().splitlines() if x.startswith(failed))
        assert "network connection that cannot move" in line, line
        server.close()  # the holder ends: nothing left that cannot move

        slurm_cluster.run("scontrol", "requeue", jobid)
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        text = out.read_text()
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (text, info)
        assert "restoring job" in slurm_cluster.restore_log(jobid)
        assert_counted_once(log, steps)
        assert text.count("start restart=") == 1 and text.count("after python") == 1, text
        assert text.count(line) == 1, text
    finally:
        server.close()
        slurm_cluster.run("scancel", jobid, check=False)


def waiting_on_a_socket(pid: int) -> bool:
    """The process holds a socket and sleeps (it connects and sends at once, then waits)."""
    try:
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return any(fd.startswith("socket:") for fd in fds) and state == "S"


def test_process_gone_during_a_request_is_one_line(tmp_path):
    """The shim's process is stopped (as a suspended job's, or a tree a killed
    checkpoint left frozen) when a command asks it something, and is killed while
    the command waits: the control socket resets. One line, non-zero, no traceback."""
    build_shim()
    env = dict(os.environ, GPUCR_RUN_DIR=str(tmp_path / "run"), GPUCR_SHIM=str(build_shim()))
    proc = subprocess.Popen(gpucr_cli() + ["run", "--", sys.executable, "-c", "import time; time.sleep(120)"],
                            env=env)
    try:
        assert wait_for_path(tmp_path / "run" / f"{proc.pid}.sock")
        os.kill(proc.pid, signal.SIGSTOP)
        ask = subprocess.Popen(gpucr_cli() + ["checkpoint", "--pid", str(proc.pid)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Its request queued on the stopped process's socket: connected, waiting for the answer.
        wait_for(lambda: ask.poll() is not None or waiting_on_a_socket(ask.pid), timeout=60,
                 what="the command to connect")
        assert ask.poll() is None, ask.communicate()
        os.kill(proc.pid, signal.SIGKILL)
        _, err = ask.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = err.strip().splitlines()
    assert ask.returncode != 0 and len(lines) == 1, err
    assert lines[0].startswith("gpucr-hpc: error: ") and "Traceback" not in err, err
    assert f"process {proc.pid}" in lines[0], lines[0]
