"""The gpucr SPANK plugin (spank/) on the real local Slurm cluster.

The module builds spank/ from this checkout and, for its own duration, points the
cluster's plugstack.conf at that build with test settings: a stand-in shim (any
preloadable library does; the plugin only checks it exists and puts it in LD_PRELOAD)
and a run dir root per node (`%n`), since all nodes of the test cluster share one file
system. plugstack.conf is re-read for every step, so no daemon restarts; the original
file is put back at the end.
"""

import json
import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parent.parent
TEST_USER = "gpucrtest"

PROBE = r'''
import json, os, sys
rd = os.environ.get("GPUCR_RUN_DIR")
info = {
    "host": os.uname().nodename,
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "uid": os.getuid(),
    "tag": sys.argv[1] if len(sys.argv) > 1 else "",
    "env": {k: v for k, v in os.environ.items()
            if (k.startswith("GPUCR_") and not k.startswith("GPUCR_TESTCLUSTER"))
            or k in ("LD_PRELOAD", "SLURM_PROCID", "SLURM_STEP_ID")},
}
if rd and os.path.isdir(rd):
    st = os.stat(rd)
    info["rundir"] = {"uid": st.st_uid, "mode": oct(st.st_mode & 0o7777),
                      "tasks": sorted(os.listdir(os.path.join(rd, "tasks")))}
    rec = os.path.join(rd, "tasks", "%s.%s" % (os.environ["GPUCR_STEP_ID"],
                                               os.environ["GPUCR_LOCAL_RANK"]))
    if os.path.exists(rec):
        info["record"] = dict(line.split("=", 1) for line in open(rec).read().split())
    sub = os.path.join(rd, "submission")
    if info["tag"].startswith("sub") and os.path.exists(sub):
        info["submission"] = open(sub).read().strip()
# Into a file, named on a short line: srun splits an output line over 1 KiB, and
# the lines of two tasks then interleave.
path = "/tmp/gpucr-probe-%d-%d.json" % (os.getpid(), __import__("time").time_ns())
with open(path, "w") as f:
    json.dump(info, f)
print("PROBE @" + path, flush=True)
'''


def probes(text):
    out = []
    for line in text.splitlines():
        if "PROBE @" in line:
            path = Path(line.split("PROBE @", 1)[1].strip())
            out.append(json.loads(path.read_text()))
    return out


