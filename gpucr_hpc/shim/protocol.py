"""The shim's control-socket messages, typed: the one place their keys are spelled
in Python (shim/protocol_keys.h is the shim's; tests/test_shim_protocol.py checks
that both spell the same).

A request is one JSON object on one line, `{"cmd": NAME, ...}` (shim/protocol.c
reads it); the answer is one JSON object on one line, written by the shim's JSON
module (shim/json.c). Every answer says `ok`; one that is not ok says `error` (a
sentence for people) and may say `reason` (a word for code to decide on).
`Reply.parse` turns an answer into a `Reply`; `raw` keeps the whole answer for
`--json` output and for diagnostics that report everything the shim said.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Requests (the shim's commands; the command lists of shim/protocol.h name the
# same; tests/test_shim_protocol.py checks it).
STATUS = "status"
PING = "ping"
CHECKPOINT = "checkpoint"          # quiesce, copy the GPU data to the arena, yield the GPU memory
RESTORE = "restore"                # the reverse
PREFILL = "prefill"                # the copy helper refills the GPU while the driver restores
STAGING_DROP = "staging_drop"      # free the bounce ring before the driver checkpoint
ARENA_DETACH = "arena_detach"      # the arena written to an image: let it go
ARENA_ATTACH = "arena_attach"      # re-make the arena for an image's data (or map its files filled ahead)
ARENA_FILES = "arena_files"        # the arena's files, linked "into" a staging tier's folder (no copy)
IPC_FD = "ipc_fd"                  # another process's shim asks for an exported allocation (ipc_legacy.c)
# NCCL's cut (process/nccl_cut.py): every rank brought to one count of its collectives
NCCL_COUNTS = "nccl_counts"        # each communicator's operations so far
NCCL_FREEZE = "nccl_freeze"        # no new operation starts
NCCL_TARGETS = "nccl_targets"      # run on to these counts (targets="key=count,...")
NCCL_PARK = "nccl_park"            # stop there
NCCL_THAW = "nccl_thaw"            # go on
NCCL_TEARDOWN = "nccl_teardown"    # finalize and destroy every communicator
NCCL_RELOAD = "nccl_reload"        # a fresh copy of NCCL (after a restore elsewhere)
NCCL_IDS = "nccl_ids"              # new unique ids from each communicator's rank 0
NCCL_REBUILD = "nccl_rebuild"      # every communicator made anew (ids="key=id,...")
REQUESTS = (STATUS, PING, CHECKPOINT, RESTORE, PREFILL, STAGING_DROP, ARENA_DETACH, ARENA_ATTACH, ARENA_FILES,
            IPC_FD, NCCL_COUNTS, NCCL_FREEZE, NCCL_TARGETS, NCCL_PARK, NCCL_THAW, NCCL_TEARDOWN, NCCL_RELOAD,
            NCCL_IDS, NCCL_REBUILD)



def request_line(cmd: str, **fields: Any) -> bytes:
    """A request as the shim reads it: one JSON object, one line."""
    return (json.dumps({"cmd": cmd, **fields}) + "\n").encode()


# Reply.reason values code decides on.
QUIESCE_TIMEOUT = "quiesce_timeout"  # GPU work in flight did not drain in time

# What a process's checkpoint or restore reports of its data path, passed on as
# they come in a process's summary (the *_s are seconds).
REPORTED = ("quiesce_s", "data_s", "allocations", "driver_path_bytes", "arena_setup_s", "prepare_s",
            "copy_s", "release_s", "create_s", "data_path", "helper_fallback", "helper_steps",
            "copy_threads", "copy_stores", "copy_wait")


@dataclass(frozen=True)
class Blob:
    """One allocation in the shim's arena (a checkpoint's or an arena_attach's `blobs`)."""

    handle: int   # the shim's handle of the allocation (stable across restore)
    va: int       # where it is mapped whole in the process (0: not mapped whole)
    size: int
    device: int   # CUDA ordinal at checkpoint time
    host: int     # its address in the process's arena


@dataclass(frozen=True)
class NcclComm:
    """One NCCL communicator as one rank sees it (nccl_counts: "key:ops:rank:nranks")."""

    key: str
    ops: int
    rank: int
    nranks: int

    @classmethod
    def parse(cls, text: str) -> NcclComm:
        key, ops, rank, nranks = text.split(":")
        return cls(key, int(ops), int(rank), int(nranks))


