"""A job's checkpoints in the image store: generations, commit, LATEST.

    <image root>/<jobid>/
        gen-<N>/
            batch/             the batch script's process tree (a process image)
            rank-<step>.<r>/   one task of an srun step (a process image)
            output/            the job's stdout/stderr as they were at checkpoint
            manifest.json      the job manifest (kind "job"): units, nodes, sizes
            COMMITTED          written last, by rank 0, once every node voted yes
                               (with staging: by the drain that finished last)
            STAGED             instead, while units of it are in node memory
                               (the staging tier) and not yet drained: it has
                               the manifest's checksum, as COMMITTED will
            drained/<node>     a node's units are on the image root
            draining/<node>    touched every few seconds while the node drains:
                               a drain that stopped is told from a slow one
            DRAIN_FAILED       why a drain failed: the generation is never
                               restored, the previous committed one is
        LATEST                 "gen-<N>" and its submission, one per line: the
                               newest committed generation
        RESTORE                the same: the generation the next start restores
                               (written by `restore --from`; LATEST when absent)
        SUBMISSION             the submission that last started under this job id

A generation is complete only with COMMITTED. A preemption on a site with a
staging tier (plugstack.conf stage=) writes its units into node memory, marks
the generation STAGED and points LATEST at it, so the job can end at once; the
drain (job/storage/drain.py, started by the job epilog on each such node) copies them
to the image root and writes COMMITTED. A start that finds LATEST staged waits
for that (await_drain). A node Slurm reports down whose drain has stopped
has lost its units with its memory: the wait ends with the generation's drain
failed, and the previous committed generation is restored.

A generation belongs to one *submission* of the job: its manifest's
"submission" is the job's GPUCR_SUBMISSION, `<cluster>:<uid>:<token>`, where
the token is made by the plugin when sbatch/salloc/srun created the job and
kept by Slurm across requeues (spank/submission.h). Slurm hands a job id out
again once slurmctld has lost its state; the new job's generations then go
into the same directory, numbered on, and the old submission's stay there,
never restored for the new job (start_target, restore_target) and never
pruned by it (prune): `gpucr-hpc ls` shows them as another submission's.
Within a submission, the previous committed generation is kept until a newer
one commits; older ones are pruned then.

A resubmitted job (a job Slurm forgot, brought back by `gpucr-hpc restore`)
has a new id and a new submission; GPUCR_RESTORE_FROM in its environment names
the old generation, restored at its start until it has one of its own, and
only for the same user on the same cluster (resubmission_source).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import dirs as job_dirs
from gpucr_hpc.store import manifest as mf

LATEST = "LATEST"
STAGED = "STAGED"
DRAINED = "drained"
DRAINING = "draining"
HEARTBEAT_S = 5.0     # how often a running drain touches draining/<node>
DRAIN_STOPPED_S = 30  # no touch for this long: the drain is not running
LOST_POLL_S = 5.0     # how often a waiting start asks Slurm about the draining nodes
DRAIN_FAILED = "DRAIN_FAILED"
RESTORE = "RESTORE"
SUBMISSION = "SUBMISSION"
KEEP_COMMITTED = 2


def gen_name(n: int) -> str:
    return f"gen-{n}"


def number(name: str) -> int:
    """N of "gen-N" (-1 for any other name), to order generations as they were made."""
    m = re.fullmatch(r"gen-(\d+)", name)
    return int(m.group(1)) if m else -1


def generations(job_dir: Path) -> list[tuple[int, Path, bool]]:
    """(N, path, committed) of every generation, oldest first."""
    out = []
    try:
        entries = list(Path(job_dir).iterdir())
    except OSError:
        return []
    for p in entries:
        n = number(p.name)
        if n >= 0 and p.is_dir():
            out.append((n, p, (p / mf.COMMITTED).exists()))
    return sorted(out)


def new_generation(job_dir: Path, owner_uid: int) -> Path:
    """Create gen-<N+1>; N counts every generation ever started, committed or not."""
    job_dir = job_dirs.ensure(Path(job_dir), owner_uid)  # the job user's alone, or refused
    gens = generations(job_dir)
    n = gens[-1][0] + 1 if gens else 1
    path = job_dir / gen_name(n)
    try:
        with job_dirs.as_owner(owner_uid):  # root's coordinator makes it as the job's user
            path.mkdir(mode=0o700)
    except FileExistsError as e:  # the job's lock keeps gpucr-hpc commands apart; anything else
        raise GpucrError(f"{path} appeared while this checkpoint began",
                         "something outside gpucr-hpc writes into the job's directory; "
                         "the job was left running") from e
    return path


def _pointer_lines(job_dir: Path, name: str) -> list[str]:
    try:
        return (Path(job_dir) / name).read_text().split()
    except OSError:
        return []


def read_pointer(job_dir: Path, name: str) -> Path | None:
    lines = _pointer_lines(job_dir, name)
    if not lines or number(lines[0]) < 0:
        return None
    return Path(job_dir) / lines[0]


def pointer_submission(job_dir: Path, name: str) -> str | None:
    """The submission the pointer's generation belongs to (None: not recorded)."""
    lines = _pointer_lines(job_dir, name)
    return lines[1] if len(lines) > 1 else None


