"""How the commands print tables: fitted to a terminal, whole when piped."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

# Piped output is read by scripts and people's `grep`: a line is never cut.
PIPED_WIDTH = 10_000


def console() -> Console:
    """A console for stdout: the terminal's width on a terminal (long cells fold
    onto a second line), else wide enough that no row is cut or wrapped."""
    return Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH, soft_wrap=True)


def table(title: str, columns: tuple[str, ...]) -> Table:
    t = Table(title=title)
    for col in columns:
        t.add_column(col, overflow="fold")
    return t
