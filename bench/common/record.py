"""The JSON record a run writes: when it ran, and the document, rewritten whole
each time it grows so that a run cut short keeps what it measured."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path


def utc_now() -> str:
    """Now, in UTC to the second: every record's `date`."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_record(path: str | Path, doc: dict, indent: int | None = 1, sort_keys: bool = False) -> Path:
    """doc as JSON at path, its folder made. Written beside it and renamed over it:
    a run killed while writing leaves its previous record, never half of one; a
    value JSON cannot hold is written as its str() rather than losing the record."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=indent, sort_keys=sort_keys, default=str) + "\n")
    os.replace(tmp, path)
    return path
