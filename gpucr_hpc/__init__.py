"""gpucr-hpc: transparent GPU checkpoint/restore for Slurm clusters."""

__version__ = "0.1.0"
