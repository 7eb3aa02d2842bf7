"""The lock on a job's TCP connections, held across the CRIU runs of all its nodes.

Each node's ranks are dumped by their own CRIU run, so CRIU's per-run network
lock leaves a connection open while its peer on another node is already being
dumped (or is still running): bytes move, or a RST reaches the peer, and the two
images disagree. So every node locks the job's connections before the first
dump and unlocks them only after the last (CRIU then runs with
`--network-lock skip`); at a restore, the restored sockets stay locked until
every rank is back.

A lock is one nftables table, `inet gpucr_<name>`, with chains at the input and
output hooks (priority raw, before conntrack) that drop every packet of each
flow, both ways, until a deadline (`meta time`): a holder that dies cannot
stall the job's connections for longer. TCP sees only loss: nothing is reset, and what was sent while
locked is retransmitted after the unlock. It is made in one `nft -f -`
transaction, so a lock is all there or not at all.

Everything runs in the calling process's network namespace (the agent runs in
its node's). An ordinary user locks through the root helper, which checks that
each flow is the caller's (a socket a process of theirs holds, a connection of
their sealed image, or a flow their lock of that name already drops) and names
the table after the caller's uid, so no user can lock or unlock another's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time

from gpucr_hpc import config
from gpucr_hpc.criu.processes import system_tool
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.tcp import end as tcp_end
from gpucr_hpc.tcp.flows import Flow as Flow
from gpucr_hpc.tcp.flows import Spec as Spec

INSTALL_FIX = "run scripts/install-deps (as root): it installs nft with CRIU 4.2"
TABLE_PREFIX = "gpucr_"
_NAME = re.compile(r"[A-Za-z0-9_]+")
_TIMEOUT_S = 30
EXPIRES_S = 900.0  # longer than any checkpoint or restore the lock covers


def nft_command() -> list[str]:
    """The nft to run: the one installed with CRIU, else the system's."""
    wrapper = config.installed("bin", "gpucr-nft")
    if os.access(wrapper, os.X_OK):
        return [wrapper]
    try:
        return [system_tool("nft")]
    except GpucrError:
        raise GpucrError(f"nft (nftables) is not installed: neither {wrapper} nor a system nft exists",
                         INSTALL_FIX) from None