class Spank:
    """The test cluster with this checkout's plugin and test site settings."""

    def __init__(self, cluster, root: Path):
        self.cluster = cluster
        self.root = root
        self.shim = root / "lib" / "libgpucr-test.so"
        self.plugin = root / "lib" / "spank_gpucr.so"
        self.probe = root / "probe.py"
        self.out = root / "out"
        self.plugstack = cluster.state / "etc" / "plugstack.conf"
        # keep the cluster's choice of `required` / `optional`
        words = self.plugstack.read_text().split()
        self.keyword = words[0] if words and words[0] in ("required", "optional") else "optional"
        # The batch step runs under the installed gpucr-hpc supervisor (cli=, bindir=).
        self.installed = dict(w.split("=", 1) for w in words if w.startswith(("cli=", "bindir=")))

    def rundir_root(self, node):
        return self.root / "nodes" / node / "run"

    def line(self, **override):
        args = {"shim": str(self.shim), "rundir": str(self.root / "nodes" / "%n" / "run"),
                "imageroot": str(self.root / "images"),
                "arena": str(self.root / "nodes" / "%n" / "arena"),
                "gpu_feature": "gpu_nvidia", **self.installed}
        args.update(override)
        options = " ".join(f"{k}={v}" for k, v in args.items())
        return f"{self.keyword} {self.plugin} {options}\n"

    def configure(self, text):
        self.plugstack.write_text(text)

    def run(self, *argv, user=None, check=False, timeout=90, env=None):
        if user:
            argv = ("runuser", "-u", user, "--") + argv
        return self.cluster.run(*argv, check=check, timeout=timeout,
                                env=env or self.cluster.env)

    def batch(self, script, *args, user=None, env=None):
        """sbatch --wait; returns (jobid, exit code, job output)."""
        path = self.out / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/bash\n" + script)
        path.chmod(0o755)
        out = self.out / (path.stem + ".out")
        res = self.run("sbatch", "--wait", "--parsable", "-o", str(out), *args, str(path),
                       user=user, env=env)
        jobid = res.stdout.strip().split(";")[0]
        text = out.read_text() if out.exists() else ""
        return jobid, res.returncode, text + res.stderr

    def wait_gone(self, path: Path, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not path.exists():
                return True
            time.sleep(0.2)
        return False


@pytest.fixture(scope="module")
def spank(slurm_cluster, tmp_path_factory):
    build = subprocess.run(["make", "-C", str(REPO / "spank")], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    root = slurm_cluster.state / "spanktest"
    shutil.rmtree(root, ignore_errors=True)
    (root / "lib").mkdir(parents=True)
    (root / "out").mkdir()
    (root / "images").mkdir()
    for d in (root, root / "lib"):
        d.chmod(0o755)
    (root / "out").chmod(0o1777)
    (root / "images").chmod(0o1777)  # as sites had it; the plugin makes each job dir (imagedir.c)
    s = Spank(slurm_cluster, root)
    shutil.copy(REPO / "spank" / "spank_gpucr.so", s.plugin)
    src = tmp_path_factory.mktemp("shim") / "shim.c"
    src.write_text("int gpucr_test_shim_loaded = 1;\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(s.shim), str(src)], check=True)
    s.probe.write_text(PROBE)
    for f in (s.plugin, s.shim, s.probe):
        f.chmod(0o755)
    original = s.plugstack.read_text()
    s.configure(s.line())
    try:
        yield s
    finally:
        s.plugstack.write_text(original)


@pytest.fixture(scope="module")
def test_user():
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/bash",
                        TEST_USER], check=True, capture_output=True)
        return pwd.getpwnam(TEST_USER)


def check_gpucr_task(p, spank, jobid, step, user_preload=()):
    env = p["env"]
    preload = env["LD_PRELOAD"].split(":")
    assert preload[0] == str(spank.shim), env["LD_PRELOAD"]
    assert preload.count(str(spank.shim)) == 1, env["LD_PRELOAD"]
    assert preload[1:] == list(user_preload), env["LD_PRELOAD"]
    assert env["GPUCR_JOB_ID"] == jobid
    assert env["GPUCR_STEP_ID"] == step
    assert env["GPUCR_RUN_DIR"] == str(spank.rundir_root(p["host"]) / jobid)
    assert env["GPUCR_IMAGE_ROOT"] == str(spank.root / "images")
    assert env["GPUCR_ARENA_DIR"] == str(spank.root / "nodes" / p["host"] / "arena")
    assert env["GPUCR_GPU_FEATURE"] == "gpu_nvidia"
    assert env["GPUCR_NODENAME"] == p["host"]
    assert p["rundir"]["uid"] == p["uid"]
    assert p["rundir"]["mode"] == "0o700"
    rec = p["record"]
    assert rec["rank"] == env["GPUCR_RANK"] and rec["step"] == step
    assert rec["local_id"] == env["GPUCR_LOCAL_RANK"]
    assert int(rec["pid"]) in (p["pid"], p["ppid"])  # the task itself or the shell around us


def test_option_in_help(spank):
    for tool in ("sbatch", "srun", "salloc"):
        out = spank.run(tool, "--help")
        assert "--gpucr" in out.stdout, f"{tool} --help lacks --gpucr"


def test_batch_and_srun_steps_multinode(spank):
    """The batch step and srun steps on 2 nodes x 2 tasks, with the user's LD_PRELOAD."""
    user_lib = "/lib/x86_64-linux-gnu/libm.so.6"
    env = dict(spank.cluster.env, LD_PRELOAD=user_lib)
    jobid, rc, out = spank.batch(
        f"python3 {spank.probe} batch\n"
        f"srun python3 {spank.probe} step0\n"
        f"srun python3 {spank.probe} step1\n"
        f"python3 {spank.probe} after\n",
        "--gpucr=on", "-N2", "--ntasks-per-node=2", "--export=ALL", env=env)
    assert rc == 0, out
    ps = probes(out)
    batch = [p for p in ps if p["tag"] == "batch"]
    assert len(batch) == 1
    check_gpucr_task(batch[0], spank, jobid, "batch", [user_lib])
    assert batch[0]["env"]["GPUCR_RANK"] == "0"
    for n, tag in enumerate(("step0", "step1")):
        step = [p for p in ps if p["tag"] == tag]
        assert sorted(int(p["env"]["GPUCR_RANK"]) for p in step) == [0, 1, 2, 3]
        assert len({p["host"] for p in step}) == 2
        for p in step:
            # inherited from the batch step's LD_PRELOAD: still once, still first
            check_gpucr_task(p, spank, jobid, str(n), [user_lib])
            assert p["env"]["GPUCR_RANK"] == p["env"]["SLURM_PROCID"]
            assert f"{n}.{p['env']['GPUCR_LOCAL_RANK']}" in p["rundir"]["tasks"]
        # each node has its own run dir
        assert len({p["env"]["GPUCR_RUN_DIR"] for p in step}) == 2
    # the registry forgets tasks that ended
    (after,) = [p for p in ps if p["tag"] == "after"]
    assert after["rundir"]["tasks"] == ["batch.0"]
    # removed from every node at job end
    for host in {p["host"] for p in ps}:
        assert spank.wait_gone(spank.rundir_root(host) / jobid), f"run dir left on {host}"


def test_salloc_steps(spank):
    res = spank.run("salloc", "--gpucr=on", "-N2", "--ntasks-per-node=2",
                    "srun", "python3", str(spank.probe), "salloc")
    assert res.returncode == 0, res.stderr
    ps = probes(res.stdout)
    assert len(ps) == 4
    jobid = ps[0]["env"]["GPUCR_JOB_ID"]
    for p in ps:
        check_gpucr_task(p, spank, jobid, "0")
    for host in {p["host"] for p in ps}:
        assert spank.wait_gone(spank.rundir_root(host) / jobid)


def test_srun_job_without_batch(spank):
    res = spank.run("srun", "--gpucr", "-N2", "--ntasks-per-node=2",
                    "python3", str(spank.probe), "srun")
    assert res.returncode == 0, res.stderr
    ps = probes(res.stdout)
    assert sorted(int(p["env"]["GPUCR_RANK"]) for p in ps) == [0, 1, 2, 3]
    for p in ps:
        check_gpucr_task(p, spank, p["env"]["GPUCR_JOB_ID"], "0")


def test_non_root_user(spank, test_user):
    jobid, rc, out = spank.batch(
        f"python3 {spank.probe} batch\nsrun python3 {spank.probe} step\n",
        "--gpucr=on", "-N2", "--ntasks-per-node=1", user=TEST_USER)
    assert rc == 0, out
    ps = probes(out)
    assert len(ps) == 3
    for p in ps:
        assert p["uid"] == test_user.pw_uid
        check_gpucr_task(p, spank, jobid, "batch" if p["tag"] == "batch" else "0")
    for host in {p["host"] for p in ps}:
        assert spank.wait_gone(spank.rundir_root(host) / jobid)


def test_jobs_without_option_untouched(spank):
    env = dict(spank.cluster.env, LD_PRELOAD="/lib/x86_64-linux-gnu/libm.so.6")
    for args in ((), ("--gpucr=off",)):
        jobid, rc, out = spank.batch(
            f"python3 {spank.probe} batch\nsrun python3 {spank.probe} step\n",
            *args, "-N1", "--export=ALL", env=env)
        assert rc == 0, out
        ps = probes(out)
        assert len(ps) == 2
        for p in ps:
            assert not [k for k in p["env"] if k.startswith("GPUCR_")], p["env"]
            assert p["env"]["LD_PRELOAD"] == "/lib/x86_64-linux-gnu/libm.so.6"
        assert not (spank.rundir_root("n1") / jobid).exists()


def test_srun_off_inside_on_job(spank):
    jobid, rc, out = spank.batch(
        f"srun --gpucr=off python3 {spank.probe} off\nsrun python3 {spank.probe} on\n",
        "--gpucr=on", "-N1")
    assert rc == 0, out
    ps = {p["tag"]: p for p in probes(out)}
    assert not any(k.startswith("GPUCR_") for k in ps["off"]["env"])
    assert "LD_PRELOAD" not in ps["off"]["env"]
    check_gpucr_task(ps["on"], spank, jobid, "1")


def test_each_submission_has_its_own_token_in_every_step(spank):
    """GPUCR_SUBMISSION = <cluster>:<uid>:<token>: the same in the batch step, its srun
    steps and the node's run dir (also with --export=NONE), another for the next job."""
    seen = []
    for export in ("--export=ALL", "--export=NONE"):
        jobid, rc, out = spank.batch(f"/usr/bin/python3 {spank.probe} sub-batch\n"
                                     f"srun /usr/bin/python3 {spank.probe} sub-step\n",
                                     "--gpucr=on", "-N1", export)
        assert rc == 0, out
        ps = probes(out)
        assert len(ps) == 2, out
        ids = {p["env"].get("GPUCR_SUBMISSION") for p in ps} | {p.get("submission") for p in ps}
        assert len(ids) == 1, ps
        seen.append(ids.pop())
        assert re.fullmatch(rf"gpucrtest:{ps[0]['uid']}:[0-9a-f]{{32}}", seen[-1] or ""), seen
    assert seen[0] != seen[1]


@pytest.mark.parametrize("option", ["gpucr", "gpucr-outside"])
@pytest.mark.parametrize("tool", ["sbatch", "srun", "salloc"])
def test_bad_value_rejected_before_submission(spank, tool, option):
    before = spank.run("squeue", "-h", "-o", "%i").stdout.split()
    bad = f"--{option}=maybe"
    argv = {"sbatch": ["sbatch", bad, "--wrap", "true"],
            "srun": ["srun", bad, "true"],
            "salloc": ["salloc", bad, "true"]}[tool]
    res = spank.run(*argv)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--{option} argument" in lines[0] and "maybe" in lines[0], res.stderr
    assert spank.run("squeue", "-h", "-o", "%i").stdout.split() == before


def outside_of(spank, *args, script=None):
    """{tag: GPUCR_OUTSIDE} of a --gpucr=on batch job's batch step and its srun steps."""
    script = script or f"python3 {spank.probe} batch\nsrun python3 {spank.probe} step\n"
    jobid, rc, out = spank.batch(script, "--gpucr=on", "-N1", *args)
    assert rc == 0, out
    return {p["tag"]: p["env"].get("GPUCR_OUTSIDE") for p in probes(out)}


def test_outside_policy_reaches_every_step(spank):
    """GPUCR_OUTSIDE in every task of every step: the site's outside= (refuse when not
    set), unless the job chose --gpucr-outside (sbatch for the whole job, srun for its
    step alone)."""
    both = {"batch": "refuse", "step": "refuse"}
    assert outside_of(spank) == both
    assert outside_of(spank, "--gpucr-outside=close") == {"batch": "close", "step": "close"}
    spank.configure(spank.line(outside="close"))
    try:
        assert outside_of(spank) == {"batch": "close", "step": "close"}
        assert outside_of(spank, "--gpucr-outside=refuse") == both
        assert outside_of(spank, script=f"python3 {spank.probe} batch\n"
                                        f"srun --gpucr-outside=refuse python3 {spank.probe} step\n"
                                        f"srun python3 {spank.probe} after\n") == \
            {"batch": "close", "step": "refuse", "after": "close"}
    finally:
        spank.configure(spank.line())
    res = spank.run("salloc", "--gpucr=on", "--gpucr-outside=close", "-N1",
                    "srun", "python3", str(spank.probe), "salloc")
    assert res.returncode == 0, res.stderr
    assert [p["env"].get("GPUCR_OUTSIDE") for p in probes(res.stdout)] == ["close"]


def test_run_dir_kept_while_persisting(spank, test_user):
    """Root's PERSISTING keeps the run dir at job end; one the job's user made (the
    run dir is theirs) does not: it would keep it, and node memory, forever."""
    jobid, rc, out = spank.batch('touch "$GPUCR_RUN_DIR/PERSISTING"\necho "$GPUCR_RUN_DIR"\n',
                                 "--gpucr=on", "-N1")
    assert rc == 0, out
    rundir = Path(out.splitlines()[0])
    time.sleep(3)  # the epilog has run by now
    try:
        assert rundir.is_dir() and (rundir / "PERSISTING").exists()
        assert (rundir / "PERSISTING").stat().st_uid == 0
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    jobid, rc, out = spank.batch('touch "$GPUCR_RUN_DIR/PERSISTING"\necho "$GPUCR_RUN_DIR"\n'
                                 'ls -ln "$GPUCR_RUN_DIR"\n', "--gpucr=on", "-N1", user=TEST_USER)
    assert rc == 0 and "PERSISTING" in out, out
    rundir = Path(out.splitlines()[0])
    try:
        assert spank.wait_gone(rundir), "the user's own PERSISTING kept the run dir"
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def test_staging_dir_is_made_for_the_job_user_and_removed_after(spank, test_user):
    """stage=: the plugin makes <stage>/<jobid> as root for the job's user (0700) at
    step setup, and the epilog removes it, with what the job left there, once the
    job has ended. A stage root users can write to (1777) is not used, and the job
    runs all the same (it does not stage)."""
    stage = spank.root / "nodes" / "%n" / "stage"
    for node in ("n1", "n2", "n3"):
        (spank.root / "nodes" / node / "stage").mkdir(parents=True, exist_ok=True)
        (spank.root / "nodes" / node / "stage").chmod(0o755)
    spank.configure(spank.line(stage=str(stage)))
    try:
        script = ('d=$(dirname $GPUCR_RUN_DIR); d=$(dirname $d)/stage/$SLURM_JOB_ID\n'
                  'echo "$d"; stat -c "%u %a %F" "$d"; head -c 1M /dev/zero > "$d/left"; true\n')
        jobid, rc, out = spank.batch(script, "--gpucr=on", "-N1", user=TEST_USER)
        assert rc == 0, out
        lines = out.splitlines()
        where = Path(lines[0])
        assert lines[1] == f"{test_user.pw_uid} 700 directory", out
        assert spank.wait_gone(where), f"{where} outlived the job"
        node = where.parent.parent.name
        (spank.root / "nodes" / node / "stage").chmod(0o1777)
        jobid, rc, out = spank.batch(script, "--gpucr=on", "-N1", "-w", node, user=TEST_USER)
        assert rc == 0 and "No such file" in out, out
        assert not (spank.root / "nodes" / node / "stage" / jobid).exists()
    finally:
        spank.configure(spank.line())


def test_setup_failure_fails_only_gpucr_jobs(spank):
    """Shim missing on the nodes: --gpucr=on jobs fail with one clear line before the
    user's program runs; other jobs run; no node is drained."""
    spank.configure(spank.line(shim=str(spank.root / "lib" / "missing.so")))
    try:
        jobid, rc, out = spank.batch("echo USER CODE RAN\n", "--gpucr=on", "-N1")
        assert rc != 0
        assert "USER CODE RAN" not in out
        assert f"gpucr: error: shim {spank.root}/lib/missing.so not found" in out
        res = spank.run("srun", "--gpucr=on", "-N2", "echo", "USER CODE RAN")
        assert res.returncode != 0 and "USER CODE RAN" not in res.stdout
        assert "gpucr: error: shim" in res.stderr
        jobid, rc, out = spank.batch("echo PLAIN RAN\n", "-N1")
        assert rc == 0 and "PLAIN RAN" in out
    finally:
        spank.configure(spank.line())
    states = spank.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()
    assert not [s for s in states if s.startswith(("drain", "down"))], states


def test_unsafe_run_dir_root_refused(spank):
    """A run dir root that users can write to would let them plant run dirs."""
    unsafe = spank.root / "unsafe"
    unsafe.mkdir(exist_ok=True)
    unsafe.chmod(0o1777)
    spank.configure(spank.line(rundir=str(unsafe)))
    try:
        jobid, rc, out = spank.batch("echo USER CODE RAN\n", "--gpucr=on", "-N1")
        assert rc != 0 and "USER CODE RAN" not in out
        assert f"run dir root {unsafe} must be owned by root" in out
    finally:
        spank.configure(spank.line())


def test_bad_plugstack_argument_fails_only_gpucr_jobs(spank):
    spank.configure(spank.line(bogus="1"))
    try:
        res = spank.run("srun", "-N1", "echo", "PLAIN RAN")
        assert res.returncode == 0 and "PLAIN RAN" in res.stdout, res.stderr
        # refused by sbatch (`required` plugin) or failed on the node (`optional`)
        jobid, rc, out = spank.batch("echo USER CODE RAN\n", "--gpucr=on", "-N1")
        assert rc != 0
        assert "USER CODE RAN" not in out
        assert "gpucr: unknown plugstack.conf argument 'bogus=1'" in out
    finally:
        spank.configure(spank.line())


def test_plugin_disabled(spank):
    """A site without the plugin in plugstack.conf: --gpucr is unknown, jobs run as ever."""
    spank.configure("# gpucr disabled\n")
    try:
        res = spank.run("sbatch", "--gpucr=on", "--wrap", "true")
        assert res.returncode != 0 and "gpucr" in res.stderr
        jobid, rc, out = spank.batch(f"python3 {spank.probe} batch\n", "-N1")
        assert rc == 0, out
        (p,) = probes(out)
        assert not any(k.startswith("GPUCR_") for k in p["env"])
        assert "LD_PRELOAD" not in p["env"]
    finally:
        spank.configure(spank.line())


def sbatch_signal(spank, *args, env=None) -> str:
    """The warning signal sbatch would submit (`sbatch -v` prints its options)."""
    script = spank.out / "signal.sh"
    script.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {a}\n" for a in args if a.startswith("#"))
                      .replace("#SBATCH #", "#SBATCH ") + "true\n")
    cmdline = [a for a in args if not a.startswith("#")]
    res = spank.run("sbatch", "-v", "--hold", "--parsable", *cmdline, str(script), env=env)
    assert res.returncode == 0, res.stderr
    spank.run("scancel", res.stdout.strip().split(";")[0])
    found = re.search(r"^sbatch: signal\s*: (\S+)$", res.stderr, re.M)
    return found.group(1) if found else ""


