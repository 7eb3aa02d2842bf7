"""Medians of measured values, where a run that failed left None."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable


def median(values: Iterable[float | None], digits: int | None = None) -> float | None:
    """The median of the values that are not None (rounded to `digits`); None when none are."""
    xs = [x for x in values if x is not None]
    if not xs:
        return None
    m = statistics.median(xs)
    return round(m, digits) if digits is not None else m


def per_key(rows: list[dict], fn: Callable = median, keys: Iterable[str] | None = None) -> dict:
    """fn over each key's values across rows (the keys: the first row's unless given)."""
    return {k: fn([row[k] for row in rows]) for k in (rows[0] if keys is None else keys)}
