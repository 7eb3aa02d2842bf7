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
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from gpucr_hpc.errors import GpucrError
from gpucr_hpc.store.mounts import MEMORY_FS, UNWRITABLE_FS, fs_type, huge_pages

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
    from gpucr_hpc.tcp import lock as netlock

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
    from gpucr_hpc.job.storage import staging
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


# The driver a GPU node needs: cuda-python 13 (the `nvidia` extra) speaks the CUDA 13
# driver API, which starts with driver 580; the checkpoint of a process onto other GPUs
# of the same model (a restore on another node) needs 580 too.
MIN_DRIVER = (580,)
NVIDIA_VERSION_FILE = Path("/proc/driver/nvidia/version")
NVIDIA_FIX = "pip install 'gpucr-hpc[nvidia]' into the Python that runs gpucr-hpc (scripts/setup-venv does)"


def driver_of(version_text: str) -> str | None:
    """The driver version in /proc/driver/nvidia/version's text ("NVRM version: NVIDIA UNIX
    x86_64 Kernel Module  580.159.04  ...", or "... Open Kernel Module for x86_64  580.82.07 ..."),
    else None."""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", version_text)
    return m.group(1) if m else None


def cuda_bindings() -> tuple[str | None, str]:
    """(cuda-python's version, "") where the driver checkpoint API imports, else (None, why)."""
    try:
        import cuda.bindings as cb
        from cuda.bindings import driver

        if not hasattr(driver, "cuCheckpointProcessCheckpoint"):
            return None, f"cuda-python {cb.__version__} has no driver checkpoint API"
        return str(cb.__version__), ""
    except ImportError as e:
        return None, f"cuda-python does not import ({e})"


def gpu_node(driver: str | None, bindings: tuple[str | None, str], models: str = "") -> Check:
    """What a GPU node needs of its driver and of cuda-python, from what it has."""
    on = f"{models}, " if models else ""
    if driver is None:
        return Check("gpu", False, f"{on}the NVIDIA driver's version cannot be read",
                     f"check the NVIDIA driver ({NVIDIA_VERSION_FILE}, nvidia-smi)")
    have = tuple(int(x) for x in driver.split(".") if x.isdigit())
    need = ".".join(map(str, MIN_DRIVER))
    if have[:len(MIN_DRIVER)] < MIN_DRIVER:
        return Check("gpu", False, f"{on}driver {driver} is older than {need}, which gpucr-hpc needs "
                     "(cuda-python 13's driver API, the driver checkpoint API)",
                     f"upgrade the NVIDIA driver to {need} or newer")
    version, why = bindings
    if version is None:
        return Check("gpu", False, f"{on}driver {driver}, but {why}: the first GPU checkpoint would fail",
                     NVIDIA_FIX)
    return Check("gpu", True, f"{on}driver {driver}, cuda-python {version}")


def gpu() -> Check:
    """A GPU node (the NVIDIA driver is loaded, or nvidia-smi is there): its driver and cuda-python."""
    try:
        text = NVIDIA_VERSION_FILE.read_text()
    except OSError:
        text = None
    smi = shutil.which("nvidia-smi")
    if text is None and not smi:
        return Check("gpu", None, "no NVIDIA driver here (no /proc/driver/nvidia, no nvidia-smi): a CPU node")
    driver, models = driver_of(text or ""), ""
    if smi:
        out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
        rows = [ln.split(",") for ln in out.stdout.strip().splitlines() if "," in ln]
        if out.returncode != 0 or not rows:
            return Check("gpu", False, f"nvidia-smi failed: {(out.stderr.strip() or out.stdout.strip())[:200]}",
                         "check the NVIDIA driver (nvidia-smi must list the GPUs)")
        models = ", ".join(sorted({r[0].strip() for r in rows}))
        driver = driver or rows[0][1].strip()
    return gpu_node(driver, cuda_bindings(), models)


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


def mpi4py_loads() -> Check:
    """A multi-node job's node agents talk through mpi4py (job/checkpoint/agent.py), over the MPI
    library it was built with: both must load here (without starting MPI)."""
    prog = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
            "print(mpi4py.__version__, MPI.Get_library_version().split(',')[0].strip(' \\0\\n'))")
    try:
        out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return Check("mpi4py", False, "importing mpi4py's MPI did not end in 60 s",
                     "check the MPI library mpi4py loads (Open MPI: scripts/install-deps)")
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return Check("mpi4py", False, f"multi-node jobs cannot be checkpointed: mpi4py does not load ({last})",
                     "pip install 'gpucr-hpc[mpi]' into the Python that runs gpucr-hpc (scripts/setup-venv "
                     "does), with Open MPI installed (scripts/install-deps)")
    return Check("mpi4py", True, f"mpi4py {out.stdout.strip()}: multi-node jobs' agents can talk")


