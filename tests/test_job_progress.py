"""Progress of a job command on its nodes (job/checkpoint/progress.py): the agents' lines
reach the listener while the agents still run, a terminal shows one line per
node with its phases and bytes, and the agents' result is read as before."""

import io
import json
import sys
import time

import pytest
from rich.console import Console
from rich.progress import Progress, TextColumn

from gpucr_hpc.cli.output import NodeProgress
from gpucr_hpc.job.checkpoint import coordinator, progress

AGENTS = """
import json, sys, time
def say(d): print(json.dumps(d), flush=True)
say({"progress": {"node": "n1", "unit": "rank-0.0", "phase": "gpu", "bytes": 0}})
time.sleep(float(sys.argv[1]))
say({"progress": {"node": "n1", "unit": "rank-0.0", "phase": "done", "bytes": 3 << 30}})
print("not json")
say({"node_report": {"node": "n1"}})
say({"result": {"committed": True}})
"""


def test_progress_lines_reach_the_listener_while_the_agents_run(tmp_path):
    script = tmp_path / "agents.py"
    script.write_text(AGENTS)
    heard = []
    t0 = time.monotonic()
    with progress.listening(lambda e: heard.append((time.monotonic() - t0, e))):
        lines, err, rc = coordinator._run_streaming([sys.executable, str(script), "1.0"], {})
    assert rc == 0 and err == ""
    assert [e["phase"] for _, e in heard] == ["gpu", "done"]
    assert heard[0][0] < 0.9, "the first line came only at the end"
    assert lines == [{"node_report": {"node": "n1"}}, {"result": {"committed": True}}]


def test_agents_that_outrun_the_limit_are_killed(tmp_path, monkeypatch):
    script = tmp_path / "agents.py"
    script.write_text(AGENTS)
    monkeypatch.setattr(coordinator, "AGENT_TIMEOUT_S", 0.5)
    t0 = time.monotonic()
    with pytest.raises(coordinator.subprocess.TimeoutExpired):
        coordinator._run_streaming([sys.executable, str(script), "30"], {})
    assert time.monotonic() - t0 < 10


def test_a_node_line_shows_its_phases_units_and_bytes():
    out = io.StringIO()
    with Progress(TextColumn("{task.description}"), TextColumn("{task.fields[moved]}"),
                  console=Console(file=out, width=200)) as bar:
        nodes = NodeProgress(bar)
        nodes.heard({"node": "n1", "unit": "rank-0.0", "phase": "dump", "bytes": 2 << 30})
        nodes.heard({"node": "n1", "unit": "rank-0.1", "phase": "done", "bytes": 1 << 30})
        nodes.heard({"node": "n2", "unit": "batch", "phase": "write", "bytes": 0})
        tasks = {t.description.split(":")[0].strip(): t for t in bar.tasks}
        assert tasks["n1"].description.endswith("n1: dump (1/2 units)")
        assert tasks["n1"].fields["moved"] == "3.0 GiB"
        assert "n2: write (0/1 units)" in tasks["n2"].description


def test_an_agent_line_is_one_json_object(capsys):
    progress.emit("n1", "batch", "commit", 5)
    line = capsys.readouterr().out
    assert line.endswith("\n") and json.loads(line) == {"progress": {"node": "n1", "unit": "batch",
                                                                     "phase": "commit", "bytes": 5}}


@pytest.mark.slurm
@pytest.mark.criu
def test_a_job_checkpoint_on_a_terminal_shows_each_node_and_piped_prints_only_its_result(slurm_cluster, workdir):
    """On a terminal (stderr a pty) the command shows a line per node with its
    units' phases and bytes while the agents work; piped, stderr stays empty."""
    import os
    import pty
    import subprocess
    import threading

    from job_helpers import counting_script, gpucr, numbers, wait_for

    if os.geteuid() != 0:
        pytest.skip("job checkpoint with CRIU needs root here")
    log = workdir / "count.txt"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, 600), "--gpucr=on", "-o", str(workdir / "job.out"))
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 5, what="the job to count")
        master, slave = pty.openpty()
        seen = bytearray()
        reader = threading.Thread(target=lambda: _drain(master, seen), daemon=True)
        reader.start()
        r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "checkpoint", jobid], env=slurm_cluster.env,
                           stdout=subprocess.PIPE, stderr=slave, text=True, timeout=300)
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
        shown = seen.decode(errors="replace")
        assert r.returncode == 0 and "checkpointed" in r.stdout, (r.stdout, shown)
        node = slurm_cluster.job(jobid)["BatchHost"]
        assert f"{node}: " in shown and "units)" in shown, shown
        piped = gpucr(slurm_cluster, "checkpoint", jobid)
        assert piped.stderr == "" and "progress" not in piped.stdout, (piped.stdout, piped.stderr)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def _drain(fd, into: bytearray) -> None:
    import os

    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return
        if not chunk:
            return
        into += chunk
