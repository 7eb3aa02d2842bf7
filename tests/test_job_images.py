"""The image store's generations and the submission each belongs to (job/generations.py), on real files."""

import os
import shutil
import time

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import events, generations
from gpucr_hpc.store import manifest as mf

OLD, NEW = "c:0:old", "c:0:new"


def commit(job_dir, n, submission, uid=0):
    gen = job_dir / f"gen-{n}"
    gen.mkdir(parents=True)
    m = mf.new_manifest(kind="job", vendor=None, gpu=None)
    m.update(submission=submission, owner_uid=uid)
    generations.commit_generation(gen, m)
    return gen


@pytest.fixture
def reused(tmp_path):
    """Job id 7: two generations of an old submission, then one of a new one."""
    job_dir = tmp_path / "7"
    job_dir.mkdir()
    generations.claim(job_dir, OLD)  # at its start, as the batch supervisor does
    for n in (1, 2, 3):
        commit(job_dir, n, OLD)
    generations.claim(job_dir, NEW)
    commit(job_dir, 4, NEW)
    return job_dir


def test_a_new_submission_never_prunes_the_old_ones_generations(reused):
    commit(reused, 5, NEW)
    commit(reused, 6, NEW)
    assert sorted(p.name for _, p, c in generations.generations(reused) if c) == [
        "gen-2", "gen-3", "gen-5", "gen-6"]  # each submission keeps its newest two


def test_pointers_name_the_generations_submission(reused):
    assert (reused / "LATEST").read_text() == f"gen-4\n{NEW}\n"
    assert generations.current_submission(reused) == NEW


def test_a_start_restores_only_its_own_submission(reused):
    assert generations.start_target(reused, NEW, None).name == "gen-4"
    with pytest.raises(GpucrError):
        generations.start_target(reused, "c:0:third", None)


def test_restore_from_another_submissions_generation_is_refused(reused):
    with pytest.raises(GpucrError) as e:
        generations.restore_target(reused, 3)
    assert "another submission" in e.value.cause and "--from 3 --resubmit" in e.value.fix
    assert generations.restore_target(reused).name == "gen-4"


def test_a_claim_at_start_makes_the_old_generations_another_submissions(reused):
    generations.claim(reused, "c:0:third")
    assert generations.current_submission(reused) == "c:0:third"
    with pytest.raises(GpucrError):
        generations.restore_target(reused)


def test_resubmission_source_must_be_the_same_users_on_the_same_cluster(reused):
    gen = reused / "gen-3"
    assert generations.start_target(reused, "c:0:resubmitted", str(gen)) == gen
    for other in ("c:1000:resubmitted", "d:0:resubmitted", None):
        with pytest.raises(GpucrError):
            generations.start_target(reused, other, str(gen))


def test_a_forgotten_job_can_pick_any_committed_generation(reused):
    assert generations.any_committed(reused).name == "gen-4"
    assert generations.any_committed(reused, 2).name == "gen-2"
    with pytest.raises(GpucrError):
        generations.any_committed(reused, 9)


# A start that finds its own checkpoint gone (generations.lost): the job is held with
# what is gone and what goes on, never run from the top, never restored from elsewhere.

def latest_gen_5_lost(job_dir):
    shutil.rmtree(commit(job_dir, 5, NEW))


@pytest.mark.parametrize("damage, summary", [
    (latest_gen_5_lost, "gen-5 (LATEST) is gone"),
    (lambda d: generations.write_pointer(d, "LATEST", d / "gen-9", NEW), "gen-9 (LATEST) is gone"),
    (lambda d: (d / "LATEST").write_text("\x00\x17garbage"), "LATEST is garbled"),
    (lambda d: ((d / "LATEST").unlink(), (d / "LATEST").mkdir()), "LATEST is unreadable"),
    (lambda d: (d / "LATEST").unlink(), "LATEST is missing"),
    (lambda d: (d / "gen-4" / mf.COMMITTED).unlink(), "gen-4 (LATEST) is not committed"),
])
def test_a_start_whose_checkpoint_is_gone_is_told_what_is_gone_and_what_goes_on(reused, damage, summary):
    damage(reused)
    gone = generations.lost(reused, NEW)
    assert gone is not None and gone.summary == summary, gone
    if "gen-4" in summary:  # no other of its own
        assert gone.then == "scancel 7, submit it again" and "from the top" in gone.fix
    else:
        assert gone.then == "gpucr-hpc restore 7 --from 4", gone.then
    assert "\n" not in gone.one_line()
    with pytest.raises(generations.LostCheckpoint):  # never the resubmission's source instead
        generations.start_target(reused, NEW, str(reused / "gen-3"))


def test_a_checkpoint_only_events_record_is_gone_too(reused):
    for n in (2, 3, 4):
        shutil.rmtree(reused / f"gen-{n}")
    (reused / "LATEST").unlink()
    events.record(reused, 0, what="checkpoint", ok=True, generation="gen-4")
    gone = generations.lost(reused, NEW)
    assert gone is not None and gone.summary == "gen-4 is gone" and "events.jsonl" in gone.cause
    assert gone.then == "scancel 7, submit it again"


def test_no_trace_of_a_checkpoint_of_its_own_is_a_start_from_the_top(reused, tmp_path):
    assert generations.lost(reused, NEW) is None  # LATEST names a committed one
    fresh = tmp_path / "8"
    fresh.mkdir()
    generations.claim(fresh, NEW)
    events.record(fresh, 0, what="checkpoint", ok=False, error="refused")
    assert generations.lost(fresh, NEW) is None  # a checkpoint that failed made nothing
    died = fresh / "gen-1"  # one that died between its manifest and its COMMITTED
    died.mkdir()
    (died / mf.MANIFEST).write_text(f'{{"submission": "{NEW}"}}')
    assert generations.lost(fresh, NEW) is None
    # A new submission of the id: the old one's pointers, garbled ones and records are not its.
    events.record(reused, 0, what="checkpoint", ok=True, generation="gen-4")
    (reused / "RESTORE").write_text("junk\n")
    os.utime(reused / "RESTORE", (1, 1))
    time.sleep(0.05)  # the claim's time on the file, coarser than the records'
    generations.claim(reused, "c:0:third")
    assert generations.lost(reused, "c:0:third") is None
    assert generations.lost(reused, None) is None


def test_the_generation_restored_as_asked_is_latest_in_place_of_a_lost_one(reused):
    latest_gen_5_lost(reused)
    generations.write_pointer(reused, "RESTORE", reused / "gen-4", NEW)
    assert generations.start_target(reused, NEW, None).name == "gen-4"
    generations.mend_latest(reused, reused / "gen-4", NEW)
    (reused / "RESTORE").unlink()
    assert generations.lost(reused, NEW) is None
    assert generations.start_target(reused, NEW, None).name == "gen-4"
    commit(reused, 6, NEW)
    generations.mend_latest(reused, reused / "gen-4", NEW)  # one that names a checkpoint stays
    assert generations.read_pointer(reused, "LATEST").name == "gen-6"
