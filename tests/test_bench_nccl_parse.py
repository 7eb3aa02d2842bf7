"""gpu-checks/nccl_gpu_verify.py and bench/bench_nccl.py without a GPU: NCCL's
transport from its INFO log, the step timings, the driver helper's protocol (a fake
driver), a whole verification of a fake torchrun job whose cycles stop and continue
its ranks (SIGSTOP/SIGCONT), and the benchmark's record of a case."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "gpu-checks"))
sys.path.insert(0, str(REPO / "bench"))

import bench_nccl  # noqa: E402
import nccl_gpu_verify as v  # noqa: E402
from common.stats import median  # noqa: E402

P2P = "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
NET = "h:1:1 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] [send] via NET/Socket/0"
SHM = "h:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"


def test_transport_of_names_the_leading_word():
    assert v.transport_of([P2P, "rank 0 step 1 0x1p+0", P2P]) == "P2P"
    assert v.transport_of([NET]) == "NET"
    assert v.transport_of([SHM, SHM, NET]) == "SHM"
    assert v.transport_of(["NCCL INFO Init COMPLETE", "rank 0 step 0 0x0p+0"]) is None
    assert v.transports([P2P, NET, P2P]) == ["NET/Socket/0", "P2P/CUMEM/read"]


def test_median_and_step_lines():
    assert median([3, None, 1, 2]) == 2
    assert median([]) is None and median([None]) is None
    assert median([0.1234567, 0.2], digits=6) == pytest.approx(0.161728)
    assert v.parse_step("rank 1 step 12 0x1.8p+0") == (1, 12)
    assert v.parse_step("rank 1 checksum abc") is None


def test_first_step_after_restore_and_step_period():
    arrivals = {0: {i: i * 0.1 for i in range(10)}, 1: {i: i * 0.1 + 0.01 for i in range(10)}}
    # a checkpoint from 0.45 to 0.6: rank 0's next step at 0.6, rank 1's at 0.61
    worst, per = v.first_step_after(arrivals, 0.595, 2)
    assert per == [pytest.approx(0.005), pytest.approx(0.015)] and worst == pytest.approx(0.015)
    assert v.first_step_after(arrivals, 5.0, 2) == (None, [None, None])
    arrivals[0][6] = arrivals[1][6] = 2.0  # a long step 5 -> 6, inside a checkpoint
    assert v.step_period(arrivals, 2, gaps=[(1.0, 1.9)]) == pytest.approx(0.1)
    assert v.step_period(arrivals, 2) == pytest.approx(0.1)  # the median: one long step does not move it
    assert v.step_period({0: {0: 0.0}}, 1) is None


FAKE_DRIVER = """
import sys, types
calls = []
class NvidiaDriver:
    def lock(self, pid, ms): calls.append(("lock", pid))
    def checkpoint(self, pid): calls.append(("checkpoint", pid))
    def restore(self, pid, pairs=None):
        if FAIL: raise RuntimeError("driver restore failed: CUDA_ERROR_NOT_SUPPORTED (801)")
    def unlock(self, pid): pass
    def state(self, pid): return "running"
