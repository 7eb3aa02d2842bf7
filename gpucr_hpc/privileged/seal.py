"""The seal: root's word that CRIU files are what the helper dumped for this caller.

An HMAC with the node key (`/etc/gpucr-hpc/image.key`, root's, the same file on
every node) over the caller's uid and each file's name, size and sha256. A
restore checks the seal itself first, before anything else of the caller's is
read, and then copies exactly the sealed files, each no longer than its sealed
size: root's scratch copy is bounded by what root wrote (a sparse or grown file
is refused at its first byte too many), and no name outside the image is ever
opened.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.privileged.user_dirs import Caller, open_file

KEY_FILE = Path("/etc/gpucr-hpc/image.key")
SEAL = "gpucr-seal"
VERSION = 2
CHUNK = 8 << 20
MAX_SEAL_BYTES = 1 << 20
NO_SEAL_FIX = "restore an image that gpucr-hpc checkpointed for you"
CHANGED_FIX = "restore an unchanged image that gpucr-hpc checkpointed for you"


def _key() -> bytes:
    try:
        key = KEY_FILE.read_bytes()
    except OSError:
        raise GpucrError(f"the node key {KEY_FILE} is missing",
                         "run make install as root (it creates it) and copy it to every node")
    if len(key) < 32:
        raise GpucrError(f"the node key {KEY_FILE} is shorter than 32 bytes", "recreate it: make install")
    return key


def _mac(uid: int, groups: list[int], files: dict[str, list]) -> str:
    text = (f"v{VERSION}\nuid={uid}\ngroups={','.join(map(str, sorted(groups)))}\n"
            + "".join(f"{n} {s} {d}\n" for n, (s, d) in sorted(files.items())))
    return hmac.new(_key(), text.encode(), hashlib.sha256).hexdigest()


def plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name \
        and "\n" not in name and " " not in name


def seal(images_fd: int, who: Caller, groups: frozenset[int]) -> None:
    """Seal root's finished dump in images_fd (a directory only root can reach);
    groups: those the dumped tree held, which CRIU gives back at a restore."""
    files: dict[str, list] = {}
    for name in sorted(os.listdir(images_fd)):
        if not plain_name(name):
            raise GpucrError(f"CRIU wrote a file named {name!r}", "report this with the dump log")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=images_fd)
        h, size = hashlib.sha256(), 0
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                size += len(chunk)
        files[name] = [size, h.hexdigest()]
    held = sorted(groups)
    rec = {"version": VERSION, "uid": who.uid, "groups": held, "files": files, "mac": _mac(who.uid, held, files)}
    fd = os.open(SEAL, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=images_fd)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(rec) + "\n")


def sealed_files(src_fd: int, who: Caller) -> dict[str, list]:
    """The caller's seal, checked: {name: [size, sha256]} of the files it vouches for."""
    try:
        fd = open_file(src_fd, SEAL, who)
        with os.fdopen(fd, "rb") as f:
            rec = json.loads(f.read(MAX_SEAL_BYTES))
        files, groups = rec["files"], rec["groups"]
        good = (rec.get("version") == VERSION and isinstance(files, dict)
                and isinstance(groups, list) and all(isinstance(g, int) for g in groups)
                and all(plain_name(n) and isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)
                        and v[0] >= 0 and isinstance(v[1], str) for n, v in files.items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, GpucrError):
        good, rec, files, groups = False, {}, {}, []
    if not good:
        raise GpucrError("the image's CRIU files carry no valid seal of this cluster (or one of an older "
                         "gpucr-hpc)", NO_SEAL_FIX)
    if rec.get("uid") != who.uid or not hmac.compare_digest(str(rec.get("mac")), _mac(who.uid, groups, files)):
        raise GpucrError(f"the image's seal was changed, or was made for uid {rec.get('uid')} (you are uid "
                         f"{who.uid})", CHANGED_FIX)
    lost = sorted(set(groups) - who.gids)
    if lost:
        raise GpucrError(f"the checkpoint's processes hold group {lost[0]}, which you no longer have",
                         "restore a checkpoint made since your groups changed, or ask an admin")
    return files


def sealed_bytes(src_fd: int, who: Caller) -> int:
    return sum(size for size, _ in sealed_files(src_fd, who).values())


def copy_verified(src_fd: int, dst_fd: int, who: Caller) -> None:
    """Copy the caller's sealed CRIU files into dst_fd (root's), checked as they go."""
    for name, (size, digest) in sorted(sealed_files(src_fd, who).items()):
        try:
            fd = open_file(src_fd, name, who)
        except OSError as e:
            raise GpucrError(f"cannot read image file {name}: {e.strerror}", "restore from another copy")
        with os.fdopen(fd, "rb") as f:
            actual = os.fstat(f.fileno()).st_size
            if actual != size:
                raise GpucrError(f"image file {name} has {actual} bytes, sealed with {size}: it was changed "
                                 "since the checkpoint", CHANGED_FIX)
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                          dir_fd=dst_fd)
            h, left = hashlib.sha256(), size
            with os.fdopen(out, "wb") as g:
                while left and (chunk := f.read(min(CHUNK, left))):
                    h.update(chunk)
                    g.write(chunk)
                    left -= len(chunk)
            if left or f.read(1) or not hmac.compare_digest(h.hexdigest(), digest):
                raise GpucrError(f"image file {name} was changed since the checkpoint", CHANGED_FIX)
