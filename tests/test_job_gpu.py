"""A single-node GPU job under real Slurm: checkpoint -> requeue -> restore.

On a GPU machine (marked gpu; the test cluster gives its nodes the real GPUs as
GRES): a `sbatch --gpucr=on --gres=gpu:1` job trains a deterministic PyTorch
model (tests/shim_workloads/train_torch.py: one line per step with its loss,
then a checksum of the parameters). It is preempted mid-run, requeued and
restored, and its output must equal an uninterrupted run's bit for bit: no step
repeated or skipped, same losses, same checksum. While the job waits, the GPU
is back to its idle memory. Once with `gpucr-hpc preempt JOBID`, once preempted
by an urgent job (no gpucr-hpc command at all), once with the site's fast path
(the copy helper and the arena made ahead) in plugstack.conf. Figures go to
$GPUCR_RESULTS_DIR/job-gpu-slurm.json (gpu-checks/device-gpu-slurm).
"""

import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from job_helpers import drain_cli, gpucr, node_memory_stage, plugstack_args, wait_for
from user_helpers import as_user, gpucr_as, owned_dir

pytestmark = [pytest.mark.gpu, pytest.mark.slurm, pytest.mark.criu]

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "tests" / "shim_workloads" / "train_torch.py"
STEPS, BALLAST_GIB, PACE, AT = 400, 2.0, 0.08, 40  # steps: three preemptions and a drain beside
ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # deterministic cuBLAS, as the reference
RESULTS = Path(os.environ.get("GPUCR_RESULTS_DIR") or "/tmp") / "job-gpu-slurm.json"

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)


def smi(*query) -> list[str]:
    r = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(query)}", "--format=csv,noheader,nounits",
                        "-i", "0"], capture_output=True, text=True, timeout=60)
    return [x.strip() for x in r.stdout.strip().split(",")]


class VramSampler:
    """GPU 0's memory in use, every 100 ms (nvidia-smi's own loop), with the time."""

    def __init__(self):
        self.samples: list[tuple[float, int]] = []
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-i", "0", "-lms", "100"], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.samples.append((time.monotonic(), int(line)))

    def between(self, t0, t1) -> list[int]:
        return [v for t, v in self.samples if t0 <= t <= t1]

    def last_before(self, t) -> int | None:
        got = [v for ts, v in self.samples if ts <= t]
        return got[-1] if got else None

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class RegistryWatch:
    """Every change of the job's task records (tasks/<step>.<rank> in each node's run
    dir), every 20 ms, with the time and the recorded process's command line: which
    process the next checkpoint will find where."""

    def __init__(self, cluster, jobid: str):
        self.root, self.jobid, self.t0 = Path(cluster.state, "run"), jobid, time.monotonic()
        self.changes: list[dict] = []
        self.done = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self):
        seen: dict[str, str] = {}
        while not self.done.wait(0.02):
            now: dict[str, str] = {}
            for f in self.root.glob(f"*/{self.jobid}/tasks/*"):
                try:
                    now[str(f.relative_to(self.root))] = f.read_text()
                except OSError:
                    continue
            for name in seen.keys() | now.keys():
                if seen.get(name) != now.get(name):
                    self.changes.append({"t": round(time.monotonic() - self.t0, 3), "record": name,
                                         "text": now.get(name), "cmdline": self._cmdline(now.get(name))})
            seen = now

    @staticmethod
    def _cmdline(text: str | None) -> str | None:
        pid = dict(ln.split("=", 1) for ln in (text or "").splitlines() if "=" in ln).get("pid")
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
        except (OSError, TypeError):
            return None

    def stop(self) -> list[dict]:
        self.done.set()
        return self.changes


def lines(path: Path) -> list[str]:
    text = path.read_text(errors="replace") if path.exists() else ""
    return [ln for ln in text.splitlines() if ln.startswith(("step ", "checksum "))]


def steps(path: Path) -> int:
    return sum(1 for ln in lines(path) if ln.startswith("step "))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("reference") / "train.out"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    t = time.monotonic()
    with open(out, "w") as f:
        r = subprocess.run([sys.executable, str(TRAIN), str(STEPS), str(BALLAST_GIB), str(PACE)],
                           stdout=f, stderr=subprocess.PIPE, text=True, env={**env, **ENV}, timeout=600)
    got = lines(out)
    assert r.returncode == 0 and len(got) == STEPS + 1, r.stderr[-2000:]
    return {"lines": got, "seconds": round(time.monotonic() - t, 2)}


