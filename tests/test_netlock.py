"""The lock on a job's TCP connections (gpucr_hpc/tcp/lock.py), with the
real kernel and nft: in a fresh network namespace, a connection locked moves no
byte either way and is not reset; unlocked, TCP delivers all that was sent, in
order."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.tcp import lock as netlock

REPO = Path(__file__).resolve().parent.parent
UNPACKED = Path("/opt/gpucr-hpc/criu/root")  # scripts/install-deps unpacks CRIU and nft here
INSTALLED = Path("/opt/gpucr-hpc/bin/gpucr-nft")
ADDR = "10.252.33.1"


def nft_prefix(tmp: Path) -> str | None:
    """A GPUCR_PREFIX whose bin/gpucr-nft runs: the installed one, else a wrapper
    written here for the unpacked nft (as scripts/install-deps writes it)."""
    if os.access(INSTALLED, os.X_OK):
        return str(INSTALLED.parent.parent)
    if not (UNPACKED / "usr/sbin/nft").exists():
        return None
    wrapper = tmp / "bin" / "gpucr-nft"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text("#!/bin/sh\n"
                       f"D={UNPACKED}\n"
                       'exec "$D/usr/lib64/ld-linux-x86-64.so.2" --library-path "$D/usr/lib/x86_64-linux-gnu" '
                       '"$D/usr/sbin/nft" "$@"\n')
    wrapper.chmod(0o755)
    return str(tmp)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces and nftables")
    for tool in ("ip", "nsenter"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool}")
    prefix = nft_prefix(tmp_path_factory.mktemp("prefix"))
    e = dict(os.environ, PYTHONPATH=str(REPO))
    if prefix:
        e["GPUCR_PREFIX"] = prefix
    elif not shutil.which("nft"):
        pytest.skip(f"no nft: neither {INSTALLED}, {UNPACKED}/usr/sbin/nft nor nft on PATH")
    return e


@pytest.fixture
def netns(env, request):
    name = f"gcrlock{os.getpid()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)  # left by a killed run
    subprocess.run(["ip", "netns", "add", name], check=True)
    request.addfinalizer(lambda: subprocess.run(["ip", "netns", "del", name], capture_output=True))
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "-n", name, "addr", "add", f"{ADDR}/32", "dev", "lo"], check=True)
    probe = subprocess.run(["nsenter", f"--net=/run/netns/{name}", "--", *netlock_cmd(env), "--version"],
                           capture_output=True, text=True, env=env)
    if probe.returncode != 0:
        pytest.skip(f"nft does not run here: {probe.stderr.strip()[:200]}")
    return name


def netlock_cmd(env) -> list[str]:
    code = "from gpucr_hpc.tcp import lock as netlock; print(' '.join(netlock.nft_command()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return out.stdout.split()


def in_ns(ns: str, env: dict, func: str, *args):
    """netlock.<func>(*args) run in the namespace: its result, or {"error": cause}."""
    code = ("import json, sys\n"
            "from gpucr_hpc.tcp import lock as netlock\n"
            "from gpucr_hpc.errors import GpucrError\n"
            "args = json.loads(sys.argv[1])\n"
            "if len(args) > 1: args[1] = [netlock.Flow(*f) for f in args[1]]\n"
            "try:\n"
            f"    r = netlock.{func}(*args)\n"
            "    r = [[f.local, f.remote] for f in r] if isinstance(r, list) else r\n"
            "except GpucrError as e:\n"
            "    r = {'error': e.cause}\n"
            "print(json.dumps(r))\n")
    out = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "--", sys.executable, "-c", code, json.dumps(args)],
                         capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# A connected pair in one process, driven by lines on stdin:
#   send c|s N            the client (c) or the server (s) sends N more bytes of its stream
#   recv c|s N SECONDS    the other end reads until it has N bytes of it in all, or the time is up
#   err                   SO_ERROR of both sockets
PAIR = r"""
import select, socket, sys, time
addr = sys.argv[1]
lsock = socket.socket(); lsock.bind((addr, 0)); lsock.listen(1)
c = socket.create_connection(lsock.getsockname())
s, _ = lsock.accept()
for x in (c, s):
    x.setblocking(False)
