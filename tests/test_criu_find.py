"""Finding CRIU: GPUCR_CRIU, then the default install, then PATH; >= 4.1 or a one-line refusal."""

import os

import pytest

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError


def fake_criu(path, version):
    path.write_text(f"#!/bin/sh\necho 'Version: {version}'\n")
    path.chmod(0o755)
    return path


def test_gpucr_criu_missing(monkeypatch):
    monkeypatch.setenv("GPUCR_CRIU", "/nonexistent/criu")
    with pytest.raises(GpucrError) as e:
        criu_mod.find_criu()
    assert "GPUCR_CRIU=/nonexistent/criu" in e.value.one_line()
    assert "run scripts/install-deps" in e.value.one_line()


def test_gpucr_criu_too_old(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUCR_CRIU", str(fake_criu(tmp_path / "criu", "3.17")))
    with pytest.raises(GpucrError, match=r"version 3\.17, 4\.1 or newer") as e:
        criu_mod.find_criu()
    assert "run scripts/install-deps" in e.value.one_line()


def test_gpucr_criu_not_a_criu(monkeypatch, tmp_path):
    p = tmp_path / "criu"
    p.write_text("#!/bin/sh\necho hello\n")
    p.chmod(0o755)
    monkeypatch.setenv("GPUCR_CRIU", str(p))
    with pytest.raises(GpucrError, match="does not run or print a CRIU version"):
        criu_mod.find_criu()


def test_gpucr_criu_recent(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUCR_CRIU", str(fake_criu(tmp_path / "criu", "4.2")))
    c = criu_mod.find_criu()
    assert c.version == (4, 2) and c.path == str(tmp_path / "criu")


def test_prefix_then_default_then_path(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUCR_CRIU", raising=False)
    (tmp_path / "pfx" / "bin").mkdir(parents=True)
    (tmp_path / "path").mkdir()
    fake_criu(tmp_path / "path" / "criu", "4.1.1")
    monkeypatch.setenv("PATH", str(tmp_path / "path") + os.pathsep + os.environ["PATH"])
    monkeypatch.setattr(criu_mod, "DEFAULT_WRAPPER", str(tmp_path / "none"))
    monkeypatch.setenv("GPUCR_PREFIX", str(tmp_path / "pfx"))
    assert criu_mod.find_criu().path == str(tmp_path / "path" / "criu")
    fake_criu(tmp_path / "pfx" / "bin" / "criu", "4.1")
    assert criu_mod.find_criu().path == str(tmp_path / "pfx" / "bin" / "criu")


def test_old_on_path_is_skipped_and_named(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUCR_CRIU", raising=False)
    monkeypatch.delenv("GPUCR_PREFIX", raising=False)
    monkeypatch.setattr(criu_mod, "DEFAULT_WRAPPER", str(tmp_path / "none"))
    fake_criu(tmp_path / "criu", "3.17.1")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GpucrError, match="is version 3.17.1"):
        criu_mod.find_criu()


def test_nothing_found(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUCR_CRIU", raising=False)
    monkeypatch.delenv("GPUCR_PREFIX", raising=False)
    monkeypatch.setattr(criu_mod, "DEFAULT_WRAPPER", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GpucrError, match="CRIU not found") as e:
        criu_mod.find_criu()
    assert "run scripts/install-deps" in e.value.one_line()


def test_first_error_skips_harmless_lines(tmp_path):
    log = tmp_path / "restore.log"
    log.write_text("(00.001) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self\n"
                   "(00.002) Error (criu/files-reg.c:2200): File a/b has bad size 10 (expect 5)\n")
    assert criu_mod.first_error(log, "") == "Error (criu/files-reg.c:2200): File a/b has bad size 10 (expect 5)"


@pytest.mark.criu
def test_installed_criu_found():
    try:
        c = criu_mod.find_criu()
    except GpucrError as e:
        pytest.skip(f"no CRIU here: {e.one_line()}")
    assert c.version[:2] >= (4, 1)