@dataclass(frozen=True)
class Reply:
    """One answer of a shim. Fields the answer lacks keep their defaults."""

    ok: bool
    error: str = ""
    reason: str = ""
    # status
    pid: int = 0
    state: str = ""                 # running / checkpointed
    cuda: bool = False              # the process uses the GPU driver
    gate_closed: bool = False
    gpu_bytes: int = 0              # tracked GPU allocations
    checkpointed_bytes: int = 0
    async_bytes: int = 0
    managed_allocations: int = 0
    ipc_in_use: int = 0
    arena_ready: bool = False
    arena_bytes: int = 0
    arena_used: int = 0
    # checkpoint / restore / arena
    nbytes: int = 0                 # the GPU data moved
    data_path: str = ""             # how the data moved: helper, bounce or direct
    arena_pinned: bool = False
    attach_s: float = 0.0
    filled: bool = False            # arena_attach mapped the files filled ahead
    arena_dir: str = ""             # where the arena's files are made
    segment_ranges: tuple[tuple[int, int], ...] = ()  # (address, size) of each arena segment
    linked: bool = False                    # arena_files: linked "into" the folder asked for
    quiesce_s: float = 0.0          # waiting for GPU work in flight
    data_s: float = 0.0             # moving the data
    prefill: bool = False           # the copy helper took the refill
    device_uuids: Mapping[int, str] = field(default_factory=dict)  # by CUDA ordinal
    blobs: tuple[Blob, ...] = ()    # in handle order
    report: Mapping[str, Any] = field(default_factory=dict)  # the REPORTED keys it had
    # NCCL: status, and the cut's nccl_counts / freeze / park / thaw / teardown / ids
    nccl_comms: int = 0             # communicators the process holds
    nccl_cut: str = ""              # where its cut is (status)
    cut: str = ""                   # the same, in the cut's own answers
    quiet: bool = False             # no NCCL operation in flight
    settled: bool = False           # every communicator at its target count
    comms: tuple[NcclComm, ...] = ()
    unrestorable: str = ""          # why its NCCL state cannot be made again, or ""
    teardown_s: float = 0.0
    nccl_ids: Mapping[str, str] = field(default_factory=dict)  # communicator key -> new unique id
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)  # the whole answer, for printing it

    def document(self) -> dict[str, Any]:
        """The answer as the shim gave it (status --json prints it whole)."""
        return dict(self.raw)

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> Reply:
        blobs = sorted((d.get("blobs") or {}).items(), key=lambda kv: int(kv[0]))
        return cls(
            ok=bool(d.get("ok")), error=str(d.get("error") or ""), reason=str(d.get("reason") or ""),
            pid=int(d.get("pid") or 0), state=str(d.get("state") or ""), cuda=bool(d.get("cuda")),
            gate_closed=bool(d.get("gate_closed")), gpu_bytes=int(d.get("gpu_bytes") or 0),
            checkpointed_bytes=int(d.get("checkpointed_bytes") or 0), async_bytes=int(d.get("async_bytes") or 0),
            managed_allocations=int(d.get("managed_allocations") or 0), ipc_in_use=int(d.get("ipc_in_use") or 0),
            arena_ready=bool(d.get("arena_ready")), arena_bytes=int(d.get("arena_bytes") or 0),
            arena_used=int(d.get("arena_used") or 0),
            nbytes=int(d.get("bytes") or 0), data_path=str(d.get("data_path") or ""),
            arena_pinned=bool(d.get("arena_pinned")), attach_s=float(d.get("attach_s") or 0.0),
            filled=bool(d.get("filled")), arena_dir=str(d.get("arena_dir") or ""),
            segment_ranges=tuple((int(a), int(n)) for a, n in d.get("segment_ranges") or ()),
            linked=bool(d.get("linked")),
            quiesce_s=float(d.get("quiesce_s") or 0.0), data_s=float(d.get("data_s") or 0.0),
            prefill=bool(d.get("prefill")),
            device_uuids={int(k): str(v) for k, v in (d.get("device_uuids") or {}).items()},
            blobs=tuple(Blob(handle=int(b["handle"]), va=int(b["va"]), size=int(b["size"]),
                             device=int(b["device"]), host=int(b["host"])) for _, b in blobs),
            report={k: d[k] for k in REPORTED if k in d},
            nccl_comms=int(d.get("nccl_comms") or 0), nccl_cut=str(d.get("nccl_cut") or ""),
            cut=str(d.get("cut") or ""), quiet=bool(d.get("quiet")), settled=bool(d.get("settled")),
            comms=tuple(NcclComm.parse(c) for c in d.get("comms") or ()),
            unrestorable=str(d.get("unrestorable") or ""), teardown_s=float(d.get("teardown_s") or 0.0),
            nccl_ids=dict(item.partition("=")[::2] for item in str(d.get("ids") or "").split(",") if item),
            raw=dict(d))


NO_REPLY = Reply(ok=False, error="no answer")  # a process that was not asked


# -- the copy helper's protocol (shim/helper.c asks, shim/copy_helper.py answers) ----
# One JSON object per datagram, descriptors as SCM_RIGHTS. Answers: {"ok": true, ...}
# or {"ok": false, "error": ...}; see shim/copy_helper.py for what each request does.

HELPER_SEGMENT = "segment"
HELPER_OUT = "out"
HELPER_PREFILL = "prefill"
HELPER_IN = "in"
HELPER_IN_DONE = "in_done"
HELPER_FORGET = "forget"


@dataclass(frozen=True)
class HelperBlob:
    """One allocation as the shim names it to its copy helper: [id, size, segment,
    offset, device uuid, held] on the wire."""

    id: int
    size: int
    seg: int        # the arena segment it lives in
    off: int        # its offset there
    device: str     # the GPU's UUID
    held: bool      # the helper made it and keeps a handle to it


@dataclass(frozen=True)
class HelperRequest:
    cmd: str
    blobs: tuple[HelperBlob, ...] = ()
    seg: int = 0        # segment: which one, its size and generation
    size: int = 0
    gen: int = 0
    keep: bool = False  # in_done: keep a handle to what `in` handed over
    id: int = 0         # forget: which allocation

    @classmethod
    def parse(cls, data: bytes) -> HelperRequest:
        d = json.loads(data)
        return cls(cmd=str(d.get("cmd") or ""),
                   blobs=tuple(HelperBlob(int(b[0]), int(b[1]), int(b[2]), int(b[3]), str(b[4]), bool(int(b[5])))
                               for b in d.get("blobs") or ()),
                   seg=int(d.get("seg") or 0), size=int(d.get("size") or 0), gen=int(d.get("gen") or 0),
                   keep=bool(d.get("keep")), id=int(d.get("id") or 0))


def helper_answer(fields: Mapping[str, Any] | None = None, error: str | None = None) -> bytes:
    """The copy helper's answer: its step timings ("map_s": seconds, ...) and counts, or the error."""
    return json.dumps({"ok": False, "error": error} if error is not None else {"ok": True, **(fields or {})}).encode()