def write_pointer(job_dir: Path, name: str, gen_dir: Path, submission: str | None) -> None:
    """The restart decision in spank/restart.c reads these two lines."""
    text = f"{Path(gen_dir).name}\n" + (f"{submission}\n" if submission else "")
    mf.write_atomic(Path(job_dir) / name, text.encode(), mode=0o644)


def generation_submission(gen_dir: Path) -> str | None:
    """The submission recorded in a generation's manifest (None: none or unreadable)."""
    try:
        return json.loads((Path(gen_dir) / mf.MANIFEST).read_text()).get("submission")
    except (OSError, ValueError, AttributeError):
        return None


def current_submission(job_dir: Path) -> str | None:
    """The submission that last started (or committed) under this job id."""
    lines = _pointer_lines(job_dir, SUBMISSION)
    return lines[0] if lines else pointer_submission(job_dir, LATEST)


def claim(job_dir: Path, submission: str | None) -> None:
    """Record, at a job's start, that this id now belongs to `submission`: the
    generations of any other are then another submission's. Only where the
    job id already has a directory (no directory is made for a job that
    never checkpoints); not being able to write it changes nothing else."""
    job_dir = Path(job_dir)
    if not submission or not job_dir.is_dir() or current_submission(job_dir) == submission:
        return
    try:
        mf.write_atomic(job_dir / SUBMISSION, f"{submission}\n".encode(), mode=0o644)
    except OSError:
        pass


def commit_generation(gen_dir: Path, manifest: dict) -> None:
    """manifest + COMMITTED (atomic), then LATEST, then prune the submission's old generations."""
    _publish(gen_dir, manifest, mf.COMMITTED)
    prune(gen_dir.parent, manifest.get("submission"))


def stage_generation(gen_dir: Path, manifest: dict) -> None:
    """manifest + STAGED (its checksum, as COMMITTED has), then LATEST: the job's
    next start restores this generation once its drain has made it durable."""
    _publish(gen_dir, manifest, STAGED)


def _publish(gen_dir: Path, manifest: dict, marker_name: str) -> None:
    """The manifest, the marker that vouches for it (its checksum), LATEST and the
    submission; all the job user's (root publishing a user's job writes as that user)."""
    data = mf.encode(manifest)
    job_dir = gen_dir.parent
    submission = manifest.get("submission")
    with job_dirs.as_owner(manifest.get("owner_uid") or 0):
        mf.write_atomic(gen_dir / mf.MANIFEST, data)
        mf.write_atomic(gen_dir / marker_name, mf.marker(data))
        write_pointer(job_dir, LATEST, gen_dir, submission)
        claim(job_dir, submission)


def mend_latest(job_dir: Path, gen_dir: Path, submission: str | None) -> None:
    """After `gen_dir` was restored as asked (RESTORE): LATEST names it where LATEST named
    no checkpoint of the submission to restore (gone, garbled, missing), so that the next
    start restores it rather than holding the job again. One that names one stays."""
    latest = read_pointer(job_dir, LATEST)
    if not submission or (latest is not None and pointer_submission(job_dir, LATEST) == submission
                          and ((latest / mf.COMMITTED).exists() or is_staged(latest))):
        return
    try:
        write_pointer(job_dir, LATEST, gen_dir, submission)
    except OSError:
        pass  # the next start holds the job again, saying why


def manifest_of(gen_dir: Path) -> dict:
    """The manifest of a committed generation, or of a staged one before its drain."""
    gen_dir = Path(gen_dir)
    return mf.load(gen_dir, STAGED if is_staged(gen_dir) else mf.COMMITTED)


