"""A deterministic PyTorch FSDP training loop over NCCL, one process per GPU,
launched by torchrun (or srun: RANK/WORLD_SIZE/LOCAL_RANK from Slurm's SLURM_*).

python3 fsdp_nccl.py STEPS BALLAST_GIB PACE_S [SUBGROUP_FROM]
Every rank prints `rank R step I LOSS_HEX` per step and `rank R checksum HEX`
at the end: its parameter shards, its optimizer state (the shards' moments and
step counts) and its ballast. The model is sharded with FSDP2 (`fully_shard`)
where torch has it, else FullyShardedDataParallel. SUBGROUP_FROM >= 0: from that
step on, a second communicator (new_group of every rank, made lazily then)
all-reduces the loss too. The caller sets CUBLAS_WORKSPACE_CONFIG."""
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write: the ranks share the launcher's stdout


def local_bytes(t: torch.Tensor) -> bytes:
    """The bytes this rank holds of t (a DTensor's local shard)."""
    t = t.detach()
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.contiguous().cpu().numpy().tobytes()


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
try:
    from torch.distributed.fsdp import fully_shard  # FSDP2 (torch >= 2.6)

    have_fsdp2 = True
except ImportError:
    have_fsdp2 = False
if have_fsdp2:
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    sharded: torch.nn.Module = model
    kind = "fsdp2"
else:
    from torch.distributed.fsdp import FullyShardedDataParallel

    sharded = FullyShardedDataParallel(model, device_id=local, use_orig_params=True)
    kind = "fsdp1"
opt = torch.optim.AdamW(sharded.parameters(), lr=1e-3, foreach=False)
ballast = torch.empty(int(ballast_gib * 2**30) // 4, dtype=torch.float32, device=dev)
ballast.uniform_(generator=g)
if rank == 0:
    print(f"fsdp_nccl: {kind}, torch {torch.__version__}", file=sys.stderr, flush=True)
group = None
for i in range(steps):
    x = torch.randn(256, 1024, device=dev, generator=g)
    y = torch.randn(256, 1024, device=dev, generator=g)
    loss = torch.nn.functional.mse_loss(sharded(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    seen = loss.detach().clone()
    if 0 <= subgroup_from <= i:
        group = group or dist.new_group(list(range(world)))
        dist.all_reduce(seen, group=group)
    say(f"rank {rank} step {i} {float(seen.item()).hex()}")
    time.sleep(pace)
h = hashlib.sha256()
for grp in opt.param_groups:
    for p in grp["params"]:
        h.update(local_bytes(p))
        state = opt.state.get(p, {})
        for key in sorted(state):
            if isinstance(state[key], torch.Tensor):
                h.update(key.encode())
                h.update(local_bytes(state[key]))
h.update(float(ballast.sum(dtype=torch.float64).item()).hex().encode())
say(f"rank {rank} checksum {h.hexdigest()}")
dist.destroy_process_group()
