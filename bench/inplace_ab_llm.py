"""An LLM server's GPU footprint, for bench/bench_inplace_ab.py: the tensors of an
8-billion-parameter model in bf16 (Llama-3-8B's shapes, random content) and a
paged serving cache (one tensor per layer, CACHE_GIB in all), with decode-like
steps: every step a pass through all layers for one token, the token's keys and
values written into the cache, attention over the cache written so far, two host
syncs and a pause, like tests/shim_workloads/decode_torch.py.

python3 inplace_ab_llm.py OUT [--cache-gib 30] [--pause 0.05]
Writes to OUT (a file): `ready BYTES CHECKSUM` once everything is on the GPU, then
`step I TOKEN LOGIT_HEX` per step; on SIGUSR1 it ends the step under way and
writes `weights CHECKSUM` (the weights summed again: equal to the one at ready
when the memory came back whole) and `end STEPS`. Deterministic: the same steps
give the same tokens in every run."""

import argparse
import os
import signal
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--cache-gib", type=float, default=30.0)
ap.add_argument("--pause", type=float, default=0.05)
a = ap.parse_args()
out = open(a.out, "a", buffering=1)
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dev, dt = "cuda", torch.bfloat16
vocab, dim, layers, kv_heads, hd, ffn = 128256, 4096, 32, 8, 128, 14336
block = 16  # tokens per cache block


def rand(*shape):
    t = torch.empty(*shape, device=dev, dtype=dt)
    return t.normal_(0, 0.02)


emb = rand(vocab, dim)
w = [{"q": rand(dim, dim), "k": rand(kv_heads * hd, dim), "v": rand(kv_heads * hd, dim), "o": rand(dim, dim),
      "gate": rand(ffn, dim), "up": rand(ffn, dim), "down": rand(dim, ffn),
      "n1": torch.ones(dim, device=dev, dtype=dt), "n2": torch.ones(dim, device=dev, dtype=dt)}
     for _ in range(layers)]
norm, head = torch.ones(dim, device=dev, dtype=dt), rand(vocab, dim)
weights = [emb, norm, head] + [t for lw in w for t in lw.values()]
per_layer = int(a.cache_gib * 2**30) // layers
blocks = per_layer // (2 * block * kv_heads * hd * 2)
cache = [torch.zeros(2, blocks, block, kv_heads, hd, device=dev, dtype=dt) for _ in range(layers)]


def checksum() -> str:
    return repr(sum(float(t.float().sum(dtype=torch.float64)) if t.numel() < 2**28 else
                    sum(float(c.float().sum(dtype=torch.float64)) for c in t.split(2**28 // t.shape[1]))
                    for t in weights))


def rms(x, g):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt) * g


torch.cuda.synchronize()
nbytes = sum(t.numel() * t.element_size() for t in weights + cache)
out.write(f"ready {nbytes} {checksum()}\n")
token, i = 1, 0
while not stop and i < blocks * block:
    x = emb[token][None]
    b, s = divmod(i, block)
    for li, lw in enumerate(w):
        h = rms(x, lw["n1"])
        q = (h @ lw["q"].T).view(kv_heads, dim // (kv_heads * hd), hd)
        cache[li][0, b, s] = (h @ lw["k"].T).view(kv_heads, hd)
        cache[li][1, b, s] = (h @ lw["v"].T).view(kv_heads, hd)
        keys = cache[li][0].view(-1, kv_heads, hd)[:i + 1].float()
        vals = cache[li][1].view(-1, kv_heads, hd)[:i + 1].float()
        att = torch.softmax(torch.einsum("gqd,tgd->gqt", q.float(), keys) / hd ** 0.5, dim=-1)
        x = x + (torch.einsum("gqt,tgd->gqd", att, vals).reshape(1, dim).to(dt) @ lw["o"].T)
        h = rms(x, lw["n2"])
        x = x + (torch.nn.functional.silu(h @ lw["gate"].T) * (h @ lw["up"].T)) @ lw["down"].T
    logits = (rms(x, norm) @ head.T).float()[0]
    top = int(logits.argmax())  # a host sync
    best = float(logits.max())  # another one
    token = top if i % 7 else (top * 31 + i) % vocab  # never stuck on one token
    out.write(f"step {i} {token} {best.hex()}\n")
    i += 1
    time.sleep(a.pause)
out.write(f"weights {checksum()}\nend {i}\n")