def submit(cluster, workdir: Path, user=None, program: Path = TRAIN, steps: int = STEPS,
           env: dict | None = None) -> tuple[str, Path, Path]:
    """The training job, submitted by root or by `user` (then workdir is theirs)."""
    train_out, job_out = workdir / "train.out", workdir / "job.out"
    script = workdir / "job.sh"
    exports = "".join(f"export {k}={v}\n" for k, v in {**ENV, **(env or {})}.items())
    script.write_text(f"""#!/bin/bash
echo "start restart=${{SLURM_RESTART_COUNT:-0}} gpus=$CUDA_VISIBLE_DEVICES uid=$(id -u)"
{exports}{sys.executable} {program} {steps} {BALLAST_GIB} {PACE} >{train_out}
echo "after python rc=$?"
""")
    args = ("--gpucr=on", "--gres=gpu:1", "-o", str(job_out))
    if user is None:
        return cluster.sbatch(script, *args), train_out, job_out
    r = as_user(user, "sbatch", "--parsable", *args, str(script), env=cluster.env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0], train_out, job_out


def restore_log(cluster, jobid) -> str:
    p = cluster.state / "images" / jobid / "restore.log"
    return p.read_text() if p.exists() else ""


def follow_restart(cluster, jobid, train_out, vram, t_preempt, figures):
    """Requeue, restart, restore, completion: each with its time since t_preempt."""
    wait_for(lambda: cluster.job(jobid).get("Restarts") == "1", timeout=120, what="the requeue")
    figures["requeued_after_s"] = round(time.monotonic() - t_preempt, 2)
    cluster.wait_state(jobid, "RUNNING", timeout=180)
    t_running = time.monotonic()
    figures["running_again_after_s"] = round(t_running - t_preempt, 2)
    wait_for(lambda: "tree restored" in restore_log(cluster, jobid), timeout=180, what="the restore")
    t_restored = time.monotonic()
    figures["restored_after_s"] = round(t_restored - t_preempt, 2)
    m = re.search(r"tree restored in ([0-9.]+) s (\{.*\})", restore_log(cluster, jobid))
    if m:
        figures["restore_s"] = float(m.group(1))
        figures["restore_timings"] = json.loads(m.group(2))
    at = steps(train_out)
    wait_for(lambda: steps(train_out) > at, timeout=120, what="the restored job to train on")
    figures["training_again_after_s"] = round(time.monotonic() - t_preempt, 2)
    # The GPU while no process of the job held it: from the checkpoint's end to the restore.
    idle = vram.between(t_preempt + figures.get("preempt_cli_s", 0), t_running)
    figures["vram_min_mib_while_requeued"] = min(idle) if idle else None
    figures["vram_mib_after_restore"] = vram.last_before(time.monotonic())
    info = cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    return info


def check_job(info, job_out: Path, train_out: Path, reference, figures):
    text = job_out.read_text()
    got = lines(train_out)
    figures["bit_identical"] = got == reference["lines"]
    figures["steps_once"] = [ln.split()[1] for ln in got if ln.startswith("step ")] == \
        [str(i) for i in range(len(reference["lines"]) - 1)]
    assert info["JobState"] == "COMPLETED", (text, info)
    assert info["Restarts"] == "1", info
    assert text.count("start restart=0") == 1 and "start restart=1" not in text, text
    assert text.count("after python rc=0") == 1, text
    assert figures["steps_once"], "a training step was repeated or skipped"
    if not figures["bit_identical"]:
        first = next((i for i, (a, b) in enumerate(zip(reference["lines"], got)) if a != b), None)
        pytest.fail(f"output differs from the uninterrupted run at line {first}: "
                    f"{got[first] if first is not None else len(got)} vs "
                    f"{reference['lines'][first] if first is not None else len(reference['lines'])}")


def record(name: str, figures: dict, reference) -> None:
    res = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    name_, driver = smi("name", "driver_version")
    import torch

    res.update({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "device": name_, "driver": driver, "torch": torch.__version__,
                "workload": {"script": "tests/shim_workloads/train_torch.py", "steps": STEPS,
                             "ballast_gib": BALLAST_GIB, "pace_s": PACE, "preempt_at_step": AT},
                "reference_s": reference["seconds"], name: figures})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")


