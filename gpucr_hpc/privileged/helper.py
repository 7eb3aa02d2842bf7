"""The root side of CRIU for ordinary users: run by sudo, one narrow job.

CRIU needs root to dump and to restore a process tree. A job's user reaches it
only through this program, which sudo runs as root (the sudoers rule that
`make install` writes names this one program):

* it dumps a tree only when every process of it is the caller's, checked
  before the dump and again while the tree is frozen (a process that became
  another user's in between fails the dump, and its images are deleted);
* it restores only CRIU images it sealed itself, for the same caller (seal.py:
  an HMAC with the node key over each file's name, size and checksum), checked
  before anything is copied, and copied no longer than sealed into a directory
  only root can write (scratch.py);
* it refuses processes in user namespaces, and PID or mount namespaces it did
  not make (namespaces.py);
* before a restored tree runs, every file CRIU opened or mapped for it must be
  one the caller could open with the same access, at the same path: a symlink
  planted in place of a file the tree had open cannot hand it a root-only file.

It starts in `/`, with a clean environment (root_env.py), runs every
interpreter isolated (`python -I`) and every tool by its absolute path. The
caller's directories are opened, read and written only as the caller
(user_dirs.py), through descriptors, never following a link.

    gpucr-criu-root dump --pid PID --images DIR --work DIR [--leave-running] [--shell-job]
                         [--tcp-lock nftables|skip]
    gpucr-criu-root restore --images DIR --work DIR [--shell-job] [--new-pidns]
                            [--inherit-fd FD:KEY]... [--tcp] [--move END=ADDR]... [--close LOCAL REMOTE]...
                            [--lock NAME --lock-seconds S --flow LOCAL,REMOTE...]
    gpucr-criu-root lock --lock NAME --lock-seconds S --flow LOCAL,REMOTE...
    gpucr-criu-root unlock --lock NAME

TCP connections (privileged/tcp.py): a lock drops only the caller's own flows,
in a table named after their uid; a restore moves only addresses, and binds
connections only to addresses of this node.

lock and unlock answer on stdout. dump and restore answer in the work dir's
`result.json` (stdout may be the restored tree's):
{"open_files": [...]} after a dump, {"host_pid": N, "ns_pid": N} once a restored
tree runs, or {"error": CAUSE, "fix": FIX}. A restore into a new PID namespace
then stays, as the tree's launcher, and exits with the status of the tree's root.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gpucr_hpc.criu import processes, procfs
from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.criu import tcp as criu_tcp
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.privileged import namespaces, root_env, scratch, seal, user_dirs
from gpucr_hpc.privileged import tcp as privileged_tcp
from gpucr_hpc.privileged.checks import check_tree, tree_groups
from gpucr_hpc.privileged.user_dirs import Caller
from gpucr_hpc.slurm.signals import TASK_SIGNALS
from gpucr_hpc.tcp import end as tcp_end
from gpucr_hpc.tcp import lock as netlock

RESULT = "result.json"
CAP_SYS_RESOURCE = 24
LOGS = ("dump.log", "restore.log")

_ACTION_SCRIPT = """#!/bin/sh
exec {python} -I -m gpucr_hpc.privileged.checks --keep={keep} {uid} {gids} {out} {skip}
"""


def caller_from_sudo() -> Caller:
    if os.geteuid() != 0:
        raise GpucrError("gpucr-criu-root must run as root", "run it through sudo -n")
    uid = int(os.environ.get("SUDO_UID") or 0)
    gid = int(os.environ.get("SUDO_GID") or 0)
    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        groups = [gid]
    return Caller(uid, gid, frozenset(groups))


# -- the two operations -----------------------------------------------------------

def _checker(work: Path, who: Caller, images: Path, keep: Sequence[tuple[int, int]] = ()) -> list[str]:
    """The CRIU action script that runs our checks (post-dump, post-restore).
    CRIU's own files (log, images) in our private dirs are not the tree's;
    keep: (dev, ino) of the files handed in with --inherit-fd."""
    script = work / "check.sh"
    script.write_text(_ACTION_SCRIPT.format(
        python=shlex.quote(sys.executable), uid=who.uid, keep=",".join(f"{d}:{i}" for d, i in keep) or "-",
        gids=",".join(str(g) for g in sorted(who.gids)) + f":{who.gid}",
        out=shlex.quote(str(work / "check.json")), skip=" ".join(shlex.quote(str(d)) for d in (work, images))))
    script.chmod(0o700)
    return ["--action-script", str(script)]


def as_owner(who: Caller) -> list[str] | None:
    """How CRIU dumps another user's tree: as root where root has CAP_SYS_RESOURCE;
    else (some containers withhold it) as that user, with root's other capabilities
    (ambient), in CRIU's --unprivileged mode: reading another user's rlimits needs
    either that capability or the same real ids."""
    eff = int(processes.proc_status(os.getpid())["CapEff"], 16)
    if eff >> CAP_SYS_RESOURCE & 1:
        return None
    setpriv = criu_mod.system_tool("setpriv")
    names = subprocess.run([setpriv, "--list-caps"], capture_output=True, text=True).stdout.split()
    caps = ",".join(f"+{n}" for i, n in enumerate(names) if eff >> i & 1)
    return [setpriv, f"--reuid={who.uid}", f"--regid={who.gid}",
            "--groups=" + ",".join(str(g) for g in sorted(who.gids)),
            f"--inh-caps={caps}", f"--ambient-caps={caps}"]


def dump(args, who: Caller, work_fd: int) -> dict:
    if args.pid <= 1:
        raise GpucrError(f"--pid {args.pid} is not a process of yours", "give the PID of your process tree's root")
    tree = check_tree(args.pid, who)
    groups = tree_groups(tree)  # read now: a dump that is not --leave-running ends the tree
    namespaces.check_made_by_us(args.pid)
    images_fd = user_dirs.open_dir(args.images, who)
    with scratch.private_dir("dump", criu_mod.rss_bytes(tree)) as scratch_dir, scratch.private_dir("work") as work:
        images = scratch_dir / "images"
        images.mkdir(mode=0o700)
        try:
            files = criu_mod.find_criu().dump(
                args.pid, images, work, leave_running=args.leave_running, shell_job=args.shell_job,
                extra=_checker(work, who, images), run_as=as_owner(who), tcp_lock=args.tcp_lock)
            done_fd = os.open(images, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                seal.seal(done_fd, who, groups)
                user_dirs.hand_over(done_fd, images_fd, who)
            finally:
                os.close(done_fd)
            return {"open_files": files}
        except GpucrError as e:
            _why_check_failed(work / "check.json", e, args.work)
            raise
        finally:
            _logs_back(work, work_fd, who)


def inherited(specs: list[str], handed: frozenset[int]) -> dict[int, str]:
    """--inherit-fd FD:KEY, for descriptors the caller handed to us only."""
    out = {}
    for spec in specs:
        fd, _, key = spec.partition(":")
        if not fd.isdigit() or int(fd) not in handed or not key or "\n" in key:
            raise GpucrError(f"--inherit-fd {spec!r}: not a descriptor you handed in, as FD:KEY",
                             "hand the restored tree only descriptors of your own, open in the caller")
        out[int(fd)] = key
    return out


def restore(args, who: Caller, work_fd: int, handed: frozenset[int]) -> tuple[dict, subprocess.Popen | None]:
    inherit = inherited(args.inherit_fd, handed)
    images_fd = user_dirs.open_dir(args.images, who)
    keep = []
    for fd in inherit:
        st = os.fstat(fd)
        keep.append((st.st_dev, st.st_ino))
    moved = dict(m.partition("=")[::2] for m in args.move)  # move_addresses refuses a bad one
    table = privileged_tcp.table_name(who.uid, args.lock) if args.lock else None
    need = seal.sealed_bytes(images_fd, who)  # the seal first: nothing else of the caller's is read before it
    with scratch.private_dir("restore", need) as images, scratch.private_dir("work") as work:
        copy_fd = os.open(images, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            seal.copy_verified(images_fd, copy_fd, who)
        finally:
            os.close(copy_fd)
        if args.close:  # the caller's own connections, given back unconnected: nothing to check
            criu_tcp.close_connections(images, args.close)
        if moved:
            criu_tcp.move_addresses(images, moved)  # our own checked copy
        if args.tcp or moved:
            privileged_tcp.check_sources(images)
        if table:
            flows = _flows(args.flow)
            privileged_tcp.check_in_image(flows, images)
            netlock.lock(table, flows, _seconds(args.lock_seconds))
        try:
            restored = criu_mod.find_criu().start_restore(
                images, work, shell_job=args.shell_job, new_pidns=args.new_pidns, inherit=inherit,
                extra=_checker(work, who, images, keep), tied=args.tied, tcp=args.tcp)
        except GpucrError as e:
            if table:
                netlock.unlock(table)
            _why_check_failed(work / "check.json", e, args.work)
            raise
        finally:
            _logs_back(work, work_fd, who)
    return {"host_pid": restored.host_pid, "ns_pid": restored.ns_pid}, restored.launcher


def _flows(specs: list[str]) -> list[netlock.Flow]:
    flows = []
    for spec in specs:
        local, _, remote = spec.partition(",")
        tcp_end.parse(local), tcp_end.parse(remote)  # refused with one line unless both are ends
        flows.append(netlock.Flow(local, remote))
    return flows


def _seconds(text: str) -> float:
    try:
        s = float(text)
        if 0 < s <= netlock.EXPIRES_S:
            return s
    except ValueError:
        pass
    raise GpucrError(f"bad lock length {text!r}", f"give seconds, more than 0 and at most {netlock.EXPIRES_S:g}")


def lock(args, who: Caller) -> dict:
    table = privileged_tcp.table_name(who.uid, args.lock)
    flows = _flows(args.flow)
    privileged_tcp.check_own(flows, who.uid, table)
    netlock.lock(table, flows, _seconds(args.lock_seconds))
    return {"locked": len(flows)}


def unlock(args, who: Caller) -> dict:
    return {"unlocked": netlock.unlock(privileged_tcp.table_name(who.uid, args.lock))}


def _why_check_failed(out: Path, e: GpucrError, callers_work: str) -> None:
    """Our action script's refusal is the cause to report, not CRIU's echo of it;
    CRIU's log is in the caller's work dir by then."""
    e.fix = e.fix.replace(str(out.parent), callers_work)
    try:
        rec = json.loads(out.read_text())
    except (OSError, ValueError):
        return
    if rec.get("error"):
        e.cause, e.fix = rec["error"], rec.get("fix", "")


def _logs_back(work: Path, work_fd: int, who: Caller) -> None:
    """CRIU's logs, from root's work dir into the caller's, written as the caller."""
    for name in LOGS:
        try:
            fd = os.open(work / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            user_dirs.write_new(work_fd, name, who, src_fd=fd)
        finally:
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpucr-criu-root")
    sub = p.add_subparsers(dest="op", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--pid", type=int, required=True)
    r = sub.add_parser("restore")
    r.add_argument("--new-pidns", action="store_true")
    r.add_argument("--tied", action="store_true",
                   help="the restored namespace ends when the caller (sudo's parent) does")
    r.add_argument("--inherit-fd", action="append", default=[])
    for s in (d, r):
        s.add_argument("--images", required=True)
        s.add_argument("--work", required=True)
        s.add_argument("--shell-job", action="store_true")
    d.add_argument("--leave-running", action="store_true")
    d.add_argument("--tcp-lock", choices=("nftables", "skip"))
    r.add_argument("--tcp", action="store_true")
    r.add_argument("--move", action="append", default=[])
    r.add_argument("--close", action="append", nargs=2, default=[], metavar=("LOCAL", "REMOTE"))
    lk = sub.add_parser("lock")
    ul = sub.add_parser("unlock")
    for s in (r, lk):
        s.add_argument("--lock-seconds", default=str(netlock.EXPIRES_S))
        s.add_argument("--flow", action="append", default=[])
    r.add_argument("--lock")
    lk.add_argument("--lock", required=True)
    ul.add_argument("--lock", required=True)
    handed = handed_in()
    root_env.clean_start()
    scratch.sweep()
    args = p.parse_args(argv)
    if args.op in ("lock", "unlock"):
        try:
            answer = (lock if args.op == "lock" else unlock)(args, caller_from_sudo())
        except GpucrError as e:
            answer = {"error": e.cause, "fix": e.fix}
        print(json.dumps(answer), flush=True)
        return 1 if "error" in answer else 0
    try:
        who = caller_from_sudo()
        work_fd = user_dirs.open_dir(args.work, who)
    except GpucrError as e:
        print(f"gpucr-criu-root: {e.one_line()}", file=sys.stderr)
        return 1
    launcher = None
    caller = _parent_of(os.getppid())  # sudo's parent: who asked
    try:
        if args.op == "dump":
            # Ended by a signal, the dump still removes its scratch (a SIGKILL's: the next run's sweep).
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, _exit_on)
            out = dump(args, who, work_fd)
        else:
            # The restored tree is our descendant: Slurm's signals to the step reach
            # it directly. Dying of them would orphan it (a restore in flight would
            # finish outside the step), so they are let pass; the caller decides.
            for sig in TASK_SIGNALS:
                signal.signal(sig, lambda _s, _f: None)
            out, launcher = restore(args, who, work_fd, handed)
    except GpucrError as e:
        out = {"error": e.cause, "fix": e.fix}
    _write_result(work_fd, out, who)
    if "error" in out:
        return 1
    if args.op != "restore" or not args.new_pidns or launcher is None:
        return 0
    return wait_tied(launcher, caller) if args.tied else launcher.wait()


def wait_tied(launcher, caller: int) -> int:
    """The restored namespace's status; it is ended first if the caller (the job step
    that asked for it) dies: sudo outlives its parent, the tree must not."""
    while True:
        try:
            return launcher.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if not criu_mod.is_alive(caller):
                launcher.kill()  # the namespace's init: the whole tree goes with it


def _parent_of(pid: int) -> int:
    try:
        return int(processes.proc_status(pid)["PPid"])
    except (OSError, KeyError, ValueError):
        return pid


def _write_result(work_fd: int, out: dict, who: Caller) -> None:
    """result.json appears whole (renamed into place), so the caller can poll for it."""
    user_dirs.replace(work_fd, RESULT, who, (json.dumps(out) + "\n").encode())


def handed_in() -> frozenset[int]:
    """The descriptors the caller handed us (those open as we start)."""
    names = os.listdir("/proc/self/fd")  # its own descriptor is closed again by now
    return frozenset(fd for fd in map(int, names) if procfs.is_open(fd))


def _exit_on(sig: int, _frame) -> None:
    raise SystemExit(128 + sig)


if __name__ == "__main__":
    sys.exit(main())
