"""In-place checkpoint and restore of one process tree on this machine.

Checkpoint, each phase timed:
  quiesce + data  every shimmed process of the tree, in parallel: the shim closes
                  its API gate, drains and synchronizes, copies its GPU memory into
                  its host arena and releases it (addresses kept);
  control         the driver checkpoint API on every CUDA process of the tree:
                  lock all, then checkpoint all (VRAM yielded).
Any failure undoes what was done, in reverse, and the tree keeps running.

Restore is the mirror: driver restore + unlock, then the shims copy the data
back at the same addresses and reopen their gates.

`checkpoint_tree()` / `restore_tree()` are the entry points; the job-level and
image commands build on `Target`, `shim_checkpoint()`, `driver_checkpoint()`,
`driver_restore()` and `shim_restore()`.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.criu.run import process_tree
from gpucr_hpc.errors import GpucrError, NoGpuState, NotCheckpointed
from gpucr_hpc.process import nccl_cut
from gpucr_hpc.shim.client import ShimClient, control_socket, pid_alive, shimmed_pids, socket_path, uses_shim
from gpucr_hpc.shim.protocol import NO_REPLY, PREFILL, QUIESCE_TIMEOUT, Reply

DEFAULT_TIMEOUT_MS = 10_000


@dataclass
class Target:
    """One process of the tree and what is known about it."""

    pid: int
    shim: bool = False        # has a control socket
    cuda: bool = False        # uses the GPU driver
    shim_state: str = ""      # running / checkpointed (shim's view)
    driver_state: str | None = None
    gpu_pairs: list | None = None  # (old UUID, new UUID) per GPU it sees: restore onto other GPUs
    nccl: str = ""            # its NCCL cut ("none", "torn_down", ...); "" without communicators
    checkpointed: Reply = NO_REPLY  # its shim's answer to the checkpoint
    restored: Reply = NO_REPLY      # and to the restore


_DRIVER = None


def _driver():
    """The driver API, initialised once per agent process (cuInit is not free)."""
    global _DRIVER
    if _DRIVER is None:
        from gpucr_hpc.gpu.driver_nvidia import NvidiaDriver

        _DRIVER = NvidiaDriver()
    return _DRIVER


def discover(pid: int, run_dir: Path | None = None, need_driver: bool = True, before_driver=None):
    """The targets of PID's tree, and the driver (None when no process needs it).
    before_driver(targets): called once the shims have answered, before the
    driver API is initialised here (cuInit takes a while in a fresh process)."""
    if not pid_alive(pid):
        raise GpucrError(f"no process {pid}", "check the PID")
    targets = []
    for p in process_tree(pid):
        sock = control_socket(p, run_dir)
        t = Target(p, shim=sock is not None)
        if sock is not None:
            st = _status_of(p, run_dir, sock)
            if st is None:
                continue  # a short-lived process (a `sleep`) ended while it was asked
            t.cuda, t.shim_state = st.cuda, st.state
            t.nccl = st.nccl_cut if st.nccl_comms else ""
        else:
            _refuse_unreachable_shim(p)
        targets.append(t)
    if before_driver:
        before_driver(targets)
    unknown = [t for t in targets if not t.shim]
    driver = None
    if need_driver and (unknown or any(t.cuda for t in targets)):
        try:
            driver = _driver()
        except GpucrError:
            if any(t.cuda for t in targets):
                raise
            driver = None  # no cuda-python, and no shim says CUDA is in use
    if driver:
        for t in targets:
            t.driver_state = driver.state(t.pid)
            t.cuda = t.cuda or t.driver_state is not None
    if not any(t.shim or t.cuda for t in targets):
        raise NoGpuState(f"process {pid} has no GPU process and no gpucr shim in its tree",
                         "start the program with `gpucr-hpc run -- CMD`")
    return targets, driver


def _status_of(pid: int, run_dir: Path | None, sock: Path, tries: int = 10) -> Reply | None:
    """The shim's status, or None for a process on its way out. A process that
    execs (the srun wrapper's children) binds its socket anew under the same name:
    asked in between, it is asked again a moment later."""
    for attempt in range(tries):
        try:
            return ShimClient(pid, run_dir, path=sock).status()
        except GpucrError:
            if leaving(pid, run_dir):
                return None
            if attempt == tries - 1:
                raise
            time.sleep(0.1)
            sock = control_socket(pid, run_dir) or sock
    return None


def leaving(pid: int, run_dir: Path | None) -> bool:
    """A process that is gone or exiting: a zombie, or one whose shim has let go of
    its socket on the way out, with no CUDA to lose (the srun wrapper's sleep)."""
    if not criu_mod.is_alive(pid):
        return True
    return control_socket(pid, run_dir) is None and not _uses_cuda(pid)


def _uses_cuda(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return any("libcuda.so" in line for line in maps)
    except OSError:
        return False


def _refuse_unreachable_shim(pid: int) -> None:
    """A GPU process whose shim cannot be asked must not be checkpointed by the
    driver alone: its gate stays open, a call it makes then blocks in the driver's
    lock, and a later yield of the shim (SIGTSTP) waits for that call in vain."""
    if uses_shim(pid) and _uses_cuda(pid):
        raise GpucrError(f"process {pid} runs under the gpucr shim but its control socket cannot be "
                         f"found (its socket file was removed?)",
                         "the process cannot be checkpointed; `gpucr-hpc status` lists the processes "
                         "that answer")


def _parallel(fn, items):
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        futures = [pool.submit(fn, it) for it in items]
        out: list[tuple[Any, GpucrError | None]] = []
        for f in futures:
            try:
                out.append((f.result(), None))
            except GpucrError as e:
                out.append((None, e))
        return out


def shim_checkpoint(targets, timeout_ms: int, run_dir: Path | None = None) -> list[Target]:
    """Quiesce + data on every shimmed target; on any refusal, restore the others."""
    todo = [t for t in targets if t.shim and t.shim_state == "running"]

    def one(t):
        try:
            r = ShimClient(t.pid, run_dir).checkpoint(timeout_ms)
        except GpucrError:
            if t.cuda or not leaving(t.pid, run_dir):
                raise
            t.shim_state = "gone"  # ended since it was found (the srun wrapper's sleep): nothing to keep
            return t
        t.checkpointed = r
        if not r.ok:
            raise GpucrError(f"process {t.pid}: {r.error or 'checkpoint failed'}",
                             "retry when the GPU is less busy, or give a longer --timeout"
                             if r.reason == QUIESCE_TIMEOUT else "")
        t.shim_state = "checkpointed"
        return t

    results = _parallel(one, todo)
    errors = [e for _, e in results if e]
    if errors:
        shim_restore([t for t in todo if t.shim_state == "checkpointed"], run_dir)
        raise errors[0]
    return todo


def shim_prefill(targets, run_dir: Path | None = None) -> bool:
    """Ask each checkpointed shim to have its copy helper (GPUCR_COPY_HELPER)
    re-make and fill its GPU memory while the driver restores it; whether any
    did. Best effort: a shim without a helper, or that cannot, says so, and its
    restore then does the work itself."""
    started = False
    for t in targets:
        if t.shim and t.shim_state == "checkpointed":
            try:
                started |= ShimClient(t.pid, run_dir).request(PREFILL).prefill
            except GpucrError:
                pass
    return started


def shim_restore(targets, run_dir: Path | None = None) -> None:
    todo = [t for t in targets if t.shim and t.shim_state == "checkpointed"]

    def one(t):
        r = ShimClient(t.pid, run_dir).restore()
        t.restored = r
        if not r.ok:
            raise GpucrError(f"process {t.pid}: {r.error or 'restore failed'}", "")
        t.shim_state = "running"
        return t

    errors = [e for _, e in _parallel(one, todo) if e]
    if errors:
        raise errors[0]


def driver_checkpoint(driver, targets, timeout_ms: int) -> None:
    """Lock every CUDA target, then checkpoint each; undo on failure."""
    todo = [t for t in targets if t.cuda and t.driver_state == "running"]
    locked, done = [], []
    try:
        for t in todo:
            driver.lock(t.pid, timeout_ms)
            t.driver_state = "locked"
            locked.append(t)
        def one(t):
            driver.checkpoint(t.pid)
            done.append(t)

        errors = [e for _, e in _parallel(one, locked) if e]
        for t in done:
            t.driver_state = "checkpointed"
        if errors:
            raise errors[0]
    except GpucrError:
        for t in done:
            try:
                driver.restore(t.pid)
                t.driver_state = "locked"
            except GpucrError:
                pass
        for t in locked:
            try:
                driver.unlock(t.pid)
                t.driver_state = "running"
            except GpucrError:
                pass
        raise


def driver_restore(driver, targets) -> None:
    todo = [t for t in targets if t.cuda and t.driver_state in ("checkpointed", "locked")]
    errors = [e for _, e in _parallel(lambda t: driver.restore(t.pid, t.gpu_pairs)
                                      if t.driver_state == "checkpointed" else None, todo) if e]
    if errors:
        raise errors[0]
    for t in todo:
        driver.unlock(t.pid)
        t.driver_state = "running"


def _summary(pid, targets, phases, t0, restored: bool) -> dict:
    procs = []
    for t in targets:
        r = t.restored if restored else t.checkpointed
        procs.append({"pid": t.pid, "shim": t.shim, "cuda": t.cuda, "bytes": r.nbytes, **r.report})
    phases["total_s"] = time.monotonic() - t0
    return {"pid": pid, "processes": procs, "bytes": sum(p["bytes"] for p in procs),
            "phases": {k: round(v, 6) for k, v in phases.items()}}


def checkpoint_tree(pid: int, timeout_ms: int = DEFAULT_TIMEOUT_MS, run_dir: Path | None = None) -> dict:
    """Checkpoint PID and its descendants in place: its VRAM yielded, the process kept."""
    t0 = time.monotonic()
    targets, driver = discover(pid, run_dir)
    if any(t.shim_state == "checkpointed" or t.driver_state in ("locked", "checkpointed") for t in targets):
        raise GpucrError(f"process {pid} is already checkpointed", f"restore it with `gpucr-hpc restore --pid {pid}`")
    phases: dict[str, float] = {}
    ranks = [t.pid for t in targets if t.nccl and t.nccl != "torn_down"]  # torn down: by the job's agents
    if ranks:
        phases.update(nccl_park(ranks, run_dir, timeout_ms))
    try:
        shim_checkpoint(targets, timeout_ms, run_dir)
    except GpucrError:
        nccl_cut.undo(ranks, run_dir)
        raise
    done = [t.checkpointed for t in targets]
    phases["quiesce_s"] = max([r.quiesce_s for r in done] or [0.0])
    phases["data_s"] = max([r.data_s for r in done] or [0.0])
    t1 = time.monotonic()
    if driver:
        try:
            driver_checkpoint(driver, targets, timeout_ms)
        except GpucrError as e:
            shim_restore(targets, run_dir)
            nccl_cut.undo(ranks, run_dir)
            raise GpucrError(f"{e.cause}; checkpoint aborted, the processes keep running", e.fix)
    phases["control_s"] = time.monotonic() - t1
    return _summary(pid, targets, phases, t0, restored=False)


def restore_tree(pid: int, run_dir: Path | None = None, prefill: bool = True, rebuild: bool = True) -> dict:
    """Restore PID and its descendants checkpointed in place. prefill: where a
    shim has a copy helper, the helper fills the GPU beside the driver restore
    (then control_s includes that and data_s is what is left of it). rebuild:
    the tree's NCCL communicators made anew here (the job's agents do it for
    every node at once instead)."""
    t0 = time.monotonic()
    phases: dict[str, float] = {}

    def start_prefill(targets):
        # as early as possible: the helpers fill while this process initialises
        # the driver API and the driver restores the processes
        if prefill and any(t.cuda and t.shim_state == "checkpointed" for t in targets):
            phases["prefill"] = shim_prefill(targets, run_dir)

    targets, driver = discover(pid, run_dir, before_driver=start_prefill)
    if not any(t.shim_state == "checkpointed" or t.driver_state in ("locked", "checkpointed") for t in targets):
        raise NotCheckpointed(f"process {pid} is not checkpointed", "nothing to restore")
    if driver:
        driver_restore(driver, targets)
    phases["control_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    shim_restore(targets, run_dir)
    phases["data_s"] = time.monotonic() - t1
    torn = [t.pid for t in targets if t.nccl == "torn_down"]
    if torn and rebuild:
        phases.update(nccl_cut.rebuild(torn, run_dir))
    return _summary(pid, targets, phases, t0, restored=True)


def nccl_park(pids: list[int], run_dir: Path | None, timeout_ms: int, share=None) -> dict[str, float]:
    """The NCCL ranks brought to a consistent cut and their communicators torn
    down, ahead of the shims' checkpoint; on failure they run on."""
    t0 = time.monotonic()
    nccl_cut.cut(pids, run_dir, share=share or nccl_cut.alone)
    t1 = time.monotonic()
    try:
        phases = nccl_cut.teardown(pids, run_dir, timeout_ms)
    except GpucrError:
        nccl_cut.undo(pids, run_dir)
        raise
    return {"cut_s": t1 - t0, **phases}


@dataclass(frozen=True)
class ShimProcess:
    """A process serving a control socket in the run dir: its status, or why it gave none."""

    pid: int
    cmd: str
    status: Reply

    def as_json(self) -> dict:
        return {**self.status.document(), "cmd": self.cmd} if self.status.ok else \
            {"ok": False, "pid": self.pid, "error": self.status.error, "cmd": self.cmd}


def status_all(run_dir: Path | None = None) -> list[ShimProcess]:
    """The shim status of every shimmed process in the run dir."""
    out = []
    for pid in shimmed_pids(run_dir):
        # by its socket's name: a restored process's PID here may be another's
        client = ShimClient(pid, run_dir, timeout=5.0, path=socket_path(pid, run_dir))
        try:
            st = client.status()
        except GpucrError as e:
            st = Reply(ok=False, pid=pid, error=e.cause)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = ""
        out.append(ShimProcess(pid, cmd, st))
    return out
