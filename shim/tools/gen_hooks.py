#!/usr/bin/env python3
"""Generate shim/hooks_registry.c: the registry of every driver entry point the
shim hooks (its exported name, our hook, the slot for the real function), and
the gated pass-through hooks themselves.

A gated hook enters the API gate, calls the real driver function, leaves the
gate. The other hooks are written by hand (HAND_WRITTEN: which file has them);
the registry only declares them. Parameter lists are taken from cuda.h, so the
hooks match the driver ABI exactly, and the file says which cuda.h it came from
(CUDA_VERSION). `make -C shim gen` regenerates it; `make -C shim check-generated`
fails when the committed file is not what this script makes of cuda.h.

    python3 shim/tools/gen_hooks.py /usr/local/cuda/include/cuda.h > shim/hooks_registry.c
"""
import re
import sys
from pathlib import Path

SHIM = Path(__file__).resolve().parent.parent

# (name as written in cuda.h's prototype, exported base name, per-thread suffix or "")
PTDS, PTSZ = "_ptds", "_ptsz"
ENTRIES = [
    ("cuMemcpy", "cuMemcpy", PTDS),
    ("cuMemcpyPeer", "cuMemcpyPeer", PTDS),
    ("cuMemcpy3DPeer", "cuMemcpy3DPeer", PTDS),
    ("cuMemcpyHtoD", "cuMemcpyHtoD_v2", PTDS),
    ("cuMemcpyDtoH", "cuMemcpyDtoH_v2", PTDS),
    ("cuMemcpyDtoD", "cuMemcpyDtoD_v2", PTDS),
    ("cuMemcpyDtoA", "cuMemcpyDtoA_v2", PTDS),
    ("cuMemcpyAtoD", "cuMemcpyAtoD_v2", PTDS),
    ("cuMemcpyHtoA", "cuMemcpyHtoA_v2", PTDS),
    ("cuMemcpyAtoH", "cuMemcpyAtoH_v2", PTDS),
    ("cuMemcpyAtoA", "cuMemcpyAtoA_v2", PTDS),
    ("cuMemcpy2D", "cuMemcpy2D_v2", PTDS),
    ("cuMemcpy2DUnaligned", "cuMemcpy2DUnaligned_v2", PTDS),
    ("cuMemcpy3D", "cuMemcpy3D_v2", PTDS),
    ("cuMemsetD8", "cuMemsetD8_v2", PTDS),
    ("cuMemsetD16", "cuMemsetD16_v2", PTDS),
    ("cuMemsetD32", "cuMemsetD32_v2", PTDS),
    ("cuMemsetD2D8", "cuMemsetD2D8_v2", PTDS),
    ("cuMemsetD2D16", "cuMemsetD2D16_v2", PTDS),
    ("cuMemsetD2D32", "cuMemsetD2D32_v2", PTDS),
    ("cuMemcpyAsync", "cuMemcpyAsync", PTSZ),
    ("cuMemcpyPeerAsync", "cuMemcpyPeerAsync", PTSZ),
    ("cuMemcpy3DPeerAsync", "cuMemcpy3DPeerAsync", PTSZ),
    ("cuMemcpyHtoAAsync", "cuMemcpyHtoAAsync_v2", PTSZ),
    ("cuMemcpyAtoHAsync", "cuMemcpyAtoHAsync_v2", PTSZ),
    ("cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", PTSZ),
    ("cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", PTSZ),
    ("cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2", PTSZ),
    ("cuMemcpy2DAsync", "cuMemcpy2DAsync_v2", PTSZ),
    ("cuMemcpy3DAsync", "cuMemcpy3DAsync_v2", PTSZ),
    ("cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2", PTSZ),
    ("cuMemcpy3DBatchAsync", "cuMemcpy3DBatchAsync_v2", PTSZ),
    ("cuMemsetD8Async", "cuMemsetD8Async", PTSZ),
    ("cuMemsetD16Async", "cuMemsetD16Async", PTSZ),
    ("cuMemsetD32Async", "cuMemsetD32Async", PTSZ),
    ("cuMemsetD2D8Async", "cuMemsetD2D8Async", PTSZ),
    ("cuMemsetD2D16Async", "cuMemsetD2D16Async", PTSZ),
    ("cuMemsetD2D32Async", "cuMemsetD2D32Async", PTSZ),
    ("cuMemPrefetchAsync", "cuMemPrefetchAsync_v2", PTSZ),
    ("cuLaunchKernel", "cuLaunchKernel", PTSZ),
    ("cuLaunchKernelEx", "cuLaunchKernelEx", PTSZ),
    ("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", PTSZ),
    ("cuLaunchHostFunc", "cuLaunchHostFunc", PTSZ),
    ("cuStreamAddCallback", "cuStreamAddCallback", PTSZ),
    ("cuGraphLaunch", "cuGraphLaunch", PTSZ),
    ("cuStreamWriteValue32", "cuStreamWriteValue32_v2", PTSZ),
    ("cuStreamWaitValue32", "cuStreamWaitValue32_v2", PTSZ),
    ("cuStreamWriteValue64", "cuStreamWriteValue64_v2", PTSZ),
    ("cuStreamWaitValue64", "cuStreamWaitValue64_v2", PTSZ),
    ("cuStreamBatchMemOp", "cuStreamBatchMemOp_v2", PTSZ),
    # Not work, but they reach into the driver's state of streams and events: after
    # the driver checkpoint a thread polling a stream (XLA's stream status monitor
    # calls cuStreamQuery) crashed in the driver. They wait at the gate too.
    ("cuStreamQuery", "cuStreamQuery", PTSZ),
    ("cuStreamSynchronize", "cuStreamSynchronize", PTSZ),
    ("cuStreamWaitEvent", "cuStreamWaitEvent", PTSZ),
    ("cuEventRecord", "cuEventRecord", PTSZ),
    ("cuEventRecordWithFlags", "cuEventRecordWithFlags", PTSZ),
    ("cuEventQuery", "cuEventQuery", ""),
    ("cuEventSynchronize", "cuEventSynchronize", ""),
    ("cuCtxSynchronize", "cuCtxSynchronize", ""),
]

