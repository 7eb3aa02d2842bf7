"""Jobs whose ranks talk over TCP, on the real test cluster with real CRIU (4.2+).

A torch.distributed job with the gloo backend (2 nodes x 2 ranks, env://
rendezvous on the first node, an all-reduce and the TCP store every step) goes
through the same cuts, and every step's values must be exactly right.

Two ranks on two nodes hold one TCP connection: rank 1 streams numbered words
to rank 0, which checks that every word comes once and in order. The job is
checkpointed in place and runs on, then preempted with its first node drained,
requeued, restored on another node set (in netns mode each node has its own
address, so the connection's ends move), and preempted and restored again.
Rank 0 must end having read every word once: nothing lost, duplicated or
reordered across three cuts.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)

from job_helpers import gpucr, output_of, suspended_then_resumed, wait_for  # noqa: E402
from user_helpers import gpucr_as  # noqa: E402

WORDS, PER_TICK, TICK = 60_000, 100, 0.05  # 30 s of streaming

PAIR = r"""
import os, socket, struct, sys, time
rank, port, workdir = int(os.environ["SLURM_PROCID"]), int(sys.argv[1]), sys.argv[2]
words, per_tick, tick = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
addr_file = workdir + "/server-addr"
log = open(f"{workdir}/pair-{rank}.txt", "a", buffering=1)
if rank == 0:
    try:  # its node's own address where nodes have one (scripts/testcluster, netns mode)
        addr = socket.gethostbyname(os.environ["SLURMD_NODENAME"])
    except OSError:
        addr = "127.0.0.1"
    srv = socket.create_server((addr, port))
    open(addr_file + ".tmp", "w").write(addr)
    os.rename(addr_file + ".tmp", addr_file)
    conn, _ = srv.accept()
    want, buf = 0, b""
    while want < words:
        data = conn.recv(65536)
        if not data:
            log.write(f"closed at {want}\n")
            sys.exit(1)
        buf += data
        n = len(buf) // 4
        got = struct.unpack(f"!{n}I", buf[:4 * n])
        buf = buf[4 * n:]
        for i, w in enumerate(got):
            if w != want + i:
                log.write(f"bad at {want + i}: got {w}\n")
                sys.exit(1)
        want += n
        log.write(f"{want}\n")
    log.write("all words once, in order\n")
else:
    for _ in range(200):
        try:
            conn = socket.create_connection((open(addr_file).read(), port))
            break
        except OSError:
            time.sleep(0.1)
    for i in range(0, words, per_tick):
        conn.sendall(b"".join(struct.pack("!I", w) for w in range(i, min(i + per_tick, words))))
        log.write(f"{min(i + per_tick, words)}\n")
        time.sleep(tick)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # until rank 0 has read all and closed
