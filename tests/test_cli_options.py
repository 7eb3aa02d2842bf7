"""checkpoint / restore options: each one is used by the form it is given to, or refused
with one line (cause and fix); none is accepted and then ignored.

No Slurm cluster is touched: every run gets its own SLURM_CONF and a stand-in
`scontrol` first in PATH (it knows job 42 only, and logs its arguments).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from shim_helpers import REPO, build_shim, gpucr_cli, wait_for

from gpucr_hpc.store import manifest as mf

FAKE_SCONTROL = """#!/bin/sh
echo "$*" >> {log}
case "$*" in
  "show job -o 42") echo "JobId=42 JobName=train UserId=me({uid}) JobState={state} Restarts=0 NodeList=(null) \
Partition=debug Requeue=1";;
  "requeue 42"|"release 42") ;;
  *) echo "scontrol: error: Invalid job id specified" >&2; exit 1;;
esac
"""


@pytest.fixture
def slurm(tmp_path):
    """A site with the gpucr plugin line, an image root, and a stand-in scontrol for job 42."""
    bin_dir, images = tmp_path / "bin", tmp_path / "images"
    bin_dir.mkdir()
    images.mkdir()
    log = tmp_path / "scontrol.log"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(FAKE_SCONTROL.format(log=log, uid=os.getuid(), state="COMPLETED"))
    scontrol.chmod(0o755)
    (tmp_path / "plugstack.conf").write_text("optional /nowhere/spank_gpucr.so\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCR_", "SLURM_"))}
    env.update(SLURM_CONF=str(tmp_path / "slurm.conf"), GPUCR_IMAGE_ROOT=str(images),
               PATH=f"{bin_dir}:{env['PATH']}")
    return {"env": env, "images": images, "log": log, "cwd": tmp_path}


def cli(*args, env, cwd=None):
    """The CLI of this tree, also when run from another directory."""
    env = dict(env, PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p]))
    return subprocess.run(gpucr_cli() + list(args), capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=120)


def refused(r, expect):
    assert r.returncode != 0, r.stdout
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("gpucr-hpc: error:") and expect in err, err
    return err


def committed_generation(images, n):
    gen = images / "42" / f"gen-{n}"
    gen.mkdir(parents=True)
    mf.commit(gen, mf.new_manifest(kind="job", vendor=None, gpu=None))
    (images / "42" / "LATEST").write_text(f"gen-{n}\n")
    return gen


# -- restore --from: a generation for a job, a directory for a process image -----------

def test_restore_help_says_what_from_is_in_each_form(slurm):
    out = cli("restore", "--help", env=slurm["env"]).stdout
    assert "--from N|DIR" in out and "--from DIRECTORY" not in out
    text = " ".join(out.split())
    assert "With JOBID: the generation to restore, N or gen-N" in text
    assert "Without JOBID: the directory of a whole-process image" in text


def test_job_restore_from_a_generation_beside_a_file_of_that_name(slurm):
    """A file named 3 in the current directory does not stop `restore 42 --from 3`."""
    committed_generation(slurm["images"], 2)
    (slurm["cwd"] / "3").write_text("not an image\n")
    refused(cli("restore", "42", "--from", "3", env=slurm["env"], cwd=slurm["cwd"]),
            "gen-3 is not a committed checkpoint; pick one of: gen-2")
    r = cli("restore", "42", "--from", "gen-2", env=slurm["env"], cwd=slurm["cwd"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "job 42: restoring from gen-2; requeued"
    assert (slurm["images"] / "42" / "RESTORE").read_text() == "gen-2\n"
    assert "requeue 42" in slurm["log"].read_text().splitlines()


def test_job_restore_from_a_path_refused(slurm):
    refused(cli("restore", "42", "--from", str(slurm["cwd"]), env=slurm["env"]),
            "is not a generation; give --from N or --from gen-N")


@pytest.mark.parametrize("name,expect", [
    ("3", "--from 3 is a file, not an image directory"),
    ("gen-3", "no image directory gen-3; a generation number needs a job; restore JOBID --from gen-3"),
])
def test_process_restore_from_needs_a_directory(slurm, name, expect):
    if name == "3":
        (slurm["cwd"] / "3").write_text("")
    refused(cli("restore", "--from", name, env=slurm["env"], cwd=slurm["cwd"]), expect)


def test_pidns_help_does_not_say_root_only(slurm):
    text = " ".join(cli("restore", "--help", env=slurm["env"]).stdout.split())
    assert "(root)" not in text
    assert "new: a new PID namespace, where the processes keep their original PIDs (ordinary users get " \
           "it through the root helper" in text


# -- options that a form does not use: refused, before anything is done ------------------

@pytest.mark.parametrize("args,expect", [
    (["checkpoint", "42", "--leave-running"], "checkpoint JOBID always leaves the job running"),
    (["checkpoint", "42", "--timeout", "5000"], "--timeout applies to checkpoint --pid only"),
    (["checkpoint", "42", "--run-dir", "/tmp"], "--run-dir applies to --pid only"),
    (["checkpoint", "42", "--to", "/tmp/img"], "--to DIR applies to checkpoint --pid PID"),
    (["restore", "42", "--pidns", "new"], "--pidns applies to restore --from DIR only"),
    (["restore", "42", "--rewind-files"], "--rewind-files applies to restore --from DIR only"),
    (["restore", "42", "--run-dir", "/tmp"], "--run-dir applies to --pid only"),
    (["restore", "--pid", "1", "--pidns", "host"], "--pidns applies to restore --from DIR only"),
    (["restore", "--pid", "1", "--rewind-files"], "--rewind-files applies to restore --from DIR only"),
    (["restore", "--from", "/tmp", "--run-dir", "/tmp"], "--run-dir applies to restore --pid only"),
])
def test_unused_option_refused(slurm, args, expect):
    err = refused(cli(*args, env=slurm["env"]), expect)
    assert "; drop " in err
    assert not slurm["log"].exists(), "Slurm was asked before the refusal"


# -- --timeout and --run-dir reach the shims, in place and with --to ---------------------

STAND_IN = textwrap.dedent("""
    # Answers on <run dir>/<pid>.sock as a shim of a CUDA process would; a checkpoint
    # request is logged and refused, so nothing goes further.
    import json, os, socket, sys
    run_dir, log = sys.argv[1], sys.argv[2]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(os.path.join(run_dir, f"{os.getpid()}.sock"))
    s.listen()
    while True:
        c, _ = s.accept()
        req = json.loads(c.makefile().readline())
        with open(log, "a") as f:
            f.write(json.dumps(req) + "\\n")
        if req["cmd"] == "status":
            reply = {"ok": True, "pid": os.getpid(), "cuda": True, "state": "running"}
        else:
            reply = {"ok": False, "error": f"quiesce timed out after {req.get('timeout_ms')} ms (stand-in)"}
        c.sendall((json.dumps(reply) + "\\n").encode())
        c.close()
