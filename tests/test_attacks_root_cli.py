"""Root's gpucr-hpc (an admin, or the operator door) acting on a user's job writes
into the job's directory only as the job's user: a file the user linked there in
place of one of ours (a hard link to a root-only file, as a site without
fs.protected_hardlinks allows; a symlink) is never written, nor given to them."""

import os
from pathlib import Path

import pytest
from user_helpers import owned_dir

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import events, generations
from gpucr_hpc.job import lock as job_lock


@pytest.fixture
def job_dir(users, users_tmp):
    d = owned_dir(users_tmp / "1234", users[0])
    d.chmod(0o700)
    return d


@pytest.fixture
def secret(users_tmp):
    """A root-only file on the job directory's file system (hard links cannot cross one)."""
    vault = users_tmp / "vault"
    vault.mkdir(mode=0o700)
    f = vault / "secret"
    f.write_text("root data\n")
    f.chmod(0o600)
    return f


def untouched(secret: Path) -> None:
    st = secret.stat()
    assert (st.st_uid, st.st_mode & 0o777, secret.read_text()) == (0, 0o600, "root data\n")


def test_events_linked_to_a_root_file(users, job_dir, secret):
    os.link(secret, job_dir / events.EVENTS)
    events.record(job_dir, users[0].pw_uid, what="checkpoint", ok=True)
    untouched(secret)


def test_lock_linked_to_a_root_file(users, job_dir, secret):
    os.link(secret, job_dir / job_lock.LOCK_NAME)
    with pytest.raises(GpucrError), job_lock.held(job_dir, "1234", users[0].pw_uid):
        pass
    untouched(secret)


def test_restore_pointer_linked_to_a_root_file(users, job_dir, secret):
    from gpucr_hpc.job import dirs as job_dirs

    (job_dir / generations.RESTORE).symlink_to(secret)
    os.lchown(job_dir / generations.RESTORE, users[0].pw_uid, users[0].pw_gid)
    with job_dirs.as_owner(users[0].pw_uid):
        generations.write_pointer(job_dir, generations.RESTORE, job_dir / "gen-1", None)
    untouched(secret)
    assert (job_dir / generations.RESTORE).lstat().st_uid == users[0].pw_uid
    assert (job_dir / generations.RESTORE).read_text() == "gen-1\n"
