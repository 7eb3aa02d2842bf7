"""`gpucr-hpc doctor -p PARTITION`: every node of the test cluster checked through Slurm,
and the checks that read Slurm (PMIx, preemption) against its real answers."""

import json

import pytest
from job_helpers import gpucr

from gpucr_hpc.doctor import checks

pytestmark = [pytest.mark.slurm]


def test_every_node_of_a_partition_reports_its_checks(slurm_cluster):
    nodes = slurm_cluster.run("sinfo", "-h", "-p", "debug", "-N", "-o", "%N").stdout.split()
    r = gpucr(slurm_cluster, "doctor", "-p", "debug", "--json", check=False)
    doc = json.loads(r.stdout)  # one document for all nodes
    assert doc["schema"] == "gpucr-hpc.doctor/1"
    reports = doc["nodes"]
    assert sorted(rep["node"] for rep in reports) == sorted(set(nodes)), r.stderr
    for rep in reports:
        got = {c["name"]: c["ok"] for c in rep["checks"]}
        assert got["plugin"] is True and got["criu"] is True, rep
        assert got["srun --mpi=pmix"] is True and got["preempt mode"] is True, rep
    failed = [c for rep in reports for c in rep["checks"] if c["ok"] is False]
    assert (r.returncode == 0) == (not failed), (r.returncode, failed)


def test_the_test_clusters_preemption_settings_and_pmix_pass(slurm_cluster, monkeypatch):
    """The test cluster has the admin guide's settings: REQUEUE, the user signal, GraceTime=30
    on debug (urgent preempts nothing: PreemptMode=OFF). Its real scontrol answers are read."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    mode, grace = checks.preemption()
    assert mode.ok is True, mode
    assert grace.ok is not None and "debug GraceTime=30" in grace.detail and "urgent" not in grace.detail, grace
    assert checks.srun_pmix().ok is True
    monkeypatch.setenv("SLURMD_NODENAME", "no-such-node")
    assert all(c.ok is None and "in no partition" in c.detail for c in checks.preemption())
