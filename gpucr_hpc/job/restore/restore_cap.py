"""A job that fails right after each restore is held instead of looping.

Every start of a job with a committed generation restores it. When a restored
run ends before a newer generation is committed (the program crashes at the
same point, the node fails at the restore, Slurm requeues it on exit), the
next start restores the same generation again, and the job would loop. So
each restore counts how many times in a row its generation has been restored
(`<job dir>/restored-from`); once that reaches GPUCR_RESTORE_CAP, the next
start is held with the reason instead. A restore asked for by hand
(`gpucr-hpc restore`, which pins RESTORE) starts the count again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpucr_hpc.errors import GpucrError

COUNT_FILE = "restored-from"


def _read(job_dir: Path) -> dict:
    try:
        rec = json.loads((Path(job_dir) / COUNT_FILE).read_text())
        return rec if isinstance(rec, dict) else {}
    except (OSError, ValueError):
        return {}


def count(job_dir: Path, gen: str, asked: bool, cap: int) -> int:
    """Counts this restore of `gen` and returns how many in a row it makes;
    raises when `gen` was restored `cap` times in a row already and this
    restore was not asked for by hand (`asked`). Nothing is written then."""
    rec = _read(job_dir)
    times = 1 if asked or rec.get("gen") != gen else int(rec.get("times", 0)) + 1
    if times > cap:
        raise GpucrError(f"{gen} was restored {times - 1} times in a row, and each run ended before a newer "
                         f"checkpoint (GPUCR_RESTORE_CAP={cap}): the job may fail at the same point every time",
                         f"see the job's output and restore.log, fix the cause, then gpucr-hpc restore "
                         f"{Path(job_dir).name} (--from N for an earlier generation)")
    path = Path(job_dir) / COUNT_FILE
    tmp = path.with_name(f".{COUNT_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"gen": gen, "times": times}) + "\n")
    os.replace(tmp, path)
    return times
