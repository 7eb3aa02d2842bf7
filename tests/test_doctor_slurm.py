"""`gpucr-hpc doctor -p PARTITION`: every node of the test cluster checked through Slurm."""

import json

import pytest
from job_helpers import gpucr

pytestmark = [pytest.mark.slurm]


def test_every_node_of_a_partition_reports_its_checks(slurm_cluster):
    nodes = slurm_cluster.run("sinfo", "-h", "-p", "debug", "-N", "-o", "%N").stdout.split()
    r = gpucr(slurm_cluster, "doctor", "-p", "debug", "--json", check=False)
    reports = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert sorted(rep["node"] for rep in reports) == sorted(set(nodes)), r.stderr
    for rep in reports:
        got = {c["name"]: c["ok"] for c in rep["checks"]}
        assert got["plugin"] is True and got["criu"] is True, rep
    failed = [c for rep in reports for c in rep["checks"] if c["ok"] is False]
    assert (r.returncode == 0) == (not failed), (r.returncode, failed)