def preempt_figures(result: dict) -> dict:
    """What the checkpoint took, from the agents' report."""
    units = [u for r in result.get("node_reports", []) for u in r.get("units", [])]
    return {"generation": result.get("generation"), "image_bytes": result.get("bytes"),
            "checkpoint_prepare_s": round(result.get("prepare_s", 0), 3),
            "checkpoint_total_s": round(result.get("total_s", 0), 3),
            "requeue_s": round(result.get("requeue_s", 0), 3),
            "units": {u["name"]: {k: round(v, 3) for k, v in u["timings"].items() if k.endswith(("_s", "MBps"))}
                      for u in units if "timings" in u},
            "arena_copied": {u["name"]: u["arena_copied"] for u in units if u.get("arena_copied")}}


def shim_status(cluster, jobid) -> list[dict]:
    """`gpucr-hpc status` of the job's shimmed processes, from their node run dirs
    (each node's run dir is kept under the cluster's state, scripts/testcluster)."""
    rows = []
    for d in Path(cluster.state, "run").glob(f"*/{jobid}"):
        r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "status", "--run-dir", str(d), "--json"],
                           capture_output=True, text=True, env=cluster.env, timeout=60)
        rows += json.loads(r.stdout)["processes"] if r.returncode == 0 else []
    return rows


def fast_path_ready(rows: list[dict]) -> bool:
    """A GPU process's arena holds its footprint and the copy helper pinned it all."""
    return any(st.get("ok") and st.get("gpu_bytes", 0) > 0 and st.get("arena_bytes", 0) >= st["gpu_bytes"]
               and st.get("helper_segments") == st.get("arena_segments") for st in rows)


def data_paths(cluster, jobid) -> list[str]:
    """How each CUDA process's data left the GPU, from the checkpoint manifests."""
    out = []
    for m in Path(cluster.state, "images", jobid).glob("gen-*/**/manifest.json"):
        for p in json.loads(m.read_text()).get("gpu_processes", []):
            if p.get("cuda"):
                out.append(p.get("data_path"))
    return out


def preempted_by_owner(cluster, workdir, reference, user=None, name="preempt", fast_path=False, **job):
    """The job's owner (root, or an ordinary user) preempts it with gpucr-hpc.
    fast_path: the preemption waits until the arena and the helper are ready;
    job: submit's program, steps and env."""
    idle = int(smi("memory.used")[0])
    jobid, train_out, job_out = submit(cluster, workdir, user, **job)
    vram = VramSampler()
    figures: dict = {"job": jobid, "vram_mib_idle": idle, "user": user.pw_name if user else "root"}
    try:
        cluster.wait_state(jobid, "RUNNING", timeout=60)
        wait_for(lambda: steps(train_out) >= AT, timeout=180, what=f"step {AT}")
        if fast_path:
            t, seen = time.monotonic(), []

            def ready():
                seen[:] = shim_status(cluster, jobid)
                return fast_path_ready(seen)

            wait_for(ready, timeout=120, what="the arena and the copy helper", detail=lambda: seen)
            figures["fast_path_ready_wait_s"] = round(time.monotonic() - t, 2)
            figures["shim_status"] = [{k: st.get(k) for k in ("gpu_bytes", "arena_bytes", "arena_segments",
                                                               "helper_segments", "arena_prealloc", "copy_helper")}
                                      for st in seen if st.get("gpu_bytes")]
        figures["vram_mib_before"] = vram.last_before(time.monotonic())
        t0 = time.monotonic()
        if user is None:
            r = gpucr(cluster, "preempt", jobid, "--json")
        else:
            r = gpucr_as(user, "preempt", jobid, "--json", env=cluster.env)
            assert r.returncode == 0, r.stderr
        figures["preempt_cli_s"] = round(time.monotonic() - t0, 2)
        figures.update(preempt_figures(json.loads(r.stdout)))
        during = vram.between(t0, t0 + figures["preempt_cli_s"])
        figures["vram_min_mib_during_checkpoint"] = min(during) if during else None
        info = follow_restart(cluster, jobid, train_out, vram, t0, figures)
    finally:
        vram.stop()
        figures["restore_log"] = restore_log(cluster, jobid).splitlines()[-6:]
        record(name, figures, reference)
    check_job(info, job_out, train_out, reference, figures)
    record(name, figures, reference)
    assert figures["vram_min_mib_while_requeued"] is not None
    assert figures["vram_min_mib_while_requeued"] <= idle + 64, \
        f"GPU memory not yielded while the job waited: {figures['vram_min_mib_while_requeued']} MiB"
    return jobid, job_out


