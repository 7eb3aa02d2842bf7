#!/usr/bin/env python3
"""The tables of GPUCR_ environment variables in the guides, generated from
their one declaration, gpucr_hpc/config.py (SETTINGS).

    python3 site/settings_table.py          rewrite every generated block
    python3 site/settings_table.py --check  exit 1 if a block is not current

A generated block sits between `<!-- BEGIN name -->` and `<!-- END name -->`;
the prose around it is written by hand and left alone. Three tables:
`settings` in user.md (what a user or an admin may set, the shim's included),
`job-environment` in admin.md (what our own parts set for a job's processes),
`test-settings` in testing.md (tests and scripts only). A variable may be in
more than one; every declared one is in at least one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parent
REPO = SITE.parent
DOCS = SITE / "docs"
sys.path.insert(0, str(REPO))

import doc_blocks  # noqa: E402  (beside this script)

from gpucr_hpc import config  # noqa: E402

READER = {"python": "gpucr-hpc", "shim": "shim", "plugin": "plugin", "job": "the job",
          "test": "tests", "scripts": "scripts"}
SETTER = {"user": "user", "plugin": "plugin", "gpucr-hpc": "gpucr-hpc", "srun-wrapper": "srun wrapper",
          "test": "tests", "scripts": "scripts"}
OURS = ("plugin", "gpucr-hpc", "srun-wrapper")


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def in_user(s: config.Setting) -> bool:
    return "user" in s.set_by and any(r in ("python", "shim", "plugin") for r in s.read_by)


def in_job(s: config.Setting) -> bool:
    return any(w in OURS for w in s.set_by)


def in_test(s: config.Setting) -> bool:
    return any(w in ("test", "scripts") for w in s.read_by + s.set_by)


def names(keys, words) -> str:
    return ", ".join(words[k] for k in keys)


def user_settings() -> str:
    return table(["variable", "default", "meaning", "read by"],
                 [[f"`{s.name}`", s.shown_default(), s.meaning, names(s.read_by, READER)]
                  for s in config.SETTINGS if in_user(s)])


def job_environment() -> str:
    return table(["variable", "meaning", "set by", "read by"],
                 [[f"`{s.name}`", s.meaning, names([w for w in s.set_by if w in OURS], SETTER),
                   names(s.read_by, READER)]
                  for s in config.SETTINGS if in_job(s)])


def test_settings() -> str:
    return table(["variable", "default", "meaning", "set by", "read by"],
                 [[f"`{s.name}`", s.shown_default(), s.meaning, names(s.set_by, SETTER), names(s.read_by, READER)]
                  for s in config.SETTINGS if in_test(s)])


# block name -> (page, what fills it)
BLOCKS = {
    "settings": ("user.md", user_settings),
    "job-environment": ("admin.md", job_environment),
    "test-settings": ("testing.md", test_settings),
}


def render(page: str, text: str) -> str:
    for name, (where, fn) in BLOCKS.items():
        if where != page:
            continue
        text = doc_blocks.fill(text, name, fn(), f"settings_table: {DOCS / page}")
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check that the tables in the guides are current")
    a = ap.parse_args()
    lost = [s.name for s in config.SETTINGS if not (in_user(s) or in_job(s) or in_test(s))]
    if lost:
        print(f"settings_table: in no table: {', '.join(lost)}", file=sys.stderr)
        return 1
    stale = []
    for page in sorted({p for p, _ in BLOCKS.values()}):
        doc = DOCS / page
        old = doc.read_text()
        new = render(page, old)
        if new != old:
            stale.append(str(doc.relative_to(REPO)))
            if not a.check:
                doc.write_text(new)
    if a.check:
        if stale:
            print(f"settings_table: not current: {', '.join(stale)}; run python3 site/settings_table.py",
                  file=sys.stderr)
            return 1
        return 0
    print(f"settings_table: {'updated ' + ', '.join(stale) if stale else 'everything current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
