"""Whole-process migration of a GPU process.

On a GPU machine (marked gpu, skipped elsewhere): a PyTorch training process under
the shim is checkpointed to disk with `gpucr-hpc checkpoint --pid --to`, killed,
restored with `restore --from`, and finishes bit-identical to an uninterrupted run
(loss of every step and the parameter checksum); the same with --leave-running
(the original and the restored copy both identical), and that image restored a
second time in a new PID namespace. Driven by gpu-checks/migrate_gpu_verify.py;
every check it makes is asserted here.

Without a GPU: the arena <-> HDF5 copy of gpu_image against a live (CPU) process.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from shim_helpers import REPO, build_shim, root_criu_or_skip

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import gpu_data
from gpucr_hpc.store.mounts import in_node_memory

HOLDER = r"""
import sys, numpy as np
a = np.arange(3_000_000, dtype=np.uint32).view(np.uint8)
b = np.full(5000, 7, np.uint8)
print(a.ctypes.data, a.size, b.ctypes.data, b.size, flush=True)
sys.stdin.readline()
a[:] = 0; b[:] = 0
print("zeroed", flush=True)
sys.stdin.readline()
ok = np.array_equal(a, np.arange(3_000_000, dtype=np.uint32).view(np.uint8)) and (b == 7).all()
print("same" if ok else "different", flush=True)
"""


def _holder():
    """A process holding two buffers (HOLDER) and the blobs that describe them."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    ha, na, hb, nb = map(int, child.stdout.readline().split())
    return child, [gpu_data.Blob(handle=0x20, va=0x7F0000000000, size=na, device=0, host=ha),
                   gpu_data.Blob(handle=0x21, va=0, size=nb, device=0, host=hb)]


def _step(child, says: str) -> None:
    """The holder's next step (zero its buffers, compare them), and what it says."""
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == says


def test_arena_to_h5_and_back_through_process_memory(tmp_path):
    """save_process reads a live process's memory into one dataset per blob; load_process
    writes it back at the same addresses after the process lost it."""
    child, blobs = _holder()
    try:
        na, nb, hb = blobs[0].size, blobs[1].size, blobs[1].host
        p = tmp_path / "process-1.h5"
        rep = gpu_data.save_process(p, child.pid, blobs, attrs={"vendor": "nvidia"},
                                     block_bytes=image_store.HASH_BLOCK)
        assert rep["bytes"] == na + nb and rep["allocations"] == 2
        assert rep["file_size"] == p.stat().st_size
        assert rep["checksum"] == image_store.block_digests(p, workers=1)
        # Small blocks: blocks that hold HDF5 metadata, a blob's start and end, both blobs
        small = tmp_path / "process-2.h5"
        rep2 = gpu_data.save_process(small, child.pid, blobs, block_bytes=(1 << 20) + 4097)
        assert len(rep2["checksum"]) > 10 and rep2["file_size"] == small.stat().st_size
        want = []
        with open(small, "rb") as f:
            while block := f.read((1 << 20) + 4097):
                want.append(hashlib.sha256(block).hexdigest())
        assert rep2["checksum"] == want
        assert {b.va: bytes(b.data) for b in gpu_data.read(small)} == \
            {b.va: bytes(b.data) for b in gpu_data.read(p)}
        assert gpu_data.list_buffers(p) == sorted([(0, nb, 0), (0x7F0000000000, na, 0)])
        back = {b.va: b.data for b in gpu_data.read(p)}
        assert np.array_equal(back[0x7F0000000000], np.arange(3_000_000, dtype=np.uint32).view(np.uint8))
        _step(child, "zeroed")
        with pytest.raises(ValueError, match="not in"):
            gpu_data.load_process(p, child.pid, blobs[:1] + [gpu_data.Blob(0x99, 0, nb, 0, hb)])
        assert gpu_data.load_process(p, child.pid, blobs)["bytes"] == na + nb
        _step(child, "same")
    finally:
        child.kill()
        child.wait()


