"""Refusals of checkpoint --to / restore --from: one clear line, non-zero exit, image untouched.

One real image is made per module (real CRIU); each test works on its own copy
and hashes it (names, modes, owners, sizes, mtimes, contents) before and after.
"""

import json
import os
import shutil
import stat

import pytest
from migrate_workload import alive, cli, cli_json, kill_tree, start_workload, wait_lines

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.process import image as process_image
from gpucr_hpc.store import files as image_store
from gpucr_hpc.store import manifest as mf

pytestmark = pytest.mark.criu


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A committed image of a killed workload (module-wide, never modified)."""
    if os.geteuid() != 0:
        pytest.skip("CRIU dump of a process tree needs root here")
    try:
        criu_mod.find_criu()
    except GpucrError as e:
        pytest.skip(f"CRIU >= 4.1 not available: {e.one_line()}")
    tmp = tmp_path_factory.mktemp("pristine")
    work = tmp / "cwd"
    work.mkdir()
    proc, out = start_workload(work)
    try:
        wait_lines(out, 5)
        cli_json("checkpoint", "--pid", str(proc.pid), "--to", str(tmp / "img"))
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=10)
    return tmp / "img"


@pytest.fixture
def image(pristine, tmp_path):
    dst = tmp_path / "img"
    shutil.copytree(pristine, dst)
    return dst


def refused(args, image, expect, env=None):
    """Run the CLI, expect a one-line refusal containing `expect`, and the image unchanged."""
    before = image_store.tree_digest(image)
    r = cli(*args, env=env)
    assert r.returncode != 0, r.stdout
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("gpucr-hpc: error:") and expect in err, err
    assert image_store.tree_digest(image) == before, "a failed restore modified the image"
    return err


def _first_criu_file(image):
    m = json.loads((image / "manifest.json").read_text())
    return max((r for r in m["files"] if r.startswith("criu/pages-")), key=lambda r: m["files"][r]["size"])


def test_corrupt_file_refused(image):
    victim = image / _first_criu_file(image)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    refused(["restore", "--from", str(image)], image, "checksum mismatch")


def test_truncated_file_refused(image):
    victim = image / _first_criu_file(image)
    os.truncate(victim, victim.stat().st_size // 2)
    refused(["restore", "--from", str(image)], image, "truncated")


def test_missing_file_refused(image):
    (image / _first_criu_file(image)).unlink()
    refused(["restore", "--from", str(image)], image, "missing")


def test_uncommitted_refused(image):
    (image / "COMMITTED").unlink()
    refused(["restore", "--from", str(image)], image, "not committed")


def test_edited_manifest_refused(image):
    p = image / "manifest.json"
    p.write_text(p.read_text().replace('"kind": "process"', '"kind": "process" '))
    refused(["restore", "--from", str(image)], image, "does not match its checksum")


def _recommit(image, **changes):
    m = json.loads((image / "manifest.json").read_text())
    m.update(changes)
    mf.commit(image, m)


@pytest.mark.parametrize("vendor,model", [("nvidia", "NVIDIA Z999 (no such GPU)"), ("amd", "AMD MI999")])
def test_wrong_gpu_vendor_or_model_refused(image, vendor, model):
    _recommit(image, vendor=vendor, gpu={"model": model, "uuids": ["GPU-0"], "driver_version": "1"})
    refused(["restore", "--from", str(image)], image, "GPU")


def test_check_node_model_mismatch():
    m = {"vendor": "nvidia", "gpu": {"model": "NVIDIA H100 80GB HBM3"}}
    h200 = {"vendor": "nvidia", "model": "NVIDIA H200", "models": ["NVIDIA H200"]}
    with pytest.raises(GpucrError, match="this node has NVIDIA H200"):
        process_image.check_node(m, h200)
    with pytest.raises(GpucrError, match="has amd GPUs"):
        process_image.check_node(m, {"vendor": "amd", "model": None, "models": []})
    process_image.check_node(m, {"vendor": "nvidia", "model": m["gpu"]["model"], "models": [m["gpu"]["model"]]})
    process_image.check_node({"vendor": None}, None)  # CPU-only images go anywhere


def test_missing_criu_refused(image):
    err = refused(["restore", "--from", str(image)], image, "CRIU not found",
                  env={"GPUCR_CRIU": "/nonexistent/criu"})
    assert "scripts/install-deps" in err


def test_too_old_criu_refused(image, tmp_path):
    fake = tmp_path / "criu"
    fake.write_text("#!/bin/sh\necho 'Version: 3.17'\n")
    fake.chmod(0o755)
    err = refused(["restore", "--from", str(image)], image, "version 3.17", env={"GPUCR_CRIU": str(fake)})
    assert "scripts/install-deps" in err


def test_checkpoint_without_criu_leaves_process_alone(tmp_path):
    proc, out = start_workload(tmp_path)
    try:
        wait_lines(out, 3)
        r = cli("checkpoint", "--pid", str(proc.pid), "--to", str(tmp_path / "img"),
                env={"GPUCR_CRIU": "/nonexistent/criu"})
        assert r.returncode != 0 and "CRIU not found" in r.stderr
        assert alive(proc.pid) and not (tmp_path / "img").exists()
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=10)


def test_checkpoint_refuses_existing_image(pristine, image, tmp_path):
    proc, out = start_workload(tmp_path)
    try:
        wait_lines(out, 3)
        before = image_store.tree_digest(image)
        r = cli("checkpoint", "--pid", str(proc.pid), "--to", str(image))
        assert r.returncode != 0 and "already holds a committed image" in r.stderr
        assert alive(proc.pid) and image_store.tree_digest(image) == before
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=10)


def test_foreign_owner_refused_in_process(pristine):
    """A non-root user may not restore someone else's image (run as uid 65534 in a child)."""
    import tempfile
    top = tempfile.mkdtemp(prefix="gpucr-test-owner-")
    os.chmod(top, 0o755)  # others may look up the image dir, not into it
    image = shutil.copytree(pristine, os.path.join(top, "img"))
    try:
        _foreign_owner(image)
    finally:
        shutil.rmtree(top)


