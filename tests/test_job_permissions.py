"""Whose a job's checkpoints are, and one command on a job at a time, on the real
test cluster with real CRIU:

* a job's image dir is made by the plugin (as root) for the job's user, 0700, also
  for a job with an srun step; another user cannot list it, and gets one line;
* a job dir that another user made ahead of the job (an image root of mode 1777),
  or a symlink planted in its place, is refused with one line and never used;
* one whose mode lets others write is refused by a checkpoint, the job runs on;
* other users can neither delete, rename nor add anything in a job's dir;
* an image file that cannot be read holds the requeued job with the reason;
* two commands on one job at once: the second is refused at once, naming the first;
  a lock left by a killed command blocks nothing; the automatic checkpoint at a
  preemption waits for a running command instead of being refused;
* JOBID arguments are job ids, never paths.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

if os.geteuid() != 0:
    pytest.skip("job checkpoint with CRIU needs root here", allow_module_level=True)

from job_helpers import assert_counted_once, counting_script, gpucr, numbers, output_of, wait_for  # noqa: E402
from user_helpers import as_user, gpucr_as  # noqa: E402

from gpucr_hpc.store.files import tree_digest  # noqa: E402


def images(cluster) -> Path:
    return cluster.state / "images"


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpucr-hpc: error: "), r.stderr
    return lines[0]


def counting_job(cluster, d: Path, *args, ballast_mib=0) -> tuple[str, Path]:
    """A job counting into d/count.txt, submitted; ballast_mib: memory it holds,
    so that its checkpoint takes longer."""
    d.chmod(0o755)
    (d / "counter.py").write_text(f"import sys, time\nballast = b'x' * ({ballast_mib} << 20)\n"
                                  "out = open(sys.argv[1], 'a', buffering=1)\n"
                                  "for i in range(100000):\n    out.write(f'{i}\\n')\n    time.sleep(0.05)\n")
    log = d / "count.txt"
    (d / "job.sh").write_text(f"#!/bin/bash\n{sys.executable} {d}/counter.py {log}\n")
    return cluster.sbatch(d / "job.sh", "--gpucr=on", "-N1", "-o", str(d / "job.out"), *args), log


def wait_counting(cluster, jobid: str, log: Path) -> None:
    cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the job to count",
             detail=lambda: str(cluster.job(jobid)))


def still_counting(cluster, jobid: str, log: Path) -> None:
    n = len(numbers(log))
    wait_for(lambda: len(numbers(log)) > n + 5, what="the job to keep running")
    assert cluster.job(jobid)["JobState"] == "RUNNING"


def next_job_id(cluster, d: Path) -> int:
    """The id the next sbatch gets: a held job's, plus one (this cluster is ours alone)."""
    (d / "probe.sh").write_text("#!/bin/bash\ntrue\n")
    r = cluster.run("sbatch", "--parsable", "-H", "-o", "/dev/null", str(d / "probe.sh"))
    probe = r.stdout.strip().split(";")[0]
    cluster.run("scancel", probe)
    return int(probe) + 1


# --- JOBID arguments --------------------------------------------

@pytest.mark.parametrize("args", [("ls", ".."), ("ls", "14/../15"), ("ls", "/etc"), ("checkpoint", "../1"),
                                  ("status", ".."), ("restore", "../1"), ("preempt", "1/.."),
                                  ("suspend", "1 2"), ("resume", "\u0663")])
def test_job_id_arguments_that_are_paths_are_refused_with_one_line(slurm_cluster, args):
    r = gpucr(slurm_cluster, *args, check=False)
    line = one_error_line(r)
    assert "is not a job id" in line, line
    assert r.stdout == "", r.stdout


# --- the job's dir: the user's alone (items 6 and 7) ---------------------------------

