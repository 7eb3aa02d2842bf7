"""The image store and its HDF5 GPU-buffer files, without CRIU or a GPU."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import gpu_data
from gpucr_hpc.store import manifest as mf


def _buffers():
    rng = np.random.default_rng(7)
    return [
        gpu_data.Buffer(va=0x7F0000000000, size=3 << 20, device=0,
                         data=rng.integers(0, 256, 3 << 20, dtype=np.uint8)),
        gpu_data.Buffer(va=0x7F0000400000, size=4096, device=1, data=bytes(range(256)) * 16),
        gpu_data.Buffer(va=0x7F0000500000, size=0, device=0, data=b""),
    ]


def test_h5_roundtrip(tmp_path):
    p = tmp_path / "process-1.h5"
    bufs = _buffers()
    assert gpu_data.write(p, bufs, attrs={"pid": 1, "vendor": "nvidia"}) == sum(b.size for b in bufs)
    assert gpu_data.list_buffers(p) == [(b.va, b.size, b.device) for b in bufs]
    back = list(gpu_data.read(p))
    for a, b in zip(bufs, back):
        assert (a.va, a.size, a.device) == (b.va, b.size, b.device)
        assert np.array_equal(np.frombuffer(a.data, np.uint8) if not isinstance(a.data, np.ndarray) else a.data, b.data)
    arena = bytearray(4096)
    gpu_data.read_into(p, 0x7F0000400000, arena)
    assert bytes(arena) == bytes(range(256)) * 16
    assert gpu_data.file_attrs(p)["vendor"] == "nvidia"


def test_h5_size_mismatch_rejected(tmp_path):
    with pytest.raises(ValueError, match="expected"):
        gpu_data.write(tmp_path / "x.h5", [gpu_data.Buffer(va=1, size=10, device=0, data=b"abc")])


def test_h5_readable_with_standard_tools(tmp_path):
    if not (shutil.which("h5ls") and shutil.which("h5dump")):
        pytest.skip("HDF5 command line tools (Debian: hdf5-tools) are not installed")
    p = tmp_path / "process-1.h5"
    gpu_data.write(p, _buffers())
    ls = subprocess.run(["h5ls", "-r", str(p)], capture_output=True, text=True, check=True).stdout
    assert "/allocations/alloc-00007f0000400000 Dataset {4096}" in ls
    attrs = subprocess.run(["h5dump", "-A", "-d", "/allocations/alloc-00007f0000400000", str(p)],
                           capture_output=True, text=True, check=True).stdout
    assert str(0x7F0000400000) in attrs and "ATTRIBUTE \"device\"" in attrs
    data = subprocess.run(["h5dump", "-d", "/allocations/alloc-00007f0000400000", "-c", "4", str(p)],
                          capture_output=True, text=True, check=True).stdout
    assert "0, 1, 2, 3" in data


def _make_image(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.img").write_bytes(os.urandom(1 << 20))
    (src / "sub" / "b.img").write_bytes(b"hello")
    m = mf.new_manifest(kind="test", vendor=None, gpu=None)
    w = image_store.ImageWriter(tmp_path / "img", m)
    assert w.add_tree(src, "criu") == (1 << 20) + 5
    gpu_data.write(w.path / "process-1.h5", _buffers())
    w.add_written("process-1.h5")
    w.commit()
    return tmp_path / "img"


def test_writer_commits_and_verifies(tmp_path):
    img = _make_image(tmp_path)
    names = sorted(p.name for p in img.iterdir())
    assert names == ["COMMITTED", "criu", "manifest.json", "process-1.h5"]
    m = json.loads((img / "manifest.json").read_text())
    for key in ("vendor", "gpu", "files", "total_bytes", "created", "tool_version", "owner_uid"):
        assert key in m
    assert set(m["files"]) == {"criu/a.img", "criu/sub/b.img", "process-1.h5"}
    assert m["files"]["criu/sub/b.img"]["sha256_blocks"] == image_store.block_digests(img / "criu/sub/b.img")
    assert stat_mode(img) == 0o700
    image_store.open_image(img)
    assert not list(img.glob(".*tmp*")), "no temp files left behind"


def stat_mode(p):
    return os.stat(p).st_mode & 0o777


def test_unlisted_file_refused(tmp_path):
    img = _make_image(tmp_path)
    (img / "criu" / "extra.img").write_bytes(b"x")
    with pytest.raises(GpucrError, match="not in the manifest"):
        image_store.open_image(img)


def test_flipped_bit_in_h5_refused(tmp_path):
    img = _make_image(tmp_path)
    p = img / "process-1.h5"
    data = bytearray(p.read_bytes())
    data[-100] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(GpucrError, match="checksum mismatch in process-1.h5"):
        image_store.open_image(img)


def test_new_image_never_overwrites(tmp_path):
    img = _make_image(tmp_path)
    with pytest.raises(GpucrError, match="already holds a committed image"):
        image_store.prepare_new(img)
    (tmp_path / "file").write_text("x")
    with pytest.raises(GpucrError, match="not a directory"):
        image_store.prepare_new(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    assert image_store.prepare_new(tmp_path / "empty") == tmp_path / "empty"


def test_atomic_write_replaces_whole(tmp_path):
    p = tmp_path / "f.json"
    mf.write_atomic(p, b"old")
    mf.write_atomic(p, b"new")
    assert p.read_bytes() == b"new" and sorted(x.name for x in tmp_path.iterdir()) == ["f.json"]


def test_format_from_the_future_refused(tmp_path):
    img = _make_image(tmp_path)
    m = json.loads((img / "manifest.json").read_text())
    m["format_version"] = 99
    mf.commit(img, m)
    with pytest.raises(GpucrError, match="v99") as e:
        image_store.open_image(img)
    assert "newer gpucr-hpc" in e.value.one_line()


@pytest.mark.parametrize("size", [0, 5, (3 << 20) + 17])
def test_block_copy_is_whole_and_its_digests_are_the_files(tmp_path, monkeypatch, size):
    """A file copied into an image by blocks in parallel: the same bytes and mode,
    one sha256 per block, equal to what the restore's check computes."""
    monkeypatch.setattr(image_store, "HASH_BLOCK", 1 << 20)
    monkeypatch.setattr(image_store, "COPY_CHUNK", 300_000)  # several pieces per block
    src = tmp_path / "pages-1.img"
    src.write_bytes(os.urandom(size))
    src.chmod(0o640)
    dst = tmp_path / "copy.img"
    got_size, digests = image_store.copy_with_block_sha256(src, dst, workers=3)
    assert got_size == size and dst.read_bytes() == src.read_bytes()
    assert len(digests) == (size + (1 << 20) - 1) // (1 << 20)
    assert digests == image_store.block_digests(dst, workers=2)
    assert stat_mode(dst) == 0o640
    with pytest.raises(FileExistsError):  # never over an existing file
        image_store.copy_with_block_sha256(src, dst)


