"""The GPU step of a whole-process image: GPU data to one HDF5 file per process,
the rest through the driver, the shim's arena out of CRIU's way.

Checkpoint (`GpuCheckpoint`), on the shimmed and CUDA processes of the tree:
  1. data     the shims quiesce, copy their GPU memory into their host arenas and
              yield the VRAM (in_place.shim_checkpoint); `data_s`;
  2. control  driver lock + checkpoint of every CUDA process (contexts, modules,
              stream-ordered pools): no GPU state and no /dev/nvidia* fd is left,
              so plain CRIU can dump the tree, and the GPU is free (`released_s`)
              before the image is written; `control_s`. Then each shim drops the
              pages of its staging ring (scratch, not for the image);
  3. write    each arena, as the shim placed it (its reply lists the allocations),
              is copied from the process into <image>/process-<pid>.h5 and fsync'd,
              checksummed per block from the page cache meanwhile
              (gpu_data.save_process); `h5_write_s`, `h5_MBps`;
              A tree that ends into node memory (a job's staging tier, hand_over)
              keeps its arena instead: the shim's segment files are linked into
              the image beside the .h5 file's metadata (store/files.py), so the
              process can end at once, its data staying where it is (no copy;
              the drain joins the two on the image root);
  4. detach   each shim swaps its arena for an empty reservation of the same
              range: CRIU cannot dump it (unlinked shared files, huge pages), and
              its data is in the .h5 now; `detach_s`.
  A pinned arena (GPUCR_ARENA_PIN=1) is unregistered at detach, a CUDA call, so
  there step 4 comes before step 2 and the GPU is free only after the write.
  `resume()` undoes what was done, in reverse, and the tree runs on as before
  (an aborted checkpoint, or --leave-running after the dump).

Each process's record in the manifest names the GPUs it sees (`gpu_uuids`, by
CUDA ordinal: from its shim, else from its CUDA_VISIBLE_DEVICES) and its GPU data
on each (`gpu_bytes`).

Restore: `plan_restore` (before anything is changed) decides onto which GPUs of
this node the image goes (gpu_remap); after CRIU has restored the tree,
`restore_gpu`: driver restore (with the plan's GPU pairs for a process that
moves) + unlock -> each shim re-creates its arena at the same addresses
(arena_attach) -> the .h5 into it (gpu_data.load_process) -> shim restore (data
back to the GPU at the same virtual addresses and ordinals, API gate open). The
image is only read.

A CUDA process without the shim takes the driver path alone: its GPU data then
travel inside its CRIU images (the driver stages them into process memory).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.gpu import inventory as gpu_inventory
from gpucr_hpc.gpu import remap as gpu_remap
from gpucr_hpc.process import in_place
from gpucr_hpc.shim.client import ShimClient
from gpucr_hpc.shim.protocol import ARENA_ATTACH, ARENA_DETACH, ARENA_FILES, NO_REPLY, STAGING_DROP, Reply
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import gpu_data
from gpucr_hpc.store import manifest as mf
from gpucr_hpc.store.manifest import image_pid

TIMEOUT_MS = in_place.DEFAULT_TIMEOUT_MS


def _client(pid: int, sock: str) -> ShimClient:
    c = ShimClient(pid)
    c.path = Path(sock)  # bound where the process first ran (a restored PID may differ)
    return c


def _ok(reply: Reply, pid: int, what: str) -> Reply:
    if not reply.ok:
        raise GpucrError(f"process {pid}: {what} failed: {reply.error or 'no reason given'}",
                         "start the program with GPUCR_DEBUG=1 for the shim's diagnostics on its stderr")
    return reply


class GpuCheckpoint:
    """Steps 1-4 of the module doc on the tree of `pid`, writing .h5 files into image_dir.

    timeout_ms: how long the shims wait for GPU work in flight (quiesce) and the driver
    for its lock; run_dir: where the shims' control sockets are (default: the usual)."""

    def __init__(self, pid: int, image_dir: Path, timeout_ms: int | None = None,
                 run_dir: Path | None = None, hashed: bool = True, hand_over: bool = False):
        self.pid = pid
        self.hashed = hashed  # False: image_dir is in node memory, the drain checksums it
        self.hand_over = hand_over and not hashed  # the tree ends: its arenas stay in image_dir
        self.dir = Path(image_dir)
        self.timeout_ms = TIMEOUT_MS if timeout_ms is None else timeout_ms
        self.run_dir = run_dir
        self.targets, self.driver = in_place.discover(pid, run_dir)
        if any(t.shim_state == "checkpointed" or t.driver_state in ("locked", "checkpointed")
               for t in self.targets):
            raise GpucrError(f"process {pid} is checkpointed in place",
                             f"restore it first (`gpucr-hpc restore --pid {pid}`), then checkpoint --to")
        self.records: list[dict] = []   # per process, for the manifest
        self.h5_files: list[tuple[str, int, list | None]] = []   # image-relative name, size, block sha256s
        self.arenas: list[tuple[str, str, list[tuple[str, int, int]]]] = []  # .h5 name, its parts (hand_over)
        self.timings: dict[str, float] = {}
        self.bytes = 0
        self._shimmed: list = []
        self._detached: list[dict] = []
        self._driver_done = False
        self.released_at: float | None = None  # when the tree held nothing on the GPU any more
        self._node: list | None = None  # this node's GPUs, asked for once when needed

    # -- checkpoint -------------------------------------------------------------

    def run(self) -> None:
        t0 = time.monotonic()
        self._shimmed = in_place.shim_checkpoint(self.targets, self.timeout_ms, self.run_dir)
        self.timings["data_s"] = time.monotonic() - t0
        try:
            early = not any(tg.checkpointed.arena_pinned for tg in self._shimmed)
            if early:
                self._control(t0)
                for tg in self._shimmed:
                    if tg.cuda:
                        _ok(ShimClient(tg.pid, self.run_dir).request(STAGING_DROP), tg.pid,
                            "dropping the staging ring")
            t = time.monotonic()
            for tg in self.targets:
                self.records.append(self._save(tg))
            self.timings["h5_write_s"] = time.monotonic() - t
            if self.bytes:
                self.timings["h5_MBps"] = self.bytes / self.timings["h5_write_s"] / 1e6
            t = time.monotonic()
            for rec in self.records:
                if rec["h5"]:
                    r = _ok(_client(rec["pid"], rec["socket"]).request(ARENA_DETACH), rec["pid"],
                            "detaching the arena")
                    self._detached.append(rec)
                    rec["arena_bytes"] = r.arena_bytes
                    if r.segment_ranges:  # for a restore that fills them ahead (arena_fill)
                        rec["arena_dir"] = r.arena_dir
                        rec["arena_segments"] = [list(seg) for seg in r.segment_ranges]
            self.timings["detach_s"] = time.monotonic() - t
            if not early:
                self._control(t0)
        except BaseException:
            self.resume()
            raise
        self.timings["gpu_total_s"] = time.monotonic() - t0

    def _control(self, t0: float) -> None:
        """The driver checkpoint: after it, the tree holds nothing on the GPU."""
        t = time.monotonic()
        if self.driver:
            in_place.driver_checkpoint(self.driver, self.targets, self.timeout_ms)
            self._driver_done = True
        self.timings["control_s"] = time.monotonic() - t
        self.released_at = time.monotonic()
        self.timings["released_s"] = self.released_at - t0

    def _save(self, tg) -> dict:
        # pid: the process now (a tree left running goes on with it); image_pid: as CRIU
        # records it, what a restore maps back (they differ for a tree restored before).
        # driver: the driver held state of it (a process that only loaded libcuda, such
        # as a torch.compile worker, has none: a restore must not ask the driver of it)
        rec = {"pid": tg.pid, "image_pid": criu_mod.pid_in_image(tg.pid),
               "shim": tg.shim, "cuda": tg.cuda, "driver": tg.driver_state is not None, "h5": None, "bytes": 0,
               "socket": str(ShimClient(tg.pid, self.run_dir).path) if tg.shim else None}
        reply = tg.checkpointed if tg.shim else NO_REPLY
        if reply.data_path:  # how the data left the GPU (helper, bounce, direct)
            rec["data_path"] = reply.data_path
        blobs = list(reply.blobs)
        if tg.cuda:
            rec["gpu_uuids"] = self._gpu_uuids(tg.pid, reply)
            per_ordinal = [0] * len(rec["gpu_uuids"])
            for b in blobs:
                if 0 <= b.device < len(per_ordinal):
                    per_ordinal[b.device] += b.size
            rec["gpu_bytes"] = per_ordinal
        if not blobs:
            return rec
        rel = image_store.process_h5_name(tg.pid)
        attrs: dict[str, object] = {"vendor": "nvidia"}
        if rec.get("gpu_uuids"):
            attrs["device_uuids"] = gpu_data.string_array(rec["gpu_uuids"])
        if self.hand_over:
            why = self._keep_arena(tg.pid, rel, blobs, attrs, rec)
            if why is None:
                return rec
            rec["arena_copied"] = why  # the copy below, as without a staging tier
        try:
            rep = gpu_data.save_process(self.dir / rel, tg.pid, blobs, attrs=attrs,
                                         block_bytes=image_store.HASH_BLOCK, hashed=self.hashed)
        except OSError as e:
            raise GpucrError(f"writing the GPU data of process {tg.pid} to {self.dir / rel} failed: "
                             f"{e.strerror or e}", "free space there or checkpoint --to another directory")
        self.h5_files.append((rel, rep["file_size"], rep["checksum"]))
        self.bytes += rep["bytes"]
        rec.update(h5=rel, bytes=rep["bytes"], allocations=rep["allocations"],
                   copy_s=round(rep["copy_s"], 6), fsync_s=round(rep["fsync_s"], 6))
        return rec

    def _keep_arena(self, pid: int, rel: str, blobs: list, attrs: dict, rec: dict) -> str | None:
        """The process's arena linked into the image, as its own files, beside the
        metadata of the .h5 file `rel` (store/files.py): no byte is copied. The shim
        links them (arena_files "into"): a restored process may have mounts of its
        own, across which our link would fail. None when done; else why not, with
        nothing left behind (the caller copies instead)."""
        layout = image_store.layout_name(pid)
        folder = self.dir / Path(image_store.arena_name(pid, 0)).parent
        try:
            folder.mkdir(mode=0o700)
            if os.geteuid() == 0:  # the process's own user links into it
                fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.fchown(fd, criu_mod.owner_uid(pid), -1)
                finally:
                    os.close(fd)
            r = ShimClient(pid, self.run_dir).request(ARENA_FILES, into=str(folder))
            if not r.ok or not r.linked or len(r.segment_ranges) != len(list(folder.iterdir())):
                shutil.rmtree(folder, ignore_errors=True)
                return f"the shim did not hand its arena over: {r.error or 'it linked no files'}"
            rep = gpu_data.save_layout(self.dir / layout, pid, blobs, attrs=attrs)
        except OSError as e:
            shutil.rmtree(folder, ignore_errors=True)
            (self.dir / layout).unlink(missing_ok=True)
            return f"keeping the arena's files in {self.dir} failed: {e.strerror or e}"
        names = [image_store.arena_name(pid, k) for k in range(len(r.segment_ranges))]
        self.arenas.append((rel, layout, [(n, a, size) for n, (a, size) in zip(names, r.segment_ranges)]))
        self.bytes += rep["bytes"]
        rec.update(h5=rel, bytes=rep["bytes"], allocations=rep["allocations"], copy_s=0.0, fsync_s=0.0,
                   arena_kept=True)
        return None

    def _gpu_uuids(self, pid: int, reply: Reply) -> list[str]:
        """The UUIDs of the GPUs process `pid` sees, by CUDA ordinal: as its shim reported
        them, else from its CUDA_VISIBLE_DEVICES against this node's GPUs; [] if unknown
        (such an image restores onto the GPUs it had, only)."""
        told = reply.device_uuids
        if told:
            return [told[k] for k in sorted(told)]
        if self._node is None:
            self._node = gpu_inventory.node_gpus()
        try:
            return [g.uuid for g in gpu_inventory.process_gpus(pid, self._node)]
        except OSError:
            return []

    # -- undo / leave running ---------------------------------------------------

    def resume(self) -> dict:
        """Bring the GPU state back into the still-running tree, from the .h5 files."""
        t0 = time.monotonic()
        if self._driver_done:
            in_place.driver_restore(self.driver, self.targets)
            self._driver_done = False
        kept = {rel: (layout, segments) for rel, layout, segments in self.arenas}
        for rec in list(self._detached):
            filled = None
            if rec["h5"] in kept:  # its own files, linked into the image: mapped back as they are
                from gpucr_hpc.process import arena_fill

                layout, segments = kept[rec["h5"]]
                entry = {"arena": {"layout": layout, "segments": [list(s) for s in segments]}}
                filled = arena_fill.adopt(self.dir, entry, [(a, n) for _, a, n in segments])
            _refill(rec, rec["pid"], self.dir, filled=filled)
            self._detached.remove(rec)
        in_place.shim_restore(self._shimmed, self.run_dir)
        return {"resume_s": time.monotonic() - t0}


