"""Issue 32, the drain and the staging tier: what an ordinary user's job can do to
root through them, tried for real. Each test is the attack, run as an ordinary
user through `sbatch --gpucr=on` jobs on the test cluster with a staging tier
(plugstack stage=), against the installed plugin and its job epilog; each fails
if the attack works.

* The drain ran as root inside the user's directories and followed their links:
  a job that crafts its own staged generation, with draining/<node> and drained/
  links to root's files and staged files that link to a root-only file, got
  root's file chowned to it and the root-only bytes copied into its image dir.
  The drain now runs as the job's user and follows no link.
* The stage root was 1777: another user could make <stage>/<jobid> ahead of a
  job (and swap its generations); a leftover one of another user was used by
  the job and drained as it. The stage root is now root's, the plugin makes each
  job's dir, and one of another user is never staged into nor drained.
* Node memory: what a job left in its stage dir outside gen-* stayed there after
  the job, and a PERSISTING file the user made kept the run dir forever.
"""

import json
import os
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("the test cluster and the test users need root", allow_module_level=True)

from job_helpers import (  # noqa: E402
    assert_counted_once,
    counting_script,
    node_memory_stage,
    numbers,
    output_of,
    wait_for,
)
from user_helpers import as_user, gpucr_as  # noqa: E402

from gpucr_hpc.store.files import tree_digest  # noqa: E402


@pytest.fixture
def stage(slurm_cluster):
    with node_memory_stage(slurm_cluster) as root:
        yield root


def submit_as(cluster, user, *args) -> str:
    r = as_user(user, "sbatch", "--parsable", *args, env=cluster.env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def ended(cluster, jobid: str, out: Path) -> dict:
    info = cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
    assert info["JobState"] == "COMPLETED", (info, output_of(out))
    return info


def files_under(path: Path) -> list[Path]:
    return [Path(r) / n for r, _d, names in os.walk(path) for n in names]


# --- the drain as root, led by the user's links ------------------------------------

CRAFT = r'''
"""The user's job: a staged generation of its own making, for the epilog's drain."""
import hashlib, json, os, sys
stage_node, root_file, root_dir, secret, size = sys.argv[1:6]
size = int(size)
job, node, uid = os.environ["SLURM_JOB_ID"], os.environ["SLURMD_NODENAME"], os.getuid()
gen = os.path.join(os.environ["GPUCR_IMAGE_ROOT"], job, "gen-1")

def marker(data):
    return (json.dumps({"manifest_sha256": hashlib.sha256(data).hexdigest()}) + "\n").encode()

def publish(folder, manifest, name):
    data = json.dumps(manifest).encode()
    open(os.path.join(folder, "manifest.json"), "wb").write(data)
    open(os.path.join(folder, name), "wb").write(marker(data))

stage = os.path.join(stage_node, job)
os.makedirs(stage, exist_ok=True)  # the plugin's now; with a 1777 stage root, the user's to make
unit = os.path.join(stage, "gen-1", "rank-0.0")
os.makedirs(os.path.join(unit, "criu"))
os.symlink(secret, os.path.join(unit, "criu", "pages-1.img"))  # root-only bytes, "staged"
publish(unit, {"format": "gpucr-hpc-image", "format_version": 1, "kind": "process", "owner_uid": uid,
               "files": {"criu/pages-1.img": {"size": size}}, "total_bytes": size}, "COMMITTED")
os.makedirs(os.path.join(gen, "draining"))
os.symlink(root_file, os.path.join(gen, "draining", node))   # the heartbeat's touch + chown
os.symlink(root_dir, os.path.join(gen, "drained"))           # finish_drain's mkdir + chown
publish(gen, {"format": "gpucr-hpc-image", "format_version": 1, "kind": "job", "owner_uid": uid,
              "units": {"rank-0.0": {"name": "rank-0.0", "node": node, "staged": True, "bytes": size}},
              "nodes": [node], "files": {}, "total_bytes": 0,
              "submission": os.environ.get("GPUCR_SUBMISSION")}, "STAGED")
with open(os.path.join(os.environ["GPUCR_IMAGE_ROOT"], job, "LATEST"), "w") as f:
    f.write("gen-1\n")
print("crafted", flush=True)
'''


def test_a_crafted_staged_generation_gets_the_user_no_root_file(slurm_cluster, users, users_tmp, jobdir, stage):
    a = users[0]
    root_file = users_tmp / "root-owned"      # stands for /etc/passwd
    root_file.write_text("root's own\n")
    root_file.chmod(0o644)
    root_dir = users_tmp / "root-dir"         # stands for /etc
    root_dir.mkdir(mode=0o755)
    secret = users_tmp / "secret"             # stands for the node key
    secret.write_bytes(b"ROOT-ONLY-" * 410)
    secret.chmod(0o600)
    assert as_user(a, "cat", str(secret)).returncode != 0, "the secret must be root's alone"
    (jobdir / "craft.py").write_text(CRAFT)
    out = jobdir / "job.out"
    (jobdir / "job.sh").write_text(f"#!/bin/bash\n{sys.executable} {jobdir}/craft.py {stage}/n1 {root_file} "
                                   f"{root_dir} {secret} {secret.stat().st_size}\n")
    jobid = submit_as(slurm_cluster, a, "--gpucr=on", "-w", "n1", "-o", str(out), str(jobdir / "job.sh"))
    ended(slurm_cluster, jobid, out)
    assert "crafted" in output_of(out), output_of(out)
    job_dir = slurm_cluster.state / "images" / jobid
    gen = job_dir / "gen-1"
    # The epilog's drain has run once the job's staging dir is gone (and the
    # generation is marked either way).
    wait_for(lambda: not os.path.lexists(stage / "n1" / jobid), timeout=120, what="the drain and the removal",
             detail=lambda: slurm_cluster.restore_log(jobid))
    wait_for(lambda: (gen / "DRAIN_FAILED").exists() or (gen / "COMMITTED").exists(), timeout=30,
             what="the drain's verdict", detail=lambda: slurm_cluster.restore_log(jobid))
    st = root_file.stat()
    assert (st.st_uid, root_file.read_text()) == (0, "root's own\n"), "root's file was given to the user"
    assert root_dir.stat().st_uid == 0 and not list(root_dir.iterdir()), "root's directory was written and given away"
    assert secret.stat().st_uid == 0 and secret.stat().st_mode & 0o777 == 0o600
    leaked = [p for p in files_under(job_dir) if not p.is_symlink() and b"ROOT-ONLY-" in p.read_bytes()]
    assert not leaked, f"root-only bytes copied into the user's image dir: {leaked}"
    assert "failed" in slurm_cluster.restore_log(jobid), slurm_cluster.restore_log(jobid)


# --- another user's staging dir --------------------------------------------------

def test_another_users_staging_dir_is_never_made_used_nor_drained(slurm_cluster, users, jobdir, stage):
    """User b cannot make a staging dir for someone's job (the stage root is root's);
    one of b's left under the victim's job id (root made it here, as for a job id
    handed out again) is neither staged into by the victim's preemption, which goes
    to the image root and restores, nor drained as the victim."""
    a, b = users
    steps = 300
    log, out = jobdir / "count.txt", jobdir / "job.out"
    script = counting_script(jobdir, log, steps)
    jobid = submit_as(slurm_cluster, a, "--hold", "--gpucr=on", "-w", "n1", "-o", str(out), str(script))
    planted = stage / "n1" / jobid
    try:
        r = as_user(b, "mkdir", "-m", "0777", str(planted))
        assert r.returncode != 0 and not planted.exists(), "another user made the job's staging dir"
        planted.mkdir(mode=0o777, exist_ok=True)
        planted.chmod(0o777)
        os.chown(planted, b.pw_uid, b.pw_gid)
        for rel in ("b-was-here", "gen-7/rank-0.0/b-was-here"):
            (planted / rel).parent.mkdir(parents=True, exist_ok=True)
            (planted / rel).write_text("b's\n")
        for p in (planted / "gen-7", planted / "gen-7" / "rank-0.0", *files_under(planted)):
            os.chown(p, b.pw_uid, b.pw_gid)
        before = tree_digest(planted)
        slurm_cluster.run("scontrol", "release", jobid)
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: len(numbers(log)) > 10, what="the counter to start", detail=lambda: output_of(out))
        pre = gpucr_as(a, "preempt", jobid, "--json", env=slurm_cluster.env)
        assert pre.returncode == 0, pre.stderr
        manifest = json.loads((slurm_cluster.state / "images" / jobid / "gen-1" / "manifest.json").read_text())
        assert not any(u.get("staged") for u in manifest["units"].values()), \
            f"the victim staged into another user's dir: {manifest['units']}"
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=240)
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", \
            (output_of(out), slurm_cluster.restore_log(jobid))
        assert_counted_once(log, steps)
        wait_for(lambda: slurm_cluster.job(jobid).get("JobState") == "COMPLETED", what="the epilog")
        time.sleep(5)  # a drain the epilog started for it would be at work by now
        assert planted.lstat().st_uid == b.pw_uid and tree_digest(planted) == before, \
            "a drain ran in another user's staging dir as the job's"
        job_dir = slurm_cluster.state / "images" / jobid
        assert not [p for p in files_under(job_dir) if p.name == "b-was-here"], "b's files in the victim's dir"
        assert "drained from" not in slurm_cluster.restore_log(jobid)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


