"""What happened to a job, where its users look.

Every job command (checkpoint, preempt, suspend, resume, by hand or not)
appends one record to `<image root>/<jobid>/events.jsonl`: when, what, who,
which generation, on which nodes, how long, or why it failed. The batch
supervisor relays the records of other processes into the job's output as
`gpucr:` lines (it alone may write there: it shares the output's file offset
with the script), and `gpucr-hpc status` tells the job's story from them.
"""

from __future__ import annotations

import json
import os
import pwd
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import dirs as job_dirs

EVENTS = "events.jsonl"
RELAY_POLL_S = 2.0
T = TypeVar("T")


def _who() -> str:
    """The user behind the command: sudo's caller where root runs it for them (the
    operator door keeps SUDO_USER), else the effective user."""
    if os.geteuid() == 0 and os.environ.get("SUDO_USER"):
        return os.environ["SUDO_USER"]
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def record(job_dir: Path, uid: int, **fields) -> None:
    """One record, appended whole (one write); the job's user owns the file."""
    rec = {"at": time.time(), "by": _who(), "pid": os.getpid(), **fields}
    path = Path(job_dir) / EVENTS
    try:
        with job_dirs.as_owner(uid):  # root appends as the job's user: the file stays theirs alone
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (json.dumps(rec, default=str) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # the command's own answer still says it


def told(job_dir: Path, uid: int, what: str, run: Callable[[], T]) -> T:
    """run(), recorded as `what`: its result's generation, nodes and time, or its error."""
    try:
        result = run()
    except GpucrError as e:
        record(job_dir, uid, what=what, ok=False, error=e.one_line())
        raise
    r = result if isinstance(result, dict) else {}
    record(job_dir, uid, what=what, ok=True, generation=r.get("generation"), nodes=r.get("nodes"),
           took_s=r.get("total_s"))
    return result


def read(job_dir: Path) -> list[dict]:
    try:
        lines = (Path(job_dir) / EVENTS).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a full disk
    return out


def text(ev: dict, jobid: str) -> str:
    """A record as the job's output line says it."""
    when = time.strftime("%H:%M:%S", time.localtime(ev.get("at", 0)))
    who = f"by {ev.get('by', '?')} at {when}"
    if not ev.get("ok"):
        return f"gpucr: {ev.get('what', '?')} of job {jobid} {who} failed: {ev.get('error', '')}"
    done = {"checkpoint": "checkpointed", "preempt": "preempted", "suspend": "suspended",
            "resume": "resumed", "drain": "drained to the image root"}.get(ev.get("what", ""), ev.get("what", "?"))
    parts = [f"gpucr: job {jobid} {done} {who}"]
    if ev.get("generation"):
        parts.append(f": {ev['generation']}")
    if ev.get("nodes"):
        parts.append(f" on {', '.join(ev['nodes'])}")
    if ev.get("took_s") is not None:
        parts.append(f" in {ev['took_s']:.1f} s")
    return "".join(parts)


def relay(job_dir: Path, jobid: str, say: Callable[[str], None], stop: threading.Event) -> None:
    """In a thread of the batch supervisor: says the records other processes append
    from now on (its own say themselves)."""
    path = Path(job_dir) / EVENTS
    try:
        at = path.stat().st_size
    except OSError:
        at = 0
    pending = b""
    while not stop.wait(RELAY_POLL_S):
        try:
            with open(path, "rb") as f:
                f.seek(at)
                chunk = f.read()
        except OSError:
            continue
        at += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("pid") != os.getpid():
                say(text(ev, jobid))
