"""Talking to the shim in a process: its control socket, one JSON object per line.

Every process running under `libgpucr-cuda.so` serves `<run dir>/<pid>.sock`.
The run dir is `$GPUCR_RUN_DIR`, else `$XDG_RUNTIME_DIR/gpucr`, else
`/tmp/gpucr-<uid>` — the same rule the shim applies (shim/control.c).

A process restored from an image keeps the socket it had: bound under the run
dir where it first ran, and named after its PID there, which is its PID inside
the new PID namespace of a restore, not the PID seen here. So a process's socket
is found from the process itself (`control_socket`), not from its PID.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.criu import procfs
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.shim import protocol
from gpucr_hpc.slurm.site import load_site

SHIM_NAME = "libgpucr-cuda.so"


def default_run_dir() -> Path:
    env = config.value("GPUCR_RUN_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "gpucr"
    return Path(f"/tmp/gpucr-{os.getuid()}")




def shim_candidates() -> list[Path]:
    """Where libgpucr-cuda.so is looked for, in this order: $GPUCR_SHIM; the install
    under $GPUCR_PREFIX; the shim= of the site's plugstack.conf line, which jobs use;
    the source tree; the installs of `make install` ($(PREFIX)/lib/gpucr: the
    top-level Makefile's PREFIX, then shim/Makefile's /usr/local, the site default)
    and /usr/lib/gpucr."""
    out = []
    if config.value("GPUCR_SHIM"):
        out.append(Path(config.value("GPUCR_SHIM")))
    if config.value("GPUCR_PREFIX"):
        out.append(Path(config.value("GPUCR_PREFIX")) / "lib" / "gpucr" / SHIM_NAME)
    try:
        site = load_site()
        if site.plugstack is not None:
            out.append(Path(site.shim))
    except (GpucrError, ValueError):
        pass  # a plugstack.conf we cannot read: the other places still count
    out += [Path(__file__).resolve().parents[2] / "shim" / SHIM_NAME]  # a source checkout
    out += [Path(prefix) / "lib" / "gpucr" / SHIM_NAME for prefix in (config.INSTALL_PREFIX, "/usr/local", "/usr")]
    return out


def shim_library() -> Path:
    """The first of shim_candidates() that exists."""
    for c in shim_candidates():
        if c.is_file():
            return c
    raise GpucrError(f"the shim {SHIM_NAME} was not found",
                     "build it with `make -C shim`, install it with `make install` (into $PREFIX/lib/gpucr; "
                     "set GPUCR_PREFIX for a PREFIX other than /opt/gpucr-hpc) or point GPUCR_SHIM at it")


def socket_path(pid: int, run_dir: Path | None = None) -> Path:
    return (run_dir or default_run_dir()) / f"{pid}.sock"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _own_pid(pid: int) -> int:
    """PID's PID inside its own PID namespace (what the shim named its socket after)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


def control_socket(pid: int, run_dir: Path | None = None) -> Path | None:
    """The control socket process PID serves, or None. Found from the process: the
    listening Unix socket among its descriptors named `<its own PID>.sock` (wherever
    it was bound); where its descriptors cannot be read, `<run dir>/<pid>.sock`."""
    inodes = procfs.socket_inodes(pid)
    if not inodes:
        guess = socket_path(pid, run_dir)
        return guess if guess.is_socket() and not os.access(f"/proc/{pid}/fd", os.R_OK) else None
    name = f"{_own_pid(pid)}.sock"
    try:
        table = Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]
    except OSError:
        return None
    found = []
    for row in table:  # Num RefCount Protocol Flags Type St Inode Path (the path may hold spaces)
        f = row.split(None, 7)
        if len(f) >= 8 and int(f[6]) in inodes and f[7].endswith("/" + name) and Path(f[7]).is_socket():
            found.append(Path(f[7]))
    # A process may serve more than one (a run dir given with --run-dir): that one first.
    wanted = [p for p in found if run_dir is not None and p.parent == Path(run_dir)]
    return (wanted or found)[0] if found else None


