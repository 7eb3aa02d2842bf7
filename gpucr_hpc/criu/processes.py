"""Processes and process trees as the kernel shows them (/proc), the system's
tools by absolute path, and the handle of a tree CRIU restored: what running
CRIU, its root helper and the TCP lock all need, none of them importing another."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field

from gpucr_hpc.criu.procfs import fd_targets
from gpucr_hpc.errors import GpucrError

SYSTEM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def system_tool(name: str) -> str:
    """A tool of the operating system, by its absolute path: never one a PATH chose."""
    for d in SYSTEM_DIRS:
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise GpucrError(f"{name} is not installed in {', '.join(SYSTEM_DIRS)}",
                     f"install it (util-linux has {name}): scripts/install-deps")


def criu_env(**extra: str) -> dict:
    """Our environment without LD_PRELOAD: inside a --gpucr=on job it holds the shim,
    whose control thread must not run inside CRIU (a forked CRIU helper with an
    extra thread never becomes reapable, and CRIU waits for it forever)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(extra)
    return env


@dataclass
class Restored:
    host_pid: int            # the restored root as seen from here
    ns_pid: int | None       # the root's PID inside its namespace (its original PID)
    new_pidns: bool
    launcher: subprocess.Popen | None = field(repr=False, default=None)


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants, parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children(p)
    return out


def end_tree(pid: int, launcher: subprocess.Popen | None = None) -> None:
    """SIGKILL a restored tree, leaves first, and reap its launcher. In a new PID
    namespace the root's death ends its init, and the kernel the rest with it."""
    for p in reversed(process_tree(pid)):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if launcher is not None:
        launcher.wait()


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status, field by field."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def nspid(pid: int) -> list[int]:
    return [int(x) for x in proc_status(pid).get("NSpid", str(pid)).split()]


def enter_pidns_of(pid: int) -> tuple[list[str], int]:
    """How CRIU must run to dump the tree of `pid`: (command prefix, the tree's PID there).

    A restored tree lives in a PID namespace of its own (and the mount namespace
    that mounts its /proc), below ours. CRIU cannot dump a PID namespace without
    its init, so it runs inside both namespaces and sees the tree as its own: the
    image then holds the PIDs the tree knows, as a first dump's does, and is
    restored the same way."""
    inside, ours = nspid(pid), nspid(os.getpid())
    if len(inside) <= len(ours):
        return [], pid
    return [system_tool("nsenter"), f"--target={pid}", "--pid", "--mount", "--"], inside[-1]


def pid_in_image(pid: int) -> int:
    """`pid` as an image of its tree records it: the PID the tree knows (see enter_pidns_of)."""
    return enter_pidns_of(pid)[1]


def owner_uid(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


def is_session_leader(pid: int) -> bool:
    return os.getsid(pid) == pid


def session_visible(pid: int) -> bool:
    """False when `pid`'s session leader lies outside its PID namespace.

    The kernel then reports its session as 0 inside that namespace (last NSsid
    field), and CRIU cannot record it, not even with --shell-job.
    """
    nssid = proc_status(pid).get("NSsid", "").split()
    return not nssid or int(nssid[-1]) != 0


def is_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_reaped(pid: int, timeout: float = 2.0) -> None:
    """Waits (at most `timeout`) until no process of pid's tree is exiting: CRIU
    refuses a tree with a process caught mid-exit ("zombies with threads"), and
    its parent reaps it in a moment. One that stays a zombie is left to CRIU."""
    deadline = time.monotonic() + timeout
    while any(not is_alive(p) for p in process_tree(pid)) and time.monotonic() < deadline:
        time.sleep(0.01)


def wait_gone(pids: list[int], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(is_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    return total


def pid_in_use(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def open_files(pids: list[int]) -> list[dict]:
    """Regular files held open or mapped by the tree, with their current size.

    CRIU refuses a restore when such a file changed size since the dump; these
    records let the restore say which file and what to do before CRIU runs.
    """
    seen: dict[str, dict] = {}
    for pid in pids:
        entries = []
        for sub in ("fd", "map_files"):
            try:
                names = os.listdir(f"/proc/{pid}/{sub}")
            except OSError:
                continue
            entries += [(sub, n) for n in names]
        for sub, n in entries:
            link = f"/proc/{pid}/{sub}/{n}"
            try:
                target = os.readlink(link)
                st = os.stat(link)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or not target.startswith("/") or target.endswith(" (deleted)"):
                continue
            writable = False
            if sub == "fd":
                try:
                    writable = (fd_flags(pid, n) & os.O_ACCMODE) != os.O_RDONLY
                except (OSError, AttributeError):
                    pass
            rec = seen.setdefault(target, {"path": target, "size": st.st_size, "writable": False})
            rec["writable"] = rec["writable"] or writable
    return sorted(seen.values(), key=lambda r: r["path"])


def fd_flags(pid: int, fd: int | str) -> int:
    """The open flags of one fd of pid (O_ACCMODE and the rest), from /proc fdinfo."""
    with open(f"/proc/{pid}/fdinfo/{fd}") as f:
        m = re.search(r"flags:\s*(\d+)", f.read())
    if m is None:
        raise OSError(f"no flags in /proc/{pid}/fdinfo/{fd}")
    return int(m.group(1), 8)


def holds_gpu(pids: list[int]) -> bool:
    """True when any process of the tree has a GPU device open."""
    return any(t.startswith(("/dev/nvidia", "/dev/dri/")) or t == "/dev/kfd"
               for pid in pids for t in fd_targets(pid))
