"""The durable image store: one directory per checkpoint image.

Layout of an image directory:

    manifest.json        vendor, GPU, sizes, sha256 of every file, owner, ...
    process-<pid>.h5     GPU buffers of one process (store/gpu_data.py), GPU processes only
    criu/                CRIU images of the process tree
    COMMITTED            written last; holds the sha256 of manifest.json

A job's image in node memory (the staging tier) may hold a process's GPU buffers
in two parts instead of its .h5 file: the arena's own files, linked there as the
process ended (no copy), and the .h5 file's metadata with holes where the
buffers go. Its manifest lists the .h5 file with an `arena` entry naming them:

    process-<pid>.layout.h5       the metadata (gpu_data.save_layout)
    process-<pid>.arena/<k>       the k-th segment of the process's arena

The drain joins them into the .h5 file on the image root (gpu_data.compose); a
restore on the same node maps the segments as the arena (arena_fill.adopt).

Writing goes through `ImageWriter`: files are streamed in with their sha256
computed on the way (one pass, so the checksum costs no extra read), one per
64 MiB block so that several threads share the work, and the manifest +
COMMITTED are written atomically at the end. Reading goes through
`open_image`, which checks, before anything is touched: the image is committed,
owned by the caller (root may open any), and every file has its recorded size
and checksum. Nothing here ever writes into an image that has been committed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.store import manifest as mf
from gpucr_hpc.store import writeback

CRIU_SUBDIR = "criu"
COPY_CHUNK = 16 << 20
HASH_BLOCK = 64 << 20   # large files are checksummed per block, in parallel
HASH_WORKERS = 8


def full_disk(e: BaseException, where: Path) -> GpucrError | None:
    """The one line for a write that found its file system full or over quota, naming
    the place and what is free there; None for any other error."""
    if not isinstance(e, OSError) or e.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    place = Path(e.filename) if e.filename else where
    probe = next((p for p in (place, *place.parents) if p.exists()), place)
    try:
        free = f"{os.statvfs(probe).f_bavail * os.statvfs(probe).f_frsize / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    what = "over its quota" if e.errno == errno.EDQUOT else "full"
    return GpucrError(f"the file system of {where} is {what} ({free})",
                      "free space there or raise the quota, then try again")


def process_h5_name(pid: int) -> str:
    return f"process-{pid}.h5"


def layout_name(pid: int) -> str:
    return f"process-{pid}.layout.h5"


def arena_name(pid: int, k: int) -> str:
    return f"process-{pid}.arena/{k}"


def outside(rel: str) -> bool:
    """Whether a name from a manifest would lead out of its image (or is empty)."""
    return not rel or ".." in Path(rel).parts or Path(rel).is_absolute()


def arena_parts(rec: dict) -> list[tuple[str, int, int]]:
    """A manifest file record's arena segments (file, address, size); [] for a whole file."""
    return [(str(f), int(a), int(n)) for f, a, n in (rec.get("arena") or {}).get("segments") or ()]


def prepare_new(path: Path) -> Path:
    """Create the directory for a new image; refuses to overwrite anything."""
    path = Path(path).absolute()
    if path.exists():
        if not path.is_dir():
            raise GpucrError(f"{path} exists and is not a directory",
                             "give checkpoint --to a new or empty directory")
        if any(path.iterdir()):
            what = "a committed image" if (path / mf.COMMITTED).exists() else "files"
            raise GpucrError(f"{path} already holds {what}",
                             "give checkpoint --to a new or empty directory (images are never overwritten)")
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=0o700)
        except OSError as e:
            raise GpucrError(f"cannot create image directory {path}: {e.strerror}",
                             "check the path and its permissions")
    return path


