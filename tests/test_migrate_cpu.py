"""Whole-process migration of a CPU process tree with real CRIU, through the CLI.

checkpoint --to DIR kills the tree (threads, a child, open files), restore
--from DIR brings it back, and the counter goes on exactly where it stopped.
"""

import os
import time

import pytest
from migrate_workload import (
    alive,
    assert_counter_exact,
    cli,
    cli_json,
    kill_tree,
    lines,
    start_workload,
    start_workload_under,
    wait_lines,
)

from gpucr_hpc.criu import run as criu_mod
from gpucr_hpc.errors import GpucrError

pytestmark = pytest.mark.criu


@pytest.fixture(scope="module")
def criu():
    if os.geteuid() != 0:
        pytest.skip("CRIU dump/restore of a process tree needs root here (no --unprivileged setup)")
    try:
        return criu_mod.find_criu()
    except GpucrError as e:
        pytest.skip(f"CRIU >= 4.1 not available: {e.one_line()}")


@pytest.fixture
def reaper():
    """PIDs (process tree roots) to kill at the end of the test, whatever happened."""
    roots, popens = [], []
    yield roots, popens
    for pid in roots:
        kill_tree(pid)
    for p in popens:
        if p.poll() is None:
            kill_tree(p.pid)
        p.wait(timeout=10)


def _tree_shape(pid):
    tree = criu_mod.process_tree(pid)
    threads = len(os.listdir(f"/proc/{pid}/task"))
    return tree, threads


@pytest.mark.parametrize("pidns", ["host", "new"])
def test_checkpoint_kill_restore_continues(criu, tmp_path, reaper, pidns):
    roots, popens = reaper
    proc, out = start_workload(tmp_path)
    popens.append(proc)
    wait_lines(out, 20)
    tree, threads = _tree_shape(proc.pid)
    assert len(tree) == 2 and threads >= 3  # root + child; main, worker, ticker threads

    img = tmp_path / "img"
    rep = cli_json("checkpoint", "--pid", str(proc.pid), "--to", str(img))
    proc.wait(timeout=10)  # reap our child so its PID is free again
    assert rep["pids"] == tree and not rep["leave_running"]
    assert rep["schema"] == "gpucr-hpc.process-checkpoint/1"
    assert all(not alive(p) for p in tree), "the tree must be gone after checkpoint --to"
    for k in ("dump_s", "released_s", "persist_s", "commit_s", "total_s"):
        assert k in rep["timings"]
    assert (img / "COMMITTED").exists() and (img / "manifest.json").exists()
    stopped_at = len(lines(out))
    time.sleep(0.3)
    assert len(lines(out)) == stopped_at, "nothing may run between checkpoint and restore"

    rep = cli_json("restore", "--from", str(img), "--pidns", pidns)
    roots.append(rep["pid"])
    assert rep["schema"] == "gpucr-hpc.process-restore/1"
    assert rep["pidns"] == pidns
    assert rep["ns_pid"] == tree[0]
    if pidns == "host":
        assert rep["pid"] == tree[0]
    got = wait_lines(out, stopped_at + 30)
    assert_counter_exact(got)
    rtree, rthreads = _tree_shape(rep["pid"])
    assert len(rtree) == 2 and rthreads == threads


def test_leave_running_then_restore_with_rewind(criu, tmp_path, reaper):
    roots, popens = reaper
    proc, out = start_workload(tmp_path)
    popens.append(proc)
    wait_lines(out, 10)
    img = tmp_path / "img"
    rep = cli_json("checkpoint", "--pid", str(proc.pid), "--to", str(img), "--leave-running")
    assert rep["leave_running"]
    at_ckpt = len(lines(out))
    wait_lines(out, at_ckpt + 20)  # it runs on
    assert alive(proc.pid)
    kill_tree(proc.pid)
    proc.wait(timeout=10)
    before = lines(out)

    # The counter file grew after the checkpoint: refused, naming the file and the fix.
    r = cli("restore", "--from", str(img))
    assert r.returncode != 0
    assert "counter.txt" in r.stderr and "--rewind-files" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

    rep = cli_json("restore", "--from", str(img), "--rewind-files")
    roots.append(rep["pid"])
    kept = rep["rewound_files_kept_as"]
    assert len(kept) == 1 and open(kept[0]).read().splitlines() == before
    got = wait_lines(out, len(before) + 10)
    assert_counter_exact(got)


