"""The root helper's lock on an ordinary user's TCP connections (real sudo, real
users, real nftables): a user locks, renews and unlocks only their own flows, in
a table named after their uid; another user can neither lock nor unlock them.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from user_helpers import as_user

from gpucr_hpc.criu import root_helper
from gpucr_hpc.criu import tcp as criu_tcp
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.privileged import tcp as privileged_tcp
from gpucr_hpc.tcp import lock as netlock

pytestmark = [pytest.mark.criu]

# A connection to itself over loopback; prints its two ends, then waits.
HOLDER = r"""
import socket, sys, time
srv = socket.create_server(("127.0.0.1", 0))
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
print("%s:%d,%s:%d" % (c.getsockname() + c.getpeername()), flush=True)
time.sleep(120)
"""


@pytest.fixture
def helper_ready():
    if os.geteuid() != 0:
        pytest.skip("needs root: test users and sudo")
    if not os.access(root_helper.helper_path(), os.X_OK) or not shutil.which("sudo"):
        pytest.skip(f"the root helper is not installed ({root_helper.helper_path()}): make install")
    try:
        netlock.nft_command()
    except GpucrError as e:
        pytest.skip(e.cause)


def holding(user):
    """A process of `user` holding one loopback connection: (process, "local,remote")."""
    p = subprocess.Popen(["runuser", "-u", user.pw_name, "--", sys.executable, "-c", HOLDER],
                         stdout=subprocess.PIPE, text=True, cwd="/")
    return p, p.stdout.readline().strip()


def helper(user, *args):
    r = as_user(user, "sudo", "-n", root_helper.helper_path(), *args)
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {"stderr": r.stderr}


def test_a_user_locks_renews_and_unlocks_only_their_own_flows(users, helper_ready):
    a, b = users
    pa, flow_a = holding(a)
    name = f"t{os.getpid()}"
    table_a = privileged_tcp.table_name(a.pw_uid, name)
    try:
        rc, res = helper(a, "lock", f"--lock={name}", "--lock-seconds=30", f"--flow={flow_a}")
        assert (rc, res) == (0, {"locked": 1}), res
        assert netlock.locked(table_a) == [netlock.Flow(*flow_a.split(","))]
        # Another user: neither their lock on it, nor a renewal of it, nor its unlock.
        rc, res = helper(b, "lock", f"--lock={name}", "--lock-seconds=30", f"--flow={flow_a}")
        assert rc == 1 and "is not one of yours" in res["error"], res
        rc, res = helper(b, "unlock", f"--lock={name}")
        assert (rc, res) == (0, {"unlocked": False}), res
        assert netlock.locked(table_a)
        # Renewed once the holder is gone: the flow is already in the caller's own lock.
        pa.send_signal(signal.SIGKILL)
        pa.wait()
        rc, res = helper(a, "lock", f"--lock={name}", "--lock-seconds=30", f"--flow={flow_a}")
        assert (rc, res) == (0, {"locked": 1}), res
        # A lock longer than the longest the helper grants, a bad end: one line each.
        for bad in (("--lock-seconds=100000", f"--flow={flow_a}"), ("--lock-seconds=30", "--flow=a,b")):
            rc, res = helper(a, "lock", f"--lock={name}", *bad)
            assert rc == 1 and res["error"] and res["fix"], res
        rc, res = helper(a, "unlock", f"--lock={name}")
        assert (rc, res) == (0, {"unlocked": True}), res
        assert netlock.locked(table_a) == []
    finally:
        pa.kill()
        netlock.unlock(table_a)


def test_through_netlock_a_user_gets_the_helpers_answer(users, helper_ready):
    """netlock.lock/unlock as an ordinary user go through the helper."""
    a, b = users
    pb, flow_b = holding(b)
    code = ("import sys\n"
            "from gpucr_hpc.tcp import lock as netlock\n"
            "from gpucr_hpc.errors import GpucrError\n"
            "flow = netlock.Flow(*sys.argv[1].split(','))\n"
            "try: netlock.lock('mine', [flow], 30)\n"
            "except GpucrError as e: print(e.one_line())\n")
    try:
        out = as_user(a, sys.executable, "-c", code, flow_b, cwd="/",
                      env={**os.environ, "PYTHONPATH": str(os.path.dirname(os.path.dirname(netlock.__file__)))})
        assert out.stdout.startswith(f"connection {flow_b.replace(',', ' -> ')} is not one of yours"), out
    finally:
        pb.kill()


def test_moves_change_addresses_only_and_only_local_addresses_bind(tmp_path):
    criu_tcp.parse_moves({"10.0.0.1:4242": "10.0.0.2", "10.0.0.1": "10.0.0.3", "[fd00::1]:80": "fd00::2"})
    for bad in ({"10.0.0.1:4242": "10.0.0.2:80"}, {"host:1": "10.0.0.2"}, {"10.0.0.1:4242": ""}):
        with pytest.raises(GpucrError):
            criu_tcp.parse_moves(bad)
    import ipaddress
    assert privileged_tcp._here(ipaddress.ip_address("127.0.0.1"))
    assert privileged_tcp._here(ipaddress.ip_address("0.0.0.0"))
    assert not privileged_tcp._here(ipaddress.ip_address("192.0.2.77"))  # TEST-NET-1: never ours


@pytest.mark.parametrize("name", ["", "a b", "x;y", "../t"])
def test_a_bad_lock_name_is_refused(name):
    with pytest.raises(GpucrError):
        privileged_tcp.table_name(1000, name)
