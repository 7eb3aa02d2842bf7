"""What a node needs for gpucr-hpc, checked one thing at a time.

Each check returns a Check: ok (True), a failure with the fix (False), or not
applicable here (None, with the reason: no GPU on a CPU node, a step that
needs root). `gpucr-hpc doctor` prints one line per check and fails on any
failure; the same checks run on every node of a partition through Slurm.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.mounts import MEMORY_FS, UNWRITABLE_FS, fs_type, huge_pages

KEY_FILE = Path("/etc/gpucr-hpc/image.key")
SUDOERS = Path("/etc/sudoers.d/gpucr-hpc")
TCP_KERNEL = (6, 16)  # from this Linux on, CRIU 4.1 cannot dump a network socket


@dataclass
class Check:
    name: str
    ok: bool | None  # None: does not apply here (detail says why)
    detail: str
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _kernel() -> tuple[int, ...]:
    return tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2] if x.isdigit())


def criu_version() -> Check:
    from gpucr_hpc.criu import run as criu_mod

    try:
        c = criu_mod.find_criu()
    except GpucrError as e:
        return Check("criu", False, e.cause, e.fix)
    if c.version[:2] < (4, 2) and _kernel() >= TCP_KERNEL:
        return Check("criu", False, f"CRIU {c.version_str} at {c.path} cannot dump a network socket on "
                     f"Linux {platform.release()}", "run scripts/install-deps (as root): it installs CRIU 4.2")
    return Check("criu", True, f"CRIU {c.version_str} at {c.path}")


def criu_dumps_here() -> Check:
    """A real process, dumped and restored with this node's CRIU."""
    from gpucr_hpc.criu import run as criu_mod

    if os.geteuid() != 0:
        return Check("criu dump/restore", None, "needs root (ordinary users go through the root helper)")
    try:
        c = criu_mod.find_criu()
    except GpucrError as e:
        return Check("criu dump/restore", False, e.cause, e.fix)
    with tempfile.TemporaryDirectory(prefix="gpucr-doctor-") as tmp:
        images, work = Path(tmp, "images"), Path(tmp, "work")
        images.mkdir()
        work.mkdir()
        p = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            c.dump(p.pid, images, work, leave_running=False, shell_job=False)
            p.wait(timeout=30)
            restored = c.start_restore(images, work, shell_job=False, new_pidns=True)
            criu_mod.end_tree(restored.host_pid, restored.launcher)
        except (GpucrError, subprocess.TimeoutExpired) as e:
            cause = e.cause if isinstance(e, GpucrError) else "the dumped process did not end"
            return Check("criu dump/restore", False, cause, f"see the CRIU logs in {work}")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return Check("criu dump/restore", True, "a test process was dumped and restored")


def nft() -> Check:
    from gpucr_hpc.criu import netlock

    try:
        cmd = netlock.nft_command()
        out = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=30)
    except (GpucrError, OSError, subprocess.TimeoutExpired) as e:
        return Check("nft", False, getattr(e, "cause", str(e)), netlock.INSTALL_FIX)
    if out.returncode != 0:
        return Check("nft", False, f"{cmd[0]} --version failed: {out.stderr.strip()[:200]}", netlock.INSTALL_FIX)
    return Check("nft", True, f"{out.stdout.strip()} ({cmd[0]}): jobs whose ranks talk over TCP can be locked")


def pycriu() -> Check:
    from gpucr_hpc.criu import tcp

    try:
        tcp._pycriu()
    except GpucrError as e:
        return Check("pycriu", False, e.cause, e.fix)
    return Check("pycriu", True, "CRIU's image module loads: TCP ends can move at a restore")


def plugin() -> tuple[Check, object | None]:
    from gpucr_hpc.slurm import site as site_mod

    try:
        site = site_mod.load_site()
        site_mod.require_plugin(site)
    except GpucrError as e:
        return Check("plugin", False, e.cause, e.fix), None
    return Check("plugin", True, f"plugstack line parsed ({site.plugstack})"), site


def _world_readable(path: Path, executable: bool) -> str | None:
    """Why an ordinary user cannot reach `path` (every directory above it must let
    others through), or None."""
    want = stat.S_IROTH | (stat.S_IXOTH if executable else 0)
    try:
        real = path.resolve(strict=True)
    except OSError as e:
        return f"{path}: {e.strerror}"
    for d in [*reversed(real.parents)]:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return f"{d} does not let other users through (mode {stat.filemode(os.stat(d).st_mode)})"
    if os.stat(real).st_mode & want != want:
        return f"{real} is mode {stat.filemode(os.stat(real).st_mode)}"
    return None


