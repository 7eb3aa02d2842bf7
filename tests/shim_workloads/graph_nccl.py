"""Ranks that all-reduce inside a captured CUDA graph (torch.cuda.graph), launched
by torchrun: what a checkpoint refuses, since the graph holds NCCL's work on the
communicator it was captured with, which a rebuild cannot put back.

python3 graph_nccl.py STEPS PACE_S
Every rank prints `rank R step I SUM` per step (SUM: the world size, each rank
adding 1) and `rank R done` at the end."""
import os
import sys
import time

import torch
import torch.distributed as dist


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write: the ranks share the launcher's stdout


steps, pace = int(sys.argv[1]), float(sys.argv[2])
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)  # the communicator is made outside the capture
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    dist.all_reduce(x)  # warm-up on the stream the capture uses
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    dist.all_reduce(x)
for i in range(steps):
    x.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    say(f"rank {rank} step {i} {x[0].item():g}")
    time.sleep(pace)
say(f"rank {rank} done")
del graph  # NCCL's captured work goes before its communicator
torch.cuda.synchronize()
dist.destroy_process_group()
