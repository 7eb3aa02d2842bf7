"""Ordinary users for the tests: created once, commands run as them with runuser."""

import fcntl
import os
import pwd
import subprocess
import sys
from pathlib import Path

USERS = ("gpucrtest", "gpucrtest2")


def ensure_user(name: str) -> pwd.struct_passwd:
    # tests in parallel workers (pytest -n) create the same users: one at a time
    with open("/tmp/gpucr-test-users.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/bash", name],
                           check=True, capture_output=True)
            return pwd.getpwnam(name)


def as_user(user: pwd.struct_passwd, *argv, env=None, timeout=120, **kw):
    """argv run as `user` (its own uid, gid and groups), output captured."""
    return subprocess.run(["runuser", "-u", user.pw_name, "--", *argv], env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)


def gpucr_as(user, *args, env=None, timeout=300):
    return as_user(user, sys.executable, "-m", "gpucr_hpc", *args, env=env, timeout=timeout)


def owned_dir(path: Path, user) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(0o755)
    return path