def test_an_image_in_node_memory_is_mapped_both_ways_and_left_unhashed(tmp_path, monkeypatch):
    """A job's staging tier: save_process(hashed=False) fills the file in node memory
    straight from the process (no digests: the drain makes them), and an unchecked
    load_process of a file in node memory maps it; the file is the same HDF5 either way."""
    shm = Path(tempfile.mkdtemp(prefix="gpucr-test-", dir="/dev/shm"))
    monkeypatch.setattr(gpu_data, "COPY_CHUNK", (1 << 20) + 3)  # pieces that end mid-page
    child, blobs = _holder()
    other = None
    try:
        if not in_node_memory(shm):
            pytest.skip("/dev/shm is not a tmpfs here")
        want = blobs[0].size + blobs[1].size
        staged, ref = shm / "process-1.h5", tmp_path / "process-1.h5"
        rep = gpu_data.save_process(staged, child.pid, blobs, hashed=False)
        assert rep["checksum"] is None and rep["bytes"] == want and rep["file_size"] == staged.stat().st_size
        gpu_data.save_process(ref, child.pid, blobs)
        assert {b.va: bytes(b.data) for b in gpu_data.read(staged)} == {b.va: bytes(b.data) for b in gpu_data.read(ref)}
        _step(child, "zeroed")
        rep = gpu_data.load_process(staged, child.pid, blobs)
        assert rep["mapped"] and rep["bytes"] == want and not rep["checked"]
        _step(child, "same")  # the holder ends here: the file on a disk goes to another one
        other, blobs = _holder()
        _step(other, "zeroed")
        assert gpu_data.load_process(ref, other.pid, blobs).get("mapped", False) == in_node_memory(ref)
        _step(other, "same")
    finally:
        for p in (child, other):
            if p is not None:
                p.kill()
                p.wait()
        shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.parametrize("block,direct", [(image_store.HASH_BLOCK, True), (image_store.HASH_BLOCK, False),
                                          ((1 << 20) + 4097, True)])
