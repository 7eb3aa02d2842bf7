"""A job that fails right after each restore is held instead of looping
(job/restore/restore_cap.py)."""

import json

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job.restore import restore_cap


def test_the_same_generation_is_restored_at_most_cap_times_in_a_row(tmp_path):
    assert [restore_cap.count(tmp_path, "gen-1", False, 3) for _ in range(3)] == [1, 2, 3]
    with pytest.raises(GpucrError) as e:
        restore_cap.count(tmp_path, "gen-1", False, 3)
    assert "gen-1 was restored 3 times in a row" in e.value.cause and "gpucr-hpc restore" in e.value.fix
    assert json.loads((tmp_path / restore_cap.COUNT_FILE).read_text()) == {"gen": "gen-1", "times": 3}


def test_a_newer_generation_or_a_restore_by_hand_starts_the_count_again(tmp_path):
    for _ in range(3):
        restore_cap.count(tmp_path, "gen-1", False, 3)
    assert restore_cap.count(tmp_path, "gen-1", True, 3) == 1  # gpucr-hpc restore
    restore_cap.count(tmp_path, "gen-1", False, 3)
    assert restore_cap.count(tmp_path, "gen-2", False, 3) == 1  # the run checkpointed again


def test_a_damaged_count_counts_from_one(tmp_path):
    (tmp_path / restore_cap.COUNT_FILE).write_text("not json")
    assert restore_cap.count(tmp_path, "gen-1", False, 3) == 1
