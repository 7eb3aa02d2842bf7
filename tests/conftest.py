"""Shared fixtures: the real local Slurm cluster and GPU detection."""

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from job_helpers import COUNTER
from user_helpers import USERS, as_user, ensure_user, owned_dir

REPO = Path(__file__).resolve().parent.parent
TESTCLUSTER = REPO / "scripts" / "testcluster"

# Cluster tests run in parallel (pytest -n N, scripts/run-tests): each worker but the
# first gets a test cluster of its own, with its own state folder, ports, subnet and
# job ids (scripts/testcluster), set here so that every command a test runs reaches it.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
if _WORKER != "gw0" and "GPUCR_TESTCLUSTER_DIR" not in os.environ:
    _n = int(_WORKER.removeprefix("gw"))
    os.environ["GPUCR_TESTCLUSTER_DIR"] = f"/tmp/gpucr-testcluster-{_WORKER}"
    os.environ["GPUCR_TESTCLUSTER_PORT"] = str(16817 + 100 * _n)


def gpu_present() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_present():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found by nvidia-smi -L)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class SlurmCluster:
    """The cluster of scripts/testcluster, driven through the real Slurm CLI."""

    def __init__(self, conf: Path):
        self.conf = conf
        self.state = conf.parent.parent
        self.env = dict(os.environ, SLURM_CONF=str(conf))

    def run(self, *argv, check=True, **kw):
        kw.setdefault("timeout", 60)
        return subprocess.run(list(argv), env=kw.pop("env", self.env), capture_output=True,
                              text=True, check=check, **kw)

    def sbatch(self, script: Path, *args, user=None) -> str:
        """The job's id; submitted by root, or by `user` (a pwd entry)."""
        if user is None:
            out = self.run("sbatch", "--parsable", *args, str(script))
        else:
            out = as_user(user, "sbatch", "--parsable", *args, str(script), env=self.env)
            assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0]

    def job(self, jobid: str) -> dict:
        """`scontrol show job -o` as a dict (22.05 has no --json for it)."""
        out = self.run("scontrol", "show", "job", "-o", jobid, check=False)
        if out.returncode != 0:
            return {}
        return dict(re.findall(r"(\S+?)=(\S*)", out.stdout))

    @property
    def node_local(self) -> bool:
        """Whether every node sees its own spool and run dir at one path (as on a real
        cluster); where the test machine allows no mounts, they differ by node (%n)."""
        return "/node-local/" in self.conf.read_text()

    @property
    def netns(self) -> bool:
        """Whether each node has its own network namespace and address (scripts/testcluster
        up says why not where it cannot: then all nodes share 127.0.0.1)."""
        net = self.state / "net"
        return net.exists() and net.read_text().split()[:1] == ["netns"]

    @property
    def net_why(self) -> str:
        """Why the nodes share 127.0.0.1 (empty in netns mode)."""
        net = self.state / "net"
        return net.read_text().strip().partition(" ")[2] if net.exists() else "no network recorded"

    @property
    def outside_addr(self) -> str:
        """The address at which a job reaches this machine's own processes (the test
        runner's servers): the bridge's in netns mode, else 127.0.0.1."""
        m = re.search(r"^SlurmctldHost=[^(\s]*\(([^)]+)\)", self.conf.read_text(), re.M)
        return m.group(1) if m else "127.0.0.1"

    def restore_log(self, jobid: str) -> str:
        """What the job's restores logged (for a test's failure message)."""
        log = self.state / "images" / jobid / "restore.log"
        return log.read_text(errors="replace") if log.exists() else f"(no {log})"

    def wait_state(self, jobid: str, states, timeout=60) -> dict:
        states = {states} if isinstance(states, str) else set(states)
        deadline = time.time() + timeout
        info = {}
        while time.time() < deadline:
            info = self.job(jobid)
            if info.get("JobState") in states:
                return info
            time.sleep(0.3)
        raise AssertionError(f"job {jobid} not in {states} after {timeout}s: "
                             f"{info.get('JobState')} ({info.get('Reason')})")


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("the test cluster needs root")
    was_up = subprocess.run([str(TESTCLUSTER), "status"], capture_output=True).returncode == 0
    up = subprocess.run([str(TESTCLUSTER), "up"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, f"testcluster up failed: {up.stderr.strip() or up.stdout}"
    cluster = SlurmCluster(Path(up.stdout.strip().splitlines()[-1]))
    yield cluster
    if not was_up:
        subprocess.run([str(TESTCLUSTER), "down"], capture_output=True, timeout=120)


@pytest.fixture(autouse=True)
def _images_of_ended_jobs_removed(request):
    """After each cluster test, the image directories of jobs Slurm no longer runs or
    holds: a torch job's generations take a GB or more, and a whole run's would fill
    a small CI disk (it did, mid-run, as ENOSPC in a later test's checkpoint)."""
    yield
    if "slurm_cluster" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("slurm_cluster")
    queue = cluster.run("squeue", "-h", "-o", "%A", check=False)
    if queue.returncode != 0:
        return  # Slurm cannot say which jobs live: keep everything
    alive = set(queue.stdout.split())
    for d in (cluster.state / "images").iterdir():
        if d.is_dir() and d.name.isdigit() and d.name not in alive:
            shutil.rmtree(d, ignore_errors=True)


# --- fixtures of the job and user tests (their helpers: job_helpers.py, user_helpers.py)

@pytest.fixture
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("job")
    os.chmod(d, 0o755)
    (d / "counter.py").write_text(COUNTER)
    return d


@pytest.fixture(scope="session")
def users():
    if os.geteuid() != 0:
        pytest.skip("creating test users and running as them needs root")
    return [ensure_user(n) for n in USERS]


@pytest.fixture
def users_tmp(users):
    """A directory every user can enter (pytest's tmp_path is root's alone), removed after."""
    base = Path(tempfile.mkdtemp(prefix="gpucr-users-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def jobdir(users, users_tmp):
    """The first user's own job directory, with the counter workload in it."""
    d = owned_dir(users_tmp / "job", users[0])
    (d / "counter.py").write_text(COUNTER)
    return d


@pytest.fixture(scope="module")
def cuda_bin(tmp_path_factory):
    """The CUDA C workload of the GPU tests, built with nvcc."""
    from shim_helpers import REPO, build_shim

    build_shim()
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = tmp_path_factory.mktemp("bin") / "cuda_malloc"
    subprocess.run([nvcc, "-O2", "-o", str(out), str(REPO / "tests/shim_workloads/cuda_malloc.cu")], check=True)
    return out


@pytest.fixture
def hugetlbfs_dir(tmp_path):
    """A hugetlbfs mounted on a new folder (root only): node memory that takes no write(2)."""
    where = tmp_path / "huge"
    where.mkdir()
    if subprocess.run(["mount", "-t", "hugetlbfs", "none", str(where)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a hugetlbfs here (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


@pytest.fixture
def tmpfs_dir(tmp_path):
    """mount(options) -> a new tmpfs with those options (root only), unmounted after the test."""
    made = []

    def mount(options: str):
        where = tmp_path / f"tmpfs-{len(made)}"
        where.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "none", str(where)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        made.append(where)
        return where

    yield mount
    for where in made:
        subprocess.run(["umount", str(where)], capture_output=True)


@pytest.fixture
def node_memory():
    """A new folder in /dev/shm (node memory), removed after the test."""
    from gpucr_hpc.store.mounts import in_node_memory

    d = Path(tempfile.mkdtemp(prefix="gpucr-test-", dir="/dev/shm"))
    if not in_node_memory(d):
        shutil.rmtree(d)
        pytest.skip("/dev/shm is not a tmpfs here")
    yield d
    shutil.rmtree(d, ignore_errors=True)
