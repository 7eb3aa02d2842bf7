"""The package's layout holds: what sudo runs as root loads only the standard
library and the few of our modules that are themselves standard library only."""

import subprocess
import sys

# criu/run: running CRIU; errors: the one-line error; config: the settings; slurm/signals: a constant;
# criu/netlock, criu/tcp, privileged/tcp, tcp_end, procfs: TCP connections locked, moved and checked
# (CRIU's own image module, pycriu, is loaded only where an image holds TCP connections).
ROOT_MAY_LOAD = {"gpucr_hpc", "gpucr_hpc.config", "gpucr_hpc.criu", "gpucr_hpc.criu.run", "gpucr_hpc.errors",
                 "gpucr_hpc.privileged", "gpucr_hpc.privileged.helper", "gpucr_hpc.slurm",
                 "gpucr_hpc.slurm.signals", "gpucr_hpc.criu.netlock", "gpucr_hpc.criu.tcp",
                 "gpucr_hpc.privileged.tcp", "gpucr_hpc.tcp_end", "gpucr_hpc.procfs",
                 # the helper's own parts (privileged/*) and the PID namespace's init it starts
                 "gpucr_hpc.privileged.checks", "gpucr_hpc.privileged.namespaces", "gpucr_hpc.privileged.root_env",
                 "gpucr_hpc.privileged.scratch", "gpucr_hpc.privileged.seal", "gpucr_hpc.privileged.user_dirs",
                 "gpucr_hpc.criu.pidns_init", "gpucr_hpc.regular_file"}


def loaded_by(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_root_helper_loads_only_what_it_may():
    loaded = loaded_by("gpucr_hpc.privileged.helper")
    ours = {m for m in loaded if m.startswith("gpucr_hpc")}
    assert ours <= ROOT_MAY_LOAD, sorted(ours - ROOT_MAY_LOAD)
    third_party = {m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"gpucr_hpc"}
    site_hooks = {"sitecustomize", "usercustomize"}  # the Python installation's, not ours
    assert not {m for m in third_party - site_hooks if not m.startswith("_")}, sorted(third_party)


def test_every_module_imports():
    """A moved module whose imports were not followed fails here, not in a job."""
    import pkgutil

    import gpucr_hpc
    names = [m.name for m in pkgutil.walk_packages(gpucr_hpc.__path__, "gpucr_hpc.") if not m.name.endswith("__main__")]
    assert len(names) > 30
    out = subprocess.run([sys.executable, "-c", "import importlib, sys\nfor n in sys.argv[1:]: importlib.import_module(n)", *names],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
