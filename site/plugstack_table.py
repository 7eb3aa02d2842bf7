#!/usr/bin/env python3
"""The table of the plugin's plugstack.conf arguments in the admin guide,
generated from the plugin's own table of them (spank/site_config.c, `keys[]`).

    python3 site/plugstack_table.py          rewrite the generated block
    python3 site/plugstack_table.py --check  exit 1 if the block is not current

From the C sources come the arguments and their order (`keys[]`), whether the
value must be an absolute path (`is_path`), the default (what
`gpucr_site_parse` puts in the field before it reads the line) and the form of
the value (the field's comment in site_config.h: `shim=PATH`). The longer
meaning of each argument is written here, in MEANING; an argument the plugin
parses that MEANING does not describe, or one MEANING describes that the plugin
no longer parses, is an error, and so is a `known:` list in the plugin's
error message that differs from `keys[]`. The block sits between
`<!-- BEGIN plugstack -->` and `<!-- END plugstack -->` in admin.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parent
REPO = SITE.parent
DOCS = SITE / "docs"
SPANK = REPO / "spank"
PAGE = "admin.md"
sys.path.insert(0, str(SITE))

import doc_blocks  # noqa: E402  (beside this script)

# What each argument does, for the guide (Markdown); the rest comes from the C.
MEANING = {
    "shim": "The shim, put first in every task's `LD_PRELOAD` (`GPUCR_SHIM`).",
    "rundir": "Root of the per-job run dirs: node-local, owned by root and writable by root only (the plugin "
              "refuses a root that users could plant directories in); best the same path on every node (no `%n`).",
    "imageroot": "The checkpoint image store, shared by all nodes, root's with mode 0755: the plugin makes each "
                 "job's `<jobid>` dir there, the job user's, 0700 (`GPUCR_IMAGE_ROOT`).",
    "arena": "Node-local mount of the host arena, hugetlbfs or shm (`GPUCR_ARENA_DIR`).",
    "gpu_feature": "Node features that name the GPU vendor/model (`GPUCR_GPU_FEATURE`); a requeued GPU job gets "
                   "those its nodes have as constraints ([Same GPU model after a requeue]"
                   "(#same-gpu-model-after-a-requeue)).",
    "vendor": "GPU vendor of the nodes (`GPUCR_VENDOR`).",
    "cli": "The `gpucr-hpc` command (the one pip installed): it supervises every `--gpucr=on` batch step.",
    "bindir": "Holds the `srun` wrapper (`make install` puts it in `$PREFIX/lib/gpucr/bin`), put first in the "
              "batch step's `PATH`.",
    "signal": "Warning signal of `--gpucr=on` batch jobs (`sbatch --signal=B:SIG@SECS`; SIG one of USR1 USR2 URG "
              "XCPU PWR WINCH): its arrival makes the job checkpoint and requeue itself "
              "([Preemption and time limits](#preemption-and-time-limits)).",
    "copy_helper": "`on`: every task gets `GPUCR_COPY_HELPER=<job run dir>/copy-helper.sock` and "
                   "`GPUCR_COPY_HELPER_START=<cli>`: the GPU data moves through a copy helper the shim starts "
                   "(unless the job set `GPUCR_COPY_HELPER=off`) "
                   "([The fast path](#the-fast-path-copy-helper-and-arena-ahead)).",
    "arena_prealloc": "`GPUCR_ARENA_PREALLOC` of every task, unless the job set its own: the host arena made "
                      "ahead of checkpoints (`auto`: grown as the GPU memory grows; a size such as `80G`).",
    "interval": "The site's periodic in-place checkpoints of `--gpucr=on` batch jobs, against node failures "
                "(`GPUCR_CHECKPOINT_INTERVAL`, seconds; `3600`, `90m`, `2h`); a job's `--gpucr-interval` wins.",
    "stage": "Node memory (a tmpfs directory on every node, owned by root, mode 0755; `%n`: the node's name) that "
             "a preemption writes the job's units to first: the job ends and the node is free before the image "
             "root has them; the plugin makes each job's `<jobid>` dir there for the job's user, and the job "
             "epilog starts `gpucr-hpc drain JOBID` as that user, which moves them to the image root "
             "([Node memory first](#node-memory-first-the-staging-tier)).",
    "stage_cap": "What staged checkpoints may take of `stage=` on a node (a share of its file system such as "
                 "`50%`, or a size such as `64G`); a unit beyond it goes straight to the image root.",
    "outside": "What a checkpoint of a `--gpucr=on` job does with a TCP connection to a server outside the job "
               "(W&B, MLflow): `refuse` the checkpoint, or `close`: the connection is restored closed and the "
               "program reconnects (`GPUCR_OUTSIDE` of every task); a job's `--gpucr-outside` wins.",
}


class Stale(Exception):
    pass


def parse_keys(c: str) -> list[tuple[str, str, bool]]:
    """(name, field, is_path) of every entry of `keys[]`, in its order."""
    m = re.search(r"static const struct key keys\[\] = \{(.*?)\n\};", c, re.S)
    if not m:
        raise Stale("spank/site_config.c: no `static const struct key keys[]` table")
    rows = re.findall(r'\{\s*"(\w+)",\s*FIELD\((\w+)\),\s*([01])\s*\}', m.group(1))
    if not rows:
        raise Stale("spank/site_config.c: keys[] has no entries this script can read")
    return [(n, f, p == "1") for n, f, p in rows]


def parse_defaults(c: str) -> dict[str, str]:
    """field -> the value gpucr_site_parse gives it before reading the line."""
    macros = dict(re.findall(r'#define\s+(DEFAULT_\w+)\s+"([^"]*)"', c))
    body = c[c.index("int gpucr_site_parse("):]
    out = {}
    for field, val in re.findall(r'snprintf\(site->(\w+),\s*sizeof\(site->\w+\),\s*"%s",\s*(\w+|"[^"]*")\)', body):
        out[field] = val[1:-1] if val.startswith('"') else macros[val]
    return out


def parse_forms(h: str) -> dict[str, str]:
    """field -> `name=VALUE` as the field's comment in site_config.h writes it."""
    m = re.search(r"struct gpucr_site \{(.*?)\n\};", h, re.S)
    if not m:
        raise Stale("spank/site_config.h: no struct gpucr_site")
    return dict(re.findall(r"\b(\w+)\[[^\]]*\];\s*/\*\s*(\w+=\S+)", m.group(1)))


