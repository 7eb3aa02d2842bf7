"""Building and installing the SPANK plugin (spank/Makefile); no cluster needed."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HAVE_HEADERS = Path("/usr/include/slurm/spank.h").exists()


def make(src, *args):
    return subprocess.run(["make", "-C", str(src), *args], capture_output=True, text=True)


@pytest.fixture
def src(tmp_path):
    dst = tmp_path / "spank"
    shutil.copytree(REPO / "spank", dst, ignore=shutil.ignore_patterns("*.o", "*.so"))
    return dst


@pytest.mark.skipif(not HAVE_HEADERS, reason="slurm/spank.h not installed (libslurm-dev)")
def test_builds_cleanly_and_installs(src, tmp_path):
    res = make(src)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "warning" not in res.stderr
    assert "-Wall -Wextra -Werror" in res.stdout
    syms = subprocess.run(["nm", "-D", "--defined-only", str(src / "spank_gpucr.so")],
                          capture_output=True, text=True, check=True).stdout
    for sym in ("plugin_name", "plugin_type", "plugin_version", "slurm_spank_init",
                "slurm_spank_init_post_opt", "slurm_spank_task_init",
                "slurm_spank_task_exit", "slurm_spank_job_epilog"):
        assert f" {sym}\n" in syms, sym
    res = make(src, "install", f"PREFIX={tmp_path / 'prefix'}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "prefix" / "lib" / "gpucr" / "spank_gpucr.so").is_file()


# What Slurm looks up in a SPANK plugin besides the hooks (SPANK_PLUGIN() defines all four).
PLUGIN_SYMBOLS = {"plugin_name", "plugin_type", "plugin_version", "spank_plugin_version"}


@pytest.mark.skipif(not HAVE_HEADERS, reason="slurm/spank.h not installed (libslurm-dev)")
def test_exports_only_spank_hooks_and_plugin_symbols(src):
    """spank_gpucr.lds: the gpucr_* helpers stay local to the plugin, so they can
    clash with nothing else loaded into slurmd, slurmstepd or srun."""
    res = make(src)
    assert res.returncode == 0, res.stdout + res.stderr
    out = subprocess.run(["nm", "-D", "--defined-only", str(src / "spank_gpucr.so")],
                         capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    extra = sorted(n for n in names if n not in PLUGIN_SYMBOLS and not n.startswith("slurm_spank_"))
    assert extra == [], f"exported beyond the SPANK interface: {extra}"
    assert PLUGIN_SYMBOLS <= names
    assert {"slurm_spank_init", "slurm_spank_task_init", "slurm_spank_job_epilog"} <= names


def test_missing_headers_one_clear_line(src, tmp_path):
    res = make(src, f"SLURM_INCLUDE={tmp_path / 'nowhere'}")
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("make")]
    assert len(lines) == 1 and "slurm/spank.h not found" in lines[0], res.stderr
    assert "libslurm-dev" in lines[0]


HARNESS = r'''
#include <stdio.h>
#include <string.h>
#include "task_env.h"
/* stubs: the functions under test do not call Slurm */
spank_err_t spank_getenv(spank_t s, const char *v, char *b, int l) {
    (void)s; (void)v; (void)b; (void)l; return ESPANK_ERROR;
}
spank_err_t spank_setenv(spank_t s, const char *v, const char *x, int o) {
    (void)s; (void)v; (void)x; (void)o; return ESPANK_ERROR;
}
spank_err_t spank_unsetenv(spank_t s, const char *v) { (void)s; (void)v; return ESPANK_ERROR; }
const char *spank_strerror(spank_err_t e) { (void)e; return ""; }
void slurm_error(const char *f, ...) { (void)f; }
int main(int argc, char **argv) {
    char out[256];
    int rc = strcmp(argv[1], "prepend") == 0
        ? gpucr_preload_prepend(argv[2], argc > 3 ? argv[3] : NULL, out, sizeof(out))
        : gpucr_preload_remove(argv[2], argc > 3 ? argv[3] : NULL, out, sizeof(out));
    if (rc) { puts("TOO LONG"); return 1; }
    printf("[%s]\n", out);
    return 0;
}
'''


@pytest.mark.skipif(not HAVE_HEADERS, reason="slurm/spank.h not installed (libslurm-dev)")
@pytest.mark.parametrize("op,old,want", [
    ("prepend", None, "/s.so"),
    ("prepend", "", "/s.so"),
    ("prepend", "/u.so", "/s.so:/u.so"),
    ("prepend", "/u.so /v.so", "/s.so:/u.so:/v.so"),          # ld.so also splits on blanks
    ("prepend", "/s.so:/u.so", "/s.so:/u.so"),                # already there: still once
    ("prepend", "/u.so:/s.so::/s.so", "/s.so:/u.so"),         # moved first, empties dropped
    ("prepend", "/s.so.1:/x/s.so", "/s.so:/s.so.1:/x/s.so"),  # only the exact path counts
    ("prepend", "/u" * 200, "TOO LONG"),
    ("remove", "/s.so:/u.so", "/u.so"),
    ("remove", "/s.so", ""),
])
def test_ld_preload_editing(src, tmp_path, op, old, want):
    (tmp_path / "h.c").write_text(HARNESS)
    exe = tmp_path / "h"
    subprocess.run(["cc", "-Wall", "-Wextra", "-Werror", f"-I{src}", "-o", str(exe),
                    str(tmp_path / "h.c"), str(src / "task_env.c")], check=True)
    argv = [str(exe), op, "/s.so"] + ([old] if old is not None else [])
    out = subprocess.run(argv, capture_output=True, text=True).stdout.strip()
    assert out == (want if want == "TOO LONG" else f"[{want}]")


SITE_HARNESS = r'''
#include <stdio.h>
#include "site_config.h"
int main(int argc, char **argv) {
    struct gpucr_site site;
    if (gpucr_site_parse(&site, argc - 1, argv + 1) != 0) {
        printf("ERROR %s\n", site.error);
        return 1;
    }
    printf("outside=%s\n", site.outside);
    return 0;
}
'''


@pytest.mark.parametrize("args,want", [
    ([], "outside=refuse"),
    (["outside=close"], "outside=close"),
    (["outside=refuse"], "outside=refuse"),
    (["outside=Close"], "ERROR plugstack.conf argument 'outside=Close' must be refuse or close"),
    (["outside="], "ERROR plugstack.conf argument 'outside=' must be refuse or close"),
    # longer than the field: still told what it may be
    (["outside=sometimes"], "ERROR plugstack.conf argument 'outside=sometimes' must be refuse or close"),
])
def test_outside_argument(src, tmp_path, args, want):
    """plugstack outside=refuse|close: refuse unless the site says close; a bad value is
    one line naming the argument and what it may be (site_config.c needs no Slurm)."""
    (tmp_path / "s.c").write_text(SITE_HARNESS)
    exe = tmp_path / "s"
    subprocess.run(["cc", "-Wall", "-Wextra", "-Werror", f"-I{src}", "-o", str(exe),
                    str(tmp_path / "s.c"), str(src / "site_config.c")], check=True)
    res = subprocess.run([str(exe), *args], capture_output=True, text=True)
    assert res.stdout.splitlines() == [want], res.stdout
    assert res.returncode == (1 if want.startswith("ERROR") else 0)
