"""`gpucr-hpc ls`: an unknown job is one line and a non-zero exit; a table piped
to another program is printed whole (no cell cut short with an ellipsis)."""

import json
import os

import pytest
from test_cli_options import cli, committed_generation, refused


@pytest.fixture
def store(tmp_path):
    """A site with the plugin line and an image root (ls asks Slurm nothing)."""
    images = tmp_path / "images"
    images.mkdir()
    (tmp_path / "plugstack.conf").write_text("optional /nowhere/spank_gpucr.so\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCR_", "SLURM_"))}
    env.update(SLURM_CONF=str(tmp_path / "slurm.conf"), GPUCR_IMAGE_ROOT=str(images))
    return env, images


def test_ls_of_a_job_the_store_does_not_have_is_one_line(store):
    env, images = store
    err = refused(cli("ls", "4242", env=env), "the image store has no job 4242")
    assert str(images / "4242") in err
    refused(cli("ls", "4242", "--json", env=env), "the image store has no job 4242")


def test_ls_of_a_job_without_a_checkpoint_yet_says_so(store):
    env, images = store
    (images / "42").mkdir()
    r = cli("ls", "42", env=env)
    assert r.returncode == 0 and r.stdout.strip() == "no checkpoint of job 42 yet", r.stdout + r.stderr
    doc = json.loads(cli("ls", "42", "--json", env=env).stdout)
    assert doc == {"schema": "gpucr-hpc.ls/1", "job": "42", "generations": []}, doc


def test_ls_piped_prints_every_cell_whole(store):
    env, images = store
    committed_generation(images, 3)
    out = cli("ls", env=dict(env, COLUMNS="40")).stdout
    row = next(line for line in out.splitlines() if "gen-3" in line)
    assert "…" not in out, out
    created = [c.strip() for c in row.split("│") if c.strip()][-1]
    assert len(created) == len("2026-11-25T19:51:43Z") and created.endswith("Z"), row
