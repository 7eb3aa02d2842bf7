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
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith("Error:")
    assert "--no-such-option" in lines[-1]
