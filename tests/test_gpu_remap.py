"""Restore onto other GPUs: which GPU each GPU of an image goes to.

No GPU needed: the node's GPUs are given as lists (models, UUIDs, free memory) to
the real planning code (gpu_remap, image_gpu.plan_restore), CUDA_VISIBLE_DEVICES
is parsed as CUDA does (gpu_inventory), the GPU pairs are laid out in the driver's
struct when cuda-bindings is installed. The GPU run is tests/test_gpu_remap_gpu.py.
"""

import ctypes
import subprocess
import sys

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.gpu import inventory as gpu_inventory
from gpucr_hpc.gpu import remap as gpu_remap
from gpucr_hpc.gpu.inventory import Gpu
from gpucr_hpc.gpu.remap import ImageGpu
from gpucr_hpc.process import image_gpu
from gpucr_hpc.shim.protocol import NO_REPLY, Reply

GiB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"


def uuid(n: int) -> str:
    return f"GPU-{n:08x}-0000-0000-0000-{n:012x}"


def node(*gpus) -> list[Gpu]:
    """node((model, free GiB), ...): GPU i has index i and uuid(100 + i)."""
    return [Gpu(index=i, uuid=uuid(100 + i), model=m, free=int(f * GiB)) for i, (m, f) in enumerate(gpus)]


def started_with(env: dict) -> subprocess.Popen:
    """A process with environment env, once it runs (before exec, /proc shows ours)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                         env={"PATH": "/usr/bin:/bin", **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def stop(p: subprocess.Popen) -> None:
    p.stdin.close()
    p.wait()


def one_line(e: GpucrError) -> str:
    text = e.one_line()
    assert "\n" not in text and e.cause and e.fix, text
    return text


# -- CUDA_VISIBLE_DEVICES, as CUDA reads it ------------------------------------------

def test_parse_smi_rows():
    text = ("0, GPU-aa, 580.159.04, NVIDIA H100 80GB HBM3, 81000\n1, GPU-bb, 580.159.04, NVIDIA H100 80GB HBM3, [N/A]\n"
            "2, GPU-cc, 580.159.04, A, model, with commas, 1\n\n")
    assert gpu_inventory.parse_smi(text) == [Gpu(0, "GPU-aa", H100, 81000 << 20, "580.159.04"),
                                             Gpu(2, "GPU-cc", "A, model, with commas", 1 << 20, "580.159.04")]


def test_visible_devices():
    here = node((H100, 80), (H100, 80), (H100, 80))
    vis = gpu_inventory.visible
    assert vis(None, here) == here
    assert vis("", here) == []
    assert vis("-1", here) == []
    assert vis("2,0", here) == [here[2], here[0]]
    assert vis(f"{uuid(101)[:12]},0", here) == [here[1], here[0]]   # a unique UUID prefix
    assert vis("1,7,0", here) == [here[1]]        # CUDA stops at the first bad entry
    assert vis("1,1,0", here) == [here[1]]        # ... and at a repeated one
    assert vis("GPU-0000,1", here) == []          # a prefix of several GPUs names none
    assert vis("MIG-abc", here) == []


def test_process_gpus_from_its_environment():
    here = node((H100, 80), (H100, 80))
    for env, want in (({"CUDA_VISIBLE_DEVICES": "1"}, [here[1]]), ({}, here)):
        p = started_with(env)
        try:
            assert gpu_inventory.process_gpus(p.pid, here) == want
        finally:
            stop(p)


# -- what an image records ----------------------------------------------------------------

def test_image_gpus_each_once_with_the_data_of_every_process():
    m = {"gpu": {"model": H100, "models": [H100, H200], "uuids": [uuid(1), uuid(2)]},
         "gpu_processes": [
             {"pid": 10, "cuda": True, "gpu_uuids": [uuid(2), uuid(1)], "gpu_bytes": [5 * GiB, 1 * GiB]},
             {"pid": 11, "cuda": False},
             {"pid": 12, "cuda": True, "gpu_uuids": [uuid(1)], "gpu_bytes": [2 * GiB]}]}
    assert gpu_remap.image_gpus(m) == [ImageGpu(uuid(2), H200, 5 * GiB), ImageGpu(uuid(1), H100, 3 * GiB)]


def test_old_image_has_no_gpu_list():
    m = {"gpu": {"model": H100}, "gpu_processes": [{"pid": 10, "cuda": True, "h5": "process-10.h5"}]}
    assert gpu_remap.image_gpus(m) is None
    with pytest.raises(GpucrError, match="does not record the GPUs") as e:
        image_gpu.plan_restore(m, ["1"], here=node((H100, 80)), env={})
    assert "without --gpu" in one_line(e.value)
    assert image_gpu.plan_restore(m, None, here=node((H100, 80)), env={}) is None


def old_image(uuids, nbytes):
    """An image of an older gpucr-hpc: its node's GPUs and its GPU data, no GPU per process."""
    return {"gpu": {"model": H100, "uuids": uuids}, "gpu_bytes": nbytes,
            "gpu_processes": [{"pid": 10, "cuda": True, "h5": "process-10.h5"}]}


