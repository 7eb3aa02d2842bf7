"""Connections to outside the job under the close policy (--gpucr-outside=close).

The cut (which connections stay inside the job) with the policy of each unit,
and, with real CRIU, a client whose connection to a server outside the dumped
tree is restored closed: its next request fails, it connects again, and every
record it was told had arrived is on the server.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.criu import tcp
from gpucr_hpc.job.checkpoint.agent import tcp_plans
from gpucr_hpc.job.connections import connections
from gpucr_hpc.job.connections.connections import CLOSE, REFUSE, Socket


def _sockets(outside: str) -> list[Socket]:
    return [Socket("rank-0.0", "n1", "10.0.0.1:5000", "10.0.0.2:40000"),
            Socket("rank-0.1", "n2", "10.0.0.2:40000", "10.0.0.1:5000"),
            Socket("rank-0.0", "n1", "10.0.0.1:41000", "192.0.2.7:443", outside=outside)]


def test_a_connection_to_outside_is_refused_by_default():
    cut = connections.cut(_sockets(REFUSE))
    assert cut.closed == [] and [s.remote for s in cut.foreign] == ["192.0.2.7:443"]
    why = cut.refusal()
    assert why and "10.0.0.1:41000 -> 192.0.2.7:443" in why and "--gpucr-outside=close" in why


def test_under_close_it_is_listed_apart_and_neither_moved_nor_locked():
    socks = _sockets(CLOSE)
    cut = connections.cut(socks)
    assert cut.refusal() is None and [s.remote for s in cut.closed] == ["192.0.2.7:443"]
    plan = tcp_plans([s for s in socks if s.unit == "rank-0.0"], cut)["rank-0.0"]
    assert plan["closed"] == [["10.0.0.1:41000", "192.0.2.7:443"]]
    assert plan["links"] == [["10.0.0.1:5000", "10.0.0.2:40000"]], "the restore locks only the job's own"
    assert "10.0.0.1:41000" not in plan["ends"], "a closed socket's end does not move"
    assert plan["lock"] == "skip", "its dump still holds it still, with the job's connections"


def test_a_bad_connection_to_close_is_one_line(tmp_path):
    from gpucr_hpc.errors import GpucrError

    with pytest.raises(GpucrError) as e:
        tcp.close_connections(tmp_path, [("10.0.0.1", "nowhere")])
    assert "bad connection to close" in e.value.one_line()


# --- with CRIU ------------------------------------------------------------------

NET = "10.251.78.1"
RECORDS = 400

# Acks each record line "rec N" with "ok N", and logs what it got, one line each.
SERVER = r"""
import socket, sys, threading
addr, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
srv = socket.create_server((addr, port))
def serve(conn):
    f = conn.makefile("rwb")
    for line in f:
        with open(log, "ab") as out:
            out.write(line)
        f.write(b"ok " + line.split()[1] + b"\n")
        f.flush()
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

# Sends records one at a time, each once acked; on a failed connection it connects
# again and sends the record it had no answer for, as an HTTP client with retries does.
CLIENT = r"""
import socket, sys, time
addr, port, n, done = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
reconnects, conn = 0, None
i = 0
while i < n:
    try:
        if conn is None:
            conn = socket.create_connection((addr, port), timeout=10)
            f = conn.makefile("rwb")
        f.write(b"rec %d\n" % i)
        f.flush()
        answer = f.readline()
        if answer != b"ok %d\n" % i:
            raise ConnectionError(f"answer {answer!r}")
        i += 1
        time.sleep(0.01)
    except OSError:
        reconnects += 1
        conn = None
        time.sleep(0.1)
open(done, "w").write(f"{i} {reconnects}\n")
"""


def _in_netns(ns):
    return ["nsenter", f"--net=/run/netns/{ns}", "--"]


@pytest.fixture
def node():
    ns = f"gcrout{os.getpid()}"
    ip = ["ip", "-n", ns]
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    subprocess.run(ip + ["link", "set", "lo", "up"], check=True, capture_output=True)
    subprocess.run(ip + ["addr", "add", f"{NET}/32", "dev", "lo"], check=True, capture_output=True)
    yield ns
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.criu
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and CRIU need root here")
def test_a_closed_connection_is_reconnected_and_nothing_acked_is_lost(node, tmp_path):
    criu = criu_mod.find_criu()
    if criu.version[:2] < (4, 2):
        pytest.skip(f"CRIU {criu.version_str} cannot dump TCP sockets on this kernel: 4.2 is needed")
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "client.py").write_text(CLIENT)
    log, done, images, work = (tmp_path / n for n in ("got", "done", "images", "work"))
    images.mkdir()
    work.mkdir()
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
             "start_new_session": True}
    server = subprocess.Popen(_in_netns(node) + [sys.executable, str(tmp_path / "server.py"), NET, "8080",
                                                 str(log)], **quiet)
    client = None
    try:
        time.sleep(0.5)
        client = subprocess.Popen(_in_netns(node) + [sys.executable, str(tmp_path / "client.py"), NET, "8080",
                                                     str(RECORDS), str(done)], **quiet)
        time.sleep(1.0)  # part way through its records
        root = next(p for p in criu_mod.process_tree(client.pid)
                    if Path(f"/proc/{p}/cmdline").read_bytes().startswith(sys.executable.encode()))
        assert not done.exists(), "the client ended before the dump: make RECORDS larger"
        d = subprocess.run(_in_netns(node) + [criu.path, "dump", "-t", str(root), "-D", str(images),
                                              "-o", "dump.log", "-v4", "--tcp-established",
                                              "--network-lock", "nftables"],
                           capture_output=True, text=True, timeout=120)
        assert d.returncode == 0, (images / "dump.log").read_text()[-3000:]
        client.wait(timeout=30)
        (conn,) = [c for c in tcp.connections(images) if not c.listening]
        assert conn.remote == f"{NET}:8080"

        restore = ("import sys; from pathlib import Path; from gpucr_hpc.criu import run; "
                   "r = run.find_criu().start_restore(Path(sys.argv[1]), Path(sys.argv[2]), shell_job=False, "
                   "new_pidns=True, tcp=True, closed=[(sys.argv[3], sys.argv[4])]); print(r.host_pid)")
        r = subprocess.run(_in_netns(node) + [sys.executable, "-c", restore, str(images), str(work),
                                              conn.local, conn.remote],
                           capture_output=True, text=True, timeout=180)
        rlog = work / "restore.log"
        assert r.returncode == 0, (r.stderr[-2000:], rlog.read_text()[-3000:] if rlog.exists() else "")
        assert [c.state for c in tcp.connections(work / "moved-images")] == ["CLOSE"]
        assert [c.state for c in tcp.connections(images)] == ["ESTABLISHED"], "the image itself is unchanged"
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert done.exists(), "the restored client did not finish"
        sent, reconnects = map(int, done.read_text().split())
        assert sent == RECORDS and reconnects >= 1, done.read_text()
        got = [int(line.split()[1]) for line in log.read_text().splitlines()]
        assert set(got) == set(range(RECORDS)), "every record the client was told had arrived is there"
        assert len(got) - len(set(got)) <= 1, "only the one record in flight at the dump may come twice"
    finally:  # the server, the client, and its restored tree (whose command lines name tmp_path)
        subprocess.run(["pkill", "-9", "-f", str(tmp_path)], capture_output=True)
        for p in (client, server):
            if p is not None:
                p.wait(timeout=30)
