"""NCCL communicators across a checkpoint: the consistent cut, the teardown and
the rebuild, driven over the shims' control sockets of every rank at once.

A rank that has launched collective #k while a peer has not would wait for it
forever once that peer is quiesced. So before the ordinary checkpoint:

  freeze    every rank stops at its next NCCL operation and says, for each of its
            communicators (by key, the same on every rank), how many it issued;
  targets   each communicator's target is the largest count over its ranks; the
            ranks behind run on until they reach it, and park; a rank that went
            past a target (it had another communicator to catch up on) raises
            that target, and the round repeats;
  park      once every rank reports its counts equal to the targets;
  teardown  every rank finalizes and destroys its communicators, which hands
            back the GPU memory NCCL shares between processes (the driver's
            checkpoint refuses such memory).
After the restore each communicator's rank 0 makes a fresh unique id, every rank
gets them all, and the communicators are made anew (`rebuild`); the parked
operations then run against them. A cut that does not settle by its deadline is
given up (`thaw`): the ranks run on and the checkpoint fails with one line.

MANA's per-communicator sequence numbers and NVIDIA's nccl_checkpoint contrib
are the prior art; neither was copied.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.shim import protocol
from gpucr_hpc.shim.client import ShimClient
from gpucr_hpc.shim.protocol import NcclComm, Reply

DEFAULT_DEADLINE_S = 60.0
POLL_S = 0.005


@dataclass
class RankState:
    pid: int
    cut: str
    quiet: bool
    settled: bool
    comms: tuple[NcclComm, ...]
    unrestorable: str = ""

    @classmethod
    def of(cls, pid: int, r: Reply) -> RankState:
        return cls(pid, r.cut, r.quiet, r.settled, r.comms, r.unrestorable)


# (this node's states, its error or "") -> (every rank's states, every error): how the
# node agents see one another (an allgather); alone, the identity.
Share = Callable[[list["RankState"], str], tuple[list["RankState"], list[str]]]
# (this node's unique ids, its error or "") -> (every one's ids, every error)
ShareIds = Callable[[dict[str, str], str], tuple[dict[str, str], list[str]]]


def with_comms(statuses: dict[int, Reply]) -> list[int]:
    """The processes (by pid) that hold NCCL communicators, from their shims' status."""
    return sorted(pid for pid, st in statuses.items() if st.nccl_comms > 0)


def _ask(pids, run_dir: Path | None, cmd: str, timeout: float = 30.0, **fields) -> dict[int, Reply]:
    def one(pid):
        return pid, ShimClient(pid, run_dir).request(cmd, timeout=timeout, **fields)

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(pids)))) as pool:
        return dict(pool.map(one, pids))


def _states(pids, run_dir, cmd=protocol.NCCL_COUNTS, **fields) -> list[RankState]:
    replies = _ask(pids, run_dir, cmd, **fields)
    for pid, r in replies.items():
        if not r.ok and r.reason not in ("not_settled",):
            raise GpucrError(f"process {pid}: {r.error or cmd + ' failed'}", "")
    return [RankState.of(pid, r) for pid, r in replies.items()]


def _targets(states: list[RankState]) -> dict[str, int]:
    """Each communicator's target: the largest count over its ranks. Every rank of
    every communicator must be among the processes checkpointed together."""
    top: dict[str, int] = {}
    ranks: dict[str, set[int]] = defaultdict(set)
    size: dict[str, int] = {}
    for s in states:
        for c in s.comms:
            top[c.key] = max(top.get(c.key, 0), c.ops)
            ranks[c.key].add(c.rank)
            size[c.key] = max(size.get(c.key, 0), c.nranks)
    for key, seen in ranks.items():
        if size[key] and len(seen) < size[key]:
            raise GpucrError(f"NCCL communicator {key} has {size[key]} ranks but only {len(seen)} of them are in "
                             f"this checkpoint", "checkpoint the whole job (every rank) together")
    return top


def _at(states: list[RankState], targets: dict[str, int]) -> bool:
    return all(c.ops == targets[c.key] for s in states for c in s.comms)


def alone(states: list[RankState], error: str) -> tuple[list[RankState], list[str]]:
    return states, [error] if error else []


def alone_ids(ids: dict[str, str], error: str) -> tuple[dict[str, str], list[str]]:
    return ids, [error] if error else []


LATE = ("the ranks did not reach a consistent cut of their NCCL operations in time (a rank may be waiting for "
        "another outside NCCL); checkpoint aborted, the job runs on")


