"""Which GPU of this node each GPU of an image is restored onto. Pure logic: the
node's GPUs come in as a list, so all of it is tested without a GPU.

An image records, per CUDA process, the UUIDs of the GPUs it sees in CUDA ordinal
order (`gpu_uuids`) and how many bytes of GPU data it holds on each (`gpu_bytes`).
At restore (`plan`):
  * every recorded GPU is here, usable by this restore, with room for its data:
    nothing to map, the driver puts the processes back where they were;
  * otherwise each GPU that is missing (or full) goes to a GPU here of the same
    model that no other GPU of the image takes, the one with the most free memory
    first, and GPUs still here stay on themselves; when keeping them leaves no
    room, every GPU of the image is placed afresh;
  * `--gpu` names the target of each GPU of the image instead, in image order.
Anything else is a GpucrError with cause and fix, raised before anything changed.

The driver (cuCheckpointProcessRestore with gpuPairs) then gets, for each process
that moves, a pair (old UUID, new UUID) for every GPU of the node it was
checkpointed on, not only those the process sees: measured on two H200s, a
process with CUDA_VISIBLE_DEVICES=0 restored with the one pair (0 -> 1) fails
with CUDA_ERROR_INVALID_VALUE, and with (0 -> 1, 1 -> 0) it runs on GPU 1
(bench/probe/remap_probe.py). The GPUs the process does not see keep their own
UUID where it is here and free, else take a GPU nothing else takes. CUDA
ordinals stay as they were, only the physical GPUs change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucr_hpc import figures
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.gpu.inventory import Gpu


@dataclass(frozen=True)
class ImageGpu:
    uuid: str    # where the image's processes ran
    model: str
    need: int    # bytes of GPU data the image holds for it


@dataclass
class Plan:
    targets: dict[str, Gpu]   # image UUID -> GPU here
    node_then: list[str] = field(default_factory=list)   # every GPU of the checkpoint's node
    node_here: list[str] = field(default_factory=list)   # every GPU of this node

    @property
    def moves(self) -> bool:
        return any(old != new.uuid for old, new in self.targets.items())

    def pairs(self, uuids: list[str]) -> list[tuple[str, str]] | None:
        """The driver's gpuPairs for a process that sees `uuids`, completed over every GPU
        of the checkpoint's node onto this node's; None when the process stays put."""
        node_then, node_here = self.node_then, self.node_here
        pairs = [(u, self.targets[u].uuid) for u in uuids]
        if all(old == new for old, new in pairs):
            return None
        mapped, taken = {old for old, _ in pairs}, {new for _, new in pairs}
        rest = [u for u in node_then if u not in mapped]
        for u in [u for u in rest if u in node_here and u not in taken]:
            pairs.append((u, u))
            mapped.add(u)
            taken.add(u)
        free = [u for u in node_here if u not in taken]
        for u, new in zip([u for u in rest if u not in mapped], free):
            pairs.append((u, new))
        return pairs


def image_gpus(m: dict) -> list[ImageGpu] | None:
    """The GPUs of an image's CUDA processes, each once, in order of first use (process
    by process, ordinal by ordinal); None when the image does not record them (written
    by an older gpucr-hpc: restored where it was, without a plan)."""
    recs = [r for r in m.get("gpu_processes") or [] if r.get("cuda")]
    if not recs or any(not r.get("gpu_uuids") for r in recs):
        return None
    gpu = m.get("gpu") or {}
    models = dict(zip(gpu.get("uuids") or [], gpu.get("models") or []))
    need: dict[str, int] = {}
    for r in recs:
        sizes = r.get("gpu_bytes") or [0] * len(r["gpu_uuids"])
        for uuid, nbytes in zip(r["gpu_uuids"], sizes):
            need[uuid] = need.get(uuid, 0) + int(nbytes)
    return [ImageGpu(u, models.get(u) or gpu.get("model") or "", n) for u, n in need.items()]


def plan(image: list[ImageGpu], here: list[Gpu], usable: list[Gpu] | None = None,
         force: list[str] | None = None) -> Plan:
    """Targets for the image's GPUs on this node.

    here: every GPU of the node; usable: those this restore may take (the GPUs of
    its CUDA_VISIBLE_DEVICES; default all); force: --gpu, nvidia-smi indices or UUIDs."""
    if force:
        return Plan(dict(zip((g.uuid for g in image), _forced(image, here, force))))
    usable = list(here if usable is None else usable)
    by_uuid = {g.uuid: g for g in usable}
    stay = [g for g in image if g.uuid in by_uuid and by_uuid[g.uuid].free >= g.need]
    if len(stay) == len(image):
        return Plan({g.uuid: by_uuid[g.uuid] for g in image})
    targets, stuck = _place(image, stay, usable)
    if targets is None and stay:
        targets, _ = _place(image, [], usable)
    if targets is None:
        raise _no_room(image, stuck, here, usable)
    return Plan(targets)


def _place(image: list[ImageGpu], stay: list[ImageGpu], usable: list[Gpu]):
    """(targets, None), or (None, the image GPU that found no place). Largest need first,
    each onto the free GPU of its model with the most free memory (lowest index on a tie)."""
    targets = {g.uuid: next(h for h in usable if h.uuid == g.uuid) for g in stay}
    taken = {h.uuid for h in targets.values()}
    for g in sorted((g for g in image if g.uuid not in targets), key=lambda g: -g.need):
        fits = [h for h in usable if h.model == g.model and h.uuid not in taken and h.free >= g.need]
        if not fits:
            return None, g
        best = max(fits, key=lambda h: (h.free, -h.index))
        targets[g.uuid] = best
        taken.add(best.uuid)
    return targets, None


def _no_room(image: list[ImageGpu], g: ImageGpu, here: list[Gpu], usable: list[Gpu]) -> GpucrError:
    same = [h for h in usable if h.model == g.model]
    where = "is not on this node" if g.uuid not in {h.uuid for h in here} else (
        "is not usable by this restore (CUDA_VISIBLE_DEVICES)" if g.uuid not in {h.uuid for h in usable}
        else f"has {figures.size(next(h.free for h in usable if h.uuid == g.uuid))} free")
    have = ", ".join(f"GPU {h.index} with {figures.size(h.free)} free" for h in same) or "none"
    n = sum(1 for x in image if x.model == g.model)
    model = g.model or "GPU"
    return GpucrError(
        f"no GPU here to restore the image's {model} {g.uuid} onto ({figures.size(g.need)} of data): "
        f"it {where}, and the image needs {n} {model}{'s' if n > 1 else ''} with room; "
        f"usable {model}s here: {have}",
        f"restore on a node with {n} free {model}{'s' if n > 1 else ''}, end other GPU processes "
        "here, or pick the GPUs with --gpu")


def check_in_place(uuids: list[str], need: int, here: list[Gpu]) -> None:
    """Room for an image that does not record which GPU each process had (written by an
    older gpucr-hpc): it goes back onto the GPUs of its node (`uuids`), so its data
    (`need` bytes) must fit in their free memory here, summed, since the share of each
    is not known (exact for an image of one GPU). Its GPUs that are not here are the
    driver's to refuse."""
    mine = [h for h in here if h.uuid in uuids]
    free = sum(h.free for h in mine)
    if not mine or need <= free:
        return
    have = ", ".join(f"GPU {h.index} {figures.size(h.free)}" for h in mine)
    raise GpucrError(f"the image needs {figures.size(need)} of GPU memory on the GPUs it had (an image of an "
                     f"older gpucr-hpc goes back onto them), and they have {figures.size(free)} free here ({have})",
                     "end other GPU processes on this node or restore on another one")


