"""The control socket of a real process running under the real shim."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from shim_helpers import shim_env, wait_for


def ask(path, *requests, timeout=10):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(str(path))
    s.sendall(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in requests))
    f = s.makefile()
    out = [json.loads(f.readline()) for _ in requests]
    s.close()
    return out


@pytest.fixture
def sleeper(tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen(["sleep", "60"], env=shim_env(run))
    sock = run / f"{p.pid}.sock"
    assert wait_for(sock), "no control socket appeared"
    yield p, sock
    p.kill()
    p.wait()


def test_status_over_socket(sleeper):
    p, sock = sleeper
    st, ping = ask(sock, {"cmd": "status"}, {"cmd": "ping"})
    assert st["ok"] and st["pid"] == p.pid and st["state"] == "running"
    assert st["cuda"] is False and st["gpu_bytes"] == 0 and st["gate_closed"] is False
    assert st["socket"] == str(sock)
    assert ping == {"ok": True, "pid": p.pid}


def test_bad_and_unknown_requests_answered_on_one_connection(sleeper):
    _, sock = sleeper
    bad, unknown, ok = ask(sock, b"not json", {"cmd": "frobnicate"}, {"cmd": "ping"})
    assert not bad["ok"] and "bad request" in bad["error"]
    assert not unknown["ok"] and unknown["error"] == "unknown command"
    assert ok["ok"]


def test_socket_and_dir_private(sleeper):
    _, sock = sleeper
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(sock.stat().st_mode) & 0o077 == 0


def test_socket_removed_at_exit(tmp_path):
    run = tmp_path / "run"
    p = subprocess.run(["python3", "-c", "import os; print(os.getpid())"], env=shim_env(run),
                       capture_output=True, text=True, check=True)
    assert not (run / f"{p.stdout.strip()}.sock").exists()
    assert list(run.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_other_uid_refused():
    """SO_PEERCRED: with the file permissions opened up, uid 65534 still gets no answer."""
    import shutil
    import tempfile
    from pathlib import Path

    run = Path(tempfile.mkdtemp(prefix="gpucr-peercred-"))  # outside pytest's private tmp
    p = subprocess.Popen(["sleep", "60"], env=shim_env(run))
    sock = run / f"{p.pid}.sock"
    try:
        assert wait_for(sock)
        os.chmod(run, 0o755)
        os.chmod(sock, 0o777)
        _other_uid_refused(sock)
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(run, ignore_errors=True)


def _other_uid_refused(sock):
    code = textwrap.dedent(f"""
        import os, socket, json
        os.setgid(65534); os.setuid(65534)
        s = socket.socket(socket.AF_UNIX); s.connect({str(sock)!r})
        s.sendall(b'{{"cmd": "status"}}\\n')
        print(s.makefile().readline())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert answer["ok"] is False and "permission denied" in answer["error"]
    # and the owner is still served
    assert ask(sock, {"cmd": "ping"})[0]["ok"]


def test_socket_recreated_after_fork(tmp_path):
    run = tmp_path / "run"
    code = textwrap.dedent("""
        import os, sys, time
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r); os.write(w, b"x"); time.sleep(60); os._exit(0)
        os.read(r, 1)
        print(pid, flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], env=shim_env(run), stdout=subprocess.PIPE, text=True)
    try:
        child = int(p.stdout.readline())
        parent_sock, child_sock = run / f"{p.pid}.sock", run / f"{child}.sock"
        assert wait_for(child_sock)
        assert ask(child_sock, {"cmd": "status"})[0]["pid"] == child
        st = ask(child_sock, {"cmd": "status"})[0]
        assert st["ppid"] == p.pid and st["state"] == "running"
        assert ask(parent_sock, {"cmd": "status"})[0]["pid"] == p.pid
    finally:
        p.kill()
        p.wait()
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, NameError):
            pass


def test_socket_survives_exec(tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c",
                          "import os, time; time.sleep(0.3); os.execvp('sleep', ['sleep', '60'])"],
                         env=shim_env(run))
    try:
        sock = run / f"{p.pid}.sock"
        assert wait_for(sock)
        time.sleep(1.0)  # after the exec
        assert open(f"/proc/{p.pid}/comm").read().strip() == "sleep"
        assert ask(sock, {"cmd": "ping"})[0] == {"ok": True, "pid": p.pid}
    finally:
        p.kill()
        p.wait()


def test_checkpoint_restore_cpu_process_state_machine(sleeper):
    """Without CUDA there is nothing to move, but the states still pair up."""
    _, sock = sleeper
    cp, st, again, rs, rs2 = ask(sock, {"cmd": "checkpoint", "timeout_ms": 1000}, {"cmd": "status"},
                                 {"cmd": "checkpoint"}, {"cmd": "restore"}, {"cmd": "restore"})
    assert cp == {"ok": True, "cuda": False}
    assert st["state"] == "checkpointed"
    assert not again["ok"] and "already checkpointed" in again["error"]
    assert rs["ok"]
    assert not rs2["ok"] and "not checkpointed" in rs2["error"]
