"""`gpucr-hpc doctor`: one line per check, FAIL with its fix, exit 1 on any FAIL.

Real checks on this machine (its CRIU, its install); the failures are made
real too: a CRIU that is not one, a `cli=` under a directory others cannot
enter, a plugstack without our line, nodes with different keys.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpucr_hpc.doctor import checks, nodes
from gpucr_hpc.slurm.site import Site
from gpucr_hpc.store import mounts


def doctor(*args, **env):
    return subprocess.run([sys.executable, "-m", "gpucr_hpc", "doctor", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_every_check_is_one_line_and_a_failure_exits_1_with_the_fix(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")  # no plugstack line of ours
    r = doctor(SLURM_CONF=str(conf), GPUCR_CRIU="/bin/true")
    lines = r.stdout.splitlines()
    assert r.returncode == 1
    assert all(": ok " in ln or ": FAIL " in ln or ": skip " in ln for ln in lines), lines
    criu = next(ln for ln in lines if " criu: " in ln)
    assert "FAIL" in criu and "install-deps" in criu  # the fix is on the line
    assert any("FAIL plugin:" in ln and "plugstack" in ln for ln in lines)
    assert len(r.stderr.strip().splitlines()) == 1 and "check(s) failed" in r.stderr


def test_json_is_one_document_also_when_checks_fail(tmp_path):
    """A failed check used to give one object per node and then main's error document:
    two documents, which json.loads refuses."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    r = doctor("--json", SLURM_CONF=str(conf), GPUCR_CRIU="/bin/true")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpucr-hpc.doctor/1" and len(doc["nodes"]) == 1
    rep = doc["nodes"][0]
    assert rep["node"] and {c["name"] for c in rep["checks"]} >= {"criu", "plugin", "nft", "pycriu"}
    assert all(set(c) == {"name", "ok", "detail", "fix"} for c in rep["checks"])
    assert len(r.stderr.strip().splitlines()) == 1 and "check(s) failed" in r.stderr


