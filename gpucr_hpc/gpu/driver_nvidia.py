"""The NVIDIA driver checkpoint API (cuda-python), applied to another process.

`cuCheckpointProcessLock/Checkpoint/Restore/Unlock/GetState` act on a PID: after
lock + checkpoint the process holds no GPU state (its VRAM is yielded), and
restore + unlock bring it back. Some cuda-bindings releases lack parts of it
(FACTS.md): 13.0.0/13.0.1 have no cuCheckpointProcessRestore, 13.3.0 no
CUcheckpointRestoreArgs. `NvidiaDriver()` checks for them and says so.
"""

from __future__ import annotations

import ctypes

from gpucr_hpc.errors import GpucrError

FIX_BINDINGS = "install cuda-python >= 13.3.1 (pip install 'gpucr-hpc[nvidia]')"

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


def uuid_bytes(uuid: str) -> bytes:
    """The 16 bytes of a GPU UUID as nvidia-smi writes it (GPU-xxxxxxxx-xxxx-...)."""
    raw = bytes.fromhex(uuid.removeprefix("GPU-").replace("-", ""))
    if len(raw) != 16:
        raise ValueError(f"not a GPU UUID: {uuid}")
    return raw


def load_bindings():
    """The cuda.bindings.driver module, checked for the checkpoint API."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6 layout
        except ImportError:
            raise GpucrError("cuda-python is not installed (needed for the driver checkpoint API)",
                             FIX_BINDINGS)
    try:
        from cuda.bindings import __version__ as version
    except ImportError:
        version = "unknown"
    missing = [name for name in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                                 "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock",
                                 "cuCheckpointProcessGetState", "CUcheckpointLockArgs",
                                 "CUcheckpointRestoreArgs")
               if not hasattr(driver, name)]
    if missing:
        raise GpucrError(f"cuda-bindings {version} lacks {', '.join(missing)}", FIX_BINDINGS)
    return driver


def init(cu) -> None:
    """cuInit through the bindings. Without an NVIDIA driver on the machine the
    bindings raise their own error when they look for libcuda: one line then."""
    try:
        err = cu.cuInit(0)[0]
    except Exception as e:  # noqa: BLE001 - the bindings' loader has no common base class
        raise GpucrError(f"no NVIDIA driver here: libcuda.so.1 cannot be loaded ({type(e).__name__})",
                         "run this on a node with an NVIDIA GPU and its driver")
    if int(err) != 0:
        raise GpucrError(f"cuInit failed: {error_name(cu, err)} ({int(err)})",
                         "check the NVIDIA driver with nvidia-smi")


def error_name(cu, err) -> str:
    """The driver's name of a CUresult (CUDA_ERROR_...), for a message."""
    try:
        return cu.cuGetErrorName(err)[1].decode()
    except Exception:  # noqa: BLE001 - only for the message
        return str(int(err))


class NvidiaDriver:
    """Driver checkpoint calls on other processes (same machine, same user or root)."""

    def __init__(self):
        self.cu = load_bindings()
        init(self.cu)

    def _check(self, result, what: str, pid: int | None = None):
        err = result[0] if isinstance(result, tuple) else result
        if int(err) == 0:
            return result[1] if isinstance(result, tuple) and len(result) > 1 else None
        name = error_name(self.cu, err)
        who = f" of process {pid}" if pid is not None else ""
        raise GpucrError(f"{what}{who} failed: {name} ({int(err)})",
                         "see the driver's limits in the docs (managed memory, IPC, MPS are not supported)")

    def state(self, pid: int, cuda: bool = False) -> str | None:
        """running/locked/checkpointed/failed, or None when PID uses no CUDA.
        cuda: PID is known to use CUDA, so a failing query is an error (a process
        the driver cannot reach would block in its first CUDA call)."""
        result = self.cu.cuCheckpointProcessGetState(pid)
        if int(result[0]) != 0:
            if cuda:
                self._check(result, "asking the driver for the checkpoint state", pid)
            return None
        return STATES.get(int(result[1]), str(int(result[1])))

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = self.cu.CUcheckpointLockArgs()
        args.timeoutMs = int(timeout_ms)
        self._check(self.cu.cuCheckpointProcessLock(pid, args), "driver lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._check(self.cu.cuCheckpointProcessCheckpoint(pid, None), "driver checkpoint", pid)

    def restore(self, pid: int, pairs: list[tuple[str, str]] | None = None) -> None:
        """Restore PID's GPU state; with pairs (old UUID, new UUID), one for every GPU the
        process sees, onto those GPUs instead of the ones it had (driver >= 580)."""
        args = self.restore_args(pairs) if pairs else None
        what = "driver restore" + (" onto " + ", ".join(new for _, new in pairs) if pairs else "")
        self._check(self.cu.cuCheckpointProcessRestore(pid, args), what, pid)

    def restore_args(self, pairs: list[tuple[str, str]]):
        """CUcheckpointRestoreArgs with gpuPairs. cuda-bindings 13.3.1: CUuuid.bytes is
        read-only, so each CUuuid wraps our 16 bytes and is copied into its pair; the
        gpuPairs setter copies the list but leaves gpuPairsCount to us."""
        objs = []
        for old, new in pairs:
            pair = self.cu.CUcheckpointGpuPair()
            raw_old, raw_new = (ctypes.create_string_buffer(uuid_bytes(u), 16) for u in (old, new))
            pair.oldUuid = self.cu.CUuuid(ctypes.addressof(raw_old))
            pair.newUuid = self.cu.CUuuid(ctypes.addressof(raw_new))
            objs.append(pair)
        args = self.cu.CUcheckpointRestoreArgs()
        args.gpuPairs = objs
        args.gpuPairsCount = len(objs)
        return args

    def unlock(self, pid: int) -> None:
        self._check(self.cu.cuCheckpointProcessUnlock(pid, None), "driver unlock", pid)
