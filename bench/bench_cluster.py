"""The local test cluster (scripts/testcluster) as the job benchmarks drive it:
bring it up in the caller's GPUCR_TESTCLUSTER_DIR/PORT, run Slurm's and
gpucr-hpc's commands against it, and read a job's step log (lines
"STEP WALLTIME"). Waits: common.timing.wait_until (a TimeoutError)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.gpucr_cli import run_gpucr

REPO = Path(__file__).resolve().parent.parent
TESTCLUSTER = REPO / "scripts" / "testcluster"


class BenchError(Exception):
    pass


class Cluster:
    def __init__(self, conf: Path, env: dict):
        self.conf = conf
        self.state = conf.parent.parent
        self.env = env

    def run(self, *argv, check=True, timeout=60):
        out = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise BenchError(f"{' '.join(argv)}: rc {out.returncode}: {out.stderr.strip()}")
        return out

    def job(self, jobid: str) -> dict:
        out = self.run("scontrol", "show", "job", "-o", jobid, check=False)
        return dict(re.findall(r"(\S+?)=(\S*)", out.stdout)) if out.returncode == 0 else {}

    def nodes(self, jobid: str) -> list[str]:
        return sorted(self.run("scontrol", "show", "hostnames", self.job(jobid)["NodeList"]).stdout.split())

    def gpucr(self, *args, timeout=300) -> tuple[float, dict]:
        """gpucr-hpc ARGS --json on this cluster: its wall time and its report."""
        run = run_gpucr(*args, "--json", env=self.env, timeout=timeout)
        if run.rc != 0 or run.doc is None:
            raise BenchError(f"gpucr-hpc {' '.join(args)} failed: {(run.stderr or run.stdout).strip()[-2000:]}")
        return run.wall_s, run.doc

    @contextmanager
    def plugstack_args(self, args: str) -> Iterator[None]:
        """The plugin's plugstack.conf line with these arguments added, for the
        duration (the plugin reads it again for every step)."""
        conf = self.state / "etc" / "plugstack.conf"
        original = conf.read_text()
        conf.write_text(original.rstrip("\n") + f" {args}\n")
        try:
            yield
        finally:
            conf.write_text(original)

    def mode(self) -> str:
        net = self.state / "net"
        return net.read_text().strip() if net.exists() else "unknown"


def cli_wrapper(tmp: Path) -> str:
    """The gpucr-hpc the plugin calls (plugstack cli=): this checkout's, run by this
    Python, unless $GPUCR_CLI names one or the checkout has its own venv."""
    if os.environ.get("GPUCR_CLI"):
        return os.environ["GPUCR_CLI"]
    own = REPO / ".venv" / "bin" / "gpucr-hpc"
    if own.exists():
        return str(own)
    path = tmp / "gpucr-hpc"
    path.write_text(f"#!/bin/sh\nPYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}} "
                    f"exec {sys.executable} -m gpucr_hpc \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def cluster_env(tmp: Path) -> dict:
    env = dict(os.environ, GPUCR_CLI=cli_wrapper(tmp))
    env["PYTHONPATH"] = ":".join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def cluster_is_up(env: dict) -> bool:
    return subprocess.run([str(TESTCLUSTER), "status"], capture_output=True, env=env).returncode == 0


def cluster_up(env: dict) -> Cluster:
    up = subprocess.run([str(TESTCLUSTER), "up"], capture_output=True, text=True, timeout=180, env=env)
    if up.returncode != 0:
        raise BenchError(f"testcluster up failed: {up.stderr.strip() or up.stdout.strip()}")
    conf = Path(up.stdout.strip().splitlines()[-1])
    exports = subprocess.run([str(TESTCLUSTER), "env"], capture_output=True, text=True, env=env).stdout
    for k, v in re.findall(r"^export (\w+)=(.*)$", exports, re.M):
        env[k] = v.strip("'")
    env["SLURM_CONF"] = str(conf)
    return Cluster(conf, env)


def steps_of(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    rows = []
    for ln in path.read_text(errors="replace").splitlines():
        parts = ln.split()
        if len(parts) == 3 and parts[0].isdigit():
            rows.append((int(parts[0]), float(parts[1])))
    return rows