def installed_files(site) -> list[Check]:
    """The shim every task loads and the `cli=` every job runs, as an ordinary user sees them."""
    out = []
    for name, path, exe, fix in (
            ("shim", Path(site.shim), False, "make install; every user's tasks load it (LD_PRELOAD)"),
            ("cli", Path(site.cli), True, "install gpucr-hpc where every user can run it (not under a "
                                          "0700 home): jobs run it at start and at their restore")):
        why = _world_readable(path, exe)
        out.append(Check(name, why is None, why or f"{path} reachable by every user", "" if why is None else fix))
    return out


def root_helper() -> Check:
    from gpucr_hpc.criu import root_helper as rh

    path = Path(rh.helper_path())
    if not path.exists():
        return Check("root helper", False, f"{path} is not installed",
                     "run scripts/install-helper (as root): ordinary users' checkpoints need it")
    st = path.stat()
    if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return Check("root helper", False, f"{path} is not root's alone (mode {stat.filemode(st.st_mode)})",
                     "run scripts/install-helper (as root) again")
    if not SUDOERS.exists():
        return Check("root helper", False, f"no sudo rule ({SUDOERS})", "run scripts/install-helper (as root)")
    return Check("root helper", True, f"{path} and its sudo rule")


def node_key() -> Check:
    try:
        st = KEY_FILE.stat()
        digest = hashlib.sha256(KEY_FILE.read_bytes()).hexdigest()[:16]
    except PermissionError:
        return Check("node key", None, f"{KEY_FILE} is readable by root only (as it should be)")
    except OSError as e:
        return Check("node key", False, f"{KEY_FILE}: {e.strerror}",
                     "run scripts/install-helper (as root), then copy the key to every node")
    if st.st_uid != 0 or st.st_mode & 0o077:
        return Check("node key", False, f"{KEY_FILE} is mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid}",
                     f"chown root {KEY_FILE}; chmod 0600 {KEY_FILE}")
    return Check("node key", True, f"fingerprint {digest} (the same on every node)")


def image_root(site) -> Check:
    root = Path(site.imageroot)
    try:
        st = root.stat()
    except OSError as e:
        return Check("image root", False, f"{root}: {e.strerror}",
                     f"mkdir -m 0755 {root} (owned by root, on a file system every node shares)")
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != 0 or mode & 0o022 and mode != 0o1777:
        return Check("image root", False, f"{root} is mode {mode:04o}, owner uid {st.st_uid}",
                     f"chown root {root}; chmod 0755 {root}")
    free = shutil.disk_usage(root).free
    note = " (1777: another user can make a job's directory before the job; 0755 is safer)" if mode == 0o1777 else ""
    return Check("image root", True, f"{root}, mode {mode:04o}, {free / 2**30:.1f} GiB free{note}")


def arena(site) -> Check:
    path = Path(site.arena)
    if not path.is_dir():
        return Check("arena", False, f"{path} is not a directory", "give plugstack arena= a tmpfs or hugetlbfs")
    free = shutil.disk_usage(path).free
    huge = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("HugePages_Free", "Hugepagesize"):
                huge[k] = int(v.split()[0])
    except OSError:
        pass
    pages = (f", {huge.get('HugePages_Free', 0)} huge pages of {huge.get('Hugepagesize', 0)} kB free"
             if huge else "")
    return Check("arena", True, f"{path}: {free / 2**30:.1f} GiB free{pages}{small_pages_note(path)}")


def small_pages_note(path: Path) -> str:
    """Node memory on 4 KiB pages: each costs its allocation at first touch."""
    if fs_type(path) != "tmpfs" or huge_pages(path):
        return ""
    return ("; on 4 KiB pages, whose allocation bounds filling it (about 3 GB/s against 25 on 2 MiB "
            "pages on the H100 machine): mount that tmpfs with -o huge=always")


