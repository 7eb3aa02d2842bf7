"""Slurm out of reach is never taken for "no such job" (issue 33, item 3).

Only slurmctld's own answer that an id is invalid means a job is unknown; a
controller that is stopped (nothing listens at its port) or slow (it accepts
and never answers) gives one line naming Slurm as unreachable, a non-zero exit,
and never a resubmission. A resubmission also never happens while the job's
lock is held, nor while an earlier resubmission of the job still runs.

The real scontrol is run against a slurm.conf of its own, whose SlurmctldHost
is this machine at a port where nothing listens (stopped) or where a socket
accepts and never answers (slow; a private munged signs the request, as a real
one would). `sbatch` is a stand-in that only logs: it must never be called.
No Slurm cluster is touched.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from test_cli_options import cli

from gpucr_hpc.store import manifest as mf

SCONTROL = shutil.which("scontrol")
MUNGED = shutil.which("munged") or ("/usr/sbin/munged" if os.path.exists("/usr/sbin/munged") else None)
pytestmark = pytest.mark.skipif(SCONTROL is None, reason="needs Slurm's scontrol")

STAND_IN_SBATCH = """#!/bin/sh
echo "sbatch $*" >> {log}
cat > /dev/null
echo 77
"""

# Slurm's answers as a stand-in scontrol gives them: only job 77 (a resubmitted copy) is known.
STAND_IN_SCONTROL = """#!/bin/sh
case "$*" in
  "show job -o 77") echo "JobId=77 JobName=train UserId=root(0) JobState=RUNNING Restarts=0 NodeList=(null)" \
      "Partition=debug Requeue=1";;
  "show job -o "*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1;;
  *) echo "scontrol: unexpected $*" >&2; exit 1;;
esac
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_conf(path: Path, port: int, munge_socket: str, message_timeout: int = 1) -> None:
    path.write_text(f"ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={port}\n"
                    f"MessageTimeout={message_timeout}\nAuthType=auth/munge\nAuthInfo=socket={munge_socket}\n"
                    "NodeName=n1 CPUs=1\nPartitionName=debug Nodes=ALL\n")


def forgotten_job(images: Path, jobid: str = "42") -> Path:
    """Job `jobid`'s directory with a committed generation that a resubmission would use."""
    job_dir = images / jobid
    job_dir.mkdir(mode=0o700)
    gen = job_dir / "gen-1"
    gen.mkdir()
    m = {"format": mf.FORMAT, "format_version": mf.FORMAT_VERSION, "owner_uid": os.geteuid(), "nodes": ["n1"],
         "units": {"rank-0": {}}, "job": {"std_out": str(images.parent / "job.out"), "partition": "debug"}}
    mf.commit(gen, m)
    (gen / "script").write_text("#!/bin/sh\ntrue\n")
    (job_dir / "LATEST").write_text("gen-1\n")
    return job_dir