def pmix_types(mpi_list: str) -> list[str]:
    """The MPI plugin types of `srun --mpi=list`'s output (22.05: one per line, indented,
    after "MPI plugin types are..."; 23.02+: "MPI plugin types are...: a,b")."""
    types: list[str] = []
    for line in mpi_list.splitlines():
        line = line.strip()
        if line.startswith("MPI plugin types are"):
            types += [t.strip() for t in line.partition(":")[2].split(",") if t.strip()]
        elif line and not line.startswith("specific") and ":" not in line and " " not in line:
            types.append(line)
    return types


def srun_pmix() -> Check:
    """A multi-node job's agents start as one step with srun --mpi=pmix (job/checkpoint/coordinator.py)."""
    srun = shutil.which("srun")
    if not srun:
        return Check("srun --mpi=pmix", None, "no srun here (Slurm's client commands are not on PATH)")
    out = subprocess.run([srun, "--mpi=list"], capture_output=True, text=True, timeout=60)
    said = out.stdout + "\n" + out.stderr
    if out.returncode != 0 and "MPI plugin types" not in said:
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return Check("srun --mpi=pmix", None, f"not checked: srun --mpi=list failed here ({last})")
    types = pmix_types(said)
    if "pmix" not in types:
        return Check("srun --mpi=pmix", False, f"Slurm has no PMIx plugin here (srun --mpi=list: "
                     f"{', '.join(types) or 'nothing'}): multi-node jobs cannot be checkpointed",
                     "install Slurm's mpi_pmix plugin with libpmix (Debian: slurm-wlm-basic-plugins, "
                     "libpmix2), built for the Slurm the site runs")
    return Check("srun --mpi=pmix", True, f"MPI plugin types: {', '.join(types)}")


# How long a checkpoint of a whole node takes at most, for its partitions' GraceTime: the
# GPU memory and the node's memory (a job may use all of it), written at CHECKPOINT_RATE,
# plus CHECKPOINT_FIXED_S (freeze, the driver's lock, CRIU's start). 2 GB/s is below what
# the H100 runs measured (GPU data 4.6-55 GB/s, results.md) and what CRIU writes to node
# memory: a conservative bound, for a partition whose jobs fill the node.
CHECKPOINT_RATE = 2e9  # bytes per second
CHECKPOINT_FIXED_S = 10


def checkpoint_estimate_s(gpu_bytes: int, host_bytes: int) -> int:
    return int(CHECKPOINT_FIXED_S + (gpu_bytes + host_bytes) / CHECKPOINT_RATE + 0.999)


def preempt_settings(config: dict[str, str], partitions: dict[str, dict[str, str]], need_s: int,
                     estimate: str) -> list[Check]:
    """The preemption settings of the admin guide, from `scontrol show config` (config) and
    `scontrol show partition -o` of this node's partitions: PreemptMode=REQUEUE and the
    user signal (a preempted job checkpoints and requeues itself), and a GraceTime on each
    preempting partition above the checkpoint time the node can reach (need_s)."""
    mode = config.get("PreemptMode", "OFF").upper()
    params = config.get("SlurmctldParameters", "") + "," + config.get("PreemptParameters", "")
    out = []
    if config.get("PreemptType", "preempt/none") == "preempt/none" or "REQUEUE" not in mode:
        out.append(Check("preempt mode", False, f"PreemptType={config.get('PreemptType', '?')} "
                         f"PreemptMode={mode}: a preempted --gpucr=on job is not requeued with its checkpoint",
                         "set PreemptMode=REQUEUE (and a PreemptType) in slurm.conf (admin guide: Preemption)"))
    elif "send_user_signal" not in params:
        out.append(Check("preempt mode", False, "PreemptMode=REQUEUE, but Slurm sends a preempted job no "
                         "signal first: it is requeued without a checkpoint",
                         "set SlurmctldParameters=preempt_send_user_signal (22.05; 23.02+: "
                         "PreemptParameters=send_user_signal) in slurm.conf"))
    else:
        out.append(Check("preempt mode", True, f"PreemptMode={mode}, the user signal is sent"))
    short: list[str] = []
    ok: list[str] = []
    for name, p in sorted(partitions.items()):
        pmode = p.get("PreemptMode", mode).upper()
        if pmode == "OFF":
            continue  # its jobs are not preempted
        grace = int(p.get("GraceTime", "0") or 0)
        (ok if grace > need_s else short).append(f"{name} GraceTime={grace}")
    if short:
        out.append(Check("grace time", False, f"{', '.join(short)} s is not above this node's checkpoint time "
                         f"({need_s} s: {estimate}): a preempted job is killed before its checkpoint ends",
                         f"set GraceTime={need_s * 2} (or more) on those partitions in slurm.conf"))
    elif ok:
        out.append(Check("grace time", True, f"{', '.join(ok)} s, above {need_s} s ({estimate})"))
    else:
        out.append(Check("grace time", None, "no partition of this node preempts its jobs"))
    return out


