#!/bin/bash
#SBATCH --job-name=sweep
#SBATCH --gpucr=on
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:h100:2          # two GPUs per node: one per rank
#SBATCH --time=12:00:00
#SBATCH --output=sweep-%j.out

# Four independent ranks: each works on its own share of the inputs and
# never talks to another rank (rank r uses GPU $SLURM_LOCALID of its node).
# One srun step at a time.
echo "start on $(hostname), restart count ${SLURM_RESTART_COUNT:-0}"
srun python sweep.py --shard "$SLURM_PROCID" --shards "$SLURM_NTASKS"
echo "all ranks done: exit $?"