def test_job_dir_of_a_job_with_an_srun_step_is_private(slurm_cluster, users, users_tmp):
    """The srun wrapper used to make the job dir first, with the umask's 0755."""
    a, b = users
    d = users_tmp / "job"
    d.mkdir()
    os.chown(d, a.pw_uid, a.pw_gid)
    d.chmod(0o755)
    (d / "job.sh").write_text("#!/bin/bash\nsrun true\nsleep 300\n")
    r = as_user(a, "sbatch", "--parsable", "--gpucr=on", "-N1", "-o", str(d / "job.out"),
                str(d / "job.sh"), env=slurm_cluster.env)
    assert r.returncode == 0, r.stderr
    jobid = r.stdout.strip().split(";")[0]
    job_dir = images(slurm_cluster) / jobid
    try:
        slurm_cluster.wait_state(jobid, "RUNNING")
        wait_for(lambda: (job_dir / "steps").is_dir(), what="the srun step to start",
                 detail=lambda: (d / "job.out").read_text() if (d / "job.out").exists() else "")
        for p in (job_dir, job_dir / "steps"):
            st = p.lstat()
            assert (st.st_uid, oct(st.st_mode & 0o7777)) == (a.pw_uid, "0o700"), p
        assert as_user(b, "ls", str(job_dir)).returncode != 0
        for args in (("ls", jobid), ("ls", jobid, "--json")):
            r = gpucr_as(b, *args, env=slurm_cluster.env)
            line = one_error_line(r)
            assert "Traceback" not in r.stderr and f"uid {a.pw_uid}" in line, r.stderr
        assert jobid not in gpucr_as(b, "ls", "--json", env=slurm_cluster.env).stdout
        assert gpucr_as(a, "ls", jobid, env=slurm_cluster.env).returncode == 0
        # A dir left readable by an earlier version, with a generation in it: still one line.
        assert as_user(a, "mkdir", "-m", "0700", str(job_dir / "gen-1")).returncode == 0
        job_dir.chmod(0o755)
        r = gpucr_as(b, "ls", jobid, env=slurm_cluster.env)
        assert "Traceback" not in r.stderr and f"uid {a.pw_uid}" in one_error_line(r), r.stderr
        assert gpucr_as(b, "ls", env=slurm_cluster.env).returncode == 0
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


@pytest.fixture
def image_root_1777(slurm_cluster):
    """The image root as sites had it (mode 1777: any user can create a dir in it)."""
    root = images(slurm_cluster)
    mode = root.stat().st_mode & 0o7777
    root.chmod(0o1777)
    yield root
    root.chmod(mode)


def test_job_dir_made_ahead_by_another_user_is_refused_and_never_used(slurm_cluster, users, workdir,
                                                                      image_root_1777):
    """User b makes the dir of the next job id (0777) and a symlink for the one after;
    root's two jobs fail at start with one line and write nothing there."""
    b = users[1]
    first = next_job_id(slurm_cluster, workdir)
    planted, target = image_root_1777 / str(first), workdir / "b-owned"
    link = image_root_1777 / str(first + 1)
    assert as_user(b, "mkdir", "-m", "0777", str(planted)).returncode == 0
    assert as_user(b, "chmod", "0777", str(planted)).returncode == 0
    assert as_user(b, "touch", str(planted / "b-was-here")).returncode == 0
    target.mkdir()
    os.chown(target, b.pw_uid, b.pw_gid)
    assert as_user(b, "ln", "-s", str(target), str(link)).returncode == 0
    before = {p: sorted(os.listdir(p)) for p in (planted, target)}
    jobs = []
    try:
        for n in (first, first + 1):
            out = workdir / f"job-{n}.out"
            (workdir / "job.sh").write_text("#!/bin/bash\necho started\nsleep 30\n")
            jobid = slurm_cluster.sbatch(workdir / "job.sh", "--gpucr=on", "-N1", "-o", str(out))
            jobs.append(jobid)
            assert jobid == str(n), "another job took the id (is this test cluster shared?)"
            info = slurm_cluster.wait_state(jobid, {"FAILED", "COMPLETED", "CANCELLED"})
            assert info["JobState"] == "FAILED", (info, out.read_text() if out.exists() else "")
            text = out.read_text()
            gpucr_lines = [line for line in text.splitlines() if "gpucr" in line]
            assert len(gpucr_lines) == 1 and "image dir" in gpucr_lines[0], text
            assert "started" not in text, text
        assert "belongs to uid" in (workdir / f"job-{first}.out").read_text()
        assert "not a directory" in (workdir / f"job-{first + 1}.out").read_text()
        assert {p: sorted(os.listdir(p)) for p in (planted, target)} == before
        assert planted.lstat().st_uid == b.pw_uid and planted.lstat().st_mode & 0o777 == 0o777
        assert link.is_symlink() and target.lstat().st_uid == b.pw_uid
    finally:
        for jobid in jobs:
            slurm_cluster.run("scancel", jobid, check=False)
        subprocess.run(["rm", "-rf", str(planted), str(link)], check=False)