@pytest.fixture
def site(tmp_path):
    """A site with the plugin line, an image root, a stand-in sbatch that logs, and a
    slurm.conf whose slurmctld is this machine at a port where nothing listens."""
    bin_dir, images = tmp_path / "bin", tmp_path / "images"
    bin_dir.mkdir()
    images.mkdir()
    log = tmp_path / "sbatch.log"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(STAND_IN_SBATCH.format(log=log))
    sbatch.chmod(0o755)
    (tmp_path / "plugstack.conf").write_text("optional /nowhere/spank_gpucr.so\n")
    conf = tmp_path / "slurm.conf"
    write_conf(conf, free_port(), str(tmp_path / "no-munge.sock"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCR_", "SLURM_"))}
    env.update(SLURM_CONF=str(conf), GPUCR_IMAGE_ROOT=str(images), PATH=f"{bin_dir}:{env['PATH']}")
    return {"env": env, "images": images, "sbatch_log": log, "conf": conf, "bin": bin_dir}


def unreachable(r) -> str:
    """One line naming Slurm as unreachable, with scontrol's reason; a non-zero exit."""
    assert r.returncode != 0, r.stdout + r.stderr
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("gpucr-hpc: error:"), err
    assert "Slurm is unreachable" in err and "known to Slurm" not in err, err
    return err


def never_submitted(site) -> None:
    log = site["sbatch_log"]
    assert not log.exists(), f"a job was submitted: {log.read_text()}"


# -- slurmctld stopped -----------------------------------------------------------------

def test_status_with_slurmctld_stopped_is_not_a_job_slurm_forgot(site):
    forgotten_job(site["images"])
    err = unreachable(cli("status", "42", env=site["env"]))
    assert "Unable to contact slurm controller" in err, err
    doc = json.loads(cli("status", "42", "--json", env=site["env"]).stdout)
    assert doc["schema"] == "gpucr-hpc.error/1" and "Slurm is unreachable" in doc["error"], doc


def test_status_of_a_job_without_checkpoints_with_slurmctld_stopped(site):
    unreachable(cli("status", "42", env=site["env"]))


@pytest.mark.parametrize("verb", ["checkpoint", "preempt", "suspend", "resume"])
def test_job_commands_with_slurmctld_stopped_say_so(site, verb):
    unreachable(cli(verb, "42", env=site["env"]))


def test_restore_with_slurmctld_stopped_submits_nothing(site):
    forgotten_job(site["images"])
    err = unreachable(cli("restore", "42", env=site["env"]))
    assert "Unable to contact slurm controller" in err, err
    never_submitted(site)


def test_an_array_task_with_slurmctld_stopped(site):
    unreachable(cli("status", "42_3", env=site["env"]))


# -- slurmctld slow: it accepts and never answers ---------------------------------------

@pytest.fixture
def munge_socket():
    """A private munged, so that scontrol gets as far as sending its request."""
    if MUNGED is None or os.geteuid() != 0:
        pytest.skip("needs munged, run as root")
    d = Path(tempfile.mkdtemp(prefix="gpucr-munge-"))
    key = d / "key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = d / "sock"
    subprocess.run([MUNGED, "--force", f"--socket={sock}", f"--key-file={key}", f"--pid-file={d / 'pid'}",
                    f"--log-file={d / 'log'}", f"--seed-file={d / 'seed'}"], check=True, timeout=30)
    try:
        yield str(sock)
    finally:
        try:
            os.kill(int((d / "pid").read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def silent_controller():
    """A port that accepts connections and never answers: a controller too slow to reply."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def test_restore_with_a_slow_slurmctld_submits_nothing(site, munge_socket, silent_controller):
    forgotten_job(site["images"])
    write_conf(site["conf"], silent_controller, munge_socket, message_timeout=1)
    t0 = time.monotonic()
    err = unreachable(cli("restore", "42", env=site["env"]))
    assert "timed out" in err, err  # scontrol's own MessageTimeout
    assert time.monotonic() - t0 < 60
    never_submitted(site)
    err = unreachable(cli("status", "42", env=site["env"]))


def test_show_job_gives_up_on_a_slow_slurmctld_after_its_own_timeout(site, munge_socket, silent_controller,
                                                                      monkeypatch):
    """scontrol would wait MessageTimeout (here 30 s) for each try: gpucr-hpc stops
    waiting after SHOW_TIMEOUT_S and says Slurm is unreachable."""
    from gpucr_hpc.slurm import commands as slurm

    write_conf(site["conf"], silent_controller, munge_socket, message_timeout=30)
    monkeypatch.setenv("SLURM_CONF", str(site["conf"]))
    monkeypatch.setattr(slurm, "SHOW_TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    with pytest.raises(slurm.SlurmUnreachable) as e:
        slurm.show_job("42")
    assert time.monotonic() - t0 < 10
    assert "Slurm is unreachable" in e.value.one_line() and "no answer in 1 s" in e.value.one_line()
    assert not isinstance(e.value, slurm.JobUnknown)


# -- Slurm answered that the job is gone: resubmitted, but never twice, never under its lock --

@pytest.fixture
def slurm_forgot(site):
    """site, with a stand-in scontrol that answers Slurm's "Invalid job id" for every
    job but 77 (a copy of job 42 already submitted again, running)."""
    scontrol = site["bin"] / "scontrol"
    scontrol.write_text(STAND_IN_SCONTROL)
    scontrol.chmod(0o755)
    return site


def test_a_job_slurm_forgot_is_submitted_again_once(slurm_forgot):
    site = slurm_forgot
    forgotten_job(site["images"])
    r = cli("restore", "42", "--json", env=site["env"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpucr-hpc.restore/1" and doc["resubmitted_as"] == "77", doc
    assert site["sbatch_log"].read_text().count("sbatch ") == 1
    again = cli("restore", "42", env=site["env"])
    assert again.returncode != 0, again.stdout
    err = again.stderr.strip()
    assert len(err.splitlines()) == 1 and "already submitted again as job 77, which is RUNNING" in err, err
    assert site["sbatch_log"].read_text().count("sbatch ") == 1, "submitted a second copy"


def test_no_resubmission_while_the_jobs_lock_is_held(slurm_forgot):
    from gpucr_hpc.job import lock as job_lock

    site = slurm_forgot
    job_dir = forgotten_job(site["images"])
    with job_lock.held(job_dir, "42", os.geteuid(), "the restore of job 42"):
        r = cli("restore", "42", env=site["env"])
    assert r.returncode != 0, r.stdout
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "job 42 is busy: `the restore of job 42`" in err, err
    never_submitted(site)


def test_status_json_of_a_job_slurm_forgot_has_typed_fields(slurm_forgot):
    site = slurm_forgot
    forgotten_job(site["images"])
    r = cli("status", "42", "--json", env=site["env"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpucr-hpc.job-status/1", doc
    assert doc["known_to_slurm"] is False and doc["state"] is None and doc["job"] == "42", doc
    assert "no job 42 known to Slurm" in doc["note"], doc
    text = cli("status", "42", env=site["env"]).stdout
    assert "not known to Slurm" in text and "UNKNOWN" not in text, text
