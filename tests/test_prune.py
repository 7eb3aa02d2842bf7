"""`gpucr-hpc prune` (gpucr_hpc.job.storage.retention): old generations go, what a restore
reads never does, nor a job a command is acting on.

Generations are made as checkpoints make them (new_generation, commit_generation);
what Slurm says of the jobs is given here; tests/test_prune_slurm.py asks the
test cluster about jobs that ended and run.
"""

import os

import pytest

from gpucr_hpc.job import generations
from gpucr_hpc.job import lock as job_lock
from gpucr_hpc.job.storage import retention
from gpucr_hpc.store import manifest as mf

SUB = "cl:0:token-a"


def make_job(root, jobid="41", committed=4, other=0, dead=False):
    job = root / jobid
    job.mkdir(mode=0o700)
    for _ in range(other):  # an earlier job that had this id
        g = generations.new_generation(job, os.geteuid())
        mf.commit(g, {**mf.new_manifest(kind="job", vendor=None, gpu=None), "submission": "cl:0:token-old"})
    for _ in range(committed):
        g = generations.new_generation(job, os.geteuid())
        m = {**mf.new_manifest(kind="job", vendor=None, gpu=None), "submission": SUB, "owner_uid": os.geteuid()}
        mf.commit(g, m)
        generations.write_pointer(job, generations.LATEST, g, SUB)
        generations.claim(job, SUB)
    if dead:
        generations.new_generation(job, os.geteuid())  # a checkpoint that died before its commit
    return job


def names(job):
    return [p.name for _, p, _ in generations.generations(job)]


def test_keeps_the_newest_and_removes_the_rest_and_dead_ones(tmp_path):
    job = make_job(tmp_path, committed=4, dead=True)
    assert names(job) == ["gen-1", "gen-2", "gen-3", "gen-4", "gen-5"]
    dry = retention.prune_job(job, keep=2, states=None, dry_run=True)
    assert names(job) == ["gen-1", "gen-2", "gen-3", "gen-4", "gen-5"], "a dry run removed something"
    acts = {a.generation: a.action for a in retention.prune_job(job, keep=2, states=None, dry_run=False)}
    assert acts == {a.generation: a.action for a in dry}
    assert acts == {"gen-1": "removed", "gen-2": "removed", "gen-3": "kept", "gen-4": "kept", "gen-5": "removed"}
    assert names(job) == ["gen-3", "gen-4"]


def test_never_the_generation_a_restore_reads_nor_an_earlier_submissions(tmp_path):
    job = make_job(tmp_path, committed=3, other=1)  # gen-1 is another submission's
    generations.write_pointer(job, generations.RESTORE, job / "gen-2", SUB)  # restore --from 2
    # Slurm reports other jobs ended; this one it no longer knows (it may be resubmitted)
    states = {"40": "COMPLETED", "42": "CANCELLED"}
    acts = {a.generation: (a.action, a.why) for a in retention.prune_job(job, keep=1, states=states, dry_run=False)}
    assert acts["gen-1"][0] == "kept" and "earlier submission" in acts["gen-1"][1]
    assert acts["gen-2"][0] == "kept" and "restore" in acts["gen-2"][1]
    assert acts["gen-4"][0] == "kept"  # LATEST
    assert acts["gen-3"][0] == "removed"
    assert names(job) == ["gen-1", "gen-2", "gen-4"]
    assert acts[""] == ("kept", "Slurm no longer knows the job: it may be resubmitted from its checkpoint")


def test_a_job_a_command_is_acting_on_is_skipped_whole(tmp_path):
    job = make_job(tmp_path, committed=3)
    with job_lock.held(job, "41", os.geteuid(), what="gpucr-hpc checkpoint 41"):
        acts = retention.prune_job(job, keep=1, states=None, dry_run=False)
    assert len(acts) == 1 and acts[0].action == "skipped" and "busy" in acts[0].why
    assert names(job) == ["gen-1", "gen-2", "gen-3"]


def test_an_ended_job_goes_whole(tmp_path):
    job = make_job(tmp_path, "43", committed=2)
    acts = retention.prune_job(job, keep=2, states={"43": "COMPLETED"}, dry_run=False)
    assert [(a.generation, a.action) for a in acts] == [("", "removed")] and not job.exists()
    job = make_job(tmp_path, "44", committed=2)
    acts = retention.prune_job(job, keep=2, states={"44": "FAILED"}, dry_run=False)
    assert ("", "kept") in [(a.generation, a.action) for a in acts] and job.exists()  # may be restored


def test_someone_elses_job_is_not_listed_and_a_named_one_is_one_line(tmp_path):
    make_job(tmp_path, "7")
    assert [p.name for p in retention.job_dirs(tmp_path, None)] == ["7"]
    if os.geteuid() == 0:
        os.chown(tmp_path / "7", 65534, 65534)  # root still prunes every job
        assert [p.name for p in retention.job_dirs(tmp_path, None)] == ["7"]
    with pytest.raises(retention.GpucrError, match="no job 9"):
        retention.job_dirs(tmp_path, "9")
