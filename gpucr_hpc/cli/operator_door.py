"""An operator acting on another user's job goes through the operator door
(privileged/operator.py) when the site's sudo rule opens it to them."""

from __future__ import annotations

import os
import subprocess
import sys

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.slurm import commands as slurm


def door_path() -> str:
    return config.installed("libexec", "gpucr-operator")


def _open_to_me(door: str) -> bool:
    """Asked of sudo itself (-l), never read from the wording of a refusal."""
    if not os.path.isfile(door):
        return False
    try:
        return subprocess.run(["sudo", "-n", "-l", door], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def through_door_if_not_mine(verb: str, jobid: str, *extra: str) -> None:
    """Runs the command as root through the door, instead of this process, when the
    job is another user's and the door is open to us; else returns (and the command
    refuses with its own line if the job is not ours)."""
    if os.geteuid() == 0:
        return
    try:
        job = slurm.show_job(jobid)
    except GpucrError:
        return  # a job Slurm forgot (restore brings it back) or none: the command says what is true
    door = door_path()
    if job.uid == os.geteuid() or not _open_to_me(door):
        return
    print(f"gpucr-hpc: job {jobid} is {job.user}'s: acting on it as a Slurm operator (sudo {door})",
          file=sys.stderr, flush=True)
    os.execvp("sudo", ["sudo", "-n", door, verb, jobid, *extra])