def _foreign_owner(image):
    before = image_store.tree_digest(image)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to nobody, try the restore, report the one line
        code = 3
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            process_image.restore_from(image)
            msg = "restored?!"
        except GpucrError as e:
            msg, code = e.one_line(), 0
        except BaseException as e:  # noqa: BLE001
            msg = f"unexpected {type(e).__name__}: {e}"
        os.write(w, msg.encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        msg = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, msg
    assert "belongs to uid 0, you are uid 65534" in msg and "as its owner or as root" in msg
    assert image_store.tree_digest(image) == before


def test_foreign_owner_check_unit(image):
    m = json.loads((image / "manifest.json").read_text())
    with pytest.raises(GpucrError, match="belongs to uid 0"):
        image_store.check_owner(image, m, euid=1234)
    image_store.check_owner(image, m, euid=0)  # root may restore anyone's image
    m["owner_uid"] = 1234
    os.chown(image, 1234, -1)
    image_store.check_owner(image, m, euid=1234)
    with pytest.raises(GpucrError, match="belongs to uid 1234, you are uid 4321"):
        image_store.check_owner(image, m, euid=4321)


def test_failed_criu_restore_leaves_image_untouched(tmp_path):
    """CRIU itself fails (the process's cwd is gone): refused, image byte-identical."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    criu_mod.find_criu()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    import subprocess
    import sys

    from migrate_workload import WORKLOAD
    (tmp_path / "w.py").write_text(WORKLOAD)
    (tmp_path / "data.txt").write_text("0000" * 10)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "w.py"), str(tmp_path / "out.txt"),
                             str(tmp_path / "data.txt")], cwd=cwd, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_lines(tmp_path / "out.txt", 3)
        cli_json("checkpoint", "--pid", str(proc.pid), "--to", str(tmp_path / "img"))
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=10)
    cwd.rename(tmp_path / "cwd-moved")
    img = tmp_path / "img"
    mode = stat.S_IMODE(img.stat().st_mode)
    err = refused(["restore", "--from", str(img)], img, "criu restore failed",
                  env={"TMPDIR": str(tmp_path)})  # CRIU's kept log lands here, not in /tmp
    assert str(tmp_path) in err
    assert stat.S_IMODE(img.stat().st_mode) == mode


# -- restore onto other GPUs: refused before anything is touched ------------------------

H100 = "NVIDIA H100 80GB HBM3"
FAKE_SMI = """#!{python}
# nvidia-smi --query-gpu=FIELDS for this test's GPUs (the node's real ones do not matter)
import sys
gpus = {gpus!r}
fields = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--query-gpu=")).split(",")
for g in gpus:
    print(", ".join(g[f] for f in fields))
"""


def _gpu_node(tmp_path, *gpus):
    """A PATH whose nvidia-smi lists gpus: (model, uuid, free MiB) each."""
    import sys
    rows = [{"index": str(i), "name": m, "uuid": u, "memory.free": str(free), "driver_version": "580.159.04"}
            for i, (m, u, free) in enumerate(gpus)]
    d = tmp_path / "fake-bin"
    d.mkdir()
    (d / "nvidia-smi").write_text(FAKE_SMI.format(python=sys.executable, gpus=rows))
    (d / "nvidia-smi").chmod(0o755)
    return {"PATH": f"{d}:{os.environ['PATH']}"}


def _as_gpu_image(image, uuid, nbytes):
    """The image as if its process had run on GPU `uuid` with nbytes of GPU data."""
    m = json.loads((image / "manifest.json").read_text())
    rec = {"pid": m["process"]["root_pid"], "shim": False, "cuda": True, "h5": None, "bytes": 0,
           "socket": None, "gpu_uuids": [uuid], "gpu_bytes": [nbytes]}
    _recommit(image, vendor="nvidia", gpu_bytes=nbytes, gpu_processes=[rec],
              gpu={"model": H100, "models": [H100], "uuids": [uuid], "driver_version": "580.159.04"})


def test_no_gpu_with_room_refused(image, tmp_path):
    _as_gpu_image(image, "GPU-aaaaaaaa-0000-0000-0000-000000000000", 40 << 30)
    env = _gpu_node(tmp_path, (H100, "GPU-bbbbbbbb-0000-0000-0000-000000000000", 10240),
                    (H100, "GPU-cccccccc-0000-0000-0000-000000000000", 20480))
    err = refused(["restore", "--from", str(image)], image, "no GPU here to restore the image's", env=env)
    assert "is not on this node" in err and "GPU 1 with 20.0 GiB free" in err


def test_old_image_without_room_on_its_own_gpu_refused(image, tmp_path):
    """An image without GPUs per process goes back onto the GPU it had: that one must have
    room, however much another GPU here has free."""
    _as_gpu_image(image, "GPU-aaaaaaaa-0000-0000-0000-000000000000", 40 << 30)
    m = json.loads((image / "manifest.json").read_text())
    for rec in m["gpu_processes"]:
        del rec["gpu_uuids"], rec["gpu_bytes"]
    _recommit(image, gpu_processes=m["gpu_processes"])
    env = _gpu_node(tmp_path, (H100, "GPU-aaaaaaaa-0000-0000-0000-000000000000", 10240),
                    (H100, "GPU-cccccccc-0000-0000-0000-000000000000", 81000))
    err = refused(["restore", "--from", str(image)], image, "needs 40.0 GiB of GPU memory on the GPUs it had", env=env)
    assert "10.0 GiB free here (GPU 0 10.0 GiB)" in err


def test_forced_gpu_of_another_model_refused(image, tmp_path):
    _as_gpu_image(image, "GPU-aaaaaaaa-0000-0000-0000-000000000000", 1 << 30)
    env = _gpu_node(tmp_path, (H100, "GPU-aaaaaaaa-0000-0000-0000-000000000000", 81000),
                    ("NVIDIA H200", "GPU-cccccccc-0000-0000-0000-000000000000", 139000))
    refused(["restore", "--from", str(image), "--gpu", "1"], image, "--gpu 1 is a NVIDIA H200", env=env)


def test_gpu_option_on_a_cpu_image_refused(image):
    refused(["restore", "--from", str(image), "--gpu", "0"], image, "holds no GPU state")


@pytest.mark.parametrize("args,expect", [
    (["--pid", "1", "--gpu", "0"], "--gpu applies to restore --from DIR only"),
    (["--from", "/nonexistent", "--gpu", "0,,1"], "bad --gpu"),
])
def test_gpu_option_misuse_refused(args, expect):
    r = cli("restore", *args)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and expect in r.stderr, r.stderr


def test_shim_failure_points_at_the_shims_debug_switch():
    """A shim's refusal names the variable the shim reads for its diagnostics (shim/log.c)."""
    from pathlib import Path

    from gpucr_hpc.process import image_gpu
    from gpucr_hpc.shim.protocol import Reply

    with pytest.raises(GpucrError) as e:
        image_gpu._ok(Reply.parse({"ok": False, "error": "arena_attach: mmap failed"}), 4242,
                      "re-creating the arena")
    line = e.value.one_line()
    assert line.startswith("process 4242: re-creating the arena failed: arena_attach: mmap failed; ")
    assert "GPUCR_DEBUG=1" in line and "GPUCR_LOG" not in line
    log_c = (Path(__file__).resolve().parent.parent / "shim" / "log.c").read_text()
    assert 'getenv("GPUCR_DEBUG")' in log_c