FAIL = {fail}
m = types.ModuleType("gpucr_hpc.gpu.driver_nvidia"); m.NvidiaDriver = NvidiaDriver
sys.modules["gpucr_hpc.gpu.driver_nvidia"] = m
sys.path.insert(0, {gpu_checks!r})
import nccl_gpu_verify
sys.exit(nccl_gpu_verify.main(["_driver_helper", "11", "12"]))
"""


@pytest.mark.parametrize("fail", [False, True])
def test_driver_helper_protocol(fail):
    code = FAKE_DRIVER.format(fail=fail, gpu_checks=str(REPO / "gpu-checks"))
    r = subprocess.run([sys.executable, "-c", code], input="checkpoint\nrestore\nquit\n", capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    msgs = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [m["event"] for m in msgs] == ["ready", "checkpointed", "restored"]
    assert msgs[1]["errors"] == {} and set(msgs[1]["phases"]) == {"lock_s", "checkpoint_s", "total_s"}
    if fail:
        assert set(msgs[2]["errors"]) == {"restore 11", "restore 12"}
        assert "801" in msgs[2]["errors"]["restore 11"]
    else:
        assert msgs[2]["errors"] == {} and msgs[2]["t_end"] > 0


FAKE_TORCHRUN = """\
#!{python}
import subprocess, sys
n = int([a for a in sys.argv if a.startswith("--nproc-per-node=")][0].split("=")[1])
steps = int(sys.argv[[i for i, a in enumerate(sys.argv) if a.endswith(".py")][0] + 1])
code = '''
import os, sys, time
r, steps = int(sys.argv[1]), int(sys.argv[2])
if r == 0:
    os.write(1, b"h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Socket/0\\\\n")
for i in range(steps):
    os.write(1, f"rank {{r}} step {{i}} {{float(i * r).hex()}}\\\\n".encode()); time.sleep(0.03)
os.write(1, f"rank {{r}} checksum {{steps * r}}\\\\n".encode())
'''
ps = [subprocess.Popen([sys.executable, "-c", code, str(r), str(steps)], start_new_session=True) for r in range(n)]
sys.exit(max(p.wait() for p in ps))
"""


class StopCycler:
    """A cycle that stops the ranks (SIGSTOP) and lets them go on (SIGCONT)."""

    hang_restore = False

    def __init__(self, proc, ranks, timeout, env):
        self.pids = v.descendants(proc.p.pid)
        assert len(self.pids) == ranks

    def checkpoint(self, e):
        for p in self.pids:
            os.kill(p, signal.SIGSTOP)
        e["checkpoint_s"], e["checkpoint"] = 0.01, {}

    def restore(self, e):
        if self.hang_restore:
            raise v.Failed("restore + unlock hung: no answer from the driver within 1 s")
        for p in self.pids:
            os.kill(p, signal.SIGCONT)
        e["restore_s"], e["restore"] = 0.01, {}
        return v.time.monotonic()

    def close(self):
        pass


@pytest.mark.parametrize("hang", [False, True])
def test_verify_end_to_end_with_a_fake_job(tmp_path, monkeypatch, hang):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text(textwrap.dedent(FAKE_TORCHRUN.format(python=sys.executable)))
    (bindir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setattr(v, "DriverCycler", StopCycler)
    monkeypatch.setattr(StopCycler, "hang_restore", hang)
    out = tmp_path / "v.json"
    handler = signal.getsignal(signal.SIGTERM)
    rc = v.main(["--out", str(out), "--path", "driver", "--transport", "p2p-off", "--cycles", "2",
                 "--steps-per-cycle", "6", "--pause", "0.3", "--budget-s", "12" if hang else "60", "--reference-out",
                 str(tmp_path / "ref.json")])
    res = json.loads(out.read_text())
    # the caller's SIGTERM handler given back: children started later must not inherit SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == handler
    assert res["nccl_transport"] == "NET" and res["checks"]["p2p_shm_off"]
    assert res["reference_step_period_s"] == pytest.approx(0.03, abs=0.02)
    if hang:
        assert rc == 1 and not res["restored"] and "hung" in res["error"]
        assert res["cycles"][0]["outcome"].startswith("restore + unlock hung")
        assert res["job_rc"] == -signal.SIGKILL  # its ranks stay stopped: the job is ended when the budget is
        assert res["wall_s"] < 20
        return
    assert rc == 0, res
    assert res["restored"] and res["identical"]
    assert [e["outcome"] for e in res["cycles"]] == ["ok", "ok"]
    assert all(e["steps_while_checkpointed"] == 0 for e in res["cycles"])
    for e in res["cycles"]:
        assert 0 < e["first_step_after_restore_s"] < 0.5
        assert len(e["first_step_after_restore_per_rank_s"]) == 2
    assert res["step_period_s"] == pytest.approx(0.03, abs=0.02)  # the 0.3 s pauses are not steps
    # the saved reference serves a second run with the same settings
    rc2 = v.main(["--out", str(tmp_path / "v2.json"), "--path", "driver", "--transport", "p2p-off", "--cycles",
                  "2", "--steps-per-cycle", "6", "--pause", "0.3", "--reference", str(tmp_path / "ref.json")])
    res2 = json.loads((tmp_path / "v2.json").read_text())
    assert rc2 == 0 and res2["reference_from"] == str(tmp_path / "ref.json") and res2["identical"]


def test_bench_case_record_and_floor(tmp_path):
    verify_json = {"path": "shim", "transport": "p2p-off", "workload": "ddp", "restored": True, "identical": True,
                   "nccl_transport": "NET", "step_period_s": 0.03,
                   "cycles": [{"outcome": "ok", "checkpoint_s": 1.0, "restore_s": 0.5,
                               "first_step_after_restore_s": 0.2, "checkpoint_bytes": 4_000_000_000,
                               "vram_freed_bytes": 5_000_000_000},
                              {"outcome": "ok", "checkpoint_s": 3.0, "restore_s": 0.7,
                               "first_step_after_restore_s": 0.4, "checkpoint_bytes": 4_000_000_000},
                              {"outcome": "driver restore failed", "checkpoint_s": 9.0, "restore_s": 9.0}]}
    raw = {"d2h_GBps": 20.0, "h2d_GBps": 25.0}
    rec = bench_nccl.case_record("shim-p2p-off", verify_json, raw, 2)
    assert rec["checkpoint_median_s"] == 2.0 and rec["restore_median_s"] == 0.6  # failed cycles left out
    assert rec["checkpoint_s"] == [1.0, 3.0, 9.0]
    assert rec["first_step_after_restore_median_s"] == pytest.approx(0.3)
    assert rec["bytes"] == 4_000_000_000 and rec["bytes_source"].startswith("shim")
    assert rec["floor"]["checkpoint_parallel_s"] == pytest.approx(0.1)
    assert rec["floor"]["restore_serial_s"] == pytest.approx(0.16)
    drv = bench_nccl.case_record("driver-p2p-off", {"cycles": [{"outcome": "ok", "vram_freed_bytes": 2**30}]}, {}, 2)
    assert drv["bytes"] == 2**30 and drv["bytes_source"].startswith("nvidia-smi") and drv["floor"] is None
    res = {"device": "X", "options": {"ranks": 2, "workload": "ddp", "ballast_gib": 2.0, "cycles": 3},
           "cases": [rec, drv, {"case": "driver-default", "restored": False, "identical": False}]}
    pytest.importorskip("matplotlib")
    assert bench_nccl.plot(res, tmp_path / "p.png") == str(tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_bench_help():
    r = subprocess.run([sys.executable, str(REPO / "bench" / "bench_nccl.py"), "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "--time-limit" in r.stdout
