"""The documentation site: the tables of site/docs/results.md are those that
site/results_tables.py generates from the committed bench/results/*.json, and the
plots it shows are the committed ones. A changed result file fails here until the
page is regenerated (python3 site/results_tables.py). The admin guide's table of
plugstack.conf arguments is the one site/plugstack_table.py generates from the
plugin's own table (spank/site_config.c), and README, the quick start and the admin
guide show one plugstack line of known arguments. The whole site builds with
`mkdocs build --strict` (skipped, with the reason, where mkdocs is not installed).
No GPU, Slurm or CRIU needed."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TABLES = REPO / "site" / "results_tables.py"
PLUGSTACK = REPO / "site" / "plugstack_table.py"


def check(script: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)


def test_results_page_is_current():
    r = check(TABLES)
    assert r.returncode == 0, r.stderr + "\nregenerate with: python3 site/results_tables.py"


def test_check_notices_a_stale_page(tmp_path):
    """--check is not vacuous: a copy of the site whose page lost a figure is reported."""
    shutil.copytree(REPO / "site", tmp_path / "site", ignore=shutil.ignore_patterns("site"))
    shutil.copytree(REPO / "bench" / "results", tmp_path / "bench" / "results")
    assert check(tmp_path / "site" / "results_tables.py").returncode == 0
    doc = tmp_path / "site" / "docs" / "results.md"
    text = doc.read_text()
    begin = text.index("<!-- BEGIN data-path -->\n") + len("<!-- BEGIN data-path -->\n")
    end = text.index("<!-- END data-path -->")
    assert "bench/results/shim-vs-driver-h100.json" in text[begin:end]
    doc.write_text(text[:begin] + text[end:])
    r = check(tmp_path / "site" / "results_tables.py")
    assert r.returncode == 1
    assert "site/docs/results.md" in r.stderr


def test_check_notices_a_changed_result(tmp_path):
    """A figure changed in a result file (a new run) makes the page stale until regenerated."""
    shutil.copytree(REPO / "site", tmp_path / "site", ignore=shutil.ignore_patterns("site"))
    shutil.copytree(REPO / "bench" / "results", tmp_path / "bench" / "results")
    f = tmp_path / "bench" / "results" / "job-gpu-slurm-h100.json"
    d = json.loads(f.read_text())
    d["preempt"]["preempt_cli_s"] = 1234.5
    f.write_text(json.dumps(d))
    r = check(tmp_path / "site" / "results_tables.py")
    assert r.returncode == 1 and "site/docs/results.md" in r.stderr
    subprocess.run([sys.executable, str(tmp_path / "site" / "results_tables.py")], check=True, capture_output=True)
    assert "1234.50 s" in (tmp_path / "site" / "docs" / "results.md").read_text()
    assert check(tmp_path / "site" / "results_tables.py").returncode == 0


def copy_site_and_plugin(tmp_path: Path) -> Path:
    """A copy of site/ and of the plugin's argument table; returns the copied plugstack_table.py."""
    shutil.copytree(REPO / "site", tmp_path / "site", ignore=shutil.ignore_patterns("site"))
    (tmp_path / "spank").mkdir()
    for f in ("site_config.c", "site_config.h"):
        shutil.copy(REPO / "spank" / f, tmp_path / "spank" / f)
    return tmp_path / "site" / "plugstack_table.py"


def test_plugstack_table_is_current():
    r = check(PLUGSTACK)
    assert r.returncode == 0, r.stderr + "\nregenerate with: python3 site/plugstack_table.py"


def test_plugstack_check_notices_a_stale_page(tmp_path):
    """--check is not vacuous: a copy of the admin guide that lost a row is reported, and regenerated."""
    script = copy_site_and_plugin(tmp_path)
    assert check(script).returncode == 0
    doc = tmp_path / "site" / "docs" / "admin.md"
    text = doc.read_text()
    row = next(line for line in text.splitlines(keepends=True) if line.startswith("| `stage_cap="))
    doc.write_text(text.replace(row, ""))
    r = check(script)
    assert r.returncode == 1 and "site/docs/admin.md" in r.stderr, r.stderr
    subprocess.run([sys.executable, str(script)], check=True, capture_output=True)
    assert row in doc.read_text() and check(script).returncode == 0


def test_plugstack_table_follows_the_plugin(tmp_path):
    """The table comes from the plugin's keys[]: a new default there changes the page; an
    argument the plugin parses but the generator does not describe fails the check by name."""
    script = copy_site_and_plugin(tmp_path)
    c = tmp_path / "spank" / "site_config.c"
    src = c.read_text()
    c.write_text(src.replace('#define DEFAULT_RUNDIR    "/run/gpucr"', '#define DEFAULT_RUNDIR    "/run/gpucr2"'))
    assert check(script).returncode == 1
    subprocess.run([sys.executable, str(script)], check=True, capture_output=True)
    assert "| `rundir=DIR` | `/run/gpucr2` |" in (tmp_path / "site" / "docs" / "admin.md").read_text()
    c.write_text(src.replace('{ "stage_cap",   FIELD(stage_cap),   0 },',
                             '{ "stage_cap",   FIELD(stage_cap),   0 },\n\t{ "newarg", FIELD(vendor), 0 },'))
    r = check(script)
    assert r.returncode == 1 and "newarg=" in r.stderr, r.stderr


def plugstack_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("required ") and "spank_gpucr.so" in line]


def test_the_plugstack_line_is_one_and_valid():
    """README, the quick start and the admin guide show the same plugstack.conf line first, and
    every argument on a plugin line of theirs is one the plugin parses (keys[] of
    spank/site_config.c)."""
    sys.path.insert(0, str(REPO / "site"))
    import plugstack_table

    lines = {p: plugstack_lines(REPO / p) for p in ("README.md", "site/docs/quickstart.md", "site/docs/admin.md")}
    assert all(lines.values()) and len({v[0] for v in lines.values()}) == 1, lines
    known = {n for n, _, _ in plugstack_table.parse_keys((REPO / "spank" / "site_config.c").read_text())}
    for line in (x for v in lines.values() for x in v):
        for arg in line.split()[2:]:
            assert arg == "..." or arg.split("=", 1)[0] in known, (arg, line)


def test_results_page_is_short():
    """The results page is read in five minutes; the history of runs stays in bench/results/."""
    assert len((REPO / "site" / "docs" / "results.md").read_text().splitlines()) <= 250


def mkdocs_build(site: Path, out: Path) -> subprocess.CompletedProcess:
    """No -q: it hides the warnings that --strict turns into a failure."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(site / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, timeout=300, cwd=out.parent, env=env)


def test_site_builds_strict(tmp_path):
    """`mkdocs build --strict`: every link, anchor, snippet and nav entry resolves.
    Skipped only where mkdocs is not installed (pip install -e '.[docs]')."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    r = mkdocs_build(REPO / "site", tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "out" / "index.html").exists()


def test_strict_build_notices_a_broken_anchor(tmp_path):
    """The strict build is not vacuous: a link to a section that is not there fails it."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    shutil.copytree(REPO / "site", tmp_path / "site", ignore=shutil.ignore_patterns("site"))
    with open(tmp_path / "site" / "docs" / "index.md", "a") as f:
        f.write("\n[gone](results.md#no-such-section)\n")
    r = mkdocs_build(tmp_path / "site", tmp_path / "out")
    assert r.returncode != 0 and "no-such-section" in r.stdout + r.stderr