def _refill(rec: dict, pid: int, image_dir: Path, m: dict | None = None, filled=None) -> dict:
    """arena_attach in process `pid`, then its .h5 into the arena; with the
    manifest `m`, each block checked against its sha256 as it is read. filled
    (arena_fill.Filled): the arena's files, filled ahead, are handed over instead."""
    c = _client(pid, rec["socket"])
    if filled is not None:
        try:
            more = {"linkable": True} if filled.linkable else {}  # the shim may hand them to a stage as they are
            r = _ok(c.request(ARENA_ATTACH, timeout=600.0, fds=filled.fds, **more), pid,
                    "mapping the arena filled ahead")
        finally:
            filled.close()  # the shim holds its own copies now
        if r.filled:
            if _placements(r.blobs) != _placements(filled.blobs):
                raise GpucrError(f"process {pid}: its arena's allocations are not where its image has them",
                                 "restore from another generation, and report this with the image")
            return {"bytes": filled.bytes, "attach_s": r.attach_s, "fill_s": filled.fill_s, "kept": filled.kept}
        # a shim that took no descriptors made the arena anew: load it as before
    else:
        r = _ok(c.request(ARENA_ATTACH, timeout=600.0), pid, "re-creating the arena")
    digests, block = image_store.block_checksums(m, rec["h5"]) if m else (None, image_store.HASH_BLOCK)
    try:
        rep = gpu_data.load_process(image_dir / rec["h5"], pid, list(r.blobs),
                                     block_digests=digests, block_bytes=block)
    except (OSError, ValueError) as e:
        raise GpucrError(f"loading the GPU data of process {pid} from {image_dir / rec['h5']} failed: {e}",
                         "restore from an intact copy of the image")
    rep["attach_s"] = r.attach_s
    return rep


