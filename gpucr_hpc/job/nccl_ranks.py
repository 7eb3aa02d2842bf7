"""A job's NCCL ranks across its node agents (process/nccl_cut.py does the work
on each node): every agent takes part in every step, even one whose node has
no NCCL rank, and all see the same states, so all decide alike.

  park     the consistent cut over every rank of the job, then each node's ranks
           tear their communicators down (before their GPU checkpoint);
  rebuild  after the restore, or once a checkpoint that left the job running is
           done: fresh unique ids gathered from every node, communicators made.

After a requeue the ranks come back through one restore task each (no MPI):
`rebuild_by_files` trades the ids through the job's folder instead.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpucr_hpc.criu.run import process_tree
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import dirs as job_dirs
from gpucr_hpc.process import nccl_cut
from gpucr_hpc.shim.client import ShimClient, control_socket

IDS_DIR = "nccl-ids"  # one file per restored rank: its part of the unique ids
POLL_S = 0.05


def ranks_in(pids: list[int], run_dir: Path | None) -> list[int]:
    """The processes of these trees that hold NCCL communicators."""
    found = []
    for root in pids:
        for p in process_tree(root):
            sock = control_socket(p, run_dir)
            if sock is None:
                continue
            try:
                st = ShimClient(p, run_dir, path=sock).status()
            except GpucrError:
                continue
            if st.nccl_comms:
                found.append(p)
    return found


class Agents:
    """How the node agents share what nccl_cut needs (comm: the agents' MPI world)."""

    def __init__(self, comm):
        self.comm = comm

    def share(self, states, error):
        got = self.comm.allgather((states, error))
        return [s for mine, _ in got for s in mine], [e for _, e in got if e]

    def share_ids(self, ids, error):
        got = self.comm.allgather((ids, error))
        merged: dict[str, str] = {}
        for mine, _ in got:
            merged.update(mine)
        return merged, [e for _, e in got if e]

    def any(self, flag: bool) -> bool:
        return any(self.comm.allgather(bool(flag)))


def park(comm, pids: list[int], run_dir: Path | None, timeout_ms: int = 10_000) -> str:
    """Every NCCL rank of the job at one cut, its communicators torn down: "", or
    why not (the same line on every agent; the ranks then run on)."""
    agents = Agents(comm)
    if not agents.any(bool(pids)):
        return ""
    try:
        nccl_cut.cut(pids, run_dir, share=agents.share)
    except GpucrError as e:
        return e.one_line()
    try:
        nccl_cut.teardown(pids, run_dir, timeout_ms)
        error = ""
    except GpucrError as e:
        error = e.one_line()
    errors = [e for e in comm.allgather(error) if e]
    if errors:
        try:
            nccl_cut.undo(pids, run_dir, any_torn=agents.any, share_ids=agents.share_ids)
        except GpucrError as e:
            return f"{errors[0]}; and undoing it failed: {e.one_line()}"
        return errors[0]
    return ""


def rebuild(comm, pids: list[int], run_dir: Path | None) -> str:
    """The job's communicators made anew on every node: "", or why not."""
    agents = Agents(comm)
    pids = nccl_cut.torn_down(pids, run_dir) if pids else []
    if not agents.any(bool(pids)):
        return ""
    try:
        nccl_cut.rebuild(pids, run_dir, share_ids=agents.share_ids)
    except GpucrError as e:
        return e.one_line()
    return ""


def rebuild_by_files(job_dir: Path, procid: int, n_ranks: int, pids: list[int], run_dir: Path | None,
                     timeout_s: float) -> None:
    """rebuild() for the restore tasks of a requeued job's ranks: each writes its
    ids (or its error) to job_dir/nccl-ids/PROCID and reads every other's."""
    folder = job_dir / IDS_DIR

    def share_ids(ids: dict[str, str], error: str) -> tuple[dict[str, str], list[str]]:
        tmp = folder / f".{procid}"
        tmp.write_text(json.dumps({"ids": ids, "error": error}))
        os.replace(tmp, folder / str(procid))
        end = time.monotonic() + timeout_s
        while len([n for n in os.listdir(folder) if not n.startswith(".")]) < n_ranks:
            if time.monotonic() > end:
                return {}, [f"not every rank of the job came back within {timeout_s:.0f} s to rebuild its NCCL "
                            f"communicators"]
            time.sleep(POLL_S)
        merged: dict[str, str] = {}
        errors = []
        for name in sorted(n for n in os.listdir(folder) if not n.startswith(".")):
            part = json.loads((folder / name).read_text())
            merged.update(part["ids"])
            errors += [part["error"]] if part["error"] else []
        return merged, errors

    nccl_cut.rebuild(pids, run_dir, share_ids=share_ids, reload=True)  # restored by CRIU, maybe elsewhere


def fresh_ids_folder(job_dir: Path) -> None:
    """Made empty by the batch restorer before it starts the ranks' restore tasks."""
    job_dirs.fresh_folder(job_dir / IDS_DIR)