""")


class NoDriverWork:
    """The driver's view of a process without a CUDA context (cuda-python may be missing here)."""

    def state(self, pid, cuda=False):
        return None

    def lock(self, *a):
        raise AssertionError("the driver must not be reached")

    checkpoint = restore = unlock = lock


@pytest.mark.parametrize("to_image", [False, True])
def test_timeout_and_run_dir_reach_the_shim(tmp_path, monkeypatch, to_image):
    """The process runs under the real shim (its own socket in the default run dir) and
    answers as a CUDA process's shim on a socket in another run dir, given with --run-dir."""
    from gpucr_hpc.cli import main as cli_mod
    from gpucr_hpc.criu import run as criu_mod
    from gpucr_hpc.errors import GpucrError
    from gpucr_hpc.process import in_place

    if to_image:
        try:
            criu_mod.find_criu()
        except GpucrError as e:
            pytest.skip(f"CRIU >= 4.1 not available: {e.one_line()}")
    default_run, other_run = tmp_path / "run", tmp_path / "other-run"
    other_run.mkdir()
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    log = tmp_path / "requests.log"
    env = dict(os.environ, LD_PRELOAD=str(build_shim()), GPUCR_RUN_DIR=str(default_run))
    p = subprocess.Popen([sys.executable, str(tmp_path / "stand_in.py"), str(other_run), str(log)],
                         env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        assert wait_for(other_run / f"{p.pid}.sock") and wait_for(default_run / f"{p.pid}.sock")
        monkeypatch.setenv("GPUCR_RUN_DIR", str(default_run))
        monkeypatch.setattr(in_place, "_DRIVER", NoDriverWork())
        args = ["checkpoint", "--pid", str(p.pid), "--timeout", "1234", "--run-dir", str(other_run)]
        if to_image:
            args += ["--to", str(tmp_path / "img")]
        with pytest.raises(GpucrError, match="quiesce timed out after 1234 ms"):
            cli_mod.cli.main(args, standalone_mode=False)
        asked = [json.loads(line) for line in log.read_text().splitlines()]
        assert {"cmd": "checkpoint", "timeout_ms": 1234} in asked
        assert p.poll() is None and not (tmp_path / "img").exists()
    finally:
        p.kill()
        p.wait()