def test_gpu_job_preempted_requeued_restored_bit_identical(slurm_cluster, workdir, reference):
    preempted_by_owner(slurm_cluster, workdir, reference)


FRAMEWORK_STEPS = 150


@pytest.mark.parametrize("program,mode", [("triton_loop.py", None), ("compile_loop.py", "default"),
                                          ("compile_loop.py", "reduce-overhead")],
                         ids=["triton", "torch_compile", "torch_compile_reduce_overhead"])
def test_framework_job_preempted_requeued_restored_bit_identical(slurm_cluster, workdir, tmp_path, program, mode):
    """A Triton program launching through Triton's own launcher, and torch.compile
    in both modes, preempted under Slurm: yielded, dumped, requeued, restored,
    and its output is the uninterrupted run's."""
    pytest.importorskip("triton")
    path = REPO / "tests" / "shim_workloads" / program
    env = {"COMPILE_MODE": mode} if mode else {}
    out = tmp_path / "reference.out"
    with open(out, "w") as f:
        r = subprocess.run([sys.executable, str(path), str(FRAMEWORK_STEPS), str(BALLAST_GIB), str(PACE)],
                           stdout=f, stderr=subprocess.PIPE, text=True, timeout=600,
                           env={**{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, **ENV, **env})
    assert r.returncode == 0, r.stderr[-2000:]
    reference = {"lines": lines(out), "seconds": None}
    preempted_by_owner(slurm_cluster, workdir, reference, name=f"preempt_{program.split('.')[0]}_{mode or 'triton'}",
                       program=path, steps=FRAMEWORK_STEPS, env=env)


def test_gpu_job_with_the_site_fast_path(slurm_cluster, workdir, reference):
    """The site's fast path (plugstack copy_helper=on arena_prealloc=auto): the
    job's shim starts the node's copy helper and grows the arena ahead; the
    preemption's checkpoint moves the GPU data through the helper; while the job
    waits the helper is gone with the job's run dir (the GPU back to idle, checked
    in preempted_by_owner); the restored job's output is bit-identical."""
    with plugstack_args(slurm_cluster, "copy_helper=on arena_prealloc=auto"):
        jobid, _ = preempted_by_owner(slurm_cluster, workdir, reference, name="fast_path", fast_path=True)
    paths = data_paths(slurm_cluster, jobid)
    assert paths and set(paths) == {"helper"}, paths


def test_ordinary_users_gpu_job_preempted_requeued_restored(slurm_cluster, users, users_tmp, reference):
    """The same flow as an ordinary user: their job, their gpucr-hpc preempt, CRIU
    through the root helper; the images are theirs alone."""
    a = users[0]
    jobid, job_out = preempted_by_owner(slurm_cluster, owned_dir(users_tmp / "job", a), reference,
                                        user=a, name="user_preempt")
    assert f"uid={a.pw_uid}" in job_out.read_text()
    images = Path(slurm_cluster.state) / "images" / jobid
    assert images.stat().st_uid == a.pw_uid and images.stat().st_mode & 0o077 == 0


def test_gpu_job_preempted_by_urgent_job(slurm_cluster, workdir, reference):
    """No gpucr-hpc command: an urgent job on the node preempts it; the warning
    signal makes the job checkpoint and requeue itself within the grace time."""
    idle = int(smi("memory.used")[0])
    jobid, train_out, job_out = submit(slurm_cluster, workdir)
    vram = VramSampler()
    figures: dict = {"job": jobid, "vram_mib_idle": idle}
    try:
        info = slurm_cluster.wait_state(jobid, "RUNNING", timeout=60)
        wait_for(lambda: steps(train_out) >= AT, timeout=180, what=f"step {AT}")
        figures["vram_mib_before"] = vram.last_before(time.monotonic())
        urgent_sh = workdir / "urgent.sh"
        urgent_sh.write_text("#!/bin/bash\nsleep 3\necho urgent done\n")
        t0 = time.monotonic()
        urgent = slurm_cluster.sbatch(urgent_sh, "-p", "urgent", "-w", info["NodeList"], "--gres=gpu:1",
                                      "--exclusive", "-o", str(workdir / "urgent.out"))
        info = follow_restart(slurm_cluster, jobid, train_out, vram, t0, figures)
        slurm_cluster.wait_state(urgent, "COMPLETED", timeout=120)
    finally:
        vram.stop()
        figures["restore_log"] = restore_log(slurm_cluster, jobid).splitlines()[-6:]
        record("urgent", figures, reference)
    check_job(info, job_out, train_out, reference, figures)
    record("urgent", figures, reference)
    assert f"gpucr: checkpointing job {jobid} before preemption" in job_out.read_text()
    assert figures["vram_min_mib_while_requeued"] is not None
    assert figures["vram_min_mib_while_requeued"] <= idle + 64, figures["vram_min_mib_while_requeued"]
    assert "urgent done" in (workdir / "urgent.out").read_text()


@pytest.mark.parametrize("tier", ["direct", "staged"])
def test_gpu_job_through_three_preemptions_bit_identical(slurm_cluster, workdir, reference, tier):
    """A restored GPU job is a job like any other: checkpointed in place, preempted and
    restored again, three times; every step once and the output bit-identical.
    staged: each preemption leaves the arena's own files in node memory and the job,
    back on its node before the (late) drain, maps them as its arena; the checkpoint
    in place and the next preemption must not write into them while the drain reads."""
    if tier == "direct":
        three_preemptions(slurm_cluster, workdir, reference, "three_preemptions")
        return
    late = drain_cli(slurm_cluster, "late-drain-gpu", "sleep 20")
    with node_memory_stage(slurm_cluster, f"cli={late}"):
        jobid = three_preemptions(slurm_cluster, workdir, reference, "three_preemptions_staged")
    said = restore_log(slurm_cluster, jobid)
    assert said.count("read from node memory") == 3 and said.count('"gpu_arenas_kept": 1') == 3, said


def three_preemptions(slurm_cluster, workdir, reference, name: str) -> str:
    jobid, train_out, job_out = submit(slurm_cluster, workdir)
    figures: dict = {"job": jobid, "cycles": []}
    registry = RegistryWatch(slurm_cluster, jobid)
    try:
        slurm_cluster.wait_state(jobid, "RUNNING", timeout=60)
        wait_for(lambda: steps(train_out) >= AT, timeout=180, what=f"step {AT}")
        for cycle in range(1, 4):
            at = steps(train_out)
            t0 = time.monotonic()
            pre = json.loads(gpucr(slurm_cluster, "preempt", jobid, "--json").stdout)
            row = {"cycle": cycle, "at_step": at, "preempt_cli_s": round(time.monotonic() - t0, 2),
                   **preempt_figures(pre)}
            wait_for(lambda c=cycle: slurm_cluster.job(jobid).get("Restarts") == str(c)
                     and slurm_cluster.job(jobid).get("JobState") == "RUNNING",
                     timeout=180, what=f"restart {cycle}", detail=lambda: restore_log(slurm_cluster, jobid))
            # The output is rewound to the dump, which came steps after `at`: count from the restore.
            wait_for(lambda c=cycle: restore_log(slurm_cluster, jobid).count("tree restored") >= c,
                     timeout=180, what=f"restore {cycle}", detail=lambda: restore_log(slurm_cluster, jobid))
            back = steps(train_out)
            wait_for(lambda b=back: steps(train_out) > b + 5, timeout=180, what=f"training after restore {cycle}",
                     detail=lambda: restore_log(slurm_cluster, jobid))
            row["training_again_after_s"] = round(time.monotonic() - t0, 2)
            t1 = time.monotonic()
            ck = gpucr(slurm_cluster, "checkpoint", jobid, "--json", check=False)
            assert ck.returncode == 0, (cycle, ck.stderr)
            row["checkpoint_in_place_cli_s"] = round(time.monotonic() - t1, 2)
            figures["cycles"].append(row)
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    finally:
        figures["task_registry"] = registry.stop()
        figures["restore_log"] = restore_log(slurm_cluster, jobid).splitlines()[-12:]
        record(name, figures, reference)
    got = lines(train_out)
    figures["bit_identical"] = got == reference["lines"]
    record(name, figures, reference)
    text = job_out.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "3", (text, info)
    assert text.count("start restart=0") == 1 and text.count("after python rc=0") == 1, text
    assert figures["bit_identical"], "the output differs from the uninterrupted run"
    return jobid
