"""Whole-process images: checkpoint a process tree to an image, restore it.

checkpoint_to(pid, DIR):
    1. checks   - CRIU present and new enough, the process exists and is ours,
                  DIR is new or empty (nothing is ever overwritten);
    2. gpu      - GPU process tree (image_gpu): the shims quiesce and copy GPU
                  memory into their host arenas (VRAM of the allocations free,
                  `gpu_data_s`), each arena goes to DIR/process-<pid>.h5
                  (`gpu_h5_write_s`) and out of the address space, the driver
                  checkpoints the rest (`gpu_control_s`): the GPU is free now
                  (`gpu_released_s`). CPU-only process: nothing to do;
    3. dump     - CRIU dumps the tree into a node-local staging dir (tmpfs) when
                  it has room, else straight into DIR/criu. Without
                  --leave-running the tree is gone after this, with it the tree
                  runs on (`released_s`: how long the process was held);
    4. persist  - the drain: staged CRIU files to DIR/criu/, each with its
                  sha256 (the .h5 files got theirs as they were written;
                  `persist_s`); with
                  --leave-running the tree gets its GPU state back first
                  (`gpu_resume_s`);
    5. commit   - manifest.json, then COMMITTED, atomically (`commit_s`).
    A failure before 3 leaves the process as it was and removes the partial DIR;
    a failure after 3 keeps the staged copy and says where it is.

restore_from(DIR):
    1. checks   - CRIU, image committed, owned by the caller (or root), every file
                  with its checksum, GPU vendor/model of this node, the GPUs to
                  restore onto (the ones it had, or others of the same model:
                  image_gpu.plan_restore), files the tree had open still of their
                  checkpoint size, PIDs free (or a new PID namespace). All before
                  anything is changed; the image is only ever read;
    2. CRIU restore (`criu_restore_s`);
    3. gpu      - driver restore (onto those GPUs) + unlock, each shim's arena re-created at the same
                  addresses and filled from its .h5 file, shim copies the data back
                  to the GPU at the same VAs (image_gpu.restore_gpu). A failure
                  here ends the restored tree; the image is untouched.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.gpu import inventory as gpu_inventory
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import manifest as mf
from gpucr_hpc.tcp import lock as netlock

SHIM_LIBS = ("libgpucr-cuda.so",)  # the shims there are (one: NVIDIA)


# -- node and process facts ---------------------------------------------------

def node_gpus(here: list[gpu_inventory.Gpu] | None = None) -> dict | None:
    """Vendor, model, UUIDs and driver version of this node's GPUs; None without GPUs.
    here: gpu_inventory.node_gpus() when the caller has it already."""
    gpus = gpu_inventory.node_gpus() if here is None else here
    if gpus:
        return {"vendor": "nvidia", "model": gpus[0].model, "models": [g.model for g in gpus],
                "uuids": [g.uuid for g in gpus], "driver_version": gpus[0].driver}
    if os.path.exists("/dev/kfd"):
        return {"vendor": "amd", "model": None, "models": [], "uuids": [], "driver_version": None}
    return None


def is_shimmed(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
        except OSError:
            continue
        if any(lib in maps for lib in SHIM_LIBS):
            return True
    return False


def uses_gpu(tree: list[int], run_dir: Path | None = None) -> bool:
    """True when the tree has GPU state: a GPU device open, or a shim that reports CUDA in use.

    Every task of a --gpucr=on job runs under the shim; one that never touched
    the GPU is a CPU process and takes the CRIU-only path.
    """
    if criu_mod.holds_gpu(tree):
        return True
    if not is_shimmed(tree):
        return False
    from gpucr_hpc.process import in_place

    try:
        targets, _ = in_place.discover(tree[0], run_dir, need_driver=False)
    except GpucrError:
        return False
    return any(t.cuda or t.shim_state == "checkpointed" for t in targets)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _stage_root(need: int) -> Path | None:
    """A node-local tmpfs dir with room for `need` bytes, for the fast dump; else None."""
    cand = config.value("GPUCR_STAGE_DIR")
    if cand.lower() in ("", "none", "off"):
        return None
    try:
        st = os.statvfs(cand)
    except OSError:
        return None
    if not os.access(cand, os.W_OK) or st.f_bavail * st.f_frsize < need:
        return None
    return Path(cand)


# -- checkpoint -----------------------------------------------------------------

def checkpoint_to(pid: int, to_dir: str | Path, *, leave_running: bool = False,
                  stay_yielded: bool = False, timeout_ms: int | None = None,
                  run_dir: Path | None = None, tcp_lock: str | None = None,
                  on_phase: Callable[[str, int], None] | None = None, checksums: bool = True) -> dict:
    """Image of the tree of `pid` in to_dir. leave_running: the tree runs on, its GPU
    state brought back; with stay_yielded it runs on without it (its VRAM stays yielded,
    its GPU calls wait) until it is ended, or `image_gpu.resume_held` brings it back:
    a preemption frees the GPU now, not after the requeue. timeout_ms: how long the
    shims wait for GPU work in flight and the driver for its lock (default
    in_place.DEFAULT_TIMEOUT_MS); run_dir: where the shims' control sockets are
    (default shim_client.default_run_dir()). tcp_lock: dump established TCP
    connections, the network locked by CRIU ("nftables") or by the caller ("skip":
    a job's agents lock every connection of its units, tcp/lock). on_phase(phase,
    bytes so far): told as each phase begins ("gpu", "dump", "write", "commit").
    checksums=False: to_dir is in node memory (a job's staging tier): CRIU dumps
    straight into it and its files are checksummed by the drain that copies them to
    the image root (store/drain.py), not here, while the node waits; a tree that
    ends leaves its arenas there as they are (image_gpu.GpuCheckpoint hand_over)."""
    t0 = time.monotonic()
    said = on_phase or (lambda phase, nbytes: None)
    timings: dict[str, float] = {}
    criu = criu_mod.find_criu()
    if not criu_mod.is_alive(pid):
        raise GpucrError(f"no process {pid}", "give the PID of a running process")
    uid = criu_mod.owner_uid(pid)
    if os.geteuid() not in (0, uid):
        raise GpucrError(f"process {pid} belongs to uid {uid}, you are uid {os.geteuid()}",
                         "checkpoint it as its owner or as root")
    if not criu_mod.session_visible(pid):
        raise GpucrError(f"process {pid}'s session leader is outside its PID namespace, "
                         "which CRIU cannot record",
                         "start the program with setsid (Slurm tasks already are)")
    tree = criu_mod.process_tree(pid)
    shimmed = uses_gpu(tree, run_dir)  # GPU step via image_gpu
    shell_job = not criu_mod.is_session_leader(pid)
    to_dir = Path(to_dir).absolute()
    created = not to_dir.exists()
    m = mf.new_manifest(kind="process", vendor=None, gpu=None)
    m["owner_uid"] = uid
    writer = image_store.ImageWriter(to_dir, m)
    stage = None
    dumped = False
    gpu = None
    gpu_active = False  # the tree's GPU state is checkpointed by us
    try:
        # 2. GPU: data into the arena and the .h5 files, the rest through the driver.
        if shimmed:
            from gpucr_hpc.process import image_gpu

            said("gpu", 0)
            t = time.monotonic()
            node = node_gpus() or {}
            m["vendor"] = node.get("vendor") or "nvidia"
            m["gpu"] = {k: node.get(k) for k in ("model", "models", "uuids", "driver_version")}
            # the tree ends (now, or a preemption's requeue ends it yielded): its arena may stay
            gpu = image_gpu.GpuCheckpoint(pid, writer.path, timeout_ms, run_dir, hashed=checksums,
                                          hand_over=not leave_running or stay_yielded)
            gpu.run()
            gpu_active = True
            timings.update({f"gpu_{k}": v for k, v in gpu.timings.items()})
            timings["gpu_released_s"] = (gpu.released_at or time.monotonic()) - t
        # 3. CPU: CRIU dump, to node-local tmpfs when it fits.
        root = _stage_root(int(criu_mod.rss_bytes(tree) * 1.2) + (64 << 20)) if checksums else None
        stage = Path(tempfile.mkdtemp(prefix="gpucr-stage-", dir=root)) if root else None
        dump_dir = stage if stage else to_dir / image_store.CRIU_SUBDIR
        dump_dir.mkdir(exist_ok=True, mode=0o700)
        work = Path(tempfile.mkdtemp(prefix="gpucr-dump-"))
        said("dump", gpu.bytes if gpu else 0)
        t = time.monotonic()
        criu_mod.wait_reaped(pid)
        files_open = criu.dump(pid, dump_dir, work, leave_running=leave_running, shell_job=shell_job,
                               tcp_lock=tcp_lock)
        dumped = True
        if not leave_running and not criu_mod.wait_gone(tree):
            raise GpucrError(f"process tree of {pid} still runs after criu dump",
                             "kill it by hand; the image will still be written")
        timings["dump_s"] = time.monotonic() - t
        timings["released_s"] = time.monotonic() - t0
        shutil.rmtree(work, ignore_errors=True)
        # 4. Drain: persist GPU buffers and CRIU files with checksums.
        said("write", gpu.bytes if gpu else 0)
        t = time.monotonic()
        if gpu is not None and leave_running and not stay_yielded:
            timings["gpu_resume_s"] = gpu.resume()["resume_s"]  # the original runs on, on its GPU
            gpu_active = False
        for rel, size, digests in (gpu.h5_files if gpu else []):
            if digests is None:
                writer.add_unhashed(rel)
            else:
                writer.add_blocks(rel, size, digests)
        for rel, layout, segments in (gpu.arenas if gpu else []):
            writer.add_arena(rel, layout, segments)
        if stage:
            criu_bytes = writer.add_tree(stage, image_store.CRIU_SUBDIR)
        else:
            criu_bytes = 0
            for p in sorted((to_dir / image_store.CRIU_SUBDIR).iterdir()):
                rel = f"{image_store.CRIU_SUBDIR}/{p.name}"
                criu_bytes += writer.add_written(rel) if checksums else writer.add_unhashed(rel)
        timings["persist_s"] = time.monotonic() - t
        # 5. Commit.
        said("commit", (gpu.bytes if gpu else 0) + criu_bytes)
        t = time.monotonic()
        m["process"] = {
            **m.get("process", {}),
            "root_pid": pid, "pids": tree, "uid": uid, "cmdline": _cmdline(pid),
            "shell_job": shell_job, "shimmed": shimmed, "leave_running": leave_running,
            "gpu_held": bool(gpu_active and leave_running),
        }
        m["criu"] = {"version": criu.version_str, "bytes": criu_bytes, "tcp_lock": tcp_lock}
        m["gpu_bytes"] = gpu.bytes if gpu else 0
        m["gpu_processes"] = gpu.records if gpu else []
        m["open_files"] = files_open
        m["timings"] = timings
        writer.commit()
        timings["commit_s"] = time.monotonic() - t
    except BaseException as e:
        if gpu_active and gpu is not None and (not dumped or leave_running):
            gpu.resume()  # the tree runs on as before (needs the .h5 files: before they go)
        if not dumped:
            if created:
                shutil.rmtree(to_dir, ignore_errors=True)
            else:
                for p in to_dir.iterdir():
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
            if stage:
                shutil.rmtree(stage, ignore_errors=True)
        elif not leave_running and stage and isinstance(e, GpucrError):
            raise GpucrError(e.cause, f"the dumped process is kept in {stage}; {e.fix}") from e
        raise
    if stage:
        shutil.rmtree(stage, ignore_errors=True)
    timings["total_s"] = time.monotonic() - t0
    total = m["total_bytes"]
    return {"image": str(to_dir), "pid": pid, "pids": tree, "bytes": total,
            "gpu_bytes": m["gpu_bytes"], "criu_bytes": m["criu"]["bytes"],
            "leave_running": leave_running, "gpu_held": m["process"]["gpu_held"], "staged": stage is not None,
            "arena_copied": {r["pid"]: r["arena_copied"] for r in m["gpu_processes"] if r.get("arena_copied")},
            "persist_MBps": total / timings["persist_s"] / 1e6 if timings["persist_s"] else None,
            "timings": timings}


# -- restore --------------------------------------------------------------------

def check_node(m: dict, node: dict | None) -> None:
    """The image's GPU vendor and model must be on this node (node: node_gpus())."""
    if not m.get("vendor"):
        return
    want = f"{m['vendor']} {(m.get('gpu') or {}).get('model') or ''}".strip()
    if not node:
        raise GpucrError(f"image needs a {want} GPU, this node ({socket.gethostname()}) has none",
                         "restore on a node with that GPU (Slurm: --gres=gpu:<type>)")
    if node["vendor"] != m["vendor"]:
        raise GpucrError(f"image needs a {want} GPU, this node has {node['vendor']} GPUs",
                         "restore on a node with the same GPU vendor and model")
    model = (m.get("gpu") or {}).get("model")
    if model and model not in (node.get("models") or [node.get("model")]):
        have = ", ".join(sorted(set(node.get("models") or [node.get("model") or "?"])))
        raise GpucrError(f"image needs a {want} GPU, this node has {have}",
                         "restore on a node with the same GPU model")


def check_open_files(m: dict, *, rewind: bool) -> list[dict]:
    """Files the tree had open must still have their checkpoint size (CRIU requires it).

    Returns the files that `rewind` would truncate (a grown append log); raises
    for anything else. Nothing is changed here.
    """
    todo = []
    for rec in m.get("open_files") or []:
        p = Path(rec["path"])
        try:
            size = p.stat().st_size
        except OSError:
            raise GpucrError(f"file {p} that the process had open is missing",
                             "put it back (the process needs it) and restore again")
        if size == rec["size"]:
            continue
        if size > rec["size"] and rewind:
            todo.append({**rec, "now": size})
            continue
        fix = ("pass --rewind-files to truncate it back (a copy is kept beside it)"
               if size > rec["size"] else "put back the file as it was at checkpoint time")
        raise GpucrError(f"file {p} has {size} bytes, {rec['size']} at checkpoint "
                         "(changed since; CRIU cannot restore over it)", fix)
    return todo


def _rewind(files: list[dict]) -> list[str]:
    kept = []
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for rec in files:
        p = Path(rec["path"])
        backup = p.with_name(f"{p.name}.gpucr-{stamp}")
        try:
            shutil.copy2(p, backup)
            os.truncate(p, rec["size"])
        except OSError as e:
            raise GpucrError(f"cannot rewind {p} to its checkpoint size: {e.strerror}",
                             "rewind it as its owner, or put back the file as it was") from e
        kept.append(str(backup))
    return kept


def _pids_in_use(pids: list[int], zombie_grace: float = 5.0) -> list[int]:
    """PIDs of the image that exist here; zombies (a killed tree not yet reaped) get a grace time."""
    deadline = time.monotonic() + zombie_grace
    while True:
        used = [p for p in pids if criu_mod.pid_in_use(p)]
        if not used or any(criu_mod.is_alive(p) for p in used) or time.monotonic() > deadline:
            return used
        time.sleep(0.02)


def restore_from(from_dir: str | Path, *, pidns: str = "auto", rewind_files: bool = False,
                 inherit: dict[int, str] | None = None, checksums_verified: bool = False,
                 gpus: list[str] | None = None, tied: bool = False,
                 moved: dict[str, str] | None = None, lock: netlock.Spec | None = None,
                 closed: list[tuple[str, str]] | None = None) -> dict:
    """Restore the image in from_dir; `inherit` hands our fds to the tree (criu --inherit-fd).

    moved: TCP ends ("addr:port") that are elsewhere now -> their new address: the
    connections are restored with those ends (the image itself is not changed).
    closed: connections (local end, remote end) to outside the job, restored closed.
    lock: taken on the restored connections before CRIU runs; the caller lets it go.

    tied: a job's unit, whose new PID namespace must end with the step restoring it.

    checksums_verified: the caller has just verified the image's checksums (a job
    restore checks every unit before it touches anything); not read twice.
    gpus: the GPUs of this node to restore onto (--gpu: indices or UUIDs, one per GPU
    of the image); default: where it was when those GPUs are here with room, else
    others of the same model (image_gpu.plan_restore)."""
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    image_store.check_owner(Path(from_dir).absolute(), None)
    criu = criu_mod.find_criu()
    t = time.monotonic()
    # the GPU data is checked as it is loaded (read once), everything else now
    img = image_store.open_image(Path(from_dir), verify_checksums=not checksums_verified, defer_gpu_data=True)
    timings["verify_s"] = time.monotonic() - t
    m = img.manifest
    proc = m.get("process") or {}
    if m.get("kind") != "process" or "root_pid" not in proc:
        raise GpucrError(f"image {img.path} is not a process image", "give restore --from a checkpoint --to directory")
    fill = None
    if m.get("gpu_processes"):  # the arenas fill while the checks, CRIU and the driver run
        from gpucr_hpc.process import arena_fill

        fill = arena_fill.ArenaFill(m, img.path, check=not checksums_verified)
    try:
        t = time.monotonic()
        here = gpu_inventory.node_gpus() if m.get("vendor") or m.get("gpu_processes") else []
        timings["node_query_s"] = time.monotonic() - t  # part of checks_s: the node's GPUs, asked once
        check_node(m, node_gpus(here))
        plan = None
        if m.get("gpu_processes"):
            from gpucr_hpc.process import image_gpu

            plan = image_gpu.plan_restore(m, gpus, here=here)  # and whether the GPUs it goes onto have room
        elif gpus:
            raise GpucrError(f"image {img.path} holds no GPU state, so --gpu has nothing to place",
                             "restore it without --gpu")
        rewinds = check_open_files(m, rewind=rewind_files)
        # in a new PID namespace the image's PIDs are free whatever holds them here
        clash = _pids_in_use(proc.get("pids", [])) if pidns != "new" else []
        if pidns == "host" and clash:
            raise GpucrError(f"PID namespace clash: PID {clash[0]} of the image is in use here "
                             f"({' '.join(_cmdline(clash[0]))[:60] or 'unknown'})",
                             "restore with --pidns new, or end the process that holds it")
        new_ns = pidns == "new" or (pidns == "auto" and bool(clash))
        kept = _rewind(rewinds) if rewinds else []
        work = Path(tempfile.mkdtemp(prefix="gpucr-restore-"))
        timings["checks_s"] = time.monotonic() - t0
        t = time.monotonic()
        restored = criu.start_restore(img.criu_dir, work, shell_job=bool(proc.get("shell_job")),
                                      new_pidns=new_ns, inherit=inherit, tied=tied and new_ns,
                                      tcp=bool((m.get("criu") or {}).get("tcp_lock")), moved=moved, lock=lock,
                                      closed=closed)
        timings["criu_restore_s"] = time.monotonic() - t
        placed: list[dict] = []
        if m.get("gpu_processes"):
            t = time.monotonic()
            gt, placed = _restore_gpu_or_end(m, img.path, restored, new_ns, plan, check=not checksums_verified,
                                             fill=fill)
            timings.update({f"gpu_{k}": v for k, v in gt.items()})
            timings["gpu_restore_s"] = time.monotonic() - t
    finally:
        if fill is not None:
            fill.close()
    shutil.rmtree(work, ignore_errors=True)
    timings["total_s"] = time.monotonic() - t0
    return {"image": str(img.path), "pid": restored.host_pid, "ns_pid": restored.ns_pid,
            "pidns": "new" if new_ns else "host", "bytes": m.get("total_bytes", 0),
            "rewound_files_kept_as": kept, "timings": timings,
            "gpus": placed, "gpu_moved": bool(plan and plan.moves),
            "_launcher": restored.launcher}


def _restore_gpu_or_end(m: dict, image: Path, restored, new_ns: bool, plan=None,
                        check: bool = True, fill=None) -> tuple[dict, list]:
    """GPU state into the CRIU-restored tree (timings, and the GPUs of each process);
    on failure the tree is ended (it could not run on) and the image stays as it
    was, for another try."""
    from gpucr_hpc.process import image_gpu

    tree = criu_mod.process_tree(restored.host_pid)
    pid_map = {(criu_mod.nspid(p)[-1] if new_ns else p): p for p in tree}
    try:
        paths: dict[int, str] = {}
        timings = image_gpu.restore_gpu(m, image, pid_map, plan, check=check, data_paths=paths, fill=fill)
        placed = image_gpu.placement(m, plan, pid_map)
        for proc in placed:
            if proc["pid"] in paths:
                proc["data_path"] = paths[proc["pid"]]
        return timings, placed
    except BaseException as e:
        criu_mod.end_tree(restored.host_pid, restored.launcher)
        if isinstance(e, GpucrError):
            raise GpucrError(f"{e.cause}; the restored process was ended, the image is unchanged",
                             e.fix) from e
        raise