# --- node memory and the run dir after the job -------------------------------------

def test_what_a_job_leaves_in_node_memory_and_its_own_persisting_do_not_outlive_it(
        slurm_cluster, users, jobdir, stage):
    a = users[0]
    out = jobdir / "job.out"
    (jobdir / "job.sh").write_text(f"""#!/bin/bash
d={stage}/n1/$SLURM_JOB_ID
mkdir -p $d
head -c 4M /dev/zero > $d/junk
mkdir -p $d/more && head -c 1M /dev/zero > $d/more/junk
touch "$GPUCR_RUN_DIR/PERSISTING"
echo "rundir=$GPUCR_RUN_DIR"
ls $d "$GPUCR_RUN_DIR"
""")
    jobid = submit_as(slurm_cluster, a, "--gpucr=on", "-w", "n1", "-o", str(out), str(jobdir / "job.sh"))
    ended(slurm_cluster, jobid, out)
    text = output_of(out)
    assert "junk" in text and "PERSISTING" in text and "rundir=" in text, text
    assert text.split("rundir=", 1)[1].split()[0].endswith(f"/{jobid}"), text
    rundir = slurm_cluster.state / "run" / "n1" / jobid  # node n1's run dir, as this machine sees it
    wait_for(lambda: not os.path.lexists(stage / "n1" / jobid), timeout=60,
             what="the job's staging dir, junk and all, to go",
             detail=lambda: sorted(str(p) for p in (stage / "n1").rglob("*")))
    wait_for(lambda: not os.path.lexists(rundir), timeout=30,
             what="the run dir, whose PERSISTING the user made, to go")
