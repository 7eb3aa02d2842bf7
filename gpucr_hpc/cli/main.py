"""The `gpucr-hpc` command line.

Each group of commands lives in its own module and is registered here, so this
file stays a table of contents.
"""

import sys

import click

from gpucr_hpc import __version__, config
from gpucr_hpc.cli import output
from gpucr_hpc.errors import GpucrError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpucr-hpc")
def cli():
    """Transparent GPU checkpoint/restore for Slurm clusters."""


from gpucr_hpc.cli import process as cmd_process  # noqa: E402

cli.add_command(cmd_process.run)
cli.add_command(cmd_process.checkpoint)  # in place; --to DIR writes an image (process/image)
cli.add_command(cmd_process.restore)  # in place; --from DIR restores an image (process/image)
cli.add_command(cmd_process.status)
cli.add_command(cmd_process.copy_helper)

from gpucr_hpc.cli import job as cmd_job  # noqa: E402

cli.add_command(cmd_job.preempt)
cli.add_command(cmd_job.suspend)
cli.add_command(cmd_job.resume)
cli.add_command(cmd_job.ls)
cli.add_command(cmd_job.prune)
cli.add_command(cmd_job.drain)

from gpucr_hpc.cli import doctor as cmd_doctor  # noqa: E402

cli.add_command(cmd_doctor.doctor)


def main():
    if config.value("GPUCR_BATCH_SUPERVISE"):
        # The batch step's task of a --gpucr=on job (spank/restart.c).
        from gpucr_hpc.job.restore import batch_supervisor

        sys.exit(batch_supervisor.main())
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("gpucr-hpc: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except GpucrError as e:
        click.echo(f"gpucr-hpc: error: {e.one_line()}", err=True)
        _json_error(e.cause, e.fix, e.exit_code)
        sys.exit(e.exit_code)
    except OSError as e:  # not foreseen where it happened: still one line, never a traceback
        where = f" ({e.filename})" if e.filename else ""
        click.echo(f"gpucr-hpc: error: {type(e).__name__}: {e.strerror or e}{where}; unexpected here: "
                   "check the job or process (gpucr-hpc status), run the command again, and report "
                   "it with this line if it persists", err=True)
        _json_error(f"{type(e).__name__}: {e.strerror or e}{where}", "", 1)
        sys.exit(1)


def _json_error(cause: str, fix: str, exit_code: int) -> None:
    """With --json the report asked for is the error, as the command's one document
    (none where the command printed its own before it failed)."""
    if "--json" in sys.argv[1:] and not output.printed_json():
        output.print_json("error", {"error": " ".join(cause.split()), "fix": fix, "exit_code": exit_code})
