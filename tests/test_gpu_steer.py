"""Which GPU features a requeued job is given (gpucr_hpc/gpu/steer.py): pure logic,
the nodes' features handed in."""

from gpucr_hpc.gpu import steer as gpu_steer
from gpucr_hpc.slurm.commands import Job


def job(nodes, tres="gres:gpu:1", features="(null)"):
    return Job(id="7", state="RUNNING", uid=0, user="root", nodes=nodes, batch_host=nodes[0],
               restart_count=0, partition="p", std_out="", std_err="", requeue=True,
               raw={"TresPerNode": tres, "Features": features})


FEATURES = {"a1": {"gpu_nvidia", "gpu_h100", "ib"}, "a2": {"gpu_nvidia", "gpu_h100"},
            "b1": {"gpu_nvidia", "gpu_a100"}}


def test_features_every_node_has_in_the_sites_order():
    site = "gpu_h100,gpu_a100,gpu_nvidia"
    assert gpu_steer.wanted(site, job(["a1", "a2"]), FEATURES.get) == ["gpu_h100", "gpu_nvidia"]
    assert gpu_steer.wanted(site, job(["a1", "b1"]), FEATURES.get) == ["gpu_nvidia"]


def test_no_steering_without_gpus_or_site_list():
    assert gpu_steer.wanted("gpu_h100", job(["a1"], tres="cpu=1"), FEATURES.get) == []
    assert gpu_steer.wanted("", job(["a1"]), FEATURES.get) == []
    assert gpu_steer.uses_gpus(job(["a1"], tres="cpu=2,mem=4G,node=1,gres/gpu=1"))


def test_constraint_keeps_the_users_and_adds_what_is_missing():
    assert gpu_steer.constraint("(null)", ["gpu_h100"]) == "gpu_h100"
    assert gpu_steer.constraint("bigmem", ["gpu_h100", "gpu_nvidia"]) == "bigmem&gpu_h100&gpu_nvidia"
    assert gpu_steer.constraint("bigmem&gpu_h100", ["gpu_h100"]) is None
    assert gpu_steer.constraint("gpu_h100|gpu_a100", ["gpu_h100"]) is None  # an OR is the user's to keep
    assert gpu_steer.constraint("", []) is None