def taken(fill, rec: dict, image_dir: Path):
    """The process's arena as `fill` (arena_fill.ArenaFill) filled it, or None; a data
    error is said as the load it replaces says it."""
    try:
        return fill.take(image_pid(rec))
    except (OSError, ValueError) as e:
        raise GpucrError(f"loading the GPU data of process {image_pid(rec)} from {image_dir / rec['h5']} "
                         f"failed: {e}", "restore from an intact copy of the image") from e


def _placements(blobs) -> set[tuple[int, int, int]]:
    return {(b.handle, b.size, b.host) for b in blobs}


def resume_held(image_dir: Path) -> dict:
    """Bring the GPU state back into a tree that a checkpoint left running with its
    GPU yielded (image.checkpoint_to stay_yielded): its processes are the image's own."""
    from gpucr_hpc.process import arena_fill

    m = mf.load(image_dir)
    recs = m.get("gpu_processes") or []
    gone = [r["pid"] for r in recs if not criu_mod.is_alive(r["pid"])]
    if gone:
        raise GpucrError(f"process {gone[0]} of {image_dir} is gone", "restore the job from its image instead")
    fill = arena_fill.ArenaFill(m, image_dir, check=False)  # an arena kept in node memory maps back as it is
    try:
        return restore_gpu(m, image_dir, {image_pid(r): r["pid"] for r in recs}, fill=fill)
    finally:
        fill.close()