def _make_gpu_image(tmp_path):
    """An image whose GPU data file has per-block checksums and a gpu_processes record."""
    m = mf.new_manifest(kind="test", vendor=None, gpu=None)
    w = image_store.ImageWriter(tmp_path / "img", m)
    p = w.path / "process-1.h5"
    gpu_data.write(p, _buffers())
    w.add_blocks("process-1.h5", p.stat().st_size, image_store.block_digests(p))
    m["gpu_processes"] = [{"pid": 1, "h5": "process-1.h5", "shim": True, "cuda": True}]
    w.commit()
    return tmp_path / "img"


def test_gpu_data_checked_as_it_is_loaded_is_skipped_by_open_but_not_its_size(tmp_path):
    """restore --from opens with defer_gpu_data: the .h5 is hashed by the loader (one read
    from disk), so open_image does not read it; every other check still runs."""
    img = _make_gpu_image(tmp_path)
    m = image_store.open_image(img, defer_gpu_data=True).manifest
    assert image_store.gpu_data_files(m) == {"process-1.h5"}
    digests, block = image_store.block_checksums(m, "process-1.h5")
    assert block == image_store.HASH_BLOCK and digests == image_store.block_digests(img / "process-1.h5")
    p = img / "process-1.h5"
    data = bytearray(p.read_bytes())
    data[-100] ^= 1
    p.write_bytes(bytes(data))
    image_store.open_image(img, defer_gpu_data=True)  # left to the loader
    with pytest.raises(GpucrError, match="checksum mismatch in process-1.h5"):
        image_store.open_image(img)
    p.write_bytes(bytes(data[:-1]))
    with pytest.raises(GpucrError, match="truncated or corrupt"):
        image_store.open_image(img, defer_gpu_data=True)
    (img / "criu").mkdir(exist_ok=True)
    m2 = json.loads((img / "manifest.json").read_text())
    del m2["files"]["process-1.h5"]["sha256_blocks"]
    with pytest.raises(GpucrError, match="no per-block checksums"):
        image_store.block_checksums(m2, "process-1.h5")


def test_a_full_file_system_is_named_with_what_is_free_there(tmp_path):
    with pytest.raises(OSError) as full, open("/dev/full", "wb", buffering=0) as f:
        f.write(b"x" * 4096)  # the kernel's own ENOSPC
    err = image_store.full_disk(full.value, tmp_path / "gen-2")
    assert err is not None
    line = err.one_line()
    assert f"the file system of {tmp_path}/gen-2 is full (" in line and "MiB free)" in line, line
    assert "free space there" in line


def test_an_error_that_is_not_a_full_disk_is_left_as_it_is(tmp_path):
    with pytest.raises(OSError) as missing:
        (tmp_path / "absent").read_bytes()
    assert image_store.full_disk(missing.value, tmp_path) is None
    assert image_store.full_disk(ValueError("x"), tmp_path) is None