def test_other_users_cannot_create_in_the_image_root_nor_touch_a_jobs_generations(
        slurm_cluster, users, workdir):
    b = users[1]
    root = images(slurm_cluster)
    assert as_user(b, "mkdir", str(root / "999999")).returncode != 0
    jobid, log = counting_job(slurm_cluster, workdir)
    try:
        wait_counting(slurm_cluster, jobid, log)
        gpucr(slurm_cluster, "checkpoint", jobid)
        job_dir = root / jobid
        digest = tree_digest(job_dir / "gen-1")
        for argv in (("rm", "-rf", str(job_dir / "gen-1")), ("rm", "-f", str(job_dir / "LATEST")),
                     ("mv", str(job_dir / "gen-1"), str(job_dir / "gen-0")),
                     ("mv", str(job_dir), str(root / "stolen")), ("mkdir", str(job_dir / "gen-9")),
                     ("ls", str(job_dir))):
            assert as_user(b, *argv).returncode != 0, argv
        # The same with the image root of mode 1777 sites used to have (sticky: no renames).
        root.chmod(0o1777)
        try:
            assert as_user(b, "mv", str(job_dir), str(root / "stolen")).returncode != 0
            assert as_user(b, "rm", "-rf", str(job_dir)).returncode != 0
        finally:
            root.chmod(0o755)
        assert tree_digest(job_dir / "gen-1") == digest
        assert (job_dir / "LATEST").read_text().split()[0] == "gen-1"
        still_counting(slurm_cluster, jobid, log)
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


def test_checkpoint_into_a_job_dir_others_can_write_is_refused_and_job_runs_on(slurm_cluster, workdir):
    jobid, log = counting_job(slurm_cluster, workdir)
    job_dir = images(slurm_cluster) / jobid
    try:
        wait_counting(slurm_cluster, jobid, log)
        job_dir.chmod(0o777)  # as a dir another user had made, or an admin's mistake
        line = one_error_line(gpucr(slurm_cluster, "checkpoint", jobid, check=False))
        assert str(job_dir) in line and "writable by other users" in line, line
        assert not list(job_dir.glob("gen-*")) and job_dir.stat().st_mode & 0o777 == 0o777
        still_counting(slurm_cluster, jobid, log)
        job_dir.chmod(0o700)
        gpucr(slurm_cluster, "checkpoint", jobid)
        assert (job_dir / "LATEST").read_text().split()[0] == "gen-1"
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


# --- an unreadable image file holds the job (item 8) ---------------------------------

DENY_OPENS = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
FAN_CLASS_CONTENT, FAN_CLOEXEC, FAN_MARK_ADD, FAN_OPEN_PERM, FAN_DENY = 0x4, 0x1, 0x1, 0x10000, 0x2
fd = libc.fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC, os.O_RDONLY)
if fd < 0 or libc.fanotify_mark(fd, FAN_MARK_ADD, FAN_OPEN_PERM, -100, sys.argv[1].encode()) != 0:
    sys.exit("fanotify: " + os.strerror(ctypes.get_errno()))
print("ready", flush=True)
while True:
    buf, off = os.read(fd, 4096), 0
    while off < len(buf):
        size, _v, _r, _m, _mask, efd, _pid = struct.unpack_from("IBBHQii", buf, off)
        os.write(fd, struct.pack("iI", efd, FAN_DENY))
        if efd >= 0:
            os.close(efd)
        off += size
