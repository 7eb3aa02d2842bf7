"""The door for Slurm operators who are not root: `sudo gpucr-operator VERB JOBID`.

Slurm lets only root (and SlurmUser) start a step in another user's job, and
the node agents of every job command run as such steps. So an operator acts on
another user's job through this program, which sudo runs as root for whom the
site's rule names (`make install GPUCR_OPERATORS=%group`). It runs exactly
`gpucr-hpc VERB JOBID [--from N] [--json]` for the verbs an operator needs, as
root would run them (the agents still act with the job user's rights), and
nothing else: no process commands, no paths, no other options.

    gpucr-operator checkpoint|preempt|suspend|resume JOBID [--json]
    gpucr-operator restore JOBID [--from N] [--json]
"""

from __future__ import annotations

import os
import re
import sys

from gpucr_hpc.privileged import install_check

VERBS = ("checkpoint", "preempt", "suspend", "resume", "restore")
_JOBID = re.compile(r"[0-9]{1,12}")
_GEN = re.compile(r"(gen-)?[0-9]{1,9}")
ENV_KEPT = ("LANG", "LC_ALL", "TERM", "SUDO_USER", "SUDO_UID")
SECURE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def root_only(path: str) -> bool:
    """A file, and every folder above it, that only root can change."""
    try:
        return install_check.unsafe_above(os.path.realpath(path)) is None
    except OSError:
        return False


def environment(env: dict[str, str]) -> dict[str, str]:
    """What of the operator's environment reaches root: who they are, the terminal, and a
    Slurm configuration only root can change; the tools are found on the system's path."""
    out = {k: env[k] for k in ENV_KEPT if k in env}
    out["PATH"] = SECURE_PATH
    conf = env.get("SLURM_CONF")
    if conf:
        if not root_only(conf):
            raise ValueError(f"SLURM_CONF={conf} is a file another user than root could change; "
                             "root reads only a Slurm configuration that root alone writes")
        out["SLURM_CONF"] = conf
    return out


def parse(argv: list[str]) -> list[str]:
    """The gpucr-hpc arguments argv stands for; ValueError with the reason otherwise."""
    if len(argv) < 2 or argv[0] not in VERBS:
        raise ValueError(f"give one of {', '.join(VERBS)} and a job id")
    verb, jobid, rest = argv[0], argv[1], argv[2:]
    if not _JOBID.fullmatch(jobid):
        raise ValueError(f"{jobid!r} is not a job id")
    out = [verb, jobid]
    while rest:
        if rest[0] == "--json":
            out.append(rest.pop(0))
        elif rest[0] == "--from" and verb == "restore" and len(rest) > 1 and _GEN.fullmatch(rest[1]):
            out += rest[:2]
            del rest[:2]
        else:
            raise ValueError(f"{rest[0]!r} is not allowed here")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if os.geteuid() != 0:
            raise ValueError("it must run as root, through sudo")
        args = parse(argv)
        env = environment(dict(os.environ))
    except ValueError as e:
        print(f"gpucr-operator: error: {e}; usage: gpucr-operator VERB JOBID "
              f"(VERB: {', '.join(VERBS)}; restore also takes --from N)", file=sys.stderr)
        return 2
    os.chdir("/")
    os.execve(sys.executable, [sys.executable, "-I", "-m", "gpucr_hpc", *args], env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
