"""Draining a staged image: from node memory to the image root, durable and checked.

A preemption writes each unit's image into node-local memory first (the
staging tier), so the job's processes can end and the node go to the
preemptor without waiting for the file system. The drain then copies every
file of the committed staged image to its place on the image root, checking
each against the sha256 the staged manifest recorded (a bad page in memory
or a short write stops it), fsyncs files and directories, and writes the
manifest and COMMITTED last: the drained image is the staged one, byte for
byte, and durable. Files CRIU dumped straight into node memory have no
checksum there yet (the node should not wait for one): the drain makes it as
it copies them, and the drained manifest records it. A process's GPU data
staged as its arena's own files and the .h5 file's metadata (store/files.py) is
joined into the .h5 file here, checksummed as it is written.

A drain that fails for any reason (disk full, a checksum, the file system
gone) removes what it wrote and says why in one line; the staged image is
left as it was.

The drain runs as the job's user (spank/drain_spawn.c), in the user's own
directories: what it writes is the user's as it is made, never chowned.
Still, a staged file or the manifest is never read through a symlink, and a
destination that is a symlink is refused: the image is what the checkpoint
wrote, not what a link points at.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.regular_file import NOT_REGULAR, open_regular
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import gpu_data
from gpucr_hpc.store import manifest as mf


def _copy_checked(src: Path, dst: Path, rec: dict) -> dict:
    """Copy one file; its record as the drained image has it: checked against the
    staged record's checksum, or checksummed now where the staged one has none."""
    dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    size, blocks = image_store.copy_with_block_sha256(src, dst, nofollow=True)
    if size != rec["size"]:
        raise GpucrError(f"{src} has {size} bytes, its manifest says {rec['size']}",
                         "the staged image is damaged; the job restores from its previous generation")
    if "sha256_blocks" in rec:
        good = rec.get("block_bytes") == image_store.HASH_BLOCK and blocks == rec["sha256_blocks"]
    elif "sha256" in rec:
        good = mf.sha256_file(dst) == rec["sha256"]
    else:  # dumped straight into node memory: its checksum is made here, off the node's time
        return {"size": size, "sha256_blocks": blocks, "block_bytes": image_store.HASH_BLOCK}
    if not good:
        raise GpucrError(f"{src} does not match its checksum in the staged manifest",
                         "the staged image is damaged; the job restores from its previous generation")
    return rec


def _compose(staged: Path, dst: Path, rec: dict) -> dict:
    """The .h5 file a checkpoint left as the arena's segments and its metadata
    (store/files.py), whole and checksummed on the image root."""
    layout, parts = rec["arena"].get("layout") or "", image_store.arena_parts(rec)
    names = [layout] + [f for f, _, _ in parts]
    if any(image_store.outside(n) for n in names):
        raise GpucrError(f"staged image {staged}: bad file name among {names!r}", "checkpoint the job again")
    segments = [(staged / f, a, n) for f, a, n in parts]
    for name in names:
        _not_a_link(staged / name, "staged file")
    try:
        size, blocks = gpu_data.compose(staged / layout, segments, dst,
                                        block_bytes=image_store.HASH_BLOCK)
    except ValueError as e:
        raise GpucrError(f"{staged}: the GPU data of {dst.name} does not fit its arena's files ({e})",
                         "the staged image is damaged; the job restores from its previous generation") from e
    if size != rec["size"]:
        raise GpucrError(f"{dst.name} joined from {staged} has {size} bytes, its manifest says {rec['size']}",
                         "the staged image is damaged; the job restores from its previous generation")
    return {"size": size, "sha256_blocks": blocks, "block_bytes": image_store.HASH_BLOCK}


def _not_a_link(path: Path, what: str) -> None:
    if path.is_symlink():
        raise GpucrError(f"the {what} {path} is a symlink", "nothing is drained through a link; the job restores "
                         "from its previous generation")


def _vouched(marker: bytes) -> str | None:
    try:
        return json.loads(marker).get("manifest_sha256")
    except (ValueError, AttributeError):
        return None


def _decoded(data: bytes) -> dict | None:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _read_nofollow(path: Path) -> bytes:
    """A staged file's bytes, the file itself and never what a symlink names."""
    try:
        fd = open_regular(path)
    except OSError as e:
        what = f"{path} is not a regular file" if e.errno == NOT_REGULAR else f"cannot read {path}: {e.strerror}"
        raise GpucrError(what, "the staged image is damaged; the job restores from its previous generation") from e
    with os.fdopen(fd, "rb") as f:
        return f.read()


def drain_image(staged: Path, dest: Path) -> int:
    """Copy the committed image `staged` to the new directory `dest`; returns its bytes.
    On any failure `dest` is removed and a GpucrError says why."""
    staged, dest = Path(staged), Path(dest)
    _not_a_link(staged, "staged image")
    _not_a_link(dest, "drain destination")
    m = mf.load(staged)
    data, marker = _read_nofollow(staged / mf.MANIFEST), _read_nofollow(staged / mf.COMMITTED)
    if _vouched(marker) != hashlib.sha256(data).hexdigest() or _decoded(data) != m:
        raise GpucrError(f"staged image {staged}: its manifest changed while it was read",
                         "the staged image is damaged; the job restores from its previous generation")
    created = not os.path.lexists(dest)
    try:
        image_store.prepare_new(dest)
        files = {}
        for rel, rec in sorted((m.get("files") or {}).items(), key=lambda kv: -kv[1]["size"]):
            if image_store.outside(rel):
                raise GpucrError(f"staged image {staged}: bad file name {rel!r}", "checkpoint the job again")
            if rec.get("arena"):  # held as its parts, the process's arena among them: joined here
                files[rel] = _compose(staged, dest / rel, rec)
            else:
                files[rel] = _copy_checked(staged / rel, dest / rel, rec)
        for root, dirs, _files in os.walk(dest):
            for d in dirs:
                mf.fsync_dir(Path(root) / d)
        if files == (m.get("files") or {}):  # every file had its checksum: the same image, byte for byte
            mf.write_atomic(dest / mf.MANIFEST, data)
            mf.write_atomic(dest / mf.COMMITTED, marker)
        else:
            mf.commit(dest, {**m, "files": files})
        mf.fsync_dir(dest.parent)
    except (GpucrError, OSError) as e:
        if created:
            shutil.rmtree(dest, ignore_errors=True)
        if isinstance(e, GpucrError):
            raise
        raise GpucrError(f"draining {staged} to {dest} failed: {e.strerror or e}",
                         "free space on the image root (or fix it); the job restores from its previous "
                         "generation") from e
    return int(m.get("total_bytes") or 0)
