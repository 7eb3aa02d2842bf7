"""manifest.json: what an image holds, and the COMMITTED marker written last.

The manifest records the vendor, GPU model and UUIDs, driver version, the size
and sha256 of every file of the image, creation time, tool version and owner
uid. It is written atomically (write to a temp file, fsync, rename, fsync the
directory). `COMMITTED` is written the same way after it and holds the sha256
of manifest.json, so a changed or truncated manifest is detected too.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path

from gpucr_hpc import __version__
from gpucr_hpc.errors import GpucrError

FORMAT = "gpucr-hpc-image"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
COMMITTED = "COMMITTED"
CHUNK = 8 << 20


def image_pid(rec: dict) -> int:
    """A GPU process record's PID in the image's process tree (images before image_pid: its pid)."""
    return int(rec.get("image_pid", rec["pid"]))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """write + fsync + rename + fsync(dir): the file is either old or new, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_native_id()}")
    try:  # a stale one of an earlier process of this pid; a link there is removed, never followed
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    fsync_dir(path.parent)


def new_manifest(*, kind: str, vendor: str | None, gpu: dict | None) -> dict:
    now = time.time()
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tool_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "created_unix": now,
        "hostname": socket.gethostname(),
        "owner_uid": os.geteuid(),
        "kind": kind,
        # vendor None = CPU only; gpu = {model, uuids, driver_version}
        "vendor": vendor,
        "gpu": gpu,
        "files": {},
        "total_bytes": 0,
    }


def add_file(manifest: dict, rel: str, size: int, sha256: str) -> None:
    manifest["files"][rel] = {"size": size, "sha256": sha256}
    manifest["total_bytes"] = sum(f["size"] for f in manifest["files"].values())


def encode(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def marker(data: bytes) -> bytes:
    """What COMMITTED holds: the sha256 of the manifest's bytes."""
    return (json.dumps({"manifest_sha256": hashlib.sha256(data).hexdigest()}) + "\n").encode()


def commit(image_dir: Path, manifest: dict) -> None:
    """Write manifest.json, then COMMITTED (with the manifest's sha256), both atomically."""
    data = encode(manifest)
    write_atomic(Path(image_dir) / MANIFEST, data)
    write_atomic(Path(image_dir) / COMMITTED, marker(data))


def load(image_dir: Path, marker_name: str = COMMITTED) -> dict:
    """Read a committed manifest; refuses an uncommitted or altered one. marker_name:
    the marker that vouches for it (a job generation's STAGED, before its drain)."""
    image_dir = Path(image_dir)
    marker_path, man_path = image_dir / marker_name, image_dir / MANIFEST
    try:
        os.stat(image_dir)
        os.stat(marker_path)
    except PermissionError:
        raise GpucrError(f"image {image_dir}: permission denied",
                         "restore it as its owner or as root")
    except OSError:
        pass
    if not image_dir.is_dir():
        raise GpucrError(f"no image at {image_dir}", "give the directory a checkpoint --to wrote")
    if not marker_path.exists():
        raise GpucrError(f"image {image_dir} is not committed (no {COMMITTED} marker): "
                         "its checkpoint did not finish",
                         "restore from an earlier committed image")
    try:
        data = man_path.read_bytes()
        marker = json.loads(marker_path.read_text())
    except (OSError, ValueError) as e:
        raise GpucrError(f"image {image_dir}: cannot read {MANIFEST} or {COMMITTED} ({e})",
                         "the image is damaged; restore from another copy")
    if hashlib.sha256(data).hexdigest() != marker.get("manifest_sha256"):
        raise GpucrError(f"image {image_dir}: {MANIFEST} does not match its checksum in {COMMITTED}",
                         "the image is corrupt or was edited; restore from another copy")
    try:
        m = json.loads(data)
    except ValueError as e:
        raise GpucrError(f"image {image_dir}: {MANIFEST} is not JSON ({e})",
                         "restore from another copy")
    if m.get("format") != FORMAT or m.get("format_version", 0) > FORMAT_VERSION:
        raise GpucrError(f"image {image_dir} has format {m.get('format')} "
                         f"v{m.get('format_version')}, this gpucr-hpc {__version__} reads "
                         f"{FORMAT} v{FORMAT_VERSION}", "restore with a newer gpucr-hpc")
    return m
