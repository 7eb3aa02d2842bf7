"""The JOBID argument of the job commands: what Slurm takes as a job id.

A job id (1234) is taken as it is. An array task (1234_5) and a heterogeneous
job's component (1234+0) are asked of Slurm: each has a job id of its own
once it runs, and the job's checkpoints are kept under that id. Any other form
is refused by name (job/dirs.py: no job id ever reaches a path unchecked).
"""

from __future__ import annotations

from gpucr_hpc.slurm import commands as slurm


def argument(ctx, param, value):
    """click callback of the JOBID argument of every command that acts on a job."""
    if value is None:
        return None
    try:
        return slurm.resolve_job_id(value)
    except slurm.JobUnknown as e:
        raise slurm.JobUnknown(e.cause, f"{e.fix}; a job Slurm has forgotten is named by its own numeric "
                                        "job id (gpucr-hpc ls lists the jobs with checkpoints)") from e
