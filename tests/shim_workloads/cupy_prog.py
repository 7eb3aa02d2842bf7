"""A deterministic CuPy iteration with a GPU ballast.

python3 cupy_prog.py STEPS BALLAST_GIB PACE_S"""
import hashlib
import sys
import time

import cupy as cp

steps, ballast_gib, pace = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
rs = cp.random.RandomState(0)
a = rs.standard_normal((2048, 2048), dtype=cp.float32) / 64
w = rs.standard_normal((2048, 256), dtype=cp.float32)
ballast = rs.random_sample(int(ballast_gib * 2**30) // 4, dtype=cp.float32)
for i in range(steps):
    w = w - 0.01 * (a @ w) + 0.001 * cp.tanh(w)
    print(f"step {i} {float(cp.sum(w * w)).hex()}", flush=True)
    time.sleep(pace)
h = hashlib.sha256(cp.asnumpy(w).tobytes())
h.update(float(cp.sum(ballast, dtype=cp.float64)).hex().encode())
print(f"checksum {h.hexdigest()}", flush=True)