# -- restore ----------------------------------------------------------------------

def plan_restore(m: dict, force: list[str] | None = None, here: list | None = None,
                 env: dict | None = None) -> gpu_remap.Plan | None:
    """Where the image's GPUs go on this node (gpu_remap.plan); None for an image that
    does not record them (restored onto the GPUs it had, as before). The GPUs this
    restore may take are those of its own CUDA_VISIBLE_DEVICES when set (a Slurm step's
    GPUs); --gpu (force) may name any GPU of the node. Either way the GPUs the image
    goes onto must have room for its data, or this refuses (the restore's only GPU
    memory check)."""
    wanted = gpu_remap.image_gpus(m)
    if wanted is None and force:
        raise GpucrError("the image does not record the GPUs of its processes (written by an older "
                         "gpucr-hpc), so --gpu cannot map them",
                         "restore it without --gpu, onto the GPUs it had")
    here = gpu_inventory.node_gpus() if here is None else here
    if wanted is None:
        gpu_remap.check_in_place((m.get("gpu") or {}).get("uuids") or [], int(m.get("gpu_bytes") or 0), here)
        return None
    usable_env = os.environ if env is None else env
    usable = gpu_inventory.visible(usable_env.get("CUDA_VISIBLE_DEVICES"), here)
    p = gpu_remap.plan(wanted, here, usable, force)
    p.node_then = list((m.get("gpu") or {}).get("uuids") or [])
    p.node_here = [g.uuid for g in here]
    return p


