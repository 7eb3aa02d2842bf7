"""What root runs must be root's alone: the check `make install` makes before it
writes a sudo rule that runs this Python as root.

Every file and folder the interpreter may load from when run isolated (`-I`):
the interpreter itself, every folder on its path (site-packages and what its
.pth files add), our package wherever it lies (an editable install names it in
a finder, not on the path), each of them whole, and every folder above them up
to `/`. One of them owned by another user, or writable by group or others,
lets that user change what root runs.

    python -I -m gpucr_hpc.privileged.install_check [PATH...]
        prints the first unsafe path; exits 1 if any. PATHs: more that root runs
        (scripts/install-helper names CRIU, nft and the wrappers of its prefix).
"""

from __future__ import annotations

import os
import stat
import sys

SKIP = {".git"}


def unsafe_entry(path: str, above: bool = False) -> bool:
    """Whether a user other than root can change path (above: a folder above what root
    loads, where a sticky folder such as /tmp is fine: its root-owned entries stay root's)."""
    st = os.lstat(path)
    if st.st_uid != 0:
        return True
    if stat.S_ISLNK(st.st_mode):
        return False  # a link's own mode means nothing; its target is checked where it is loaded from
    if st.st_mode & 0o022:
        return not (above and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX)
    return False


def unsafe_above(path: str) -> str | None:
    """The first of path and the folders above it that another user can change."""
    if unsafe_entry(path):
        return path
    while path != "/":
        path = os.path.dirname(path)
        if unsafe_entry(path, above=True):
            return path
    return None


def roots() -> list[str]:
    import gpucr_hpc

    found = [os.path.realpath(sys.executable), os.path.dirname(os.path.realpath(gpucr_hpc.__file__))]
    found += [os.path.realpath(p) for p in sys.path if p and os.path.exists(p)]
    return list(dict.fromkeys(found))


def first_unsafe(paths: list[str]) -> str | None:
    """The first path root would load that another user can change: each of paths and
    the folders above it, everything in it, in every subfolder, and what each link in
    it leads to (the target is checked as a root of its own: a root-owned link to a
    user's file lets that user change what root runs)."""
    walked: set[str] = set()
    todo = list(paths)
    checked: set[str] = set()
    while todo:
        root = todo.pop(0)
        if root in checked:
            continue
        checked.add(root)
        bad = unsafe_above(root)
        if bad:
            return bad
        if not os.path.isdir(root):
            continue
        for here, dirs, files in os.walk(root):
            if here in walked:
                dirs[:] = []
                continue
            walked.add(here)
            dirs[:] = [d for d in dirs if d not in SKIP]
            for name in dirs + files:
                path = os.path.join(here, name)
                if unsafe_entry(path):
                    return path
                if os.path.islink(path) and os.path.exists(path):
                    todo.append(os.path.realpath(path))
    return None


def main(argv: list[str] | None = None) -> int:
    more = [os.path.realpath(p) for p in (sys.argv[1:] if argv is None else argv) if os.path.lexists(p)]
    bad = first_unsafe(roots() + more)
    if bad:
        print(bad)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
