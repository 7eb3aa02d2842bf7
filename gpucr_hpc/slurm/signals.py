"""The signals Slurm sends a job's processes. Standard library only: the root
helper (gpucr_hpc/privileged) imports it."""

import signal

# What Slurm sends the processes of a job's steps (scancel --signal, the end of a
# step, the time limit's warning); the first four end a step.
ENDING_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
TASK_SIGNALS = ENDING_SIGNALS | {signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM}