def cut(pids: list[int], run_dir: Path | None = None, deadline_s: float = DEFAULT_DEADLINE_S,
        share: Share = alone) -> dict[str, int]:
    """Brings every rank in pids to a consistent cut and parks it there; returns
    the targets reached. On any failure the ranks are thawed and run on.

    share: see Share. The node agents pass an allgather, so that every agent
    sees the same states, takes the same steps and fails together."""
    end = time.monotonic() + deadline_s

    def everyone(cmd=protocol.NCCL_COUNTS, **fields) -> list[RankState]:
        try:
            local, error = _states(pids, run_dir, cmd, **fields), ""
        except GpucrError as e:
            local, error = [], e.one_line()
        if not error and time.monotonic() > end:
            error = LATE
        states, errors = share(local, error)
        if errors:
            raise GpucrError(errors[0], "retry the checkpoint" if errors[0] == LATE else "")
        return states

    try:
        states = everyone(protocol.NCCL_FREEZE)
        bad = [s for s in states if s.unrestorable]
        if bad:
            raise GpucrError(f"process {bad[0].pid}: checkpoint refused: {bad[0].unrestorable}; it keeps running", "")
        while True:
            while not all(s.quiet for s in states):  # a group open at the freeze ends first
                time.sleep(POLL_S)
                states = everyone()
            targets = _targets(states)
            states = everyone(protocol.NCCL_TARGETS, targets=",".join(f"{k}={v}" for k, v in sorted(targets.items())))
            while not (all(s.settled for s in states) or any(c.ops > targets[c.key] for s in states for c in s.comms)):
                time.sleep(POLL_S)
                states = everyone()
            if all(s.settled for s in states) and _at(states, targets):
                try:
                    mine, error = [RankState(pid, "parked" if r.ok else "", True, r.ok, ())
                                   for pid, r in _ask(pids, run_dir, protocol.NCCL_PARK).items()], ""
                except GpucrError as e:
                    mine, error = [], e.one_line()
                parked, errors = share(mine, error)
                if errors:
                    raise GpucrError(errors[0], "")
                if all(s.settled for s in parked):
                    return targets
                states = everyone()  # one moved on since: a new round
    except GpucrError:
        thaw(pids, run_dir)
        raise


def thaw(pids: list[int], run_dir: Path | None = None) -> None:
    """Best effort: every rank leaves the cut and runs on."""
    try:
        _ask(pids, run_dir, protocol.NCCL_THAW)
    except GpucrError:
        pass


def teardown(pids: list[int], run_dir: Path | None = None, timeout_ms: int = 10_000) -> dict[str, float]:
    """Every parked rank finalizes and destroys its communicators (in parallel:
    a finalize may wait for its peers)."""
    replies = _ask(pids, run_dir, protocol.NCCL_TEARDOWN, timeout=timeout_ms / 1000 + 60, timeout_ms=timeout_ms)
    bad = [(pid, r) for pid, r in replies.items() if not r.ok]
    if bad:
        pid, r = bad[0]
        raise GpucrError(f"process {pid}: {r.error or 'NCCL teardown failed'}", "")
    return {"teardown_s": max(r.teardown_s for r in replies.values())}


def torn_down(pids: list[int], run_dir: Path | None = None) -> list[int]:
    return [s.pid for s in _states(pids, run_dir) if s.cut == "torn_down"]


def rebuild(pids: list[int], run_dir: Path | None = None, timeout_s: float = 300.0,
            share_ids: ShareIds = alone_ids, reload: bool = False) -> dict[str, float]:
    """New communicators on every rank: fresh unique ids from each one's rank 0,
    handed to all (share_ids: across the node agents), then made together (each
    rank's make waits for its peers). reload: after a CRIU restore, each process
    first loads a fresh copy of NCCL, whose host state (bootstrap address) then
    is this node's, not the one it was checkpointed on."""
    t0 = time.monotonic()
    ids: dict[str, str] = {}
    error = ""
    try:
        if reload:
            for pid, r in _ask(pids, run_dir, protocol.NCCL_RELOAD).items():
                if not r.ok:
                    raise GpucrError(f"process {pid}: {r.error or 'NCCL could not be loaded again'}", "")
        for pid, r in _ask(pids, run_dir, protocol.NCCL_IDS).items():
            if not r.ok:
                raise GpucrError(f"process {pid}: {r.error or 'no NCCL unique ids'}", "")
            ids.update(r.nccl_ids)
    except GpucrError as e:
        error = e.one_line()
    ids, errors = share_ids(ids, error)
    if errors:
        raise GpucrError(errors[0], "the job's ranks stay parked; restore it again, or cancel it")
    listed = ",".join(f"{k}={v}" for k, v in sorted(ids.items()))
    replies = _ask(pids, run_dir, protocol.NCCL_REBUILD, timeout=timeout_s, ids=listed)
    bad = [(pid, r) for pid, r in replies.items() if not r.ok]
    if bad:
        pid, r = bad[0]
        raise GpucrError(f"process {pid}: {r.error or 'NCCL rebuild failed'}",
                         "the job's ranks stay parked; restore it again, or cancel it")
    return {"rebuild_s": time.monotonic() - t0}


def undo(pids: list[int], run_dir: Path | None = None, any_torn: Callable[[bool], bool] = bool,
         share_ids: ShareIds = alone_ids) -> None:
    """After a checkpoint given up past the cut: ranks still parked are thawed;
    once any rank tore its communicators down, all do and all are rebuilt.
    any_torn: whether a rank anywhere did (the node agents tell one another)."""
    torn = torn_down(pids, run_dir)
    if not any_torn(bool(torn)):
        thaw(pids, run_dir)
        return
    rest = [p for p in pids if p not in torn]
    if rest:
        teardown(rest, run_dir)
    rebuild(pids, run_dir, share_ids=share_ids)
