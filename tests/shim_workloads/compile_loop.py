"""A deterministic training loop of a torch.compile'd model, with a GPU ballast.

COMPILE_MODE=MODE python3 compile_loop.py STEPS BALLAST_GIB PACE_S
MODE: default, or reduce-overhead (CUDA graphs). Prints `step I LOSS_HEX` per
step and `checksum HEX` (parameters + ballast) at the end."""
import hashlib
import os
import sys
import time

import torch

steps, ballast_gib, pace = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
mode = os.environ.get("COMPILE_MODE", "default")
torch.manual_seed(0)
g = torch.Generator(device="cuda").manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.LayerNorm(2048),
                            torch.nn.Linear(2048, 512)).cuda()
compiled = torch.compile(model, mode=None if mode == "default" else mode)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
ballast = torch.empty(int(ballast_gib * 2**30) // 4, dtype=torch.float32, device="cuda")
ballast.uniform_(generator=g)
for i in range(steps):
    x = torch.randn(256, 512, device="cuda", generator=g)
    y = torch.randn(256, 512, device="cuda", generator=g)
    loss = torch.nn.functional.mse_loss(compiled(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"step {i} {loss.item().hex()}", flush=True)
    time.sleep(pace)
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().cpu().numpy().tobytes())
h.update(ballast.sum(dtype=torch.float64).item().hex().encode())
print(f"checksum {h.hexdigest()}", flush=True)
