"""PyTorch DDP jobs over NCCL under real Slurm on GPUs, their output compared bit
for bit with an uninterrupted torchrun of the same job.

* One node, two GPUs, NCCL's default transports (P2P over NVLink), launched by
  `srun -n2` and by `torchrun --nproc-per-node 2`: suspended and resumed,
  twice, checkpointed, then preempted, requeued and restored by CRIU twice.
* Two nodes, one GPU each (a test cluster whose nodes have GPUs of their own,
  GPUCR_TESTCLUSTER_GPUS=2,1,1 on four GPUs or 1,1,2 on two: NCCL sees two
  hosts and uses its NET transport): preempted and restored, then preempted
  with its batch node drained, so that its ranks move to another node and rank
  0 onto another GPU.

Each test skips on a cluster that lacks its shape. Marked gpu; figures go to
$GPUCR_RESULTS_DIR/job-nccl-gpu-*.json."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from job_helpers import gpucr, output_of, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.slurm, pytest.mark.criu]

REPO = Path(__file__).resolve().parent.parent
DDP = REPO / "tests" / "shim_workloads" / "ddp_nccl.py"
STEPS, BALLAST_GIB, PACE = 400, 1.0, 0.05
ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "INFO"}
NET_ONLY = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}  # the reference of the two-host job
RESULTS = Path(os.environ.get("GPUCR_RESULTS_DIR") or "/tmp")

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)


def used_mib() -> list[int]:
    r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []


def busy_gpus(idle: list[int]) -> list[int]:
    """The GPUs the job's ranks hold (each holds over a GiB: its ballast and model)."""
    return [i for i, (u, b) in enumerate(zip(used_mib(), idle)) if u - b > 512]


def gpus_per_node(cluster) -> dict[str, int]:
    out = cluster.run("scontrol", "show", "node", "-o").stdout
    return {m.group(1): int(g.group(1)) if (g := re.search(r"Gres=gpu:[^:\s]*:?(\d+)", line)) else 0
            for line in out.splitlines() if (m := re.match(r"NodeName=(\S+)", line))}


def lines(text: str, rank: int) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(f"rank {rank} ")]


def steps_of(out: Path, rank: int) -> int:
    return sum(1 for ln in lines(output_of(out), rank) if " step " in ln)


def transports(text: str) -> set[str]:
    """What NCCL's INFO log says it used: `... via P2P/CUMEM/read`, `via NET/Socket/0`."""
    return {m.group(1) for m in re.finditer(r"via (P2P|SHM|NET)/", text)}


