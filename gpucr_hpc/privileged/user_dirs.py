"""The caller's directories, touched only as the caller.

Root never opens, reads or writes a path of the caller's with root's rights:
every such step runs with the caller's effective uid, gid and groups (the
kernel checks the access as theirs), and files it makes are theirs from the
start, so nothing is chowned by name afterwards (a name a caller can swap for a
link between two calls). Root's own files reach them through descriptors root
opened, never through paths. The real and saved uids stay root's: the caller
cannot signal or trace the helper while it acts for them.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.regular_file import NOT_REGULAR, open_regular

CHUNK = 8 << 20


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    gids: frozenset[int]


@contextmanager
def acting_as(who: Caller) -> Iterator[None]:
    groups = os.getgroups()
    os.setgroups(sorted(who.gids))
    os.setegid(who.gid)
    os.seteuid(who.uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


def open_dir(path: str, who: Caller) -> int:
    """An fd of the caller's own directory, opened as the caller, never through a link."""
    try:
        with acting_as(who):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise GpucrError(f"cannot open directory {path!r}: {e.strerror}", "give a directory of your own")
    owner = os.fstat(fd).st_uid
    if owner != who.uid:
        os.close(fd)
        raise GpucrError(f"{path} belongs to uid {owner}, not to you (uid {who.uid})",
                         "use your own image directory")
    return fd


def open_file(dir_fd: int, name: str, who: Caller) -> int:
    """A regular file of the caller's directory, for reading, opened as the caller."""
    try:
        with acting_as(who):
            return open_regular(name, dir_fd=dir_fd)
    except OSError as e:
        if e.errno != NOT_REGULAR:
            raise
        raise GpucrError(f"image file {name} is not a regular file", "restore from another copy") from e


def write_new(dir_fd: int, name: str, who: Caller, data: bytes | None = None, src_fd: int | None = None) -> None:
    """`name` in the caller's directory, made anew as the caller (an old file or
    link of that name is removed first, never followed), from data or src_fd."""
    with acting_as(who):
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                      dir_fd=dir_fd)
        with os.fdopen(out, "wb") as g:
            if data is not None:
                g.write(data)
            if src_fd is not None:
                with os.fdopen(os.dup(src_fd), "rb") as f:
                    shutil.copyfileobj(f, g, CHUNK)


def replace(dir_fd: int, name: str, who: Caller, data: bytes) -> None:
    """`name` in the caller's directory replaced whole (renamed into place), as the caller."""
    tmp = f".{name}.{os.getpid()}"
    write_new(dir_fd, tmp, who, data)
    with acting_as(who):
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def hand_over(src_fd: int, dst_fd: int, who: Caller) -> None:
    """Move root's finished files (in a directory only root can reach, src_fd) into
    the caller's directory. They are given to the caller first, through their
    descriptors; then, as the caller, renamed across (same file system) or copied."""
    names = sorted(os.listdir(src_fd))
    for name in names:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src_fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise GpucrError(f"CRIU left {name}, which is not a regular file", "report this with the dump log")
            os.fchown(fd, who.uid, who.gid)
        finally:
            os.close(fd)
    os.fchown(src_fd, who.uid, who.gid)  # the caller may now move out of it: only through this fd
    for name in names:
        try:
            with acting_as(who):
                os.rename(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src_fd)
            try:
                write_new(dst_fd, name, who, src_fd=fd)
            finally:
                os.close(fd)
