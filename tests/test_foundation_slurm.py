"""A real `sbatch --gpucr=on` job on the real local cluster: the plugin acts, the shim is loaded."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

PREFIX = Path("/opt/gpucr-hpc")

JOB = """#!/bin/bash
echo "LD_PRELOAD=$LD_PRELOAD"
env | grep '^GPUCR_' | sort
grep -c libgpucr-cuda.so /proc/self/maps || true
"""


def run_job(cluster, tmp_path, *args):
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    out = tmp_path / "job.out"
    jobid = cluster.sbatch(script, "-o", str(out), *args)
    info = cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
    for _ in range(50):  # the output file is flushed as the step ends
        if out.exists() and out.stat().st_size:
            break
        time.sleep(0.1)
    return jobid, info, out.read_text()


def parse_env(text):
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_gpucr_job_gets_shim_and_settings(slurm_cluster, tmp_path):
    jobid, info, text = run_job(slurm_cluster, tmp_path, "--gpucr=on")
    assert info["JobState"] == "COMPLETED", text
    env = parse_env(text)
    preload = env["LD_PRELOAD"].split(":")
    assert preload.count(str(PREFIX / "lib/gpucr/libgpucr-cuda.so")) == 1
    assert env["GPUCR_JOB_ID"] == jobid
    # The node's run dir (the path every node sees its own at, else the per-node one), of this job.
    roots = (slurm_cluster.state / "node-local" / "run", slurm_cluster.state / "run" / info["NodeList"])
    assert Path(env["GPUCR_RUN_DIR"]).parent in roots and Path(env["GPUCR_RUN_DIR"]).name == jobid
    # The last line counts the shim's mappings in the job's own process: it was really preloaded.
    assert int(text.strip().splitlines()[-1]) >= 1


def test_job_without_option_is_untouched(slurm_cluster, tmp_path):
    _, info, text = run_job(slurm_cluster, tmp_path)
    assert info["JobState"] == "COMPLETED", text
    env = parse_env(text)
    assert "libgpucr" not in env.get("LD_PRELOAD", "")
    # (the test runner's own GPUCR_* variables, if any, reach the job as all its others)
    assert not [k for k in env if k.startswith("GPUCR_") and k not in os.environ]
    assert text.strip().splitlines()[-1] == "0"


# Rank 0 serves one connection on its node's address; rank 1 finds it by rank 0's
# node name and sends bytes, which rank 0 sends back.
TCP_PEERS = r"""
import json, os, socket, subprocess, sys, time
rank, port, out = int(os.environ["SLURM_PROCID"]), int(sys.argv[1]), sys.argv[2]
nodes = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                       capture_output=True, text=True, check=True).stdout.split()
me = {"rank": rank, "host": socket.gethostname(),
      "addrs": subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split(),
      "resolved": {n: socket.gethostbyname(n) for n in nodes}}
if rank == 0:
    srv = socket.create_server(("0.0.0.0", port))
    srv.settimeout(30)
    conn, peer = srv.accept()
    data = conn.recv(100)
    conn.sendall(data[::-1])
    me.update(got=data.decode(), peer=peer[0])
else:
    for _ in range(150):
        try:
            conn = socket.create_connection((nodes[0], port), timeout=10)
            break
        except OSError:
            time.sleep(0.2)
    conn.sendall(b"hello from " + me["host"].encode())
    me.update(back=conn.recv(100).decode(), local=conn.getsockname()[0])
open(f"{out}/tcp-{rank}.json", "w").write(json.dumps(me))
"""


def test_nodes_have_their_own_addresses(slurm_cluster, tmp_path):
    """In netns mode (scripts/testcluster) the ranks of a 2-node job on n1 and n2 see
    different addresses, resolve each other's node name to the other's address, and
    pass bytes over TCP between them."""
    if not slurm_cluster.netns:
        pytest.skip(f"the test cluster runs in loopback mode: {slurm_cluster.net_why}")
    tmp_path.chmod(0o755)
    (tmp_path / "peers.py").write_text(TCP_PEERS)
    port = 20000 + os.getpid() % 10000
    r = slurm_cluster.run("srun", "-N2", "--ntasks=2", "--ntasks-per-node=1", "-w", "n1,n2",
                          sys.executable, str(tmp_path / "peers.py"), str(port), str(tmp_path),
                          check=False, timeout=120)
    assert r.returncode == 0, r.stderr
    a, b = (json.loads((tmp_path / f"tcp-{i}.json").read_text()) for i in (0, 1))
    assert (a["host"], b["host"]) == ("n1", "n2")
    assert len(a["addrs"]) == len(b["addrs"]) == 1 and a["addrs"] != b["addrs"], (a, b)
    for me in (a, b):
        assert me["resolved"] == {"n1": a["addrs"][0], "n2": b["addrs"][0]}, me
    assert b["back"] == "hello from n2"[::-1] and a["got"] == "hello from n2"
    assert a["peer"] == b["local"] == b["addrs"][0]


def test_pmix_world_spans_nodes_over_their_addresses(slurm_cluster):
    """srun --mpi=pmix (the node agents' launch) makes one MPI world of ranks on n1
    and n2, whose messages go over TCP between the nodes' own addresses."""
    if not slurm_cluster.netns:
        pytest.skip(f"the test cluster runs in loopback mode: {slurm_cluster.net_why}")
    prog = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
            "print(c.rank, socket.gethostname(), c.allreduce(c.rank + 1), flush=True)")
    env = dict(slurm_cluster.env, OMPI_MCA_btl="tcp,self")  # no shared memory between "nodes"
    r = slurm_cluster.run("srun", "-N2", "--ntasks=2", "--ntasks-per-node=1", "-w", "n1,n2", "--mpi=pmix",
                          sys.executable, "-c", prog, env=env, check=False, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.strip().splitlines()) == ["0 n1 3", "1 n2 3"], r.stdout