def test_not_session_leader_uses_shell_job(criu, tmp_path, reaper):
    """A program started from a shell: its session leader (the shell) stays behind."""
    roots, popens = reaper
    shell, pid, out = start_workload_under(tmp_path, ["sh", "-c", '"$@"; true', "sh"],
                                           new_session=True)
    popens.append(shell)
    assert os.getsid(pid) == shell.pid
    wait_lines(out, 5)
    img = tmp_path / "img"
    cli_json("checkpoint", "--pid", str(pid), "--to", str(img))
    shell.wait(timeout=10)
    import json
    assert json.loads((img / "manifest.json").read_text())["process"]["shell_job"] is True
    n = len(lines(out))
    rep = cli_json("restore", "--from", str(img))
    roots.append(rep["pid"])
    assert_counter_exact(wait_lines(out, n + 10))


def test_session_leader_outside_pidns_refused_and_left_running(criu, tmp_path, reaper):
    """CRIU cannot record a session whose leader it cannot see: refuse, one line."""
    roots, popens = reaper
    wrapper, pid, out = start_workload_under(tmp_path, ["unshare", "--pid", "--fork"],
                                             new_session=False)
    popens.append(wrapper)
    assert criu_mod.session_visible(pid) is False
    wait_lines(out, 3)
    r = cli("checkpoint", "--pid", str(pid), "--to", str(tmp_path / "img"))
    assert r.returncode != 0
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "session leader is outside its PID namespace" in err
    assert "setsid" in err
    assert not (tmp_path / "img").exists()
    n = len(lines(out))
    assert_counter_exact(wait_lines(out, n + 3))  # still counting


def test_pid_clash_refused_in_host_mode_and_avoided_in_auto(criu, tmp_path, reaper):
    roots, popens = reaper
    proc, out = start_workload(tmp_path)
    popens.append(proc)
    wait_lines(out, 5)
    img = tmp_path / "img"
    cli_json("checkpoint", "--pid", str(proc.pid), "--to", str(img), "--leave-running")
    # The original still holds the PIDs: --pidns host is a clash.
    kill_tree(proc.pid)  # stop it, but keep its zombie (PID held) until we reap it
    r = cli("restore", "--from", str(img), "--pidns", "host", "--rewind-files")
    assert r.returncode != 0 and "PID namespace clash" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # auto picks a new PID namespace while the PID is taken.
    rep = cli_json("restore", "--from", str(img), "--rewind-files")
    roots.append(rep["pid"])
    assert rep["pidns"] == "new" and rep["ns_pid"] == proc.pid and rep["pid"] != proc.pid
    proc.wait(timeout=10)
    assert_counter_exact(wait_lines(out, 30))


def test_end_tree_ends_a_tree_restored_in_a_new_pid_namespace(criu, tmp_path, reaper):
    """What a restore step does when it learns after the restore that its job was
    requeued meanwhile: the restored tree (root, child, the namespace's init) ends
    at once and the launcher is reaped."""
    from gpucr_hpc.process import image as process_image

    roots, popens = reaper
    proc, out = start_workload(tmp_path)
    popens.append(proc)
    wait_lines(out, 10)
    cli_json("checkpoint", "--pid", str(proc.pid), "--to", str(tmp_path / "img"))
    proc.wait(timeout=10)
    rep = process_image.restore_from(tmp_path / "img", pidns="new")
    roots.append(rep["pid"])
    tree = criu_mod.process_tree(rep["pid"])
    assert len(tree) == 2 and all(alive(p) for p in tree)
    criu_mod.end_tree(rep["pid"], rep["_launcher"])
    assert rep["_launcher"].returncode is not None
    assert criu_mod.wait_gone(tree, timeout=10), "the restored tree outlived end_tree"
    stopped_at = len(lines(out))
    time.sleep(0.3)
    assert len(lines(out)) == stopped_at