def test_gpucr_job_gets_the_checkpoint_warning_signal(spank):
    """--gpucr=on, on the command line (even after -o FILE) or in an #SBATCH line, asks
    for the site's warning signal for the batch step alone; the user's own wins."""
    assert sbatch_signal(spank, "--gpucr=on") == "B:USR2@120"
    assert sbatch_signal(spank, "-o", "/dev/null", "--gpucr") == "B:USR2@120"
    assert sbatch_signal(spank, "#--gpucr=on") == "B:USR2@120"
    assert sbatch_signal(spank, "--gpucr=on", "--signal=B:USR1@30") == "B:USR1@30"
    env = dict(spank.cluster.env, SBATCH_SIGNAL="USR1@40")
    assert sbatch_signal(spank, "--gpucr=on", env=env) == "USR1@40"
    assert sbatch_signal(spank) == ""
    assert sbatch_signal(spank, "--gpucr=off") == ""
    spank.configure(spank.line(signal="XCPU@300"))
    try:
        assert sbatch_signal(spank, "--gpucr=on") == "B:XCPU@300"
        spank.configure(spank.line(signal="off"))
        assert sbatch_signal(spank, "--gpucr=on") == ""
    finally:
        spank.configure(spank.line())


def test_bad_signal_argument_fails_only_gpucr_jobs(spank):
    spank.configure(spank.line(signal="KILL@10"))
    try:
        jobid, rc, out = spank.batch("echo ran\n", "--gpucr=on", "-N1")
        assert rc != 0 and "signal=KILL@10" in out and "SIG@SECONDS" in out, out
        jobid, rc, out = spank.batch("echo ran\n", "-N1")
        assert rc == 0 and "ran" in out, out
    finally:
        spank.configure(spank.line())


