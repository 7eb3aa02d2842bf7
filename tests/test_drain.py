"""Draining a staged image to the image root (gpucr_hpc.store.drain): the copy is
the staged image byte for byte and opens as a committed, checked image; a
damaged staged file or a full file system stops it in one line, with nothing
left behind at the destination and the staged image untouched."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.store import drain
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import manifest as mf


def staged_image(path: Path, mib: int = 3) -> Path:
    """A committed image as a checkpoint writes one: a copied file (block checksums)
    and a file written in place (one checksum)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / "src.bin"
    src.write_bytes(os.urandom(mib << 20))
    w = image_store.ImageWriter(path, mf.new_manifest(kind="process", vendor=None, gpu=None))
    w.add_copy(src, "criu/pages-1.img")
    (w.path / "process-7.h5").write_bytes(os.urandom(4096))
    w.add_written("process-7.h5")
    w.commit()
    return path


def contents(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): mf.sha256_file(p) for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_drained_image_is_the_staged_one_and_opens_checked(tmp_path):
    staged = staged_image(tmp_path / "stage" / "rank-0.0")
    dest = tmp_path / "root" / "gen-3" / "rank-0.0"
    assert drain.drain_image(staged, dest) == mf.load(staged)["total_bytes"]
    assert contents(dest) == contents(staged)
    image_store.open_image(dest)  # committed, owned, every checksum right


def test_a_damaged_staged_file_stops_the_drain_and_leaves_nothing(tmp_path):
    staged = staged_image(tmp_path / "stage" / "u")
    pages = staged / "criu" / "pages-1.img"
    with open(pages, "r+b") as f:
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 1]))
    before = image_store.tree_digest(staged)
    dest = tmp_path / "root" / "u"
    with pytest.raises(GpucrError, match="does not match its checksum") as e:
        drain.drain_image(staged, dest)
    assert "\n" not in e.value.one_line()
    assert not dest.exists()
    assert image_store.tree_digest(staged) == before


DRAIN_WITH_FILE_SIZE_LIMIT = """
import resource, signal, sys
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.store import drain
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    drain.drain_image(sys.argv[1], sys.argv[2])
except GpucrError as e:
    print(e.one_line(), file=sys.stderr)
    sys.exit(1)
"""


def test_a_file_system_that_takes_no_more_stops_the_drain_in_one_line(tmp_path):
    staged = staged_image(tmp_path / "stage" / "u")
    dest = tmp_path / "root" / "u"
    r = subprocess.run([sys.executable, "-c", DRAIN_WITH_FILE_SIZE_LIMIT, str(staged), str(dest)],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "File too large" in lines[0] and "previous generation" in lines[0], r.stderr
    assert not dest.exists()
    image_store.open_image(staged)


def test_an_uncommitted_staged_image_is_not_drained(tmp_path):
    staged = staged_image(tmp_path / "stage" / "u")
    (staged / mf.COMMITTED).unlink()
    with pytest.raises(GpucrError, match="not committed"):
        drain.drain_image(staged, tmp_path / "root" / "u")
    assert not (tmp_path / "root" / "u").exists()


def test_a_destination_that_holds_files_is_never_touched(tmp_path):
    staged = staged_image(tmp_path / "stage" / "u")
    dest = tmp_path / "root" / "u"
    dest.mkdir(parents=True)
    (dest / "keep").write_text("theirs")
    with pytest.raises(GpucrError, match="already holds"):
        drain.drain_image(staged, dest)
    assert (dest / "keep").read_text() == "theirs"



def test_a_file_dumped_into_node_memory_unhashed_is_checksummed_by_the_drain(tmp_path):
    staged = tmp_path / "stage" / "u"
    w = image_store.ImageWriter(staged, mf.new_manifest(kind="process", vendor=None, gpu=None))
    (w.path / "criu").mkdir()
    (w.path / "criu" / "pages-1.img").write_bytes(os.urandom(3 << 20))
    w.add_unhashed("criu/pages-1.img")
    w.commit()
    with pytest.raises(GpucrError, match="has no checksum"):
        image_store.open_image(staged)
    dest = tmp_path / "root" / "u"
    drain.drain_image(staged, dest)
    rec = mf.load(dest)["files"]["criu/pages-1.img"]
    assert rec["size"] == 3 << 20 and len(rec["sha256_blocks"]) == 1
    image_store.open_image(dest)
    assert contents(dest)["criu/pages-1.img"] == contents(staged)["criu/pages-1.img"]


# --- what the drain never follows: it runs as the job's user in the user's own
# directories (spank/drain_spawn.c), and reads and writes the files themselves.

def test_a_staged_file_that_is_a_symlink_is_not_copied(tmp_path):
    """A staged file swapped for a link to a file the link's maker could not read
    through the drain (root's node key, /etc/shadow): the drain stops, nothing copied."""
    staged = staged_image(tmp_path / "stage" / "u")
    secret = tmp_path / "secret"
    secret.write_bytes(b"k" * 4096)
    pages = staged / "criu" / "pages-1.img"
    pages.unlink()
    pages.symlink_to(secret)
    dest = tmp_path / "root" / "u"
    with pytest.raises(GpucrError) as e:
        drain.drain_image(staged, dest)
    assert "\n" not in e.value.one_line()
    assert not dest.exists()


def test_a_staged_manifest_that_is_a_symlink_is_not_read(tmp_path):
    staged = staged_image(tmp_path / "stage" / "u")
    real = tmp_path / "elsewhere.json"
    (staged / mf.MANIFEST).rename(real)
    (staged / mf.MANIFEST).symlink_to(real)
    dest = tmp_path / "root" / "u"
    with pytest.raises(GpucrError):
        drain.drain_image(staged, dest)
    assert not dest.exists()


def test_a_destination_that_is_a_symlink_to_an_empty_directory_is_refused(tmp_path):
    staged = staged_image(tmp_path / "stage" / "u")
    target = tmp_path / "somewhere-else"
    target.mkdir()
    dest = tmp_path / "root" / "u"
    dest.parent.mkdir(parents=True)
    dest.symlink_to(target)
    with pytest.raises(GpucrError, match="symlink"):
        drain.drain_image(staged, dest)
    assert dest.is_symlink() and not any(target.iterdir())


def test_the_manifests_temporary_file_is_never_followed(tmp_path):
    """A link planted where write_atomic's temporary file goes is replaced, never
    written through."""
    import threading

    victim = tmp_path / "victim"
    victim.write_text("theirs")
    path = tmp_path / "gen" / mf.MANIFEST
    path.parent.mkdir()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_native_id()}")
    tmp.symlink_to(victim)
    mf.write_atomic(path, b"{}\n")
    assert victim.read_text() == "theirs"
    assert path.read_bytes() == b"{}\n" and not path.is_symlink()
