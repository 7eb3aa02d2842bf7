"""Slurm access through its command line, which works with every Slurm version.

(pyslurm would be the other backend, but it only builds against the Slurm
release of the same major.minor, and PyPI has none for the 22.05 that Debian 12
ships; the CLI is the backend that always works.)
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import time
from dataclasses import dataclass, field

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.slurm.job_ids import check_job_id

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class JobUnknown(GpucrError):
    """Slurm answered that it knows no job of this id (it ended long ago, or
    slurmctld lost its state). Only that answer: see SlurmUnreachable."""


class SlurmUnreachable(GpucrError):
    """Slurm gave no answer about a job: slurmctld down, restarting, too slow, or
    scontrol failing for any reason but an unknown job id. Nothing may be
    concluded about the job from it (above all, never that it is gone)."""


# Slurm's text for ESLURM_INVALID_JOB_ID (2017; slurm_errno.c, the same since
# Slurm 2.x). scontrol exits 1 for every failure and prints only
# slurm_strerror()'s text, and 22.05's scontrol has no --json: this text is the
# one sign that slurmctld answered "no such job". It is matched here alone.
INVALID_JOB_ID_TEXT = "Invalid job id specified"
UNREACHABLE_FIX = ("nothing was done; try again once slurmctld answers (`scontrol ping`), "
                   "or ask the admin whether it is down or restarting")


# States Slurm shows while a job moves on (job_state_string's flags): a requeue or a
# release asked then is refused ("Job is pending execution") or acts on the old state.
SETTLING_STATES = {"COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING",
                   "STAGE_OUT", "RESIZING"}
SETTLE_S = 120.0


@dataclass
class Job:
    id: str
    state: str
    uid: int
    user: str
    nodes: list[str]
    batch_host: str
    restart_count: int
    partition: str
    std_out: str
    std_err: str
    requeue: bool
    raw: dict = field(repr=False, default_factory=dict)

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def held(self) -> bool:
        """Pending and held (scontrol hold, or a requeue held by a failed restore):
        Slurm marks a held job by priority 0."""
        return self.state == "PENDING" and self.raw.get("Priority") == "0"

    @property
    def settling(self) -> bool:
        """On its way between states: its processes still end (COMPLETING, for up to
        KillWait and the epilog), or a requeue is still carried out."""
        return self.state in SETTLING_STATES


def run(*argv: str, timeout: float = 60, check: bool = True,
        fix: str = "check the job id and that slurmctld runs", stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=stdin)
    except FileNotFoundError:
        raise GpucrError(f"{argv[0]} not found", "install the Slurm client commands or fix PATH")
    except subprocess.TimeoutExpired:
        raise SlurmUnreachable(f"Slurm is unreachable: {' '.join(argv[:3])} got no answer in {timeout:g} s",
                               UNREACHABLE_FIX)
    if check and out.returncode != 0:
        msg = (out.stderr.strip() or out.stdout.strip()).splitlines()
        raise GpucrError(f"{' '.join(argv[:3])} failed: {msg[-1] if msg else out.returncode}", fix)
    return out


def parse_one_line(text: str) -> dict:
    """`scontrol show ... -o`: unquoted Key=Value pairs; values may hold spaces."""
    pairs = re.split(r" (?=[A-Za-z:/]+=)", text.strip())
    out = {}
    for p in pairs:
        k, _, v = p.partition("=")
        out[k] = v
    return out


def hostnames(nodelist: str) -> list[str]:
    if not nodelist or nodelist == "(null)":
        return []
    return run("scontrol", "show", "hostnames", nodelist).stdout.split()


def node_address(node: str) -> str | None:
    """The address Slurm reaches `node` by (its NodeAddr, which may be a name
    itself), or None where slurmctld does not answer or knows no such node."""
    try:
        out = run("scontrol", "show", "node", "-o", node, timeout=15, check=False)
    except GpucrError:
        return None
    lines = out.stdout.splitlines()
    addr = parse_one_line(lines[0]).get("NodeAddr", "") if out.returncode == 0 and lines else ""
    return addr or None


LOST_STATES = ("DOWN", "FAIL", "FAILING", "FUTURE")


def node_lost(node: str) -> str | None:
    """Why Slurm has given up on `node` (its state: down or failed), or None: it is
    up, or Slurm says nothing of it (no answer, no such node: nothing is known)."""
    try:
        out = run("scontrol", "show", "node", "-o", node, timeout=15, check=False)
    except GpucrError:
        return None
    lines = out.stdout.splitlines()
    if out.returncode != 0 or not lines:
        return None
    state = parse_one_line(lines[0]).get("State", "")
    flags = set(state.rstrip("*").replace("+", " ").split())
    return f"{state} in Slurm" if flags & set(LOST_STATES) else None


def settled(job: Job, wait_s: float = SETTLE_S) -> Job:
    """`job` once it has stopped moving between states (see SETTLING_STATES): asked
    again while it moves."""
    deadline = time.monotonic() + wait_s
    while job.settling:
        if time.monotonic() > deadline:
            raise GpucrError(f"job {job.id} is still {job.state} after {wait_s:.0f} s",
                             f"try again once `squeue -j {job.id}` shows it pending or gone "
                             "(a slow epilog or an unkillable process keeps it there)")
        time.sleep(0.5)
        job = show_job(job.id)
    return job


# How long scontrol may take to answer about a job before Slurm counts as unreachable.
SHOW_TIMEOUT_S = 60.0


def _said_invalid_job_id(out: subprocess.CompletedProcess) -> bool:
    """Whether scontrol's failure is slurmctld's own answer ESLURM_INVALID_JOB_ID."""
    last = (out.stderr.strip().splitlines() or [""])[-1]
    return last.endswith(f"error: {INVALID_JOB_ID_TEXT}")


def _show_lines(jobid: str, spec: str | None = None) -> list[dict]:
    """`scontrol show job -o jobid`, one dict per record (a het job or an array
    gives several). JobUnknown only where slurmctld answered that the id is
    invalid; SlurmUnreachable for every other failure."""
    out = run("scontrol", "show", "job", "-o", str(jobid), check=False, timeout=SHOW_TIMEOUT_S)
    if out.returncode != 0 and _said_invalid_job_id(out):
        raise JobUnknown(f"no job {spec or jobid} known to Slurm",
                         "check the id with squeue; finished jobs are forgotten after MinJobAge")
    lines = [line for line in out.stdout.splitlines() if line.startswith("JobId=")]
    if out.returncode != 0 or not lines:
        why = (out.stderr.strip() or out.stdout.strip() or f"scontrol exit {out.returncode}").splitlines()[-1]
        raise SlurmUnreachable(f"Slurm is unreachable, nothing is known of job {spec or jobid}: {why}",
                               UNREACHABLE_FIX)
    return [parse_one_line(line) for line in lines]


def show_job(jobid: str) -> Job:
    if not re.fullmatch(r"\d+", str(jobid)):
        raise GpucrError(f"'{jobid}' is not a job id", "give the numeric Slurm job id")
    records = _show_lines(str(jobid))
    d = next((r for r in records if r.get("JobId") == str(jobid)), records[0])
    user, _, uid = d.get("UserId", "?(-1)").partition("(")
    return Job(
        id=str(jobid), state=d.get("JobState", "UNKNOWN"), uid=int(uid.rstrip(")") or -1),
        user=user, nodes=hostnames(d.get("NodeList", "")), batch_host=d.get("BatchHost", ""),
        restart_count=int(d.get("Restarts", "0") or 0), partition=d.get("Partition", ""),
        std_out=d.get("StdOut", ""), std_err=d.get("StdErr", ""),
        requeue=d.get("Requeue", "1") == "1", raw=d)


ARRAY_TASK = re.compile(r"([0-9]+)_([0-9]+)", re.ASCII)
HET_COMPONENT = re.compile(r"([0-9]+)\+([0-9]+)", re.ASCII)
ID_FORMS = "a job id (1234), an array task (1234_5) or a heterogeneous job's component (1234+0)"


def _in_task_list(task: int, tasks: str) -> bool:
    """Whether ArrayTaskId's list of pending tasks ("2-5,7", "4-9:2%2") holds `task`."""
    for part in tasks.split("%")[0].split(","):
        first, _, rest = part.partition("-")
        last, _, step = rest.partition(":")
        try:
            lo, hi, by = int(first), int(last or first), int(step or 1)
        except ValueError:
            continue
        if lo <= task <= hi and (task - lo) % by == 0:
            return True
    return False


