"""The connections between a job's ranks: what moves with them, and their ends after a restore."""
