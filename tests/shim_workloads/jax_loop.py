"""A deterministic JAX loop: a state matrix updated on the GPU each step, one
copy of it to the host (a sync) and a 50 ms sleep. XLA preallocates 75 % of the GPU
unless XLA_PYTHON_CLIENT_PREALLOCATE=false (or XLA_PYTHON_CLIENT_MEM_FRACTION says
otherwise).

python3 jax_loop.py STEPS OUT
Appends `step I SUM_HEX HASH` per step (HASH: of every state so far) and `checksum HEX` at the end to OUT."""
import hashlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

steps, out_path = int(sys.argv[1]), sys.argv[2]
out = open(out_path, "a", buffering=1)
key = jax.random.PRNGKey(0)
x = jax.random.normal(key, (2048, 2048), dtype=jnp.float32)
w = jax.random.normal(jax.random.PRNGKey(1), (2048, 2048), dtype=jnp.float32) / 2048 ** 0.5


@jax.jit
def step(x, w, i):
    # no reduction on the GPU (its order may vary from run to run); the product's
    # algorithm is fixed by XLA_FLAGS=--xla_gpu_autotune_level=0 (set by the caller)
    return jnp.tanh(x @ w) * 0.9 + 0.001 * i


h = hashlib.sha256()
for i in range(steps):
    x = step(x, w, i)
    host = np.asarray(x)  # a host sync
    h.update(host.tobytes())
    out.write(f"step {i} {float(host.astype(np.float64).sum()).hex()} {h.hexdigest()[:16]}\n")
    time.sleep(0.05)
out.write(f"checksum {h.hexdigest()}\n")
