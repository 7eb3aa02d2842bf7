"""The staging tier without Slurm: what a site's stage_cap= allows, and a node's
drain of a staged generation (gpucr_hpc.job.storage.drain) on real image files: the
generation committed once every node holding units of it has drained, or,
when a drain fails, the reason recorded and the previous committed generation
the one a start restores (generations.await_drain)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import events, generations, restore_log
from gpucr_hpc.job import lock as job_lock
from gpucr_hpc.job.restore import batch_restore, unit_source
from gpucr_hpc.job.storage import drain, staging
from gpucr_hpc.slurm.site import load_site
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import manifest as mf

SUBMISSION = "test:0:abc"


@pytest.mark.parametrize("cap, fs, want", [
    ("50%", 1000, 500), ("100%", 1000, 1000), ("250%", 1000, 1000), ("64G", 0, 64 << 30),
    ("1.5M", 0, 3 << 19), ("4096", 0, 4096), ("2t", 0, 2 << 40)])
def test_stage_cap_is_a_share_or_a_size(cap, fs, want):
    assert staging.cap_bytes(cap, fs) == want


@pytest.mark.parametrize("cap", ["", "half", "-5%", "64GB", "5 G", "%"])
def test_a_stage_cap_that_is_neither_is_one_line_naming_the_setting(cap):
    with pytest.raises(GpucrError, match="stage_cap=") as e:
        staging.cap_bytes(cap, 1000)
    assert "\n" not in e.value.one_line()


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site whose plugstack.conf has a staging tier, as an admin writes it."""
    (tmp_path / "images").mkdir()
    for node in ("n1", "n2"):  # made by the admin on each node: root's, 0755
        (tmp_path / "stage" / node).mkdir(parents=True, mode=0o755)
    (tmp_path / "slurm.conf").write_text("ClusterName=t\nSlurmctldHost=localhost\n")  # for scontrol hostnames
    (tmp_path / "plugstack.conf").write_text(
        f"optional /usr/local/lib/gpucr/spank_gpucr.so imageroot={tmp_path / 'images'} "
        f"stage={tmp_path / 'stage'}/%n stage_cap=50%\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    for var in ("GPUCR_IMAGE_ROOT", "GPUCR_FAULTS"):
        monkeypatch.delenv(var, raising=False)
    return load_site()


def test_the_budget_takes_units_until_the_cap(site):
    st = os.statvfs(Path(site.stage.replace("%n", "n1")))
    (Path(site.stage.replace("%n", "n1")) / "7").mkdir(mode=0o700)  # as the plugin makes it
    budget = staging.Budget(site, "7")
    assert budget.dir == Path(site.stage.replace("%n", "n1")) / "7"
    half = st.f_blocks * st.f_frsize // 2
    assert budget.left <= half
    assert budget.take(1 << 20)
    left = budget.left
    assert not budget.take(left + 1) and budget.take(left) and budget.left == 0



def test_what_a_stage_holds_is_its_files_memory_not_their_sizes(tmp_path):
    """A .h5 file's metadata staged beside the arena's own files has the whole file's
    size and holes for its data: counted by size, the GPU data counted twice."""
    (tmp_path / "7" / "gen-1").mkdir(parents=True)
    with open(tmp_path / "7" / "gen-1" / "process-1.layout.h5", "wb") as f:
        f.write(b"m" * 4096)
        f.truncate(64 << 20)
    (tmp_path / "7" / "gen-1" / "0").write_bytes(b"d" * (1 << 20))
    assert (1 << 20) + 4096 <= staging.used_bytes(tmp_path) < 2 << 20


HOLDS = r"""
import mmap, os, sys
shm = open(sys.argv[1], "w+b"); shm.truncate(64 << 20)
shared = mmap.mmap(shm.fileno(), 64 << 20); shared.write(b"s" * (64 << 20))
anon = bytearray(b"a" * (32 << 20))  # private (an anonymous mmap is shared memory)
print("ready", flush=True); sys.stdin.readline()
"""


def test_an_image_is_estimated_from_shared_and_anonymous_memory_not_libraries(tmp_path):
    """A process with 64 MiB of /dev/shm (like an arena) and 32 MiB of its own memory:
    its image is counted as the shared bytes plus the anonymous ones with the margin,
    not as its whole resident memory (which holds its libraries' pages too)."""
    shm = Path(tempfile.mkdtemp(prefix="gpucr-test-", dir="/dev/shm"))
    p = subprocess.Popen([sys.executable, "-c", HOLDS, str(shm / "seg")], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        est = staging.image_bytes([p.pid])
        assert 64 << 20 <= est - int((32 << 20) * staging.MARGIN) < (64 << 20) + (24 << 20)  # + the interpreter's own
        assert est < criu_mod.rss_bytes([p.pid]) * staging.MARGIN
        assert staging.image_bytes([p.pid, 999_999_999]) == est  # a process gone counts nothing
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(shm, ignore_errors=True)


def unit_image(path: Path, mib: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / f"{path.name}.src"
    src.write_bytes(os.urandom(mib << 20))
    w = image_store.ImageWriter(path, mf.new_manifest(kind="process", vendor=None, gpu=None))
    w.add_copy(src, "criu/pages-1.img")
    w.commit()
    src.unlink()


def job_generation(site, jobid: str, n: int, staged_on: dict[str, str]) -> Path:
    """gen-N of the job as the agents leave it: units on the image root, or staged in
    their node's memory (staged_on: unit -> node), committed or STAGED."""
    job_dir = Path(site.imageroot) / jobid
    job_dir.mkdir(exist_ok=True, mode=0o700)
    gen_dir = job_dir / generations.gen_name(n)
    gen_dir.mkdir(mode=0o700)
    units = {}
    for name, node in staged_on.items():
        where = (staging.job_stage(site, jobid, node) / gen_dir.name) if node else gen_dir
        unit_image(where / name)
        units[name] = {"name": name, "node": node or "n1", "bytes": 2 << 20, **({"staged": True} if node else {}),
                       **({"rank": int(name.rsplit(".", 1)[1])} if name.startswith("rank-") else {})}
    m = mf.new_manifest(kind="job", vendor=None, gpu=None)
    m.update(units=units, submission=SUBMISSION, owner_uid=os.geteuid(), job={"id": int(jobid)},
             nodes=sorted({u["node"] for u in units.values()}))
    if generations.staged_nodes(m):
        generations.stage_generation(gen_dir, m)
    else:
        generations.commit_generation(gen_dir, m)
    return gen_dir


def drain_with_fault(jobid: str) -> subprocess.CompletedProcess:
    """`gpucr-hpc drain JOBID` as the epilog starts it, its drain made to fail."""
    if os.geteuid() != 0:
        pytest.skip("gpucr-hpc drain runs as root")
    return subprocess.run([sys.executable, "-m", "gpucr_hpc", "drain", jobid], capture_output=True, text=True,
                          env=dict(os.environ, GPUCR_FAULTS="drain_fails"))


def test_a_staged_generation_is_committed_by_the_last_node_to_drain(site, monkeypatch):
    gen = job_generation(site, "7", 2, {"rank-0.0": "n1", "rank-0.1": "n2"})
    job_dir = gen.parent
    assert generations.is_staged(gen) and generations.read_pointer(job_dir, generations.LATEST) == gen
    assert drain.drain_job("7") == []
    assert not (gen / mf.COMMITTED).exists(), "n2's units are still in its memory"
    assert not list(staging.job_stage(site, "7", "n1").iterdir()), "n1's memory is given back"
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    assert drain.drain_job("7") == []
    assert (gen / mf.COMMITTED).exists() and not generations.is_staged(gen)
    for unit in ("rank-0.0", "rank-0.1"):
        image_store.open_image(gen / unit)
    assert mf.load(gen) == generations.manifest_of(gen)
    assert "drained" in (job_dir / "restore.log").read_text()
    assert generations.await_drain(job_dir, SUBMISSION, timeout_s=1) == "gen-2 is drained to the image root"
    assert generations.start_target(job_dir, SUBMISSION, None) == gen


def test_a_failed_drain_says_why_and_the_previous_generation_is_restored(site):
    earlier = job_generation(site, "8", 1, {"rank-0.0": ""})
    gen = job_generation(site, "8", 2, {"rank-0.0": "n1"})
    job_dir = gen.parent
    r = drain_with_fault("8")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "injected" in lines[0], r.stderr
    assert not (gen / mf.COMMITTED).exists() and not generations.is_staged(gen)
    assert "injected" in generations.drain_failure(gen)
    assert generations.read_pointer(job_dir, generations.LATEST) == earlier
    assert "restores gen-1 instead" in (job_dir / "restore.log").read_text()
    story = events.read(job_dir)
    assert story[-1]["what"] == "drain" and not story[-1]["ok"] and "gen-1" in story[-1]["error"]
    assert not list(staging.job_stage(site, "8", "n1").iterdir()), "node memory is given back either way"
    assert generations.start_target(job_dir, SUBMISSION, None) == earlier


def test_a_failed_drain_with_no_earlier_checkpoint_leaves_nothing_to_restore(site):
    gen = job_generation(site, "9", 1, {"rank-0.0": "n1"})
    assert drain_with_fault("9").returncode != 0
    assert generations.read_pointer(gen.parent, generations.LATEST) is None
    with pytest.raises(GpucrError, match="no committed checkpoint") as e:
        generations.start_target(gen.parent, SUBMISSION, None)
    # checkpointed, and lost: the job is held, never run from the top on its own
    assert isinstance(e.value, generations.LostCheckpoint) and "injected" in e.value.cause
    assert e.value.then == "scancel 9, submit it again"


def test_a_start_waits_for_a_drain_no_longer_than_it_is_told(site):
    gen = job_generation(site, "10", 1, {"rank-0.0": "n1"})
    with pytest.raises(GpucrError, match="still being drained") as e:
        generations.await_drain(gen.parent, SUBMISSION, timeout_s=0.3, poll_s=0.05)
    assert "gpucr-hpc restore 10" in e.value.one_line()
    assert generations.is_staged(gen)


def test_a_staged_generation_is_kept_by_prune(site):
    from gpucr_hpc.job.storage import retention

    gen = job_generation(site, "11", 1, {"rank-0.0": "n1"})
    actions = retention.prune_job(gen.parent, keep=1, states=None, dry_run=False)
    assert gen.exists()
    assert [a.action for a in actions if a.generation == gen.name] == ["kept"]
    assert json.loads((gen / mf.MANIFEST).read_text())["units"]["rank-0.0"]["staged"]


def test_a_restore_on_the_staging_node_reads_node_memory_and_the_drain_waits_for_it(site):
    gen = job_generation(site, "12", 1, {"rank-0.0": "n1"})
    unit = generations.manifest_of(gen)["units"]["rank-0.0"]
    copy = staging.job_stage(site, "12", "n1") / "gen-1" / "rank-0.0"
    with ExitStack() as reading:
        assert unit_source.locate(gen, unit, "12", reading, verified=False) == (copy, True, unit_source.MEMORY)
        errors: list = []
        drainer = threading.Thread(target=lambda: errors.extend(drain.drain_job("12")))
        drainer.start()
        deadline = time.monotonic() + 30
        while not (gen / mf.COMMITTED).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (gen / mf.COMMITTED).exists(), "the drain commits while the restore reads"
        drainer.join(0.5)
        assert drainer.is_alive() and copy.is_dir(), "node memory is kept while a restore reads it"
    drainer.join(30)
    assert not drainer.is_alive() and errors == []
    assert not copy.parent.exists(), "and given back once the restore is done"
    image_store.open_image(gen / "rank-0.0")  # the durable copy, with its checksums


def test_a_staged_image_of_the_wrong_size_is_not_read_from_node_memory(site):
    gen = job_generation(site, "13", 1, {"rank-0.0": "n1"})
    unit = generations.manifest_of(gen)["units"]["rank-0.0"]
    pages = staging.job_stage(site, "13", "n1") / "gen-1" / "rank-0.0" / "criu" / "pages-1.img"
    os.truncate(pages, 4096)
    with ExitStack() as reading, pytest.raises(GpucrError, match="truncated or corrupt"):
        unit_source.locate(gen, unit, "13", reading, verified=True)


def test_a_restore_on_another_node_reads_the_image_root_once_drained(site, monkeypatch):
    gen = job_generation(site, "14", 1, {"rank-0.0": "n1"})
    unit = generations.manifest_of(gen)["units"]["rank-0.0"]
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    monkeypatch.setenv("GPUCR_DRAIN_WAIT", "0.3")
    with ExitStack() as reading, pytest.raises(GpucrError, match="still being drained"):
        unit_source.locate(gen, unit, "14", reading, verified=True)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert drain.drain_job("14") == []
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    with ExitStack() as reading:
        # drained after the batch restore began: this restore checks the checksums itself
        assert unit_source.locate(gen, unit, "14", reading, verified=False) == (
            gen / "rank-0.0", False, unit_source.IMAGE_ROOT)


def test_a_restore_of_a_generation_whose_drain_failed_says_so(site, monkeypatch):
    job_generation(site, "15", 1, {"rank-0.0": ""})
    gen = job_generation(site, "15", 2, {"rank-0.0": "n1"})
    unit = generations.manifest_of(gen)["units"]["rank-0.0"]
    assert drain_with_fault("15").returncode != 0
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    with ExitStack() as reading, pytest.raises(GpucrError, match="its drain failed") as e:
        unit_source.locate(gen, unit, "15", reading, verified=True)
    assert "injected" in e.value.one_line() and "\n" not in e.value.one_line()


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs Slurm's scontrol (hostnames)")
def test_a_start_back_on_the_nodes_that_staged_the_job_does_not_wait_for_the_drain(site, monkeypatch):
    gen = job_generation(site, "16", 1, {"batch": "n1", "rank-0.0": "n2"})
    job_dir = gen.parent
    monkeypatch.setenv("GPUCR_SUBMISSION", SUBMISSION)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n2")  # rank 0 back on n2
    restore_log.open_log(job_dir)
    assert unit_source.staged_start_here(job_dir) == gen
    m = batch_restore.check_generation(gen, "16")
    assert m[batch_restore.UNITS_CHECKED] is False, "its units are checked where they are read"
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n3")
    assert unit_source.staged_start_here(job_dir) is None, "rank 0 moved: the whole job waits for the drain"
    assert "rank-0.0 restore on other nodes now" in (job_dir / "restore.log").read_text()
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n2")
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    assert unit_source.staged_start_here(job_dir) is None, "a start elsewhere waits for the drain"
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    generations.write_pointer(job_dir, generations.RESTORE, gen, SUBMISSION)
    assert unit_source.staged_start_here(job_dir) is None, "gpucr-hpc restore --from picks a committed one"


def test_a_node_lost_before_its_drain_fails_the_drain_and_the_previous_generation_is_restored(site, monkeypatch):
    earlier = job_generation(site, "17", 1, {"rank-0.0": ""})
    gen = job_generation(site, "17", 2, {"rank-0.0": "n1", "rank-0.1": "n2"})
    job_dir = gen.parent
    assert drain.drain_job("17") == []  # n1's; n2 went down with its memory
    asked = []

    def lost(node):
        asked.append(node)
        return "DOWN* in Slurm" if node == "n2" else None

    said = generations.await_drain(job_dir, SUBMISSION, timeout_s=30, poll_s=0.05, lost=lost)
    assert asked == ["n2"], "only the nodes still to drain are asked about"
    assert said.startswith("gen-2 was not drained (n2: node n2 is DOWN* in Slurm and no drain runs for it"), said
    assert generations.read_pointer(job_dir, generations.LATEST) == earlier
    assert generations.start_target(job_dir, SUBMISSION, None) == earlier
    monkeypatch.setenv("SLURMD_NODENAME", "n2")  # n2 back after all, its units still there
    assert drain.drain_job("17") == []
    assert not (gen / mf.COMMITTED).exists(), "a generation given up on is never committed later"


def test_a_node_slurm_calls_down_whose_drain_still_runs_is_waited_for(site):
    gen = job_generation(site, "18", 1, {"rank-0.0": "n2"})
    generations.heartbeat(gen, "n2")  # its drain runs (an admin set the node DOWN after the job)
    with pytest.raises(GpucrError, match="still being drained"):
        generations.await_drain(gen.parent, SUBMISSION, timeout_s=0.3, poll_s=0.05, lost=lambda node: "DOWN")
    assert generations.is_staged(gen)
    old = time.time() - generations.DRAIN_STOPPED_S - 1
    os.utime(gen / generations.DRAINING / "n2", (old, old))
    assert generations.await_drain(gen.parent, SUBMISSION, timeout_s=5, poll_s=0.05,
                                   lost=lambda node: "DOWN").startswith("gen-1 was not drained")


def test_a_drain_says_it_runs_while_it_copies(site, monkeypatch):
    gen = job_generation(site, "19", 1, {"rank-0.0": "n1"})
    monkeypatch.setattr(generations, "HEARTBEAT_S", 0.01)
    seen = []
    real = drain.store_drain.drain_image

    def slow(src, dest):
        time.sleep(0.2)
        seen.append(not generations.drain_stopped(gen, "n1"))
        return real(src, dest)

    monkeypatch.setattr(drain.store_drain, "drain_image", slow)
    assert drain.drain_job("19") == []
    assert seen == [True] and (gen / mf.COMMITTED).exists()


def test_a_generation_still_being_written_is_left_to_its_own_drain(site):
    gen = job_generation(site, "20", 1, {"rank-0.0": "n1"})
    writing = gen.parent / "gen-2"  # the job, back on n1, preempted again: its agents write gen-2 now
    writing.mkdir(mode=0o700)
    unit_image(staging.job_stage(site, "20", "n1") / "gen-2" / "rank-0.0")
    with job_lock.held(gen.parent, "20", os.geteuid(), what="gpucr-hpc preempt 20"):  # that checkpoint's
        assert drain.drain_job("20") == []
    assert (gen / mf.COMMITTED).exists()
    assert (staging.job_stage(site, "20", "n1") / "gen-2" / "rank-0.0" / mf.MANIFEST).exists(), \
        "a generation a checkpoint still writes is not the drain's"


def test_a_generation_whose_checkpoint_is_gone_loses_its_staged_copies(site):
    """A checkpoint killed mid-way (its agent crashed, the command killed) leaves gen-2
    on the image root with no verdict and its units in node memory; nobody holds the
    job's lock. The drain gives that memory back and says so; gen-1 stays the one
    restored."""
    gen = job_generation(site, "22", 1, {"rank-0.0": "n1"})
    (gen.parent / "gen-2").mkdir(mode=0o700)
    left = staging.job_stage(site, "22", "n1") / "gen-2"
    unit_image(left / "rank-0.0")
    assert drain.drain_job("22") == []
    assert not left.exists() and (gen / mf.COMMITTED).exists()
    assert generations.read_pointer(gen.parent, generations.LATEST) == gen
    said = (gen.parent / restore_log.LOG_NAME).read_text()
    assert "gen-2 was left unfinished on n1" in said


def test_two_drains_of_one_job_on_a_node_take_turns(site):
    gen = job_generation(site, "21", 1, {"rank-0.0": "n1"})
    done: list = []
    with staging.held(staging.job_stage(site, "21", "n1"), exclusive=True):  # the first drain
        second = threading.Thread(target=lambda: done.extend(drain.drain_job("21")))
        second.start()
        second.join(0.5)
        assert second.is_alive() and generations.is_staged(gen)
    second.join(30)
    assert not second.is_alive() and done == [] and (gen / mf.COMMITTED).exists()


def test_a_stage_on_hugetlbfs_is_not_used_and_the_units_go_to_the_image_root(tmp_path, monkeypatch, hugetlbfs_dir):
    # hugetlbfs takes no write(2): CRIU and the GPU data could not be written there.
    (hugetlbfs_dir / "n1" / "7").mkdir(parents=True, mode=0o700)
    (tmp_path / "plugstack.conf").write_text(
        f"optional /usr/local/lib/gpucr/spank_gpucr.so imageroot={tmp_path} stage={hugetlbfs_dir}/%n\n")
    (tmp_path / "slurm.conf").write_text("ClusterName=t\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    budget = staging.Budget(load_site(), "7")
    assert budget.dir is None and not budget.take(1)


def test_a_restore_log_line_says_where_the_time_went():
    said = batch_restore.phases_said({"criu_restore_s": 0.614, "gpu_attach_s": 0.9, "gpu_h5_read_s": 1.2,
                                      "total_s": 3.0, "gpu_data_s": None})
    assert said == " (CRIU 0.61 s, arena 0.90 s, GPU data read 1.20 s)"
    assert batch_restore.phases_said({}) == ""
    kept = batch_restore.phases_said({"criu_restore_s": 0.6, "gpu_fill_s": 0.001, "gpu_arenas_kept": 1})
    assert kept == " (CRIU 0.60 s, 1 arena(s) as the checkpoint left them in node memory)"


# --- the drain is the job's user, and the staging dir the plugin's (spank/imagedir.c)

def test_the_drain_refuses_a_staging_dir_it_does_not_own_root_too(site):
    """A drain as root in a user's directory is what let the user's links make root
    write and read anywhere: `gpucr-hpc drain` runs only as the owner of
    <stage>/<jobid>, and says so in one line otherwise."""
    if os.geteuid() != 0:
        pytest.skip("needs a staging dir of another uid")
    gen = job_generation(site, "30", 1, {"rank-0.0": "n1"})
    folder = staging.job_stage(site, "30", "n1")
    os.chown(folder, 65534, -1)
    before = image_store.tree_digest(folder)
    r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "drain", "30"], capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "belongs to uid 65534" in lines[0], r.stderr
    assert generations.is_staged(gen) and not (gen / "rank-0.0").exists() and not (gen / generations.DRAINING).exists()
    assert image_store.tree_digest(folder) == before
    with pytest.raises(GpucrError, match="belongs to uid 65534"):
        drain.drain_job("30")


def test_the_drain_refuses_a_staging_dir_that_is_a_link_or_open_to_others(site, tmp_path):
    gen = job_generation(site, "31", 1, {"rank-0.0": "n1"})
    folder = staging.job_stage(site, "31", "n1")
    folder.chmod(0o777)
    with pytest.raises(GpucrError, match="writable by other users"):
        drain.drain_job("31")
    folder.chmod(0o700)
    moved = tmp_path / "moved"
    folder.rename(moved)
    folder.symlink_to(moved)
    with pytest.raises(GpucrError, match="not a directory"):
        drain.drain_job("31")
    assert generations.is_staged(gen)


def test_the_heartbeat_never_touches_through_a_link(site, tmp_path):
    gen = job_generation(site, "32", 1, {"rank-0.0": "n1"})
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    old = time.time() - 3600
    os.utime(victim, (old, old))
    (gen / generations.DRAINING).mkdir(mode=0o700)
    (gen / generations.DRAINING / "n1").symlink_to(victim)
    with pytest.raises(OSError):
        generations.heartbeat(gen, "n1")
    assert victim.read_text() == "theirs" and victim.stat().st_mtime == pytest.approx(old)


def test_a_job_stages_only_into_its_own_staging_dir_as_the_plugin_made_it(site, tmp_path):
    """Nothing but the plugin makes <stage>/<jobid>: the agent stages into one that is
    there, a directory of its own user that no one else writes; else the units go to
    the image root. A restore reads node memory only from such a one too."""
    stage = Path(site.stage.replace("%n", "n1"))
    assert staging.Budget(site, "33").dir is None and not (stage / "33").exists(), "none made by the agent"
    (stage / "33").mkdir(mode=0o700)
    assert staging.Budget(site, "33").dir == stage / "33"
    (stage / "33").chmod(0o777)
    assert staging.Budget(site, "33").dir is None
    (stage / "33").rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (stage / "33").symlink_to(tmp_path / "elsewhere")
    assert staging.Budget(site, "33").dir is None
    if os.geteuid() == 0:
        (stage / "33").unlink()
        (stage / "33").mkdir(mode=0o700)
        os.chown(stage / "33", 65534, -1)  # another user's, left from an earlier job of the id
        assert staging.Budget(site, "33").dir is None
        gen = job_generation(site, "34", 1, {"rank-0.0": "n1"})
        unit = generations.manifest_of(gen)["units"]["rank-0.0"]
        assert unit_source.in_memory_here(gen, unit, "34") is not None
        os.chown(staging.job_stage(site, "34", "n1"), 65534, -1)
        assert unit_source.in_memory_here(gen, unit, "34") is None
