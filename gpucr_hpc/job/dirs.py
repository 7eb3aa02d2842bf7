"""A job's directory in the image store, <image root>/<jobid>: its user's alone.

The SPANK plugin makes it as root when a `--gpucr=on` step starts (owned by
the job's user, mode 0700; spank/imagedir.c). Whatever writes there later
checks it first, on a descriptor opened without following symlinks: owned
by the job's user and writable by no one else. Another user may have made
it ahead of the job (an image root of mode 1777), or planted a symlink
there; such a directory is refused with one line and never used.

Job ids reach paths only through `check_job_id`: "..", "14/../15" and the
like are refused before any path is built from them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.privileged.user_dirs import Caller, acting_as
from gpucr_hpc.slurm.job_ids import check_job_id

NOT_OURS_FIX = ("it was not made by gpucr-hpc and is not used (nothing was written there); "
                "ask an admin to move it away")


@contextmanager
def as_owner(uid: int) -> Iterator[None]:
    """Root (an admin, the operator door) acting in a job's directory does so as the
    job's user: the kernel checks each step as theirs, and what it makes is theirs
    from the start, never chowned afterwards (a name the user could swap for a link)."""
    if os.geteuid() != 0 or uid == 0:
        yield
        return
    try:
        pw = pwd.getpwuid(uid)
        who = Caller(uid, pw.pw_gid, frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid)))
    except KeyError:
        who = Caller(uid, uid, frozenset({uid}))
    with acting_as(who):
        yield


def owner(job_dir: Path) -> int:
    """The uid that owns the job's directory (never through a link)."""
    try:
        fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise GpucrError(f"{job_dir} holds no checkpoint of the job ({e.strerror})",
                         "check the job id; gpucr-hpc ls lists the checkpoints") from e
    try:
        return os.fstat(fd).st_uid
    finally:
        os.close(fd)


def job_id_argument(ctx, param, value):
    """click callback of every JOBID argument."""
    return None if value is None else check_job_id(value)


def _refusal(path: Path, st: os.stat_result, uid: int) -> GpucrError | None:
    if st.st_uid != uid:
        return GpucrError(f"{path} belongs to uid {st.st_uid}, not to the job's user (uid {uid})",
                          NOT_OURS_FIX)
    if st.st_mode & 0o022:
        return GpucrError(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})",
                          NOT_OURS_FIX)
    return None


def _open_checked(path: Path, uid: int, made: bool) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:  # ELOOP: a symlink; ENOTDIR: a file
        raise GpucrError(f"{path} is not a directory ({e.strerror})", NOT_OURS_FIX) from e
    try:
        if made and os.geteuid() == 0:
            os.fchown(fd, uid, -1)
        st = os.fstat(fd)
        refusal = _refusal(path, st, uid)
        if refusal:
            raise refusal
        if st.st_mode & 0o077:  # the user's own, written by no one else: only made private
            os.fchmod(fd, 0o700)
    except OSError as e:
        raise GpucrError(f"cannot check {path}: {e.strerror}",
                         "only the job's owner or root can use it") from e
    finally:
        os.close(fd)


def check(job_dir: Path, uid: int) -> bool:
    """True if the job's directory exists and is its user's alone; False if it does
    not exist; a GpucrError if it exists and is not (then it must not be used)."""
    try:
        os.lstat(job_dir)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise GpucrError(f"cannot check {job_dir}: {e.strerror}",
                         "only the job's owner or root can use it") from e
    _open_checked(Path(job_dir), uid, made=False)
    return True


def ensure(job_dir: Path, uid: int) -> Path:
    """The job's directory, checked; made (0700, the job user's) where the plugin
    did not make it (an image root of mode 1777)."""
    job_dir = Path(job_dir)
    try:
        os.mkdir(job_dir, 0o700)
        made = True
    except FileExistsError:
        made = False
    except OSError as e:
        raise GpucrError(f"cannot create {job_dir}: {e.strerror}",
                         "the plugin makes it when a --gpucr=on job starts; check the image root "
                         "(plugstack.conf imageroot=) and its permissions") from e
    _open_checked(job_dir, uid, made)
    return job_dir


def fresh_folder(folder: Path) -> Path:
    """`folder` in a job's directory, emptied of an earlier restore's and made anew (mode 0700)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    return folder
