"""Site settings: the arguments of our line in plugstack.conf.

An admin sets them once, for the plugin; the CLI and the node agents read the
same line so the two can never disagree. `GPUCR_*` variables override them
(inside a job the plugin exports them; tests use them too).
"""

from __future__ import annotations

import glob
import os
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.slurm.job_ids import check_job_id

PLUGIN_NAME = "spank_gpucr.so"


@dataclass
class Site:
    plugstack: Path | None
    shim: str = "/usr/local/lib/gpucr/libgpucr-cuda.so"
    rundir: str = "/run/gpucr"
    imageroot: str = "/var/lib/gpucr/images"
    arena: str = "/dev/shm"
    gpu_feature: str = ""
    vendor: str = ""
    cli: str = "/usr/local/bin/gpucr-hpc"
    bindir: str = "/usr/local/lib/gpucr/bin"
    stage: str = ""        # node-local memory a preemption writes to first ("": none)
    stage_cap: str = "50%"  # how much of it staged checkpoints may use: a size or a share

    def run_dir_root(self, node: str | None = None) -> Path:
        """The node-local run-dir root, with %n/%h expanded as the plugin does."""
        return Path(expand(self.rundir, node))

    def job_run_dir(self, jobid: str, node: str | None = None) -> Path:
        return self.run_dir_root(node) / check_job_id(str(jobid))

    def job_image_dir(self, jobid: str) -> Path:
        return Path(self.imageroot) / check_job_id(str(jobid))  # never "..", never "14/../15"


def node_name() -> str:
    """This node's name as Slurm knows it (the plugin's %n), else the short host name.

    Several slurmd on one machine share its host name: only Slurm's name tells them apart."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def expand(value: str, node: str | None = None) -> str:
    full = socket.gethostname()
    short = node or node_name()
    out, i = [], 0
    while i < len(value):
        if value[i] == "%" and i + 1 < len(value):
            out.append({"n": short, "h": full, "%": "%"}.get(value[i + 1], value[i:i + 2]))
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def slurm_conf_path() -> Path:
    return Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))


def plugstack_path() -> Path:
    """PlugStackConfig of slurm.conf, else plugstack.conf beside it (Slurm's default)."""
    conf = slurm_conf_path()
    try:
        for line in conf.read_text().splitlines():
            key, _, value = line.split("#", 1)[0].strip().partition("=")
            if key.strip().lower() == "plugstackconfig" and value.strip():
                return Path(value.strip())
    except OSError:
        pass
    return conf.parent / "plugstack.conf"


def _plugstack_lines(path: Path, depth=0):
    try:
        text = path.read_text()
    except OSError:
        return
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "include" and depth < 8:
            for inc in sorted(glob.glob(words[1] if os.path.isabs(words[1])
                                        else str(path.parent / words[1]))):
                yield from _plugstack_lines(Path(inc), depth + 1)
        else:
            yield words


def load_site() -> Site:
    path = plugstack_path()
    site = Site(plugstack=None)
    for words in _plugstack_lines(path):
        if len(words) >= 2 and os.path.basename(words[1]) == PLUGIN_NAME:
            site.plugstack = path
            for arg in words[2:]:
                key, _, value = arg.partition("=")
                if hasattr(site, key) and key != "plugstack":
                    setattr(site, key, value)
            break
    for attr, var in (("imageroot", "GPUCR_IMAGE_ROOT"), ("rundir", "GPUCR_RUN_DIR_ROOT"),
                      ("arena", "GPUCR_ARENA_DIR"), ("shim", "GPUCR_SHIM")):
        if config.value(var):
            setattr(site, attr, config.value(var))
    return site


def require_plugin(site: Site) -> None:
    if site.plugstack is None:
        raise GpucrError(f"the gpucr SPANK plugin is not in {plugstack_path()}",
                         "add its line to plugstack.conf (see spank/README.md) or set SLURM_CONF")