def reference(env: dict) -> str:
    ref = subprocess.run(["torchrun", "--standalone", "--nproc-per-node=2", str(DDP), str(STEPS), str(BALLAST_GIB),
                          "0"], capture_output=True, text=True, env=dict(os.environ, **env), timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    return ref.stdout


# The batch node's address as Slurm has it: a node name may not resolve at all (the
# test cluster's loopback mode), and where DNS is missing a lookup can stall.
ADDR = "$(scontrol show node \"$SLURMD_NODENAME\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)"
LAUNCH = {
    "srun": f"""export MASTER_PORT=29533 MASTER_ADDR={ADDR}
[ -n "$MASTER_ADDR" ] || {{ echo "no address for $(hostname)"; exit 1; }}
srun --ntasks=2 --ntasks-per-node=2 {sys.executable} {DDP} {STEPS} {BALLAST_GIB} {PACE}""",
    "torchrun": f"""srun --ntasks=1 torchrun --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d \\
    --rdzv-endpoint=127.0.0.1:29534 --local-addr=127.0.0.1 {DDP} {STEPS} {BALLAST_GIB} {PACE}""",
    "two-hosts": f"""export MASTER_PORT=29535 MASTER_ADDR={ADDR}
[ -n "$MASTER_ADDR" ] || {{ echo "no address for $(hostname)"; exit 1; }}
srun --ntasks=2 --ntasks-per-node=1 {sys.executable} {DDP} {STEPS} {BALLAST_GIB} {PACE}""",
}


def job_script(workdir: Path, launch: str) -> Path:
    script = workdir / f"ddp-{launch}.sh"
    exports = " ".join(f"{k}={v}" for k, v in ENV.items())
    script.write_text(f"#!/bin/bash\nexport {exports}\n{LAUNCH[launch]}\necho \"after srun rc=$?\"\n")
    return script


class Run:
    """One job under test: its output, its figures, and waits on its ranks."""

    def __init__(self, cluster, jobid: str, out: Path, res: dict):
        self.cluster, self.jobid, self.out, self.res = cluster, jobid, out, res

    def stepping(self, what: str, more: int = 10) -> None:
        at = min(steps_of(self.out, r) for r in (0, 1))
        wait_for(lambda: all(steps_of(self.out, r) >= at + more for r in (0, 1)), timeout=180, what=what,
                 detail=lambda: output_of(self.out)[-3000:] + self.cluster.restore_log(self.jobid)[-2000:])

    def timed(self, name: str, *args) -> None:
        t = time.monotonic()
        gpucr(self.cluster, *args, self.jobid)
        self.res[f"{name}_s"] = round(time.monotonic() - t, 3)

    def preempted_and_restored(self, n: int) -> None:
        t = time.monotonic()
        gpucr(self.cluster, "preempt", self.jobid)
        self.res[f"preempt_{n}_s"] = round(time.monotonic() - t, 3)
        job = self.cluster.job
        wait_for(lambda: job(self.jobid).get("Restarts") == str(n) and job(self.jobid).get("JobState") == "RUNNING",
                 timeout=300, what=f"restore {n}", detail=lambda: self.cluster.restore_log(self.jobid))
        self.res[f"restored_{n}_s"] = round(time.monotonic() - t, 3)
        self.res[f"nodes_{n}"] = job(self.jobid).get("NodeList")
        # The output is put back as it was at the checkpoint before the ranks are
        # restored: steps count only once both ranks hold their GPU memory again.
        wait_for(lambda: len(busy_gpus(self.res["idle_mib"])) == 2, timeout=240, what=f"ranks on GPUs {n}",
                 detail=lambda: self.cluster.restore_log(self.jobid))
        self.res[f"back_{n}_s"] = round(time.monotonic() - t, 3)
        self.stepping(f"steps after restore {n}")
        self.res[f"gpus_{n}"] = busy_gpus(self.res["idle_mib"])

    def finished(self, ref: str, restarts: int) -> str:
        info = self.cluster.wait_state(self.jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        text = output_of(self.out)
        self.res.update(state=info["JobState"], restarts=info.get("Restarts"),
                        nccl_transports=sorted(transports(text)),
                        bit_identical=all(lines(text, r) == lines(ref, r) for r in (0, 1)))
        assert info["JobState"] == "COMPLETED" and info.get("Restarts") == str(restarts), \
            (text[-3000:], self.cluster.restore_log(self.jobid))
        assert text.count("after srun rc=0") == 1, text[-3000:]
        for r in (0, 1):
            assert lines(text, r) == lines(ref, r), f"rank {r} differs"
        return text


def start(cluster, workdir: Path, launch: str, *sbatch_args) -> Run:
    out = workdir / f"job-{launch}.out"
    jobid = cluster.sbatch(job_script(workdir, launch), "--gpucr=on", "-o", str(out), *sbatch_args)
    run = Run(cluster, jobid, out, {"launch": launch, "steps": STEPS, "ballast_gib": BALLAST_GIB,
                                    "idle_mib": used_mib(), "jobid": jobid})
    cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: all(steps_of(out, r) >= 20 for r in (0, 1)), timeout=180, what="both ranks to step",
             detail=lambda: output_of(out)[-3000:])
    run.res["nodes_0"] = cluster.job(jobid).get("NodeList")
    run.res["gpus_0"] = busy_gpus(run.res["idle_mib"])
    return run


@pytest.mark.parametrize("launch", ["srun", "torchrun"])
def test_one_node_ddp_job_suspended_checkpointed_and_twice_preempted_runs_as_if_never_stopped(
        slurm_cluster, workdir, launch):
    if max(gpus_per_node(slurm_cluster).values(), default=0) < 2:
        pytest.skip("needs a node with 2 GPUs")
    ref = reference(ENV)
    run = start(slurm_cluster, workdir, launch, "-N1", "--ntasks=2" if launch == "srun" else "--ntasks=1",
                "--gres=gpu:2")
    try:
        for n in (1, 2):  # with the checkpoint and the two preemptions: five cycles
            run.timed(f"suspend_{n}", "suspend")
            run.res[f"suspended_{n}_mib"] = used_mib()
            assert all(u - i <= 64 for u, i in zip(run.res[f"suspended_{n}_mib"], run.res["idle_mib"])), run.res
            run.timed(f"resume_{n}", "resume")
            run.stepping(f"steps after resume {n}")
        run.timed("checkpoint", "checkpoint")
        run.stepping("steps after the checkpoint")
        for n in (1, 2):
            run.preempted_and_restored(n)
        text = run.finished(ref, restarts=2)
        assert "P2P" in transports(text), "NCCL's log shows no P2P transport"
    finally:
        (RESULTS / f"job-nccl-gpu-{launch}.json").write_text(json.dumps(run.res, indent=1))
        slurm_cluster.run("scancel", run.jobid, check=False)


def node_gpus(cluster) -> dict[str, list[int]]:
    """Which of the machine's GPUs each test-cluster node has; {} where every node has them all."""
    f = cluster.state / "etc" / "node-gpus.json"
    return json.loads(f.read_text()) if f.exists() else {}


def set_node(cluster, node: str, state: str) -> None:
    cluster.run("scontrol", "update", f"NodeName={node}", f"State={state}",
                *(["Reason=gpucr-test"] if state == "DRAIN" else []), check=False)


def test_two_host_ddp_job_over_net_is_restored_in_place_then_moved_to_another_node_and_gpu(slurm_cluster, workdir):
    gpus = node_gpus(slurm_cluster)
    if len(gpus) < 3 or not all(gpus.values()):
        pytest.skip("needs 3 nodes with GPUs of their own (GPUCR_TESTCLUSTER_GPUS=1,1,2 or 2,1,1)")
    first, second, third = list(gpus)[:3]
    # The job starts on the first two nodes and moves to the last two; a rank with
    # one GPU gets its node's first. Where nodes share the machine's GPUs (fewer
    # than four), the third node waits drained until the move.
    if gpus[first][0] == gpus[second][0] or gpus[second][0] == gpus[third][0]:
        pytest.skip(f"two of the nodes would run ranks on one GPU ({gpus}): GPUCR_TESTCLUSTER_GPUS=1,1,2 or 2,1,1")
    ref = reference(dict(ENV, **NET_ONLY))
    set_node(slurm_cluster, third, "DRAIN")
    drained = [third]
    run = None
    try:
        run = start(slurm_cluster, workdir, "two-hosts", "-N2", "--ntasks-per-node=1", "--gres=gpu:1")
        run.res["node_gpus"] = gpus
        run.preempted_and_restored(1)
        # rank 0 runs on the batch node, which has one GPU of the job's
        batch = slurm_cluster.job(run.jobid)["BatchHost"]
        run.res["rank0_gpu_1"] = gpus[batch][0]
        set_node(slurm_cluster, batch, "DRAIN")
        drained.append(batch)
        set_node(slurm_cluster, third, "RESUME")
        drained.remove(third)
        run.preempted_and_restored(2)
        moved_to = slurm_cluster.job(run.jobid)["BatchHost"]
        run.res["rank0_gpu_2"] = gpus[moved_to][0]
        nodes = slurm_cluster.run("scontrol", "show", "hostnames", run.res["nodes_2"]).stdout.split()
        assert batch not in nodes, run.res
        text = run.finished(ref, restarts=2)
        assert transports(text) == {"NET"}, f"NCCL used {transports(text)}, not NET only"
        assert all(len(run.res[f"gpus_{n}"]) == 2 for n in (0, 1, 2)), run.res
        assert run.res["rank0_gpu_1"] != run.res["rank0_gpu_2"], "rank 0 kept its GPU"
    finally:
        if run:
            (RESULTS / "job-nccl-gpu-two-hosts.json").write_text(json.dumps(run.res, indent=1))
            slurm_cluster.run("scancel", run.jobid, check=False)
        for node in drained:
            set_node(slurm_cluster, node, "RESUME")