def test_batch_script_runs_under_the_supervisor(spank):
    """The script is the supervisor's child: its pid is the one registered, it does not
    see the supervisor's variables or the request for SBATCH_SIGNAL, its exit status is
    the job's, and a signal sent to the batch step alone reaches it."""
    jobid, rc, out = spank.batch(
        'echo "pid=$$"; env | grep -E "^(GPUCR_BATCH|GPUCR_CHECKPOINT|SBATCH_SIGNAL|GPUCR_SBATCH)" '
        '| sed "s/^/leak: /"; cat "$GPUCR_RUN_DIR/tasks/batch.0"\n'
        'trap "echo got USR1; exit 7" USR1\n'
        'scancel --batch --signal=USR1 "$SLURM_JOB_ID"\n'
        'for i in $(seq 100); do sleep 0.1; done; echo "no signal"\n',
        "--gpucr=on", "-N1")
    assert "leak:" not in out, out
    pid = next(ln.split("=")[1] for ln in out.splitlines() if ln.startswith("pid="))
    assert f"pid={pid}" in out.splitlines()[1:], out   # the registry names the script
    assert "got USR1" in out and "no signal" not in out, out
    assert rc == 7, out


FAST_VARS = ("GPUCR_RUN_DIR", "GPUCR_COPY_HELPER", "GPUCR_COPY_HELPER_START", "GPUCR_ARENA_PREALLOC")
# short lines: srun splits long ones of tasks on several nodes
FAST_PROBE = f"""import json, os
print("FAST " + json.dumps(dict(host=os.uname().nodename, **{{k: os.environ[k] for k in {FAST_VARS!r}
                                                             if k in os.environ}})), flush=True)
"""


