"""A deterministic PyTorch training loop (MLP + AdamW) with a GPU ballast.

python3 train_torch.py STEPS BALLAST_GIB PACE_S
Prints `step I LOSS_HEX` per step and `checksum HEX` (parameters + ballast) at the end.
The allocator comes from PYTORCH_CUDA_ALLOC_CONF (default, expandable_segments,
backend:cudaMallocAsync)."""
import hashlib
import sys
import time

import torch

steps, ballast_gib, pace = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                            torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ballast = torch.empty(int(ballast_gib * 2**30) // 4, dtype=torch.float32, device=dev)
ballast.uniform_(generator=g)
for i in range(steps):
    x = torch.randn(512, 1024, device=dev, generator=g)
    y = torch.randn(512, 1024, device=dev, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"step {i} {loss.item().hex()}", flush=True)
    time.sleep(pace)
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().cpu().numpy().tobytes())
for s in opt.state.values():
    h.update(s["exp_avg"].cpu().numpy().tobytes())
h.update(ballast.sum(dtype=torch.float64).item().hex().encode())
print(f"checksum {h.hexdigest()}", flush=True)
