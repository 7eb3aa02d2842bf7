"""The job's restore log and gpucr's own lines in its output.

restore.log (<image root>/<jobid>/restore.log) is where the restore, the drain
and the batch supervisor say what they did: the job's own output must stay
byte-identical to the checkpoint until its processes are back. The few lines
gpucr does write into the job's output are kept beside it, so that a restore
that rewinds the output to an older checkpoint writes them again.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from gpucr_hpc.job import generations

LOG_NAME = "restore.log"

# gpucr's own lines in the job's output, kept to be written again after a restore
# rewinds the output to a checkpoint that came before them.
SAID_NAME = "output-lines.jsonl"
_log_path: Path | None = None


def open_log(job_dir: Path | None) -> None:
    """None: a job dir that must not be written to; the log goes nowhere."""
    global _log_path
    _log_path = job_dir / LOG_NAME if job_dir is not None else None


def log(msg: str) -> None:
    """Into <image root>/<jobid>/restore.log: the job's own output must stay
    byte-identical to the checkpoint until the processes are back."""
    if _log_path is None:
        return
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {os.environ.get('SLURMD_NODENAME', '')} {msg}\n"
    try:  # the user's alone, and never through a symlink planted there
        fd = os.open(_log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def say(line: str) -> None:
    """A line of gpucr's in the job's output (stderr), also kept with the checkpoint it
    follows: a restore from that checkpoint or an older one writes it again."""
    print(line, file=sys.stderr, flush=True)
    if _log_path is None:
        return
    record = {"after": _generation_number(generations.read_pointer(_log_path.parent, generations.LATEST)),
              "line": line}
    try:
        with open(_log_path.parent / SAID_NAME, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError:
        pass  # it is in the output; only a later rewind could lose it


def _generation_number(gen: Path | None) -> int:
    return int(gen.name.split("-")[1]) if gen is not None else 0


def say_again_after_rewind(gen: Path) -> None:
    """The lines put_back_outputs took away: those said after `gen` was checkpointed.
    Only once the restored processes hold the output file, whose size CRIU checks."""
    try:
        records = (gen.parent / SAID_NAME).read_text().splitlines()
    except OSError:
        return
    n = _generation_number(gen)
    for text in records:
        try:
            rec = json.loads(text)
        except ValueError:
            continue  # a line cut by a full disk
        if rec.get("after", 0) >= n:
            print(rec.get("line", ""), file=sys.stderr, flush=True)