def known_list(c: str) -> list[str] | None:
    m = re.search(r"known: ([^)]*)\)", c)
    return [w.rstrip("=") for w in m.group(1).split()] if m else None


def cell(text: str) -> str:
    """One table cell: `|` escaped outside code spans (inside one, Python-Markdown's tables
    read it as text, and an escape would show)."""
    parts = " ".join(text.split()).split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def plugstack_table(spank: Path = SPANK) -> str:
    c = (spank / "site_config.c").read_text()
    h = (spank / "site_config.h").read_text()
    keys = parse_keys(c)
    defaults = parse_defaults(c)
    forms = parse_forms(h)
    names = [n for n, _, _ in keys]
    problems = []
    if missing := [n for n in names if n not in MEANING]:
        problems.append(f"the plugin parses {', '.join(n + '=' for n in missing)}, which site/plugstack_table.py "
                        "does not describe: add it to MEANING")
    if gone := [n for n in MEANING if n not in names]:
        problems.append(f"site/plugstack_table.py describes {', '.join(n + '=' for n in gone)}, which the plugin "
                        "no longer parses: remove it from MEANING")
    known = known_list(c)
    if known is not None and known != names:
        problems.append(f"spank/site_config.c: the error message's known: list ({' '.join(known)}) differs from "
                        f"keys[] ({' '.join(names)})")
    rows = []
    for name, field, is_path in keys:
        form = forms.get(field, f"{name}=VALUE")
        if not form.startswith(name + "="):
            problems.append(f"spank/site_config.h: the comment of {field} says {form}, not {name}=...")
        value = form.split("=", 1)[1]
        if is_path != (value in ("PATH", "DIR")):
            problems.append(f"{name}=: is_path is {int(is_path)} in keys[], but its form is {form}")
        default = defaults.get(field, "")
        rows.append([f"`{form}`", f"`{default}`" if default else "—", MEANING.get(name, "")])
    if problems:
        raise Stale("; ".join(problems))
    out = ["| argument | default | meaning |", "|---|---|---|"]
    out += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check that the table in the admin guide is current")
    a = ap.parse_args()
    doc = DOCS / PAGE
    try:
        old = doc.read_text()
        new = doc_blocks.fill(old, "plugstack", plugstack_table(), f"plugstack_table: {doc}")
    except Stale as e:
        print(f"plugstack_table: {e}", file=sys.stderr)
        return 1
    stale = new != old
    if a.check:
        if stale:
            print(f"plugstack_table: not current: {doc.relative_to(REPO)}; run python3 site/plugstack_table.py",
                  file=sys.stderr)
            return 1
        return 0
    if stale:
        doc.write_text(new)
    print(f"plugstack_table: {'updated ' + str(doc.relative_to(REPO)) if stale else 'everything current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
