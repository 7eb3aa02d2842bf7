"""The staging tier: node memory a preemption writes its units to first.

A site names it in plugstack.conf (stage=, a tmpfs directory on every node,
root's and writable by root only; %n is the node's name; not hugetlbfs, which
takes no write(2), so CRIU could write no image there) and caps
what staged checkpoints may take of it (stage_cap=: a share such as 50% of the
file system, or a size such as 64G). A unit that would not fit under the cap
is written straight to the image root, as without a staging tier.

Layout: <stage>/<jobid>/gen-N/<unit>, the unit's whole image (the same files
the image root would get). The plugin makes <stage>/<jobid> as root when a
step of the job starts on the node (the job user's, 0700; spank/imagedir.c)
and removes it when the job has ended there and its drain is done
(spank/drain_spawn.c). Nothing here makes it: a job stages only into one that
is there, a directory (not a link), its own (this process's euid) and
writable by no one else (usable()); else its units go to the image root.

A restore on the node that staged a unit reads it there (job/restore/unit_source.py)
under a shared flock of <stage>/<jobid>/gen-N; the drain takes it exclusively
before it removes the folder, so node memory is never pulled from under a
restore that reads it.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.slurm.site import Site, expand
from gpucr_hpc.store.mounts import UNWRITABLE_FS, fs_type

MARGIN = 1.2  # CRIU's image of anonymous memory against that memory (its own records)


def job_stage(site: Site, jobid: str, node: str | None = None) -> Path | None:
    """<stage>/<jobid> on the node, or None where the site has no staging tier."""
    if not site.stage:
        return None
    return Path(expand(site.stage, node)) / str(jobid)


def refusal(folder: Path) -> GpucrError | None:
    """Why <stage>/<jobid> is not as the plugin made it for this process's user (a
    directory, not a symlink, owned by the euid, not writable by group or others);
    None when it is."""
    try:
        st = os.lstat(folder)
    except OSError as e:
        return GpucrError(f"cannot check {folder}: {e.strerror}", "the job epilog drains it as the job's user")
    if not stat.S_ISDIR(st.st_mode):
        return GpucrError(f"{folder} is not a directory", "nothing is drained from it; ask an admin to remove it")
    if st.st_uid != os.geteuid():
        return GpucrError(f"{folder} belongs to uid {st.st_uid}, this drain runs as uid {os.geteuid()}",
                          "the job epilog drains it as the job's user; run it as that user, never as root")
    if st.st_mode & 0o022:
        return GpucrError(f"{folder} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})",
                          "nothing is drained from it; ask an admin to remove it")
    return None


def usable(folder: Path | None) -> bool:
    """<stage>/<jobid> as the plugin made it for this process's user (refusal)."""
    return folder is not None and refusal(folder) is None


@contextmanager
def held(folder: Path, exclusive: bool) -> Iterator[None]:
    """A staged generation's folder, read (shared) or about to go (exclusive); the
    lock dies with its holder, so a killed restore never blocks a drain."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def cap_bytes(cap: str, fs_bytes: int) -> int:
    """stage_cap= in bytes: `50%` of the staging file system, or `64G`, `512M`, `1T`, bytes
    (what spank/site_config.c lets through)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(%|[KMGT])?", cap or "", re.I)
    if not m:
        raise GpucrError(f"stage_cap={cap!r} in plugstack.conf is neither a share (50%) nor a size (64G)",
                         "fix stage_cap= on the gpucr plugin's line")
    value, unit = float(m.group(1)), (m.group(2) or "").upper()
    if unit == "%":
        return int(fs_bytes * min(value, 100.0) / 100)
    return int(value * 1024 ** " KMGT".index(unit or " "))


def used_bytes(root: Path) -> int:
    """What staged checkpoints of every job take under the stage root now: the memory
    of their files, not their sizes (a .h5 file's metadata staged beside the arena's
    own files has the size of the whole file, and holes where the data would go)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def image_bytes(pids: list[int]) -> int:
    """About what a unit's image of these processes takes: their shared memory as it
    is (the arena, which holds the GPU data, and /dev/shm segments: written byte
    for byte) and their anonymous memory with MARGIN for CRIU's records. Pages
    of files (libraries: CUDA's alone are GBs) are not in an image. A 43.8 GiB
    job, counted as 1.2 x its whole resident memory, did not fit a staging tier
    of 56 GiB that its 46 GiB image fitted (H100 run, 2026-11-27)."""
    shared = anon = 0
    for pid in pids:
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if line.startswith(("RssAnon:", "RssShmem:")))
            anon += int(fields["RssAnon"].split()[0]) << 10
            shared += int(fields["RssShmem"].split()[0]) << 10
        except (OSError, KeyError, ValueError, IndexError):
            pass  # gone, or a kernel without these lines: counts nothing
    return shared + int(anon * MARGIN)


class Budget:
    """What this node's staging tier can still take, handed out unit by unit."""

    def __init__(self, site: Site, jobid: str):
        self.dir = job_stage(site, jobid)
        self.left = 0
        if not usable(self.dir):  # none made for this job here, or not this user's alone
            self.dir = None
            return
        assert self.dir is not None
        root = self.dir.parent
        try:
            st = os.statvfs(root)
        except OSError:
            self.dir = None  # no such directory on this node: straight to the image root
            return
        if fs_type(root) in UNWRITABLE_FS:  # `gpucr-hpc doctor` says so; the image root takes it
            self.dir = None
            return
        cap = cap_bytes(site.stage_cap, st.f_blocks * st.f_frsize)
        self.left = min(cap - used_bytes(root), st.f_bavail * st.f_frsize)

    def take(self, need: int) -> bool:
        """Whether a unit of about `need` bytes (image_bytes) is staged (and counted)."""
        if self.dir is None or need > self.left:
            return False
        self.left -= need
        return True