def test_old_image_needs_room_on_its_own_gpu_not_on_the_emptiest():
    """It goes back onto the GPU it had: that one must have room, however free the others are."""
    here = node((H100, 10), (H100, 80))
    with pytest.raises(GpucrError) as e:
        image_gpu.plan_restore(old_image([uuid(100)], 40 * GiB), None, here=here, env={})
    text = one_line(e.value)
    assert "needs 40.0 GiB of GPU memory on the GPUs it had" in text and "10.0 GiB free here (GPU 0 10.0 GiB)" in text
    assert image_gpu.plan_restore(old_image([uuid(101)], 40 * GiB), None, here=here, env={}) is None


def test_old_image_over_several_gpus_is_not_refused_for_its_total():
    """Its data may be spread over the GPUs it had: no single one needs room for all of it."""
    here = node((H100, 40), (H100, 40))
    assert image_gpu.plan_restore(old_image([uuid(100), uuid(101)], 60 * GiB), None, here=here, env={}) is None
    with pytest.raises(GpucrError, match="80.0 GiB free here"):
        image_gpu.plan_restore(old_image([uuid(100), uuid(101)], 90 * GiB), None, here=here, env={})


def test_old_image_whose_gpus_are_not_here_is_left_to_the_driver():
    assert gpu_remap.check_in_place([uuid(7)], 40 * GiB, node((H100, 10))) is None


# -- the plan -----------------------------------------------------------------------------

def test_all_here_with_room_stays_put():
    here = node((H100, 10), (H100, 70))
    p = gpu_remap.plan([ImageGpu(uuid(100), H100, 8 * GiB)], here)
    assert not p.moves and p.targets == {uuid(100): here[0]}
    assert p.pairs([uuid(100)]) is None


def test_missing_gpu_goes_to_the_free_one_of_its_model_with_most_memory():
    here = node((H200, 139), (H100, 20), (H100, 60), (H100, 60))
    p = gpu_remap.plan([ImageGpu(uuid(1), H100, 8 * GiB)], here)
    assert p.moves and p.targets[uuid(1)] == here[2]   # H200 not taken; on a tie the lower index
    assert p.pairs([uuid(1)]) == [(uuid(1), uuid(102))]


def test_gpus_still_here_keep_themselves_and_are_not_taken():
    here = node((H100, 30), (H100, 70), (H100, 50))
    image = [ImageGpu(uuid(100), H100, GiB), ImageGpu(uuid(7), H100, GiB)]
    p = gpu_remap.plan(image, here)
    assert p.targets == {uuid(100): here[0], uuid(7): here[1]}
    # a process seeing both gets a pair for each, the one that stays included
    assert p.pairs([uuid(100), uuid(7)]) == [(uuid(100), uuid(100)), (uuid(7), uuid(101))]
    assert p.pairs([uuid(100)]) is None   # a process on the staying GPU alone is not remapped


def test_pairs_cover_every_gpu_of_the_checkpoint_node():
    """The driver wants a pair for every GPU of the node the process was checkpointed
    on, not only the ones it sees (CUDA_VISIBLE_DEVICES=0 with the one pair 0 -> 1:
    CUDA_ERROR_INVALID_VALUE on two H200s)."""
    u0, u1, u2 = uuid(100), uuid(101), uuid(102)
    p = gpu_remap.Plan({u0: node((H100, 80), (H100, 80))[1]}, node_then=[u0, u1], node_here=[u0, u1])
    assert p.pairs([u0]) == [(u0, u1), (u1, u0)]
    # a GPU the process does not see keeps its own UUID when free here
    p = gpu_remap.Plan({u0: node((H100, 1), (H100, 1), (H100, 80))[2]}, node_then=[u0, u1, u2],
                       node_here=[u0, u1, u2])
    assert p.pairs([u0]) == [(u0, u2), (u1, u1), (u2, u0)]
    # another node: the rest in order onto the GPUs left here
    a, b, x, y = uuid(1), uuid(2), uuid(200), uuid(201)
    p = gpu_remap.Plan({b: node((H100, 80))[0]}, node_then=[a, b], node_here=[uuid(100), y])
    assert p.pairs([b]) == [(b, uuid(100)), (a, y)]
    assert x not in {n for _, n in p.pairs([b])}


