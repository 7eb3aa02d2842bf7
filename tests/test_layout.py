"""The package's layout holds: what sudo runs as root loads only the standard
library and the few of our modules that are themselves standard library only."""

import subprocess
import sys

# criu/run: running CRIU; errors: the one-line error; config: the settings; slurm/signals: a constant;
# tcp/lock, tcp/end, criu/tcp, privileged/tcp, criu/procfs: TCP connections locked, moved and checked
# (CRIU's own image module, pycriu, is loaded only where an image holds TCP connections).
ROOT_MAY_LOAD = {"gpucr_hpc", "gpucr_hpc.config", "gpucr_hpc.criu", "gpucr_hpc.criu.run", "gpucr_hpc.errors",
                 "gpucr_hpc.privileged", "gpucr_hpc.privileged.helper", "gpucr_hpc.slurm",
                 "gpucr_hpc.slurm.signals", "gpucr_hpc.tcp", "gpucr_hpc.tcp.lock", "gpucr_hpc.criu.tcp",
                 "gpucr_hpc.privileged.tcp", "gpucr_hpc.tcp.end", "gpucr_hpc.criu.procfs",
                 # the helper's own parts (privileged/*) and the PID namespace's init it starts
                 "gpucr_hpc.privileged.checks", "gpucr_hpc.privileged.namespaces", "gpucr_hpc.privileged.root_env",
                 "gpucr_hpc.privileged.scratch", "gpucr_hpc.privileged.seal", "gpucr_hpc.privileged.user_dirs",
                 "gpucr_hpc.criu.pidns_init", "gpucr_hpc.regular_file",
                 # criu/run's process-tree queries and the lock's connections
                 "gpucr_hpc.criu.processes", "gpucr_hpc.tcp.flows"}


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
    out = subprocess.run([sys.executable, "-c",
                          "import importlib, sys\nfor n in sys.argv[1:]: importlib.import_module(n)", *names],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# The floors of the package, top to bottom: a module imports only from its own floor
# or below. Modules at the top of gpucr_hpc (errors, config, figures, ...) are the ground.
FLOORS = [{"__main__"}, {"cli"}, {"doctor"}, {"job"}, {"process"}, {"store"}, {"shim", "privileged"},
          {"criu", "gpu", "tcp"}, {"slurm"}, {""}]
# What breaks the rules today, to be removed; nothing may be added.
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_LOOPS: list[set[str]] = []


def _imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports, at any depth of its code."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "gpucr_hpc"
    mods = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom):
                base = pkg.split(".")[:len(pkg.split(".")) - (n.level - 1)] if n.level else []
                target = ".".join(base + ([n.module] if n.module else []))
                names = [target] + [f"{target}.{a.name}" for a in n.names]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            else:
                continue
            edges[m] |= {x for x in names if x in mods and x != m and not m.startswith(x + ".")}
    return edges


def _floor(module: str) -> int:
    parts = module.split(".")
    sub = parts[1] if len(parts) > 2 or parts[-1] == "__main__" else ""
    return next(i for i, floor in enumerate(FLOORS) if sub in floor)


def test_imports_go_down_the_floors():
    upward = {(a, b) for a, bs in _imports().items() for b in bs if _floor(b) < _floor(a)}
    assert upward == KNOWN_UPWARD, f"new: {sorted(upward - KNOWN_UPWARD)}; gone: {sorted(KNOWN_UPWARD - upward)}"


def test_no_import_loops():
    edges = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops = []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(comp)

    for v in edges:
        if v not in index:
            visit(v)
    assert sorted(map(sorted, loops)) == sorted(map(sorted, KNOWN_LOOPS)), loops


def test_click_only_in_cli():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "gpucr_hpc"
    outside = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if "cli" not in p.relative_to(root).parts and "import click" in p.read_text()]
    assert outside == []


def test_settings_are_parameters_not_our_own_environment():
    """Nothing of ours sets a GPUCR_ setting in its own process's environment to
    reach code it calls (the run dir went through os.environ once): a value is
    passed as a parameter. (The root helper's clean start and the batch
    supervisor's PATH for the script are the environment itself.)"""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "gpucr_hpc"
    writes = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py")
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if re.search(r"os\.environ\[[\"']GPUCR_\w*[\"']\]\s*=[^=]|os\.environ\.setdefault\([\"']GPUCR_"
                           r"|os\.putenv\([\"']GPUCR_|os\.environ\.update\(.*GPUCR_", line)]
    assert writes == []


def test_the_architecture_page_names_every_folder_and_module():
    """The package table of the architecture page is read to find code: every
    folder of the package is a row, and every module is named in its folder's row."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    page = (repo / "site" / "docs" / "architecture.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_/]+/)` \| (.*) \|$", page, re.M)}
    root = repo / "gpucr_hpc"
    missing = []
    for d in sorted(p for p in root.rglob("*") if p.is_dir() and (p / "__init__.py").exists() and p != root):
        folder = f"{d.relative_to(root)}/"
        if folder not in rows:
            missing.append(folder)
            continue
        named = set(re.findall(r"`([a-z_]+)`", rows[folder]))
        missing += [f"{folder}{p.stem}" for p in d.glob("*.py")
                    if p.stem not in ("__init__", "__main__") and p.stem not in named]
    assert missing == []


def _shim_layers():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "shim" / "tools" / "check_layers.py"
    spec = importlib.util.spec_from_file_location("check_layers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_shim_includes_what_it_names_in_layers():
    """shim/tools/check_layers.py (make -C shim check-layers): each C file of the shim
    includes the header of everything it names, and its modules go down in layers."""
    problems, edges = _shim_layers().check()
    assert problems == []
    assert {"log", "json", "table", "driver", "checkpoint", "dispatch", "init"} <= set(edges)


def test_the_shim_layer_check_finds_what_it_forbids(tmp_path):
    """A name from a header not included, a call up the layers, a function that
    belongs in its own file: each is reported."""
    import shutil
    from pathlib import Path

    layers = _shim_layers()
    shim = tmp_path / "shim"
    shutil.copytree(Path(layers.__file__).parent.parent, shim, ignore=shutil.ignore_patterns("*.so", "tools"))
    gate_c, gate_h = (shim / "gate.c").read_text(), (shim / "gate.h").read_text()
    (shim / "gate.c").write_text(gate_c.replace('#include "log.h"\n', "") + "void gpucr_gate_alone(void) {}\n")
    (shim / "gate.h").write_text(gate_h.replace("#endif", "void gpucr_gate_alone(void);\n#endif"))
    numa = (shim / "numa.c").read_text().replace('#include "log.h"', '#include "arena.h"\n#include "log.h"')
    (shim / "numa.c").write_text(numa.replace("return error;", "return *error ? error : gpucr_arena_dir();"))
    problems, _ = layers.check(shim)
    assert "gate.c names gpucr_deadline_in of log.h but does not include it" in problems
    assert "gpucr_gate_alone (gate.h) is named only in gate.c: make it static there" in problems
    assert "modules depend on each other in a loop: arena -> numa" in problems, problems
