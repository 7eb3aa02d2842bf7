"""A TCP connection dumped with its bytes in flight and restored on another address.

Real CRIU (4.2 or newer), real sockets, two network namespaces standing for two
nodes: a server and a client connected over node A's address stream numbered
words, the server reading slowly so that bytes wait in both queues. CRIU dumps
the tree inside A with its connections; gpucr_hpc.criu.tcp moves the image's
addresses to node B's; CRIU restores it inside B. The server must then read
every word once, in order, to the end: nothing lost, duplicated or reordered.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.criu import tcp

pytestmark = [pytest.mark.criu,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and CRIU need root here")]

NET = "10.251.77"
WORDS = 400_000  # 1.6 MB: more than the socket buffers hold

PAIR = r"""
import os, socket, struct, sys, time
addr, port, words, result = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
srv = socket.create_server((addr, port))
if os.fork() == 0:  # the client: words 0, 1, 2, ... as fast as the server takes them
    c = socket.create_connection((addr, port))
    for i in range(0, words, 1000):
        c.sendall(b"".join(struct.pack("!I", w) for w in range(i, min(i + 1000, words))))
    time.sleep(3600)
conn, _ = srv.accept()
want, buf = 0, b""
while want < words:
    time.sleep(0.005)  # slow (about 8 s in all): the queues stay full
    data = conn.recv(1024)
    if not data:
        break
    buf += data
    n = len(buf) // 4
    got = struct.unpack(f"!{n}I", buf[:4 * n])
    buf = buf[4 * n:]
    if list(got) != list(range(want, want + n)):
        bad = next(i for i, w in enumerate(got) if w != want + i)
        open(result, "w").write(f"bad at word {want + bad}: got {got[bad]}\n")
        sys.exit(1)
    want += n
open(result, "w").write(f"ok {want}\n")
"""


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def two_nodes():
    names = [f"gcrtcp{os.getpid()}-{n}" for n in "ab"]
    for i, ns in enumerate(names):
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{NET}.{i + 1}/32", "dev", "lo")  # the node's own address
    yield [(ns, f"{NET}.{i + 1}") for i, ns in enumerate(names)]
    for ns in names:
        _ip("netns", "del", ns, check=False)


def _criu_42():
    c = criu_mod.find_criu()
    if c.version[:2] < (4, 2):
        pytest.skip(f"CRIU {c.version_str} cannot dump TCP sockets on this kernel: 4.2 is needed")
    return c


def _in(ns):
    return ["nsenter", f"--net=/run/netns/{ns}", "--"]


def test_connection_with_bytes_in_flight_moves_to_another_address(two_nodes, tmp_path):
    criu = _criu_42()
    (a, addr_a), (b, addr_b) = two_nodes
    images, result = tmp_path / "images", tmp_path / "result"
    images.mkdir()
    script = tmp_path / "pair.py"
    script.write_text(PAIR)
    tree = subprocess.Popen(_in(a) + [sys.executable, str(script), addr_a, "4242", str(WORDS), str(result)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        time.sleep(1.0)  # connected, queues full, the server part way
        pids = criu_mod.process_tree(tree.pid)
        root = next(p for p in pids if Path(f"/proc/{p}/cmdline").read_bytes().startswith(sys.executable.encode()))
        assert not result.exists(), "the pair ended before the dump: make WORDS larger"
        d = subprocess.run(_in(a) + [criu.path, "dump", "-t", str(root), "-D", str(images), "-o", "dump.log",
                                     "-v4", "--tcp-established", "--network-lock", "nftables"],
                           capture_output=True, text=True, timeout=120)
        assert d.returncode == 0, (images / "dump.log").read_text()[-3000:]
        tree.wait(timeout=30)  # the launcher (nsenter) ends with the dumped tree
        assert criu_mod.wait_gone(pids), "the dumped tree still runs"  # its PIDs come back at the restore

        found = tcp.connections(images)
        established = [c for c in found if not c.listening]
        assert {c.local for c in established} == {f"{addr_a}:4242"} | {c.remote for c in established}
        assert any(c.listening and c.local == f"{addr_a}:4242" for c in found)
        assert tcp.move_addresses(images, {addr_a: addr_b}) == 5  # 2 x 2 established ends + the listener
        assert tcp.move_addresses(images, {f"{addr_b}:4242": addr_a}) == 3  # by end: the port-4242 ends
        assert tcp.move_addresses(images, {f"{addr_a}:4242": addr_b}) == 3
        assert {c.local.split(":")[0] for c in tcp.connections(images)} == {addr_b}

        # As a job's restore does it: in a new PID namespace (the tree's PIDs may be taken
        # here by now), CRIU in the node's network namespace.
        # As a job's restore does it: the moved connections locked in B's namespace before
        # CRIU runs (tcp/lock), let go once the tree runs. Without it, the first end
        # restored sends its unsent bytes to a peer not restored yet, which resets it.
        restore = ("import sys; from pathlib import Path; from gpucr_hpc.criu import run, tcp; "
                   "from gpucr_hpc.tcp import lock as netlock; "
                   "flows = [netlock.Flow(c.local, c.remote) for c in tcp.connections(Path(sys.argv[1])) "
                   "if not c.listening]; "
                   "r = run.find_criu().start_restore(Path(sys.argv[1]), Path(sys.argv[2]), shell_job=False, "
                   "new_pidns=True, extra=['--tcp-established', '--network-lock', 'nftables'], "
                   "lock=netlock.Spec('criu_tcp_test', flows, 60.0)); "
                   "netlock.unlock('criu_tcp_test'); print(r.host_pid)")
        work = tmp_path / "work"
        work.mkdir()
        r = subprocess.run(_in(b) + [sys.executable, "-c", restore, str(images), str(work)],
                           capture_output=True, text=True, timeout=180)
        log = work / "restore.log"
        assert r.returncode == 0, (r.stderr[-2000:], log.read_text()[-3000:] if log.exists() else "")
        deadline = time.monotonic() + 120
        while not result.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert result.exists(), "the restored server did not finish"
        assert result.read_text() == f"ok {WORDS}\n"
    finally:
        subprocess.run(["pkill", "-9", "-f", str(script)], capture_output=True)
        shutil.rmtree(images, ignore_errors=True)