"""


def submit_pair(cluster, workdir, port: int, *sbatch_args, user=None) -> tuple[str, list]:
    """The TCP pair job (rank 0 on one node reads, rank 1 on another streams): its id and
    logs. Submitted by root, or by `user`."""
    (workdir / "pair.py").write_text(PAIR)
    script = workdir / "pair.sh"
    script.write_text(f"#!/bin/bash\necho start restart=${{SLURM_RESTART_COUNT:-0}} uid=$(id -u)\n"
                      f"srun --ntasks=2 --ntasks-per-node=1 {sys.executable} {workdir}/pair.py {port} {workdir} "
                      f"{WORDS} {PER_TICK} {TICK}\necho after srun rc=$?\n")
    args = ("--gpucr=on", "-N2", "-o", str(workdir / "pair.out"), *sbatch_args)
    jobid = cluster.sbatch(script, *args, user=user)
    return jobid, [workdir / f"pair-{r}.txt" for r in (0, 1)]


def numbers(path) -> list[int]:
    """The counts a rank logged (its last line may say how it ended)."""
    return [int(x) for x in path.read_text().split("\n") if x.isdigit()] if path.exists() else []


def _nodes(cluster, jobid):
    return sorted(cluster.run("scontrol", "show", "hostnames", cluster.job(jobid)["NodeList"]).stdout.split())


def _restored(cluster, jobid, restarts, logs):
    wait_for(lambda: cluster.job(jobid).get("Restarts") == str(restarts)
             and cluster.job(jobid).get("JobState") == "RUNNING", timeout=180, what=f"restart {restarts}")
    at = len(numbers(logs[0]))
    out = logs[0].parent / "pair.out"
    wait_for(lambda: len(numbers(logs[0])) > at + 5, timeout=120, what=f"rank 0 reading after restore {restarts}",
             detail=lambda: (cluster.job(jobid), out.read_text() if out.exists() else "",
                             [p.read_text()[-200:] for p in logs], cluster.restore_log(jobid)))


def test_ranks_connected_across_nodes_move_with_their_connection(slurm_cluster, workdir):
    jobid, logs = submit_pair(slurm_cluster, workdir, 20000 + os.getpid() % 10000)
    through_three_cuts(slurm_cluster, jobid, logs, workdir / "pair.out", lambda *a: gpucr(slurm_cluster, *a))


def test_an_ordinary_users_connected_ranks_move_with_their_connection(slurm_cluster, users, jobdir):
    """The same as the job's user: the lock, the dump and the moved restore go
    through the root helper, which checks that each connection is the user's."""
    if not slurm_cluster.netns or not slurm_cluster.node_local:
        pytest.skip("needs the test cluster's netns mode with node-local paths (scripts/testcluster up)")
    a = users[0]
    jobid, logs = submit_pair(slurm_cluster, jobdir, 20000 + os.getpid() % 10000 + 1, user=a)

    def as_a(*args):
        r = gpucr_as(a, *args, env=slurm_cluster.env)
        assert r.returncode == 0, (args, r.stderr)
        return r

    text = through_three_cuts(slurm_cluster, jobid, logs, jobdir / "pair.out", as_a)
    assert f"uid={a.pw_uid}" in text, text
    assert not any(p.lstat().st_uid != a.pw_uid for p in (Path(slurm_cluster.state) / "images" / jobid).rglob("*"))


def through_three_cuts(slurm_cluster, jobid, logs, out, run) -> str:
    """An in-place checkpoint, a preemption with the first node drained (the ranks
    move, and the connection's ends with them), a second preemption; every word once."""
    drained = None
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: all(len(numbers(p)) > 5 for p in logs), what="both ranks to talk")
        # 1. In place: the job runs on, its connection too.
        run("checkpoint", jobid)
        at = len(numbers(logs[0]))
        wait_for(lambda: len(numbers(logs[0])) > at + 5, what="rank 0 to read on after the checkpoint")
        # 2. Preempted with its first node drained: restored on other nodes.
        drained = _nodes(slurm_cluster, jobid)[0]
        slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=gpucr-test")
        run("preempt", jobid)
        _restored(slurm_cluster, jobid, 1, logs)
        assert drained not in _nodes(slurm_cluster, jobid)
        slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME")
        drained = None
        # 3. Again, from the restored state.
        run("preempt", jobid)
        _restored(slurm_cluster, jobid, 2, logs)
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
        text = out.read_text()
        final = logs[0].read_text().splitlines()
        assert final[-1] == "all words once, in order", final[-3:]
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", (text, info)
        assert text.count("start restart=") == 1 and text.count("after srun rc=0") == 1, text
        return text
    finally:
        if drained:
            slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
        slurm_cluster.run("scancel", jobid, check=False)


GLOO = r"""
import os, sys, time
import torch
import torch.distributed as dist
out, steps, pace = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: its rendezvous says who is who
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
else:
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", rank=rank, world_size=world)
store = dist.distributed_c10d._get_default_store()
log = open(f"{out}/gloo-{rank}.txt", "a", buffering=1)
for step in range(steps):
    t = torch.full((1024,), float((rank + 1) * (step + 1)), dtype=torch.float64)
    dist.all_reduce(t)
    store.set(f"s{step}r{rank}", str(step * 1000 + rank))
    peer = (rank + 1) % world
    got = int(store.get(f"s{step}r{peer}"))
    ok = t[0].item() == (step + 1) * world * (world + 1) / 2 and bool((t == t[0]).all()) \
        and got == step * 1000 + peer
    log.write(f"{step} {'ok' if ok else 'WRONG'} {t[0].item()} {got}\n")
    time.sleep(pace)
dist.barrier()
log.write("done\n")
dist.destroy_process_group()
"""


