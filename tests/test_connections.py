"""Which of a job's TCP connections stay inside it (gpucr_hpc.job.connections.connections).

Real processes with real sockets stand for a job's units: a server rank and a
client rank connected to each other, a rank whose two ends are both its own,
and a rank connected to a server outside the job.
"""

import socket
import subprocess
import sys
import time

import pytest

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.job.connections import connections

SERVER = r"""
import socket, sys, time
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
time.sleep(60)
"""
CLIENT = r"""
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", flush=True)
time.sleep(60)
"""
SELF = r"""
import socket, time
srv = socket.create_server(("127.0.0.1", 0))
c = socket.create_connection(srv.getsockname())
conn, _ = srv.accept()
print("connected", flush=True)
time.sleep(60)
"""


@pytest.fixture
def procs():
    started = []

    def start(code, *args):
        p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
        started.append(p)
        return p, p.stdout.readline().strip()

    yield start
    for p in started:
        p.kill()
        p.wait()


def _sockets(unit, p):
    deadline = time.monotonic() + 5
    while True:
        found = connections.unit_sockets(unit, "n1", criu_mod.process_tree(p.pid))
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_two_ranks_connected_to_each_other_are_one_connection_between_units(procs):
    server, port = procs(SERVER)
    client, _ = procs(CLIENT, port)
    time.sleep(0.2)  # the server accepted
    found = _sockets("rank-0.0", server) + _sockets("rank-0.1", client)
    assert any(s.listening and s.local == f"127.0.0.1:{port}" for s in found)
    c = connections.cut(found)
    assert c.foreign == [] and c.refusal() is None
    assert len(c.between_units) == 1
    a, b = c.between_units[0]
    assert {a.unit, b.unit} == {"rank-0.0", "rank-0.1"} and a.local == b.remote and b.local == a.remote


def test_a_connection_within_one_unit_needs_nothing(procs):
    p, _ = procs(SELF)
    c = connections.cut(_sockets("batch", p))
    assert c.between_units == [] and c.foreign == []


def test_a_connection_to_a_server_outside_the_job_is_refused_naming_both_ends(procs):
    outside = socket.create_server(("127.0.0.1", 0))
    try:
        port = outside.getsockname()[1]
        client, _ = procs(CLIENT, str(port))
        conn, _ = outside.accept()
        c = connections.cut(_sockets("rank-3.1", client))
        assert c.between_units == [] and len(c.foreign) == 1
        line = c.refusal()
        assert line is not None and "\n" not in line
        assert "rank-3.1 on n1" in line and f"-> 127.0.0.1:{port}" in line and "not a process of this job" in line
        conn.close()
    finally:
        outside.close()


def test_loopback_ends_in_two_network_namespaces_are_not_one_connection():
    a = connections.Socket("rank-0.0", "n1", "127.0.0.1:5000", "127.0.0.1:40000", netns="boot/net:[1]")
    b = connections.Socket("rank-0.1", "n2", "127.0.0.1:40000", "127.0.0.1:5000", netns="boot/net:[2]")
    assert len(connections.cut([a, b]).foreign) == 2
    b2 = connections.Socket("rank-0.1", "n2", "127.0.0.1:40000", "127.0.0.1:5000", netns="boot/net:[1]")
    assert len(connections.cut([a, b2]).between_units) == 1


def test_node_addresses_match_across_nodes():
    a = connections.Socket("rank-0.0", "n1", "10.0.0.11:5000", "10.0.0.12:40000", netns="b1/net:[1]")
    b = connections.Socket("rank-0.1", "n2", "10.0.0.12:40000", "10.0.0.11:5000", netns="b2/net:[1]")
    assert len(connections.cut([a, b]).between_units) == 1


MPI_LOADED = r"""
import mpi4py
mpi4py.rc.initialize = False  # the library loaded, no MPI_Init
from mpi4py import MPI
print("loaded", flush=True)
import time; time.sleep(60)
"""


def test_a_unit_with_mpi_loaded_is_found(procs):
    pytest.importorskip("mpi4py")
    from gpucr_hpc.job.units import mpi_process

    p, said = procs(MPI_LOADED)
    assert said == "loaded"
    assert mpi_process(criu_mod.process_tree(p.pid)) == p.pid
    q, _ = procs(SELF)
    assert mpi_process(criu_mod.process_tree(q.pid)) is None