def test_load_checks_each_block_as_it_reads(tmp_path, monkeypatch, block, direct):
    """load_process with the file's block digests: the data arrives whole in one read,
    checked; a flipped byte, or digests of another size, are refused with the cause.
    Read with O_DIRECT where blocks are page-aligned (the file's last piece is not a
    whole page: the read rounds up and stops at the end), else through the page cache."""
    monkeypatch.setenv("GPUCR_LOAD_DIRECT", "1" if direct else "0")
    child, blobs = _holder()
    try:
        na, nb = blobs[0].size, blobs[1].size
        p = tmp_path / "process-1.h5"
        digests = gpu_data.save_process(p, child.pid, blobs, block_bytes=block)["checksum"]
        _step(child, "zeroed")
        with pytest.raises(ValueError, match="another size"):
            gpu_data.load_process(p, child.pid, blobs, block_digests=digests[:-1], block_bytes=block)
        bad = bytearray(p.read_bytes())
        bad[len(bad) // 2] ^= 0x10
        corrupt = tmp_path / "corrupt.h5"
        corrupt.write_bytes(bytes(bad))
        with pytest.raises(ValueError, match=r"checksum mismatch in corrupt.h5, block \d+ \(corrupt image\)"):
            gpu_data.load_process(corrupt, child.pid, blobs, block_digests=digests, block_bytes=block)
        rep = gpu_data.load_process(p, child.pid, blobs, block_digests=digests, block_bytes=block)
        assert rep["bytes"] == na + nb and rep["checked"]
        assert p.stat().st_size % gpu_data.DIRECT_ALIGN  # the unaligned tail is covered
        can_direct = gpu_data._open_direct(p)
        if can_direct is not None:
            os.close(can_direct)
        assert rep["direct"] == (direct and block % gpu_data.DIRECT_ALIGN == 0 and can_direct is not None)
        _step(child, "same")
    finally:
        child.kill()
        child.wait()


@pytest.mark.gpu
@pytest.mark.parametrize("helper", [False, True], ids=["own_copies", "copy_helper"])
def test_pytorch_process_migrates_bit_identically(tmp_path, helper):
    """copy_helper: the data leaves and re-enters the GPU through `gpucr-hpc
    copy-helper` (the migrated process reconnects to it after the restore)."""
    pytest.importorskip("torch")
    pytest.importorskip("h5py")
    root_criu_or_skip()
    build_shim()
    results = Path(os.environ.get("GPUCR_RESULTS_DIR") or tmp_path)
    out = results / ("migrate-gpu-test-helper.json" if helper else "migrate-gpu-test.json")
    extra = ["--copy-helper", "--only", "kill"] if helper else ["--again"]
    r = subprocess.run([sys.executable, str(REPO / "gpu-checks/migrate_gpu_verify.py"), "--out", str(out),
                        "--image-root", str(tmp_path / "images"), "--steps", "60", "--checkpoint-at", "20",
                        "--ballast-gib", "2", *extra],
                       capture_output=True, text=True, timeout=1200)
    assert out.exists(), f"no result written: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    res = json.loads(out.read_text())
    for scenario in ("kill",) if helper else ("kill", "leave_running"):
        assert "error" not in res[scenario], f"{scenario}: {res[scenario]['error']}\n{res[scenario]['stderr_tail']}"
    if helper:
        assert "kill_helper_moved_the_data" in res["checks"]
    for check, ok in res["checks"].items():
        assert ok, f"{check} failed: {r.stdout[-3000:]}"


def test_block_checksummed_file_is_verified(tmp_path, monkeypatch):
    """A GPU data file recorded with per-block sha256s: intact it opens, one changed
    byte in any block is a one-line refusal naming the file."""
    monkeypatch.setattr(image_store, "HASH_BLOCK", 1 << 20)
    from gpucr_hpc.store import manifest as mf

    img = tmp_path / "img"
    w = image_store.ImageWriter(img, mf.new_manifest(kind="process", vendor="nvidia", gpu=None))
    data = np.random.default_rng(3).integers(0, 256, (5 << 20) + 123, dtype=np.uint8)
    (img / "process-1.h5").write_bytes(data.tobytes())
    digests = image_store.block_digests(img / "process-1.h5", workers=3)
    assert len(digests) == 6
    w.add_blocks("process-1.h5", data.size, digests)
    w.commit()
    image_store.open_image(img)
    with open(img / "process-1.h5", "r+b") as f:
        f.seek((3 << 20) + 7)
        f.write(b"\x00" if data[(3 << 20) + 7] else b"\x01")
    with pytest.raises(GpucrError, match="checksum mismatch in process-1.h5"):
        image_store.open_image(img)


@pytest.mark.gpu
@pytest.mark.parametrize("workload,mode", [("triton_loop.py", None), ("compile_loop.py", "default"),
                                           ("compile_loop.py", "reduce-overhead")],
                         ids=["triton", "torch_compile", "torch_compile_reduce_overhead"])
def test_framework_process_migrates_bit_identically(tmp_path, workload, mode):
    """A Triton program launching through Triton's launcher, and torch.compile in
    both modes: checkpoint --to (the process gone), restore --from, the output
    as an uninterrupted run's."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    root_criu_or_skip()
    build_shim()
    results = Path(os.environ.get("GPUCR_RESULTS_DIR") or tmp_path)
    out = results / f"migrate-gpu-{workload.split('.')[0]}-{mode or 'triton'}.json"
    env = dict(os.environ, **({"COMPILE_MODE": mode} if mode else {}))
    r = subprocess.run([sys.executable, str(REPO / "gpu-checks/migrate_gpu_verify.py"), "--out", str(out),
                        "--image-root", str(tmp_path / "images"), "--workload",
                        str(REPO / "tests" / "shim_workloads" / workload), "--steps", "60",
                        "--checkpoint-at", "20", "--ballast-gib", "1", "--only", "kill"],
                       capture_output=True, text=True, timeout=1200, env=env)
    assert out.exists(), f"no result written: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    res = json.loads(out.read_text())
    assert "error" not in res["kill"], f"{res['kill']['error']}\n{res['kill'].get('stderr_tail')}"
    for check, ok in res["checks"].items():
        assert ok, f"{check} failed: {r.stdout[-3000:]}"