def is_staged(gen_dir: Path) -> bool:
    """Staged, not yet drained (nor failed)."""
    gen_dir = Path(gen_dir)
    return ((gen_dir / STAGED).exists() and not (gen_dir / mf.COMMITTED).exists()
            and not (gen_dir / DRAIN_FAILED).exists())


def staged_nodes(manifest: dict) -> set[str]:
    """The nodes whose memory holds units of the generation."""
    return {u["node"] for u in manifest["units"].values() if u.get("staged")}


def finish_drain(gen_dir: Path, node: str) -> bool:
    """Record that `node`'s units are drained; the last node's drain commits the
    generation (COMMITTED: STAGED's checksum) and prunes. True once committed."""
    gen_dir = Path(gen_dir)
    (gen_dir / DRAINED).mkdir(mode=0o700, exist_ok=True)
    mf.write_atomic(gen_dir / DRAINED / node, b"")
    m = json.loads((gen_dir / mf.MANIFEST).read_text())
    if (gen_dir / DRAIN_FAILED).exists():
        return False  # given up on (another node was lost): never committed now
    if not staged_nodes(m) <= drained_nodes(gen_dir):
        return False
    # Each node's drain synced its units, files and folders (store/drain.py), on the
    # shared image root: what is left to make durable is COMMITTED's own entry.
    try:  # two drains ending together both get here: the first link wins
        os.link(gen_dir / STAGED, gen_dir / mf.COMMITTED)
    except FileExistsError:
        return True
    mf.fsync_dir(gen_dir)
    prune(gen_dir.parent, m.get("submission"))
    return True


def drained_nodes(gen_dir: Path) -> set[str]:
    try:
        return {p.name for p in (Path(gen_dir) / DRAINED).iterdir()}
    except OSError:
        return set()