def lock(name: str, flows: list[Flow], expires_s: float = EXPIRES_S) -> None:
    """Drop every packet of `flows`, both ways, until unlock(name) or for
    `expires_s` seconds at most: a lock whose holder died must not stall the
    job's connections for ever. Locking a name again replaces its flows."""
    if os.geteuid() != 0:
        from gpucr_hpc.criu import root_helper

        return root_helper.lock(name, flows, expires_s)
    table = _table(name)
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() + expires_s))
    out_rules, in_rules = [], []
    for flow in flows:
        local, remote = _endpoint(flow.local), _endpoint(flow.remote)
        if local[0].version != remote[0].version:
            raise GpucrError(f"connection {flow.local} -> {flow.remote} mixes IPv4 and IPv6",
                             "give both ends of a connection in the same family")
        out_rules.append(f'        meta time < "{until}" {_match(local, remote)} drop')
        in_rules.append(f'        meta time < "{until}" {_match(remote, local)} drop')
    # The empty table first makes the delete succeed when none existed: one
    # transaction that replaces an old lock or makes a new one.
    text = "\n".join([
        f"table inet {table} {{}}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        "    chain output {",
        "        type filter hook output priority raw; policy accept;",
        *out_rules,
        "    }",
        "    chain input {",
        "        type filter hook input priority raw; policy accept;",
        *in_rules,
        "    }",
        "}",
        "",
    ])
    _nft(["-f", "-"], f"cannot lock the TCP connections of {name}", stdin=text)


def _exists(table: str) -> bool:
    out = _run(["-j", "list", "tables", "inet"])
    if out.returncode != 0:
        raise _error("cannot list the nftables tables", out.stderr)
    return any((item.get("table") or {}).get("name") == table
               for item in json.loads(out.stdout).get("nftables", []))


class Lease:
    """A lock held while its holder lives: renewed every third of `lease_s` by a
    thread, so it lapses within `lease_s` of the holder's death however long the
    work it covers takes. As a context manager: locked on entry (unless `taken`:
    the work it covers takes it, e.g. a restore), unlocked on exit."""

    def __init__(self, name: str, flows: list[Flow], lease_s: float, taken: bool = False):
        self.name, self.flows, self.lease_s, self.taken = name, flows, lease_s, taken
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def spec(self) -> Spec:
        return Spec(self.name, self.flows, self.lease_s)

    def __enter__(self) -> Lease:
        if not self.taken:
            lock(self.name, self.flows, self.lease_s)
        self._thread = threading.Thread(target=self._renew, daemon=True, name=f"lease-{self.name}")
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                lock(self.name, self.flows, self.lease_s)  # one transaction: never a gap
            except GpucrError:
                pass  # the lease runs out, as if its holder had died

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        unlock(self.name)


def unlock(name: str) -> bool:
    """Let the flows of `name` through again. True if it was locked."""
    if os.geteuid() != 0:
        from gpucr_hpc.criu import root_helper

        return root_helper.unlock(name)
    table = _table(name)
    if not _exists(table):
        return False
    out = _run(["delete", "table", "inet", table])
    if out.returncode != 0:
        raise _error(f"cannot unlock the TCP connections of {name}", out.stderr)
    return True


def locked(name: str) -> list[Flow]:
    """The flows `name` locks now, as this node's sockets see them (from the
    output chain: saddr/sport is the local end); [] when it locks none."""
    table = _table(name)
    if not _exists(table):
        return []
    out = _run(["-j", "list", "table", "inet", table])
    if out.returncode != 0:
        raise _error(f"cannot list the locked TCP connections of {name}", out.stderr)
    flows = []
    for item in json.loads(out.stdout).get("nftables", []):
        rule = item.get("rule")
        if not rule or rule.get("chain") != "output":
            continue
        seen = {}
        for expr in rule.get("expr", []):
            match = expr.get("match")
            payload = match and match.get("left", {}).get("payload")
            if payload:
                seen[payload["field"]] = match["right"]
        flows.append(Flow(tcp_end.text(seen["saddr"], seen["sport"]), tcp_end.text(seen["daddr"], seen["dport"])))
    return flows


def _table(name: str) -> str:
    # The name becomes part of nft's ruleset text: nothing but a plain word.
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise GpucrError(f"bad lock name {name!r}: only letters, digits and _ are allowed",
                         "name the lock after the job, e.g. job123")
    return TABLE_PREFIX + name


def _endpoint(text: str) -> tuple[tcp_end.Address, int]:
    addr, port = tcp_end.parse(text)
    if port == 0:  # a flow is between two bound ends; 0 would match nothing
        raise GpucrError(f"bad connection end {text!r}: port 0", "write it as 10.0.0.1:4242 or [fd00::1]:4242")
    return addr, port


def _match(src, dst) -> str:
    ip = "ip" if src[0].version == 4 else "ip6"
    return f"{ip} saddr {src[0]} tcp sport {src[1]} {ip} daddr {dst[0]} tcp dport {dst[1]}"


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    if os.geteuid() != 0:  # lock and unlock go through the root helper; the rest is root's
        raise GpucrError("reading the nftables lock needs root (CAP_NET_ADMIN)", "run it as root")
    cmd = nft_command() + args
    try:
        # TZ: the expiry is written in UTC, and nft reads dates in its own zone
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=_TIMEOUT_S,
                              env={**os.environ, "TZ": "UTC"})
    except subprocess.TimeoutExpired:
        raise GpucrError(f"{cmd[0]} did not answer within {_TIMEOUT_S} s", INSTALL_FIX) from None
    except OSError as e:
        raise GpucrError(f"cannot run {cmd[0]}: {e.strerror}", INSTALL_FIX) from e


def _nft(args: list[str], what: str, stdin: str | None = None) -> None:
    out = _run(args, stdin)
    if out.returncode != 0:
        raise _error(what, out.stderr)


def _error(what: str, stderr: str) -> GpucrError:
    first = next((line.strip() for line in stderr.splitlines() if line.strip()), "no message")
    return GpucrError(f"{what}: nft: {first}", "")