def placement(m: dict, plan: gpu_remap.Plan | None, pid_map: dict[int, int]) -> list[dict]:
    """For the report: the GPUs each restored CUDA process runs on, by CUDA ordinal."""
    out = []
    for r in m.get("gpu_processes") or []:
        if not r.get("cuda"):
            continue
        gpus = []
        for ordinal, old in enumerate(r.get("gpu_uuids") or []):
            new = plan.targets.get(old) if plan else None
            gpus.append({"ordinal": ordinal, "image_uuid": old, "uuid": new.uuid if new else old,
                         "index": new.index if new else None, "moved": bool(new and new.uuid != old)})
        out.append({"pid": pid_map.get(image_pid(r)), "image_pid": image_pid(r), "gpus": gpus})
    return out


def _driver_held(rec: dict) -> bool:
    """Whether the driver checkpointed this process (images before the "driver"
    field: every CUDA process)."""
    return bool(rec.get("driver", rec["cuda"]))


def restore_gpu(m: dict, image_dir: Path, pid_map: dict[int, int],
                plan: gpu_remap.Plan | None = None, check: bool = False,
                data_paths: dict[int, str] | None = None, fill=None) -> dict:
    """GPU state of a CRIU-restored tree; pid_map: PID at checkpoint -> PID here;
    plan: onto which GPUs (None: the ones it had); check: the .h5 files were not
    verified yet, so each block is checked as it is loaded; data_paths: filled
    with how each shimmed process's data went back to the GPU, by PID here;
    fill (arena_fill.ArenaFill): the arenas being filled since before CRIU ran."""
    timings: dict[str, float] = {}
    recs = m.get("gpu_processes") or []
    targets = []
    t0 = time.monotonic()
    driver = in_place._driver() if any(map(_driver_held, recs)) else None
    for r in recs:
        host = pid_map.get(image_pid(r))
        if host is None:
            raise GpucrError(f"process {image_pid(r)} of the image was not restored", "see the CRIU restore log")
        t = in_place.Target(host, shim=r["shim"], cuda=r["cuda"], shim_state="checkpointed" if r["shim"] else "")
        t.driver_state = driver.state(host, cuda=True) if driver and _driver_held(r) else None
        if plan and r["cuda"]:
            t.gpu_pairs = plan.pairs(r["gpu_uuids"])
        targets.append((r, t))
    if driver:
        in_place.driver_restore(driver, [t for _, t in targets])
    timings["control_s"] = time.monotonic() - t0
    started = time.monotonic()
    total = 0
    checked = image_store.gpu_data_files(m) if check else frozenset()
    for r, tg in targets:
        if r["h5"]:
            filled = taken(fill, r, image_dir) if fill is not None else None
            rep = _refill(r, tg.pid, image_dir, m if r["h5"] in checked else None, filled)
            total += rep["bytes"]
            timings["attach_s"] = timings.get("attach_s", 0.0) + rep["attach_s"]
            if "fill_s" in rep:  # beside CRIU and the driver: the longest of them
                timings["fill_s"] = max(timings.get("fill_s", 0.0), rep["fill_s"])
            if rep.get("kept"):  # mapped as the checkpoint left it in node memory: no fill
                timings["arenas_kept"] = timings.get("arenas_kept", 0) + 1
    timings["h5_read_s"] = time.monotonic() - started - timings.get("attach_s", 0.0)
    if total and "fill_s" not in timings:  # filled ahead, h5_read_s is only the wait for it
        timings["h5_read_MBps"] = total / timings["h5_read_s"] / 1e6
    started = time.monotonic()
    for r, tg in targets:
        if r["shim"]:
            back = _ok(_client(tg.pid, r["socket"]).restore(), tg.pid, "restoring the GPU data")
            if data_paths is not None and back.data_path:
                data_paths[tg.pid] = back.data_path
    timings["data_s"] = time.monotonic() - started
    timings["gpu_total_s"] = time.monotonic() - t0
    return timings