def heartbeat(gen_dir: Path, node: str) -> None:
    """Said by a running drain (the job's user), every HEARTBEAT_S: this node is still
    at it. Never through a link: the mark is touched on a descriptor of a file made
    or opened without following one."""
    folder = Path(gen_dir) / DRAINING
    folder.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(folder / node, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def drain_stopped(gen_dir: Path, node: str, now: float | None = None) -> bool:
    """No drain of `node` has said it runs for DRAIN_STOPPED_S (or ever)."""
    try:
        seen = (Path(gen_dir) / DRAINING / node).stat().st_mtime
    except OSError:
        return True
    return (now or time.time()) - seen > DRAIN_STOPPED_S


def fail_drain(gen_dir: Path, node: str, why: str) -> Path | None:
    """A drain that failed: DRAIN_FAILED says why, and LATEST goes back to the
    previous committed generation of the submission (returned; None: there is none)."""
    gen_dir = Path(gen_dir)
    job_dir = gen_dir.parent
    mf.write_atomic(gen_dir / DRAIN_FAILED, f"{node}: {why}\n".encode())
    submission = generation_submission(gen_dir)
    earlier = [p for p in committed_of(job_dir, submission) if p != gen_dir]
    if read_pointer(job_dir, LATEST) == gen_dir:
        if earlier:
            write_pointer(job_dir, LATEST, earlier[-1], submission)
        else:
            (job_dir / LATEST).unlink(missing_ok=True)
    return earlier[-1] if earlier else None


# Why Slurm has given up on a node (its state: "DOWN in Slurm"), or None.
NodeLost = Callable[[str], "str | None"]


def await_drain(job_dir: Path, submission: str | None, timeout_s: float, poll_s: float = 0.5,
                lost: NodeLost | None = None) -> str | None:
    """When LATEST names a staged generation of `submission`: wait until its drain
    commits it, or fails (LATEST then names the previous committed one). What
    happened, for restore.log; None where nothing was staged."""
    path = read_pointer(job_dir, LATEST)
    if path is None or pointer_submission(job_dir, LATEST) != submission or not (path / STAGED).exists():
        return None
    if await_settled(path, timeout_s, poll_s, lost):
        return f"{path.name} is drained to the image root"
    return f"{path.name} was not drained ({drain_failure(path)}): the previous checkpoint is restored"


def await_settled(gen_dir: Path, timeout_s: float, poll_s: float = 0.5, lost: NodeLost | None = None) -> bool:
    """Wait while a staged generation drains: True once committed, False if its drain
    failed, or a node still to drain is lost (lost(): Slurm gave up on it) and its
    drain stopped; a GpucrError when the wait runs out."""
    gen_dir = Path(gen_dir)
    deadline = time.monotonic() + timeout_s
    asked = 0.0
    while is_staged(gen_dir):
        if lost is not None and time.monotonic() - asked >= LOST_POLL_S:
            asked = time.monotonic()
            if give_up_on_lost_nodes(gen_dir, lost):
                break
        if time.monotonic() > deadline:
            job = gen_dir.parent.name
            raise GpucrError(f"{gen_dir.name} is still being drained from node memory to the image root after "
                             f"{timeout_s:.0f} s", f"once `gpucr-hpc status {job}` shows it committed or its "
                             f"drain failed, gpucr-hpc restore {job}")
        time.sleep(poll_s)
    return (gen_dir / mf.COMMITTED).exists()


def give_up_on_lost_nodes(gen_dir: Path, lost: NodeLost) -> bool:
    """A node still to drain that Slurm reports lost, with no drain running for it:
    its memory, and the units in it, are gone. The generation's drain fails (as a
    failed drain does: the previous committed generation is the restore point)."""
    m = json.loads((Path(gen_dir) / mf.MANIFEST).read_text())
    for node in sorted(staged_nodes(m) - drained_nodes(gen_dir)):
        why = lost(node)
        if why and drain_stopped(gen_dir, node):
            fail_drain(gen_dir, node, f"node {node} is {why} and no drain runs for it: its staged units are lost")
            return True
    return False


def staged_start(job_dir: Path, submission: str | None) -> Path | None:
    """The generation a start restores while it is still staged (LATEST, not pinned
    away by RESTORE): it can be read from node memory before its drain ends."""
    path = read_pointer(job_dir, LATEST)
    if (not submission or path is None or pointer_submission(job_dir, LATEST) != submission
            or (read_pointer(job_dir, RESTORE) and pointer_submission(job_dir, RESTORE) == submission)
            or not is_staged(path)):
        return None
    return path


def drain_failure(gen_dir: Path) -> str | None:
    try:
        return (Path(gen_dir) / DRAIN_FAILED).read_text().strip() or "unknown"
    except OSError:
        return None


def prune(job_dir: Path, submission: str | None, keep: int = KEEP_COMMITTED) -> None:
    """Keep the newest `keep` committed generations of `submission` (and any newer
    uncommitted one in flight); another submission's are never touched."""
    committed = [g for g in generations(job_dir) if g[2] and generation_submission(g[1]) == submission]
    pinned = read_pointer(job_dir, RESTORE)
    for _, path, _ in committed[:-keep]:
        if path != pinned:
            shutil.rmtree(path, ignore_errors=True)


def discard(gen_dir: Path) -> None:
    """Remove an uncommitted generation (an aborted checkpoint); never a committed one."""
    if (Path(gen_dir) / mf.COMMITTED).exists():
        raise GpucrError(f"{gen_dir} is committed", "committed generations are never discarded")
    shutil.rmtree(gen_dir, ignore_errors=True)


def committed_of(job_dir: Path, submission: str | None) -> list[Path]:
    """The committed generations of one submission, oldest first."""
    return [p for _, p, c in generations(job_dir) if c and generation_submission(p) == submission]


def restore_target(job_dir: Path, gen: int | None = None, submission: str | None = None) -> Path:
    """The committed generation of `submission` to restore: `gen`, else RESTORE,
    else LATEST. `submission` None: the one that last started under this id."""
    job_dir = Path(job_dir)
    if submission is None:
        submission = current_submission(job_dir)
    path: Path | None
    if gen is not None:
        path = job_dir / gen_name(gen)
    else:
        path = next((read_pointer(job_dir, name) for name in (RESTORE, LATEST)
                     if pointer_submission(job_dir, name) == submission and read_pointer(job_dir, name)),
                    None)
    mine = ", ".join(p.name for p in committed_of(job_dir, submission)) or "none"
    if path is None:
        raise GpucrError(f"no committed checkpoint of this submission of job {job_dir.name} under {job_dir}",
                         "checkpoint the job first (gpucr-hpc checkpoint JOBID)")
    if not (path / mf.COMMITTED).exists():
        raise GpucrError(f"{path} is not a committed checkpoint", f"pick one of: {mine}")
    if generation_submission(path) != submission:
        raise GpucrError(f"{path.name} belongs to another submission of job id {job_dir.name} "
                         "(Slurm gave the id out again), not to this job",
                         f"pick one of this job's: {mine}; or bring the earlier job back as a new one: "
                         f"gpucr-hpc restore {job_dir.name} --from {path.name[4:]} --resubmit")
    return path


def start_target(job_dir: Path, submission: str | None, restore_from: str | None) -> Path:
    """What a starting job restores, the same choice as spank/restart.c makes:
    its own submission's RESTORE or LATEST, else a resubmission's source. A job
    whose own checkpoint is gone is never restored from an older source instead:
    LostCheckpoint says what is gone (the job is held)."""
    job_dir = Path(job_dir)
    for name in (RESTORE, LATEST):
        path = read_pointer(job_dir, name)
        if (submission and path and pointer_submission(job_dir, name) == submission
                and (path / mf.COMMITTED).exists()):
            return restore_target(job_dir, int(path.name[4:]), submission)
    gone = lost(job_dir, submission)
    if gone is not None:
        raise gone
    if restore_from:
        return resubmission_source(Path(restore_from), submission)
    raise GpucrError(f"no committed checkpoint of this submission of job {job_dir.name} under {job_dir}",
                     "the job starts from the top when it runs again")


class LostCheckpoint(GpucrError):
    """A job checkpointed before whose checkpoint a start cannot find: `summary` is the
    short form and `then` the command that goes on (a held job's Comment)."""

    def __init__(self, cause: str, fix: str, summary: str, then: str):
        super().__init__(cause, fix)
        self.summary = summary
        self.then = then


COMMITS = ("checkpoint", "preempt", "drain")  # events.jsonl records of a generation made


def lost(job_dir: Path, submission: str | None) -> LostCheckpoint | None:
    """Why `submission`, checkpointed before, has no checkpoint a start can restore;
    None: it has one, or was never checkpointed (no trace of it: it starts from the top).
    Traces: RESTORE or LATEST of the submission naming a generation that is gone or not
    committed; one garbled or unreadable, of the submission or written since it claimed
    the job id; a generation of its own that neither names (committed, or staged and its
    drain failed); a checkpoint events.jsonl records since the claim. Read before the
    start claims the id (claim)."""
    job_dir = Path(job_dir)
    if not submission:
        return None  # a job from before submissions: spank/restart.c never restores it
    since = _claimed_at(job_dir, submission)
    pointers: list[tuple[str, Path, list[str] | OSError]] = []
    for name in (LATEST, RESTORE):
        path = job_dir / name
        try:
            words: list[str] | OSError = path.read_text(errors="replace").split()
        except FileNotFoundError:
            continue
        except OSError as e:
            words = e
        if isinstance(words, list) and words[1:2] == [submission] and number(words[0]) >= 0 and (
                (job_dir / words[0] / mf.COMMITTED).exists() or is_staged(job_dir / words[0])):
            return None  # a checkpoint to restore
        pointers.append((name, path, words))
    for name, path, words in pointers:
        dated = since is not None and _mtime(path) >= since  # written since the submission claimed the id
        if isinstance(words, OSError):
            if dated:
                return _lost(job_dir, submission, f"cannot read {path}: {words.strerror}", f"{name} is unreadable")
            continue
        if not words or number(words[0]) < 0:
            theirs = len(words) > 1 and words[1] != submission and words[1].count(":") >= 2
            if not theirs and (words[1:2] == [submission] or dated):
                return _lost(job_dir, submission, f"{path} names no generation ({' '.join(words)[:40]!r})",
                             f"{name} is garbled")
            continue
        if words[1:2] != [submission]:
            continue  # another submission's (the job id was given out again), or from before submissions
        gen = job_dir / words[0]
        if not gen.is_dir():
            return _lost(job_dir, submission, f"{gen.name}, the checkpoint {name} names, is gone from {job_dir}",
                         f"{gen.name} ({name}) is gone")
        return _lost(job_dir, submission, f"{gen.name}, the checkpoint {name} names, {_state(gen)}",
                     f"{gen.name} ({name}) is not committed")
    committed = committed_of(job_dir, submission)
    if committed:
        return _lost(job_dir, submission, f"{job_dir} has no LATEST naming its checkpoints "
                     f"({', '.join(p.name for p in committed)})", "LATEST is missing")
    # Published, and lost before it committed (its drain failed): not one whose checkpoint
    # died between its manifest and its marker, which never was a checkpoint.
    mine = [p for _, p, _ in generations(job_dir) if ((p / STAGED).exists() or (p / DRAIN_FAILED).exists())
            and generation_submission(p) == submission]
    if mine:
        return _lost(job_dir, submission, f"no committed checkpoint of job {job_dir.name} is left under "
                     f"{job_dir}: {mine[-1].name} {_state(mine[-1])}", f"{mine[-1].name} is not committed")
    if since is not None:
        from gpucr_hpc.job import events  # here: events is needed only for this trace
        made = [ev for ev in events.read(job_dir) if ev.get("ok") and ev.get("what") in COMMITS
                and ev.get("generation") and _number_or(ev.get("at")) >= since]
        if made:
            ev = made[-1]
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_number_or(ev["at"])))
            return _lost(job_dir, submission, f"{events.EVENTS} records {ev['generation']} made by {ev['what']} "
                         f"at {when}, but no checkpoint of job {job_dir.name} is left under {job_dir} "
                         "(neither LATEST nor a generation)", f"{ev['generation']} is gone")
    return None


