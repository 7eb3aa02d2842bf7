"""Finding and driving CRIU: the CPU side of a process tree.

CRIU >= 4.1 is needed (3.17 fails on current kernels). It is looked up in this
order: `$GPUCR_CRIU`, `$GPUCR_PREFIX/bin/criu`, `/opt/gpucr-hpc/bin/criu` (the
wrapper that scripts/install-deps writes), then `criu` on PATH.

Gotchas handled here (shared FACTS, CRIU):
* the dumped root must be a session leader, else `--shell-job` is used;
* a restore in the current PID namespace fails while any PID of the tree is in
  use, so that is checked first; a restore into a new PID namespace
  (`unshare -p -f --mount-proc`, CRIU in the foreground as its init) avoids it;
* regular files the tree had open must have their dump-time size at restore:
  they are recorded at dump (`open_files`) and checked before restore;
* CRIU writes logs and stats into its images dir unless told otherwise, so it
  always gets a separate `--work-dir`: a restore never writes into an image.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpucr_hpc import config
from gpucr_hpc.criu import pidns_init
from gpucr_hpc.criu.processes import (  # re-exported: criu.run is where callers find them
    Restored as Restored,
)
from gpucr_hpc.criu.processes import (
    children as children,
)
from gpucr_hpc.criu.processes import (
    criu_env as criu_env,
)
from gpucr_hpc.criu.processes import (
    end_tree as end_tree,
)
from gpucr_hpc.criu.processes import (
    enter_pidns_of as enter_pidns_of,
)
from gpucr_hpc.criu.processes import (
    fd_flags as fd_flags,
)
from gpucr_hpc.criu.processes import (
    holds_gpu as holds_gpu,
)
from gpucr_hpc.criu.processes import (
    is_alive as is_alive,
)
from gpucr_hpc.criu.processes import (
    is_session_leader as is_session_leader,
)
from gpucr_hpc.criu.processes import (
    nspid as nspid,
)
from gpucr_hpc.criu.processes import (
    open_files as open_files,
)
from gpucr_hpc.criu.processes import (
    owner_uid as owner_uid,
)
from gpucr_hpc.criu.processes import (
    pid_in_image as pid_in_image,
)
from gpucr_hpc.criu.processes import (
    pid_in_use as pid_in_use,
)
from gpucr_hpc.criu.processes import (
    process_tree as process_tree,
)
from gpucr_hpc.criu.processes import (
    rss_bytes as rss_bytes,
)
from gpucr_hpc.criu.processes import (
    session_visible as session_visible,
)
from gpucr_hpc.criu.processes import (
    system_tool as system_tool,
)
from gpucr_hpc.criu.processes import (
    wait_gone as wait_gone,
)
from gpucr_hpc.criu.processes import (
    wait_reaped as wait_reaped,
)
from gpucr_hpc.errors import GpucrError

if TYPE_CHECKING:
    from gpucr_hpc.tcp.flows import Spec

MIN_VERSION = (4, 1)
DEFAULT_WRAPPER = "/opt/gpucr-hpc/bin/criu"
_PKG_PARENT = str(Path(__file__).resolve().parents[2])  # the folder holding gpucr_hpc: the post-dump script's
INSTALL_FIX = "run scripts/install-deps (as root) to install CRIU >= 4.1, or point GPUCR_CRIU at one"

# Runs inside `criu dump` after the images are written, tasks still frozen.
_POST_DUMP_SCRIPT = """#!/bin/sh
[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] || exit 0
exec {python} -I -c {code}
"""
_POST_DUMP_CODE = (
    "import json, sys; sys.path.insert(0, {path!r}); "
    "from gpucr_hpc.criu.processes import open_files, process_tree; "
    "json.dump(open_files(process_tree({pid})), open({out!r}, 'w'))"
)

# CRIU error lines that are known to be harmless (FACTS: CRIU).
_HARMLESS = ("Can't setup RLIMIT_NOFILE",)

# A tree is restored into the cgroups of whoever restores it (the job's new step),
# never into those it had: on another node those are the old node's job cgroups,
# where Slurm's proctrack/cgroup would neither freeze, limit nor end it. CRIU's
# "ignore" mode, at dump and restore, leaves cgroups alone.
NO_CGROUPS = ("--manage-cgroups=ignore",)


def _parse_version(text: str) -> tuple[int, ...] | None:
    m = re.search(r"^Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", text, re.M)
    if not m:
        return None
    return tuple(int(x) for x in m.groups() if x is not None)


def candidates() -> list[tuple[str, str]]:
    """(path, where it came from) in lookup order; only existing ones after the first."""
    out = []
    prefix = config.value("GPUCR_PREFIX")
    if prefix:
        out.append((os.path.join(prefix, "bin", "criu"), "GPUCR_PREFIX"))
    out.append((DEFAULT_WRAPPER, "default install"))
    on_path = shutil.which("criu")
    if on_path:
        out.append((on_path, "PATH"))
    return out


@dataclass
class Criu:
    path: str
    version: tuple[int, ...]

    @property
    def version_str(self) -> str:
        return ".".join(str(v) for v in self.version)

    # -- running -----------------------------------------------------------

    def dump(self, pid: int, images_dir: Path, work_dir: Path, *, leave_running: bool,
             shell_job: bool, extra: list[str] | None = None,
             run_as: list[str] | None = None, tcp_lock: str | None = None) -> list[dict]:
        """Dump the process tree rooted at `pid` into `images_dir` (CRIU files only).

        Returns the regular files the tree holds open, with their sizes taken
        by a post-dump action script while the tree is still frozen, i.e. the
        sizes CRIU recorded and will insist on at restore.

        An ordinary user's dump goes through the root helper (criu_helper);
        `run_as` is its command prefix that runs CRIU as the tree's owner
        with root's capabilities (criu_root.as_owner).

        `tcp_lock`: established TCP connections are dumped (their queues and
        sequence numbers), with CRIU's network lock ("nftables"), or none
        ("skip": the caller holds the job's lock, tcp/lock).
        """
        if os.geteuid() != 0:
            from gpucr_hpc.criu import root_helper
            return root_helper.dump(pid, images_dir, work_dir, leave_running=leave_running,
                                    shell_job=shell_job, tcp_lock=tcp_lock)
        enter, tree_pid = enter_pidns_of(pid)
        args = enter + (run_as or []) + [self.path] + (["--unprivileged"] if run_as else []) + [
            "dump", "-t", str(tree_pid), "-D", str(images_dir), "-W", str(work_dir),
            "-o", "dump.log", "-v4", "--file-locks", "--link-remap", *NO_CGROUPS]
        if leave_running:
            args.append("--leave-running")
        if shell_job:
            args.append("--shell-job")
        files_json = work_dir / "open-files.json"
        script = work_dir / "post-dump.sh"
        script.write_text(_POST_DUMP_SCRIPT.format(
            python=shlex.quote(sys.executable),
            code=shlex.quote(_POST_DUMP_CODE.format(
                path=_PKG_PARENT, pid=tree_pid, out=str(files_json)))))
        script.chmod(0o700)
        args += ["--action-script", str(script)]
        if tcp_lock:
            args += ["--tcp-established", "--network-lock", tcp_lock]
        args += extra or []
        r = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=criu_env(),
                           stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise GpucrError(
                f"criu dump of PID {pid} failed: {first_error(work_dir / 'dump.log', r.stdout)}",
                f"see {work_dir / 'dump.log'}; the process was left running",
            )
        try:
            return json.loads(files_json.read_text())
        except (OSError, ValueError):
            raise GpucrError(f"criu dump of PID {pid}: the list of its open files was not written",
                             f"see {work_dir / 'dump.log'}")

    def start_restore(self, images_dir: Path, work_dir: Path, *, shell_job: bool,
                      new_pidns: bool, inherit: dict[int, str] | None = None,
                      extra: list[str] | None = None, tied: bool = False, tcp: bool = False,
                      moved: dict[str, str] | None = None, lock: Spec | None = None,
                      closed: list[tuple[str, str]] | None = None) -> Restored:
        """Restore a tree; returns once it runs (or raises with CRIU's own error).

        In the current PID namespace CRIU detaches (`-d`) and the tree is
        reparented to init. In a new PID namespace the namespace's init is
        pidns_init, which runs CRIU detached and then waits for the restored
        root: the launcher returned in `Restored` exits with the root's status.

        `inherit` maps our fds to CRIU keys (`pipe:[123]`, a file path): the
        restored tree gets our fd where it had that resource (`--inherit-fd`),
        e.g. the stdio pipes of a new Slurm step in place of the old ones.

        `tied` (new_pidns only): the namespace, and the tree in it, ends with the
        calling thread, as a job's processes must end with its step: nothing of a
        job may run on outside it when the step that restored it dies.

        `tcp`: the images hold established TCP connections. `moved`: those of
        their ends that are elsewhere now ("addr:port" or "addr" -> new address),
        rewritten in a copy of the images (criu/tcp); `closed`: connections
        (local end, remote end) given back closed there. `lock`: taken on the
        restored connections just before CRIU runs (tcp/lock); the caller
        lets it go.

        An ordinary user's restore goes through the root helper (criu_helper),
        which moves and locks only what its checks allow.
        """
        if os.geteuid() != 0:
            from gpucr_hpc.criu import root_helper
            return root_helper.start_restore(images_dir, work_dir, shell_job=shell_job,
                                             new_pidns=new_pidns, inherit=inherit, tied=tied,
                                             tcp=tcp, moved=moved, lock=lock, closed=closed)
        if moved or closed:
            from gpucr_hpc.criu import tcp as criu_tcp

            images_dir = criu_tcp.moved_copy(images_dir, work_dir / "moved-images", moved or {}, closed)
        if lock:
            from gpucr_hpc.tcp import lock as netlock

            netlock.lock(lock.name, lock.flows, lock.expires_s)
        pidfile = work_dir / "restore.pid"
        log = work_dir / "restore.log"
        args = [self.path, "restore", "-D", str(images_dir), "-W", str(work_dir), "-o", "restore.log",
                "-v4", "--file-locks", "--link-remap", *NO_CGROUPS, "--pidfile", str(pidfile)]
        if shell_job:
            args.append("--shell-job")
        inherit = inherit or {}
        for fd, key in sorted(inherit.items()):
            args += ["--inherit-fd", f"fd[{fd}]:{key}"]
        if tcp:
            args.append("--tcp-established")  # CRIU locks as the dump did; "skip": the caller holds the lock
        args += extra or []
        args.append("-d")
        if new_pidns:
            # --kill-child: the namespace's init dies with unshare; setpriv: unshare with us.
            # pidns_init, run as root, by its own path and isolated (-I): nothing of the
            # caller's working directory or environment is imported.
            tie = [system_tool("setpriv"), "--pdeathsig", "KILL"] if tied else []
            args = tie + [system_tool("unshare"), "-p", "-f", "--kill-child=SIGKILL", "--mount-proc",
                          sys.executable, "-I", os.path.realpath(pidns_init.__file__)] + args
        std = [None if fd in inherit else subprocess.DEVNULL for fd in (0, 1, 2)]
        proc = subprocess.Popen(args, stdin=std[0], stdout=std[1], stderr=std[2],
                                start_new_session=True, close_fds=True, env=criu_env())
        deadline = time.monotonic() + 600
        while True:
            text = log.read_text(errors="replace") if log.exists() else ""
            if "Restore finished successfully" in text:
                break
            rc = proc.poll()
            if rc is not None and not new_pidns:
                # -d: CRIU exits once the tree runs (0) or on failure.
                text = log.read_text(errors="replace") if log.exists() else ""
                if rc == 0 and "Restore finished successfully" in text:
                    break
                raise GpucrError(f"criu restore failed: {first_error(log, '')}",
                                 f"see {log}; the image was not changed")
            if rc is not None:
                raise GpucrError(f"criu restore failed: {first_error(log, '')}",
                                 f"see {log}; the image was not changed")
            if time.monotonic() > deadline:
                _kill_group(proc)
                raise GpucrError("criu restore did not finish in 600 s", f"see {log}")
            time.sleep(0.01)
        # CRIU writes its stats after the success line; let it finish with the
        # work dir before the caller removes it (it stays running in new_pidns).
        end = time.monotonic() + 5
        while not (work_dir / "stats-restore").exists() and time.monotonic() < end:
            time.sleep(0.005)
        ns_pid = int(pidfile.read_text().strip()) if pidfile.exists() else None
        if new_pidns:
            host_pid = _find_ns_root(proc.pid, ns_pid)
            # The namespace's init reads the pidfile too; the work dir must outlive that.
            taken = Path(str(pidfile) + ".taken")
            end = time.monotonic() + 30
            while not taken.exists() and proc.poll() is None and time.monotonic() < end:
                time.sleep(0.005)
        else:
            proc.wait()
            if ns_pid is None:
                raise GpucrError(f"criu restore wrote no pidfile ({pidfile})", f"see {log}")
            host_pid = ns_pid
        return Restored(host_pid=host_pid, ns_pid=ns_pid, new_pidns=new_pidns, launcher=proc)


def _find_ns_root(unshare_pid: int, ns_pid: int | None) -> int:
    """The restored root's host PID: in unshare's subtree, with its original PID in the namespace."""
    for _ in range(200):
        for c in process_tree(unshare_pid)[2:]:  # below unshare and the namespace's init
            try:
                if ns_pid is None or nspid(c)[-1] == ns_pid:
                    return c
            except OSError:
                continue
        time.sleep(0.01)
    raise GpucrError("restored process not found under its PID namespace",
                     "report this as a bug with the restore log")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def first_error(log: Path, fallback: str) -> str:
    """The first meaningful `Error (...)` line of a CRIU log, shortened."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        text = ""
    for line in (text + "\n" + (fallback or "")).splitlines():
        if "Error (" in line and not any(h in line for h in _HARMLESS):
            return re.sub(r"^\(\s*[\d.]+\)\s*", "", line).strip()
    tail = [line for line in (fallback or text).splitlines() if line.strip()]
    return tail[-1].strip() if tail else "no error message"


def find_criu() -> Criu:
    """The CRIU to use, or a GpucrError naming the fix."""
    explicit = config.value("GPUCR_CRIU")
    if explicit:
        tries = [(explicit, "GPUCR_CRIU")]
    else:
        tries = candidates()
    too_old = None
    for path, origin in tries:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            if origin == "GPUCR_CRIU":
                raise GpucrError(f"CRIU not found at GPUCR_CRIU={path}", INSTALL_FIX)
            continue
        try:
            r = subprocess.run([path, "--version"], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=30)
            version = _parse_version(r.stdout + r.stderr)
        except (OSError, subprocess.TimeoutExpired):
            version = None
        if version is None:
            if origin == "GPUCR_CRIU":
                raise GpucrError(f"{path} (GPUCR_CRIU) does not run or print a CRIU version",
                                 INSTALL_FIX)
            continue
        if version[:2] < MIN_VERSION:
            too_old = (path, version)
            if origin == "GPUCR_CRIU":
                break
            continue
        return Criu(path=path, version=version)
    if too_old:
        path, version = too_old
        raise GpucrError(
            f"CRIU at {path} is version {'.'.join(map(str, version))}, "
            f"{'.'.join(map(str, MIN_VERSION))} or newer is needed", INSTALL_FIX)
    raise GpucrError("CRIU not found", INSTALL_FIX)


# -- /proc helpers ------------------------------------------------------------
