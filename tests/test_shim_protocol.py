"""Every control-socket message between the real shim and the Python side, parsed by
gpucr_hpc/shim/protocol.py (a CPU process: the GPU data messages of the copy helper
are exercised by test_copy_helper_gpu.py on a GPU machine)."""

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest
from shim_helpers import shim_env, wait_for

from gpucr_hpc.shim import protocol
from gpucr_hpc.shim.client import ShimClient


@pytest.fixture
def client(tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen(["sleep", "60"], env=shim_env(run))
    assert wait_for(run / f"{p.pid}.sock"), "no control socket appeared"
    yield p.pid, ShimClient(p.pid, run)
    p.kill()
    p.wait()


def test_status_ping_checkpoint_restore_round_trip(client):
    pid, c = client
    st = c.status()
    assert st.ok and st.pid == pid and st.state == "running" and not st.cuda and not st.gate_closed
    assert st.gpu_bytes == st.checkpointed_bytes == st.arena_used == 0
    assert st.raw["pid"] == pid  # the whole answer kept for --json
    assert c.request(protocol.PING).ok
    cp = c.checkpoint(1000)
    assert cp.ok and not cp.cuda and cp.nbytes == 0 and cp.blobs == ()
    assert c.status().state == "checkpointed"
    assert c.request(protocol.STAGING_DROP).ok
    rs = c.restore()
    assert rs.ok and c.status().state == "running"


@pytest.mark.parametrize("cmd", [protocol.PREFILL, protocol.ARENA_DETACH, protocol.ARENA_ATTACH])
def test_a_refusal_is_a_reply_with_its_error_and_reason(client, cmd):
    """A CPU process has no GPU data: each GPU data request is refused, typed."""
    _, c = client
    c.checkpoint(1000)
    r = c.request(cmd)
    assert not r.ok and r.error and r.reason


def _files_open_in(pid: int, folder) -> int:
    """How many descriptors of the process lead to files in folder."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return sum(link.startswith(str(folder)) for link in links)


def test_descriptors_sent_with_a_request_are_closed_when_it_does_not_take_them(client, tmp_path):
    """arena_attach may carry the arena's files (SCM_RIGHTS). Refused, or sent with a
    request that takes none, they are closed in the process: none leaks, whatever
    was asked."""
    pid, c = client
    files = [os.open(tmp_path, os.O_TMPFILE | os.O_RDWR, 0o600) for _ in range(3)]
    try:
        for cmd in (protocol.ARENA_ATTACH, protocol.STATUS):
            r = c.request(cmd, fds=files)
            assert r.ok == (cmd == protocol.STATUS) and not r.filled
            assert _files_open_in(pid, tmp_path) == 0, cmd
        c.checkpoint(1000)  # checkpointed, without GPU data: still nothing to attach
        assert not c.request(protocol.ARENA_ATTACH, fds=files).ok and _files_open_in(pid, tmp_path) == 0
    finally:
        for fd in files:
            os.close(fd)


def test_every_request_is_one_the_shim_knows(client):
    _, c = client
    known = protocol.REQUESTS
    unknown = c.request("frobnicate")
    assert not unknown.ok
    for cmd in known:
        assert c.request(cmd).error != unknown.error, cmd


def test_blobs_and_device_uuids_parse_in_order():
    """The checkpoint answer's GPU part as the shim writes it (shim/checkpoint.c)."""
    r = protocol.Reply.parse({"ok": True, "bytes": 48, "cuda": True, "data_path": "bounce",
                              "device_uuids": {"1": "GPU-b", "0": "GPU-a"}, "quiesce_s": 0.5,
                              "blobs": {"10": {"handle": 10, "va": 4096, "size": 32, "device": 1, "host": 8192},
                                        "2": {"handle": 2, "va": 0, "size": 16, "device": 0, "host": 0}}})
    assert [b.handle for b in r.blobs] == [2, 10]
    assert r.blobs[1] == protocol.Blob(handle=10, va=4096, size=32, device=1, host=8192)
    assert dict(r.device_uuids) == {0: "GPU-a", 1: "GPU-b"} and r.nbytes == 48
    assert r.report == {"quiesce_s": 0.5, "data_path": "bounce"} and r.quiesce_s == 0.5


def test_arena_answers_parse_as_the_shim_writes_them():
    """status counts the arena's segments; arena_detach gives their ranges, which a
    restore fills ahead; arena_attach says whether it mapped files filled ahead."""
    st = protocol.Reply.parse({"ok": True, "state": "checkpointed", "arena_segments": 2, "arena_dir": "/dev/shm",
                               "arena_bytes": 3 << 21})
    assert st.ok and st.arena_bytes == 3 << 21 and st.arena_dir == "/dev/shm" and st.segment_ranges == ()
    d = protocol.Reply.parse({"ok": True, "segments": 2, "arena_bytes": 3 << 21, "arena_dir": "/dev/shm",
                              "segment_ranges": [[1 << 40, 1 << 21], [(1 << 40) + (4 << 21), 2 << 21]]})
    assert d.segment_ranges == ((1 << 40, 1 << 21), ((1 << 40) + (4 << 21), 2 << 21))
    assert protocol.Reply.parse({"ok": True, "filled": True, "attach_s": 0.01}).filled


def test_copy_helper_requests_parse_as_the_shim_writes_them():
    """The copy helper's requests as shim/helper.c writes them: blobs as arrays."""
    out = protocol.HelperRequest.parse(b'{"cmd": "out", "blobs": [[7, 4096, 0, 128, "GPU-a", 1]]}')
    assert out.cmd == protocol.HELPER_OUT
    assert out.blobs == (protocol.HelperBlob(id=7, size=4096, seg=0, off=128, device="GPU-a", held=True),)
    seg = protocol.HelperRequest.parse(b'{"cmd": "segment", "seg": 2, "size": 65536, "gen": 3}')
    assert (seg.seg, seg.size, seg.gen) == (2, 65536, 3)
    assert protocol.HelperRequest.parse(b'{"cmd": "in_done", "keep": true}').keep
    assert protocol.HelperRequest.parse(b'{"cmd": "forget", "id": 9}').id == 9
    assert protocol.helper_answer(error="boom") == b'{"ok": false, "error": "boom"}'


def test_nccl_answers_parse_into_typed_fields():
    """The cut's answers (nccl_counts, nccl_teardown, nccl_ids) and status's NCCL
    fields, as the shim writes them: no caller reads the raw answer."""
    r = protocol.Reply.parse({"ok": True, "nccl_comms": 2, "nccl_cut": "parked", "cut": "parked", "quiet": True,
                              "settled": False, "comms": ["a1:7:0:2", "b2:3:1:4"], "unrestorable": "",
                              "teardown_s": 0.25, "ids": "a1=ff00,b2=00ff"})
    assert (r.nccl_comms, r.nccl_cut, r.cut, r.quiet, r.settled) == (2, "parked", "parked", True, False)
    assert r.comms == (protocol.NcclComm("a1", 7, 0, 2), protocol.NcclComm("b2", 3, 1, 4))
    assert r.teardown_s == 0.25 and r.nccl_ids == {"a1": "ff00", "b2": "00ff"}
    empty = protocol.Reply.parse({"ok": True})
    assert (empty.nccl_comms, empty.comms, empty.nccl_ids) == (0, (), {})


SHIM = Path(__file__).resolve().parent.parent / "shim"


def _x_list(header: str, macro: str) -> list[str]:
    """The names of an X-macro list of a shim header: X(name) or X(name, ...)."""
    lines = iter((SHIM / header).read_text().splitlines())
    block = [next(ln for ln in lines if ln.startswith(f"#define {macro}(X)"))]
    while block[-1].endswith("\\"):
        block.append(next(lines))
    return re.findall(r"\bX\((\w+)", "\n".join(block))


def test_the_shim_and_python_name_the_same_requests():
    """protocol.h's lists are the requests the shim answers (dispatch.c's table is
    made from them); gpucr_hpc/shim/protocol.py names each of them, and no other."""
    c_names = set(_x_list("protocol.h", "GPUCR_COMMANDS")) | set(_x_list("protocol.h", "GPUCR_NCCL_COMMANDS"))
    assert c_names == set(protocol.REQUESTS), (sorted(c_names - set(protocol.REQUESTS)),
                                                sorted(set(protocol.REQUESTS) - c_names))
    assert len(c_names) >= 19


def _python_keys() -> set[str]:
    """The keys gpucr_hpc/shim/protocol.py reads of an answer or a copy helper's
    request (d.get("k"), d["k"], REPORTED), or writes (dict literals)."""
    keys = set()
    for n in ast.walk(ast.parse(Path(protocol.__file__).read_text())):
        if isinstance(n, ast.Dict):
            keys |= {k.value for k in n.keys if isinstance(k, ast.Constant)}
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args:
            keys |= {n.args[0].value} if isinstance(n.args[0], ast.Constant) else set()
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
            keys.add(n.slice.value)
    return keys | set(protocol.REPORTED)


def _request_fields() -> set[str]:
    """The fields the package sends with a request: the keywords of every call that
    passes a request (a protocol constant such as ARENA_FILES), and the keys of a
    dict literal it passes as **fields."""
    requests = {name for name, value in vars(protocol).items() if name.isupper() and value in protocol.REQUESTS}
    fields = set()
    for path in Path(protocol.__file__).parent.parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            dicts = {t.id: n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name)}
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                if not any(getattr(a, "id", getattr(a, "attr", None)) in requests for a in call.args):
                    continue
                for kw in call.keywords:
                    if kw.arg and kw.arg not in ("timeout", "fds"):
                        fields.add(kw.arg)
                    elif kw.arg is None and isinstance(kw.value, ast.Name) and kw.value.id in dicts:
                        fields |= {k.value for d in ast.walk(dicts[kw.value.id]) if isinstance(d, ast.Dict)
                                   for k in d.keys if isinstance(k, ast.Constant)}
    return fields


