"""Where a restored rank's TCP ends go (gpucr_hpc.job.rank_connections).

Pure decisions from the manifest's record and the restore step's layout: node
names here are addresses, so resolving them needs no name service.
"""

import shutil

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job import rank_connections as rc

RANKS = [
    {"name": "rank-0.0", "rank": 0, "tcp": {
        "ends": ["10.0.0.11:5000", "10.0.0.11:5000", "0.0.0.0:6000", "127.0.0.1:7000"],
        "peers": {"10.0.0.12:40000": "rank-0.1", "127.0.0.1:7001": "rank-0.0"},
        "links": [["10.0.0.11:5000", "10.0.0.12:40000"]]}},
    {"name": "rank-0.1", "rank": 1, "tcp": {
        "ends": ["10.0.0.12:40000"], "peers": {"10.0.0.11:5000": "rank-0.0"},
        "links": [["10.0.0.12:40000", "10.0.0.11:5000"]]}},
]


def test_node_address_ends_move_and_loopback_and_wildcard_ends_stay():
    nodes = ["10.0.0.21", "10.0.0.22"]  # rank 0 now on .21, rank 1 on .22
    moved = rc.moves(RANKS[0], RANKS, nodes)
    assert moved == {"10.0.0.11:5000": "10.0.0.21", "10.0.0.12:40000": "10.0.0.22"}
    assert rc.flows(RANKS[0], moved) == [rc.netlock.Flow("10.0.0.21:5000", "10.0.0.22:40000")]
    peer = rc.moves(RANKS[1], RANKS, nodes)
    assert rc.flows(RANKS[1], peer) == [rc.netlock.Flow("10.0.0.22:40000", "10.0.0.21:5000")]


def test_a_node_without_an_address_is_one_line():
    with pytest.raises(GpucrError, match="no address"):
        rc.moves(RANKS[1], RANKS, ["no-such-node.invalid", "no-such-node.invalid"])


@pytest.mark.skipif(not shutil.which("scontrol"), reason="needs Slurm's scontrol (hostlist expansion)")
def test_the_step_layout_places_ranks_in_blocks(monkeypatch, tmp_path):
    conf = tmp_path / "slurm.conf"  # hostlist expansion needs a configuration, not a controller
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("SLURM_STEP_NODELIST", "n[1-3]")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2),1")
    assert rc.step_nodes(5) == ["n1", "n1", "n2", "n2", "n3"]
    with pytest.raises(GpucrError, match="cannot tell where the 4 ranks"):
        rc.step_nodes(4)


def test_holding_until_all_back_times_out_in_one_line(tmp_path):
    (tmp_path / "0").touch()
    with pytest.raises(GpucrError, match="only 1 of 2 ranks were restored within 0 s"):
        rc.hold_until_all_back(tmp_path, 2, timeout=0.2)
    (tmp_path / "1").touch()
    rc.hold_until_all_back(tmp_path, 2, timeout=0.2)