def stage(site) -> Check:
    """The staging tier (plugstack stage=): node memory, root's; the plugin makes each
    job's <stage>/<jobid> in it for the job's user (spank/imagedir.c)."""
    from gpucr_hpc.job import staging
    from gpucr_hpc.slurm.site import expand

    if not site.stage:
        return Check("staging tier", None, "plugstack stage= is not set: a preemption writes to the image root")
    path = Path(expand(site.stage))
    try:
        st = path.stat()
        fs = os.statvfs(path)
        cap = staging.cap_bytes(site.stage_cap, fs.f_blocks * fs.f_frsize)
    except GpucrError as e:
        return Check("staging tier", False, e.cause, e.fix)
    except OSError as e:
        return Check("staging tier", False, f"{path} (stage=): {e.strerror}",
                     f"mkdir -m 0755 {path} on every node, on a tmpfs")
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        return Check("staging tier", False, f"{path} (stage=) is not a directory: no job stages there",
                     f"mkdir -m 0755 {path} on every node, on a tmpfs")
    if st.st_uid != 0 or mode & 0o022:
        return Check("staging tier", False, f"{path} (stage=) is mode {mode:04o}, owned by uid {st.st_uid}: "
                     "users could plant, fill or swap other jobs' staging dirs there, so no job stages there",
                     f"chown root {path}; chmod 0755 {path} (the plugin makes each job's own dir in it)")
    kind = fs_type(path)
    if kind in UNWRITABLE_FS:
        return Check("staging tier", False, f"{path} (stage=) is on {kind}, which takes no written files: "
                     "no checkpoint can be staged there", "put stage= on a tmpfs (mount -t tmpfs -o huge=always "
                     "for huge pages)")
    note = (small_pages_note(path) if kind in MEMORY_FS
            else f"; it is on {kind}, not node memory: a preemption waits for that disk")
    try:
        apart = Path(expand(site.arena)).stat().st_dev != st.st_dev
    except OSError:
        apart = False  # the arena's own check says what is wrong with it
    if apart:
        note += (f"; the arena (arena={site.arena}) is on another file system: a preemption copies the GPU "
                 "data here instead of keeping the arena's pages (put both on one tmpfs)")
    used = staging.used_bytes(path)
    return Check("staging tier", True, f"{path} on {kind}: cap {cap / 2**30:.1f} GiB (stage_cap={site.stage_cap}), "
                 f"{used / 2**30:.1f} GiB staged now{note}")


def gpu() -> Check:
    if not shutil.which("nvidia-smi"):
        return Check("gpu", None, "no nvidia-smi: a CPU node")
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or not out.stdout.strip():
        return Check("gpu", False, f"nvidia-smi failed: {out.stderr.strip()[:200]}", "check the NVIDIA driver")
    names = sorted({ln.split(",")[0].strip() for ln in out.stdout.strip().splitlines()})
    driver = out.stdout.split(",")[1].strip()
    try:
        import cuda.bindings as cb

        bindings = f", cuda-python {cb.__version__}"
    except ImportError:
        bindings = ", no cuda-python (the driver-only path needs it: pip install gpucr-hpc[nvidia])"
    return Check("gpu", True, f"{', '.join(names)}, driver {driver}{bindings}")


def gpu_features(models: list[str], node: str, node_feats: set[str], site_feats: list[str]) -> Check:
    """A GPU node must carry one of the site's GPU features (plugstack gpu_feature=):
    a requeued job is steered to nodes with the features of the nodes it ran on,
    and a node with none of them takes any GPU job, whatever model its image needs."""
    if not site_feats:
        return Check("gpu feature", None, "plugstack gpu_feature= is not set: requeued jobs are not steered")
    have = sorted(node_feats & set(site_feats))
    if not have:
        return Check("gpu feature", False, f"{node} has {', '.join(models)} but none of the features of "
                     f"gpu_feature= ({', '.join(site_feats)})",
                     f"add the feature for its model to {node}'s Features= in slurm.conf")
    return Check("gpu feature", True, f"{node}: {', '.join(have)} for {', '.join(models)}")


def gpu_feature(site) -> Check:
    from gpucr_hpc.gpu import steer
    from gpucr_hpc.slurm.site import node_name

    if not shutil.which("nvidia-smi"):
        return Check("gpu feature", None, "no nvidia-smi: a CPU node")
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60)
    models = sorted({ln.strip() for ln in out.stdout.splitlines() if ln.strip()})
    site_feats = [f for f in site.gpu_feature.split(",") if f]
    try:
        feats = steer.node_features(node_name())
    except GpucrError as e:
        return Check("gpu feature", None, f"Slurm does not answer here: {e.cause}")
    return gpu_features(models, node_name(), feats, site_feats)


def run_all() -> list[Check]:
    plug, site = plugin()
    checks: list[Callable[[], Check | list[Check]]] = [
        criu_version, criu_dumps_here, pycriu, nft, lambda: plug, root_helper, node_key, gpu]
    if site is not None:  # what the plugstack line names
        checks += [lambda: installed_files(site), lambda: image_root(site), lambda: arena(site),
                   lambda: stage(site), lambda: gpu_feature(site)]
    out: list[Check] = []
    for c in checks:
        try:
            got = c()
        except Exception as e:  # noqa: BLE001 - a check that breaks is a failure to report, not a crash
            got = Check(getattr(c, "__name__", "check"), False, f"{type(e).__name__}: {e}",
                        "report it with this line")
        out += got if isinstance(got, list) else [got]
    return out
