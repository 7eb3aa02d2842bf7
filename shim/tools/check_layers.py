#!/usr/bin/env python3
"""The shim's include graph, in layers: `make -C shim check-layers` (and
tests/test_layout.py) runs it; it prints the modules layer by layer.

A module is a .c file and the header of the same name, or one of GROUPS; a
header of its own declares what the module exports. It fails when
  - a file names something declared in a shim header it does not include
    itself (the compiler is content with a declaration that came through
    another header, so a file's includes would stop saying what it uses);
  - a file includes a shim header it names nothing of;
  - a name is declared in two headers;
  - a function or variable a header declares is named by its own file only
    (it belongs there, static), or by none;
  - headers include each other in a loop, or modules depend on each other in
    a loop (a call up the layers goes through a pointer the caller is given).
"""

import re
import sys
from pathlib import Path

SHIM = Path(__file__).resolve().parent.parent

# Modules of more than one .c file: one job, one public header, and a header the
# generated file includes (tools/gen_hooks.py, tools/gen_nccl_hooks.py).
GROUPS = {
    "driver": ("driver.c", "driver.h", "hooks.h", "hooks_registry.c", "hooks_getproc.c"),
    "nccl_comms": ("nccl_comms.c", "nccl_comms.h", "nccl_hooks.h", "nccl_hooks.c"),
}
MODULE_OF = {f: m for m, files in GROUPS.items() for f in files}

TOKENS = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def strip(text: str) -> str:
    """Comments and literals out, continued lines joined."""
    text = TOKENS.sub(lambda m: " " if m.group(0)[0] == "/" else '""', text)
    return text.replace("\\\n", " ")


def module(name: str) -> str:
    return MODULE_OF.get(name, name.rsplit(".", 1)[0])


def statements(code: str):
    """The top-level declarations of a header: neither preprocessor lines nor the
    expansions of an X-macro list (GPUCR_KEYS(...)), whose names come as prefixes."""
    code = "\n".join(ln for ln in code.splitlines()
                     if not ln.lstrip().startswith("#") and not re.fullmatch(r"\s*[A-Z_0-9]+\(.*\)\s*", ln))
    depth, start = 0, 0
    for i, c in enumerate(code):
        if c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
        elif c == ";" and depth == 0:
            yield code[start:i].strip()
            start = i + 1


def flatten(s: str) -> tuple[str, list[tuple[str, str]]]:
    """s with each top-level {...} emptied, and (what came before it, its body) of each."""
    out, bodies, depth, start, opened = [], [], 0, 0, 0
    for i, c in enumerate(s):
        if c == "{":
            if depth == 0:
                out.append(s[start:i])
                opened = i + 1
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                bodies.append(("".join(out), s[opened:i]))
                start = i + 1
    out.append(s[start:])
    return " ".join(out), bodies


