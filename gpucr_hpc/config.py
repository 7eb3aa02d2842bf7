"""Every `GPUCR_*` environment variable, declared once: name, type, default,
meaning, who reads it and who sets it.

Python reads a setting through `value(name)`, which looks at the environment
at call time (tests and child processes set variables per process; nothing is
cached at import), parses it, and turns a bad value into one GpucrError naming
the variable and what it accepts. An empty value counts as unset. The shim (C)
and the SPANK plugin read their own settings; they are declared here too, so
that the guides' tables (site/settings_table.py) show every one of them, and
tests/test_config.py fails on a `GPUCR_` name used anywhere without a
declaration.

Test-only fault injection is one variable, GPUCR_FAULTS=name,name, and one
call, `fault(name)`, for the names declared in FAULTS; production code reads no
other test variable.

Standard library only, besides gpucr_hpc.errors: what sudo runs as root (the
CRIU root helper, through the CRIU module) loads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from gpucr_hpc.errors import GpucrError

# Who reads a variable, and who sets it (besides the user or the admin).
READERS = ("python", "shim", "plugin", "job", "test", "scripts")
SETTERS = ("user", "plugin", "gpucr-hpc", "srun-wrapper", "test", "scripts")
TYPES = ("text", "path", "command", "flag", "int", "seconds", "choice", "size", "signal")


@dataclass(frozen=True)
class Setting:
    name: str
    type: str                      # one of TYPES
    default: str | None            # as it would be written in the environment; None: none, or computed
    meaning: str                   # one or two sentences, Markdown, for the guides' tables
    read_by: tuple[str, ...]       # of READERS
    set_by: tuple[str, ...] = ("user",)  # of SETTERS
    choices: tuple[str, ...] = ()  # type "choice"
    minimum: float | None = None   # types "int", "seconds"
    default_doc: str = ""          # the default as the table shows it, where it is computed

    def accepts(self) -> str:
        """What a valid value looks like, for an error message and the tables."""
        if self.type == "flag":
            return "1 or 0 (also yes/no, on/off, true/false)"
        if self.type == "choice":
            return " or ".join(self.choices)
        if self.type == "int":
            return "a whole number" + (f" >= {self.minimum:g}" if self.minimum is not None else "")
        if self.type == "seconds":
            return "seconds, e.g. 600"
        if self.type == "size":
            return "a size in bytes, with K, M or G (e.g. 80G), or auto"
        if self.type == "signal":
            return "a signal name or number"
        return {"path": "a path", "command": "a command", "text": "text"}[self.type]

    def shown_default(self) -> str:
        if self.default_doc:
            return self.default_doc
        return f"`{self.default}`" if self.default not in (None, "") else "—"


def _s(name, type, default, meaning, read_by, **kw) -> Setting:
    return Setting(name, type, default, meaning, tuple(read_by.split()), **kw)


# Test faults GPUCR_FAULTS may name: name -> what it does.
FAULTS = {
    "agent_dies_after_lock": "the node agent of MPI rank 1 is killed once it has locked the job's "
                             "connections, before its dumps (tests/test_job_tcp.py)",
    "rank_not_back": "rank 1 of a restore step never says it is back, so the ranks that hold their "
                     "connections until all are back time out (tests/test_job_tcp.py)",
    "drain_fails": "the drain of a staged generation fails on its first unit, as on a full image root "
                   "(tests/test_job_stage.py)",
    "copy_helper_in_done": "the copy helper says the copies of the first `in` failed, so that a GPU "
                           "test sees the process fall back to its own data path without loss "
                           "(`gpu-checks/shim_gpu_verify.py --helper-fails-copy`)",
}

_JOB = ("plugin",)
SETTINGS: tuple[Setting, ...] = (
    # --- user and admin settings ------------------------------------------------------------
    _s("GPUCR_RUN_DIR", "path", None,
       "Where the control sockets are (see `--run-dir`); the plugin sets it to the job's run dir on the node.",
       "python shim", set_by=("user", "plugin", "gpucr-hpc"),
       default_doc="`$XDG_RUNTIME_DIR/gpucr`, else `/tmp/gpucr-<uid>`"),
    _s("GPUCR_SHIM", "path", None,
       "The shim library `gpucr-hpc run` loads; the plugin sets it to plugstack `shim=`.",
       "python", set_by=("user", "plugin"),
       default_doc="`$GPUCR_PREFIX/lib/gpucr`, plugstack `shim=`, the source tree, then the installs"),
    _s("GPUCR_PREFIX", "path", None,
       "Where gpucr-hpc was installed (`make install PREFIX=`), when not `/opt/gpucr-hpc`: "
       "the shim, CRIU and the root helper are looked for under it.",
       "python", default_doc="`/opt/gpucr-hpc`"),
    _s("GPUCR_CRIU", "path", None,
       "The CRIU to use (4.1 or newer).",
       "python", default_doc="`$GPUCR_PREFIX/bin/criu`, `/opt/gpucr-hpc/bin/criu`, then `criu` on PATH"),
    _s("GPUCR_CRIU_HELPER", "path", None,
       "The root helper ordinary users' checkpoints run through sudo (admin guide, 'Ordinary users').",
       "python", default_doc="`$GPUCR_PREFIX/libexec/gpucr-criu-root`, else "
                             "`/opt/gpucr-hpc/libexec/gpucr-criu-root`"),
    _s("GPUCR_IMAGE_ROOT", "path", None,
       "The checkpoint image store, instead of plugstack `imageroot=`; the plugin sets it in every task.",
       "python", set_by=("user", "plugin"), default_doc="plugstack `imageroot=`"),
    _s("GPUCR_RUN_DIR_ROOT", "path", None,
       "Where the nodes' job run dirs are, instead of plugstack `rundir=`.",
       "python", default_doc="plugstack `rundir=`"),
    _s("GPUCR_ARENA_DIR", "path", None,
       "Where the host arena is (hugetlbfs or shm); the plugin sets it to plugstack `arena=`.",
       "python shim", set_by=("user", "plugin", "gpucr-hpc"), default_doc="`/dev/shm`"),
    _s("GPUCR_ARENA_PREALLOC", "size", None,
       "A size (`80G`): create the arena at start (what `run --arena-size` sets); `auto`: grow it in the "
       "background as the GPU memory grows ([In a Slurm job](user.md#in-a-slurm-job)). Anything else is one line on "
       "stderr, and the arena is made at the first checkpoint, as without the variable. A job's own wins over "
       "plugstack `arena_prealloc=`.",
       "shim plugin", set_by=("user", "plugin", "gpucr-hpc"),
       default_doc="`auto` in jobs (plugstack `arena_prealloc=`) and under `gpucr-hpc run`"),
    _s("GPUCR_ARENA_PIN", "flag", None,
       "`1`: pin the whole arena once and let the GPU copy into it directly, without the staging ring; "
       "`0`: never.",
       "shim", default_doc="pinned only where the process may use fewer than 4 CPUs"),
    _s("GPUCR_ARENA_REPORT", "flag", "0",
       "The shim tells the one-time cost of making the arena ready on stderr (`run --arena-size` sets it).",
       "shim", set_by=("user", "gpucr-hpc")),
    _s("GPUCR_COPY_HELPER", "path", None,
       "The socket of a running `gpucr-hpc copy-helper`: the GPU data of checkpoints and restores moves "
       "through it ([The copy helper](user.md#the-copy-helper)). Unset: the shim moves it itself. "
       "`run --copy-helper` sets it, and so does the plugin where the site has `copy_helper=on`; "
       "`off` turns it off.",
       "shim plugin", set_by=("user", "plugin", "gpucr-hpc")),
    _s("GPUCR_COPY_HELPER_START", "command", None,
       "A `gpucr-hpc` command: when no helper serves at `GPUCR_COPY_HELPER`, the shim of a process that uses "
       "CUDA starts one with it ([In a Slurm job](user.md#in-a-slurm-job)).",
       "shim", set_by=("user", "plugin")),
    _s("GPUCR_COPY_HELPER_IDLE", "seconds", "600",
       "Seconds a copy helper started by `run --copy-helper` or by the shim waits without a connected "
       "process before it exits; `0`: it does not.",
       "python shim", minimum=0),
    _s("GPUCR_COPY_THREADS", "int", None,
       "Threads that copy between the pinned staging ring and the arena; at most 32 when set.",
       "shim", default_doc="one per CPU the process may use, minus one (left to the thread that issues the "
                           "GPU copies), 1 to 16 (15 on a 16-CPU machine)"),
    _s("GPUCR_COPY_SLOT_MIB", "int", "8",
       "Size of one staging slot, in MiB (1 to 256): the bytes of one GPU copy and of one thread's copy "
       "between the ring and the arena. The ring holds two slots per copy thread (240 MiB at 15 threads).",
       "shim"),
    _s("GPUCR_COPY_NT", "choice", "out",
       "Which copies use streaming (non-temporal) stores: `out`: the copy into the arena, on the way from "
       "the GPU; `in`: the copy into the ring, on the way to the GPU; `both` (or `1`); `0`: none. "
       "Ordinary stores leave the ring in the CPU cache for the GPU copy to read.",
       "shim", choices=("out", "in", "both", "1", "0")),
    _s("GPUCR_COPY_WAIT", "choice", "block",
       "How a copy thread waits for its GPU copy: `block` sleeps until it is done; `spin` polls.",
       "shim", choices=("block", "spin")),
    _s("GPUCR_NUMA", "flag", "1",
       "`0`: the host arena and the copy threads are not placed on the GPU's NUMA node. By default each new "
       "arena segment prefers the GPU's node (memory of another node when it is full) and the copy threads "
       "run on the node's CPUs that the process may use; nothing changes where the machine has one node or "
       "the GPU's node is unknown. The shim's status says the node (`numa_node`, -1: none).",
       "shim"),
    _s("GPUCR_YIELD_ON_TSTP", "flag", "1",
       "`0`: GPU memory is not yielded on SIGTSTP ([Suspend](user.md#suspend)).",
       "shim"),
    _s("GPUCR_IO_URING", "flag", "0",
       "`1`: the program may create io_uring instances, which CRIU cannot checkpoint; by default the "
       "shim answers that the kernel has none, and libraries such as libuv (PyTorch's TCP store) use epoll.",
       "shim"),
    _s("GPUCR_TSTP_GRACE_MS", "int", "2000",
       "After how many milliseconds yielding GPU memory on SIGTSTP is reported as late "
       "(Slurm 22.05's gap between SIGTSTP and SIGSTOP).",
       "shim"),
    _s("GPUCR_QUIESCE_TIMEOUT_MS", "int", "10000",
       "How many milliseconds a checkpoint asked without a timeout, or yielding GPU memory on SIGTSTP, "
       "waits for GPU work in flight.",
       "shim"),
    _s("GPUCR_VERBOSE", "flag", "0",
       "The shim also reports GPU memory yielded and restored on suspend.",
       "shim"),
    _s("GPUCR_DEBUG", "flag", "0",
       "The shim's diagnostics on stderr.",
       "shim"),
    _s("GPUCR_DISABLE", "flag", "0",
       "`1`: the shim, though loaded, does nothing (the shim sets it for the copy helper it starts).",
       "shim"),
    _s("GPUCR_CONTROL", "flag", "1",
       "`0`: the shim opens no control socket (nothing can checkpoint the process).",
       "shim"),
    _s("GPUCR_VMM_BACKING", "flag", "1",
       "`0`: plain `cuMemAlloc` allocations use the real call instead of being backed by the driver's "
       "virtual memory API (a debugging switch).",
       "shim"),
    _s("GPUCR_LOAD_DIRECT", "flag", "0",
       "`1`: `restore --from` reads the GPU data of the image with O_DIRECT (bypassing the page cache) where "
       "the file system allows it. Off by default: on the H100 machine's disk it read slower so "
       "(`bench/bench_image_io.py` compares both on yours).",
       "python"),
    _s("GPUCR_DRAIN_WAIT", "seconds", "900",
       "How long a restarting job, or a rank restored on another node than the one that staged it, waits "
       "for its newest checkpoint to be drained from node memory (the staging tier, plugstack.conf stage=) "
       "to the image root; past it the job is held with the reason.",
       "python"),
    _s("GPUCR_STAGE_DIR", "path", "/dev/shm",
       "Where a whole-process checkpoint stages CRIU's files before writing them to the image, when it has "
       "room; `off` writes them to the image directly.",
       "python"),
    # --- set for the job's processes by our own parts -----------------------------------------
    _s("GPUCR_ENABLED", "flag", None, "`1` in every task of a `--gpucr=on` job.", "job", set_by=_JOB),
    _s("GPUCR_JOB_ID", "text", None, "The Slurm job id.", "job", set_by=_JOB),
    _s("GPUCR_STEP_ID", "text", None, "The step: `batch`, `interactive` or the step number.", "job",
       set_by=_JOB),
    _s("GPUCR_RANK", "int", None, "The task's global rank (`SLURM_PROCID`).", "job", set_by=_JOB),
    _s("GPUCR_LOCAL_RANK", "int", None, "The task's rank on its node.", "job", set_by=_JOB),
    _s("GPUCR_NODE_ID", "int", None, "The node's index in the job.", "job", set_by=_JOB),
    _s("GPUCR_NODENAME", "text", None, "The node's name.", "job", set_by=_JOB),
    _s("GPUCR_RESTART_COUNT", "int", None, "How often Slurm restarted the job (`SLURM_RESTART_COUNT`).",
       "job", set_by=_JOB),
    _s("GPUCR_GPU_FEATURE", "text", None,
       "Plugstack `gpu_feature=`: the node features that name the GPU model (admin guide).",
       "job", set_by=_JOB),
    _s("GPUCR_VENDOR", "text", None, "Plugstack `vendor=`: the nodes' GPU vendor.", "job", set_by=_JOB),
    _s("GPUCR_SUBMISSION", "text", None,
       "`<cluster>:<uid>:<token>`: one submission across requeues; which image generations are the job's.",
       "python job", set_by=_JOB),
    _s("GPUCR_RESTORE_FROM", "path", None,
       "The image generation a job submitted by `gpucr-hpc restore` of a job Slurm forgot starts from "
       "(`sbatch --export`); the plugin makes its batch step a restore.",
       "python plugin", set_by=("gpucr-hpc",)),
    _s("GPUCR_RESTORE_CAP", "int", "3",
       "How many times in a row a job's start may restore the same generation (each run ending before a "
       "newer checkpoint) before the next start is held with the reason instead of looping; "
       "`gpucr-hpc restore` starts the count again.", "python", minimum=1),
    _s("GPUCR_RANK_NODES", "text", None,
       "The node each rank of a job's restore step is restored on, comma-separated, by rank: the layout the "
       "batch step's restore decided and launched the step to (`srun --distribution=arbitrary`).",
       "job", set_by=("gpucr-hpc",)),
    _s("GPUCR_BATCH_NODE", "text", None,
       "Where the batch script of a job being restored runs: its ranks move their connections to it there.",
       "job", set_by=("gpucr-hpc",)),
    _s("GPUCR_BATCH_SUPERVISE", "flag", "0",
       "`1`: `gpucr-hpc` is the batch step's task, the supervisor of the batch script.",
       "python", set_by=_JOB),
    _s("GPUCR_BATCH_SCRIPT", "path", None, "The batch script the supervisor runs or restores.",
       "python", set_by=_JOB),
    _s("GPUCR_BATCH_ARGV", "choice", None,
       "`prepended`: Slurm put the supervisor before the script's argv (23.02+) rather than replacing "
       "the script (22.05).",
       "python", set_by=_JOB, choices=("prepended",)),
    _s("GPUCR_RESTORE_BATCH", "flag", "0", "`1`: the supervisor restores the job instead of starting the script.",
       "python", set_by=_JOB),
    _s("GPUCR_CHECKPOINT_SIGNAL", "signal", None,
       "The job's warning signal (plugstack `signal=`): on it the supervisor checkpoints and requeues the job.",
       "python", set_by=_JOB),
    _s("GPUCR_CHECKPOINT_LEAD", "int", "0",
       "Seconds before the time limit the warning signal comes (plugstack `signal=`).",
       "python", set_by=_JOB, minimum=0),
    _s("GPUCR_CHECKPOINT_INTERVAL", "int", "0",
       "Seconds between periodic in-place checkpoints of the job, against node failures (0: none); the plugin "
       "sets it from `--gpucr-interval` or plugstack `interval=`.", "python", set_by=_JOB, minimum=0),
    _s("GPUCR_OUTSIDE", "choice", "refuse",
       "What a checkpoint does with a TCP connection of the job to a server outside it: `refuse` (a checkpoint "
       "of a process with one is refused) or `close` (it is restored closed, so the program sees it closed and "
       "reconnects); the plugin sets it from `--gpucr-outside` or plugstack `outside=`.",
       "python", set_by=_JOB, choices=("refuse", "close")),
    _s("GPUCR_SBATCH_SIGNAL_SET", "flag", None,
       "The plugin's mark that it set `SBATCH_SIGNAL` for the job itself (so that it takes it out again).",
       "plugin", set_by=_JOB),
    _s("GPUCR_SRUN_STATUS", "path", None,
       "Where the srun wrapper of a batch step writes the step's exit status (what a restore writes too).",
       "python", set_by=("srun-wrapper",)),
    # --- tests and scripts only ----------------------------------------------------------------
    _s("GPUCR_LOCK_LEASE", "seconds", "60",
       "How long the lock on a job's connections between ranks outlives an agent or a restoring rank "
       "that died holding it (it is renewed while its holder lives).", "python", set_by=("test",)),
    _s("GPUCR_RANKS_BACK_TIMEOUT", "seconds", "300",
       "How long a restored rank holds its connections to other ranks locked, waiting for every rank "
       "to be back; after it the job is held with the reason.", "python", set_by=("test",)),
    _s("GPUCR_FAULTS", "text", None,
       "Test faults to make, comma-separated: " + "; ".join(f"`{k}`: {v}" for k, v in FAULTS.items()) + ".",
       "python", set_by=("test",)),
    # The shim's C unit tests link a stub of the GPU commands (shim/tests/stub_commands.c, never
    # in the shim itself) that test_tstp.c drives with these.
    _s("GPUCR_STUB_LOG_FD", "int", None,
       "A descriptor the stub commands of the shim's C unit tests note `checkpoint`/`restore` on.",
       "test", set_by=("test",)),
    _s("GPUCR_STUB_CKPT_MS", "int", None,
       "The stub checkpoint of the shim's C unit tests takes this many milliseconds.",
       "test", set_by=("test",)),
    _s("GPUCR_STUB_REFUSE", "flag", None, "Set: the stub checkpoint of the shim's C unit tests refuses.",
       "test", set_by=("test",)),
    _s("GPUCR_STUB_HELD", "flag", None,
       "Set: the stub checkpoint of the shim's C unit tests answers that another checkpoint holds the process.",
       "test", set_by=("test",)),
    _s("GPUCR_CRIU_SUITE", "text", "sid",
       "The Debian suite `scripts/install-deps` takes CRIU (4.2 or newer) and its runtime from.", "scripts"),
    _s("GPUCR_TEST_WORKERS", "int", "2",
       "How many pytest workers `scripts/run-tests` runs the cluster tests in, each with a test cluster "
       "of its own.", "scripts", set_by=("scripts",)),
    _s("GPUCR_TESTCLUSTER_DIR", "path", "/tmp/gpucr-testcluster", "Where the test cluster lives.", "scripts",
       set_by=("test", "scripts")),
    _s("GPUCR_TESTCLUSTER_NODES", "int", "3", "How many slurmd the test cluster runs.", "scripts",
       set_by=("test", "scripts")),
    _s("GPUCR_TESTCLUSTER_PORT", "int", "16817", "The test cluster's first port.", "scripts",
       set_by=("test", "scripts")),
    _s("GPUCR_TESTCLUSTER_NET", "choice", "netns",
       "`loopback`: the test cluster's nodes share 127.0.0.1 instead of a network namespace and an address each "
       "(also what `up` falls back to where namespaces or the bridge cannot be made).", "scripts",
       set_by=("test", "scripts"), choices=("netns", "loopback")),
    _s("GPUCR_TESTCLUSTER_GPUS", "text", "all",
       "`all`: every test-cluster node has all the machine's GPUs; counts such as `2,1,1`: each node has that many "
       "of its own, dealt out in order (`split`: one each), so that NCCL sees separate hosts and a moved rank "
       "lands on another GPU.", "scripts", set_by=("test", "scripts")),
    _s("GPUCR_TESTCLUSTER_PROCTRACK", "choice", "linuxproc",
       "`cgroup`: the test cluster tracks jobs by cgroups (proctrack/cgroup, cgroup v1), as most sites do; "
       "Slurm then ends what is left in a job's cgroups (tests/test_job_cgroup.py).", "scripts",
       set_by=("test", "scripts"), choices=("linuxproc", "cgroup")),
    _s("GPUCR_SLURM_PREFIX", "path", None,
       "A Slurm unpacked under this dir (`scripts/fetch-slurm-debs`) instead of the system's, for the test "
       "cluster.", "scripts", set_by=("test", "scripts"), default_doc="the system's Slurm"),
    _s("GPUCR_CLI", "command", None, "The `gpucr-hpc` command the test cluster's jobs use (plugstack `cli=`).",
       "scripts", set_by=("test", "scripts"), default_doc="`.venv/bin/gpucr-hpc`"),
    _s("GPUCR_RESULTS_DIR", "path", None, "Where GPU tests write their JSON results.", "test",
       set_by=("scripts",), default_doc="the test's tmp dir"),
    _s("GPUCR_OPERATORS", "text", None,
       "`make install GPUCR_OPERATORS=%group`: a sudoers user list let through the operator door "
       "(`libexec/gpucr-operator`) to act on any job (admin guide, 'Slurm operators who are not root').",
       "scripts", set_by=("user",), default_doc="none: only root acts on other users' jobs"),
    _s("GPUCR_CGROUP_ROOT", "path", "/sys/fs/cgroup",
       "Where the shim reads the process's memory cgroups (the arena grows only where their limits leave "
       "room); the shim's C unit tests point it at a tree they make.", "shim test", set_by=("test",)),
    _s("GPUCR_PYTHON", "path", "/usr/bin/python3", "The Python `scripts/setup-venv` makes the venv with.",
       "scripts", set_by=("user",)),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
assert len(BY_NAME) == len(SETTINGS), "a GPUCR_ variable declared twice"
assert all(r in READERS for s in SETTINGS for r in s.read_by)
assert all(r in SETTERS for s in SETTINGS for r in s.set_by)
assert all(s.type in TYPES for s in SETTINGS)

_TRUE = ("1", "yes", "on", "true")
_FALSE = ("0", "no", "off", "false")


def setting(name: str) -> Setting:
    """The declaration of `name`; KeyError for a name nobody declared (a bug, not a user error)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in gpucr_hpc/config.py") from None


def raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value as set in env (default: this process's environment, now); None when unset or empty."""
    setting(name)
    v = (os.environ if env is None else env).get(name)
    return v if v else None


def parse(s: Setting, text: str):
    """text as s's type; a GpucrError naming the variable and what it accepts."""
    def bad():
        return GpucrError(f"bad {s.name}={text!r}", f"give {s.accepts()}")

    t = text.strip()
    if s.type == "flag":
        if t.lower() in _TRUE:
            return True
        if t.lower() in _FALSE:
            return False
        raise bad()
    if s.type == "choice":
        if t not in s.choices:
            raise bad()
        return t
    if s.type in ("int", "seconds"):
        try:
            v = int(t) if s.type == "int" else float(t)
        except ValueError:
            raise bad() from None
        if s.minimum is not None and v < s.minimum:
            raise bad()
        return v
    return text


def value(name: str, env: Mapping[str, str] | None = None, required: bool = False):
    """The setting's value, parsed (flag: bool; int: int; seconds: float; else str), read from env
    (default: this process's environment) now; the declared default when unset or empty; None
    where there is none. required: a GpucrError when there is none."""
    s = setting(name)
    text = raw(name, env)
    if text is None:
        text = s.default
    if text is None:
        if required:
            raise GpucrError(f"{name} is not set", f"set it to {s.accepts()}")
        return False if s.type == "flag" else None
    return parse(s, text)


_fired: set[str] = set()


INSTALL_PREFIX = "/opt/gpucr-hpc"  # the top-level Makefile's PREFIX


def installed(*parts: str) -> str:
    """A path of the installed parts: under $GPUCR_PREFIX, else the Makefile's default prefix."""
    return os.path.join(value("GPUCR_PREFIX") or INSTALL_PREFIX, *parts)


def fault(name: str) -> bool:
    """True once per process for a test fault that GPUCR_FAULTS names; False otherwise.
    Only the names in FAULTS exist (a ValueError for others: a typo in the code)."""
    if name not in FAULTS:
        raise ValueError(f"{name!r} is not a fault declared in gpucr_hpc/config.py FAULTS")
    named = (raw("GPUCR_FAULTS") or "").split(",")
    if name not in (n.strip() for n in named) or name in _fired:
        return False
    _fired.add(name)
    return True
