"""Which GPU pairs does the driver accept for a process that sees only GPU 0
(CUDA_VISIBLE_DEVICES=0)? One fresh process per variant: lock + checkpoint in
place, restore with the pairs, unlock, and see that it computes on."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from gpucr_hpc.gpu.driver_nvidia import NvidiaDriver

CHILD = r"""
import torch, time, sys
x = torch.arange(1 << 24, device="cuda", dtype=torch.float32)
print("ready", torch.cuda.get_device_name(0), flush=True)
for line in sys.stdin:
    print("sum", float(x.sum()), torch.cuda.current_device(), flush=True)
"""
smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout
u = [ln.split(",")[1].strip() for ln in smi.strip().splitlines()]
variants = {"only_visible_0to1": [(u[0], u[1])],
            "permutation_0to1_1to0": [(u[0], u[1]), (u[1], u[0])],
            "identity_both": [(u[0], u[0]), (u[1], u[1])]}
d = NvidiaDriver()
out = {}
for name, pairs in variants.items():
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"))
    p.stdout.readline()
    p.stdin.write("\n")
    p.stdin.flush()
    before = p.stdout.readline().strip()
    rec = {"before": before}
    try:
        d.lock(p.pid, 10000)
        d.checkpoint(p.pid)
        t = time.monotonic()
        d.restore(p.pid, pairs)
        d.unlock(p.pid)
        rec["restore_s"] = round(time.monotonic() - t, 3)
        p.stdin.write("\n")
        p.stdin.flush()
        rec["after"] = p.stdout.readline().strip()
        rec["mem"] = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"],
                                    capture_output=True, text=True).stdout.strip().splitlines()
    except Exception as e:
        rec["error"] = str(e)
    p.kill()
    p.wait()
    out[name] = rec
    print(name, json.dumps(rec), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "remap-probe.json"), "w"), indent=1)
