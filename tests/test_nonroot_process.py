"""An ordinary user checkpoints and restores their own processes, through the root
helper (gpucr_hpc/privileged/helper.py via sudo), and nobody else's.

Real CRIU, real sudo, real users. The helper's refusals are tested by calling it
directly, as a user who wants more than their own would.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from job_helpers import numbers, wait_for
from user_helpers import as_user, gpucr_as, owned_dir

from gpucr_hpc.criu import root_helper
from gpucr_hpc.store import files as image_store

pytestmark = [pytest.mark.criu]

# Counts from 0 through a file it keeps open; writes its PID first.
COUNTER = r"""
import os, sys, time
path, steps = sys.argv[1], int(sys.argv[2])
open(path + ".pid", "w").write(str(os.getpid()))
out = open(path, "a", buffering=1)
for i in range(steps):
    out.write(f"{i}\n")
    time.sleep(0.05)
"""

# Holds a file open for reading and reports, on each line of stdin, what it reads there.
HOLDER = r"""
import os, sys
path = sys.argv[1]
open(path + ".pid", "w").write(str(os.getpid()))
f = open(path)
for _ in sys.stdin:
    f.seek(0)
    print(f.read(), flush=True)
"""


@pytest.fixture
def home(users, users_tmp):
    """A directory of each user's own."""
    return {u.pw_name: owned_dir(users_tmp / u.pw_name, u) for u in users}


