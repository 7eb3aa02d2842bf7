"""How the commands print tables (fitted to a terminal, whole when piped) and
show a long command at work (on a terminal only)."""

from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext

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


def working(what: str):
    """A spinner with the time so far on stderr while `what` runs, where stderr is
    a terminal; nothing where it is piped (scripts read the result lines only)."""
    if not sys.stderr.isatty():
        return nullcontext()
    return _spinner(what)


@contextmanager
def _spinner(what: str):
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as progress:
        progress.add_task(what, total=None)
        yield
