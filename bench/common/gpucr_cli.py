"""A `gpucr-hpc` command as the benchmarks and checks run it: this Python's
gpucr_hpc (the checkout's, through PYTHONPATH), timed from the caller's side."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field


@dataclass
class CliRun:
    rc: int
    stdout: str
    stderr: str
    wall_s: float  # the command's whole wall time: start-up, work and exit
    doc: dict | None = field(init=False)  # the --json document; None where stdout holds none

    def __post_init__(self) -> None:
        try:
            self.doc = json.loads(self.stdout)
        except ValueError:
            self.doc = None


def run_gpucr(*args: str, env: dict | None = None, cwd: str | None = None, timeout: float = 600) -> CliRun:
    """`python -m gpucr_hpc ARGS` (give --json among ARGS for a document), stdin closed."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "gpucr_hpc", *args], env=env, cwd=cwd, capture_output=True,
                       text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return CliRun(r.returncode, r.stdout, r.stderr, time.monotonic() - t0)
