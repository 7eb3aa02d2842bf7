"""`gpucr-hpc checkpoint --pid PID --to DIR` and `restore --from DIR` (whole-process migration).

Kept apart from the in-place commands (`checkpoint --pid` / `restore --pid`)
until the two are merged into one `checkpoint` and one `restore` command; the
logic lives in migrate.py, this file is only the click surface.
"""

import click

from gpucr_hpc import migrate
from gpucr_hpc.errors import GpucrError


@click.command("checkpoint")
@click.option("--pid", type=int, required=True, help="Root of the process tree to checkpoint.")
@migrate.checkpoint_options
def checkpoint(pid, to_dir, leave_running, as_json):
    """Checkpoint a process tree (GPU data + CPU state) to an image directory."""
    if not to_dir:
        raise GpucrError("checkpoint --pid needs --to DIR in this build", "add --to DIR")
    migrate.run_checkpoint(pid, to_dir, leave_running, as_json)


@click.command("restore")
@migrate.restore_options
def restore(from_dir, pidns, rewind_files, as_json):
    """Restore a process tree from an image directory written by checkpoint --to."""
    if not from_dir:
        raise GpucrError("restore needs --from DIR in this build", "add --from DIR")
    migrate.run_restore(from_dir, pidns, rewind_files, as_json)
