"""CRIU for an ordinary user: through the root helper, `sudo -n gpucr-criu-root`.

The helper (privileged/helper.py) is the only part of gpucr-hpc that runs as root on
a node. sudo keeps it a child of ours, so a restored tree stays inside the
job's process tree and cgroup, where Slurm tracks, signals and suspends it.
Its answer comes back in the work dir's result.json: our stdout and stderr
may be handed to the restored tree (criu --inherit-fd).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.criu.processes import Restored, criu_env, process_tree
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.tcp.flows import Flow, Spec

RESULT = "result.json"
INSTALL_FIX = ("install the root helper and its sudo rule on every node: make install (as root); "
               "see the admin guide, 'Ordinary users'")


def helper_path() -> str:
    return config.value("GPUCR_CRIU_HELPER") or config.installed("libexec", "gpucr-criu-root")


def _sudo(op: str, flags: list[str], needs: str = "CRIU needs root") -> list[str]:
    """The command that runs the helper's `op` as root; `needs`: why root, for the
    line that says the helper is missing."""
    helper = helper_path()
    if not os.path.isfile(helper):
        raise GpucrError(f"{needs}, and the gpucr-hpc root helper {helper} is not installed", INSTALL_FIX)
    return ["sudo", "-n", helper, op, *flags]


def _argv(op: str, images_dir: Path, work_dir: Path, flags: list[str]) -> list[str]:
    return _sudo(op, ["--images", str(images_dir), "--work", str(work_dir), *flags])


def _result(work_dir: Path) -> dict | None:
    try:
        return json.loads((Path(work_dir) / RESULT).read_text())
    except (OSError, ValueError):
        return None


def _sudo_allows(helper: str) -> bool:
    """Whether sudo runs the helper for us without a password: asked of sudo
    itself (-l), never read from the wording of its refusal."""
    try:
        return subprocess.run(["sudo", "-n", "-l", helper], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _raise_if_error(res: dict | None, stderr: str) -> dict:
    if res is None:
        last = [line for line in (stderr or "").splitlines() if line.strip()]
        why = last[-1].strip() if last else "no answer"
        if not _sudo_allows(helper_path()):
            raise GpucrError(f"CRIU needs root, and sudo does not let you run the gpucr-hpc root helper "
                             f"({why})", INSTALL_FIX)
        raise GpucrError(f"the gpucr-hpc root helper failed: {why}", "see the admin guide, 'Ordinary users'")
    if "error" in res:
        raise GpucrError(res["error"], res.get("fix", ""))
    return res


def dump(pid: int, images_dir: Path, work_dir: Path, *, leave_running: bool, shell_job: bool,
         tcp_lock: str | None = None) -> list[dict]:
    flags = (["--pid", str(pid)] + ["--leave-running"] * leave_running + ["--shell-job"] * shell_job
             + ([f"--tcp-lock={tcp_lock}"] if tcp_lock else []))
    r = subprocess.run(_argv("dump", images_dir, work_dir, flags), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, env=criu_env())
    return _raise_if_error(_result(work_dir), r.stderr)["open_files"]


class HelperLauncher(subprocess.Popen):
    """The sudo process that holds a tree restored into a new PID namespace.

    It exits with the status of the tree's root. It runs as root, so ending it
    means ending the tree (ours): the namespace's init then exits, and it too."""

    root_pid: int | None = None

    def send_signal(self, sig: int) -> None:
        if sig == signal.SIGKILL and self.root_pid and self.poll() is None:
            for p in reversed(process_tree(self.root_pid)):
                try:
                    os.kill(p, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        super().send_signal(sig)


def start_restore(images_dir: Path, work_dir: Path, *, shell_job: bool, new_pidns: bool,
                  inherit: dict[int, str] | None = None, tied: bool = False, tcp: bool = False,
                  moved: dict[str, str] | None = None, lock: Spec | None = None,
                  closed: list[tuple[str, str]] | None = None) -> Restored:
    """The helper closes the connections `closed` names and moves the TCP ends
    (`moved`) in its own checked copy of the images, and takes `lock` on the
    restored connections just before CRIU runs."""
    inherit = inherit or {}
    flags = (["--shell-job"] * shell_job + ["--new-pidns"] * new_pidns + ["--tied"] * tied
             + [f"--inherit-fd={fd}:{key}" for fd, key in sorted(inherit.items())]
             + ["--tcp"] * tcp + [f"--move={k}={v}" for k, v in sorted((moved or {}).items())]
             + [arg for local, remote in closed or [] for arg in ("--close", local, remote)]
             + (_lock_flags(lock.name, lock.flows, lock.expires_s) if lock else []))
    std = [None if fd in inherit else subprocess.DEVNULL for fd in (0, 1)]
    proc = HelperLauncher(_argv("restore", images_dir, work_dir, flags), stdin=std[0], stdout=std[1],
                          stderr=None if 2 in inherit else subprocess.PIPE, start_new_session=True,
                          env=criu_env())
    while (res := _result(work_dir)) is None and proc.poll() is None:
        time.sleep(0.01)
    if res is None:
        res = _result(work_dir)  # written just before it exited
    err = proc.stderr.read() if proc.stderr and proc.poll() is not None else ""
    res = _raise_if_error(res, err)
    if not new_pidns:
        proc.wait()
    proc.root_pid = res["host_pid"]
    return Restored(host_pid=res["host_pid"], ns_pid=res["ns_pid"], new_pidns=new_pidns, launcher=proc)


def _lock_flags(name: str, flows: list[Flow], seconds: float) -> list[str]:
    return [f"--lock={name}", f"--lock-seconds={seconds:g}"] + [f"--flow={f.local},{f.remote}" for f in flows]


def _answer(op: str, flags: list[str]) -> dict:
    argv = _sudo(op, flags, needs="locking TCP connections needs root")
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise GpucrError(f"the gpucr-hpc root helper did not {op} within 60 s", "see the node's load") from None
    try:
        res = json.loads(r.stdout)
    except ValueError:
        res = None
    return _raise_if_error(res if isinstance(res, dict) else None, r.stderr)


def lock(name: str, flows: list[Flow], seconds: float) -> None:
    """netlock.lock for an ordinary user: the helper checks that each flow is ours."""
    _answer("lock", _lock_flags(name, flows, seconds))


def unlock(name: str) -> bool:
    return bool(_answer("unlock", [f"--lock={name}"]).get("unlocked"))