def resolve_job_id(spec: str) -> str:
    """The job id of `spec` as Slurm takes it: a job id as it is (Slurm is not
    asked), an array task (1234_5) or het component (1234+0) as the job id Slurm
    gave it, which names its checkpoints. One line for any other form, for a
    task that has not started (it has no id of its own yet), and for one Slurm
    does not know."""
    spec = str(spec)
    array, het = ARRAY_TASK.fullmatch(spec), HET_COMPONENT.fullmatch(spec)
    if not (array or het):
        if spec.isascii() and spec.isdigit():
            return check_job_id(spec)
        raise GpucrError(f"'{spec}' is not a job id", f"give {ID_FORMS}")
    base, index = (array or het).groups()  # type: ignore[union-attr]
    records = _show_lines(base, spec)
    if array:
        for r in records:
            if r.get("ArrayJobId") == base and r.get("ArrayTaskId") == index:
                return check_job_id(r["JobId"])
        if any(r.get("ArrayJobId") == base and _in_task_list(int(index), r.get("ArrayTaskId", ""))
               for r in records):
            raise GpucrError(f"array task {spec} has not started, so it has no job id of its own yet",
                             "act on it once it runs (squeue -r shows its id then)")
        if not any(r.get("ArrayJobId") == base for r in records):
            raise GpucrError(f"job {base} is not an array job, so it has no task {spec}", f"give {ID_FORMS}")
        raise JobUnknown(f"no array task {spec} known to Slurm",
                         f"check the task with squeue -r -j {base}; ended tasks are forgotten after MinJobAge")
    for r in records:
        if r.get("HetJobId") == base and r.get("HetJobOffset") == str(int(index)):
            return check_job_id(r["JobId"])
    if not any(r.get("HetJobId") == base for r in records):
        raise GpucrError(f"job {base} is not a heterogeneous job, so it has no component {spec}",
                         f"give {ID_FORMS}")
    raise JobUnknown(f"no component {spec} known to Slurm", f"check the components with squeue -j {base}")