def _number_or(x, default: float = 0.0) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return default


def _lost(job_dir: Path, submission: str, cause: str, summary: str) -> LostCheckpoint:
    """The error, with the command that goes on: a restore of the newest committed
    generation left, else a new submission (nothing else is restored on its own)."""
    jobid = job_dir.name
    left = [p.name[4:] for p in committed_of(job_dir, submission)]
    if left:
        then = f"gpucr-hpc restore {jobid} --from {left[-1]}"
        return LostCheckpoint(cause, f"restore an earlier checkpoint: {then} (committed: {', '.join(left)}; "
                              f"gpucr-hpc ls {jobid} lists them)", summary, then)
    then = f"scancel {jobid}, submit it again"
    return LostCheckpoint(f"{cause}; no other checkpoint of it is left",
                          f"to run it from the top: scancel {jobid} and submit the job again", summary, then)


def _state(gen: Path) -> str:
    why = drain_failure(gen)
    if why is not None:
        return f"was never drained to the image root ({why})"
    if not (gen / mf.MANIFEST).exists():
        return "has no manifest.json (its checkpoint never finished)"
    return "is not committed (its COMMITTED is missing)"


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def _claimed_at(job_dir: Path, submission: str) -> float | None:
    """When `submission` claimed the job id (SUBMISSION names it: its time); None when
    SUBMISSION names another or is absent: nothing undated there is known to be its."""
    path = job_dir / SUBMISSION
    try:
        if path.read_text().split()[:1] != [submission]:
            return None
        return path.stat().st_mtime
    except OSError:
        return None


