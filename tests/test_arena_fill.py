"""The arena filled ahead of a restore (process/arena_fill.py), without a GPU: the
.h5 file of a live (CPU) process's buffers goes into nameless files, one per
segment, at the placements the file records; from node memory, from a disk,
checked block by block. Handing the files to a restored shim, which maps them,
is exercised on a GPU machine (test_migrate_gpu.py, the job GPU tests)."""

import mmap
import os
import subprocess
import threading
from pathlib import Path

import pytest
from test_migrate_gpu import _holder

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.process import arena_fill, image_gpu
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import gpu_data

PAGE = 1 << 21


def _segments(blobs) -> list[tuple[int, int]]:
    """Ranges around the blobs, as an arena's segments would hold them: 2 MiB-aligned,
    merged where they meet."""
    out: list[list[int]] = []
    for b in sorted(blobs, key=lambda b: b.host):
        lo, hi = b.host // PAGE * PAGE, -(-(b.host + b.size) // PAGE) * PAGE
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in out]


def _bytes_at(filled, segments, blob) -> bytes:
    """A blob's bytes in the filled file of the segment that holds it."""
    for fd, (base, size) in zip(filled.fds, segments):
        if base <= blob.host < base + size:
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
                return mm[blob.host - base:blob.host - base + blob.size]
    raise AssertionError(f"no segment holds {blob.host:#x}")




@pytest.fixture
def saved(tmp_path, node_memory):
    """A holder's buffers saved twice: to node memory unhashed, to a disk with digests."""
    child, blobs = _holder()
    try:
        staged, on_disk = node_memory / "process-1.h5", tmp_path / "process-1.h5"
        gpu_data.save_process(staged, child.pid, blobs, hashed=False)
        digests = gpu_data.save_process(on_disk, child.pid, blobs)["checksum"]
        want = {b.handle: bytes(next(x.data for x in gpu_data.read(on_disk) if x.size == b.size)) for b in blobs}
    finally:
        child.kill()
        child.wait()
    return blobs, staged, on_disk, digests, want


@pytest.mark.parametrize("source", ["node memory", "disk", "disk, checked"])
def test_the_arena_is_filled_at_the_placements_its_image_records(saved, node_memory, source):
    blobs, staged, on_disk, digests, want = saved
    segments = _segments(blobs)
    h5 = staged if source == "node memory" else on_disk
    arena_dir = node_memory / "arena"
    arena_dir.mkdir()
    filled = arena_fill.fill(h5, segments, str(arena_dir), threading.Event(),
                             digests if source.endswith("checked") else None)
    try:
        assert filled.bytes == sum(b.size for b in blobs) and len(filled.fds) == len(segments)
        assert {(b.handle, b.size, b.host) for b in filled.blobs} == {(b.handle, b.size, b.host) for b in blobs}
        for b in blobs:
            assert _bytes_at(filled, segments, b) == want[b.handle], hex(b.handle)
        for fd, (_, size) in zip(filled.fds, segments):
            assert os.fstat(fd).st_size == size and os.fstat(fd).st_blocks * 512 >= size  # every page in
        assert os.listdir(arena_dir) == []  # no name: nothing left however the restore ends
        assert filled.linkable  # O_TMPFILE: a preemption of the restored job may link them, no copy
    finally:
        filled.close()


def test_a_bad_block_or_a_placement_outside_the_segments_fails_and_keeps_nothing_open(saved, node_memory, tmp_path):
    blobs, _, on_disk, digests, _ = saved
    bad = bytearray(on_disk.read_bytes())
    bad[len(bad) // 2] ^= 0x10
    corrupt = tmp_path / "corrupt.h5"
    corrupt.write_bytes(bytes(bad))
    arena_dir = node_memory / "arena"
    arena_dir.mkdir()
    fds_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError, match="checksum mismatch"):
        arena_fill.fill(corrupt, _segments(blobs), str(arena_dir), threading.Event(), digests)
    with pytest.raises(ValueError, match="outside the arena's segments"):
        arena_fill.fill(on_disk, _segments(blobs[:1]), str(arena_dir), threading.Event())
    assert len(os.listdir("/proc/self/fd")) == fds_before and os.listdir(arena_dir) == []


def _manifest(blobs, h5: Path, arena_dir: Path, digests=None) -> dict:
    rec = {"pid": 7, "image_pid": 7, "h5": h5.name, "arena_dir": str(arena_dir),
           "arena_segments": [list(s) for s in _segments(blobs)]}
    m = {"gpu_processes": [rec, {"pid": 8, "h5": None}]}
    if digests:
        m["files"] = {h5.name: {"size": h5.stat().st_size, "block_bytes": image_store.HASH_BLOCK,
                                "sha256_blocks": digests}}
    return m


