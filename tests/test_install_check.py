"""What root runs is root's alone, in every subfolder and through every link
(gpucr_hpc/privileged/install_check.py, scripts/install-helper).

Real files with real owners and modes: a user's file deep in a folder root runs
from, a group-writable one, a root-owned link to a user's file, and the SPANK
plugin's folder, which slurmd loads as root.
"""

import os
import subprocess
from pathlib import Path

import pytest

from gpucr_hpc.privileged import install_check

REPO = Path(__file__).resolve().parent.parent


def tree(base: Path) -> Path:
    """base/prefix/criu/root/usr/lib/x86_64-linux-gnu/libx.so, root's, 0755/0644."""
    base.chmod(0o755)
    deep = base / "prefix" / "criu" / "root" / "usr" / "lib" / "x86_64-linux-gnu"
    deep.mkdir(parents=True)
    (deep / "libx.so").write_text("")
    return base / "prefix"


def test_a_users_or_writable_file_in_any_subfolder_is_refused(users, tmp_path):
    prefix = tree(tmp_path)
    lib = prefix / "criu" / "root" / "usr" / "lib" / "x86_64-linux-gnu" / "libx.so"
    assert install_check.first_unsafe([str(prefix / "criu")]) is None
    os.chown(lib, users[0].pw_uid, -1)
    assert install_check.first_unsafe([str(prefix / "criu")]) == str(lib)
    os.chown(lib, 0, -1)
    for mode in (0o664, 0o646):
        lib.chmod(mode)
        assert install_check.first_unsafe([str(prefix / "criu")]) == str(lib)
    lib.chmod(0o644)


def test_a_root_owned_link_to_a_users_file_in_a_subfolder_is_refused(users, tmp_path):
    """The link itself is root's; what root loads through it is the user's."""
    prefix = tree(tmp_path)
    theirs = tmp_path / "home"
    theirs.mkdir(mode=0o755)
    target = theirs / "libevil.so"
    target.write_text("")
    os.chown(target, users[0].pw_uid, -1)
    link = prefix / "criu" / "root" / "usr" / "lib" / "x86_64-linux-gnu" / "libevil.so"
    link.symlink_to(target)
    assert install_check.first_unsafe([str(prefix / "criu")]) == str(target)
    os.chown(target, 0, -1)
    assert install_check.first_unsafe([str(prefix / "criu")]) is None
    theirs.chmod(0o777)  # a folder above the link's target
    assert install_check.first_unsafe([str(prefix / "criu")]) == str(theirs)
    theirs.chmod(0o755)
    os.chown(theirs, users[0].pw_uid, -1)  # a user's folder of links: each a root of its own
    (theirs / "more").mkdir()
    os.chown(theirs / "more", users[0].pw_uid, -1)
    link.unlink()
    link.symlink_to(theirs / "more")
    assert install_check.first_unsafe([str(prefix / "criu")]) == str(theirs / "more")


def test_install_helper_refuses_a_users_file_under_the_plugins_folder(users, tmp_path):
    """slurmd loads the SPANK plugin as root and it starts programs of its bindir: a file
    there another user owns is named, in one line, and nothing is written. /etc/sudoers.d
    is a private tmpfs here, so the machine's sudo rules are never touched."""
    prefix = tree(tmp_path)
    bindir = prefix / "lib" / "gpucr" / "bin"
    bindir.mkdir(parents=True)
    srun = bindir / "srun"
    srun.write_text("#!/bin/sh\n")
    os.chown(srun, users[0].pw_uid, -1)
    python = REPO / ".venv" / "bin" / "python"
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c",
         f"mount -t tmpfs none /etc/sudoers.d && exec {REPO / 'scripts' / 'install-helper'} {python}; "
         f"ls /etc/sudoers.d"],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, PREFIX=str(prefix)))
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode != 0 and len(lines) == 1, (out.stdout, out.stderr)
    assert lines[0].startswith("install-helper: error:") and str(srun) in lines[0], lines
    assert not (prefix / "libexec").exists()


@pytest.fixture(autouse=True)
def _root_only():
    if os.geteuid() != 0:
        pytest.skip("owners and modes of root's files need root")
