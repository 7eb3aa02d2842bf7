"""The copy helper: moves checkpointed processes' GPU data between the GPU and
their host arenas at the copy engines' full rate (the shim's side and the why
are in shim/helper.c).

    gpucr-hpc copy-helper --socket PATH

One thread per connected process. Each arena segment the process sends is
mapped here and registered (pinned) once, in this process's own context, which
no driver checkpoint ever touches. Requests, one JSON object per datagram,
descriptors as SCM_RIGHTS; a blob is [id, size, segment, offset, device uuid,
held], held when this helper made it and keeps a handle to it:

  segment  {seg, size, gen} + the segment's descriptor: map and pin it
  out      {blobs} + one exported allocation per blob not held: copy each into
           its arena place, answer, then let go of it (held ones too)
  prefill  {blobs}: start making and filling those allocations now (while the
           driver restores the process), answer at once
  in       {blobs}: the allocations (prefilled, or made now), exported: one
           descriptor per blob with the answer, sent while their copies from
           the arena still run (the process imports and maps meanwhile)
  in_done  {keep}: answered once those copies are done (a failed one is its
           error); the process imported them: keep a handle to each (the
           driver does not export an imported allocation again, so the next
           `out` copies through ours), or let go (keep false)
  forget   {id}: the process freed that allocation: let go of it (no answer)

Every answer is {"ok": true, ...} or {"ok": false, "error": ...}; the `out`,
`in` and `in_done` answers time their steps ("map_s": seconds, ...), which the shim adds
up into its reply's helper_steps. An error
leaves the process's data where it was (the shim then uses its own path).
A closed connection lets go of everything of that process.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.gpu import driver_nvidia
from gpucr_hpc.gpu.driver_nvidia import load_bindings
from gpucr_hpc.shim.client import pid_alive
from gpucr_hpc.shim.protocol import (
    HELPER_FORGET,
    HELPER_IN,
    HELPER_IN_DONE,
    HELPER_OUT,
    HELPER_PREFILL,
    HELPER_SEGMENT,
    HelperBlob,
    HelperRequest,
    helper_answer,
)

MSG_MAX = 64 << 10
MAX_FDS = 64
CHUNK = 256 << 20  # one DMA
STREAMS = 2


class CudaError(Exception):
    pass


class Steps(dict):
    """Seconds per step of one request, by name; the shim adds them up and
    reports them (helper_steps), so that a slow copy says where its time went."""

    @contextmanager
    def timed(self, name: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.monotonic() - t0

    def merge(self, other: dict, prefix: str = "") -> None:
        for k, v in other.items():
            self[prefix + k] = self.get(prefix + k, 0.0) + v


class Gpu:
    """The driver calls of the helper, on the primary context of each GPU."""

    def __init__(self):
        self.cu = load_bindings()
        driver_nvidia.init(self.cu)
        self.ctx: dict[str, object] = {}
        self.dev: dict[str, int] = {}
        self.streams: dict[str, list] = {}
        (n,) = self._ok(self.cu.cuDeviceGetCount(), "cuDeviceGetCount")
        for i in range(n):
            (d,) = self._ok(self.cu.cuDeviceGet(i), "cuDeviceGet")
            (u,) = self._ok(self.cu.cuDeviceGetUuid(d), "cuDeviceGetUuid")
            self.dev[bytes(u.bytes).hex()] = i
        self.lock = threading.Lock()
        self.turn = 0  # the stream the next chunk goes on
        for uuid in self.dev:  # each GPU's context now: its memory is a start-up cost, not a checkpoint's
            self.use(uuid)

    def _ok(self, result, what: str):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise CudaError(f"{what}: CUDA error {int(err)}")
        return rest

    def use(self, uuid: str) -> int:
        """Make the GPU with this uuid current in the calling thread; its ordinal."""
        with self.lock:
            if uuid not in self.dev:
                raise CudaError(f"no GPU with uuid {uuid} here")
            if uuid not in self.ctx:
                (d,) = self._ok(self.cu.cuDeviceGet(self.dev[uuid]), "cuDeviceGet")
                (c,) = self._ok(self.cu.cuDevicePrimaryCtxRetain(d), "cuDevicePrimaryCtxRetain")
                self._ok(self.cu.cuCtxSetCurrent(c), "cuCtxSetCurrent")
                self.streams[uuid] = [self._ok(self.cu.cuStreamCreate(1), "cuStreamCreate")[0]
                                      for _ in range(STREAMS)]
                self.ctx[uuid] = c
            self._ok(self.cu.cuCtxSetCurrent(self.ctx[uuid]), "cuCtxSetCurrent")
            return self.dev[uuid]

    def register(self, addr: int, size: int) -> None:
        self._ok(self.cu.cuMemHostRegister(addr, size, self.cu.CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister")

    def unregister(self, addr: int) -> None:
        self.cu.cuMemHostUnregister(addr)

    def _set_access(self, va: int, size: int, ordinal: int) -> None:
        acc = self.cu.CUmemAccessDesc()
        acc.location.type = self.cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        acc.location.id = ordinal
        acc.flags = self.cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._ok(self.cu.cuMemSetAccess(va, size, [acc], 1), "cuMemSetAccess")

    def _unmap(self, va: int, size: int) -> None:
        self.cu.cuMemUnmap(va, size)
        self.cu.cuMemAddressFree(va, size)

    def reserve_map(self, handle, size: int) -> int:
        """A new address range with handle mapped there, not yet accessible
        (enqueue() opens it just before its copies)."""
        (va,) = self._ok(self.cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
        try:
            self._ok(self.cu.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
        except CudaError:
            self.cu.cuMemAddressFree(va, size)
            raise
        return int(va)

    def map_new(self, handle, size: int, steps: Steps) -> int:
        """reserve_map(), timed as map_s; the handle is released if it cannot be mapped."""
        try:
            with steps.timed("map_s"):
                return self.reserve_map(handle, size)
        except CudaError:
            self.release(handle)
            raise

    def enqueue(self, uuid: str, dva: int, host: int, size: int, to_host: bool, steps: Steps,
                open_for: int | None = None) -> None:
        """Asynchronous copies of one allocation in CHUNK DMAs over the streams.
        open_for: the GPU ordinal to give access first (the driver takes the
        whole mapped range at once, not a part of it)."""
        if open_for is not None:
            with steps.timed("access_s"):
                self._set_access(dva, size, open_for)
        streams = self.streams[uuid]
        for off in range(0, size, CHUNK):
            n = min(CHUNK, size - off)
            s = streams[self.turn % len(streams)]
            self.turn += 1
            if to_host:
                self._ok(self.cu.cuMemcpyDtoHAsync(host + off, dva + off, n, s), "cuMemcpyDtoHAsync")
            else:
                self._ok(self.cu.cuMemcpyHtoDAsync(dva + off, host + off, n, s), "cuMemcpyHtoDAsync")

    def sync(self, uuid: str) -> None:
        for s in self.streams[uuid]:
            self._ok(self.cu.cuStreamSynchronize(s), "cuStreamSynchronize")

    def settle(self, uuid: str) -> None:
        """After a failure: wait for copies in flight before their memory goes."""
        for s in self.streams.get(uuid, []):
            self.cu.cuStreamSynchronize(s)

    def import_fd(self, fd: int):
        t = self.cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        (h,) = self._ok(self.cu.cuMemImportFromShareableHandle(fd, t), "cuMemImportFromShareableHandle")
        return h

    def create(self, size: int, ordinal: int):
        prop = self.cu.CUmemAllocationProp()
        prop.type = self.cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = self.cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = ordinal
        prop.requestedHandleTypes = self.cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        (h,) = self._ok(self.cu.cuMemCreate(size, prop, 0), "cuMemCreate")
        return h

    def export_fd(self, handle) -> int:
        t = self.cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        (fd,) = self._ok(self.cu.cuMemExportToShareableHandle(handle, t, 0), "cuMemExportToShareableHandle")
        return int(fd)

    def release(self, handle) -> None:
        self.cu.cuMemRelease(handle)


class Client:
    """One connected process: its segments here, its allocations in flight."""

    def __init__(self, gpu: Gpu, conn: socket.socket):
        self.gpu, self.conn = gpu, conn
        self.segs: dict[int, tuple[int, mmap.mmap, int, int]] = {}  # seg -> (gen, map, addr, size)
        self.prefills: list[threading.Thread] = []  # one per prefill request (batch)
        self.made: dict[int, tuple] = {}  # blob id -> (handle, va, size) made for `in`
        self.made_error: str | None = None
        self.lock = threading.Lock()
        self.prefill_steps = Steps()  # of the prefills since the last `in`
        self.after_answer: list[tuple] = []  # (handle, va, size) to let go once answered
        self.handed: dict[int, tuple] = {}  # blob id -> (handle, va, size) sent by `in`
        self.kept: dict[int, tuple] = {}  # the same, imported by the process: ours too
        self.filling: set[str] = set()  # GPUs whose copies for `in` may still run

    def host(self, seg: int, off: int, size: int) -> int:
        if seg not in self.segs:
            raise CudaError(f"segment {seg} was never sent")
        _, _, addr, ssize = self.segs[seg]
        if off + size > ssize:
            raise CudaError(f"a blob of {size} bytes at {off} is outside segment {seg}")
        return addr + off

    def on_segment(self, req: HelperRequest, fds: list[int]) -> dict:
        seg, size, gen = req.seg, req.size, req.gen
        old = self.segs.pop(seg, None)
        if old:
            self.gpu.unregister(old[2])
            old[1].close()
        t0 = time.monotonic()
        m = mmap.mmap(fds[0], size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        self.gpu.use(next(iter(self.gpu.dev)))  # registration is portable: any context
        self.gpu.register(addr, size)
        self.segs[seg] = (gen, m, addr, size)
        return {"register_s": time.monotonic() - t0}

    def by_device(self, blobs: Iterable[HelperBlob]):
        out: dict[str, list[HelperBlob]] = {}
        for b in blobs:
            out.setdefault(b.device, []).append(b)
        return out.items()

    def on_out(self, req: HelperRequest, fds: list[int]) -> dict:
        blobs = req.blobs
        sent = [b for b in blobs if not b.held]
        if len(fds) != len(sent):
            raise CudaError(f"{len(sent)} exported blobs came with {len(fds)} descriptors")
        fd_of = {b.id: fd for b, fd in zip(sent, fds)}
        missing = [b.id for b in blobs if b.held and b.id not in self.kept]
        if missing:
            raise CudaError(f"allocations {missing} are not held here")
        t0, moved, steps = time.monotonic(), 0, Steps()
        for uuid, group in self.by_device(blobs):
            ordinal = self.gpu.use(uuid)
            held = []
            try:
                # each allocation's copies start as soon as it is mapped: the
                # next one is imported and mapped while they run
                for b in group:
                    size, opened = b.size, None
                    if b.held:
                        h, va, size = self.kept.pop(b.id)
                    else:
                        with steps.timed("import_s"):
                            h = self.gpu.import_fd(fd_of[b.id])
                        va = self.gpu.map_new(h, size, steps)
                        opened = ordinal
                    held.append((h, va, size))
                    self.gpu.enqueue(uuid, va, self.host(b.seg, b.off, size), size, True, steps, opened)
                with steps.timed("wait_s"):
                    self.gpu.sync(uuid)
            except BaseException:
                self.gpu.settle(uuid)
                self.let_go(held)
                raise
            moved += sum(size for _, _, size in held)
            # the data is in the arena: answer first, let go of the mappings
            # while the process releases its own (before the next request)
            self.after_answer.extend(held)
        return {"bytes": moved, "seconds": time.monotonic() - t0, **steps}

    def make(self, blobs: Iterable[HelperBlob], steps: Steps, wait: bool = True) -> list[str]:
        """Create and fill the allocations of these blobs (for `in`); each one's
        copies start as soon as it is mapped, while the next one is created.
        wait False: the copies may still run; the GPUs to sync() are returned."""
        touched = []
        for uuid, group in self.by_device(blobs):
            ordinal = self.gpu.use(uuid)
            touched.append(uuid)
            try:
                for b in group:
                    if b.id in self.made:
                        continue
                    size = b.size
                    with steps.timed("create_s"):
                        h = self.gpu.create(size, ordinal)
                    va = self.gpu.map_new(h, size, steps)
                    self.made[b.id] = (h, va, size)
                    self.gpu.enqueue(uuid, va, self.host(b.seg, b.off, size), size, False, steps, ordinal)
                if wait:
                    with steps.timed("wait_s"):
                        self.gpu.sync(uuid)
            except BaseException:
                self.gpu.settle(uuid)
                raise
        return touched

    def on_prefill(self, req: HelperRequest, fds: list[int]) -> dict:
        """Answered at once: the driver restore waits for this answer."""
        blobs = req.blobs

        def run():
            steps = Steps()
            try:
                self.make(blobs, steps)
            except Exception as e:  # reported to the `in` that waits for it
                self.made_error = str(e)
            with self.lock:
                self.prefill_steps.merge(steps, "prefill_")

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.prefills.append(t)
        return {}

    def wait_prefill(self) -> None:
        for t in self.prefills:
            t.join()
        self.prefills = []

    def on_in(self, req: HelperRequest, fds: list[int]) -> tuple[dict, list[int]]:
        """Answered once the allocations are exported, while their copies run:
        the process imports and maps them meanwhile, and its `in_done` waits
        for the copies."""
        t0, steps = time.monotonic(), Steps()
        with steps.timed("waited_for_prefill_s"):
            self.wait_prefill()
        steps.merge(self.prefill_steps)
        self.prefill_steps = Steps()
        if self.made_error:
            err, self.made_error = self.made_error, None
            self.drop_made()
            raise CudaError(err)
        blobs = req.blobs
        out = []
        try:
            # whatever the prefill did not make
            self.filling.update(self.make(blobs, steps, wait=False))
            with steps.timed("export_s"):
                for b in blobs:
                    out.append(self.gpu.export_fd(self.made[b.id][0]))
        except BaseException:
            self.settle_filling()
            for fd in out:
                os.close(fd)
            self.drop_made()  # half-filled: a retry makes them again
            raise
        for b in blobs:
            self.handed[b.id] = self.made.pop(b.id)
        return {"seconds": time.monotonic() - t0, **steps}, out

    def settle_filling(self) -> None:
        for uuid in self.filling:
            self.gpu.settle(uuid)
        self.filling = set()

    def on_in_done(self, req: HelperRequest | None, fds: list[int]) -> dict:
        """Once the copies of what `in` handed over are done: keep them (the
        process imported them), or let go. A failed copy is this call's error."""
        steps = Steps()
        try:
            with steps.timed("wait_s"):
                for uuid in self.filling:
                    self.gpu.sync(uuid)
            if self.handed and config.fault("copy_helper_in_done"):  # a test fault
                raise CudaError("a copy failed (GPUCR_FAULTS=copy_helper_in_done)")
        except BaseException:
            self.settle_filling()
            self.let_go(self.handed.values())
            self.handed = {}
            raise
        self.filling = set()
        if req is not None and req.keep:
            # a restore retried after one that failed in the process: the old one goes
            self.let_go(self.kept.pop(i) for i in self.handed.keys() & self.kept.keys())
            self.kept.update(self.handed)
        else:
            self.let_go(self.handed.values())
        self.handed = {}
        return {**steps}

    def on_forget(self, req: HelperRequest, fds: list[int]) -> None:
        got = self.kept.pop(req.id, None)
        if got:
            self.let_go([got])

    def let_go(self, items) -> None:
        for h, va, size in items:
            self.gpu._unmap(va, size)
            self.gpu.release(h)

    def drop_made(self) -> None:
        self.let_go(self.made.values())
        self.made = {}

    def close(self) -> None:
        self.let_go(self.after_answer)
        self.after_answer = []
        self.wait_prefill()
        try:
            self.on_in_done(None, [])
        except Exception:
            pass  # a failed copy: on_in_done let go of its allocations all the same
        self.drop_made()
        self.let_go(self.kept.values())
        self.kept = {}
        for _, m, addr, _ in self.segs.values():
            self.gpu.unregister(addr)
            m.close()
        self.segs = {}
        self.conn.close()

    def serve(self) -> None:
        handlers = {HELPER_SEGMENT: self.on_segment, HELPER_OUT: self.on_out, HELPER_PREFILL: self.on_prefill,
                    HELPER_IN: self.on_in, HELPER_IN_DONE: self.on_in_done, HELPER_FORGET: self.on_forget}
        try:
            while True:
                try:
                    msg, fds, _, _ = socket.recv_fds(self.conn, MSG_MAX, MAX_FDS)
                except OSError:
                    return
                if not msg:
                    return
                out_fds: list[int] = []
                try:
                    req = HelperRequest.parse(msg)
                    fn = handlers.get(req.cmd)
                    if fn is None:
                        raise CudaError(f"unknown request {req.cmd!r}")
                    r = fn(req, fds)
                    if r is None:  # forget: no answer
                        continue
                    if isinstance(r, tuple):
                        r, out_fds = r
                    reply = helper_answer(cast(dict, r))
                except (CudaError, ValueError, KeyError, TypeError, IndexError, OSError) as e:
                    reply = helper_answer(error=str(e))
                    print(f"gpucr-hpc copy-helper: {msg[:40]!r}: {e}", file=sys.stderr, flush=True)
                finally:
                    for fd in fds:
                        os.close(fd)
                try:
                    data = reply
                    if out_fds:
                        socket.send_fds(self.conn, [data], out_fds)
                    else:
                        self.conn.send(data)
                finally:
                    for fd in out_fds:
                        os.close(fd)
                    self.let_go(self.after_answer)
                    self.after_answer = []
        finally:
            self.close()