def test_plan_restore_knows_both_nodes():
    here = node((H100, 80), (H100, 80))
    m = {"gpu": {"model": H100, "uuids": [uuid(100), uuid(101)], "models": [H100, H100]},
         "gpu_processes": [{"pid": 10, "cuda": True, "gpu_uuids": [uuid(100)], "gpu_bytes": [GiB]}]}
    p = image_gpu.plan_restore(m, ["1"], here=here, env={})
    assert p.pairs([uuid(100)]) == [(uuid(100), uuid(101)), (uuid(101), uuid(100))]


def test_largest_need_is_placed_first():
    here = node((H100, 12), (H100, 30))
    image = [ImageGpu(uuid(1), H100, 10 * GiB), ImageGpu(uuid(2), H100, 25 * GiB)]
    p = gpu_remap.plan(image, here)
    assert p.targets == {uuid(1): here[0], uuid(2): here[1]}


def test_present_but_full_gpu_moves():
    here = node((H100, 2), (H100, 40))
    p = gpu_remap.plan([ImageGpu(uuid(100), H100, 8 * GiB)], here)
    assert p.targets[uuid(100)] == here[1]


def test_fresh_placement_when_keeping_leaves_no_room():
    # GPU 100 is here with room for its 1 GiB, but the missing 30 GiB one fits only there
    here = node((H100, 40), (H100, 5))
    image = [ImageGpu(uuid(100), H100, GiB), ImageGpu(uuid(9), H100, 30 * GiB)]
    p = gpu_remap.plan(image, here)
    assert p.targets == {uuid(9): here[0], uuid(100): here[1]}


