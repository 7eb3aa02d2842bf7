"""Sizes, durations and rates as every command prints them: one style everywhere."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def size(n: float) -> str:
    """Bytes in binary units with one decimal: `512 B`, `7.1 MiB`, `80.0 GiB`."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TiB"


def timing(name: str, value: float) -> str:
    """One timing of a report: `quiesce 0.123 s`, `h5 1931.8 MB/s`, else `name value`."""
    if name.endswith("_MBps"):
        return f"{name[:-5]} {value:.1f} MB/s"
    if name.endswith("_s"):
        return f"{name[:-2]} {value:.3f} s"
    return f"{name} {value}"


def timings_line(t: Mapping[str, float | None], order: Iterable[str] | None = None) -> str:
    """A report's timings on one line, in `order` where given (others left out), else as they come."""
    keys = [k for k in order if k in t] if order is not None else list(t)
    return ", ".join(timing(k, v) for k in keys if (v := t[k]) is not None)
