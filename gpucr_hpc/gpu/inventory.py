"""The NVIDIA GPUs of this node, and which of them a process sees.

`node_gpus()` asks nvidia-smi for index, UUID, driver version, model and free
memory of each GPU, in one call (each call costs a restore time).
`visible(value, gpus)` applies a CUDA_VISIBLE_DEVICES value to that list as CUDA
does: entries are nvidia-smi indices or (prefixes of) UUIDs, and the list ends at
the first entry that names no GPU (so `-1` hides them all); unset means every GPU.
`process_gpus(pid, gpus)` does the same with the environment a process started
with: how the GPUs of a CUDA process without the shim are known (a shimmed one
reports them itself).

CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi in
PCI order; on a node of one GPU model (the only kind gpucr-hpc restores onto) both
orders are the same.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Gpu:
    index: int    # nvidia-smi's
    uuid: str     # GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
    model: str    # nvidia-smi's name, e.g. "NVIDIA H100 80GB HBM3"
    free: int     # bytes of free memory now
    driver: str = ""  # the driver's version


def node_gpus() -> list[Gpu]:
    """Every GPU nvidia-smi lists, by index; [] without nvidia-smi or when it fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        r = subprocess.run([smi, "--query-gpu=index,uuid,driver_version,name,memory.free",
                            "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if r.returncode != 0:
        return []
    return parse_smi(r.stdout)


def parse_smi(text: str) -> list[Gpu]:
    """Rows of `index, uuid, driver_version, name, memory.free [MiB]` (a model name may
    hold commas)."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5:
            continue
        try:
            index, free = int(cells[0]), int(cells[-1]) << 20
        except ValueError:  # "[N/A]" free memory: a GPU we cannot place anything on
            continue
        out.append(Gpu(index=index, uuid=cells[1], model=", ".join(cells[3:-1]), free=free, driver=cells[2]))
    return sorted(out, key=lambda g: g.index)


def visible(value: str | None, gpus: list[Gpu]) -> list[Gpu]:
    """The GPUs a CUDA_VISIBLE_DEVICES value leaves visible, in CUDA ordinal order."""
    if value is None:
        return list(gpus)
    out: list[Gpu] = []
    for item in value.split(","):
        item = item.strip()
        if item.isdigit():
            match = [g for g in gpus if g.index == int(item)]
        elif item.upper().startswith("GPU-"):
            match = [g for g in gpus if g.uuid.lower().startswith(item.lower())]
        else:
            match = []
        if len(match) != 1 or match[0] in out:
            break  # CUDA ignores this entry and everything after it
        out.append(match[0])
    return out


def environ_value(pid: int, name: str) -> str | None:
    """The value of `name` in the environment process `pid` started with; None if unset."""
    data = Path(f"/proc/{pid}/environ").read_bytes()
    prefix = name.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def process_gpus(pid: int, gpus: list[Gpu]) -> list[Gpu]:
    """The GPUs process `pid` sees, by CUDA ordinal, from its CUDA_VISIBLE_DEVICES."""
    return visible(environ_value(pid, "CUDA_VISIBLE_DEVICES"), gpus)
