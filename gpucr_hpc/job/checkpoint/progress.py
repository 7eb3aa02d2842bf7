"""How far a job command is on its nodes: each agent prints one line as a unit
enters a phase (`emit`: the bytes it has so far), the coordinator hands every
such line to whoever listens (`listening`: the CLI's display on a terminal).
Nothing else depends on these lines; a command piped to a script prints none."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

KEY = "progress"
Listener = Callable[[dict], None]
_listeners: list[Listener] = []


def emit(node: str, unit: str, phase: str, nbytes: int) -> None:
    """Said by an agent: `unit` on `node` is at `phase`, with `nbytes` moved so far."""
    print(json.dumps({KEY: {"node": node, "unit": unit, "phase": phase, "bytes": int(nbytes)}}), flush=True)


def heard(event: dict) -> None:
    """Said by the coordinator for every progress line of its agents."""
    for listen in list(_listeners):
        listen(event)


@contextmanager
def listening(listen: Listener) -> Iterator[None]:
    _listeners.append(listen)
    try:
        yield
    finally:
        _listeners.remove(listen)