def fast_probes(text):
    return [json.loads(line.split("FAST ", 1)[1]) for line in text.splitlines() if "FAST " in line]


def test_site_fast_path_reaches_every_task(spank):
    """plugstack copy_helper=on arena_prealloc=auto: every task of every step has
    the copy helper's socket in its own node's run dir and the command the shim
    starts it with, and the arena setting; a job's own GPUCR_ARENA_PREALLOC and
    GPUCR_COPY_HELPER=off win. Without them in plugstack.conf the arena is made
    ahead all the same (auto, the default) and no copy helper is set;
    arena_prealloc=off sets none."""
    cli = spank.installed.get("cli", "/usr/local/bin/gpucr-hpc")
    probe = spank.root / "fast_probe.py"
    probe.write_text(FAST_PROBE)
    probe.chmod(0o755)
    script = f"python3 {probe}\nsrun python3 {probe}\n"
    jobid, rc, out = spank.batch(script, "--gpucr=on", "-N1")
    assert rc == 0, out
    for p in fast_probes(out):
        assert p["GPUCR_RUN_DIR"] and p.get("GPUCR_ARENA_PREALLOC") == "auto", p
        assert not {"GPUCR_COPY_HELPER", "GPUCR_COPY_HELPER_START"} & set(p), p
    spank.configure(spank.line(arena_prealloc="off"))
    jobid, rc, out = spank.batch(script, "--gpucr=on", "-N1")
    assert rc == 0, out
    for p in fast_probes(out):
        assert p["GPUCR_RUN_DIR"] and not set(FAST_VARS[1:]) & set(p), p
    spank.configure(spank.line(copy_helper="on", arena_prealloc="auto"))
    try:
        jobid, rc, out = spank.batch(script, "--gpucr=on", "-N2", "--ntasks-per-node=1")
        assert rc == 0, out
        ps = fast_probes(out)
        assert len(ps) == 3 and len({p["host"] for p in ps}) == 2, out
        for p in ps:
            # a step on another node than the batch step's gets its own node's socket
            assert p["GPUCR_COPY_HELPER"] == p["GPUCR_RUN_DIR"] + "/copy-helper.sock", p
            assert p["GPUCR_COPY_HELPER_START"] == cli
            assert p["GPUCR_ARENA_PREALLOC"] == "auto"
        env = dict(spank.cluster.env, GPUCR_ARENA_PREALLOC="40G", GPUCR_COPY_HELPER="off")
        jobid, rc, out = spank.batch(script, "--gpucr=on", "-N1", "--export=ALL", env=env)
        assert rc == 0, out
        ps = fast_probes(out)
        assert len(ps) == 2, out
        for p in ps:
            assert p["GPUCR_ARENA_PREALLOC"] == "40G" and p["GPUCR_COPY_HELPER"] == "off", p
            assert "GPUCR_COPY_HELPER_START" not in p
    finally:
        spank.configure(spank.line())


@pytest.mark.parametrize("arg,says", [("copy_helper=yes", "must be on or off"),
                                      ("arena_prealloc=lots", "must be auto, off or a size such as 80G"),
                                      ("stage_cap=half", "must be a share such as 50% or a size such as 64G"),
                                      ("stage=dev/shm", "must be an absolute path"),
                                      ("outside=sometimes", "must be refuse or close")])
def test_bad_fast_path_argument_fails_only_gpucr_jobs(spank, arg, says):
    key, value = arg.split("=")
    spank.configure(spank.line(**{key: value}))
    try:
        jobid, rc, out = spank.batch("echo ran\n", "--gpucr=on", "-N1")
        assert rc != 0 and f"'{arg}'" in out and says in out, out
        jobid, rc, out = spank.batch("echo ran\n", "-N1")
        assert rc == 0 and "ran" in out, out
    finally:
        spank.configure(spank.line())
