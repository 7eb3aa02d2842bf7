"""The root side of CRIU for ordinary users: run by sudo, one narrow job.

CRIU needs root to dump and to restore a process tree. A job's user reaches it
only through this program, which sudo runs as root (the sudoers rule that
`make install` writes names this one program):

* it dumps a tree only when every process of it is the caller's, checked
  before the dump and again while the tree is frozen (a process that became
  another user's in between fails the dump, and its images are deleted);
* it restores only CRIU images it sealed itself, for the same caller: an HMAC
  with the node key (`/etc/gpucr-hpc/image.key`, the same file on every node),
  checked while the images are copied into a directory only root can write;
* before a restored tree runs, every file CRIU opened or mapped for it must be
  one the caller could open with the same access, at the same path: a symlink
  planted in place of a file the tree had open cannot hand it a root-only file.

Directories of the caller are never written through a path: files are renamed
or copied in through an open directory descriptor, never following a link.

    gpucr-criu-root dump --pid PID --images DIR --work DIR [--leave-running] [--shell-job]
                         [--tcp-lock nftables|skip]
    gpucr-criu-root restore --images DIR --work DIR [--shell-job] [--new-pidns]
                            [--inherit-fd FD:KEY]... [--tcp] [--move END=ADDR]...
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
import ctypes
import errno
import hashlib
import hmac
import json
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpucr_hpc import tcp_end
from gpucr_hpc.criu import netlock
from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.criu import tcp as criu_tcp
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.privileged import tcp as privileged_tcp
from gpucr_hpc.slurm.signals import TASK_SIGNALS

KEY_FILE = Path("/etc/gpucr-hpc/image.key")
SEAL = "gpucr-seal"
RESULT = "result.json"
CHUNK = 8 << 20
CAP_SYS_RESOURCE = 24

_ACTION_SCRIPT = """#!/bin/sh
exec {python} -I -m gpucr_hpc.privileged.helper check --keep={keep} {uid} {gids} {out} {skip}
"""


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    gids: frozenset[int]

    @classmethod
    def from_sudo(cls) -> Caller:
        if os.geteuid() != 0:
            raise GpucrError("gpucr-criu-root must run as root", "run it through sudo -n")
        uid = int(os.environ.get("SUDO_UID", "0"))
        gid = int(os.environ.get("SUDO_GID", "0"))
        try:
            groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
        except KeyError:
            groups = [gid]
        return cls(uid, gid, frozenset(groups))


# -- whose processes ------------------------------------------------------------

def _ids(pid: int) -> tuple[list[int], list[int]]:
    status = criu_mod._status(pid)
    return ([int(x) for x in status["Uid"].split()], [int(x) for x in status["Gid"].split()])


def check_tree(pid: int, who: Caller) -> list[int]:
    """Every process of the tree is the caller's: all four uids, groups of theirs,
    and dumpable (/proc/PID is owned by the process's user only while it is)."""
    tree = criu_mod.process_tree(pid)
    for p in tree:
        try:
            uids, gids = _ids(p)
            dumpable_uid = criu_mod.owner_uid(p)
        except (OSError, KeyError):
            continue  # gone: CRIU says so if it matters
        if set(uids) != {who.uid} or dumpable_uid != who.uid:
            other = next((u for u in uids + [dumpable_uid] if u != who.uid), None)
            raise GpucrError(f"PID {p} runs as uid {other}, not as you (uid {who.uid})",
                             "checkpoint only your own processes")
        if not set(gids) <= who.gids:
            raise GpucrError(f"PID {p} runs with group {max(set(gids) - who.gids)}, not one of yours",
                             "checkpoint only your own processes")
    return tree


def check_files_reachable(pids: list[int], who: Caller, skip: tuple[str, ...] = ()) -> None:
    """Every path-backed file of the restored tree, as the caller would open it.

    Checked in a child that has become the caller: the kernel's path of each open
    file, mapping, cwd and executable must resolve to the same inode and allow the
    same access. Deleted files are CRIU's own ghosts, made from the sealed image."""
    wants: dict[tuple[str, int], tuple[int, int]] = {}
    for pid in pids:
        for path, mode, ident in _path_backed(pid):
            if not any(path.startswith(d.rstrip("/") + "/") for d in skip):
                wants.setdefault((path, mode), ident)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        code = 0
        try:
            os.setgroups(list(who.gids))
            os.setresgid(who.gid, who.gid, who.gid)
            os.setresuid(who.uid, who.uid, who.uid)
            for (path, mode), ident in sorted(wants.items()):
                try:
                    st = os.stat(path)
                    ok = (st.st_dev, st.st_ino) == ident and os.access(path, mode)
                except OSError:
                    ok = False
                if not ok:
                    os.write(w, path.encode())
                    code = 1
                    break
        except BaseException:
            code = 2
        os._exit(code)
    os.close(w)
    bad = b""
    while chunk := os.read(r, 4096):
        bad += chunk
    os.close(r)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        what = bad.decode(errors="replace") or "(the check could not run)"
        raise GpucrError(f"the restored tree would hold {what}, which you cannot open there",
                         "put back the file the process had open (not a link to another file)")


def _pair(text: str) -> tuple[int, int]:
    """`A:B` (as _checker writes a pipe to keep) as two numbers."""
    a, b = text.split(":")
    return int(a), int(b)


def give_pipes(pids: list[int], who: Caller, keep: frozenset[tuple[int, int]] = frozenset()) -> None:
    """The pipes CRIU made for the restored tree are the caller's, as they were.

    CRIU creates them as root, and a pipe's inode keeps its creator's uid and mode
    0600: the caller could no longer reopen /proc/PID/fd/N of their own process,
    which is how the CUDA driver's checkpoint calls reach it. Pipes handed in with
    --inherit-fd (keep) are not CRIU's and stay whose they are."""
    for pid in pids:
        base = f"/proc/{pid}/fd"
        for name in os.listdir(base):
            link = f"{base}/{name}"
            try:
                if not os.readlink(link).startswith("pipe:["):
                    continue
                st = os.stat(link)
                if st.st_uid == 0 and (st.st_dev, st.st_ino) not in keep:
                    os.chown(link, who.uid, who.gid)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise GpucrError(f"cannot give the restored pipe {link} to uid {who.uid}: {e.strerror}",
                                 "report this with the restore log")


PROC_SUPER_MAGIC = 0x9FA0


def _proc_root(path: str, st: os.stat_result) -> bool:
    """Whether path (an fd link) is the root directory of a proc file system."""
    if not stat.S_ISDIR(st.st_mode) or st.st_ino != 1:
        return False
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type comes first
    if ctypes.CDLL(None, use_errno=True).statfs(path.encode(), buf) != 0:
        return False
    return ctypes.c_long.from_buffer(buf).value == PROC_SUPER_MAGIC


def _path_backed(pid: int):
    """(kernel path, access mode, (dev, ino)) of fds, mappings, cwd and exe of pid."""
    base = f"/proc/{pid}"
    for name in os.listdir(f"{base}/fd"):
        link = f"{base}/fd/{name}"
        try:
            target = os.readlink(link)
            st = os.stat(link)
            flags = criu_mod.fd_flags(pid, name)
        except (OSError, AttributeError, ValueError):
            continue
        if _proc_root(link, st):
            continue  # CRIU's own fd of the namespace's /proc (unmounted, so it reads "/"): anyone may open it
        if target.startswith("/") and not target.endswith(" (deleted)"):
            acc = flags & os.O_ACCMODE
            mode = os.R_OK if acc == os.O_RDONLY else os.W_OK if acc == os.O_WRONLY else os.R_OK | os.W_OK
            yield target, mode, (st.st_dev, st.st_ino)
    with open(f"{base}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/") or parts[5].rstrip().endswith("(deleted)"):
                continue
            major, minor = (int(x, 16) for x in parts[3].split(":"))
            mode = os.R_OK | (os.W_OK if "w" in parts[1] and "s" in parts[1] else 0)
            yield parts[5].rstrip("\n"), mode, (os.makedev(major, minor), int(parts[4]))
    for name, mode in (("cwd", os.X_OK), ("exe", os.X_OK)):
        try:
            target, st = os.readlink(f"{base}/{name}"), os.stat(f"{base}/{name}")
        except OSError:
            continue
        if target.startswith("/") and not target.endswith(" (deleted)"):
            yield target, mode, (st.st_dev, st.st_ino)


# -- directories of the caller ---------------------------------------------------

def open_callers_dir(path: str, who: Caller) -> int:
    """An fd of the caller's own directory, opened without following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise GpucrError(f"cannot open directory {path}: {e.strerror}", "give a directory of your own")
    owner = os.fstat(fd).st_uid
    if owner != who.uid:
        os.close(fd)
        raise GpucrError(f"{path} belongs to uid {owner}, not to you (uid {who.uid})",
                         "use your own image directory")
    return fd


def hand_over(src: Path, dst_fd: int, who: Caller) -> None:
    """Move the files of our private dir src into the caller's dir: renamed when on
    the same file system, else copied into new files; never through a link."""
    src_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            if not entry.is_file(follow_symlinks=False):
                continue
            try:
                os.rename(entry.name, entry.name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
                _copy_in(entry.path, entry.name, dst_fd)
            os.chown(entry.name, who.uid, who.gid, dir_fd=dst_fd, follow_symlinks=False)
    finally:
        os.close(src_fd)


def _copy_in(src: str, name: str, dst_fd: int) -> None:
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst_fd)
    with open(src, "rb") as f, os.fdopen(out, "wb") as g:
        shutil.copyfileobj(f, g, CHUNK)
    os.unlink(src)


@contextmanager
def private_dir(kind: str, need: int = 0):
    """A directory only root can write: in /dev/shm when it has room, else /var/tmp."""
    parent = "/var/tmp"
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > need + (256 << 20):
            parent = "/dev/shm"
    except OSError:
        pass
    d = Path(tempfile.mkdtemp(prefix=f"gpucr-root-{kind}-", dir=parent))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- the seal ------------------------------------------------------------------

def _key() -> bytes:
    try:
        key = KEY_FILE.read_bytes()
    except OSError:
        raise GpucrError(f"the node key {KEY_FILE} is missing",
                         "run make install as root (it creates it) and copy it to every node")
    if len(key) < 32:
        raise GpucrError(f"the node key {KEY_FILE} is shorter than 32 bytes", "recreate it: make install")
    return key


def _mac(who: Caller, digests: dict[str, str]) -> str:
    text = f"uid={who.uid}\n" + "".join(f"{n} {d}\n" for n, d in sorted(digests.items()))
    return hmac.new(_key(), text.encode(), hashlib.sha256).hexdigest()


def seal(images: Path, who: Caller) -> None:
    digests = {}
    for entry in os.scandir(images):
        h = hashlib.sha256()
        with open(entry.path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        digests[entry.name] = h.hexdigest()
    (images / SEAL).write_text(json.dumps({"uid": who.uid, "mac": _mac(who, digests)}) + "\n")


def copy_verified(src_fd: int, dst: Path, who: Caller) -> None:
    """Copy the caller's CRIU images into dst, checking the seal on the way."""
    try:
        rec = json.loads(_read_at(src_fd, SEAL))
    except (OSError, ValueError):
        raise GpucrError("the image's CRIU files carry no valid seal of this cluster",
                         "restore an image that gpucr-hpc checkpointed for you")
    digests = {}
    for name in os.listdir(src_fd):
        if name == SEAL:
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=src_fd)
        except OSError as e:
            raise GpucrError(f"cannot read image file {name}: {e.strerror}", "restore from another copy")
        h = hashlib.sha256()
        with os.fdopen(fd, "rb") as f, open(dst / name, "xb") as g:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise GpucrError(f"image file {name} is not a regular file", "restore from another copy")
            while chunk := f.read(CHUNK):
                h.update(chunk)
                g.write(chunk)
        digests[name] = h.hexdigest()
    if rec.get("uid") != who.uid or not hmac.compare_digest(str(rec.get("mac")), _mac(who, digests)):
        raise GpucrError(f"the image's CRIU files were changed since the checkpoint, or were made "
                         f"for uid {rec.get('uid')} (you are uid {who.uid})",
                         "restore an unchanged image that gpucr-hpc checkpointed for you")