# The hooks written by hand, in the order the registry looks them up after the
# gated ones: (file, [(name as written in cuda.h's prototype, exported name)]).
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
    ("ipc_legacy.c", [("cuIpcGetMemHandle", "cuIpcGetMemHandle"), ("cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"),
                      ("cuIpcCloseMemHandle", "cuIpcCloseMemHandle")]),
]


def prototype(text, name):
    """The parameter list of name's prototype in cuda.h and its argument names;
    name@last: the last prototype of that name (cuda.h's older versions)."""
    name, _, which = name.partition("@")
    found = re.findall(r"CUresult CUDAAPI " + re.escape(name) + r"\s*\(([^;]*?)\)\s*;", text)
    if not found:
        sys.exit(f"gen_hooks: no prototype for {name} in cuda.h")
    params = " ".join((found[-1] if which == "last" else found[0]).split())
    args = []
    for p in params.split(","):
        p = p.strip()
        if p in ("", "void"):
            continue
        arg = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*(\[\s*\])?$", p)
        args.append(arg.group(1))
    return params, ", ".join(args)


def cuda_version(text):
    m = re.search(r"^#define CUDA_VERSION (\d+)\s*$", text, re.M)
    if not m:
        sys.exit("gen_hooks: no CUDA_VERSION in cuda.h")
    v = int(m.group(1))
    return v, f"{v // 1000}.{v % 1000 // 10}"


def main():
    text = open(sys.argv[1]).read()
    version, dotted = cuda_version(text)
    out = [f"/* GENERATED by shim/tools/gen_hooks.py from cuda.h of CUDA {dotted} (CUDA_VERSION {version}):",
           " * do not edit by hand; `make -C shim gen` regenerates it, `make -C shim check-generated`",
           " * says whether it is current. The registry of every hooked driver entry point, and",
           " * the work-submission hooks, each of which passes through the API gate. */",
           "/* clang-format off */",
           '#include "hooks.h"', "",
           f"#define GPUCR_HOOKS_CUDA_VERSION {version} /* the cuda.h this file was made from */", "",
           "/* ---- gated pass-through hooks ---- */"]
    table = ["", "const struct gpucr_hook gpucr_hooks[] = {"]
    for src, base, suffix in ENTRIES:
        params, args = prototype(text, src)
        for name in dict.fromkeys((base, base + suffix)):  # one, where there is no per-thread variant
            out.append(f"static void *real_{name};")
            out.append(f"GPUCR_EXPORT CUresult CUDAAPI {name}({params});")
            out.append(f"GPUCR_EXPORT CUresult CUDAAPI {name}({params})")
            out.append(f"{{ GPUCR_GATED_CALL({name}, ({args})); }}")
            table.append(f'    {{"{name}", (void *){name}, &real_{name}}},')
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
    print("\n".join(out))


if __name__ == "__main__":
    main()
