"""Where a restored rank's TCP ends go (gpucr_hpc.job.connections.rank_connections).

Pure decisions from the manifest's record and the restore step's layout: node
names here are addresses, so resolving them needs no name service.
"""


import subprocess
import sys

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.job.connections import rank_connections as rc

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
    where = {"rank-0.0": "10.0.0.21", "rank-0.1": "10.0.0.22"}  # rank 0 now on .21, rank 1 on .22
    moved = rc.moves(RANKS[0], where)
    assert moved == {"10.0.0.11:5000": "10.0.0.21", "10.0.0.12:40000": "10.0.0.22"}
    assert rc.flows(RANKS[0], moved) == [rc.netlock.Flow("10.0.0.21:5000", "10.0.0.22:40000")]
    peer = rc.moves(RANKS[1], where)
    assert rc.flows(RANKS[1], peer) == [rc.netlock.Flow("10.0.0.22:40000", "10.0.0.21:5000")]


def test_a_node_without_an_address_is_one_line():
    with pytest.raises(GpucrError, match="no address"):
        rc.moves(RANKS[1], {"rank-0.0": "no-such-node.invalid", "rank-0.1": "no-such-node.invalid"})


def test_the_kth_node_of_the_ranks_becomes_the_kth_of_the_allocation():
    ranks = [{"name": f"rank-0.{i}", "node": n} for i, n in enumerate(["n3", "n3", "n1", "n1", "n2"])]
    assert rc.placement(ranks, ["a", "b", "c"]) == ["a", "a", "b", "b", "c"]
    with pytest.raises(GpucrError, match="ran on 3 nodes and it now has 2"):
        rc.placement(ranks, ["a", "b"])


def test_where_now_is_the_restores_placement_and_the_batch_node(monkeypatch):
    monkeypatch.setenv(rc.RANK_NODES_ENV, "n2,n3")
    monkeypatch.setenv(rc.BATCH_NODE_ENV, "n2")
    assert rc.where_now(RANKS) == {"rank-0.0": "n2", "rank-0.1": "n3", "batch": "n2"}
    monkeypatch.setenv(rc.RANK_NODES_ENV, "n2")
    with pytest.raises(GpucrError, match="places 1 ranks"):
        rc.where_now(RANKS)



def test_holding_until_all_back_times_out_in_one_line(tmp_path):
    (tmp_path / "0").touch()
    with pytest.raises(GpucrError, match="only 1 of 2 ranks were restored within 0 s"):
        rc.hold_until_all_back(tmp_path, 2, timeout=0.2)
    (tmp_path / "1").touch()
    rc.hold_until_all_back(tmp_path, 2, timeout=0.2)


@pytest.mark.slurm
def test_a_node_name_that_does_not_resolve_moves_to_its_slurm_node_address(slurm_cluster):
    """Found on a GPU machine without name service: ends moved to another node
    must go where Slurm reaches that node, whether or not its name resolves."""
    addr = slurm_cluster.run("scontrol", "show", "node", "-o", "n2").stdout.split("NodeAddr=")[1].split()[0]
    probe = ("from gpucr_hpc.job.connections import rank_connections as rc; "
             "print(rc.moves({'name': 'r', 'tcp': {'ends': ['10.9.9.9:5000']}}, {'r': 'n2'}))")
    out = subprocess.run([sys.executable, "-c", probe], env=slurm_cluster.env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str({"10.9.9.9:5000": addr})