def declared(header: str) -> tuple[set[str], set[str], set[str]]:
    """What a header declares: (functions and variables, other names, name prefixes
    of the X-macro families it declares)."""
    code = strip(header)
    objects, others, prefixes = set(), set(), set()
    for m in re.finditer(r"^\s*#\s*define\s+(\w+)(.*)$", code, re.M):
        if not m.group(1).endswith("_H"):
            others.add(m.group(1))
        if "extern" in m.group(2):
            prefixes |= set(re.findall(r"(\w+)##", m.group(2)))
    for s in statements(code):
        s, bodies = flatten(s)
        for before, body in bodies:
            tag = re.search(r"\b(?:struct|union|enum)\s+(\w+)\s*$", before)
            if tag:
                others.add(tag.group(1))
            if re.search(r"\benum\b\s*\w*\s*$", before):
                others |= {e.split("=")[0].strip() for e in body.split(",") if e.strip()}
        s = s.strip()
        if not s or re.fullmatch(r"(?:struct|union|enum)(?:\s+\w+)?", s):
            continue
        paren = s.find("(")
        pointer = re.match(r"\(\s*\*\s*(\w+)\s*\)", s[paren:]) if paren >= 0 else None
        if pointer:  # a pointer to a function, or its type
            (others if s.startswith("typedef") else objects).add(pointer.group(1))
        elif paren >= 0 and not s.startswith("typedef"):
            objects.add(IDENT.findall(s[:paren])[-1])
        else:
            (others if s.startswith("typedef") else objects).add(IDENT.findall(re.sub(r"\[[^\]]*\]", "", s))[-1])
    undone = set(re.findall(r"^\s*#\s*undef\s+(\w+)", code, re.M))
    others -= undone
    return objects, others, prefixes


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, found = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def check(shim: Path = SHIM) -> tuple[list[str], dict[str, set[str]]]:
    """The rules broken, and the module graph."""
    headers = {p.name: p.read_text() for p in sorted(shim.glob("*.h"))}
    files = {p.relative_to(shim).as_posix(): p.read_text()
             for p in sorted([*shim.glob("*.c"), *shim.glob("*.h"), *shim.glob("tests/*.c")])}
    problems = []
    owner: dict[str, str] = {}
    objects: dict[str, str] = {}
    prefixes: dict[str, str] = {}
    for h, text in headers.items():
        objs, others, prefs = declared(text)
        for name in objs | others:
            if name in owner and owner[name] != h:
                problems.append(f"{name} is declared in both {owner[name]} and {h}")
            owner[name] = h
        objects.update(dict.fromkeys(objs, h))
        prefixes.update(dict.fromkeys(prefs, h))

    def owner_of(name: str):
        return owner.get(name) or next((h for p, h in prefixes.items() if name.startswith(p)), None)

    named_in: dict[str, set[str]] = {}
    edges: dict[str, set[str]] = {}
    header_edges: dict[str, set[str]] = {}
    for f, text in files.items():
        includes = {inc for inc in INCLUDE.findall(text) if inc in headers}  # tests build with -I.
        code = strip(text)
        used = set(IDENT.findall(INCLUDE.sub("", code)))
        forward = set(re.findall(r"\b(?:struct|union)\s+(\w+)\s*;", code))
        for name in used:
            named_in.setdefault(name, set()).add(f)
        uses_from = {}
        for name in used:
            h = owner_of(name)
            if h and h != f and name not in forward:
                uses_from.setdefault(h, name)
        for h, name in sorted(uses_from.items()):
            if h not in includes:
                problems.append(f"{f} names {name} of {h} but does not include it")
        for h in sorted(includes - set(uses_from)):
            problems.append(f"{f} includes {h} but names nothing declared there")
        if "/" not in f:
            edges.setdefault(module(f), set()).update(module(h) for h in includes if module(h) != module(f))
            if f.endswith(".h"):
                header_edges[f] = includes
    for name, h in sorted(objects.items()):
        users = sorted(u for u in named_in.get(name, ()) if u.endswith(".c"))
        if len(users) < 2:
            problems.append(f"{name} ({h}) is named only in {users[0]}: make it static there" if users
                            else f"{name} ({h}) is named by no file: remove it")
    for loop in loops(header_edges):
        problems.append("headers include each other in a loop: " + " -> ".join(loop))
    for loop in loops(edges):
        problems.append("modules depend on each other in a loop: " + " -> ".join(loop))
    return problems, edges


def layers(edges: dict[str, set[str]]) -> list[list[str]]:
    """Modules by the longest chain of dependencies under them."""
    depth: dict[str, int] = {}

    def of(m):
        if m not in depth:
            depth[m] = 1 + max((of(d) for d in edges.get(m, ())), default=-1)
        return depth[m]

    for m in edges:
        of(m)
    out: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for m, d in sorted(depth.items()):
        out[d].append(m)
    return out


def main() -> int:
    problems, edges = check()
    for p in problems:
        print(f"check-layers: {p}", file=sys.stderr)
    if problems:
        return 1
    for n, mods in enumerate(layers(edges)):
        print(f"layer {n}: " + ", ".join(f"{m} ({' '.join(sorted(edges[m]))})" if edges[m] else m for m in mods))
    return 0


if __name__ == "__main__":
    sys.exit(main())