def serve(path: Path, ready=None, idle_exit: float = 0) -> None:
    """Accept processes on the socket at path until killed, or, idle_exit > 0,
    until no process has been connected for that many seconds; or, with none
    connected, once the socket is removed or taken over."""
    try:
        gpu = Gpu()
    except CudaError as e:
        raise GpucrError(f"the copy helper cannot use the GPUs: {e}",
                         "run it on a GPU node, as the user (or root) whose jobs it serves")
    path = Path(path)
    path.unlink(missing_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(str(path))
    os.chmod(path, 0o600)  # only its owner's processes (root: any) may connect
    srv.listen(64)
    srv.settimeout(1.0)
    ours = path.stat().st_ino
    active, idle_since, lock = [0], [time.monotonic()], threading.Lock()

    def client(conn):
        try:
            Client(gpu, conn).serve()
        finally:
            with lock:
                active[0] -= 1
                idle_since[0] = time.monotonic()

    if ready:
        ready()
    while True:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            with lock:
                idle = active[0] == 0 and time.monotonic() - idle_since[0] > idle_exit
                unused = active[0] == 0
            if unused and not _still_ours(path, ours):
                return  # its socket was removed (a Slurm job's run dir at job end): nobody can come
            if idle_exit > 0 and idle:
                if _still_ours(path, ours):  # unless another helper has taken the path meanwhile
                    path.unlink(missing_ok=True)
                return
            continue
        conn.settimeout(None)
        with lock:
            active[0] += 1
        threading.Thread(target=client, args=(conn,), daemon=True).start()


def _still_ours(path: Path, ino: int) -> bool:
    try:
        return path.stat().st_ino == ino
    except FileNotFoundError:
        return False


def listening(path: Path) -> bool:
    """Whether a helper accepts connections at path."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def helper_env(env) -> dict:
    """env for a helper: never under the shim (its CUDA calls are its own, and
    a shimmed helper would be taken for a process to checkpoint), and with none
    of the shim's settings."""
    out = {k: v for k, v in env.items() if not k.startswith("GPUCR_")}
    keep = [p for p in out.pop("LD_PRELOAD", "").replace(":", " ").split()
            if os.path.basename(p) != "libgpucr-cuda.so"]
    if keep:
        out["LD_PRELOAD"] = " ".join(keep)
    return out


def ensure(path: Path, idle_exit: float, timeout: float = 120.0) -> int | None:
    """A helper serving at path for this user: the one there (None), or one
    started now (its pid), outside the caller's process tree (CRIU dumps that
    tree, and the caller may exec anything) and in its own session; it exits
    after idle_exit seconds without a process. Its output goes to path.log."""
    path = Path(path)
    if len(str(path)) > 107:
        raise GpucrError(f"the copy helper's socket path {path} is longer than a socket path may be",
                         "use a shorter --run-dir (or GPUCR_RUN_DIR)")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one start at a time: a second would take the path over
        if listening(path):
            return None
        log = path.with_name(path.name + ".log")
        r, w = os.pipe()
        mid = os.fork()
        if mid == 0:  # the middle process: starts the helper and goes, so init adopts it
            try:
                os.close(r)
                with open(log, "ab") as out:
                    h = subprocess.Popen([sys.executable, "-m", "gpucr_hpc", "copy-helper", "--socket", str(path),
                                          "--idle-exit", str(idle_exit)], stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=out, start_new_session=True, env=helper_env(os.environ))
                os.write(w, str(h.pid).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            text = f.read()
        os.waitpid(mid, 0)
        if not text:
            raise GpucrError("the copy helper could not be started", f"see {log}")
        pid = int(text)
        deadline = time.monotonic() + timeout
        while not listening(path):
            if not _alive(pid):
                last = [ln.removeprefix("gpucr-hpc: error: ") for ln in log.read_text(errors="replace").splitlines()
                        if ln.strip()]
                raise GpucrError(f"the copy helper did not start: {last[-1] if last else 'no message'}",
                                 f"see {log}, or run without the copy helper")
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                raise GpucrError(f"the copy helper did not listen within {timeout:.0f} s", f"see {log}")
            time.sleep(0.05)
        return pid


def _alive(pid: int) -> bool:
    if not pid_alive(pid):
        return False
    try:  # adopted by init, it is a zombie only until init reaps it
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def spawn(path: Path, timeout: float = 60.0, faults: str = "") -> subprocess.Popen:
    """`gpucr-hpc copy-helper --socket path` in the background, once it listens
    (for scripts that own the helper and kill it). faults: test faults to make
    (GPUCR_FAULTS, config.FAULTS)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    env = helper_env(os.environ)
    if faults:
        env["GPUCR_FAULTS"] = faults
    h = subprocess.Popen([sys.executable, "-m", "gpucr_hpc", "copy-helper", "--socket", str(path)], env=env)
    deadline = time.monotonic() + timeout
    while not path.exists():
        if h.poll() is not None or time.monotonic() > deadline:
            h.kill()
            raise GpucrError(f"the copy helper did not start (exit {h.poll()})", "see its message above")
        time.sleep(0.1)
    return h