LAUNCH = {
    # srun starts the 4 ranks; env:// rendezvous on the first node
    "srun": "srun --ntasks=4 --ntasks-per-node=2 {python} {workdir}/gloo.py {workdir} {steps} 0.05",
    # one torchrun agent per node starts 2 ranks each; c10d rendezvous on the first node
    "torchrun": "srun --ntasks=2 --ntasks-per-node=1 {python} -m torch.distributed.run --nnodes=2 "
                "--nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT "
                "--rdzv-id=gpucr-test --max-restarts=0 {workdir}/gloo.py {workdir} {steps} 0.05",
}


@pytest.mark.parametrize("launcher", sorted(LAUNCH))
def test_gloo_job_keeps_its_connections_through_a_move(slurm_cluster, workdir, launcher):
    pytest.importorskip("torch")
    steps = 400
    (workdir / "gloo.py").write_text(GLOO)
    port = 21000 + os.getpid() % 10000
    script = workdir / "gloo.sh"
    launch = LAUNCH[launcher].format(python=sys.executable, workdir=workdir, steps=steps)
    script.write_text(f"""#!/bin/bash
echo start restart=${{SLURM_RESTART_COUNT:-0}}
export MASTER_ADDR=$(getent hosts $(scontrol show hostnames $SLURM_JOB_NODELIST | head -1) | awk '{{print $1}}')
export MASTER_PORT={port} OMP_NUM_THREADS=1
{launch}
echo after srun rc=$?
""")
    out = workdir / "gloo.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N2", "--ntasks-per-node=2", "-o", str(out))
    logs = [workdir / f"gloo-{r}.txt" for r in range(4)]

    def done(p):
        return len(p.read_text().splitlines()) if p.exists() else 0

    drained = None
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: all(done(p) > 5 for p in logs), timeout=180, what="every rank to step",
                 detail=lambda: output_of(out))
        r = gpucr(slurm_cluster, "checkpoint", jobid, check=False)
        assert r.returncode == 0, r.stderr
        at = done(logs[0])
        wait_for(lambda: done(logs[0]) > at + 5, what="the job to step on after the checkpoint")
        drained = _nodes(slurm_cluster, jobid)[0]
        slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=gpucr-test")
        gpucr(slurm_cluster, "preempt", jobid)
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1"
                 and slurm_cluster.job(jobid).get("JobState") == "RUNNING", timeout=180, what="restart 1")
        at = done(logs[0])
        wait_for(lambda: done(logs[0]) > at + 5, timeout=180, what="the job to step after its restore",
                 detail=lambda: output_of(out))
        assert drained not in _nodes(slurm_cluster, jobid)
        slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME")
        drained = None
        gpucr(slurm_cluster, "preempt", jobid)
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        text = out.read_text()
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", (text, info)
        for p in logs:
            got = p.read_text().splitlines()
            assert got[-1] == "done", (p, got[-3:])
            rows = [ln.split() for ln in got[:-1]]
            assert [int(x[0]) for x in rows] == list(range(steps)), f"{p}: a step repeated or skipped"
            assert all(x[1] == "ok" for x in rows), next(x for x in rows if x[1] != "ok")
    finally:
        if drained:
            slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
        slurm_cluster.run("scancel", jobid, check=False)


