"""The restore after a requeue: the batch step, the ranks, where each unit comes from."""