stream = lambda who, n: bytes((i * 7 + (who == "s")) % 251 for i in range(n))
sent = {"c": 0, "s": 0}; got = {"c": b"", "s": b""}  # got[x]: what x's peer received
def say(*a): print(*a, flush=True)
say(f"{c.getsockname()[0]}:{c.getsockname()[1]}", f"{s.getsockname()[0]}:{s.getsockname()[1]}")
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "send":
        who, n = cmd[1], int(cmd[2])
        data = stream(who, sent[who] + n)[sent[who]:]
        sock = c if who == "c" else s
        sock.setblocking(True); sock.sendall(data); sock.setblocking(False)
        sent[who] += n; say("sent")
    elif cmd[0] == "recv":
        who, n, end = cmd[1], int(cmd[2]), time.monotonic() + float(cmd[3])
        peer = s if who == "c" else c
        while len(got[who]) < n and time.monotonic() < end:
            if select.select([peer], [], [], max(0, end - time.monotonic()))[0]:
                chunk = peer.recv(65536)
                if not chunk:
                    break
                got[who] += chunk
        say(len(got[who]), got[who] == stream(who, len(got[who])))
    elif cmd[0] == "err":
        say(*(x.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) for x in (c, s)))
"""


class Pair:
    def __init__(self, ns: str, env: dict):
        self.p = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", "--", sys.executable, "-c", PAIR, ADDR],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.client, self.server = self.p.stdout.readline().split()

    def ask(self, line: str) -> list[str]:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().split()

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=10)


@pytest.fixture
def pair(netns, env):
    p = Pair(netns, env)
    yield p
    p.close()


def test_a_locked_connection_moves_nothing_and_resumes_whole(netns, env, pair):
    # Alive before the lock.
    assert pair.ask("send c 1000") == ["sent"]
    assert pair.ask("recv c 1000 5") == ["1000", "True"]

    flow = [pair.client, pair.server]  # as the client's socket sees it
    assert in_ns(netns, env, "lock", "job1", [flow]) is None
    assert in_ns(netns, env, "locked", "job1") == [flow]

    # Locked: nothing arrives either way (client to server is dropped at output,
    # server to client at input), and neither end is reset.
    pair.ask("send c 5000")
    pair.ask("send s 3000")
    assert pair.ask("recv c 6000 0.6") == ["1000", "True"]
    assert pair.ask("recv s 3000 0.6") == ["0", "True"]
    assert pair.ask("err") == ["0", "0"]

    # Unlocked: TCP retransmits; every byte arrives, in order, and more can follow.
    assert in_ns(netns, env, "unlock", "job1") is True
    assert pair.ask("recv c 6000 10") == ["6000", "True"]
    assert pair.ask("recv s 3000 10") == ["3000", "True"]
    pair.ask("send c 100")
    assert pair.ask("recv c 6100 5") == ["6100", "True"]
    assert pair.ask("err") == ["0", "0"]

    # Unlocking what is not locked says so, and changes nothing.
    assert in_ns(netns, env, "unlock", "job1") is False
    assert in_ns(netns, env, "locked", "job1") == []


def test_a_lock_whose_holder_died_lets_go_at_its_deadline(netns, env, pair):
    """No unlock at all (its holder was killed): the connection resumes once the lock expires."""
    flow = [pair.client, pair.server]
    assert in_ns(netns, env, "lock", "job9", [flow], 2) is None
    pair.ask("send c 4000")
    assert pair.ask("recv c 4000 0.5") == ["0", "True"]  # locked
    assert pair.ask("recv c 4000 15") == ["4000", "True"]  # expired: retransmitted, whole
    assert pair.ask("err") == ["0", "0"]
    assert in_ns(netns, env, "unlock", "job9") is True  # the table stayed, inert


def test_a_lease_outlasts_its_length_while_its_holder_lives(netns, env, pair):
    """Lease(lease_s=1.5) held for 4 s: still locked at 3 s (renewed), gone once released."""
    code = ("import sys, time\nfrom gpucr_hpc.tcp import lock as netlock\n"
            "with netlock.Lease('job10', [netlock.Flow(sys.argv[1], sys.argv[2])], 1.5):\n"
            "    print('held', flush=True)\n    time.sleep(4)\n")
    holder = subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", "--", sys.executable, "-c", code,
                               pair.client, pair.server], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        pair.ask("send c 2000")
        assert pair.ask("recv c 2000 3") == ["0", "True"]  # past 1.5 s: renewed, still locked
        assert holder.wait(timeout=10) == 0
        assert in_ns(netns, env, "locked", "job10") == []  # released on exit
        assert pair.ask("recv c 2000 15") == ["2000", "True"]
    finally:
        holder.kill()


def test_locking_again_replaces_and_ipv6_reads_back(netns, env):
    v4 = ["10.0.0.1:4242", "10.0.0.2:50000"]
    v6 = ["[fd00:0:0::1]:4242", "[FD00::2]:50000"]
    assert in_ns(netns, env, "lock", "job2", [v4, v6]) is None
    assert in_ns(netns, env, "locked", "job2") == [v4, ["[fd00::1]:4242", "[fd00::2]:50000"]]
    assert in_ns(netns, env, "lock", "job2", [v4]) is None
    assert in_ns(netns, env, "locked", "job2") == [v4]
    assert in_ns(netns, env, "lock", "job3", []) is None  # another job's lock is its own
    assert in_ns(netns, env, "unlock", "job2") is True
    assert in_ns(netns, env, "locked", "job3") == []
    assert in_ns(netns, env, "unlock", "job3") is True


def test_a_refused_relock_keeps_the_old_lock(netns, env):
    good = ["10.0.0.1:4242", "10.0.0.2:50000"]
    assert in_ns(netns, env, "lock", "job4", [good]) is None
    r = in_ns(netns, env, "lock", "job4", [good, ["10.0.0.1:4242", "10.0.0.300:1"]])
    assert "bad connection end" in r["error"]
    assert in_ns(netns, env, "locked", "job4") == [good]
    assert in_ns(netns, env, "unlock", "job4") is True


@pytest.mark.parametrize("name", ["", "job-1", "job1; flush ruleset", "job 1", "jöb"])
def test_a_bad_name_is_refused(name):
    with pytest.raises(GpucrError, match="bad lock name"):
        netlock.lock(name, [])
    with pytest.raises(GpucrError, match="bad lock name"):
        netlock.unlock(name)


@pytest.mark.parametrize("end", ["10.0.0.1", "10.0.0.1:0", "10.0.0.1:70000", "fd00::1:4242",
                                 "[10.0.0.1]:1", "[fd00::1]:x", "host:80"])
def test_a_bad_connection_end_is_refused(end):
    with pytest.raises(GpucrError, match="bad connection end"):
        netlock.lock("job5", [netlock.Flow(end, "10.0.0.2:1")])


def test_mixed_families_are_refused():
    with pytest.raises(GpucrError, match="mixes IPv4 and IPv6"):
        netlock.lock("job6", [netlock.Flow("10.0.0.1:1", "[fd00::1]:1")])


def test_nft_s_error_is_the_cause(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root: netlock refuses before running nft otherwise")
    fake = tmp_path / "bin" / "gpucr-nft"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Error: Could not process rule: Operation not supported' >&2\n"
                    "echo 'second line' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("GPUCR_PREFIX", str(tmp_path))
    assert netlock.nft_command() == [str(fake)]
    with pytest.raises(GpucrError) as e:
        netlock.lock("job7", [])
    assert e.value.cause == ("cannot lock the TCP connections of job7: "
                             "nft: Error: Could not process rule: Operation not supported")
    with pytest.raises(GpucrError, match="nft: Error: Could not process rule"):
        netlock.unlock("job7")
