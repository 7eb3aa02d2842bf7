"""What happened to a job, where users look (job/events.py): each command's
record, its line in the job's output, and the job's story in `status`."""

import json
import os
import threading
import time

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import events


def test_a_command_is_recorded_with_its_result_or_its_error(tmp_path):
    got = events.told(tmp_path, os.getuid(), "checkpoint",
                      lambda: {"generation": "gen-2", "nodes": ["n1", "n2"], "total_s": 1.25})
    assert got["generation"] == "gen-2"
    with pytest.raises(GpucrError):
        events.told(tmp_path, os.getuid(), "suspend", lambda: (_ for _ in ()).throw(GpucrError("no", "fix")))
    ok, bad = events.read(tmp_path)
    assert ok["ok"] and ok["generation"] == "gen-2" and ok["took_s"] == 1.25 and ok["pid"] == os.getpid()
    assert not bad["ok"] and bad["error"] == "no; fix"
    assert events.text(ok, "42").startswith("gpucr: job 42 checkpointed by ")
    assert events.text(ok, "42").endswith(": gen-2 on n1, n2 in 1.2 s")
    assert " failed: no; fix" in events.text(bad, "42")


def test_the_relay_says_what_other_processes_recorded_from_then_on(tmp_path, monkeypatch):
    events.record(tmp_path, os.getuid(), what="checkpoint", ok=True, generation="gen-1")  # before: not said
    monkeypatch.setattr(events, "RELAY_POLL_S", 0.05)
    said, stop = [], threading.Event()
    t = threading.Thread(target=events.relay, args=(tmp_path, "7", said.append, stop))
    t.start()
    try:
        time.sleep(0.2)
        events.record(tmp_path, os.getuid(), what="resume", ok=True)  # this process's own: not said
        with open(tmp_path / events.EVENTS, "a") as f:  # another process's, written in two pieces
            line = json.dumps({"at": time.time(), "by": "alice", "pid": 1, "what": "checkpoint", "ok": True,
                               "generation": "gen-2", "took_s": 2.0})
            f.write(line[:20])
            f.flush()
            time.sleep(0.2)
            f.write(line[20:] + "\n")
        deadline = time.monotonic() + 5
        while not said and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        t.join()
    assert len(said) == 1 and said[0].startswith("gpucr: job 7 checkpointed by alice at ") and "gen-2" in said[0]


@pytest.mark.slurm
@pytest.mark.criu
def test_commands_by_hand_and_the_restore_are_told_in_the_jobs_output_and_status(slurm_cluster, workdir):
    if os.geteuid() != 0:
        pytest.skip("job checkpoint with CRIU needs root here")
    from job_helpers import counting_script, gpucr, numbers, output_of, wait_for

    log, out = workdir / "count.txt", workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, 400), "--gpucr=on", "-o", str(out))
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 10, what="the job to count")
        gpucr(slurm_cluster, "checkpoint", jobid)
        wait_for(lambda: f"gpucr: job {jobid} checkpointed by root at " in output_of(out), timeout=30,
                 what="the checkpoint's line in the job's output", detail=lambda: output_of(out))
        gpucr(slurm_cluster, "preempt", jobid)
        wait_for(lambda: f"gpucr: job {jobid} restored from gen-2 (checkpointed " in output_of(out), timeout=120,
                 what="the restore's line in the job's output", detail=lambda: output_of(out))
        st = json.loads(gpucr(slurm_cluster, "status", jobid, "--json").stdout)
        assert [(e["what"], e["generation"]) for e in st["story"]] == [("checkpoint", "gen-1"), ("preempt", "gen-2")]
        text = gpucr(slurm_cluster, "status", jobid).stdout
        assert "what was done to it" in text and "preempt" in text, text
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
        assert info["JobState"] == "COMPLETED"
        # the checkpoint's line survives the rewind of the output to gen-2's size
        assert out.read_text().count(f"gpucr: job {jobid} checkpointed by root") == 1, out.read_text()
    finally:
        slurm_cluster.run("scancel", jobid, check=False)