def _resolve(item: str, here: list[Gpu]) -> Gpu:
    if item.isdigit():
        match = [h for h in here if h.index == int(item)]
    elif item.upper().startswith("GPU-"):  # a UUID, or enough of it to be unique
        match = [h for h in here if h.uuid.lower().startswith(item.lower())]
    else:
        match = []
    if len(match) != 1:
        known = ", ".join(f"{h.index} {h.uuid}" for h in here) or "none"
        what = "names several GPUs" if match else "names no GPU of this node"
        raise GpucrError(f"--gpu {item} {what} (GPUs here: {known})",
                         "give nvidia-smi indices or UUIDs, as `nvidia-smi -L` lists them")
    return match[0]


def _forced(image: list[ImageGpu], here: list[Gpu], force: list[str]) -> list[Gpu]:
    if len(force) != len(image):
        listed = ", ".join(g.uuid for g in image)
        raise GpucrError(f"--gpu names {len(force)} GPU{'s' if len(force) != 1 else ''}, the image has "
                         f"{len(image)} ({listed})", f"give {len(image)}, one for each of those, in that order")
    targets = [_resolve(item, here) for item in force]
    for t in targets:
        if targets.count(t) > 1:
            raise GpucrError(f"--gpu names GPU {t.index} ({t.uuid}) twice",
                             "give each GPU of the image a GPU of its own")
    for g, t in zip(image, targets):
        if t.model != g.model:
            raise GpucrError(f"--gpu {t.index} is a {t.model}, the image's {g.uuid} is a {g.model}",
                             "restore onto a GPU of the same model")
        if t.free < g.need:
            raise GpucrError(f"--gpu {t.index} has {figures.size(t.free)} free, the image holds {figures.size(g.need)} "
                             f"of GPU data for it", "end other GPU processes there or pick another GPU")
    return targets
