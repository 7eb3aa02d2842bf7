"""The machine a run measured: its GPUs as nvidia-smi lists them, where they sit
(NUMA), and the settings the run had in its environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class SmiError(OSError):
    """nvidia-smi ran and failed (an OSError, as when it is missing)."""


def smi_rows(query: str) -> list[list[str]]:
    """nvidia-smi --query-gpu=QUERY: the fields of each GPU, by index, units left out."""
    r = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SmiError(f"nvidia-smi --query-gpu={query}: {(r.stderr or r.stdout).strip()[-300:]}")
    return [[x.strip() for x in ln.split(",")] for ln in r.stdout.strip().splitlines()]


def smi(query: str) -> list[str]:
    """The fields of GPU 0."""
    return smi_rows(query)[0]


def used_mib_per_gpu() -> list[int]:
    """GPU memory in use, MiB, of every GPU by index."""
    return [int(row[0]) for row in smi_rows("memory.used")]


def gpu_used_mib() -> int:
    """GPU memory in use on GPU 0, MiB."""
    return used_mib_per_gpu()[0]


def gpu_identity() -> dict:
    """GPU 0's model and driver, and how many GPUs there are: {"device", "driver",
    "gpus"}; {"error": why} where nvidia-smi cannot say."""
    try:
        rows = smi_rows("name,driver_version")
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    if not rows or len(rows[0]) != 2:
        return {"error": f"nvidia-smi listed {rows!r}"}
    return {"device": rows[0][0], "driver": rows[0][1], "gpus": len(rows)}


def gpu_line() -> str:
    """"MODEL, DRIVER" of GPU 0, "unknown" where nvidia-smi cannot say."""
    gpu = gpu_identity()
    return f"{gpu['device']}, {gpu['driver']}" if "device" in gpu else "unknown"


def numa_of(bus_id: str) -> int:
    """The NUMA node of a GPU, from its PCI bus id; -1 where sysfs does not say.
    nvidia-smi says 00000000:XX:YY.Z, sysfs names the function 0000:xx:yy.z."""
    dom, _, rest = bus_id.lower().partition(":")
    try:
        return int(Path(f"/sys/bus/pci/devices/{dom[-4:]}:{rest}/numa_node").read_text())
    except (OSError, ValueError):
        return -1


def settings(*prefixes: str) -> dict:
    """The environment variables a run had with these prefixes (GPUCR_, NCCL_): its settings."""
    return {k: v for k, v in os.environ.items() if k.startswith(prefixes)}