def copy_with_block_sha256(src: Path, dst: Path, workers: int = HASH_WORKERS,
                           nofollow: bool = False) -> tuple[int, list[str]]:
    """Copy src to a new file dst (fsync'd), returning (size, sha256 of each HASH_BLOCK).
    nofollow: src must be a regular file itself, not a symlink to one (ELOOP).

    Several workers take whole blocks: each reads its block, hashes it, writes it
    and hands it to the disk at once (hashlib, pread and pwrite release the GIL),
    so hashing runs beside the disk instead of before or after it."""
    fi = os.open(src, os.O_RDONLY | os.O_CLOEXEC | (os.O_NOFOLLOW | os.O_NONBLOCK if nofollow else 0))
    try:
        st = os.fstat(fi)
        if nofollow and not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{src} is not a regular file")
        size = st.st_size
        blocks = (size + HASH_BLOCK - 1) // HASH_BLOCK
        fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            def one(i: int) -> str:
                h = hashlib.sha256()
                off, end = i * HASH_BLOCK, min(size, (i + 1) * HASH_BLOCK)
                while off < end:
                    data = os.pread(fi, min(COPY_CHUNK, end - off), off)
                    if not data:
                        raise OSError(errno.EIO, f"{src}: short read at offset {off}")
                    h.update(data)
                    view, at = memoryview(data), off
                    while view:
                        n = os.pwrite(fo, view, at)
                        view, at = view[n:], at + n
                    writeback.start(fo, off, len(data))
                    off += len(data)
                return h.hexdigest()

            with ThreadPoolExecutor(max_workers=max(1, min(workers, blocks))) as ex:
                digests = list(ex.map(one, range(blocks)))
            os.fsync(fo)
            os.fchmod(fo, st.st_mode & 0o777 | 0o600)
        finally:
            os.close(fo)
    finally:
        os.close(fi)
    return size, digests


