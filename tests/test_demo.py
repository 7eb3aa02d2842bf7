"""README's first command, scripts/demo, run as a user runs it: it must end with
status 0 after the job was checkpointed, preempted, moved and restored."""

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(os.geteuid() != 0, reason="the demo installs and starts the cluster as root")
def test_demo_runs_checkpoint_preempt_restore_and_exits_0(slurm_cluster):
    out = subprocess.run([str(REPO / "scripts" / "demo")], capture_output=True, text=True,
                         timeout=900, env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "restored, not rerun" in text and "demo: done" in text, text[-3000:]
    assert text.count("no step repeated or skipped") == 4, text[-3000:]
    assert "after srun: exit 0" in text, text[-3000:]
