"""PID 1 of the PID namespace a process tree is restored into.

`criu restore` in the foreground does not report the restored root's exit
status, and a job needs it (the batch script's status is the job's). So the
namespace's init is this small program: it runs `criu restore -d`, after which
the restored root is its child; it waits for the root, reaps the orphans of
the tree as an init must, and exits with the root's status.

    unshare -p -f --mount-proc python -m gpucr_hpc.criu.pidns_init CRIU-ARGV...
"""

import os
import signal
import subprocess
import sys

CRIU_FAILED = 255
TAKEN = ".taken"


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    pidfile = argv[argv.index("--pidfile") + 1]
    # The restored tree joins our session (CRIU --shell-job): its leader must be
    # inside the namespace, or the next dump of the tree cannot record it.
    os.setsid()
    # As PID 1 we get only the signals we handle: pass termination on to the tree.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(-1, s))
    if subprocess.call(argv) != 0:
        return CRIU_FAILED
    with open(pidfile) as f:
        root = int(f.read())
    # The caller removes CRIU's work dir (and the pidfile in it) once it sees this.
    open(pidfile + TAKEN, "w").close()
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 0
        if pid == root:
            return exit_code(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
