#!/usr/bin/env python3
"""Generate shim/hooks_registry.c, the registry of every driver entry point the
shim hooks, and site/docs/driver-calls.md, what each entry point does while a
process is yielded. Both come from cuda.h and the one table of
tools/driver_calls.py:

* passes: not hooked; the driver answers at once.
* waits: a gated pass-through hook (enter the API gate, call the real driver
  function, leave the gate), or a hook written by hand that does the same and
  records what the checkpoint needs (HAND_WRITTEN: which file has it).
* answered: a hook written by hand (HAND_WRITTEN) that answers as the driver
  did before the yield.

Every entry point cuda.h declares is classified, under each name the driver
exports it by (cuMemcpyHtoD_v2 and its per-thread cuMemcpyHtoD_v2_ptds, and
older versions cuda.h still declares by their own names, such as
cuCtxCreate_v3). Parameter lists are taken from cuda.h, so the hooks match the
driver ABI exactly, and both files say which cuda.h they came from
(CUDA_VERSION). `make -C shim gen` regenerates them; `make -C shim
check-generated` fails when a committed file is not what this script makes.

    python3 shim/tools/gen_hooks.py /usr/local/cuda/include/cuda.h > shim/hooks_registry.c
    python3 shim/tools/gen_hooks.py --doc /usr/local/cuda/include/cuda.h > site/docs/driver-calls.md
"""
import re
import sys
from pathlib import Path

from driver_calls import ANSWERED, PASSES, RULES, WAITS, classify

SHIM = Path(__file__).resolve().parent.parent

# The hooks written by hand: (file, [(name as written in cuda.h's prototype, exported name)]).
# cuGetProcAddress is the first version, whose prototype cuda.h keeps last.
HAND_WRITTEN = [
    ("hooks_alloc.c", [("cuMemAlloc", "cuMemAlloc_v2"), ("cuMemFree", "cuMemFree_v2"),
                       ("cuMemAllocManaged", "cuMemAllocManaged")]),
    ("hooks_vmm.c", [("cuMemCreate", "cuMemCreate"), ("cuMemRelease", "cuMemRelease"),
                     ("cuMemMap", "cuMemMap"), ("cuMemUnmap", "cuMemUnmap"),
                     ("cuMemSetAccess", "cuMemSetAccess"),
                     ("cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle"),
                     ("cuMemGetAllocationPropertiesFromHandle", "cuMemGetAllocationPropertiesFromHandle"),
                     ("cuMemExportToShareableHandle", "cuMemExportToShareableHandle"),
                     ("cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle"),
                     ("cuMulticastCreate", "cuMulticastCreate")]),
    ("hooks_async.c", [("cuMemAllocAsync", "cuMemAllocAsync"), ("cuMemAllocAsync", "cuMemAllocAsync_ptsz"),
                       ("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync"),
                       ("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"),
                       ("cuMemFreeAsync", "cuMemFreeAsync"), ("cuMemFreeAsync", "cuMemFreeAsync_ptsz"),
                       ("cuMemPoolExportToShareableHandle", "cuMemPoolExportToShareableHandle"),
                       ("cuMemPoolImportFromShareableHandle", "cuMemPoolImportFromShareableHandle"),
                       ("cuMemPoolExportPointer", "cuMemPoolExportPointer"),
                       ("cuMemPoolImportPointer", "cuMemPoolImportPointer")]),
    ("hooks_getproc.c", [("cuGetProcAddress@last", "cuGetProcAddress"), ("cuGetProcAddress", "cuGetProcAddress_v2")]),
    ("hooks_answered.c", [("cuMemGetInfo", "cuMemGetInfo_v2")]),
    ("ipc_legacy.c", [("cuIpcGetMemHandle", "cuIpcGetMemHandle"), ("cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"),
                      ("cuIpcCloseMemHandle", "cuIpcCloseMemHandle")]),
]
HAND = {exported: path for path, hooks in HAND_WRITTEN for _, exported in hooks}
LEGACY_START = "#if defined(__CUDA_API_VERSION_INTERNAL)\n    #undef"  # older versions, under their old names