def check_access(job: Job, fix: str = "only the job's owner, root, or a Slurm operator the site lets through "
                                      "gpucr-operator can checkpoint, restore or signal it (Slurm lets no one "
                                      "else start its node agents in it): ask its owner or an admin") -> None:
    """Only root and the job's owner may act on a job, or see its checkpoints."""
    me = os.geteuid()
    if me not in (0, job.uid):
        raise GpucrError(f"job {job.id} belongs to {job.user} (uid {job.uid}), you are uid {me}", fix)


def requeue(jobid: str) -> None:
    run("scontrol", "requeue", str(jobid))


def requeue_hold(jobid: str, reason: str, patience_s: float = 30.0) -> None:
    """Requeue the job held, the reason in its Comment (short: the caller keeps it so,
    never cut here). The reason goes first, so that it is there even if the requeue
    fails; a job in a passing state (a step still launching or completing) is tried
    again for `patience_s`."""
    run("scontrol", "update", f"JobId={jobid}", f"Comment={reason}", check=False)
    deadline = time.monotonic() + patience_s
    while True:
        try:
            run("scontrol", "requeuehold", str(jobid))
            return
        except GpucrError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def release(jobid: str) -> None:
    run("scontrol", "release", str(jobid))


# sacctmgr's AdminLevel values that Slurm lets suspend and resume jobs.
OPERATOR_LEVELS = {"operator", "administrator"}


def _config() -> dict:
    """`scontrol show config` as {key: value}."""
    out = run("scontrol", "show", "config", check=False)
    pairs = (line.partition("=") for line in out.stdout.splitlines() if " = " in line)
    return {k.strip(): v.strip() for k, _, v in pairs}


def _uid_in(user_field: str) -> int | None:
    """SlurmUser is written `name(uid)`."""
    m = re.search(r"\((\d+)\)", user_field)
    return int(m.group(1)) if m else None


def known_not_operator(uid: int) -> bool:
    """True only when Slurm surely refuses this user a suspend or resume: not root, not
    SlurmUser, and no AdminLevel of Operator or Administrator (only accounting holds
    those). When that cannot be told (slurmdbd down), False: scontrol decides."""
    conf = _config() if uid != 0 else {}
    if not conf or _uid_in(conf.get("SlurmUser", "")) == uid:
        return False  # root, SlurmUser, or no answer from slurmctld
    if "slurmdbd" not in conf.get("AccountingStorageType", ""):
        return True
    try:
        name = pwd.getpwuid(uid).pw_name
        out = run("sacctmgr", "-nP", "show", "user", name, "format=adminlevel", check=False)
    except (KeyError, GpucrError):
        return False
    level = out.stdout.strip().lower()
    return out.returncode == 0 and bool(level) and level not in OPERATOR_LEVELS


def require_operator(verb: str, jobid: str) -> None:
    """Slurm lets only operators and administrators suspend and resume jobs."""
    uid = os.geteuid()
    if known_not_operator(uid):
        alt = (f"or preempt it yourself (gpucr-hpc preempt {jobid}: checkpointed, requeued, restored)"
               if verb == "suspend" else "")
        raise GpucrError(f"only Slurm operators and administrators may {verb} a job, and uid {uid} is neither",
                         f"ask one to run `gpucr-hpc {verb} {jobid}` {alt}".strip())


OPERATOR_FIX = ("only Slurm operators and administrators may suspend or resume a job: "
                "ask one to run `gpucr-hpc {verb} {jobid}`")


def suspend(jobid: str) -> None:
    run("scontrol", "suspend", str(jobid), fix=OPERATOR_FIX.format(verb="suspend", jobid=jobid))


def resume(jobid: str) -> None:
    run("scontrol", "resume", str(jobid), fix=OPERATOR_FIX.format(verb="resume", jobid=jobid))