"""


class DeniedOpens:
    """Every open of one file fails with EPERM, for root too (a fanotify permission
    listener, as a site's HSM or scanner would), while its size and name stay."""

    def __init__(self, path: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", DENY_OPENS, str(path)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            pytest.skip(f"fanotify permission events are not available here: {self.proc.stderr.read().strip()}")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def test_unreadable_image_file_holds_the_job_with_the_reason(slurm_cluster, workdir):
    jobid, log = counting_job(slurm_cluster, workdir)
    job_dir = images(slurm_cluster) / jobid
    deny = None
    try:
        wait_counting(slurm_cluster, jobid, log)
        gpucr(slurm_cluster, "checkpoint", jobid)
        slurm_cluster.run("scancel", jobid)
        slurm_cluster.wait_state(jobid, {"CANCELLED", "COMPLETED", "FAILED"})
        gen = job_dir / "gen-1"
        pages = max((p for p in gen.rglob("pages-*.img")), key=lambda p: p.stat().st_size)
        before = tree_digest(gen)
        counted = len(numbers(log))
        deny = DeniedOpens(pages)
        with pytest.raises(PermissionError):
            pages.open("rb")
        r = gpucr(slurm_cluster, "restore", jobid)
        assert "restoring from gen-1" in r.stdout
        show = lambda: slurm_cluster.run("scontrol", "show", "job", jobid).stdout  # noqa: E731
        wait_for(lambda: "Comment=gpucr: cannot restore" in show() or slurm_cluster.job(jobid).get(
                     "JobState") in ("FAILED", "COMPLETED"), timeout=120,
                 what="the job to be held or to end", detail=lambda: show() + slurm_cluster.restore_log(jobid))
        info = slurm_cluster.wait_state(jobid, "PENDING", timeout=60)
        assert "held" in info["Reason"], (info, slurm_cluster.restore_log(jobid))
        # The Comment is short (what failed, where to look); the cause is in restore.log.
        assert "gen-1" in show(), show()
        assert "Operation not permitted" in slurm_cluster.restore_log(jobid), slurm_cluster.restore_log(jobid)
        restore_log = (job_dir / "restore.log").read_text()
        assert "cannot restore" in restore_log and pages.name in restore_log, restore_log
        assert len(numbers(log)) == counted, "the job ran from the top"
        deny.stop()
        deny = None
        assert tree_digest(gen) == before, "the failed restore changed the image"
    finally:
        if deny:
            deny.stop()
        slurm_cluster.run("scancel", jobid, check=False)


# --- one command on a job at a time (item 10) ---------------------------------------

def test_two_checkpoints_at_once_one_runs_the_other_is_refused_at_once(slurm_cluster, workdir):
    # 256 MiB to dump: the first checkpoint still runs when the second one starts.
    jobid, log = counting_job(slurm_cluster, workdir, ballast_mib=256)
    try:
        wait_counting(slurm_cluster, jobid, log)
        for round_ in range(1, 4):
            cmd = [sys.executable, "-m", "gpucr_hpc", "checkpoint", jobid]
            procs = [subprocess.Popen(cmd, env=slurm_cluster.env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(2)]
            ended = {}
            while len(ended) < 2:
                for i, p in enumerate(procs):
                    if i not in ended and p.poll() is not None:
                        ended[i] = (time.monotonic(), p.returncode, *p.communicate())
                time.sleep(0.05)
            ok = [i for i in ended if ended[i][1] == 0]
            assert len(ok) == 1, ended
            winner, loser = ok[0], 1 - ok[0]
            _, rc, out, err = ended[loser]
            lines = err.strip().splitlines()
            assert rc != 0 and out == "" and len(lines) == 1, ended[loser]
            assert f"job {jobid} is busy" in lines[0] and f"gpucr-hpc checkpoint {jobid}" in lines[0], lines
            assert f"pid {procs[winner].pid}" in lines[0], (lines, procs[winner].pid)
            assert "Traceback" not in err
            assert ended[loser][0] < ended[winner][0], "the refused one waited for the other"
            assert f"gen-{round_}" in ended[winner][2], ended[winner]
            still_counting(slurm_cluster, jobid, log)
        rows = gpucr(slurm_cluster, "ls", jobid, "--json").stdout
        assert '"gen-3"' in rows and "incomplete" not in rows and '"committed": false' not in rows
    finally:
        slurm_cluster.run("scancel", jobid, check=False)


HOLD_LOCK = r"""
import sys, time
from pathlib import Path
from gpucr_hpc.job import lock as job_lock
with job_lock.held(Path(sys.argv[1]), sys.argv[2], 0, what="gpucr-hpc suspend " + sys.argv[2]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_lock_names_its_holder_and_dies_with_it(slurm_cluster, workdir):
    """Every job command waits on the same lock; one left by a killed command never blocks."""
    jobid, log = counting_job(slurm_cluster, workdir)
    job_dir = images(slurm_cluster) / jobid
    holder = None
    try:
        wait_counting(slurm_cluster, jobid, log)
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(job_dir), jobid],
                                  stdout=subprocess.PIPE, text=True, env=slurm_cluster.env)
        assert holder.stdout.readline().strip() == "held"
        for args in (("checkpoint", jobid), ("preempt", jobid), ("suspend", jobid), ("resume", jobid)):
            line = one_error_line(gpucr(slurm_cluster, *args, check=False))
            assert f"`gpucr-hpc suspend {jobid}` (pid {holder.pid} on" in line, line
        assert not list(job_dir.glob("gen-*"))
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert (job_dir / "lock").stat().st_size > 0  # killed: its name is still written there
        ck = gpucr(slurm_cluster, "checkpoint", jobid)
        assert "gen-1" in ck.stdout
        still_counting(slurm_cluster, jobid, log)
    finally:
        if holder and holder.poll() is None:
            holder.kill()
        slurm_cluster.run("scancel", jobid, check=False)


def test_job_dir_of_its_own_user_left_readable_is_made_private_and_used(slurm_cluster, workdir):
    """A dir an earlier version left 0755 (the srun wrapper's) is the user's own: made 0700."""
    jobid = next_job_id(slurm_cluster, workdir)
    job_dir = images(slurm_cluster) / str(jobid)
    job_dir.mkdir(mode=0o755)
    job_dir.chmod(0o755)
    got, log = counting_job(slurm_cluster, workdir)
    try:
        assert got == str(jobid), "another job took the id (is this test cluster shared?)"
        wait_counting(slurm_cluster, got, log)
        assert job_dir.stat().st_mode & 0o7777 == 0o700
        gpucr(slurm_cluster, "checkpoint", got)
        assert (job_dir / "LATEST").read_text().split()[0] == "gen-1"
    finally:
        slurm_cluster.run("scancel", got, check=False)


def test_automatic_checkpoint_waits_for_a_running_command(slurm_cluster, workdir):
    """A preemption while another command holds the job's lock: the supervisor's
    checkpoint waits for it (up to half the lead) instead of being refused, then
    checkpoints and requeues; the job goes on from there."""
    steps = 300
    log = workdir / "count.txt"
    out = workdir / "job.out"
    jobid = slurm_cluster.sbatch(counting_script(workdir, log, steps), "--gpucr=on", "-N1", "-o", str(out))
    info = slurm_cluster.wait_state(jobid, "RUNNING")
    wait_for(lambda: len(numbers(log)) > 10, what="the counter to start")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(images(slurm_cluster) / jobid), jobid],
                              stdout=subprocess.PIPE, text=True, env=slurm_cluster.env)
    try:
        assert holder.stdout.readline().strip() == "held"
        urgent_sh = workdir / "urgent.sh"
        urgent_sh.write_text("#!/bin/bash\nsleep 3\n")
        slurm_cluster.sbatch(urgent_sh, "-p", "urgent", "-w", info["NodeList"], "--exclusive", "-o", "/dev/null")
        wait_for(lambda: f"checkpointing job {jobid} before preemption" in output_of(out), timeout=60,
                 what="the preemption's checkpoint to begin")
        assert not list((images(slurm_cluster) / jobid).glob("gen-*"))  # it waits
        holder.kill()
        holder.wait()
        wait_for(lambda: slurm_cluster.job(jobid).get("Restarts") == "1", timeout=60,
                 what="the preempted job to be requeued", detail=out.read_text)
        info = slurm_cluster.wait_state(jobid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
        text = out.read_text()
        assert info["JobState"] == "COMPLETED", (text, info)
        assert "failed" not in text and text.count("start restart=") == 1, text
        assert_counted_once(log, steps)
    finally:
        if holder.poll() is None:
            holder.kill()
        slurm_cluster.run("scancel", jobid, check=False)
