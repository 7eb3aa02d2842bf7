"""A Slurm job id as it names a job's directories: digits only, checked before
it is used in a path (never "..", never "14/../15")."""

from __future__ import annotations

import re

from gpucr_hpc.errors import GpucrError

_JOB_ID = re.compile(r"[0-9]+", re.ASCII)


def check_job_id(value: str) -> str:
    """A Slurm job id (digits only; array and het forms are resolved before), as Slurm spells it."""
    if not isinstance(value, str) or not _JOB_ID.fullmatch(value):
        raise GpucrError(f"'{value}' is not a job id", "give the numeric Slurm job id")
    return str(int(value))
