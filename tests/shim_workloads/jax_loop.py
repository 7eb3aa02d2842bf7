"""A deterministic JAX loop: a state matrix updated on the GPU each step, one
`float()` of it (a host sync) and a 50 ms sleep. XLA preallocates 75 % of the GPU
unless XLA_PYTHON_CLIENT_PREALLOCATE=false (or XLA_PYTHON_CLIENT_MEM_FRACTION says
otherwise).

python3 jax_loop.py STEPS OUT
Appends `step I SUM_HEX` per step and `checksum HEX` at the end to OUT."""
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
    y = jnp.tanh(x @ w) + 0.01 * i
    return y / (1.0 + jnp.abs(y).mean())


for i in range(steps):
    x = step(x, w, i)
    out.write(f"step {i} {float(x.sum()).hex()}\n")
    time.sleep(0.05)
out.write(f"checksum {hashlib.sha256(np.asarray(x).tobytes()).hexdigest()}\n")
