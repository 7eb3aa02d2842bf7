"""Node-local paths (%n, %h) expand as the plugin expands them.

Several slurmd on one machine share its host name; the plugin expands %n to
Slurm's node name, so the CLI, the agents and the batch supervisor must too,
or a restored job's task record lands in another node's run dir.
"""

import socket

from gpucr_hpc.slurm import site


def test_percent_n_is_slurms_node_name_not_the_host_name(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    s = site.Site(plugstack=None, rundir="/run/gpucr/%n")
    assert s.job_run_dir("12") == site.Path("/run/gpucr/n7/12")


def test_percent_n_outside_a_job_is_the_short_host_name(monkeypatch):
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert site.expand("/x/%n") == "/x/" + socket.gethostname().split(".")[0]


def test_a_named_node_wins_and_percent_h_is_the_full_host_name(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    assert site.expand("/x/%n/%h/%%", "n2") == f"/x/n2/{socket.gethostname()}/%"
