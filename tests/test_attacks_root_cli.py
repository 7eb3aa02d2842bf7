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


# -- a job Slurm forgot, brought back by root: whose it is comes from its directory -------

@pytest.fixture
def forgotten_job(users, users_tmp, monkeypatch):
    """A site whose image root holds job 4242, which Slurm no longer knows: its
    directory the user's (the plugin made it), everything in it written by the user."""
    etc = users_tmp / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=gpucrattack\n")
    root = users_tmp / "images"
    root.mkdir(mode=0o755)
    (etc / "plugstack.conf").write_text(f"required /opt/gpucr-hpc/lib/gpucr/spank_gpucr.so imageroot={root}\n")
    monkeypatch.setenv("SLURM_CONF", str(etc / "slurm.conf"))
    user = users[0]
    job_dir = owned_dir(root / "4242", user)
    job_dir.chmod(0o700)
    gen = owned_dir(job_dir / "gen-1", user)
    return user, gen


def crafted(gen: Path, user, owner_uid, script: str | None = "#!/bin/sh\nid -u > /tmp/gpucr-attack-ran\n") -> None:
    from gpucr_hpc.store import manifest as mf

    m = {"format": mf.FORMAT, "format_version": mf.FORMAT_VERSION, "owner_uid": owner_uid, "nodes": ["n1"],
         "units": {"rank-0": {}},
         "job": {"std_out": "/tmp/gpucr-attack.out", "partition": "debug"}}
    mf.commit(gen, m)
    if script is not None:
        (gen / "script").write_text(script)
    for p in [gen, *gen.iterdir()]:
        os.lchown(p, user.pw_uid, user.pw_gid)


@pytest.mark.parametrize("owner_uid", [0, None, "other"])
def test_a_forgotten_job_is_never_submitted_as_anyone_but_its_directorys_owner(forgotten_job, users, owner_uid):
    """The user's own manifest names root (or nobody, or another user) as the owner:
    root's `restore JOBID` must not submit the user's script as that uid."""
    from gpucr_hpc.job.checkpoint import coordinator

    user, gen = forgotten_job
    crafted(gen, user, users[1].pw_uid if owner_uid == "other" else owner_uid)
    with pytest.raises(GpucrError) as e:
        coordinator.resubmit("4242")
    assert f"belongs to uid {user.pw_uid}" in e.value.cause, e.value.one_line()


def test_a_forgotten_jobs_script_is_read_as_its_user(forgotten_job, secret):
    """The script's copy is a link to a root-only file: root never reads it for them."""
    from gpucr_hpc.job.checkpoint import coordinator

    user, gen = forgotten_job
    crafted(gen, user, user.pw_uid, script=None)
    (gen / "script").symlink_to(secret)
    with pytest.raises(GpucrError) as e:
        coordinator.resubmit("4242")
    assert "script" in e.value.cause, e.value.one_line()
    untouched(secret)


def test_roots_image_of_a_users_process_is_given_to_them_without_following_their_links(users, users_tmp, secret):
    """Root's `checkpoint --pid` of a user's process hands the image to the user; the
    process's user writes into part of it (the arena folder) meanwhile."""
    from gpucr_hpc.store.files import chown_tree

    user = users[0]
    image = users_tmp / "image"
    (image / "criu").mkdir(parents=True)
    (image / "criu" / "pages-1.img").write_text("pages")
    arena = owned_dir(image / "process-7.arena", user)
    os.link(secret, arena / "0")  # a hard link to a root-only file, in a folder the user writes
    (arena / "1").symlink_to(secret)
    chown_tree(image, user.pw_uid)
    untouched(secret)
    assert (image / "criu" / "pages-1.img").stat().st_uid == user.pw_uid
    assert image.stat().st_uid == user.pw_uid and (image / "criu").stat().st_uid == user.pw_uid
