"""TCP connections of a job's ranks, below CRIU's own call: one end written as
text (end), the lock that holds a job's connections still while they are
dumped and restored (lock, nftables), and the flows a lock holds (flows)."""
