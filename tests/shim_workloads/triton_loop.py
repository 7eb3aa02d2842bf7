"""A deterministic loop that launches a @triton.jit kernel through Triton's own
launcher every step (which asks the driver about every pointer argument before
the launch), on torch tensors, with a GPU ballast.

python3 triton_loop.py STEPS BALLAST_GIB PACE_S
Prints `step I HEX` per step and `checksum HEX` at the end."""
import hashlib
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def mix(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    tl.store(out_ptr + offs, tl.sin(a * x) + 0.5 * y, mask=m)


steps, ballast_gib, pace = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
torch.use_deterministic_algorithms(True)
g = torch.Generator(device="cuda").manual_seed(1)
n = 1 << 22
x = torch.rand(n, device="cuda", generator=g)
y = torch.rand(n, device="cuda", generator=g)
out = torch.empty_like(x)
ballast = torch.empty(int(ballast_gib * 2**30) // 4, dtype=torch.float32, device="cuda")
ballast.uniform_(generator=g)
for i in range(steps):
    mix[(triton.cdiv(n, 1024),)](x, y, out, 1.0 + i / 1000, n, BLOCK=1024)
    x, y, out = out, x, y
    print(f"step {i} {x[:4096].double().sum().item().hex()}", flush=True)
    time.sleep(pace)
h = hashlib.sha256(x.cpu().numpy().tobytes())
h.update(ballast.sum(dtype=torch.float64).item().hex().encode())
print(f"checksum {h.hexdigest()}", flush=True)
