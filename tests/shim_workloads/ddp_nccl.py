"""A deterministic PyTorch DDP training loop over NCCL, one process per GPU,
launched by torchrun (or srun: RANK/WORLD_SIZE/LOCAL_RANK from Slurm's SLURM_*).

python3 ddp_nccl.py STEPS BALLAST_GIB PACE_S [SUBGROUP_FROM]
Every rank prints `rank R step I LOSS_HEX` per step and `rank R checksum HEX`
(its parameters, optimizer state and ballast) at the end. SUBGROUP_FROM >= 0:
from that step on, a second communicator (new_group of every rank, made lazily
then) all-reduces the loss too."""
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write: the ranks share the launcher's stdout


steps, ballast_gib, pace = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
subgroup_from = int(sys.argv[4]) if len(sys.argv) > 4 else -1
for ours, slurms in (("RANK", "SLURM_PROCID"), ("WORLD_SIZE", "SLURM_NTASKS"), ("LOCAL_RANK", "SLURM_LOCALID")):
    if ours not in os.environ and slurms in os.environ:
        os.environ[ours] = os.environ[slurms]
rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dev = torch.device("cuda", local)
g = torch.Generator(device=dev).manual_seed(1 + rank)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                            torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
ballast = torch.empty(int(ballast_gib * 2**30) // 4, dtype=torch.float32, device=dev)
ballast.uniform_(generator=g)
group = None
for i in range(steps):
    x = torch.randn(256, 1024, device=dev, generator=g)
    y = torch.randn(256, 1024, device=dev, generator=g)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    seen = loss.detach().clone()
    if 0 <= subgroup_from <= i:
        group = group or dist.new_group(list(range(world)))
        dist.all_reduce(seen, group=group)
    say(f"rank {rank} step {i} {seen.item().hex()}")
    time.sleep(pace)
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().cpu().numpy().tobytes())
for s in opt.state.values():
    h.update(s["exp_avg"].cpu().numpy().tobytes())
h.update(ballast.sum(dtype=torch.float64).item().hex().encode())
say(f"rank {rank} checksum {h.hexdigest()}")
dist.destroy_process_group()
