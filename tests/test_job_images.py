"""The image store's generations and the submission each belongs to (job/generations.py), on real files."""

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import generations
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
    for n in (1, 2, 3):
        commit(job_dir, n, OLD)
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
