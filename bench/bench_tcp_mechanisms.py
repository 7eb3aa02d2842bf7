#!/usr/bin/env python3
"""The two known ways to keep TCP connections across a checkpoint, measured side by side.

Issue: the connections between a job's ranks must survive a checkpoint and a
restore on other nodes. Two ways are known (../shared/DESIGN.md, "Jobs whose
ranks talk"); gpucr-hpc builds the CRIU way. This benchmark measures, in one
run on this machine, what each costs for the same connections:

  criu   CRIU's TCP repair, as gpucr-hpc runs it for connections between
         ranks: the connections locked (gpucr_hpc.tcp.lock, nftables), the
         tree dumped with `--tcp-established --network-lock skip` (queues and
         sequence numbers), unlocked; in place (`--leave-running`), and for a
         restore: dumped, its addresses moved to another network namespace's
         (gpucr_hpc.criu.tcp, the pycriu rewrite of files.img), locked there,
         restored with `--tcp-established`, unlocked. The same tree with no
         connections is dumped and restored alike (no lock): the difference is
         what the connections cost.
  dmtcp  the DMTCP way, prototyped in Python on the same connections: each end
         sends a marker and reads up to its peer's (the drain: in-flight bytes
         move into the process), then every connection is made again (listen,
         connect, a connection id exchanged, dup2 onto the old descriptor),
         and the drained bytes go back where they were (sent to the peer and
         back, as DMTCP's refill does). What it leaves out: the interposition
         of every socket call while the job runs (socket, bind, connect,
         accept, dup, fork, close) that the shim would need to know each
         connection's two ends, and the name service round trip between nodes
         (here both ends share one host).

Both run in network namespaces of their own (`ip netns`), with K connections
(both ends in one process tree) and B bytes in flight each way on each. As
root, with CRIU 4.2 (scripts/install-deps):

    python3 bench/bench_tcp_mechanisms.py --repeat 5 --out bench/results/tcp-mechanisms.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.record import utc_now, write_record  # noqa: E402
from common.stats import per_key  # noqa: E402

from gpucr_hpc.criu import procfs  # noqa: E402
from gpucr_hpc.criu import run as criu_mod  # noqa: E402
from gpucr_hpc.criu import tcp as criu_tcp  # noqa: E402

NET = "10.251.91"

# K connections inside one process (`pairs`), B bytes queued each way on each.
CONNECTED = r"""
import socket, sys, time
addr, k, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.create_server((addr, 0), backlog=max(k, 1))
pairs = []
for _ in range(k):
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    pairs.append((c, s))
for c, s in pairs:
    for x in (c, s):
        x.setblocking(False)
        left = b
        while left:
            try:
                left -= x.send(b"x" * min(left, 65536))
            except BlockingIOError:
                break
