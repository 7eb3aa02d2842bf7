"""Where every run of the root helper starts: in `/`, with a clean environment.

sudo may keep the caller's working directory and, on a site that turned
env_reset off, the caller's environment. Neither may choose what root runs:
the helper's wrapper (scripts/install-helper) already starts it with `env -i`
and `python -I`, and this is the same rule once more inside, before anything
else is read, so that a helper run some other way by root is no weaker.
"""

from __future__ import annotations

import os

SECURE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# SUDO_UID/SUDO_GID: sudo sets them itself, whatever the caller had (the caller's
# identity). GPUCR_PREFIX: set by the root-owned wrapper (where it is installed).
KEPT = ("SUDO_UID", "SUDO_GID", "GPUCR_PREFIX")


def clean_start() -> None:
    kept = {k: os.environ[k] for k in KEPT if k in os.environ}
    os.environ.clear()
    os.environ.update(kept, PATH=SECURE_PATH, LANG="C.UTF-8")
    os.chdir("/")
    os.umask(0o077)
