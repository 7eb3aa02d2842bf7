#!/bin/bash
#SBATCH --job-name=train
#SBATCH --gpucr=on                 # checkpoint on preemption and before the time limit
#SBATCH --gres=gpu:h100:1          # name the GPU model: a restore needs the same one
#SBATCH --time=1-00:00:00
#SBATCH --output=train-%j.out

# The program runs as it is; nothing in it knows about gpucr-hpc.
python train.py --config config.yaml