"""

# ... then it says so and waits: the tree CRIU dumps.
HOLDER = CONNECTED + r"""
open(sys.argv[4], "w").write("ok")
time.sleep(3600)
"""


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def netns(name: str, addr: str) -> list[str]:
    ip("netns", "del", name, check=False)
    ip("netns", "add", name)
    ip("-n", name, "link", "set", "lo", "up")
    ip("-n", name, "addr", "add", f"{addr}/32", "dev", "lo")
    return ["nsenter", f"--net=/run/netns/{name}", "--"]


def start_holder(enter: list[str], addr: str, k: int, b: int, tmp: Path) -> subprocess.Popen:
    ready = tmp / f"ready-{time.monotonic_ns()}"
    script = tmp / "holder.py"
    script.write_text(HOLDER)
    p = subprocess.Popen(enter + [sys.executable, str(script), addr, str(k), str(b), str(ready)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if time.monotonic() > deadline or p.poll() is not None:
            raise SystemExit(f"the holder with {k} connections did not start")
        time.sleep(0.02)
    return p


def holder_pid(launcher: subprocess.Popen) -> int:
    return next(p for p in criu_mod.process_tree(launcher.pid)
                if Path(f"/proc/{p}/cmdline").read_bytes().startswith(sys.executable.encode()))


LOCK = ("import json, sys; from gpucr_hpc.tcp import lock as netlock; a = json.loads(sys.argv[1]); "
        "netlock.lock(a[0], [netlock.Flow(*f) for f in a[1]]) if a[1] is not None else netlock.unlock(a[0])")


def nft(enter: list[str], flows: list | None) -> None:
    """Lock `flows` (None: unlock) in the namespace, as the job's agents do in their node's."""
    subprocess.run(enter + [sys.executable, "-c", LOCK, json.dumps(["bench", flows])], check=True,
                   cwd=REPO, timeout=60)


def criu_run(enter: list[str], criu, flows: list, args: list[str], work: Path) -> float:
    """criu ARGS in the namespace, its connections locked around it; seconds taken."""
    tcp = ["--tcp-established"] + (["--network-lock", "skip"] if args[0] == "dump" else []) if flows else []
    t = time.monotonic()
    if flows:
        nft(enter, flows)
    r = subprocess.run(enter + [criu.path, *args, "-o", "criu.log", "-W", str(work), *tcp],
                       capture_output=True, text=True, timeout=300)
    if flows:
        nft(enter, None)
    took = time.monotonic() - t
    if r.returncode != 0:
        raise SystemExit(f"criu {args[0]} failed: {(work / 'criu.log').read_text()[-1500:]}")
    return took


def criu_way(k: int, b: int, ns: tuple, tmp: Path) -> dict:
    """In-place dump, then dump + move + restore in the other namespace."""
    (enter_a, addr_a), (enter_b, addr_b) = ns
    criu = criu_mod.find_criu()
    out: dict = {}
    holder = start_holder(enter_a, addr_a, k, b, tmp)
    try:
        pid = holder_pid(holder)
        flows = [[local, remote] for local, remote, state, _ in procfs.tcp_sockets(pid) if state == procfs.ESTABLISHED]
        images = Path(tempfile.mkdtemp(dir=tmp))
        out["checkpoint_in_place_s"] = criu_run(
            enter_a, criu, flows, ["dump", "-t", str(pid), "-D", str(images), "--leave-running"], images)
        shutil.rmtree(images)
        images = Path(tempfile.mkdtemp(dir=tmp))
        out["dump_s"] = criu_run(enter_a, criu, flows, ["dump", "-t", str(pid), "-D", str(images)], images)
        holder.wait(timeout=30)
        t = time.monotonic()
        moved = criu_tcp.move_addresses(images, {addr_a: addr_b})
        out["move_addresses_s"] = time.monotonic() - t
        out["ends_moved"] = moved
        flows_b = [[c.local, c.remote] for c in criu_tcp.connections(images) if not c.listening]
        pidfile = images / "restored.pid"
        out["restore_s"] = criu_run(enter_b, criu, flows_b, ["restore", "-D", str(images), "-d",
                                                             "--pidfile", str(pidfile)], images)
        subprocess.run(["kill", "-9", pidfile.read_text().strip()], capture_output=True)
    finally:
        holder.kill()
    return out


DMTCP = CONNECTED + r"""
import json, os, select
MARK = b"\x00gpucr-drain-marker\x00"
ends = [x for pair in pairs for x in pair]
t0 = time.monotonic()
# 1. Drain: every end sends a marker after what it has queued, and reads up to its peer's.
for x in ends:
    x.setblocking(True)
    x.sendall(MARK)  # after the bytes still in its send queue: TCP keeps the order
    x.setblocking(False)
drained = {x: bytearray() for x in ends}
open_ends = set(ends)
while open_ends:
    r, _, _ = select.select(list(open_ends), [], [], 10)
    if not r:
        raise SystemExit("drain timed out")
    for x in r:
        drained[x] += x.recv(1 << 20)
        if drained[x].endswith(MARK):
            del drained[x][-len(MARK):]
            open_ends.discard(x)
t1 = time.monotonic()
# 2. Reconnect: a new connection per pair, its id sent over it, dup2 onto the old descriptors.
for i, (c, s) in enumerate(pairs):
    nc = socket.create_connection(srv.getsockname())
    ns, _ = srv.accept()
    nc.sendall(i.to_bytes(4, "big"))
    assert int.from_bytes(ns.recv(4), "big") == i
    os.dup2(nc.fileno(), c.fileno())
    os.dup2(ns.fileno(), s.fileno())
    nc.close()
    ns.close()