def uses_shim(pid: int) -> bool:
    """Whether the shim is loaded in process PID (it then also has a control socket)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return any(SHIM_NAME in line for line in maps)
    except OSError:
        return False


def _listened(path: Path) -> bool:
    """Whether a process still serves the socket at path (whatever its PID here)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(str(path))
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # busy or not ours to ask: not known to be stale
    finally:
        s.close()


def shimmed_pids(run_dir: Path | None = None, clean: bool = True) -> list[int]:
    """The PIDs the control sockets in the run dir are named after (a restored
    process's PID inside its namespace); sockets nobody serves any more are removed.
    A socket is stale only when nobody listens on it: a restored process's socket is
    named after a PID that may not exist here."""
    d = run_dir or default_run_dir()
    pids = []
    try:
        entries = list(d.iterdir())
    except (FileNotFoundError, PermissionError):
        return []
    for e in entries:
        if e.suffix != ".sock" or not e.stem.isdigit():
            continue
        if _listened(e):
            pids.append(int(e.stem))
        elif clean:
            try:
                e.unlink()
            except OSError:
                pass
    return sorted(pids)


class ShimClient:
    """One connection to the shim of one process."""

    def __init__(self, pid: int, run_dir: Path | None = None, timeout: float = 30.0,
                 path: Path | None = None):
        self.pid = pid
        self.path = path or control_socket(pid, run_dir) or socket_path(pid, run_dir)
        self.timeout = timeout

    def request(self, cmd: str, timeout: float | None = None, fds: list[int] | None = None,
                **fields) -> protocol.Reply:
        """fds: descriptors sent with the request (SCM_RIGHTS); ours stay open."""
        msg = protocol.request_line(cmd, **fields)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout or self.timeout)
        try:
            s.connect(str(self.path))
            sent = socket.send_fds(s, [msg], fds) if fds else 0
            s.sendall(msg[sent:])
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except FileNotFoundError:
            raise GpucrError(f"process {self.pid} has no gpucr control socket ({self.path})",
                             "start it with `gpucr-hpc run -- CMD` (or check GPUCR_RUN_DIR)")
        except PermissionError:
            raise GpucrError(f"not allowed to talk to process {self.pid}",
                             "run as the process owner or root")
        except TimeoutError:
            raise GpucrError(f"process {self.pid} did not answer within {timeout or self.timeout:.0f} s",
                             "the process may be stopped or stuck; check it with `gpucr-hpc status`")
        except ConnectionRefusedError:
            raise GpucrError(f"process {self.pid} does not answer on {self.path}",
                             "the process may have exited; `gpucr-hpc status` cleans stale sockets")
        except OSError as e:  # ECONNRESET, EPIPE: it exited (or was killed) while we asked
            raise GpucrError(f"process {self.pid} dropped the `{cmd}` request on its control socket "
                             f"({e.strerror or e})", self._gone_fix()) from e
        finally:
            s.close()
        if not buf:
            raise GpucrError(f"process {self.pid} closed the control socket without answering",
                             "run as the process owner or root")
        try:
            return protocol.Reply.parse(json.loads(buf.decode()))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise GpucrError(f"process {self.pid} answered `{cmd}` with something that is not its protocol",
                             "its shim and this gpucr-hpc differ: install both from one build") from e

    def _gone_fix(self) -> str:
        if not pid_alive(self.pid):
            return ("it has exited; restore it from its last checkpoint (gpucr-hpc restore JOBID, "
                    "or restore --from DIR)")
        return "it may be stopped or exiting: check it with `gpucr-hpc status`, then try again"

    def status(self) -> protocol.Reply:
        return self.request(protocol.STATUS)

    def checkpoint(self, timeout_ms: int) -> protocol.Reply:
        # the socket wait covers quiesce plus the data copy
        return self.request(protocol.CHECKPOINT, timeout=max(60.0, timeout_ms / 1000 * 2 + 600),
                            timeout_ms=timeout_ms)

    def restore(self) -> protocol.Reply:
        return self.request(protocol.RESTORE, timeout=900.0)