def _read_at(dir_fd: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    with os.fdopen(fd) as f:
        return f.read(65536)


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
    eff = int(criu_mod._status(os.getpid())["CapEff"], 16)
    if eff >> CAP_SYS_RESOURCE & 1:
        return None
    names = subprocess.run(["setpriv", "--list-caps"], capture_output=True, text=True).stdout.split()
    caps = ",".join(f"+{n}" for i, n in enumerate(names) if eff >> i & 1)
    return ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}",
            "--groups=" + ",".join(str(g) for g in sorted(who.gids)),
            f"--inh-caps={caps}", f"--ambient-caps={caps}"]


def dump(args, who: Caller, work_fd: int) -> dict:
    tree = check_tree(args.pid, who)
    images_fd = open_callers_dir(args.images, who)
    need = criu_mod.rss_bytes(tree)
    with private_dir("dump", need) as images, private_dir("work") as work:
        try:
            files = criu_mod.find_criu().dump(
                args.pid, images, work, leave_running=args.leave_running, shell_job=args.shell_job,
                extra=_checker(work, who, images), run_as=as_owner(who), tcp_lock=args.tcp_lock)
            seal(images, who)
            hand_over(images, images_fd, who)
            return {"open_files": files}
        except GpucrError as e:
            _why_check_failed(work / "check.json", e, args.work)
            raise
        finally:
            _logs_back(work, work_fd, who)


