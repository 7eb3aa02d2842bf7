"""Answers every prompt file in SPOOL/in with a file in SPOOL/out. Runs until killed."""
import argparse
import os
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--spool", type=Path, required=True)
a = ap.parse_args()
tok = AutoTokenizer.from_pretrained(a.model)
model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16).to("cuda")

while True:
    for req in sorted((a.spool / "in").glob("*.txt")):
        out = a.spool / "out" / req.name
        if out.exists():
            continue
        ids = tok(req.read_text(), return_tensors="pt").to("cuda")
        answer = tok.decode(model.generate(**ids, max_new_tokens=256)[0], skip_special_tokens=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(answer)
        os.replace(tmp, out)  # a request answered again after a restore replaces the same file
    time.sleep(1)