def test_a_rank_that_does_not_come_back_holds_the_job_with_the_image_intact(slurm_cluster, workdir):
    """The restored ranks keep their connections locked until every rank is back; one never
    is (a test fault): the others give up after GPUCR_RANKS_BACK_TIMEOUT, and the job is held
    with the reason, its generation unchanged."""
    from gpucr_hpc.store.files import tree_digest

    jobid, logs = submit_pair(slurm_cluster, workdir, 22000 + os.getpid() % 10000,
                              "--export=ALL,GPUCR_FAULTS=rank_not_back,GPUCR_RANKS_BACK_TIMEOUT=8")
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: all(len(numbers(p)) > 5 for p in logs), what="both ranks to talk")
        gpucr(slurm_cluster, "preempt", jobid)
        gen = slurm_cluster.state / "images" / jobid / "gen-1"
        before = tree_digest(gen)
        comment = lambda: slurm_cluster.run("scontrol", "show", "job", jobid).stdout  # noqa: E731
        wait_for(lambda: "Comment=gpucr: cannot restore" in comment(), timeout=180,
                 what="the job to be held with the reason", detail=lambda: slurm_cluster.restore_log(jobid))
        info = slurm_cluster.wait_state(jobid, "PENDING", timeout=60)
        assert "held" in info["Reason"], info
        assert "not every rank of gen-1 came back" in comment()
        assert "ranks were restored within 8 s" in slurm_cluster.restore_log(jobid)
        assert tree_digest(gen) == before, "the failed restore changed the image"
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_an_agent_killed_during_the_cut_aborts_it_and_the_connection_goes_on(slurm_cluster, workdir):
    """One node's agent dies holding the lock on the job's connections (a test fault): the
    checkpoint aborts, the lock lapses (GPUCR_LOCK_LEASE), and the ranks stream on to the end
    with every word once."""
    jobid, logs = submit_pair(slurm_cluster, workdir, 23000 + os.getpid() % 10000)
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: all(len(numbers(p)) > 5 for p in logs), what="both ranks to talk")
        env = dict(slurm_cluster.env, GPUCR_FAULTS="agent_dies_after_lock", GPUCR_LOCK_LEASE="6")
        r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "checkpoint", jobid], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "left running" in r.stderr
        assert slurm_cluster.job(jobid)["JobState"] == "RUNNING"
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
        assert info["JobState"] == "COMPLETED", (info, (workdir / "pair.out").read_text())
        assert logs[0].read_text().splitlines()[-1] == "all words once, in order"
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_a_node_that_fails_during_the_restore_restores_the_pair_again_elsewhere(slurm_cluster, workdir):
    """The node a preempted pair job is being restored on fails (set DOWN) while its ranks'
    restore step starts: Slurm requeues the job again, it is restored on other nodes from the
    same, untouched image, and rank 0 still reads every word once."""
    from gpucr_hpc.store.files import tree_digest

    jobid, logs = submit_pair(slurm_cluster, workdir, 24000 + os.getpid() % 10000)
    failed = None
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: all(len(numbers(p)) > 5 for p in logs), what="both ranks to talk")
        gpucr(slurm_cluster, "preempt", jobid)
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", what="the requeue")
        slurm_cluster.wait_state(jobid, "RUNNING", timeout=60)
        failed = _nodes(slurm_cluster, jobid)[-1]  # rank 1's node
        image = tree_digest(slurm_cluster.state / "images" / jobid / "gen-1")
        wait_for(lambda: f"{jobid}.0" in slurm_cluster.run("squeue", "-h", "-s", "-j", jobid, "-o", "%i",
                                                           check=False).stdout,
                 timeout=30, what="the ranks' restore step")
        for state in ("DRAIN", "DOWN"):  # DRAIN first: a DOWN node alone comes back as its slurmd registers
            slurm_cluster.run("scontrol", "update", f"NodeName={failed}", f"State={state}",
                              "Reason=gpucr-test-node-failure")
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "2", timeout=90,
                 what="the job to be requeued after the node failure")
        slurm_cluster.wait_state(jobid, "RUNNING", timeout=90)
        assert failed not in _nodes(slurm_cluster, jobid)
        assert tree_digest(slurm_cluster.state / "images" / jobid / "gen-1") == image
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
        assert info["JobState"] == "COMPLETED", (info, slurm_cluster.restore_log(jobid))
        assert logs[0].read_text().splitlines()[-1] == "all words once, in order"
    finally:
        if failed:
            slurm_cluster.run("scontrol", "update", f"NodeName={failed}", "State=RESUME", check=False)
        slurm_cluster.run("scancel", jobid, check=False)


MPI_RANKS = r"""
import sys, time
from mpi4py import MPI
log = open(f"{sys.argv[1]}/mpi-{MPI.COMM_WORLD.rank}.txt", "a", buffering=1)
for i in range(100000):
    MPI.COMM_WORLD.allreduce(i)
    log.write(f"{i}\n")
    time.sleep(0.05)
"""


