"""The shim's NCCL hooks and the consistent cut, on the CPU: two ranks of a
program built against a stand-in libnccl (tests/nccl_fake: NCCL's exported
names, no GPU; it aborts on any use of a destroyed communicator) run under the
real shim, and the real agents' code brings them to a cut, tears their
communicators down and rebuilds them. NCCL itself needs GPUs: test_nccl_gpu.py
runs the same against PyTorch on two of them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shim_helpers import SHIM, build_shim

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.process import in_place, nccl_cut
from gpucr_hpc.shim.client import ShimClient

FAKE = Path(__file__).parent / "nccl_fake"


@pytest.fixture(scope="module")
def ranks_program(tmp_path_factory) -> Path:
    build_shim()
    d = tmp_path_factory.mktemp("fake_nccl")
    for cmd in (["cc", "-O2", "-shared", "-fPIC", "-o", str(d / "libnccl.so.2"), str(FAKE / "fake_nccl.c")],
                ["cc", "-O2", "-pthread", "-o", str(d / "ranks"), str(FAKE / "ranks.c"), f"-L{d}", "-l:libnccl.so.2",
                 f"-Wl,-rpath,{d}"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    return d / "ranks"


class Job:
    """Two ranks under the shim, started by one shell (the tree a checkpoint takes)."""

    def __init__(self, program: Path, work: Path, steps: int, delays=(1500, 2500), started=10, extra=""):
        self.work, self.run_dir, self.steps = work, work / "run", steps
        self.run_dir.mkdir(parents=True)
        env = dict(os.environ, LD_PRELOAD=str(SHIM), GPUCR_RUN_DIR=str(self.run_dir), FAKE_NCCL_LOG=str(work / "log"))
        script = " & ".join(f"{program} {r} 2 {work} {steps} {d} {extra} > {work}/out-{r} 2>&1"
                            for r, d in enumerate(delays))
        self.shell = subprocess.Popen(["bash", "-c", script + " & wait"], env=env, start_new_session=True)
        self.wait(lambda: all(self.done(r) >= started for r in (0, 1)), "both ranks to step")

    def done(self, rank: int) -> int:
        p = self.work / f"rank-{rank}.txt"
        return len(p.read_text().split()) if p.exists() else 0

    def ranks(self) -> list[int]:
        return sorted(int(p.stem) for p in self.run_dir.glob("*.sock")
                      if ShimClient(int(p.stem), self.run_dir).status().nccl_comms)

    def wait(self, pred, what: str, timeout: float = 30.0):
        end = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < end, f"timed out waiting for {what}: {self.outputs()}"
            time.sleep(0.02)

    def outputs(self) -> str:
        return " | ".join((self.work / f"out-{r}").read_text() for r in (0, 1) if (self.work / f"out-{r}").exists())

    def finish(self):
        assert self.shell.wait(timeout=120) == 0, self.outputs()
        assert [self.done(r) for r in (0, 1)] == [self.steps] * 2
        assert "rank 0 done" in self.outputs() and "rank 1 done" in self.outputs()

    def kill(self):
        if self.shell.poll() is None:
            os.killpg(self.shell.pid, signal.SIGKILL)


def log_lines(work: Path, what: str) -> int:
    return sum(1 for line in (work / "log").read_text().splitlines() if line.startswith(what + " "))


def test_checkpoint_of_the_tree_cuts_tears_down_and_rebuilds_every_communicator(ranks_program, tmp_path):
    job = Job(ranks_program, tmp_path, steps=1500)
    try:
        pids = job.ranks()
        assert len(pids) == 2
        for cycle in range(3):
            rep = in_place.checkpoint_tree(job.shell.pid, run_dir=job.run_dir)
            assert rep["phases"]["cut_s"] >= 0 and "teardown_s" in rep["phases"]
            states = nccl_cut._states(pids, job.run_dir)
            assert [s.cut for s in states] == ["torn_down"] * 2
            # a consistent cut: each communicator's count is the same on both ranks
            counts = [{c.key: c.ops for c in s.comms} for s in states]
            assert counts[0] == counts[1] and len(counts[0]) == 2
            at = [job.done(r) for r in (0, 1)]
            time.sleep(0.2)
            assert [job.done(r) for r in (0, 1)] == at, "a rank stepped while its communicators were down"
            assert log_lines(tmp_path, "destroy") == 4 * (cycle + 1)
            rep = in_place.restore_tree(job.shell.pid, run_dir=job.run_dir)
            assert "rebuild_s" in rep["phases"]
            job.wait(lambda: all(job.done(r) > at[r] + 5 for r in (0, 1)),  # noqa: B023
                     f"stepping after restore {cycle}")
        assert log_lines(tmp_path, "register") == 2 * 4  # each rank: made, then replayed at 3 rebuilds
        job.finish()
    finally:
        job.kill()


def test_a_communicator_with_a_rank_outside_the_checkpoint_is_refused_and_the_job_runs_on(ranks_program, tmp_path):
    job = Job(ranks_program, tmp_path, steps=400)
    try:
        one = job.ranks()[:1]
        with pytest.raises(GpucrError, match="has 2 ranks but only 1 of them"):
            nccl_cut.cut(one, job.run_dir)
        assert [s.cut for s in nccl_cut._states(job.ranks(), job.run_dir)] == ["none", "none"]
        job.finish()
        assert log_lines(tmp_path, "destroy") == 4  # only the program's own two per rank, at its end
    finally:
        job.kill()


def test_a_rank_with_communicators_is_not_checkpointed_alone(ranks_program, tmp_path):
    job = Job(ranks_program, tmp_path, steps=300)
    try:
        r = ShimClient(job.ranks()[0], job.run_dir).checkpoint(5000)
        assert not r.ok and r.reason == "refused" and "NCCL communicators" in r.error
        job.finish()
    finally:
        job.kill()


def test_a_cut_that_does_not_settle_is_given_up_and_the_ranks_run_on(ranks_program, tmp_path):
    # rank 1 sleeps 40 ms a step: it cannot catch up with rank 0 within the deadline
    job = Job(ranks_program, tmp_path, steps=100, delays=(5000, 40_000), started=2)
    try:
        pids = job.ranks()
        with pytest.raises(GpucrError, match="did not reach a consistent cut"):
            nccl_cut.cut(pids, job.run_dir, deadline_s=0.3)
        assert [s.cut for s in nccl_cut._states(pids, job.run_dir)] == ["none", "none"]
        job.finish()
    finally:
        job.kill()


def test_a_communicator_the_shim_cannot_rebuild_is_refused_and_the_job_runs_on(ranks_program, tmp_path):
    job = Job(ranks_program, tmp_path, steps=300, extra="window")
    try:
        with pytest.raises(GpucrError, match="cannot be rebuilt: ncclCommWindowRegister"):
            in_place.checkpoint_tree(job.shell.pid, run_dir=job.run_dir)
        assert [s.cut for s in nccl_cut._states(job.ranks(), job.run_dir)] == ["none", "none"]
        job.finish()
    finally:
        job.kill()


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="calls cuMulticastCreate, never made on GPU machines")
def test_a_process_that_made_a_multicast_object_is_refused_and_the_job_runs_on(ranks_program, tmp_path):
    """NVLS: NCCL's multicast objects cannot be made again at a restore."""
    job = Job(ranks_program, tmp_path, steps=300, extra="multicast")
    try:
        with pytest.raises(GpucrError, match="NVLink multicast") as e:
            in_place.checkpoint_tree(job.shell.pid, run_dir=job.run_dir)
        assert "NCCL_NVLS_ENABLE=0" in e.value.one_line()
        assert [s.cut for s in nccl_cut._states(job.ranks(), job.run_dir)] == ["none", "none"]
        job.finish()
    finally:
        job.kill()


