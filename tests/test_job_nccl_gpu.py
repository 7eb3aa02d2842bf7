"""A one-node, two-GPU PyTorch DDP job over NCCL (default transports) under real
Slurm: suspended and resumed, checkpointed, then preempted, requeued and
restored by CRIU, with its communicators torn down and rebuilt each time. Its
output must equal an uninterrupted torchrun of the same job bit for bit.
Marked gpu (needs 2 GPUs); figures go to $GPUCR_RESULTS_DIR/job-nccl-gpu.json."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from job_helpers import gpucr, output_of, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.slurm, pytest.mark.criu]

REPO = Path(__file__).resolve().parent.parent
DDP = REPO / "tests" / "shim_workloads" / "ddp_nccl.py"
STEPS, BALLAST_GIB, PACE = 120, 1.0, 0.05
ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_NVLS_ENABLE": "0"}
RESULTS = Path(os.environ.get("GPUCR_RESULTS_DIR") or "/tmp") / "job-nccl-gpu.json"

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)


def gpus() -> list[int]:
    r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []


def lines(text: str, rank: int) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(f"rank {rank} ")]


def steps_of(out: Path, rank: int) -> int:
    return sum(1 for ln in lines(output_of(out), rank) if " step " in ln)


def test_ddp_job_suspended_checkpointed_and_preempted_runs_as_if_never_stopped(slurm_cluster, workdir):
    if len(gpus()) < 2:
        pytest.skip("needs 2 GPUs")
    idle = gpus()
    ref = subprocess.run(["torchrun", "--standalone", "--nproc-per-node=2", str(DDP), str(STEPS), str(BALLAST_GIB),
                          "0"], capture_output=True, text=True, env=dict(os.environ, **ENV), timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    script = workdir / "ddp.sh"
    exports = " ".join(f"{k}={v}" for k, v in ENV.items())
    script.write_text(f"""#!/bin/bash
# an address, not a name: a lookup that has no DNS to ask can stall every store connect
export {exports} MASTER_PORT=29533
export MASTER_ADDR=$({sys.executable} -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')
[ -n "$MASTER_ADDR" ] || {{ echo "no address for $(hostname)"; exit 1; }}
srun --ntasks=2 --ntasks-per-node=2 {sys.executable} {DDP} {STEPS} {BALLAST_GIB} {PACE}
echo "after srun rc=$?"
""")
    out = workdir / "job.out"
    res: dict = {"steps": STEPS, "idle_mib": idle}
    jobid = slurm_cluster.sbatch(script, "--gpucr=on", "-N1", "--ntasks=2", "--gres=gpu:2", "-o", str(out))
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        running = lambda n: all(steps_of(out, r) >= n for r in (0, 1))  # noqa: E731
        wait_for(lambda: running(20), timeout=90, what="both ranks to step", detail=lambda: output_of(out)[-3000:])
        t = time.monotonic()
        gpucr(slurm_cluster, "suspend", jobid)
        res["suspend_s"] = time.monotonic() - t
        res["suspended_mib"] = gpus()
        assert all(u - i <= 64 for u, i in zip(res["suspended_mib"], idle)), res
        t = time.monotonic()
        gpucr(slurm_cluster, "resume", jobid)
        res["resume_s"] = time.monotonic() - t
        at = steps_of(out, 0)
        wait_for(lambda: running(at + 10), timeout=120, what="steps after resume", detail=lambda: output_of(out)[-3000:])
        t = time.monotonic()
        gpucr(slurm_cluster, "checkpoint", jobid)
        res["checkpoint_s"] = time.monotonic() - t
        at = steps_of(out, 0)
        wait_for(lambda: running(at + 10), timeout=120, what="steps after the checkpoint",
                 detail=lambda: output_of(out)[-3000:])
        t = time.monotonic()
        gpucr(slurm_cluster, "preempt", jobid)
        res["preempt_s"] = time.monotonic() - t
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1"
                 and slurm_cluster.job(jobid).get("JobState") == "RUNNING", timeout=300, what="the restore",
                 detail=lambda: slurm_cluster.restore_log(jobid))
        res["restored_s"] = time.monotonic() - t
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        text = output_of(out)
        res["state"] = info["JobState"]
        res["bit_identical"] = all(lines(text, r) == lines(ref.stdout, r) for r in (0, 1))
        RESULTS.write_text(json.dumps(res, indent=1))
        assert info["JobState"] == "COMPLETED", (text[-3000:], slurm_cluster.restore_log(jobid))
        for r in (0, 1):
            assert lines(text, r) == lines(ref.stdout, r), f"rank {r} differs"
    finally:
        RESULTS.write_text(json.dumps(res, indent=1))
        slurm_cluster.run("scancel", jobid, check=False)