def block_digests(path: Path, workers: int = HASH_WORKERS) -> list[str]:
    """sha256 of each HASH_BLOCK of a file, several blocks at a time (hashlib and
    pread release the GIL): one sha256 stream runs at ~1 GB/s, too slow for GPU data."""
    size = os.stat(path).st_size
    fd = os.open(path, os.O_RDONLY)

    def one(i: int) -> str:
        h = hashlib.sha256()
        off, end = i * HASH_BLOCK, min(size, (i + 1) * HASH_BLOCK)
        while off < end:
            data = os.pread(fd, min(8 << 20, end - off), off)
            if not data:
                raise OSError(f"{path}: short read at offset {off}")
            h.update(data)
            off += len(data)
        return h.hexdigest()

    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
            return list(ex.map(one, range((size + HASH_BLOCK - 1) // HASH_BLOCK)))
    finally:
        os.close(fd)


def fsync_and_sha256(path: Path) -> tuple[int, str]:
    """fsync a just-written file while hashing it (from the page cache) in parallel."""
    with open(path, "rb") as f, ThreadPoolExecutor(max_workers=1) as ex:
        synced = ex.submit(os.fsync, f.fileno())
        digest = mf.sha256_file(path)
        synced.result()
        size = os.fstat(f.fileno()).st_size
    return size, digest


class ImageWriter:
    """Builds one image directory; `commit()` makes it visible as complete."""

    def __init__(self, path: Path, manifest: dict):
        self.path = prepare_new(path)
        self.manifest = manifest

    def add_copy(self, src: Path, rel: str) -> int:
        dst = self.path / rel
        dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        size, digests = copy_with_block_sha256(src, dst)
        self._record_blocks(rel, size, digests)
        return size

    def add_tree(self, src_dir: Path, rel_dir: str) -> int:
        """Copy every regular file under src_dir into rel_dir; returns bytes copied."""
        total = 0
        src_dir = Path(src_dir)
        for root, _dirs, files in os.walk(src_dir):
            for name in sorted(files):
                src = Path(root) / name
                rel = str(Path(rel_dir) / src.relative_to(src_dir))
                total += self.add_copy(src, rel)
        return total

    def add_written(self, rel: str) -> int:
        """Record a file already written into the image (e.g. an HDF5 file), fsync'ing it."""
        size, digest = fsync_and_sha256(self.path / rel)
        mf.add_file(self.manifest, rel, size, digest)
        return size

    def add_unhashed(self, rel: str) -> int:
        """Record a file written into an image in node memory by its size alone: the
        drain to the image root checksums it (store/drain.py)."""
        size = (self.path / rel).stat().st_size
        self.manifest["files"][rel] = {"size": size}
        self.manifest["total_bytes"] = sum(f["size"] for f in self.manifest["files"].values())
        return size

    def add_arena(self, rel: str, layout: str, segments: list[tuple[str, int, int]]) -> int:
        """Record the .h5 file `rel` as its two parts in node memory (the module doc):
        its metadata `layout` and the arena's segment files (file, address, size)."""
        size = (self.path / layout).stat().st_size
        self.manifest["files"][rel] = {"size": size, "arena": {
            "layout": layout, "segments": [[f, a, n] for f, a, n in segments]}}
        self.manifest["total_bytes"] = sum(f["size"] for f in self.manifest["files"].values())
        return size

    def add_blocks(self, rel: str, size: int, digests: list[str]) -> int:
        """Record a file already written and fsync'd into the image, with the sha256 of
        each of its HASH_BLOCKs (block_digests, made while it was fsync'd)."""
        have = (self.path / rel).stat().st_size
        if have != size or len(digests) != (size + HASH_BLOCK - 1) // HASH_BLOCK:
            raise GpucrError(f"{self.path / rel} has {have} bytes, {size} were written",
                             "check the file system and checkpoint again")
        self._record_blocks(rel, size, digests)
        return size

    def _record_blocks(self, rel: str, size: int, digests: list[str]) -> None:
        self.manifest["files"][rel] = {"size": size, "sha256_blocks": list(digests),
                                       "block_bytes": HASH_BLOCK}
        self.manifest["total_bytes"] = sum(f["size"] for f in self.manifest["files"].values())

    def commit(self) -> None:
        for root, dirs, _files in os.walk(self.path):
            for d in dirs:
                mf.fsync_dir(Path(root) / d)
        mf.commit(self.path, self.manifest)
        if self.manifest.get("owner_uid") not in (None, os.geteuid()) and os.geteuid() == 0:
            chown_tree(self.path, self.manifest["owner_uid"])


def chown_tree(path: Path, uid: int) -> None:
    """Root's image of a user's process given to that user: through descriptors, never
    following a link (the process's user writes into parts of it, its arena folder,
    and may swap a name for a link meanwhile). A root-owned file with a second link
    is not one root wrote here, and is left as it is."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, -1)
        _chown_below(fd, uid)
    finally:
        os.close(fd)


def _chown_below(dir_fd: int, uid: int) -> None:
    for entry in os.scandir(dir_fd):
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(entry.name, flags | (os.O_DIRECTORY if entry.is_dir(follow_symlinks=False) else 0),
                         dir_fd=dir_fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                continue  # a link, or swapped for one: not ours to give
            raise
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                os.fchown(fd, uid, -1)
                _chown_below(fd, uid)
            elif stat.S_ISREG(st.st_mode) and not (st.st_uid == 0 and st.st_nlink > 1):
                os.fchown(fd, uid, -1)
        finally:
            os.close(fd)


@dataclass
class Image:
    path: Path
    manifest: dict

    @property
    def criu_dir(self) -> Path:
        return self.path / CRIU_SUBDIR


def check_owner(path: Path, manifest: dict | None, euid: int | None = None) -> None:
    """An image belongs to the user who owns it; only they and root may restore it."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return
    try:
        st_uid = Path(path).stat().st_uid
    except OSError:
        return  # missing: mf.load says so
    owner = (manifest or {}).get("owner_uid")
    for uid in (st_uid, owner):
        if uid is not None and uid != euid:
            raise GpucrError(f"image {path} belongs to uid {uid}, you are uid {euid}",
                             "restore it as its owner or as root")


def verify(path: Path, manifest: dict, workers: int = 2, defer: frozenset[str] = frozenset(),
           sizes_only: bool = False) -> None:
    """Every listed file is present with its size and sha256; nothing unlisted under criu/.
    defer: files whose sha256 the caller checks itself as it reads them (the GPU data,
    gpu_image.load_process), so they are read once; their size is still checked here.
    sizes_only: an image in node memory, whose checksums the drain makes later."""
    path = Path(path)
    files = manifest.get("files") or {}
    for rel, rec in files.items():
        p = path / rel
        if outside(rel):
            raise GpucrError(f"image {path}: bad file name {rel!r} in manifest", "restore from another copy")
        if rec.get("arena"):
            _check_arena(path, rel, rec)
            continue
        if not p.is_file():
            raise GpucrError(f"image {path}: {rel} is missing", "the image is incomplete; restore from another copy")
        size = p.stat().st_size
        if size != rec["size"]:
            raise GpucrError(f"image {path}: {rel} has {size} bytes, the manifest says {rec['size']} "
                             "(truncated or corrupt)", "restore from another copy of the image")
    crit = path / CRIU_SUBDIR
    if crit.is_dir():
        for root, _d, names in os.walk(crit):
            for n in names:
                rel = str((Path(root) / n).relative_to(path))
                if rel not in files:
                    raise GpucrError(f"image {path}: {rel} is not in the manifest",
                                     "the image was changed after it was committed; restore from another copy")
    if sizes_only:
        return

    def check(item):
        rel, rec = item
        if "sha256_blocks" not in rec and "sha256" not in rec:
            raise GpucrError(f"image {path}: {rel} has no checksum (an image in node memory, never drained)",
                             "restore from the image root's copy once it is drained")
        if "sha256_blocks" in rec:
            if rec.get("block_bytes") != HASH_BLOCK:
                raise GpucrError(f"image {path}: {rel} was checksummed in blocks of {rec.get('block_bytes')} "
                                 "bytes, this gpucr-hpc uses another size", "restore with the gpucr-hpc that wrote it")
            return rel, rec["sha256_blocks"], block_digests(path / rel)
        return rel, rec["sha256"], mf.sha256_file(path / rel)

    # Largest first, so the two workers finish together.
    items = sorted(((rel, rec) for rel, rec in files.items() if rel not in defer), key=lambda kv: -kv[1]["size"])
    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        for rel, want, got in ex.map(check, items):
            if want != got:
                raise GpucrError(f"image {path}: checksum mismatch in {rel} (corrupt image)",
                                 "restore from another copy of the image")


def _check_arena(path: Path, rel: str, rec: dict) -> None:
    """A .h5 file held as its parts in node memory: each there, of its size."""
    parts = [(rec["arena"].get("layout", ""), rec["size"])] + [(f, n) for f, _, n in arena_parts(rec)]
    for part, size in parts:
        p = path / part
        if outside(part):
            raise GpucrError(f"image {path}: bad file name {part!r} in manifest", "restore from another copy")
        if not p.is_file() or p.stat().st_size != size:
            raise GpucrError(f"image {path}: {part}, a part of {rel}, is missing or not of its "
                             f"{size} bytes", "restore from another copy of the image")


def open_image(path: Path, *, verify_checksums: bool = True, defer_gpu_data: bool = False) -> Image:
    """Open a committed image for restore: committed, owned, intact, or a GpucrError.
    defer_gpu_data: the GPU data files (gpu_data_files) are checked block by block
    as the restore loads them (gpu_image.load_process), not here."""
    path = Path(path).absolute()
    check_owner(path, None)
    m = mf.load(path)
    check_owner(path, m)
    if verify_checksums:
        verify(path, m, defer=gpu_data_files(m) if defer_gpu_data else frozenset())
    return Image(path=path, manifest=m)


def gpu_data_files(m: dict) -> frozenset[str]:
    """The image's GPU data (.h5) files that carry per-block checksums."""
    files = m.get("files") or {}
    return frozenset(r["h5"] for r in m.get("gpu_processes") or []
                     if r.get("h5") and "sha256_blocks" in files.get(r["h5"], {}))


def block_checksums(m: dict, rel: str) -> tuple[list[str], int]:
    """The per-block sha256 of an image file and the block size."""
    rec = (m.get("files") or {}).get(rel) or {}
    if "sha256_blocks" not in rec or rec.get("block_bytes") != HASH_BLOCK:
        raise GpucrError(f"{rel} has no per-block checksums of {HASH_BLOCK} bytes in its manifest",
                         "restore with the gpucr-hpc that wrote it")
    return rec["sha256_blocks"], rec["block_bytes"]


def tree_digest(path: Path) -> str:
    """One sha256 over every file name, mode, owner and content under path (for tests and audits)."""
    h = hashlib.sha256()
    path = Path(path)
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for n in sorted(files):
            p = Path(root) / n
            st = p.lstat()
            h.update(f"{p.relative_to(path)}\0{st.st_mode}\0{st.st_uid}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
            h.update(mf.sha256_file(p).encode())
        for d in dirs:
            st = (Path(root) / d).lstat()
            h.update(f"{(Path(root) / d).relative_to(path)}/\0{st.st_mode}\0{st.st_uid}\0".encode())
    return h.hexdigest()