def restore(args, who: Caller, work_fd: int) -> tuple[dict, subprocess.Popen | None]:
    images_fd = open_callers_dir(args.images, who)
    inherit = {}
    for spec in args.inherit_fd:
        fd, _, key = spec.partition(":")
        inherit[int(fd)] = key
    keep = []
    for fd in inherit:
        try:
            st = os.fstat(fd)
        except OSError:
            continue  # CRIU says what is missing
        keep.append((st.st_dev, st.st_ino))
    size = sum(os.stat(n, dir_fd=images_fd, follow_symlinks=False).st_size for n in os.listdir(images_fd))
    moved = dict(m.partition("=")[::2] for m in args.move)  # move_addresses refuses a bad one
    table = privileged_tcp.table_name(who.uid, args.lock) if args.lock else None
    with private_dir("restore", size) as images, private_dir("work") as work:
        copy_verified(images_fd, images, who)
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
    for name in ("dump.log", "restore.log"):
        if (work / name).exists():
            try:
                os.unlink(name, dir_fd=work_fd)
            except FileNotFoundError:
                pass
            _copy_in(str(work / name), name, work_fd)
            os.chown(name, who.uid, who.gid, dir_fd=work_fd, follow_symlinks=False)


def action_check(uid: int, gids: str, out: str, skip: list[str], keep: str = "-") -> int:
    """Run by CRIU as its action script: post-dump (tree frozen) and post-restore
    (tree restored, not yet resumed). Non-zero makes CRIU fail and resume or kill it."""
    action = os.environ.get("CRTOOLS_SCRIPT_ACTION", "")
    if action not in ("post-dump", "post-restore"):
        return 0
    groups, _, gid = gids.rpartition(":")
    who = Caller(uid, int(gid), frozenset(int(g) for g in groups.split(",") if g))
    root = int(os.environ["CRTOOLS_INIT_PID"])
    try:
        if action == "post-dump":
            check_tree(root, who)
        else:
            tree = criu_mod.process_tree(root)
            check_files_reachable(tree, who, tuple(skip))
            give_pipes(tree, who, frozenset(_pair(k) for k in keep.split(",") if k != "-"))
    except GpucrError as e:
        Path(out).write_text(json.dumps({"error": e.cause, "fix": e.fix}))
        return 1
    return 0


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
    lk = sub.add_parser("lock")
    ul = sub.add_parser("unlock")
    for s in (r, lk):
        s.add_argument("--lock-seconds", default=str(netlock.EXPIRES_S))
        s.add_argument("--flow", action="append", default=[])
    r.add_argument("--lock")
    lk.add_argument("--lock", required=True)
    ul.add_argument("--lock", required=True)
    c = sub.add_parser("check")
    c.add_argument("--keep", default="-")
    c.add_argument("uid", type=int)
    c.add_argument("gids")
    c.add_argument("out")
    c.add_argument("skip", nargs="*")
    args = p.parse_args(argv)
    if args.op == "check":
        return action_check(args.uid, args.gids, args.out, args.skip, args.keep)
    if args.op in ("lock", "unlock"):
        try:
            answer = (lock if args.op == "lock" else unlock)(args, Caller.from_sudo())
        except GpucrError as e:
            answer = {"error": e.cause, "fix": e.fix}
        print(json.dumps(answer), flush=True)
        return 1 if "error" in answer else 0
    try:
        who = Caller.from_sudo()
        work_fd = open_callers_dir(args.work, who)
    except GpucrError as e:
        print(f"gpucr-criu-root: {e.one_line()}", file=sys.stderr)
        return 1
    launcher = None
    caller = _parent_of(os.getppid())  # sudo's parent: who asked
    try:
        if args.op == "dump":
            out = dump(args, who, work_fd)
        else:
            # The restored tree is our descendant: Slurm's signals to the step reach
            # it directly. Dying of them would orphan it (a restore in flight would
            # finish outside the step), so they are let pass; the caller decides.
            for sig in TASK_SIGNALS:
                signal.signal(sig, lambda _s, _f: None)
            out, launcher = restore(args, who, work_fd)
    except GpucrError as e:
        out = {"error": e.cause, "fix": e.fix}
    _write_result(work_fd, out, who)
    if "error" in out:
        return 1
    if not (args.new_pidns and launcher is not None):
        return 0
    return wait_tied(launcher, caller) if args.op == "restore" and args.tied else launcher.wait()


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
        return int(criu_mod._status(pid)["PPid"])
    except (OSError, KeyError, ValueError):
        return pid


def _write_result(work_fd: int, out: dict, who: Caller) -> None:
    """result.json appears whole (renamed into place), so the caller can poll for it."""
    tmp = f".result.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=work_fd)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(out) + "\n")
    os.chown(tmp, who.uid, who.gid, dir_fd=work_fd, follow_symlinks=False)
    os.rename(tmp, RESULT, src_dir_fd=work_fd, dst_dir_fd=work_fd)


if __name__ == "__main__":
    sys.exit(main())
