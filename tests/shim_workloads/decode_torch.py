"""A deterministic PyTorch decode loop, shaped like LLM serving: a small bf16
transformer, a KV cache on the GPU, and every step a `.tolist()` and a `float()`
of the logits (two host syncs) and a 50 ms sleep.

python3 decode_torch.py STEPS CACHE_GIB OUT
Appends `step I TOKEN TOP5 LOGIT_HEX` per step and `checksum HEX` at the end to OUT
(a file: a restored process keeps writing to it, which a pipe would not allow)."""
import hashlib
import sys
import time

import torch

steps, cache_gib, out_path = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
out = open(out_path, "a", buffering=1)
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dev, dt = "cuda", torch.bfloat16
layers, heads, hd, vocab = 4, 8, 64, 8192
dim = heads * hd
max_len = max(steps + 1, int(cache_gib * 2**30) // (layers * 2 * heads * hd * 2))
emb = torch.randn(vocab, dim, device=dev, dtype=dt) * 0.05
wqkv = [torch.randn(dim, 3 * dim, device=dev, dtype=dt) * 0.05 for _ in range(layers)]
wo = [torch.randn(dim, dim, device=dev, dtype=dt) * 0.05 for _ in range(layers)]
head = torch.randn(dim, vocab, device=dev, dtype=dt) * 0.05
cache = torch.zeros(layers, 2, max_len, heads, hd, device=dev, dtype=dt)  # the KV cache
token = 1
for i in range(steps):
    x = emb[token][None]
    for li in range(layers):
        q, k, v = (x @ wqkv[li]).view(3, heads, hd)
        cache[li, 0, i], cache[li, 1, i] = k, v
        keys, vals = cache[li, 0, :i + 1], cache[li, 1, :i + 1]
        att = torch.softmax((keys.float() * q.float()).sum(-1) / hd ** 0.5, dim=0)
        ctx = (att[..., None] * vals.float()).sum(0).to(dt).reshape(1, dim)
        x = x + ctx @ wo[li]
    logits = (x @ head).float()[0]
    top = torch.topk(logits, 5).indices.tolist()  # a host sync
    best = float(logits.max())                     # another one
    token = top[0] if i % 7 else (top[0] * 31 + i) % vocab  # never stuck on one token
    out.write(f"step {i} {token} {top} {best.hex()}\n")
    time.sleep(0.05)
h = hashlib.sha256(cache[:, :, :steps].float().cpu().numpy().tobytes())
out.write(f"checksum {h.hexdigest()}\n")
