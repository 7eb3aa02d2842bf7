"""scripts/install-deps (the node install), scripts/testcluster-deps (the test cluster's
Slurm and munge), scripts/setup-venv and scripts/testcluster: idempotent, the node install
never touches Slurm or munge, and one clear line when they cannot work."""

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
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
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
@pytest.mark.slurm
def test_testcluster_up_takes_over_a_cluster_that_runs_another_checkouts_code(slurm_cluster):
    """A cluster left up by another checkout (its jobs run that tree's gpucr-hpc) is
    restarted for this one: a CI run in a fresh clone once tested the jobs of the
    tree a session was editing."""
    plugstack = slurm_cluster.state / "etc" / "plugstack.conf"
    ours = plugstack.read_text()
    other = "/nonexistent/other-checkout/.venv/bin/gpucr-hpc"
    try:
        up = subprocess.run([str(SCRIPTS / "testcluster"), "up"], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, GPUCR_CLI=other))
        assert up.returncode == 0, up.stderr
        assert f"cli={other} " in plugstack.read_text()
    finally:
        back = subprocess.run([str(SCRIPTS / "testcluster"), "up"], capture_output=True, text=True, timeout=300)
    assert back.returncode == 0, back.stderr
    assert plugstack.read_text() == ours


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


def closed_apt(tmp_path, drop):
    """An apt that cannot download (a closed proxy port, an empty cache) and a copy of
    dpkg's status without the packages `drop`: bound over the real one in a private mount
    namespace (run_unshared), those look missing; nothing on the machine changes."""
    status = Path("/var/lib/dpkg/status").read_text().split("\n\n")
    kept = [s for s in status if not any(s.startswith(f"Package: {p}\n") for p in drop)]
    assert len(kept) == len(status) - len(drop), f"{drop} must be installed for this test"
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
    return fake_status, apt_conf


def run_unshared(fake_status, apt_conf, script, **env):
    return subprocess.run(["unshare", "-m", "sh", "-c",
                           f"mount --bind {fake_status} /var/lib/dpkg/status && exec {script}"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, APT_CONFIG=str(apt_conf), **env))


@needs_root
def test_install_deps_names_the_package_it_cannot_fetch(tmp_path):
    """apt sees hdf5-tools as missing and cannot download it: the error names it."""
    fake_status, apt_conf = closed_apt(tmp_path, ["hdf5-tools"])
    line = one_line_error(run_unshared(fake_status, apt_conf, SCRIPTS / "install-deps"), "install-deps: error:")
    assert "hdf5-tools" in line, line


@needs_root
def test_testcluster_deps_names_the_package_it_cannot_fetch(tmp_path):
    """And the policy-rc.d that keeps Debian's daemons from starting is removed again
    where it made one (a machine's own is left as it is)."""
    policy = Path("/usr/sbin/policy-rc.d")
    before = policy.read_bytes() if policy.exists() else None
    fake_status, apt_conf = closed_apt(tmp_path, ["munge"])
    out = run_unshared(fake_status, apt_conf, SCRIPTS / "testcluster-deps")
    assert "munge" in one_line_error(out, "testcluster-deps: error:")
    assert (policy.read_bytes() if policy.exists() else None) == before


SLURM_PACKAGES = ["slurm-wlm", "slurmctld", "slurmd", "slurm-client", "libslurm-dev", "munge"]


def dpkg_versions(names):
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\n", *names],
                         capture_output=True, text=True)
    return out.stdout


def daemons_and_configs(conf_dir):
    status = subprocess.run([str(SCRIPTS / "testcluster"), "status"], capture_output=True, text=True,
                            timeout=60).stdout
    pids = sorted(ln.split()[0] + " " + ln.split()[-1] for ln in status.splitlines() if "running, pid" in ln)
    files = {}
    for d in (conf_dir, Path("/etc/slurm"), Path("/etc/munge")):
        for f in sorted(d.rglob("*")) if d.exists() else []:
            if f.is_file():
                st = f.stat()
                files[str(f)] = (st.st_mtime_ns, st.st_size, st.st_mode, f.read_bytes())
    return pids, files


@needs_root
@pytest.mark.slurm
def test_the_node_install_leaves_a_running_slurm_and_munge_alone(slurm_cluster, tmp_path):
    """The node install with the cluster's daemons running and Slurm's and munge's packages
    looking missing (as on a node whose Slurm is the site's own build): it installs none,
    stops, restarts or reconfigures nothing, and succeeds. A systemctl first on PATH
    records any call."""
    pids, files = daemons_and_configs(slurm_cluster.conf.parent)
    assert len(pids) == 5, pids  # munged, slurmctld, 3 x slurmd
    versions = dpkg_versions(SLURM_PACKAGES)
    dpkg_log = Path("/var/log/dpkg.log")
    log_size = dpkg_log.stat().st_size if dpkg_log.exists() else 0
    fake_status, apt_conf = closed_apt(tmp_path, SLURM_PACKAGES)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "systemctl-calls"
    for tool in ("systemctl", "service", "invoke-rc.d"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {calls}\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    out = run_unshared(fake_status, apt_conf, SCRIPTS / "install-deps",
                       PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert not any("slurm" in ln or "munge" in ln for ln in out.stdout.splitlines() if "installing" in ln), out.stdout
    assert "system packages already installed" in out.stdout, out.stdout
    assert not calls.exists(), calls.read_text()
    assert daemons_and_configs(slurm_cluster.conf.parent) == (pids, files)
    assert dpkg_versions(SLURM_PACKAGES) == versions
    new_log = dpkg_log.read_text()[log_size:] if dpkg_log.exists() else ""
    assert not any(p in new_log for p in ("slurm", "munge")), new_log


@needs_root
def test_the_node_install_names_the_slurm_headers_the_site_must_provide(tmp_path):
    """Without the site's Slurm headers the plugin cannot be built: one line names the
    package, and Slurm is not installed."""
    out = subprocess.run([str(SCRIPTS / "install-deps")], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, SLURM_INCLUDE=str(tmp_path)))
    line = one_line_error(out, "install-deps: error:")
    assert "spank.h" in line and "libslurm-dev" in line and "slurm-devel" in line, line
    assert "never installs Slurm" in line


def test_the_venv_has_the_driver_checkpoint_api():
    """A GPU node's first checkpoint needs cuda-python (the `nvidia` extra): setup-venv
    installs it everywhere (it needs the driver only at run time)."""
    out = subprocess.run([str(SCRIPTS / "setup-venv")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    r = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c",
                        "import cuda.bindings.driver as d; print(hasattr(d, 'cuCheckpointProcessCheckpoint'))"],
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "True", r.stderr


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