def any_committed(job_dir: Path, gen: int | None = None) -> Path:
    """A committed generation of any submission: `gen`, else the newest. For a job
    Slurm forgot, which no longer has a "current" submission to go by."""
    committed = [p for _, p, c in generations(job_dir) if c]
    path = Path(job_dir) / gen_name(gen) if gen is not None else (committed[-1] if committed else None)
    if path is None or path not in committed:
        raise GpucrError(f"no committed checkpoint {path.name if path else ''} under {job_dir}".replace("  ", " "),
                         f"pick one of: {', '.join(p.name for p in committed) or 'none'}")
    return path


def submission_parts(submission: str | None) -> tuple[str, str]:
    """(cluster, uid) of "<cluster>:<uid>:<token>"."""
    cluster, _, rest = (submission or "").partition(":")
    return cluster, rest.partition(":")[0]


def resubmission_source(gen_dir: Path, submission: str | None) -> Path:
    """The old generation a resubmitted job restores: committed, of this user and cluster."""
    m = mf.load(gen_dir)
    theirs = submission_parts(m.get("submission"))
    if not submission or theirs != submission_parts(submission) or str(m.get("owner_uid")) != theirs[1]:
        raise GpucrError(f"{gen_dir} belongs to uid {theirs[1] or '?'} on cluster {theirs[0] or '?'}, "
                         f"not to this job (uid {submission_parts(submission)[1]})",
                         "a job can only be brought back from its own user's checkpoint")
    return gen_dir
