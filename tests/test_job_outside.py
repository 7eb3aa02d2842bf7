"""A job that logs to a service outside it, as W&B's and MLflow's clients do: a
requests session with keep-alive, posting records from a background uploader
thread to an HTTP server on this machine, outside every node.

By default its checkpoint is refused in one line and the job runs on. With
--gpucr-outside=close it is checkpointed in place (the connection goes on),
preempted and restored: the session finds its connection closed, connects again
(urllib3 sees the pooled connection dropped, or retries the request), and the
server ends with every record, each one the client was told had arrived.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from job_helpers import gpucr, numbers, wait_for
from user_helpers import gpucr_as

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

# The job: the main thread counts (one line per step, as the counter does) and
# hands a record per step to the uploader thread, which posts it and notes each
# answered one in `acked`.
UPLOADER = r"""
import json, queue, sys, threading, time
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

url, steps, log, acked = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
session = requests.Session()
retry = Retry(total=20, connect=20, read=20, backoff_factor=0.1, allowed_methods=None)
session.mount("http://", HTTPAdapter(max_retries=retry))
todo = queue.Queue()

def upload():
    with open(acked, "a", buffering=1) as out:
        while (i := todo.get()) is not None:
            r = session.post(url, data=json.dumps({"i": i}), timeout=30)
            r.raise_for_status()
            out.write(f"{i}\n")

uploader = threading.Thread(target=upload)
uploader.start()
with open(log, "a", buffering=1) as out:
    for i in range(steps):
        out.write(f"{i}\n")
        todo.put(i)
        time.sleep(0.05)
todo.put(None)
uploader.join()
"""


class RecordServer:
    """An HTTP/1.1 server (keep-alive) on addr that keeps every record posted to it."""

    def __init__(self, addr: str):
        records = self.records = []
        self.connections = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                server.connections += 1

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                records.append(json.loads(body)["i"])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((addr, 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{addr}:{self.httpd.server_address[1]}/log"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def records(slurm_cluster):
    server = RecordServer(slurm_cluster.outside_addr)
    yield server
    server.close()


def _job(slurm_cluster, workdir, records, steps, *options, user=None):
    (workdir / "uploader.py").write_text(UPLOADER)
    log, acked, out = workdir / "count.txt", workdir / "acked.txt", workdir / "job.out"
    script = workdir / "job.sh"
    script.write_text(f"""#!/bin/bash
echo "start restart=${{SLURM_RESTART_COUNT:-0}}"
{sys.executable} {workdir}/uploader.py {records.url} {steps} {log} {acked}
echo "after python rc=$?"
""")
    args = ("--gpucr=on", "-o", str(out), *options)
    jobid = slurm_cluster.sbatch(script, *args, user=user)
    slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(acked)) > 10, what="the uploader to post records",
             detail=lambda: out.read_text() if out.exists() else "")
    return jobid, log, acked, out


def test_a_job_talking_to_an_outside_server_is_refused_by_default_and_runs_on(slurm_cluster, workdir, records):
    jobid, log, _, _ = _job(slurm_cluster, workdir, records, 2000)
    try:
        r = gpucr(slurm_cluster, "checkpoint", jobid, check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert "cannot move" in lines[0] and records.url.split("/")[2] in lines[0], lines[0]
        assert "--gpucr-outside=close" in lines[0], lines[0]
        n = len(numbers(log))
        wait_for(lambda: len(numbers(log)) > n + 5, what="the job to run on")
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_under_close_the_client_reconnects_after_a_restore_and_loses_nothing(slurm_cluster, users, jobdir,
                                                                             records):
    """As an ordinary user (the root helper closes the connection in its own copy of
    the image), the job moved to another node by the preemption."""
    steps = 600
    a = users[0]
    jobid, log, acked, out = _job(slurm_cluster, jobdir, records, steps, "--gpucr-outside=close", user=a)

    def as_a(*args):
        r = gpucr_as(a, *args, env=slurm_cluster.env)
        assert r.returncode == 0, (args, r.stderr)

    drained = None
    try:
        as_a("checkpoint", jobid)  # in place: the job and its connection go on
        n = len(numbers(acked))
        wait_for(lambda: len(numbers(acked)) > n + 5, what="uploads to go on after an in-place checkpoint")
        before = records.connections
        drained = slurm_cluster.job(jobid)["NodeList"]
        slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=gpucr-test")
        as_a("preempt", jobid)
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        text = out.read_text()
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (text, info,
                                                                             slurm_cluster.restore_log(jobid))
        assert "after python rc=0" in text, text
        assert numbers(log) == list(range(steps)), "the job counted on from its checkpoint, once"
        assert set(records.records) == set(range(steps)), "every record reached the server"
        assert set(numbers(acked)) <= set(records.records), "each answered record is on the server"
        # The restored job runs on from its checkpoint: what it posted between the
        # checkpoint and its end is posted again, one run of consecutive records.
        twice = sorted({i for i in records.records if records.records.count(i) > 1})
        assert twice == list(range(twice[0], twice[-1] + 1)) if twice else True, twice
        assert records.connections > before, "the restored client connected again"
        assert slurm_cluster.job(jobid)["NodeList"] != drained, "restored on another node"
    finally:
        if drained:
            slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
        slurm_cluster.run("scancel", jobid, check=False)
