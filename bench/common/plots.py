"""matplotlib for the plots a run saves beside its JSON: optional, the JSON is the result."""

from __future__ import annotations

from types import ModuleType


def pyplot() -> ModuleType | None:
    """matplotlib.pyplot drawing to files only (no display on a GPU machine); None
    where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