def test_checks_not_run_are_listed_as_skipped_with_the_reason(tmp_path):
    """Without our plugstack line, what that line names cannot be checked: each such check
    is there, skipped, saying why (they used to vanish)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    r = doctor("--json", SLURM_CONF=str(conf))
    got = {c["name"]: c for c in json.loads(r.stdout)["nodes"][0]["checks"]}
    for name in ("shim", "cli", "image root", "arena", "staging tier", "gpu feature"):
        assert got[name]["ok"] is None and "plugstack" in got[name]["detail"], got.get(name)
    for name in ("preempt mode", "grace time", "srun --mpi=pmix", "mpi4py", "gpu"):
        assert name in got, sorted(got)
    lines = doctor(SLURM_CONF=str(conf)).stdout.splitlines()
    assert any(": skip shim: not checked" in ln for ln in lines), lines


# /proc/driver/nvidia/version as the proprietary and the open kernel modules write it.
PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Oct 28 20:21:10 UTC 2025\n"
               "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n")
OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.127.05  Release Build  "
        "(dvs-builder@U16-I3-D12-3-1)  Wed Oct  9 20:05:18 UTC 2024\nGCC version:  gcc version 12.2.0\n")


def in_python(python: str, code: str) -> dict:
    """Run code with `checks` imported, in that Python (the repo on its path): its last line
    printed is a Check as JSON."""
    prog = f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent.parent)!r})\n" \
           f"from gpucr_hpc.doctor import checks\nc = {code}\nprint(json.dumps(c.as_dict()))"
    r = subprocess.run([python, "-I", "-c", prog], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_a_gpu_node_without_cuda_python_or_with_an_old_driver_fails_with_the_fix():
    assert checks.driver_of(PROPRIETARY) == "580.159.04" and checks.driver_of(OPEN) == "550.127.05"
    assert checks.driver_of("no module here") is None
    # A Python without cuda-python (the system's): the GPU node fails, naming the extra.
    no_cuda = shutil.which("python3", path="/usr/bin")
    if subprocess.run([no_cuda, "-I", "-c", "import cuda.bindings"], capture_output=True).returncode == 0:
        pytest.skip("the system Python has cuda-python")
    c = in_python(no_cuda, f"checks.gpu_node(checks.driver_of({PROPRIETARY!r}), checks.cuda_bindings())")
    assert c["ok"] is False and "cuda-python" in c["detail"] and "gpucr-hpc[nvidia]" in c["fix"], c
    # The venv (scripts/setup-venv installs the nvidia extra): the same driver passes.
    c = in_python(sys.executable, f"checks.gpu_node(checks.driver_of({PROPRIETARY!r}), checks.cuda_bindings())")
    assert c["ok"] is True and "580.159.04" in c["detail"] and "cuda-python" in c["detail"], c
    # A driver older than 580 fails whatever cuda-python there is.
    old = in_python(sys.executable, f"checks.gpu_node(checks.driver_of({OPEN!r}), checks.cuda_bindings())")
    assert old["ok"] is False and "550.127.05" in old["detail"] and "580" in old["fix"], old
    unread = checks.gpu_node(None, ("13.4.4", ""))
    assert unread.ok is False and "driver" in unread.fix


def test_multi_node_needs_mpi4py_where_it_runs():
    no_mpi = shutil.which("python3", path="/usr/bin")
    if subprocess.run([no_mpi, "-I", "-c", "import mpi4py"], capture_output=True).returncode == 0:
        pytest.skip("the system Python has mpi4py")
    # checks.mpi4py_loads imports mpi4py in the Python that runs the doctor.
    c = in_python(no_mpi, "checks.mpi4py_loads()")
    assert c["ok"] is False and "mpi4py" in c["detail"] and "gpucr-hpc[mpi]" in c["fix"], c
    assert in_python(sys.executable, "checks.mpi4py_loads()")["ok"] is True


def test_srun_mpi_list_is_read_in_both_slurm_layouts():
    v22 = "MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\nspecific pmix plugin versions " \
          "available: pmix_v4\n"
    assert checks.pmix_types(v22) == ["pmix", "none", "cray_shasta", "pmi2"]
    assert checks.pmix_types("MPI plugin types are...: cray_shasta,none,pmi2\n") == ["cray_shasta", "none", "pmi2"]


PREEMPTING = {"PreemptType": "preempt/partition_prio", "PreemptMode": "REQUEUE",
              "SlurmctldParameters": "preempt_send_user_signal"}


def test_preemption_settings_of_the_admin_guide():
    parts = {"debug": {"PartitionName": "debug", "GraceTime": "120", "PreemptMode": "REQUEUE"},
             "urgent": {"PartitionName": "urgent", "GraceTime": "0", "PreemptMode": "OFF"}}
    need = checks.checkpoint_estimate_s(80 * 2**30, 64 * 2**30)
    assert need == 10 + 78  # 144 GiB at 2 GB/s, and the fixed part
    mode, grace = checks.preempt_settings(PREEMPTING, parts, need, "est")
    assert mode.ok is True and grace.ok is True  # the admin guide's 120 s, an 80 GB GPU, 64 GiB
    big = checks.checkpoint_estimate_s(8 * 141 * 2**30, 2048 * 2**30)  # 8 H200s, 2 TiB host memory
    assert checks.preempt_settings(PREEMPTING, parts, big, "est")[1].ok is False
    mode, grace = checks.preempt_settings(PREEMPTING, parts, 60, "est")
    assert grace.ok is True and "debug GraceTime=120" in grace.detail and "urgent" not in grace.detail
    mode, grace = checks.preempt_settings(PREEMPTING, parts, 200, "est")
    assert grace.ok is False and "debug GraceTime=120" in grace.detail and "GraceTime=400" in grace.fix
    off = checks.preempt_settings({**PREEMPTING, "PreemptMode": "OFF"}, parts, 60, "est")[0]
    assert off.ok is False and "PreemptMode=REQUEUE" in off.fix
    none = checks.preempt_settings({**PREEMPTING, "PreemptType": "preempt/none"}, parts, 60, "est")[0]
    assert none.ok is False
    quiet = checks.preempt_settings({**PREEMPTING, "SlurmctldParameters": ""}, parts, 60, "est")[0]
    assert quiet.ok is False and "preempt_send_user_signal" in quiet.fix
    newer = checks.preempt_settings({**PREEMPTING, "SlurmctldParameters": "",
                                     "PreemptParameters": "send_user_signal"}, parts, 60, "est")[0]
    assert newer.ok is True
    only_off = checks.preempt_settings(PREEMPTING, {"urgent": parts["urgent"]}, 60, "est")[1]
    assert only_off.ok is None


@pytest.fixture
def open_dir():
    """A directory every user can enter (pytest's own tmp dirs are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="gpucr-doctor-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_cli_no_ordinary_user_can_reach_fails_naming_the_directory(open_dir):
    tmp_path = open_dir
    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    cli = home / "venv" / "bin" / "gpucr-hpc"
    cli.write_text("#!/bin/sh\n")
    cli.chmod(0o755)
    shim = tmp_path / "libgpucr-cuda.so"
    shim.write_text("")
    shim.chmod(0o644)
    home.chmod(0o700)  # a venv under a 0700 home: jobs of other users cannot exec it
    got = {c.name: c for c in checks.installed_files(Site(plugstack=None, shim=str(shim), cli=str(cli)))}
    assert got["shim"].ok is True
    assert got["cli"].ok is False and str(home) in got["cli"].detail and "0700" in got["cli"].fix
    home.chmod(0o755)
    got = {c.name: c for c in checks.installed_files(Site(plugstack=None, shim=str(shim), cli=str(cli)))}
    assert got["cli"].ok is True


def test_nodes_with_different_keys_are_one_failure():
    def rep(node, fp):
        return {"node": node, "checks": [{"name": "node key", "ok": True, "detail": f"fingerprint {fp} (...)",
                                          "fix": ""}]}
    assert nodes.key_mismatch([rep("n1", "aa"), rep("n2", "aa")]) is None
    bad = nodes.key_mismatch([rep("n1", "aa"), rep("n2", "bb")])
    assert bad is not None and bad.ok is False and "n1 aa, n2 bb" in bad.detail and "image.key" in bad.fix


def test_an_image_root_others_can_write_fails(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    root.chmod(0o777)
    c = checks.image_root(Site(plugstack=None, imageroot=str(root)))
    assert c.ok is False and "0777" in c.detail and "chmod 0755" in c.fix


def test_the_staging_tier_is_node_memory_that_only_root_writes(monkeypatch):
    """The plugin makes each job's dir in it, as root, for the job's user: a stage root
    users can write to (1777, as it used to be) lets them plant or swap those dirs."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert checks.stage(Site(plugstack=None)).ok is None
    root = Path(tempfile.mkdtemp(prefix="gpucr-doctor-stage-", dir="/dev/shm"))
    try:
        (root / "n1").mkdir()
        (root / "n1").chmod(0o755)
        good = checks.stage(Site(plugstack=None, stage=f"{root}/%n", stage_cap="25%"))
        if os.geteuid() == 0:
            assert good.ok is True and f"{root}/n1 on tmpfs" in good.detail and "stage_cap=25%" in good.detail
        for mode in (0o1777, 0o777, 0o775):
            (root / "n1").chmod(mode)
            opened = checks.stage(Site(plugstack=None, stage=f"{root}/%n"))
            assert opened.ok is False and f"{mode:04o}" in opened.detail and "chmod 0755" in opened.fix
        missing = checks.stage(Site(plugstack=None, stage=f"{root}/nowhere"))
        assert missing.ok is False and "mkdir -m 0755" in missing.fix
        (root / "n1").chmod(0o755)
        bad_cap = checks.stage(Site(plugstack=None, stage=f"{root}/n1", stage_cap="half"))
        assert bad_cap.ok is False and "stage_cap=" in bad_cap.detail
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_staging_tier_apart_from_the_arena_is_named_as_copying(monkeypatch, tmp_path):
    """A preemption keeps the arena's pages by linking its files into the stage: on
    another file system it copies them instead."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    if os.geteuid() != 0:
        pytest.skip("a stage root is root's")
    root = Path(tempfile.mkdtemp(prefix="gpucr-doctor-stage-", dir="/dev/shm"))
    try:
        (root / "n1").mkdir(mode=0o755)
        together = checks.stage(Site(plugstack=None, stage=f"{root}/%n", arena="/dev/shm"))
        apart = checks.stage(Site(plugstack=None, stage=f"{root}/%n", arena=str(tmp_path)))
        assert together.ok is True and "copies" not in together.detail
        if os.stat(tmp_path).st_dev == os.stat("/dev/shm").st_dev:
            pytest.skip("tmp_path is on /dev/shm's file system here")
        assert apart.ok is True and "another file system" in apart.detail and "copies" in apart.detail
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_staging_tier_on_hugetlbfs_fails_with_the_fix(monkeypatch, hugetlbfs_dir):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    (hugetlbfs_dir / "n1").mkdir(mode=0o755)
    c = checks.stage(Site(plugstack=None, stage=f"{hugetlbfs_dir}/%n"))
    assert c.ok is False and "hugetlbfs" in c.detail and "tmpfs" in c.fix


def test_node_memory_on_small_pages_is_named_with_the_mount_option_that_mends_it(monkeypatch, tmpfs_dir):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    small, huge = tmpfs_dir("size=64M"), tmpfs_dir("size=64M,huge=always")
    assert not mounts.huge_pages(small) and mounts.huge_pages(huge)
    for root in (small, huge):
        (root / "n1").mkdir(mode=0o755)
    on_small = checks.stage(Site(plugstack=None, stage=f"{small}/%n"))
    on_huge = checks.stage(Site(plugstack=None, stage=f"{huge}/%n"))
    assert on_small.ok is True and "huge=always" in on_small.detail
    assert on_huge.ok is True and "huge=always" not in on_huge.detail
    assert "huge=always" in checks.arena(Site(plugstack=None, arena=str(small))).detail
    assert "huge=always" not in checks.arena(Site(plugstack=None, arena=str(huge))).detail


def test_a_staging_tier_on_a_disk_is_named_as_such(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a stage root is root's")
    (tmp_path / "stage").mkdir(mode=0o755)
    c = checks.stage(Site(plugstack=None, stage=str(tmp_path / "stage")))
    kind = checks.fs_type(tmp_path)
    assert c.ok is True
    assert ("not node memory" in c.detail) == (kind not in checks.MEMORY_FS), (kind, c.detail)


def test_a_gpu_node_without_the_sites_gpu_feature_fails():
    site = ["gpu_h100", "gpu_a100"]
    ok = checks.gpu_features(["NVIDIA H100 80GB HBM3"], "n1", {"gpu_h100", "ib"}, site)
    assert ok.ok is True and "gpu_h100" in ok.detail
    bad = checks.gpu_features(["NVIDIA H200"], "n2", {"ib"}, site)
    assert bad.ok is False and "n2 has NVIDIA H200" in bad.detail and "Features=" in bad.fix
    assert checks.gpu_features(["NVIDIA H200"], "n2", set(), []).ok is None


def test_reports_split_by_srun_into_labelled_pieces_are_joined_again():
    """srun sends at most 1024 bytes of a task's output at a time and, with --label,
    ends each piece as a line of its own, interleaved with other tasks' pieces."""
    import json

    from gpucr_hpc.doctor.nodes import reports_of

    reports = [json.dumps({"node": f"n{i}", "checks": [{"detail": "x" * 1500}]}) for i in (1, 2)]
    pieces = {i: [r[k:k + 1024] for k in range(0, len(r), 1024)] for i, r in enumerate(reports)}
    lines = [f"{task}: {pieces[task][k]}" for k in range(2) for task in (1, 0)]
    got = reports_of("\n".join(lines + ["srun: a note of srun's own"]) + "\n")
    assert sorted(r["node"] for r in got) == ["n1", "n2"]