t2 = time.monotonic()
# 3. Refill: each end's drained bytes go to its peer and back, into its receive queue.
moved = 0
for c, s in pairs:
    for mine, peer in ((c, s), (s, c)):
        data = bytes(drained[mine])
        mine.setblocking(True)
        peer.setblocking(True)
        mine.sendall(len(data).to_bytes(8, "big") + data)
        n = int.from_bytes(peer.recv(8, socket.MSG_WAITALL), "big")
        back = peer.recv(n, socket.MSG_WAITALL) if n else b""
        peer.sendall(back)
        got = mine.recv(n, socket.MSG_WAITALL) if n else b""
        assert got == data
        moved += 2 * n
t3 = time.monotonic()
print(json.dumps({"drain_s": t1 - t0, "reconnect_s": t2 - t1, "refill_s": t3 - t2,
                  "bytes_drained": sum(len(v) for v in drained.values()), "bytes_refilled": moved}))
"""


def dmtcp_way(k: int, b: int, ns: tuple, tmp: Path) -> dict:
    (enter_a, addr_a), _ = ns
    script = tmp / "dmtcp.py"
    script.write_text(DMTCP)
    r = subprocess.run(enter_a + [sys.executable, str(script), addr_a, str(k), str(b)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"the DMTCP-way prototype failed: {r.stderr[-1500:]}")
    out = json.loads(r.stdout)
    out["total_s"] = out["drain_s"] + out["reconnect_s"] + out["refill_s"]
    return out


def median_of(runs: list[dict]) -> dict:
    """The median of each timing (the float figures) over the runs."""
    return per_key(runs, keys=[k for k, v in runs[0].items() if isinstance(v, float)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--connections", default="9,64", help="K values, comma-separated (the 4-rank gloo job has 9)")
    p.add_argument("--bytes", default="0,1048576", help="bytes in flight each way per connection")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default=str(REPO / "bench/results/tcp-mechanisms.json"))
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_tcp_mechanisms: needs root (network namespaces, CRIU)", file=sys.stderr)
        return 1
    criu = criu_mod.find_criu()
    tag = os.getpid()
    ns = ((netns(f"gcrbench{tag}a", f"{NET}.1"), f"{NET}.1"), (netns(f"gcrbench{tag}b", f"{NET}.2"), f"{NET}.2"))
    tmp = Path(tempfile.mkdtemp(prefix="gpucr-bench-tcp-"))
    records = []
    try:
        for b in [int(x) for x in args.bytes.split(",")]:
            base = median_of([criu_way(0, 0, ns, tmp) for _ in range(args.repeat)])
            for k in [int(x) for x in args.connections.split(",")]:
                criu_runs = [criu_way(k, b, ns, tmp) for _ in range(args.repeat)]
                dmtcp_runs = [dmtcp_way(k, b, ns, tmp) for _ in range(args.repeat)]
                c, d = median_of(criu_runs), median_of(dmtcp_runs)
                rec = {
                    "connections": k, "bytes_in_flight_each_way": b, "repeat": args.repeat,
                    "criu": {**c, "checkpoint_added_s": c["checkpoint_in_place_s"] - base["checkpoint_in_place_s"],
                             "restore_added_s": c["restore_s"] - base["restore_s"] + c["move_addresses_s"],
                             "no_connections": base, "runs": criu_runs},
                    "dmtcp": {**d, "checkpoint_added_s": d["drain_s"],
                              "restore_added_s": d["reconnect_s"] + d["refill_s"], "runs": dmtcp_runs},
                }
                records.append(rec)
                print(f"K={k:3d} B={b:8d}  criu: checkpoint +{rec['criu']['checkpoint_added_s'] * 1e3:7.1f} ms, "
                      f"restore +{rec['criu']['restore_added_s'] * 1e3:7.1f} ms   "
                      f"dmtcp: drain {d['drain_s'] * 1e3:7.1f} ms, reconnect {d['reconnect_s'] * 1e3:6.1f} ms, "
                      f"refill {d['refill_s'] * 1e3:7.1f} ms", flush=True)
    finally:
        for (enter, _addr) in ns:
            ip("netns", "del", enter[1].rsplit("/", 1)[1], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"benchmark": "tcp-mechanisms", "date": utc_now(),
           "machine": {"host_cpus": os.cpu_count(), "kernel": platform.release(),
                       "load": os.getloadavg()[0]},
           "criu_version": criu.version_str, "records": records}
    write_record(args.out, doc)
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
