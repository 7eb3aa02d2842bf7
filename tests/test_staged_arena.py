"""A process's GPU data staged as its arena's own files (store/files.py), without a
GPU: a live (CPU) process's buffers stand for the arena. The metadata file and the
segment files join, on the drain, into the very .h5 file a copy would have
written; a restore on the same node opens the files instead of filling new ones;
a missing or short part stops either in one line with nothing left behind. The
shim side (linking its files, mapping them back) runs on a GPU machine
(test_job_gpu.py)."""

import os

import pytest
from test_migrate_gpu import _holder

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.process import arena_fill, image_gpu
from gpucr_hpc.store import drain, gpu_data
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import manifest as mf

PAGE = 4096




@pytest.fixture
def staged(node_memory, tmp_path):
    """An image in node memory as a checkpoint that kept its arena leaves it: one
    segment file per buffer (highest address first, as mmap places them), the .h5
    file's metadata, a manifest; and the .h5 file the copy would have written."""
    child, blobs = _holder()
    try:
        whole = tmp_path / "process-7.h5"
        digests = gpu_data.save_process(whole, child.pid, blobs, block_bytes=image_store.HASH_BLOCK)["checksum"]
        unit = node_memory / "batch"
        w = image_store.ImageWriter(unit, mf.new_manifest(kind="process", vendor=None, gpu=None))
        (unit / "process-7.arena").mkdir()
        segments = []
        for k, b in enumerate(sorted(blobs, key=lambda b: -b.host)):
            base = b.host // PAGE * PAGE
            size = -(-(b.host + b.size) // PAGE) * PAGE - base
            data = bytearray(size)
            with open(f"/proc/{child.pid}/mem", "rb") as mem:
                mem.seek(b.host)
                data[b.host - base:b.host - base + b.size] = mem.read(b.size)
            name = image_store.arena_name(7, k)
            (unit / name).write_bytes(bytes(data))
            segments.append((name, base, size))
        gpu_data.save_layout(unit / image_store.layout_name(7), child.pid, blobs)
        w.add_arena("process-7.h5", image_store.layout_name(7), segments)
        w.manifest["gpu_processes"] = [{"pid": 7, "image_pid": 7, "h5": "process-7.h5", "arena_dir": "/nowhere",
                                        "arena_segments": [[a, n] for _, a, n in segments]}]
        w.commit()
    finally:
        child.kill()
        child.wait()
    return unit, blobs, segments, whole, digests


def test_the_parts_join_into_the_file_a_copy_writes(staged, tmp_path):
    unit, _, segments, whole, digests = staged
    assert (unit / image_store.layout_name(7)).stat().st_blocks * 512 < whole.stat().st_size // 2  # holes
    out = tmp_path / "joined.h5"
    size, got = gpu_data.compose(unit / image_store.layout_name(7),
                                 [(unit / f, a, n) for f, a, n in segments], out, block_bytes=image_store.HASH_BLOCK)
    assert size == whole.stat().st_size and got == digests
    assert out.read_bytes() == whole.read_bytes()


def test_the_drain_writes_the_whole_h5_file_checked(staged, tmp_path):
    unit, _, _, whole, digests = staged
    image_store.verify(unit, mf.load(unit), sizes_only=True)  # what a restore from node memory checks
    dest = tmp_path / "root" / "gen-1" / "batch"
    drain.drain_image(unit, dest)
    assert (dest / "process-7.h5").read_bytes() == whole.read_bytes()
    assert not (dest / image_store.layout_name(7)).exists() and not (dest / "process-7.arena").exists()
    rec = mf.load(dest)["files"]["process-7.h5"]
    assert rec["sha256_blocks"] == digests and "arena" not in rec
    image_store.open_image(dest)  # committed, every checksum right


@pytest.mark.parametrize("damage", ["missing", "short"])
def test_a_missing_or_short_part_stops_the_drain_and_the_restore(staged, tmp_path, damage):
    unit, _, segments, _, _ = staged
    seg = unit / segments[0][0]
    if damage == "missing":
        seg.unlink()
    else:
        os.truncate(seg, segments[0][2] - PAGE)
    with pytest.raises(GpucrError, match=r"process-7\.arena/0") as e:
        image_store.verify(unit, mf.load(unit), sizes_only=True)
    assert "\n" not in e.value.one_line()
    dest = tmp_path / "root" / "batch"
    with pytest.raises(GpucrError) as e:
        drain.drain_image(unit, dest)
    assert "\n" not in e.value.one_line() and not dest.exists()


def test_a_restore_on_the_node_opens_the_arena_files_instead_of_filling(staged):
    unit, blobs, segments, _, _ = staged
    m = mf.load(unit)
    fds_before = len(os.listdir("/proc/self/fd"))
    fill = arena_fill.ArenaFill(m, unit, check=False)
    filled = fill.take(7)
    try:
        assert filled is not None and filled.bytes == sum(b.size for b in blobs)
        assert filled.kept and not filled.linkable  # named in the stage: the shim moves off them later
        assert [os.fstat(fd).st_ino for fd in filled.fds] == [(unit / f).stat().st_ino for f, _, _ in segments]
        assert {(b.handle, b.host) for b in filled.blobs} == {(b.handle, b.host) for b in blobs}
    finally:
        filled.close()
        fill.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_arena_files_that_are_not_the_recorded_segments_fail_the_restore_in_one_line(staged):
    unit, _, segments, _, _ = staged
    m = mf.load(unit)
    rec = m["gpu_processes"][0]
    rec["arena_segments"] = rec["arena_segments"][::-1]  # not the order the shim has them in
    fill = arena_fill.ArenaFill(m, unit, check=False)
    try:
        with pytest.raises(GpucrError, match="not the segments the image records") as e:
            image_gpu.taken(fill, rec, unit)
        assert "intact copy" in e.value.fix
    finally:
        fill.close()
