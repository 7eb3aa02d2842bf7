"""The TCP connections a lock holds (tcp/lock.py), as the lock, the root
helper and the restore pass them on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flow:
    """One TCP connection as this node's socket sees it: "addr:port" each,
    `10.0.0.1:4242` or `[fd00::1]:4242`."""

    local: str
    remote: str


@dataclass(frozen=True)
class Spec:
    """A lock to take: its name, its flows, and for how long at most."""

    name: str
    flows: list[Flow]
    expires_s: float
