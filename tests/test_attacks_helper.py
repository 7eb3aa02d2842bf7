"""Attacks on the root helper, run as an ordinary user against the real sudo rule
and the real helper (`sudo -n gpucr-criu-root ...`), each failing if the attack
succeeds: code of the user's run as root, a file outside the user's own written,
read or given away, another user's image used, root's scratch space filled.

A payload proves it ran by writing its effective uid into PWNED in the user's
own directory: the file must never appear, as root or at all.
Site-level attacks on the drain and the stage are in test_attacks_drain.py.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from job_helpers import numbers, wait_for
from user_helpers import as_user, gpucr_as, owned_dir

from gpucr_hpc.criu import root_helper

pytestmark = [pytest.mark.criu]

PAYLOAD = "import os; open({out!r}, 'w').write(str(os.geteuid()))\n"

SLEEPER = r"""
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
ballast = bytearray(int(sys.argv[2]) << 20) if len(sys.argv) > 2 else b""
for i in range(len(ballast) // 4096):
    ballast[i * 4096] = 1
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def attacker(users, users_tmp):
    """(user, their own directory, the file a payload would write)."""
    if not os.access(root_helper.helper_path(), os.X_OK) or not shutil.which("sudo"):
        pytest.skip("needs the root helper installed (make install)")
    user = users[0]
    home = owned_dir(users_tmp / "attacker", user)
    pwned = home / "PWNED"
    yield user, home, pwned
    for u in users:
        subprocess.run(["pkill", "-KILL", "-u", u.pw_name, "-f", "attack-sleeper"], capture_output=True)


def not_pwned(pwned: Path) -> None:
    assert not pwned.exists(), f"the payload ran as uid {pwned.read_text()}"


def sleeper(user, home: Path, mib: int = 0, prefix: tuple[str, ...] = ()) -> int:
    """A process of the user's own (in its own session), its host PID."""
    script = home / "attack-sleeper.py"
    script.write_text(SLEEPER)
    pid_file = home / f"sleeper-{time.monotonic_ns()}.pid"
    subprocess.Popen(["runuser", "-u", user.pw_name, "--", "setsid", *prefix, sys.executable, str(script),
                      str(pid_file), *([str(mib)] if mib else [])],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="the user's process to start")
    return int(pid_file.read_text())


def helper(user, *args, cwd=None, env=None):
    """The helper through sudo, as the user; env: the caller's whole environment."""
    set_env = ["env", "-i", *(f"{k}={v}" for k, v in env.items())] if env is not None else []
    return as_user(user, *set_env, "sudo", "-n", root_helper.helper_path(), *args, cwd=cwd)


def sealed_image(user, home: Path) -> Path:
    """A valid image of a process of the user's, sealed by the helper: what any user can make."""
    pid = sleeper(user, home)
    ck = gpucr_as(user, "checkpoint", "--pid", str(pid), "--to", str(home / "img"))
    assert ck.returncode == 0, ck.stderr
    return home / "img" / "criu"


def package_in(folder: Path, user, *modules: str) -> None:
    """A copy of our package's names, each module a payload, in a folder of the user's."""
    pwned = folder.parent / "PWNED"
    for mod in modules:
        path = folder.joinpath(*mod.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for d in [path.parent, *path.parent.parents]:
            if d == folder.parent:
                break
            (d / "__init__.py").write_text(PAYLOAD.format(out=str(pwned)))
        path.write_text(PAYLOAD.format(out=str(pwned)))
    for p in [folder, *folder.rglob("*")]:
        os.chown(p, user.pw_uid, user.pw_gid)


# -- 1: interpreters root starts never import from the caller's working directory ------

def test_restore_into_a_new_pidns_imports_nothing_from_the_callers_directory(attacker):
    user, home, pwned = attacker
    images = sealed_image(user, home)
    trap = owned_dir(home / "trap", user)
    package_in(trap, user, "gpucr_hpc.criu.pidns_init", "json", "subprocess", "signal")
    work = owned_dir(home / "w", user)
    # The helper stays as the new namespace's launcher: its answer is result.json.
    launcher = subprocess.Popen(["runuser", "-u", user.pw_name, "--", "sudo", "-n", root_helper.helper_path(),
                                 "restore", "--images", str(images), "--work", str(work), "--new-pidns"],
                                cwd=trap, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: (work / "result.json").exists() or launcher.poll() is not None, timeout=60,
                 what="the helper's answer")
        not_pwned(pwned)
        res = json.loads((work / "result.json").read_text())
        assert "host_pid" in res, res
        os.kill(res["host_pid"], signal.SIGKILL)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()


def test_dump_imports_nothing_from_the_callers_directory(attacker):
    user, home, pwned = attacker
    pid = sleeper(user, home)
    trap = owned_dir(home / "trap", user)
    package_in(trap, user, "json", "os", "re", "stat", "gpucr_hpc.criu.run")
    work, img = owned_dir(home / "w", user), owned_dir(home / "img", user)
    helper(user, "dump", "--pid", str(pid), "--images", str(img), "--work", str(work), "--leave-running",
           cwd=trap)
    not_pwned(pwned)
    assert "open_files" in json.loads((work / "result.json").read_text())


# -- 3: a mount namespace the caller made is never entered ------------------------------

def userns_allowed(user) -> bool:
    return as_user(user, "unshare", "-Ur", "true").returncode == 0


def test_dump_never_runs_criu_from_the_callers_mount_namespace(attacker):
    """The user's own user+mount+PID namespace, with a script bound over CRIU's path there."""
    user, home, pwned = attacker
    if not userns_allowed(user):
        pytest.skip("unprivileged user namespaces are off on this kernel: the attack cannot be made")
    evil = home / "evil-criu"
    evil.write_text(f"#!/bin/sh\nid -u > {pwned}\n")
    evil.chmod(0o755)
    os.chown(evil, user.pw_uid, user.pw_gid)
    from gpucr_hpc.criu.run import find_criu
    criu_path = find_criu().path
    inner = (f"mount --bind {evil} {criu_path} && exec {sys.executable} {home}/attack-sleeper.py "
             f"{home}/ns.pid")
    (home / "attack-sleeper.py").write_text(SLEEPER)
    proc = subprocess.Popen(["runuser", "-u", user.pw_name, "--", "setsid", "unshare", "-Urpf", "--mount-proc",
                             "sh", "-c", inner], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (home / "ns.pid").exists() and (home / "ns.pid").read_text(), what="the namespace")
        inside = [p for p in Path("/proc").glob("[0-9]*")
                  if _cmd(p).startswith(sys.executable) and _cmd(p).endswith(f"{home}/ns.pid")]
        assert inside, "the sleeper in the user's namespace"
        host_pid = int(inside[0].name)
        work, img = owned_dir(home / "w", user), owned_dir(home / "img", user)
        r = helper(user, "dump", "--pid", str(host_pid), "--images", str(img), "--work", str(work),
                   "--leave-running")
        not_pwned(pwned)
        res = json.loads((work / "result.json").read_text())
        assert r.returncode != 0 and "user namespace" in res["error"], res
    finally:
        proc.kill()
        subprocess.run(["pkill", "-KILL", "-u", user.pw_name, "-f", f"{home}/ns.pid"], capture_output=True)


def _cmd(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


# -- 6: sudo's environment and the verbs it reaches ----------------------------------------

def test_installed_rule_resets_the_environment_and_the_path():
    rule = Path("/etc/sudoers.d/gpucr-hpc").read_text()
    assert "env_reset" in rule and "secure_path" in rule, rule


@pytest.fixture
def site_keeps_the_environment():
    """A site whose sudo keeps callers' environments (Defaults !env_reset), as some do."""
    rule = Path("/etc/sudoers.d/zz-gpucr-test-keep-env")
    rule.write_text("Defaults !env_reset\n")
    rule.chmod(0o440)
    yield
    rule.unlink()


def test_callers_environment_never_chooses_what_root_runs(attacker, site_keeps_the_environment):
    user, home, pwned = attacker
    evil = owned_dir(home / "bin", user)
    for tool in ("criu", "nsenter", "setpriv", "unshare", "nft", "python3", "sh"):
        (evil / tool).write_text(f"#!/bin/sh\nid -u > {pwned}\nexit 1\n")
        (evil / tool).chmod(0o755)
        os.chown(evil / tool, user.pw_uid, user.pw_gid)
    (evil / "criu-prefix" / "bin").mkdir(parents=True)
    shutil.copy(evil / "criu", evil / "criu-prefix" / "bin" / "criu")
    trap = owned_dir(home / "trap", user)
    package_in(trap, user, "json", "gpucr_hpc.criu.run")
    env = {"PATH": f"{evil}:/usr/bin:/bin", "GPUCR_CRIU": str(evil / "criu"),
           "GPUCR_PREFIX": str(evil / "criu-prefix"), "PYTHONPATH": str(trap), "PYTHONSTARTUP": str(trap / "json.py"),
           "LD_PRELOAD": "", "SUDO_UID": "0"}
    pid = sleeper(user, home)
    work, img = owned_dir(home / "w", user), owned_dir(home / "img", user)
    r = helper(user, "dump", "--pid", str(pid), "--images", str(img), "--work", str(work), "--leave-running",
               env=env)
    not_pwned(pwned)
    res = json.loads((work / "result.json").read_text())
    assert "open_files" in res, (res, r.stderr)
    for p in img.iterdir():  # the caller's own (SUDO_UID from the caller is not believed)
        assert p.lstat().st_uid == user.pw_uid


def test_the_action_script_verb_is_not_reachable_through_sudo(attacker, site_keeps_the_environment):
    user, home, pwned = attacker
    target = home / "written-by-root"
    env = {"PATH": "/usr/bin:/bin", "CRTOOLS_SCRIPT_ACTION": "post-dump", "CRTOOLS_INIT_PID": "1"}
    r = helper(user, "check", "0", "0:0", str(target), env=env)
    assert r.returncode != 0
    assert not target.exists()


# -- a group taken away is not given back by an old checkpoint ------------------------------

@pytest.fixture
def extra_group(attacker):
    user = attacker[0]
    name = "gpucrtestgrp"
    subprocess.run(["groupadd", "-f", name], check=True, capture_output=True)
    subprocess.run(["usermod", "-aG", name, user.pw_name], check=True, capture_output=True)
    yield name
    subprocess.run(["groupdel", name], capture_output=True)


def test_a_checkpoint_never_gives_back_a_group_the_user_lost(attacker, extra_group):
    user, home, pwned = attacker
    images = sealed_image(user, home)  # its process holds the group
    subprocess.run(["gpasswd", "-d", user.pw_name, extra_group], check=True, capture_output=True)
    work = owned_dir(home / "w", user)
    r = helper(user, "restore", "--images", str(images), "--work", str(work))
    res = json.loads((work / "result.json").read_text())
    assert r.returncode != 0 and "which you no longer have" in res["error"], res


# -- 5: root's scratch space is bounded by what root sealed ------------------------------

def scratch_bytes() -> int:
    total = 0
    for parent in ("/dev/shm", "/var/tmp"):
        for d in Path(parent).glob("gpucr-root-*"):
            for f in d.rglob("*"):
                try:
                    total += f.lstat().st_blocks * 512
                except OSError:
                    pass
    return total


def test_a_sparse_image_file_is_refused_before_root_copies_it(attacker):
    user, home, pwned = attacker
    images = sealed_image(user, home)
    pages = max(images.glob("pages-*.img"), key=lambda p: p.stat().st_size)
    sealed = pages.stat().st_size
    os.truncate(pages, sealed + (2 << 30))  # 2 GiB of holes: nothing on the user's disk, all of it in root's copy
    most, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            most[0] = max(most[0], scratch_bytes())
            time.sleep(0.01)

    t = threading.Thread(target=watch)
    t.start()
    try:
        work = owned_dir(home / "w", user)
        r = helper(user, "restore", "--images", str(images), "--work", str(work))
    finally:
        stop.set()
        t.join()
    res = json.loads((work / "result.json").read_text())
    assert r.returncode != 0 and f"{pages.name} has {sealed + (2 << 30)} bytes" in res["error"], res
    assert most[0] < (64 << 20), f"root's scratch held {most[0]} bytes"


def test_a_dump_killed_midway_leaves_no_scratch_behind(attacker):
    user, home, pwned = attacker
    pid = sleeper(user, home, mib=300)
    work, img = owned_dir(home / "w", user), owned_dir(home / "img", user)
    before = set(Path("/dev/shm").glob("gpucr-root-*")) | set(Path("/var/tmp").glob("gpucr-root-*"))
    p = subprocess.Popen(["runuser", "-u", user.pw_name, "--", "sudo", "-n", root_helper.helper_path(), "dump",
                          "--pid", str(pid), "--images", str(img), "--work", str(work), "--leave-running"],
                         start_new_session=True)
    made = []

    def scratch_appeared():
        made[:] = (set(Path("/dev/shm").glob("gpucr-root-*")) | set(Path("/var/tmp").glob("gpucr-root-*"))) - before
        return bool(made)

    wait_for(scratch_appeared, timeout=60, what="the dump's scratch directory")
    helpers = [int(d.name.split("-")[3]) for d in made]
    for pid_ in helpers + [p.pid]:  # as a job's end kills its whole cgroup
        try:
            os.kill(pid_, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()
    wait_for(lambda: not any(Path(f"/proc/{h}").exists() for h in helpers), timeout=30, what="the helper to end")
    wait_for(lambda: not any(c.startswith("criu") for c in _children_cmds()), timeout=30, what="CRIU to end")
    # The helper's next call, for anyone, gives back what a dead helper left.
    other = helper(user, "unlock", "--lock", "nothing_here")
    assert other.returncode in (0, 1)
    assert not [d for d in made if d.exists()], made
    os.kill(pid, signal.SIGKILL)


def _children_cmds() -> list[str]:
    return [Path(p, "comm").read_text().strip() for p in map(str, Path("/proc").glob("[0-9]*"))
            if Path(p, "comm").exists()]


# -- argument injection and crafted input, verb by verb: refused with one reason, nothing done as root --

def _canary(tmp: Path) -> Path:
    c = tmp / "root-only"
    c.mkdir(mode=0o700, exist_ok=True)
    (c / "secret").write_text("root data\n")
    return c


class Case:
    """What an injected argument may name: the user's home, a root-only folder, the
    user's sealed image, a process of theirs and one of another user's."""

    def __init__(self, home: Path, root_dir: Path, images: Path, mine: int, theirs: int):
        self.home, self.root, self.images, self.mine, self.theirs = home, root_dir, images, mine, theirs
        self.work = ["--work", str(home / "w")]
        self.img = ["--images", str(home / "img")]


# (name, whether it needs a sealed image of the user's, the helper's argv)
INJECTIONS = [
    ("images is a root-only directory", False, lambda c: ["restore", "--images", str(c.root), *c.work]),
    ("images is a link to a root-only directory", False,
     lambda c: ["restore", "--images", str(c.home / "link"), *c.work]),
    ("work is a link to a root-only directory", False,
     lambda c: ["dump", "--pid", str(c.mine), *c.img, "--work", str(c.home / "link")]),
    ("images of the dump is a root-only directory", False,
     lambda c: ["dump", "--pid", str(c.mine), "--images", str(c.root), *c.work]),
    ("pid 1", False, lambda c: ["dump", "--pid", "1", *c.img, *c.work]),
    ("pid of another user", False, lambda c: ["dump", "--pid", str(c.theirs), *c.img, *c.work, "--leave-running"]),
    ("negative pid", False, lambda c: ["dump", "--pid", "-1", *c.img, *c.work]),
    ("an option as the images path", False, lambda c: ["restore", "--images=--help", *c.work]),
    ("an fd never handed in", True,
     lambda c: ["restore", "--images", str(c.images), *c.work, "--inherit-fd", "7:file:/etc/shadow"]),
    ("a bad inherit-fd", True,
     lambda c: ["restore", "--images", str(c.images), *c.work, "--inherit-fd", "x;rm -rf /:y"]),
    ("nft syntax in a lock name", False,
     lambda c: ["lock", "--lock", "x; flush ruleset", "--flow", "10.0.0.1:1,10.0.0.2:2"]),
    ("nft syntax in a flow", False,
     lambda c: ["lock", "--lock", "job1", "--flow", "10.0.0.1:1 } ; flush ruleset ; {,10.0.0.2:2"]),
    ("a flow of someone else", False, lambda c: ["lock", "--lock", "job1", "--flow", "10.9.9.9:22,10.9.9.8:4000"]),
    ("unlock another user's table", False, lambda c: ["unlock", "--lock", "../u0_job1"]),
    ("a move to a port", True,
     lambda c: ["restore", "--images", str(c.images), *c.work, "--move", "10.0.0.1:22=127.0.0.1:22"]),
    ("a newline in a path", True, lambda c: ["restore", "--images", f"{c.images}\n/etc", *c.work]),
    ("the action script's verb", False, lambda c: ["check", "0", "0:0", str(c.home / "written-by-root")]),
    ("an unknown verb", False, lambda c: ["shell"]),
]


@pytest.mark.parametrize("name,needs_image,argv", INJECTIONS, ids=[n for n, _, _ in INJECTIONS])
def test_argument_injection_is_refused_and_changes_nothing(attacker, users, tmp_path, name, needs_image, argv):
    user, home, pwned = attacker
    other = users[1]
    root_dir = _canary(tmp_path)
    (home / "link").symlink_to(root_dir)
    owned_dir(home / "w", user)
    owned_dir(home / "img", user)
    images = sealed_image(user, home) if needs_image else home / "img" / "criu"
    mine = sleeper(user, home)
    theirs_home = owned_dir(home.parent / "victim", other)
    theirs = sleeper(other, theirs_home)
    before = sorted((p.name, p.stat().st_mode, p.stat().st_uid) for p in root_dir.iterdir())
    ours = {p: p.lstat().st_mtime_ns for p in home.rglob("*")}
    r = helper(user, *argv(Case(home, root_dir, images, mine, theirs)))
    assert r.returncode != 0, (r.stdout, r.stderr)
    not_pwned(pwned)
    assert sorted((p.name, p.stat().st_mode, p.stat().st_uid) for p in root_dir.iterdir()) == before
    assert root_dir.stat().st_uid == 0 and (root_dir / "secret").read_text() == "root data\n"
    for p in home.rglob("*"):  # nothing the helper wrote in the user's tree is root's
        if ours.get(p) != p.lstat().st_mtime_ns:
            assert p.lstat().st_uid == user.pw_uid, p
    os.kill(theirs, signal.SIGKILL)
    os.kill(mine, signal.SIGKILL)


def test_a_crafted_seal_is_refused_before_anything_is_read(attacker):
    """The user writes the seal themselves: names outside the image, sizes of their
    choosing, the MAC of their guess. Nothing is copied, nothing outside read."""
    user, home, pwned = attacker
    images = sealed_image(user, home)
    seal = json.loads((images / "gpucr-seal").read_text())
    crafted = dict(seal, files={"../../../../etc/shadow": [1 << 40, "0" * 64]}, mac="0" * 64)
    (images / "gpucr-seal").write_text(json.dumps(crafted))
    work = owned_dir(home / "w", user)
    r = helper(user, "restore", "--images", str(images), "--work", str(work))
    res = json.loads((work / "result.json").read_text())
    assert r.returncode != 0 and "seal" in res["error"], res
    assert scratch_bytes() < (1 << 20)


def test_logs_and_answers_never_follow_a_link_the_user_planted(attacker, users_tmp):
    """A symlink, and a hard link (a site without fs.protected_hardlinks lets a user
    make one to a root-only file), in place of the files the helper writes there."""
    user, home, pwned = attacker
    vault = users_tmp / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "secret"  # on the same file system as the user's work dir
    secret.write_text("root data\n")
    secret.chmod(0o600)
    work, img = owned_dir(home / "w", user), owned_dir(home / "img", user)
    os.link(secret, work / "dump.log")
    (work / "result.json").symlink_to(secret)
    (img / "gpucr-seal").symlink_to(secret)
    pid = sleeper(user, home)
    r = helper(user, "dump", "--pid", str(pid), "--images", str(img), "--work", str(work), "--leave-running")
    assert r.returncode == 0, r.stderr
    st = secret.stat()
    assert (secret.read_text(), st.st_uid, st.st_mode & 0o777) == ("root data\n", 0, 0o600)
    for p in [*work.iterdir(), *img.iterdir()]:
        assert p.lstat().st_uid == user.pw_uid, p
    os.kill(pid, signal.SIGKILL)


def test_a_restored_tree_still_runs_after_every_hardening(attacker):
    """The way in stays open for the user's own work: dump, restore, dump the
    restored tree again (its PID namespace, ours), restore it again."""
    user, home, pwned = attacker
    log = home / "count.txt"
    (home / "counter.py").write_text(
        "import sys, time\nout = open(sys.argv[1], 'a', buffering=1)\n"
        "for i in range(400):\n    out.write(f'{i}\\n'); time.sleep(0.05)\n")
    subprocess.Popen(["runuser", "-u", user.pw_name, "--", "setsid", sys.executable, str(home / "counter.py"),
                      str(log)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: len(numbers(log)) > 3, what="the counter")
    pid = int(subprocess.run(["pgrep", "-u", user.pw_name, "-f", "counter.py"], capture_output=True,
                             text=True).stdout.split()[0])
    ck = gpucr_as(user, "checkpoint", "--pid", str(pid), "--to", str(home / "img1"))
    assert ck.returncode == 0, ck.stderr
    rs = gpucr_as(user, "restore", "--from", str(home / "img1"), "--pidns", "new", "--json")
    assert rs.returncode == 0, rs.stderr
    again = json.loads(rs.stdout)["pid"]
    wait_for(lambda: len(numbers(log)) > 20, what="the restored counter")
    ck = gpucr_as(user, "checkpoint", "--pid", str(again), "--to", str(home / "img2"))
    assert ck.returncode == 0, ck.stderr
    rs = gpucr_as(user, "restore", "--from", str(home / "img2"), "--pidns", "new", "--json")
    assert rs.returncode == 0, rs.stderr
    wait_for(lambda: len(numbers(log)) >= 400, timeout=60, what="the counter to finish")
    assert numbers(log)[-1] == 399
    not_pwned(pwned)


# -- the operator door: an operator is not root --------------------------------------------

@pytest.fixture
def operator(users):
    from gpucr_hpc.cli.operator_door import door_path

    door = door_path()
    if not os.access(door, os.X_OK):
        pytest.skip(f"the operator door {door} is not installed: make install")
    rule = Path("/etc/sudoers.d/gpucr-test-attack-operator")
    rule.write_text(f'Defaults!{door} env_keep += "SLURM_CONF PATH PYTHONPATH"\nDefaults!{door} !use_pty\n'
                    f"{users[1].pw_name} ALL=(root) NOPASSWD: {door}\n")
    rule.chmod(0o440)
    yield users[1], door
    rule.unlink()


def test_an_operators_path_and_slurm_conf_never_reach_root(operator, users_tmp):
    """Even where the site's rule keeps PATH and SLURM_CONF, root runs the system's
    Slurm commands and reads only a configuration root alone can change."""
    op, door = operator
    home = owned_dir(users_tmp / "operator", op)
    pwned = home / "PWNED"
    evil = owned_dir(home / "bin", op)
    for tool in ("scontrol", "squeue", "srun", "sbatch", "python3"):
        (evil / tool).write_text(f"#!/bin/sh\nid -u > {pwned}\nexit 1\n")
        (evil / tool).chmod(0o755)
    conf = home / "slurm.conf"
    conf.write_text("ClusterName=evil\nSlurmctldHost=localhost\n")
    for p in (conf, *evil.iterdir()):
        os.chown(p, op.pw_uid, op.pw_gid)
    env = {"PATH": f"{evil}:/usr/bin:/bin", "PYTHONPATH": str(home)}
    r = as_user(op, "env", f"PATH={env['PATH']}", f"PYTHONPATH={home}", "sudo", "-n", door, "checkpoint", "999999")
    not_pwned(pwned)
    r = as_user(op, "env", f"SLURM_CONF={conf}", "sudo", "-n", door, "checkpoint", "999999")
    assert r.returncode == 2 and "SLURM_CONF" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    not_pwned(pwned)


# -- the install: what root runs is root's alone, all of it --------------------------------

def test_install_refuses_a_package_file_or_folder_another_user_can_change(users, tmp_path):
    from gpucr_hpc.privileged import install_check

    pkg = tmp_path / "site" / "gpucr_hpc"
    (pkg / "criu").mkdir(parents=True)
    (pkg / "criu" / "run.py").write_text("")
    pth = tmp_path / "site" / "evil.pth"
    pth.write_text("")
    tmp_path.chmod(0o755)
    assert install_check.first_unsafe([str(tmp_path / "site")]) is None
    for victim in (pkg / "criu" / "run.py", pth, pkg / "criu"):
        os.chown(victim, users[0].pw_uid, -1)
        assert install_check.first_unsafe([str(tmp_path / "site")]) == str(victim)
        os.chown(victim, 0, -1)
        victim.chmod(victim.stat().st_mode | 0o020)
        assert install_check.first_unsafe([str(tmp_path / "site")]) == str(victim)
        victim.chmod(victim.stat().st_mode & ~0o020)
    (tmp_path / "site").chmod(0o777)  # a folder above what root loads
    assert install_check.first_unsafe([str(pkg)]) == str(tmp_path / "site")