def test_mpi_job_is_refused_naming_mpi_and_runs_on(slurm_cluster, workdir):
    pytest.importorskip("mpi4py")
    (workdir / "mpi.py").write_text(MPI_RANKS)
    script = workdir / "mpi.sh"
    script.write_text(f"#!/bin/bash\nsrun --mpi=pmix --ntasks=2 --ntasks-per-node=1 {sys.executable} "
                      f"{workdir}/mpi.py {workdir}\n")
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N2", "-o", str(workdir / "mpi.out"))
    logs = [workdir / f"mpi-{r}.txt" for r in (0, 1)]
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: all(len(numbers(p)) > 5 for p in logs), timeout=120, what="both MPI ranks to run",
                 detail=lambda: output_of(workdir / "mpi.out"))
        r = gpucr(slurm_cluster, "checkpoint", jobid, check=False)
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "MPI" in lines[0] and "left running" in lines[0], r.stderr
        n = len(numbers(logs[0]))
        wait_for(lambda: len(numbers(logs[0])) > n + 5, what="the MPI job to run on")
        assert slurm_cluster.job(jobid)["JobState"] == "RUNNING"
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_ranks_connected_across_nodes_keep_their_connection_through_suspends(slurm_cluster, workdir):
    """Suspend leaves sockets alone (nothing is dumped): the stream stops while the
    job is suspended and goes on after, with every word once, through two
    `gpucr-hpc suspend/resume` and two `scontrol suspend/resume` cycles."""
    jobid, logs = submit_pair(slurm_cluster, workdir, 20000 + os.getpid() % 10000)
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: all(len(numbers(p)) > 5 for p in logs), what="both ranks to talk")
        for cycle in range(4):
            if cycle % 2 == 0:
                gpucr(slurm_cluster, "suspend", jobid)
                suspended_then_resumed(slurm_cluster, jobid, logs, lambda: gpucr(slurm_cluster, "resume", jobid))
            else:
                slurm_cluster.run("scontrol", "suspend", jobid)
                suspended_then_resumed(slurm_cluster, jobid, logs,
                                       lambda: slurm_cluster.run("scontrol", "resume", jobid))
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
        final = logs[0].read_text().splitlines()
        assert final[-1] == "all words once, in order", final[-3:]
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", info
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


# A connection inside one process (both ends), a MiB queued each way and never
# read, while it counts; at the end it reads both queues whole.
OWN = r"""
import socket, sys, time
log, steps, b = sys.argv[1], int(sys.argv[2]), 1 << 20
srv = socket.create_server(("127.0.0.1", 0))
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
sent = {}
for x in (c, s):
    x.setblocking(False)
    n = 0
    while n < b:
        try:
            n += x.send(bytes([len(sent) + 1]) * min(b - n, 65536))
        except BlockingIOError:
            break
    sent[x] = n
for i in range(steps):
    open(log, "a").write(f"{i}\n")
    time.sleep(0.05)
for x, peer, mark in ((c, s, 1), (s, c, 2)):
    peer.setblocking(True)
    got = peer.recv(sent[x], socket.MSG_WAITALL)
    assert got == bytes([mark]) * sent[x], (mark, len(got), sent[x])
open(log, "a").write("queues whole\n")
"""


def test_a_units_own_connection_with_full_queues_survives_preemptions(slurm_cluster, workdir):
    """Both ends in one unit, the queues full both ways: dumped and restored with
    every queued byte, twice."""
    (workdir / "own.py").write_text(OWN)
    log, out = workdir / "own.txt", workdir / "own.out"
    script = workdir / "own.sh"
    script.write_text(f"#!/bin/bash\necho start\n{sys.executable} {workdir}/own.py {log} 500\necho done rc=$?\n")
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-o", str(out))
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 10, what="the job to count")
        for n in (1, 2):
            gpucr(slurm_cluster, "preempt", jobid)
            wait_for(lambda n=n: slurm_cluster.job(jobid).get("Restarts") == str(n)
                     and slurm_cluster.job(jobid).get("JobState") == "RUNNING", timeout=120, what=f"restore {n}")
            at = len(numbers(log))
            wait_for(lambda at=at: len(numbers(log)) > at + 5, what=f"counting after restore {n}",
                     detail=lambda: (output_of(out), slurm_cluster.restore_log(jobid)))
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
        assert log.read_text().splitlines()[-1] == "queues whole", log.read_text()[-200:]
        assert info["JobState"] == "COMPLETED" and "done rc=0" in out.read_text(), (out.read_text(), info)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