def test_only_usable_gpus_are_taken():
    """A Slurm step's CUDA_VISIBLE_DEVICES: GPU 0 belongs to another job now."""
    here = node((H100, 70), (H100, 70))
    image = [ImageGpu(uuid(100), H100, GiB)]
    p = image_gpu.plan_restore({"gpu": {"model": H100, "models": [H100], "uuids": [uuid(100)]},
                                  "gpu_processes": [{"pid": 5, "cuda": True, "gpu_uuids": [uuid(100)],
                                                     "gpu_bytes": [GiB]}]},
                                 here=here, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert p.targets == {uuid(100): here[1]}
    assert not image_gpu.plan_restore(
        {"gpu_processes": [{"pid": 5, "cuda": True, "gpu_uuids": [uuid(100)], "gpu_bytes": [GiB]}],
         "gpu": {"model": H100}}, here=here, env={}).moves
    with pytest.raises(GpucrError, match="not usable by this restore"):
        gpu_remap.plan(image, here, usable=[])


def test_refused_without_a_gpu_of_that_model_with_room():
    here = node((H200, 139), (H100, 5))
    with pytest.raises(GpucrError) as e:
        gpu_remap.plan([ImageGpu(uuid(1), H100, 8 * GiB)], here)
    text = one_line(e.value)
    assert f"restore the image's {H100} {uuid(1)}" in text and "is not on this node" in text
    assert "GPU 1 with 5.0 GiB free" in text and "--gpu" in text


def test_refused_when_the_other_gpus_of_the_image_took_them():
    here = node((H100, 70), (H100, 70))
    image = [ImageGpu(uuid(1), H100, GiB), ImageGpu(uuid(2), H100, GiB), ImageGpu(uuid(3), H100, GiB)]
    with pytest.raises(GpucrError, match="the image needs 3 NVIDIA H100 80GB HBM3s with room"):
        gpu_remap.plan(image, here)


# -- --gpu --------------------------------------------------------------------------------

def test_forced_targets_by_index_uuid_and_prefix():
    here = node((H100, 70), (H100, 70), (H100, 70))
    image = [ImageGpu(uuid(100), H100, GiB), ImageGpu(uuid(101), H100, GiB)]
    p = gpu_remap.plan(image, here, force=["2", uuid(100)[:13]])
    assert p.targets == {uuid(100): here[2], uuid(101): here[0]}
    assert gpu_remap.plan(image, here, force=["0", "1"]).moves is False
    # --gpu may name a GPU the restore's CUDA_VISIBLE_DEVICES leaves out
    assert gpu_remap.plan(image[:1], here, usable=[], force=["1"]).targets[uuid(100)] == here[1]


@pytest.mark.parametrize("force,expect", [
    (["1"], "--gpu names 1 GPU, the image has 2"),
    (["1", "1"], "names GPU 1 (GPU-00000065-0000-0000-0000-000000000065) twice"),
    (["0", "5"], "--gpu 5 names no GPU of this node"),
    (["0", "GPU-0000"], "--gpu GPU-0000 names several GPUs"),
    (["0", "h100"], "--gpu h100 names no GPU"),
    (["0", "3"], f"--gpu 3 is a {H200}"),
    (["0", "2"], "--gpu 2 has 1.0 GiB free, the image holds 4.0 GiB"),
])
def test_forced_targets_refused(force, expect):
    here = node((H100, 70), (H100, 70), (H100, 1), (H200, 139))
    image = [ImageGpu(uuid(1), H100, 4 * GiB), ImageGpu(uuid(2), H100, 4 * GiB)]
    with pytest.raises(GpucrError) as e:
        gpu_remap.plan(image, here, force=force)
    assert expect in one_line(e.value)


# -- what the report and the driver get ----------------------------------------------------

def test_placement_report():
    here = node((H100, 70), (H100, 70))
    m = {"gpu": {"model": H100},
         "gpu_processes": [{"pid": 10, "cuda": True, "gpu_uuids": [uuid(100)], "gpu_bytes": [GiB]},
                           {"pid": 11, "cuda": False}]}
    p = image_gpu.plan_restore(m, ["1"], here=here, env={})
    assert image_gpu.placement(m, p, {10: 4321, 11: 4322}) == [
        {"pid": 4321, "image_pid": 10,
         "gpus": [{"ordinal": 0, "image_uuid": uuid(100), "uuid": uuid(101), "index": 1, "moved": True}]}]
    old = {"gpu_processes": [{"pid": 10, "cuda": True, "h5": None}]}
    assert image_gpu.placement(old, None, {10: 4321}) == [{"pid": 4321, "image_pid": 10, "gpus": []}]


def test_checkpoint_records_the_shims_gpus_else_the_environment():
    gc = image_gpu.GpuCheckpoint.__new__(image_gpu.GpuCheckpoint)
    gc._node = node((H100, 70), (H100, 70))
    told = {str(i): uuid(i) for i in range(11)}   # ordinals sort as numbers, not text
    assert gc._gpu_uuids(1, Reply.parse({"ok": True, "device_uuids": told})) == [uuid(i) for i in range(11)]
    p = started_with({"CUDA_VISIBLE_DEVICES": "1,0"})
    try:
        assert gc._gpu_uuids(p.pid, NO_REPLY) == [uuid(101), uuid(100)]
    finally:
        stop(p)
    assert gc._gpu_uuids(2**22 + 12345, NO_REPLY) == []   # no such process: not recorded


def test_driver_restore_args_hold_the_pairs():
    """The struct cuCheckpointProcessRestore reads: pointer, count, zeroed rest; each pair
    the 16 bytes of the old UUID, then the new one (cuda-bindings >= 13.3.1)."""
    cu = pytest.importorskip("cuda.bindings.driver")
    if not hasattr(cu, "CUcheckpointRestoreArgs"):
        pytest.skip("this cuda-bindings lacks CUcheckpointRestoreArgs")
    from gpucr_hpc.gpu.driver_nvidia import NvidiaDriver, uuid_bytes

    drv = NvidiaDriver.__new__(NvidiaDriver)   # the struct needs no GPU, cuInit is not called
    drv.cu = cu
    a, b = "GPU-8ca2b0a5-1111-2222-3333-444455556666", "GPU-00112233-4455-6677-8899-aabbccddeeff"
    args = drv.restore_args([(a, b), (b, a)])
    raw = ctypes.string_at(args.getPtr(), 64)
    ptr, count = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:12], "little")
    assert count == 2 and raw[12:] == bytes(52)
    assert ctypes.string_at(ptr, 64) == uuid_bytes(a) + uuid_bytes(b) + uuid_bytes(b) + uuid_bytes(a)
    with pytest.raises(ValueError):
        uuid_bytes("GPU-1234")
