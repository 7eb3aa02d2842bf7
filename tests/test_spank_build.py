"""Building and installing the SPANK plugin (spank/Makefile); no cluster needed."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HAVE_HEADERS = Path("/usr/include/slurm/spank.h").exists()


def make(src, *args):
    return subprocess.run(["make", "-C", str(src), *args], capture_output=True, text=True)


@pytest.fixture
def src(tmp_path):
    dst = tmp_path / "spank"
    shutil.copytree(REPO / "spank", dst, ignore=shutil.ignore_patterns("*.o", "*.so"))
    return dst


@pytest.mark.skipif(not HAVE_HEADERS, reason="slurm/spank.h not installed (libslurm-dev)")
def test_builds_cleanly_and_installs(src, tmp_path):
    res = make(src)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "warning" not in res.stderr
    assert "-Wall -Wextra -Werror" in res.stdout
    syms = subprocess.run(["nm", "-D", "--defined-only", str(src / "spank_gpucr.so")],
                          capture_output=True, text=True, check=True).stdout
    for sym in ("plugin_name", "plugin_type", "plugin_version", "slurm_spank_init",
                "slurm_spank_init_post_opt", "slurm_spank_task_init",
                "slurm_spank_task_exit", "slurm_spank_job_epilog"):
        assert f" {sym}\n" in syms, sym
    res = make(src, "install", f"PREFIX={tmp_path / 'prefix'}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "prefix" / "lib" / "gpucr" / "spank_gpucr.so").is_file()


def test_missing_headers_one_clear_line(src, tmp_path):
    res = make(src, f"SLURM_INCLUDE={tmp_path / 'nowhere'}")
    assert res.returncode != 0
    lines = [l for l in res.stderr.splitlines() if not l.startswith("make")]
    assert len(lines) == 1 and "slurm/spank.h not found" in lines[0], res.stderr
    assert "libslurm-dev" in lines[0]