def prototype_params(params):
    """A parameter list as one line, and its argument names."""
    params = " ".join(params.split())
    args = []
    for p in params.split(","):
        p = p.strip()
        if p in ("", "void"):
            continue
        args.append(re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*(\[\s*\])?$", p).group(1))
    return params, ", ".join(args)


def prototype(text, name):
    """The parameter list of name's prototype in cuda.h and its argument names;
    name@last: the last prototype of that name (cuda.h's older versions)."""
    name, _, which = name.partition("@")
    found = re.findall(r"CUresult CUDAAPI " + re.escape(name) + r"\s*\(([^;]*?)\)\s*;", text)
    if not found:
        sys.exit(f"gen_hooks: no prototype for {name} in cuda.h")
    return prototype_params(found[-1] if which == "last" else found[0])


def cuda_version(text):
    m = re.search(r"^#define CUDA_VERSION (\d+)\s*$", text, re.M)
    if not m:
        sys.exit("gen_hooks: no CUDA_VERSION in cuda.h")
    v = int(m.group(1))
    return v, f"{v // 1000}.{v % 1000 // 10}"


def entry_points(text):
    """[(exported name, name in cuda.h, params, args)] of every entry point cuda.h
    declares, each exported name once: a name cuda.h #defines to a versioned one
    (cuMemcpyHtoD -> cuMemcpyHtoD_v2, per thread also ..._v2_ptds) is exported under
    those; an older version cuda.h declares by its own name (cuCtxCreate_v3) too."""
    start = text.find(LEGACY_START)
    if start < 0:
        sys.exit("gen_hooks: cuda.h has no block of older versions where expected")
    end = text.find("#endif", text.find("#elif defined(__CUDA_API_PER_THREAD_DEFAULT_STREAM)", start))
    current, legacy = text[:start] + text[end:], text[start:end]
    renames = {}
    for m in re.finditer(r"^\s*#define (cu[A-Z]\w*)\s+(?:__CUDA_API_(PTDS|PTSZ)\((\w+)\)|(cu\w+))\s*$", current, re.M):
        target = m.group(3) or m.group(4)
        names = renames.setdefault(m.group(1), [target])
        if m.group(2):
            names.append(target + "_" + m.group(2).lower())
    out, seen = [], set()

    def add(exported, api, params):
        if exported not in seen:
            seen.add(exported)
            out.append((exported, api) + prototype_params(params))

    proto = r"CUresult CUDAAPI (cu\w+)\s*\(([^;]*?)\)\s*;"
    for m in re.finditer(proto, current):
        for exported in renames.get(m.group(1), [m.group(1)]):
            add(exported, m.group(1), m.group(2))
    for m in re.finditer(proto, legacy):
        if m.group(1) not in renames:  # an old version under its own name; others need its old ABI
            add(m.group(1), re.sub(r"(_v\d+)?(_ptds|_ptsz)?$", "", m.group(1)), m.group(2))
    return out


def registry(text):
    version, dotted = cuda_version(text)
    out = [f"/* GENERATED by shim/tools/gen_hooks.py from cuda.h of CUDA {dotted} (CUDA_VERSION {version}):",
           " * do not edit by hand; `make -C shim gen` regenerates it, `make -C shim check-generated`",
           " * says whether it is current. The registry of every hooked driver entry point, and",
           " * the hooks of the entry points that wait at the API gate while a process is yielded",
           " * (tools/driver_calls.py says which, and why). */",
           "/* clang-format off */",
           '#include "export.h"',
           '#include "hooks.h"', "",
           "/* deprecated entry points are still called by old programs: they are hooked too */",
           '#pragma GCC diagnostic ignored "-Wdeprecated-declarations"', "",
           f"#define GPUCR_HOOKS_CUDA_VERSION {version} /* the cuda.h this file was made from */", "",
           "/* ---- gated pass-through hooks ---- */"]
    table = ["", "const struct gpucr_hook gpucr_hooks[] = {"]
    for exported, api, params, args in entry_points(text):
        if exported in HAND or classify(api)[0] != WAITS:
            continue
        out.append(f"static void *real_{exported};")
        out.append(f"GPUCR_EXPORT CUresult CUDAAPI {exported}({params});")
        out.append(f"GPUCR_EXPORT CUresult CUDAAPI {exported}({params})")
        out.append(f"{{ GPUCR_GATED_CALL({exported}, ({args})); }}")
        table.append(f'    {{"{exported}", (void *){exported}, &real_{exported}}},')
    out.append("")
    out.append("/* ---- hooks written by hand (declared here, defined in the file named) ---- */")
    out.append("#undef cuGetProcAddress /* its first version (hooks_getproc.c) */")
    for path, hooks in HAND_WRITTEN:
        source = (SHIM / path).read_text()
        for _, name in hooks:  # an undefined hook would silently resolve to libcuda's at run time
            if not re.search(r"\b" + re.escape(name) + r"\b", source):
                sys.exit(f"gen_hooks: {name} is not in {path}")
        out.append(f"/* {path} */")
        table.append(f"    /* {path} */")
        for src, name in hooks:
            params, _ = prototype(text, src)
            out.append(f"static void *real_{name};")
            out.append(f"GPUCR_EXPORT CUresult CUDAAPI {name}({params});")
            table.append(f'    {{"{name}", (void *){name}, &real_{name}}},')
    out.extend(table)
    out.append("    {0, 0, 0},")
    out.append("};")
    return "\n".join(out)


def doc(text):
    version, dotted = cuda_version(text)
    by_rule = {}
    for exported, api, _, _ in entry_points(text):
        cls, why = classify(api)
        by_rule.setdefault((cls, why), {}).setdefault(api, []).append(exported)
    out = ["<!-- GENERATED by shim/tools/gen_hooks.py --doc from cuda.h and shim/tools/driver_calls.py:",
           "     do not edit by hand; `make -C shim gen` regenerates it. -->",
           "# Driver calls while a process is yielded", "",
           "While a process is checkpointed in place, suspended, or yielded between a preemption's",
           "checkpoint and its dump, its GPU memory is given back to the node. No driver call the",
           "program makes meanwhile sees that: each entry point of the driver API is in one class.", "",
           f"* **{PASSES}**: reaches the driver at once; its answer does not depend on GPU memory or work in flight.",
           f"* **{WAITS}**: waits in the shim until the process has its GPU memory back (at the same",
           "  addresses), then reaches the driver, which answers as it would have before the yield.",
           f"* **{ANSWERED}**: answered by the shim as the driver answered just before the yield, so that",
           "  a thread that only looks is not held; it waits like the others where there is no such answer.", "",
           f"Made from the `cuda.h` of CUDA {dotted}; an entry point a newer driver adds {WAITS} until the",
           "table (`shim/tools/driver_calls.py`) says otherwise. A name is listed once; the",
           "versions the driver exports it under (`_v2`, per-thread `_ptsz`) are in the same class.", "",
           "| Class | Why | Entry points |", "|---|---|---|"]
    order = {(cls, why): i for i, (_, cls, why) in enumerate(RULES)}
    for key in sorted(by_rule, key=order.__getitem__):
        names = ", ".join(f"`{n}`" for n in sorted(by_rule[key]))
        out.append(f"| {key[0]} | {key[1]} | {names} |")
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    as_doc = args[:1] == ["--doc"]
    text = open(args[-1]).read()
    print(doc(text) if as_doc else registry(text))


if __name__ == "__main__":
    main()
