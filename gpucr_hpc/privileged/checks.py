"""The root helper's checks on a process tree, and CRIU's action script that runs them.

CRIU runs the action script as root at post-dump (the tree frozen) and
post-restore (the tree restored, not yet resumed); a non-zero exit makes CRIU
fail, and resume or kill the tree. The script is this module, started with
`python -I -m gpucr_hpc.privileged.checks` from a file the helper wrote into
its own private directory: it is not a verb of the helper, so sudo's rule does
not reach it, and its arguments (the caller's ids, where to write) are root's.

    python -I -m gpucr_hpc.privileged.checks [--keep=DEV:INO,...] UID GIDS:GID OUT [SKIP...]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import stat
import sys
from pathlib import Path

from gpucr_hpc.criu import processes
from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.privileged import namespaces
from gpucr_hpc.privileged.user_dirs import Caller


def _ids(pid: int) -> tuple[list[int], list[int]]:
    """All four uids; all four gids and the supplementary groups."""
    status = processes.proc_status(pid)
    return ([int(x) for x in status["Uid"].split()],
            [int(x) for x in status["Gid"].split() + status.get("Groups", "").split()])


def check_tree(pid: int, who: Caller) -> list[int]:
    """Every process of the tree is the caller's: all four uids, groups of theirs
    (supplementary ones too), dumpable (/proc/PID is owned by the process's user
    only while it is), and in no user namespace (namespaces.py)."""
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
    namespaces.check_user_ns(tree)
    return tree


def tree_groups(tree: list[int]) -> frozenset[int]:
    """Every group a process of the tree holds: CRIU gives them back at a restore."""
    out: set[int] = set()
    for p in tree:
        try:
            out |= set(_ids(p)[1])
        except (OSError, KeyError):
            continue
    return frozenset(out)


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
    p = argparse.ArgumentParser(prog="gpucr-criu-root-check")
    p.add_argument("--keep", default="-")
    p.add_argument("uid", type=int)
    p.add_argument("gids")
    p.add_argument("out")
    p.add_argument("skip", nargs="*")
    args = p.parse_args(argv)
    return action_check(args.uid, args.gids, args.out, args.skip, args.keep)


if __name__ == "__main__":
    sys.exit(main())
