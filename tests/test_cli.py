"""The gpucr-hpc command itself: installed, versioned, one-line errors."""

import subprocess
import sys

from gpucr_hpc import __version__


def gpucr(*args):
    return subprocess.run([sys.executable, "-m", "gpucr_hpc", *args], capture_output=True, text=True)


def test_version():
    out = gpucr("--version")
    assert out.returncode == 0
    assert __version__ in out.stdout


def test_console_script_is_installed():
    import shutil

    exe = shutil.which("gpucr-hpc") or str(__import__("pathlib").Path(sys.executable).parent / "gpucr-hpc")
    out = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "checkpoint/restore" in out.stdout


def test_unknown_option_is_one_line_error():
    out = gpucr("--no-such-option")
    assert out.returncode != 0
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("Error:")
    assert "--no-such-option" in lines[-1]


def test_with_json_an_error_is_json_too():
    """--json asks for a report: a failure is that report, as JSON on stdout, besides
    the one line on stderr."""
    import json

    out = gpucr("checkpoint", "--pid", "999999999", "--json")
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("gpucr-hpc: error: ")
    err = json.loads(out.stdout)
    assert err["error"] and err["fix"] and err["exit_code"] == out.returncode
    assert err["error"] in out.stderr
    plain = gpucr("checkpoint", "--pid", "999999999")
    assert plain.returncode != 0 and plain.stdout == ""


def test_a_long_command_shows_its_work_on_a_terminal_only(monkeypatch):
    from contextlib import nullcontext

    from gpucr_hpc.cli import output

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert isinstance(output.working("x"), nullcontext)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with output.working("checkpointing job 1 on its nodes"):
        pass


def test_the_operator_door_stays_shut_for_a_job_slurm_does_not_know(monkeypatch):
    """restore JOBID of a job Slurm forgot submits it again: the door must not stop it."""
    import os

    from gpucr_hpc.cli import operator_door
    from gpucr_hpc.errors import GpucrError

    def unknown(jobid):
        raise GpucrError(f"no job known to Slurm as {jobid}", "")

    monkeypatch.setattr(operator_door.slurm, "show_job", unknown)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    monkeypatch.setattr(os, "execvp", lambda *a: (_ for _ in ()).throw(AssertionError("went through the door")))
    assert operator_door.through_door_if_not_mine("restore", "77") is None


def test_a_json_report_then_a_failure_is_still_one_document(monkeypatch, capsys):
    """A command that prints its report and then fails (doctor with a FAIL in it):
    stdout is that one document, the error is the line on stderr and the exit status."""
    import json
    import sys

    import click
    import pytest

    from gpucr_hpc.cli import main as cli_main
    from gpucr_hpc.cli import output
    from gpucr_hpc.errors import GpucrError

    @click.command("report-then-fail")
    @click.option("--json", "as_json", is_flag=True)
    def report_then_fail(as_json):
        output.print_json("report", {"ok": False})
        raise GpucrError("1 check failed", "fix it")

    monkeypatch.setitem(cli_main.cli.commands, "report-then-fail", report_then_fail)
    monkeypatch.setattr(output, "_printed", [])
    monkeypatch.setattr(sys, "argv", ["gpucr-hpc", "report-then-fail", "--json"])
    with pytest.raises(SystemExit) as e:
        cli_main.main()
    out, err = capsys.readouterr()
    assert e.value.code == 1
    assert json.loads(out) == {"schema": "gpucr-hpc.report/1", "ok": False}, out
    assert err.strip() == "gpucr-hpc: error: 1 check failed; fix it", err


def test_an_unforeseen_os_error_with_json_is_a_document_too(monkeypatch, capsys):
    import json
    import sys

    import click
    import pytest

    from gpucr_hpc.cli import main as cli_main
    from gpucr_hpc.cli import output

    @click.command("os-error")
    @click.option("--json", "as_json", is_flag=True)
    def os_error(as_json):
        raise PermissionError(13, "Permission denied", "/nowhere")

    monkeypatch.setitem(cli_main.cli.commands, "os-error", os_error)
    monkeypatch.setattr(output, "_printed", [])
    monkeypatch.setattr(sys, "argv", ["gpucr-hpc", "os-error", "--json"])
    with pytest.raises(SystemExit):
        cli_main.main()
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["schema"] == "gpucr-hpc.error/1" and "PermissionError" in doc["error"], doc
    assert len(err.strip().splitlines()) == 1