@pytest.fixture
def started():
    procs = []
    yield procs
    for pid_file in procs:
        try:
            os.kill(int(Path(pid_file).read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def start_counter(user, d: Path, steps: int, started: list) -> tuple[int, Path]:
    (d / "counter.py").write_text(COUNTER)
    log = d / "count.txt"
    subprocess.Popen(["runuser", "-u", user.pw_name, "--", "setsid", sys.executable,
                      str(d / "counter.py"), str(log), str(steps)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = Path(str(log) + ".pid")
    started.append(pid_file)
    wait_for(lambda: len(numbers(log)) > 5, what="the counter to start")
    return int(pid_file.read_text()), log


def uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


def one_line_error(r) -> str:
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def helper(user, op, *args):
    """The root helper called directly; its answer is the work dir's result.json."""
    work = Path(args[args.index("--work") + 1])
    r = as_user(user, "sudo", "-n", root_helper.helper_path(), op, *args)
    try:
        return r.returncode, json.loads((work / "result.json").read_text())
    except (OSError, ValueError):
        return r.returncode, {"error": r.stderr}


def test_user_checkpoints_and_restores_own_process(users, home, started):
    a = users[0]
    d = home[a.pw_name]
    steps = 100
    pid, log = start_counter(a, d, steps, started)
    ck = gpucr_as(a, "checkpoint", "--pid", str(pid), "--to", str(d / "img"))
    assert ck.returncode == 0, ck.stderr
    assert not os.path.exists(f"/proc/{pid}/status") or "zombie" in Path(f"/proc/{pid}/status").read_text()
    for p in (d / "img").rglob("*"):  # the image is the user's own, none of it root's
        assert p.lstat().st_uid == a.pw_uid, p
    n = len(numbers(log))

    rs = gpucr_as(a, "restore", "--from", str(d / "img"), "--json")
    assert rs.returncode == 0, rs.stderr
    rep = json.loads(rs.stdout)
    assert uid_of(rep["pid"]) == a.pw_uid
    wait_for(lambda: len(numbers(log)) == steps, timeout=30, what="the restored counter to finish")
    assert numbers(log) == list(range(steps)) and n < steps

    # Again, into a new PID namespace (as the user), the grown file rewound.
    rs = gpucr_as(a, "restore", "--from", str(d / "img"), "--pidns", "new", "--rewind-files", "--json")
    assert rs.returncode == 0, rs.stderr
    rep = json.loads(rs.stdout)
    assert rep["pidns"] == "new" and uid_of(rep["pid"]) == a.pw_uid
    wait_for(lambda: len(numbers(log)) == steps and not os.path.exists(f"/proc/{rep['pid']}"),
             timeout=30, what="the second restored counter to finish")
    assert numbers(log) == list(range(steps))


# Holds both ends of a pipe, as the CUDA driver's checkpoint channel does; writes its PID.
PIPER = r"""
import json, os, sys, time
r, w = os.pipe()
open(sys.argv[1] + ".tmp", "w").write(json.dumps({"pid": os.getpid(), "fds": [r, w]}))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"""

REOPEN = "import sys; [open(p, m).close() for p, m in zip(sys.argv[1::2], sys.argv[2::2])]"


def test_restored_pipes_are_the_users_own(users, home, started):
    """CRIU, as root, recreates the tree's pipes: they must still be the user's,
    whom the kernel lets reopen them through /proc/PID/fd (the driver does)."""
    a = users[0]
    d = home[a.pw_name]
    (d / "piper.py").write_text(PIPER)
    info = d / "piper.json"
    subprocess.Popen(["runuser", "-u", a.pw_name, "--", "setsid", sys.executable, str(d / "piper.py"), str(info)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(info.exists, what="the pipe holder to start")
    rec = json.loads(info.read_text())
    (d / "piper.pid").write_text(str(rec["pid"]))
    started.append(d / "piper.pid")
    assert gpucr_as(a, "checkpoint", "--pid", str(rec["pid"]), "--to", str(d / "img")).returncode == 0

    rs = gpucr_as(a, "restore", "--from", str(d / "img"), "--json")
    assert rs.returncode == 0, rs.stderr
    pid = json.loads(rs.stdout)["pid"]
    (d / "piper.pid").write_text(str(pid))
    r, w = (f"/proc/{pid}/fd/{fd}" for fd in rec["fds"])
    assert {os.stat(r).st_uid, os.stat(w).st_uid} == {a.pw_uid}
    reopen = as_user(a, sys.executable, "-c", REOPEN, r, "rb", w, "wb")
    assert reopen.returncode == 0, reopen.stderr


def test_helper_dumps_only_the_callers_processes(users, home, started):
    a, b = users
    pid, log = start_counter(a, home[a.pw_name], 400, started)
    d = owned_dir(home[b.pw_name] / "steal", b)
    owned_dir(d / "w", b)
    rc, res = helper(b, "dump", "--pid", str(pid), "--images", str(d), "--work", str(d / "w"),
                     "--leave-running")
    assert rc == 1 and f"PID {pid} runs as uid {a.pw_uid}, not as you (uid {b.pw_uid})" in res["error"]
    assert list(d.iterdir()) == [d / "w"] and sorted(p.name for p in (d / "w").iterdir()) == ["result.json"]
    n = len(numbers(log))
    wait_for(lambda: len(numbers(log)) > n + 3, what="the counter to keep running")

    # Through the CLI: the same refusal, one line.
    line = one_line_error(gpucr_as(b, "checkpoint", "--pid", str(pid), "--to", str(d / "img")))
    assert f"belongs to uid {a.pw_uid}" in line


def test_helper_restores_only_the_callers_sealed_images(users, home, started):
    a, b = users
    da, db = home[a.pw_name], home[b.pw_name]
    pid, _ = start_counter(a, da, 400, started)
    assert gpucr_as(a, "checkpoint", "--pid", str(pid), "--to", str(da / "img")).returncode == 0
    digest = image_store.tree_digest(da / "img")
    w = owned_dir(db / "w", b)

    # Someone else's image: refused before anything is read (opened as b, it cannot be).
    rc, res = helper(b, "restore", "--images", str(da / "img" / "criu"), "--work", str(w))
    assert rc == 1 and f"cannot open directory '{da / 'img' / 'criu'}'" in res["error"], res

    # Their own copy of it, changed in one byte: the seal no longer matches.
    pid_b, _ = start_counter(b, db, 400, started)
    assert gpucr_as(b, "checkpoint", "--pid", str(pid_b), "--to", str(db / "img")).returncode == 0
    pages = sorted((db / "img" / "criu").glob("pages-*.img"))[0]
    data = bytearray(pages.read_bytes())
    data[100] ^= 0xFF
    pages.write_bytes(bytes(data))
    rc, res = helper(b, "restore", "--images", str(db / "img" / "criu"), "--work", str(w))
    assert rc == 1 and "changed since the checkpoint" in res["error"], res
    line = one_line_error(gpucr_as(b, "restore", "--from", str(db / "img")))
    assert "checksum" in line or "changed" in line

    # CRIU images that the helper never sealed (root made them): refused.
    root_img = db / "rootimg"
    rp = subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        r = subprocess.run([sys.executable, "-m", "gpucr_hpc", "checkpoint", "--pid", str(rp.pid),
                            "--to", str(root_img)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        rp.kill()
        rp.wait()
    for p in [root_img, *root_img.rglob("*")]:
        os.chown(p, b.pw_uid, b.pw_gid)
    rc, res = helper(b, "restore", "--images", str(root_img / "criu"), "--work", str(w))
    assert rc == 1 and "no valid seal" in res["error"], res
    assert image_store.tree_digest(da / "img") == digest


def test_restore_never_hands_over_a_file_the_user_cannot_open(users, home, started, tmp_path):
    """The file the process held is replaced by a link to a root-only file of the
    same size and mode: the restored tree would hold that file, so it never runs."""
    a = users[0]
    d = home[a.pw_name]
    mine = d / "data.txt"
    mine.write_text("users data\n")
    os.chown(mine, a.pw_uid, a.pw_gid)
    mine.chmod(0o600)
    (d / "holder.py").write_text(HOLDER)
    p = subprocess.Popen(["runuser", "-u", a.pw_name, "--", "setsid", sys.executable,
                          str(d / "holder.py"), str(mine)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    started.append(Path(str(mine) + ".pid"))
    wait_for(lambda: Path(str(mine) + ".pid").exists(), what="the holder to start")
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "users data"
    pid = int(Path(str(mine) + ".pid").read_text())
    ck = gpucr_as(a, "checkpoint", "--pid", str(pid), "--to", str(d / "img"))
    assert ck.returncode == 0, ck.stderr
    p.kill()
    digest = image_store.tree_digest(d / "img")

    vault = tmp_path / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "secret"
    secret.write_text("root data!\n")  # the size and mode of the user's file
    assert secret.stat().st_size == len("users data\n")
    secret.chmod(0o600)
    mine.unlink()
    mine.symlink_to(secret)
    os.lchown(mine, a.pw_uid, a.pw_gid)

    # The CLI, as the user, cannot see the file; the helper, as root, must refuse it.
    line = one_line_error(gpucr_as(a, "restore", "--from", str(d / "img"), "--pidns", "new"))
    assert f"file {mine} that the process had open is missing" in line, line
    rc, res = helper(a, "restore", "--images", str(d / "img" / "criu"),
                     "--work", str(owned_dir(d / "w", a)), "--new-pidns")
    assert rc == 1 and f"would hold {secret}, which you cannot open" in res["error"], res
    assert image_store.tree_digest(d / "img") == digest
    assert not [q for q in Path("/proc").glob("[0-9]*") if _cmd(q).endswith(f"holder.py {mine}")]


def _cmd(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_missing_helper_or_sudo_rule_is_one_line(users, home, started):
    a = users[0]
    pid, log = start_counter(a, home[a.pw_name], 400, started)
    for helper_path, want in (("/nonexistent/gpucr-criu-root", "is not installed"),
                              ("/bin/true", "sudo does not let you run")):
        env = dict(os.environ, GPUCR_CRIU_HELPER=helper_path)
        r = gpucr_as(a, "checkpoint", "--pid", str(pid), "--to", str(home[a.pw_name] / "img"), env=env)
        line = one_line_error(r)
        assert want in line and "make install" in line, line
        assert not (home[a.pw_name] / "img").exists()
    n = len(numbers(log))
    wait_for(lambda: len(numbers(log)) > n + 3, what="the counter to keep running")