# The batch script's server: every rank streams numbered words to it, and it
# checks each connection's words come once and in order.
SERVER = r"""
import os, select, socket, struct, sys
port, workdir, n_ranks, words = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
log = open(f"{workdir}/server.txt", "a", buffering=1)
addr = socket.gethostbyname(os.environ["SLURMD_NODENAME"])
srv = socket.create_server((addr, port))
open(f"{workdir}/server-addr.tmp", "w").write(addr)
os.rename(f"{workdir}/server-addr.tmp", f"{workdir}/server-addr")
conns = [srv.accept()[0] for _ in range(n_ranks)]
want, buf = {c: 0 for c in conns}, {c: b"" for c in conns}
while any(want[c] < words for c in conns):
    for c in select.select([c for c in conns if want[c] < words], [], [], 60)[0]:
        data = c.recv(65536)
        if not data:
            log.write(f"closed at {want[c]}\n")
            sys.exit(1)
        buf[c] += data
        n = len(buf[c]) // 4
        got = struct.unpack(f"!{n}I", buf[c][:4 * n])
        buf[c] = buf[c][4 * n:]
        if list(got) != list(range(want[c], want[c] + n)):
            log.write(f"bad after {want[c]}\n")
            sys.exit(1)
        want[c] += n
    log.write(f"{sum(want.values())}\n")
log.write("all words once, in order\n")
"""

CLIENT = r"""
import socket, struct, sys, time
port, workdir = int(sys.argv[1]), sys.argv[2]
words, per_tick, tick = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
for _ in range(300):
    try:
        conn = socket.create_connection((open(f"{workdir}/server-addr").read(), port))
        break
    except OSError:
        time.sleep(0.1)
for i in range(0, words, per_tick):
    conn.sendall(b"".join(struct.pack("!I", w) for w in range(i, min(i + per_tick, words))))
    time.sleep(tick)
conn.shutdown(socket.SHUT_WR)
"""


def test_ranks_connected_to_the_batch_script_move_with_it(slurm_cluster, workdir):
    """A server in the batch script, a client in each of two ranks on two nodes:
    checkpointed in place, preempted with the batch node drained (the server's
    address moves with the script), preempted again; every word once."""
    if not slurm_cluster.netns:
        pytest.skip("needs the test cluster's netns mode (scripts/testcluster up)")
    port = 21000 + os.getpid() % 10000
    (workdir / "server.py").write_text(SERVER)
    (workdir / "client.py").write_text(CLIENT)
    script = workdir / "batch.sh"
    script.write_text(f"#!/bin/bash\necho start\n{sys.executable} {workdir}/server.py {port} {workdir} 2 {WORDS} &\n"
                      f"srun --ntasks=2 --ntasks-per-node=1 {sys.executable} {workdir}/client.py {port} {workdir} "
                      f"{WORDS} {PER_TICK} {TICK}\nwait $!\necho after server rc=$?\n")
    log, out = workdir / "server.txt", workdir / "batch.out"
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N2", "-o", str(out))
    drained = None
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 5, what="the server to read")
        gpucr(slurm_cluster, "checkpoint", jobid)
        for n in (1, 2):
            drained = slurm_cluster.job(jobid)["BatchHost"]
            slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=gpucr-test")
            gpucr(slurm_cluster, "preempt", jobid)
            wait_for(lambda n=n: slurm_cluster.job(jobid).get("Restarts") == str(n)
                     and slurm_cluster.job(jobid).get("JobState") == "RUNNING", timeout=180, what=f"restore {n}")
            assert slurm_cluster.job(jobid)["BatchHost"] != drained
            slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME")
            drained = None
            at = len(numbers(log))
            wait_for(lambda at=at: len(numbers(log)) > at + 5, timeout=120,
                     what=f"the server reading after restore {n}",
                     detail=lambda: (output_of(out), log.read_text()[-300:], slurm_cluster.restore_log(jobid)))
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
        assert log.read_text().splitlines()[-1] == "all words once, in order", log.read_text()[-300:]
        assert info["JobState"] == "COMPLETED" and "after server rc=0" in out.read_text(), (out.read_text(), info)
    finally:
        if drained:
            slurm_cluster.run("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
        slurm_cluster.run("scancel", jobid, check=False)
