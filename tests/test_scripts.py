"""scripts/install-deps and scripts/testcluster: idempotent, and one clear line when they cannot work."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="these paths are exercised as root")


@pytest.fixture
def world_readable_copy():
    """A copy of a script where an unprivileged user can read it."""
    made = []

    def copy(name):
        d = Path(tempfile.mkdtemp(prefix="gpucr-script-"))
        os.chmod(d, 0o755)
        shutil.copy(SCRIPTS / name, d / name)
        os.chmod(d / name, 0o755)
        made.append(d)
        return d / name

    yield copy
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def one_line_error(out, prefix):
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert out.returncode != 0
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


@needs_root
def test_testcluster_refuses_without_root(world_readable_copy):
    script = world_readable_copy("testcluster")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "/usr/bin/python3", str(script), "up"],
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert "needs root" in one_line_error(out, "testcluster: error:")


@needs_root
def test_testcluster_refuses_without_cgroup_fs(tmp_path):
    # A private mount namespace: the host's /sys/fs/cgroup is untouched.
    out = subprocess.run(["unshare", "-m", "sh", "-c",
                          f"umount -l /sys/fs/cgroup && exec {SCRIPTS / 'testcluster'} up"],
                         capture_output=True, text=True,
                         env=dict(os.environ, GPUCR_TESTCLUSTER_DIR=str(tmp_path / "tc")))
    assert "/sys/fs/cgroup is not mounted" in one_line_error(out, "testcluster: error:")
    assert not (tmp_path / "tc").exists(), "nothing may be started or written"


def test_testcluster_status_of_a_stopped_cluster(tmp_path):
    out = subprocess.run([str(SCRIPTS / "testcluster"), "status"], capture_output=True, text=True,
                         env=dict(os.environ, GPUCR_TESTCLUSTER_DIR=str(tmp_path)))
    assert out.returncode == 3
    assert "slurmctld    stopped" in out.stdout


@pytest.mark.slurm
def test_testcluster_up_is_idempotent(slurm_cluster):
    out = subprocess.run([str(SCRIPTS / "testcluster"), "up"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert "already up" in lines[0]
    assert lines[-1] == str(slurm_cluster.conf)
    status = subprocess.run([str(SCRIPTS / "testcluster"), "status"], capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0
    assert status.stdout.count("running, pid") == 5  # munged, slurmctld, 3 x slurmd
    assert status.stdout.count(" idle") + status.stdout.count(" mixed") + \
        status.stdout.count(" allocated") == 3


@needs_root
def test_install_deps_second_run_does_nothing():
    out = subprocess.run([str(SCRIPTS / "install-deps")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert "system packages already installed" in out.stdout
    assert "already installed at" in out.stdout  # criu


@needs_root
def test_install_deps_refuses_without_root(world_readable_copy):
    script = world_readable_copy("install-deps")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "bash", str(script)], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"]})
    assert "must run as root" in one_line_error(out, "install-deps: error:")


@needs_root
def test_install_deps_names_the_package_it_cannot_fetch(tmp_path):
    """apt sees munge as missing and cannot download it: the error names it.

    In a private mount namespace, a copy of dpkg's status without munge is bound
    over the real one, and apt is pointed at a closed proxy port with an empty
    download cache; nothing on the machine changes.
    """
    status = Path("/var/lib/dpkg/status").read_text().split("\n\n")
    kept = [s for s in status if not s.startswith("Package: munge\n")]
    assert len(kept) == len(status) - 1, "munge must be installed for this test"
    fake_status = tmp_path / "status"
    fake_status.write_text("\n\n".join(kept))
    cache = tmp_path / "archives"
    (cache / "partial").mkdir(parents=True)
    apt_conf = tmp_path / "apt.conf"
    apt_conf.write_text(f'Acquire::http::Proxy "http://127.0.0.1:9";\n'
                        f'Acquire::https::Proxy "http://127.0.0.1:9";\n'
                        f'Acquire::Retries "0";\n'
                        f'Dir::Cache::archives "{cache}";\n'
                        f'Dir::State::status "{fake_status}";\n')
    out = subprocess.run(["unshare", "-m", "sh", "-c",
                          f"mount --bind {fake_status} /var/lib/dpkg/status && "
                          f"exec {SCRIPTS / 'install-deps'}"],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, APT_CONFIG=str(apt_conf)))
    line = one_line_error(out, "install-deps: error:")
    assert "munge" in line, line


def test_testcluster_down_where_the_ip_command_is_missing(tmp_path, monkeypatch):
    # The GPU machine has no iproute2: its nodes share 127.0.0.1, and `down` must
    # still finish (it once died in remove_net, leaving the state folder mounted).
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader

    monkeypatch.setenv("GPUCR_TESTCLUSTER_DIR", str(tmp_path))
    spec = spec_from_loader("testcluster_module", SourceFileLoader("testcluster_module", str(SCRIPTS / "testcluster")))
    tc = module_from_spec(spec)
    spec.loader.exec_module(tc)
    monkeypatch.setattr(tc, "IP", str(tmp_path / "no-such-ip"))
    tc.remove_net()
    with pytest.raises(tc.ClusterError, match="command not found"):
        tc.ip("link", "add", "x", "type", "bridge")