def test_after_a_reload_the_communicators_come_from_a_fresh_copy_of_nccl(ranks_program, tmp_path):
    """What a restore by CRIU does (maybe on another node): NCCL's host state must
    not be the old node's, so the hooks move to a fresh copy of the library."""
    job = Job(ranks_program, tmp_path, steps=600)
    try:
        pids = job.ranks()
        for n in (1, 2):  # twice: a second copy must not be taken for the first (same descriptor number)
            in_place.checkpoint_tree(job.shell.pid, run_dir=job.run_dir)
            in_place.restore_tree(job.shell.pid, run_dir=job.run_dir, rebuild=False)
            inits = [line for line in (tmp_path / "log").read_text().splitlines() if line.startswith("init ")]
            nccl_cut.rebuild(pids, job.run_dir, reload=True)
            fresh = [line for line in (tmp_path / "log").read_text().splitlines()
                     if line.startswith("init ")][len(inits):]
            # a fresh copy numbers from 0 again: rank 1's two communicators 0 and 1, rank 0's 2 and 3
            # (its two unique ids took 0 and 1); the copies in use would have gone on from there
            assert sorted(line.split()[1] for line in fresh) == ["0", "1", "2", "3"], (n, fresh)
            at = [job.done(r) for r in (0, 1)]
            job.wait(lambda: all(job.done(r) > at[r] + 5 for r in (0, 1)), f"stepping after reload {n}")  # noqa: B023
        job.finish()
    finally:
        job.kill()


def test_status_lists_each_rank_with_its_communicators_and_its_cut(ranks_program, tmp_path):
    def status() -> dict[str, str]:
        r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "status", "--run-dir", str(job.run_dir)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        header, *lines = r.stdout.splitlines()
        at = header.index("NCCL")  # the column: each row's text under it
        return {line.split()[0]: line[at:at + 12].strip() for line in lines}

    job = Job(ranks_program, tmp_path, steps=400)
    try:
        pids = [str(p) for p in job.ranks()]
        rows = status()
        assert all(rows[p] == "2" for p in pids), rows
        nccl_cut.cut(job.ranks(), job.run_dir)
        rows = status()
        assert all(rows[p] == "2 parked" for p in pids), rows
        nccl_cut.thaw(job.ranks(), job.run_dir)
        job.finish()
    finally:
        job.kill()


def test_a_finalize_that_does_not_end_is_aborted_in_time_and_the_ranks_are_rebuilt(ranks_program, tmp_path):
    """Rank 0 torn down alone: NCCL's finalize waits for a peer that never comes
    (here rank 1, parked). The teardown gives up at its deadline with one line,
    the communicators aborted, and the shim still answers: the agents' undo
    then tears rank 1 down too, rebuilds both, and the job runs to its end."""
    job = Job(ranks_program, tmp_path, steps=400)
    try:
        pids = job.ranks()
        nccl_cut.cut(pids, job.run_dir)
        t = time.monotonic()
        with pytest.raises(GpucrError) as e:
            nccl_cut.teardown(pids[:1], job.run_dir, timeout_ms=2000)
        took = time.monotonic() - t
        assert "did not end" in str(e.value) and "aborted" in str(e.value), str(e.value)
        assert took < 30, f"the teardown took {took:.1f} s"
        nccl_cut.undo(pids, job.run_dir)
        at = [job.done(r) for r in (0, 1)]
        job.wait(lambda: all(job.done(r) > a + 5 for r, a in zip((0, 1), at)), "both ranks to step again")
        job.finish()
    finally:
        job.kill()