def _gpu_memory_bytes() -> int:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60)
    return sum(int(x) for x in out.stdout.split() if x.isdigit()) * 2**20


def _host_memory_bytes(real_memory_mb: int) -> int:
    """Slurm's RealMemory of the node where it is set, else the machine's MemTotal."""
    if real_memory_mb > 1:
        return real_memory_mb * 2**20
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def preemption() -> list[Check]:
    from gpucr_hpc.slurm import commands as slurm
    from gpucr_hpc.slurm.site import node_name

    names = ("preempt mode", "grace time")
    node = node_name()
    try:
        conf = slurm.run("scontrol", "show", "config", timeout=30).stdout
        mine = slurm.run("sinfo", "-h", "-N", "-n", node, "-o", "%R %m", timeout=30).stdout.split("\n")
        parts = slurm.run("scontrol", "show", "partition", "-o", timeout=30).stdout
    except GpucrError as e:
        return [Check(n, None, f"not checked: Slurm does not answer here ({e.cause})") for n in names]
    config = {}
    for line in conf.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            config[k.strip()] = v.strip()
    rows = [ln.split() for ln in mine if len(ln.split()) == 2]
    if not rows:
        return [Check(n, None, f"not checked: {node} is in no partition (not a Slurm node)") for n in names]
    wanted = {r[0].rstrip("*") for r in rows}
    partitions = {}
    for line in parts.splitlines():
        p = slurm.parse_one_line(line)
        if p.get("PartitionName") in wanted:
            partitions[p["PartitionName"]] = p
    gpu_b = _gpu_memory_bytes()
    host_b = _host_memory_bytes(max(int(r[1].rstrip("+")) if r[1].rstrip("+").isdigit() else 0 for r in rows))
    need = checkpoint_estimate_s(gpu_b, host_b)
    estimate = (f"{gpu_b / 2**30:.0f} GiB GPU + {host_b / 2**30:.0f} GiB host memory at "
                f"{CHECKPOINT_RATE / 1e9:g} GB/s + {CHECKPOINT_FIXED_S} s")
    return preempt_settings(config, partitions, need, estimate)


# The checks of what the plugstack line names: without that line, each is listed as skipped.
SITE_CHECKS = ("shim", "cli", "image root", "arena", "staging tier", "gpu feature")


def run_all() -> list[Check]:
    plug, site = plugin()
    checks: list[Callable[[], Check | list[Check]]] = [
        criu_version, criu_dumps_here, pycriu, nft, lambda: plug, root_helper, node_key, gpu,
        mpi4py_loads, srun_pmix, preemption]
    if site is not None:  # what the plugstack line names
        checks += [lambda: installed_files(site), lambda: image_root(site), lambda: arena(site),
                   lambda: stage(site), lambda: gpu_feature(site)]
    else:
        checks += [lambda: [Check(n, None, "not checked: no plugstack line of gpucr-hpc to read it from "
                                  "(see the plugin check)") for n in SITE_CHECKS]]
    out: list[Check] = []
    for c in checks:
        try:
            got = c()
        except Exception as e:  # noqa: BLE001 - a check that breaks is a failure to report, not a crash
            got = Check(getattr(c, "__name__", "check"), False, f"{type(e).__name__}: {e}",
                        "report it with this line")
        out += got if isinstance(got, list) else [got]
    return out
