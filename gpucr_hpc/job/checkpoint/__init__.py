"""The job checkpoint: the coordinator, one agent per node, and their progress."""
