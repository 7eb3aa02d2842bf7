"""The GPU's raw pinned copy rate (torch, in a process of its own): the bytes of a
checkpoint over it are the floor no data path goes below."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# GIB each way between pinned host memory and the GPU, best of 3, once the clock
# passes START (several GPUs measured at once start together).
COPIES = """
import json, sys, time, torch
n = int(float(sys.argv[1]) * 2**30); start = float(sys.argv[2])
h = torch.empty(n, dtype=torch.uint8, pin_memory=True); d = torch.empty(n, dtype=torch.uint8, device='cuda')
h.fill_(1); d.fill_(2); torch.cuda.synchronize()
while time.time() < start: time.sleep(0.001)
def best(f):
    t = []
    for _ in range(3):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(); torch.cuda.synchronize()
        t.append(time.perf_counter() - t0)
    return n / min(t) / 1e9
print(json.dumps({"d2h_GBps": best(lambda: h.copy_(d, non_blocking=True)),
                  "h2d_GBps": best(lambda: d.copy_(h, non_blocking=True))}))
"""


def start_copies(gib: float, gpu: int | None = None, start: float = 0.0) -> subprocess.Popen:
    """The measurement on `gpu` (default: the first the process sees), begun at time.time() `start`."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu)) if gpu is not None else None
    return subprocess.Popen([sys.executable, "-c", COPIES, str(gib), str(start)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def copy_rates(p: subprocess.Popen, timeout: float) -> dict:
    """{"d2h_GBps", "h2d_GBps"} of a measurement started by start_copies, or {"error": its stderr's end}."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"error": f"no rates within {timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": err[-500:]}
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"no rates in its output: {out[-300:]!r}"}


def pinned_bandwidth(gib: float = 8.0, timeout: float = 300) -> dict:
    """The first GPU's raw pinned rates: {"d2h_GBps", "h2d_GBps", "gib"}, or {"error"}."""
    rates = copy_rates(start_copies(gib), timeout)
    return rates if "error" in rates else {**rates, "gib": gib}
