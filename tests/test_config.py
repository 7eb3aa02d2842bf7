"""One config: every GPUCR_ variable is declared once in gpucr_hpc/config.py, read
through it at call time, a bad value is one line naming the variable, the guides'
tables are generated from the declaration (site/settings_table.py), and test
faults are off unless GPUCR_FAULTS names them. No GPU, Slurm or CRIU needed."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "site" / "settings_table.py"
NAME = re.compile(r"GPUCR_[A-Z0-9_]+")
C_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
# Names that are no variable: prefixes a module matches others with.
NOT_VARIABLES = {"GPUCR_RESTORE"}  # batch_restore.py: GPUCR_RESTORE* are not the restored job's


def check(script: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60)


def used_names() -> dict[str, set[str]]:
    """GPUCR_ names in the Python package, the srun wrapper, the scripts, benchmarks and GPU checks
    (scripts/, bench/, gpu-checks/; not bench/results/) and the guides (anywhere),
    and in string literals of the shim's (its C unit tests' too) and the plugin's C (the rest there
    is macros and enums).
    A name ending in _ is a prefix (`GPUCR_COPY_ variables`, `GPUCR_BATCH_*`)."""
    found: dict[str, set[str]] = {}
    plain = [*(REPO / "gpucr_hpc").rglob("*.py"), REPO / "spank" / "srun-wrapper",
             *(p for d in ("scripts", "bench", "bench/common", "gpu-checks") for p in (REPO / d).iterdir()
               if p.is_file()),
             *(REPO / "site" / "docs").glob("*.md")]
    c_files = [*(REPO / "shim").glob("*.[ch]"), *(REPO / "shim" / "tests").glob("*.[ch]"),
               *(REPO / "spank").glob("*.[ch]")]
    for path in plain + c_files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if path.suffix in (".c", ".h"):
            text = "\n".join(C_STRING.findall(text))
        for n in NAME.findall(text):
            if not n.endswith("_") and n not in NOT_VARIABLES:
                found.setdefault(n, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_name_used_is_declared():
    """A new GPUCR_ variable without a declaration (and so without a row in the guides) fails here."""
    found = used_names()
    assert {"GPUCR_RUN_DIR", "GPUCR_COPY_NT", "GPUCR_SBATCH_SIGNAL_SET", "GPUCR_SRUN_STATUS"} <= set(found)
    missing = {n: sorted(w) for n, w in found.items() if n not in config.BY_NAME}
    assert not missing, f"declare these in gpucr_hpc/config.py SETTINGS: {missing}"


def test_every_declaration_is_used():
    unused = set(config.BY_NAME) - set(used_names())
    assert not unused, f"declared but used nowhere: {sorted(unused)}"


def test_python_reads_go_through_config():
    """No module of the package reads a GPUCR_ variable from os.environ itself (writing one
    for a child is fine)."""
    read = re.compile(r"""(os\.environ\.get|os\.getenv)\(\s*["']GPUCR_"""
                      r"""|os\.environ\[["']GPUCR_[A-Z0-9_]+["']\](?!\s*=[^=])""")
    bad = []
    for path in (REPO / "gpucr_hpc").rglob("*.py"):
        if path.name == "config.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if read.search(line):
                bad.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not bad, "read these through gpucr_hpc.config:\n" + "\n".join(bad)


def test_config_loads_only_the_standard_library():
    """The root helper loads config (through the CRIU module): it must stay standard library only."""
    code = "import sys, gpucr_hpc.config; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-E", "-s", "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO)
    loaded = set(out.stdout.split())
    assert {m for m in loaded if m.startswith("gpucr_hpc")} == {"gpucr_hpc", "gpucr_hpc.config", "gpucr_hpc.errors"}
    third_party = {m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"gpucr_hpc"}
    assert not {m for m in third_party - {"sitecustomize", "usercustomize"} if not m.startswith("_")}, third_party


def test_declarations_are_complete():
    for s in config.SETTINGS:
        assert s.meaning.strip() and s.read_by and s.set_by, s.name
        if s.type == "choice":
            assert s.choices, s.name
        if s.default is not None and s.read_by == ("python",):
            config.parse(s, s.default)  # a default that does not parse is a bug


def test_value_reads_the_environment_at_call_time(monkeypatch):
    monkeypatch.delenv("GPUCR_COPY_HELPER_IDLE", raising=False)
    assert config.value("GPUCR_COPY_HELPER_IDLE") == 600.0
    monkeypatch.setenv("GPUCR_COPY_HELPER_IDLE", "3")
    assert config.value("GPUCR_COPY_HELPER_IDLE") == 3.0
    monkeypatch.setenv("GPUCR_COPY_HELPER_IDLE", "")  # empty counts as unset
    assert config.value("GPUCR_COPY_HELPER_IDLE") == 600.0
    monkeypatch.setenv("GPUCR_LOAD_DIRECT", "yes")
    assert config.value("GPUCR_LOAD_DIRECT") is True
    monkeypatch.delenv("GPUCR_LOAD_DIRECT")
    assert config.value("GPUCR_LOAD_DIRECT") is False
    assert config.value("GPUCR_STAGE_DIR", env={}) == "/dev/shm"
    assert config.value("GPUCR_SRUN_STATUS", env={"GPUCR_SRUN_STATUS": "/x/1.status"}) == "/x/1.status"
    assert config.value("GPUCR_CHECKPOINT_LEAD", env={"GPUCR_CHECKPOINT_LEAD": "120"}) == 120


@pytest.mark.parametrize("name,bad,accepts", [
    ("GPUCR_LOAD_DIRECT", "maybe", "1 or 0"),
    ("GPUCR_COPY_HELPER_IDLE", "ten", "seconds"),
    ("GPUCR_COPY_HELPER_IDLE", "-1", "seconds, e.g. 600"),
    ("GPUCR_CHECKPOINT_LEAD", "1.5", "a whole number"),
    ("GPUCR_BATCH_ARGV", "appended", "prepended"),
    ("GPUCR_BATCH_SUPERVISE", "2", "1 or 0"),
])
def test_bad_value_is_one_line_naming_the_variable(name, bad, accepts):
    with pytest.raises(GpucrError) as e:
        config.value(name, env={name: bad})
    line = e.value.one_line()
    assert "\n" not in line and f"{name}={bad!r}" in line and accepts in line, line


def test_bad_value_from_the_cli_is_one_line(tmp_path):
    """Through the CLI: `run --copy-helper` with a bad GPUCR_COPY_HELPER_IDLE is refused in one line."""
    import os
    env = dict(os.environ, GPUCR_COPY_HELPER_IDLE="soon", GPUCR_RUN_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", "from gpucr_hpc.cli import process; process._start_helper("
                        f"__import__('pathlib').Path({str(tmp_path)!r}))"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "GpucrError: bad GPUCR_COPY_HELPER_IDLE='soon'" in r.stderr, r.stderr


def test_required_value_missing_is_one_line():
    with pytest.raises(GpucrError, match="GPUCR_BATCH_SCRIPT is not set"):
        config.value("GPUCR_BATCH_SCRIPT", env={}, required=True)


def test_undeclared_name_is_a_bug():
    with pytest.raises(KeyError, match="GPUCR_NO_SUCH"):
        config.value("GPUCR_NO_SUCH")


def test_faults_are_off_unless_named(monkeypatch):
    monkeypatch.setattr(config, "_fired", set())
    monkeypatch.delenv("GPUCR_FAULTS", raising=False)
    assert not config.fault("copy_helper_in_done")
    monkeypatch.setenv("GPUCR_FAULTS", "something_else")
    assert not config.fault("copy_helper_in_done")
    monkeypatch.setenv("GPUCR_FAULTS", "something_else, copy_helper_in_done")
    assert config.fault("copy_helper_in_done")
    assert not config.fault("copy_helper_in_done")  # once per process
    with pytest.raises(ValueError, match="not a fault declared"):
        config.fault("no_such_fault")


def test_faults_are_not_read_at_import(tmp_path):
    """GPUCR_FAULTS is read when a fault is asked for, not when a module is imported (the old
    GPUCR_COPY_HELPER_FAIL was): set at import and gone by the call, it arms nothing; and the
    other way round."""
    import os
    code = ("import os; from gpucr_hpc import config; from gpucr_hpc.shim import copy_helper; "
            "from gpucr_hpc.store import gpu_data; from gpucr_hpc.process import image; "
            "os.environ.pop('GPUCR_FAULTS', None); a = config.fault('copy_helper_in_done'); "
            "os.environ['GPUCR_FAULTS'] = 'copy_helper_in_done'; b = config.fault('copy_helper_in_done'); "
            "print(a, b)")
    env = dict(os.environ, GPUCR_FAULTS="copy_helper_in_done", PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["False", "True"], r.stderr


def test_settings_page_is_current():
    r = check(TABLE)
    assert r.returncode == 0, r.stderr + "\nregenerate with: python3 site/settings_table.py"


def test_check_notices_a_stale_page(tmp_path):
    """--check is not vacuous: a copy of the site whose user guide lost a row is reported."""
    shutil.copytree(REPO / "site", tmp_path / "site", ignore=shutil.ignore_patterns("site"))
    shutil.copytree(REPO / "gpucr_hpc", tmp_path / "gpucr_hpc", ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "site" / "settings_table.py"
    assert check(script).returncode == 0
    doc = tmp_path / "site" / "docs" / "user.md"
    text = doc.read_text()
    row = next(line for line in text.splitlines(keepends=True) if line.startswith("| `GPUCR_COPY_NT` |"))
    doc.write_text(text.replace(row, ""))
    r = check(script)
    assert r.returncode == 1 and "site/docs/user.md" in r.stderr, r.stderr
    subprocess.run([sys.executable, str(script)], check=True, capture_output=True)
    assert row in doc.read_text() and check(script).returncode == 0


def test_every_setting_is_in_a_table():
    text = "".join((REPO / "site" / "docs" / p).read_text() for p in ("user.md", "admin.md", "testing.md"))
    for s in config.SETTINGS:
        assert f"| `{s.name}` |" in text, s.name