# What the shim says that no code decides on: `status --json` prints it whole
# (Reply.raw). Typing a key in protocol.py takes it off this list; nothing may be added.
KNOWN_UNTYPED = {"ppid", "uid", "mappings", "async_allocations", "multicast_objects", "arena_segments",
                 "arena_hugetlb", "numa_node", "numa_error", "helper_setup_s", "arena_prealloc", "staging_bytes",
                 "arena_detached", "copy_helper", "helper_segments", "gate_waits", "vmm_backing", "getproc_hooked",
                 "dlsym_hooked", "socket", "warning", "staging_bytes_dropped", "segment_fds", "segment_linkable",
                 "segments", "detach_s", "torn_down", "finalize_error", "reload_s", "rebuilt", "rebuild_s"}


def test_the_shim_and_python_spell_the_same_keys():
    """protocol_keys.h is every key the shim reads or writes; protocol.py reads and
    writes none the shim does not, the package sends no request field the shim
    does not read, and every key the shim writes is typed in protocol.py or known
    to be passed through untyped."""
    c_keys = _x_list("protocol_keys.h", "GPUCR_KEYS")
    assert len(c_keys) == len(set(c_keys)) > 80, sorted(k for k in c_keys if c_keys.count(k) > 1)
    python, sent = _python_keys(), _request_fields()
    assert python <= set(c_keys), sorted(python - set(c_keys))
    assert sent <= set(c_keys), sorted(sent - set(c_keys))
    assert {"timeout_ms", "into", "linkable", "targets", "ids"} <= sent
    untyped = set(c_keys) - python - sent
    assert untyped == KNOWN_UNTYPED, f"new: {sorted(untyped - KNOWN_UNTYPED)}; typed: {sorted(KNOWN_UNTYPED - untyped)}"


def test_the_shim_spells_each_key_once():
    """The shim's C names a key as KEY_<key> (protocol_keys.h), never as a string
    where a JSON member is written or looked up, and names every listed key."""
    sources = {p.name: p.read_text() for p in SHIM.glob("*.c") if p.name != "protocol_keys.c"}
    literal = re.compile(r"\b(?:jb_\w+|json_find|string_member|ok_with)\([^,;(){}\n]*,\s*\"")
    assert [f"{name}: {m.group(0)}" for name, text in sources.items() for m in literal.finditer(text)] == []
    named = set(re.findall(r"\bKEY_(\w+)", "\n".join(sources.values())))
    assert set(_x_list("protocol_keys.h", "GPUCR_KEYS")) - named == set()
