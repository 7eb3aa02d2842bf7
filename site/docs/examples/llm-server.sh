#!/bin/bash
#SBATCH --job-name=llm-batch-server
#SBATCH --gpucr=on
#SBATCH --gres=gpu:h100:1
#SBATCH --time=2-00:00:00
#SBATCH --output=llm-%j.out

# Requests are files in a shared spool directory, not TCP connections:
# a connection to a client outside the job would make the checkpoint refused.
SPOOL=/lustre/$USER/llm-spool
mkdir -p "$SPOOL/in" "$SPOOL/out"
export HF_HUB_OFFLINE=1   # the model from disk; no connection to a model hub stays open
python serve_llm.py --model /models/llama-3.1-8b-instruct --spool "$SPOOL"