def test_a_fill_runs_beside_the_restore_and_says_why_where_it_cannot(saved, node_memory, monkeypatch):
    blobs, staged, on_disk, digests, _ = saved
    m = _manifest(blobs, staged, node_memory)
    fill = arena_fill.ArenaFill(m, staged.parent, check=False)
    filled = fill.take(7)
    assert filled is not None and filled.bytes == sum(b.size for b in blobs)
    assert fill.take(8) is None and fill.take(7) is None  # nothing to fill; taken already
    filled.close()
    fill.close()
    fill = arena_fill.ArenaFill(_manifest(blobs, on_disk, node_memory, digests), on_disk.parent, check=True)
    filled = fill.take(7)  # each block checked against the manifest's digests as it is read
    assert filled is not None and filled.bytes == sum(b.size for b in blobs)
    filled.close()
    fill.close()

    older = {"gpu_processes": [{"pid": 7, "h5": staged.name}]}  # an image from before the fill
    gone = _manifest(blobs, staged, node_memory / "nowhere")
    for m, why in ((older, "does not record"), (gone, "is not here")):
        fill = arena_fill.ArenaFill(m, staged.parent, check=False)
        assert fill.take(7) is None and why in fill.skipped[7]
        fill.close()
    monkeypatch.setattr(arena_fill, "NUMA_ONLINE", node_memory / "online")
    (node_memory / "online").write_text("0-1\n")
    fill = arena_fill.ArenaFill(_manifest(blobs, staged, node_memory), staged.parent, check=False)
    assert fill.take(7) is None and "NUMA" in fill.skipped[7]
    fill.close()


def test_a_bad_block_found_by_the_fill_fails_the_restore_in_one_line(saved, node_memory, tmp_path):
    """What the restore says of a fill's data error: the load's one line, with its fix."""
    blobs, _, on_disk, digests, _ = saved
    bad = bytearray(on_disk.read_bytes())
    bad[len(bad) // 2] ^= 0x10
    corrupt = tmp_path / "image" / on_disk.name
    corrupt.parent.mkdir()
    corrupt.write_bytes(bytes(bad))
    m = _manifest(blobs, corrupt, node_memory, digests)
    fill = arena_fill.ArenaFill(m, corrupt.parent, check=True)
    try:
        with pytest.raises(GpucrError, match="checksum mismatch") as e:
            image_gpu.taken(fill, m["gpu_processes"][0], corrupt.parent)
        assert "intact copy" in e.value.fix
    finally:
        fill.close()


def test_a_fill_without_room_gives_way_to_the_shims_own_arena(saved, tmp_path):
    """A tmpfs too small for the segments: the pages cannot be faulted in, so the fill
    is Unavailable (the restore makes the arena as before), and nothing stays."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    blobs, staged, _, _, _ = saved
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        fill = arena_fill.ArenaFill(_manifest(blobs, staged, small), staged.parent, check=False)
        assert fill.take(7) is None and "cannot fault" in fill.skipped[7]
        fill.close()
        assert os.listdir(small) == [] and os.statvfs(small).f_bfree == os.statvfs(small).f_blocks
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_close_ends_fills_nobody_took(saved, node_memory):
    blobs, staged, _, _, _ = saved
    fds_before = len(os.listdir("/proc/self/fd"))
    fill = arena_fill.ArenaFill(_manifest(blobs, staged, node_memory), staged.parent, check=False)
    fill.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_the_files_come_in_the_shims_order_of_segments_not_by_address(saved, node_memory):
    """The shim maps the k-th file to its k-th segment; its segments need not rise in
    address (mmap places new ones lower): a fill that sorted them handed the shim
    its files swapped."""
    blobs, staged, _, _, want = saved
    own = sorted({(b.host // 4096 * 4096, -(-(b.host + b.size) // 4096) * 4096 - b.host // 4096 * 4096)
                  for b in blobs}, reverse=True)  # one segment per buffer, highest address first
    assert len(own) == 2
    arena_dir = node_memory / "arena"
    arena_dir.mkdir()
    filled = arena_fill.fill(staged, own, str(arena_dir), threading.Event())
    try:
        assert [os.fstat(fd).st_size for fd in filled.fds] == [n for _, n in own]
        for b in blobs:
            assert _bytes_at(filled, own, b) == want[b.handle]
    finally:
        filled.close()
