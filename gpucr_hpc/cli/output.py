"""How the commands print tables (fitted to a terminal, whole when piped), their
--json documents, and show a long command at work (on a terminal only)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext

import click
from rich.console import Console
from rich.table import Table

from gpucr_hpc.figures import size as figures_size

# The version of every --json document's layout: raised when a field changes its
# meaning or type or goes away (new fields do not raise it).
SCHEMA_VERSION = 1


def json_document(kind: str, fields: Mapping) -> dict:
    """A command's --json answer: one object whose "schema" names what it is and its
    layout's version ("gpucr-hpc.status/1"), then `fields` (never a bare list)."""
    return {"schema": f"gpucr-hpc.{kind}/{SCHEMA_VERSION}", **fields}


_printed: list[str] = []  # the kinds of the documents printed by this process


def print_json(kind: str, fields: Mapping) -> None:
    """Print json_document(kind, fields) on stdout: the one document a --json command
    prints (any other line goes to stderr). A command may still fail after it (a
    report with failures in it: raise GpucrError): the error is then only the line
    on stderr and the exit status, no second document (see printed_json)."""
    click.echo(json.dumps(json_document(kind, fields), indent=2, sort_keys=True, default=str))
    _printed.append(kind)


def printed_json() -> bool:
    """Whether this process has printed its --json document already."""
    return bool(_printed)


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

    from gpucr_hpc.job.checkpoint import progress as job_progress

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.fields[moved]}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        bar.add_task(what, total=None, moved="")
        nodes = NodeProgress(bar)
        with job_progress.listening(nodes.heard):
            yield


class NodeProgress:
    """One line per node of a job command: its units' phases and the bytes moved
    so far, as the node agents tell them (job/checkpoint/progress.py)."""

    def __init__(self, bar):
        self.bar = bar
        self.tasks: dict[str, object] = {}
        self.units: dict[str, dict[str, tuple[str, int]]] = {}

    def heard(self, event: dict) -> None:
        node, unit = str(event.get("node", "?")), str(event.get("unit", "?"))
        units = self.units.setdefault(node, {})
        units[unit] = (str(event.get("phase", "")), int(event.get("bytes") or 0))
        phases = sorted({p for p, _ in units.values() if p != "done"}) or ["done"]
        done = sum(1 for p, _ in units.values() if p == "done")
        text = f"  {node}: {', '.join(phases)} ({done}/{len(units)} units)"
        moved = figures_size(sum(n for _, n in units.values()))
        if node not in self.tasks:
            self.tasks[node] = self.bar.add_task(text, total=None, moved=moved)
        else:
            self.bar.update(self.tasks[node], description=text, moved=moved)
