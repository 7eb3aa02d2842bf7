"""What every driver entry point does while a process is yielded: the one table.

While a process is checkpointed in place (or suspended, or yielded between a
preemption's checkpoint and its dump), its GPU allocations are released and
the driver may hold its context checkpointed too. No driver call the program
makes meanwhile may see that. Each entry point of cuda.h is in one class:

* passes   -- reaches the driver at once: its answer does not depend on GPU
              memory or on work in flight (versions, device properties, the
              current context, the driver's own checkpoint API).
* waits    -- waits at the shim's gate until the process has its GPU state
              back, then reaches the driver, which answers as it would have
              before the yield: the memory is back at the same addresses.
* answered -- answered by the shim, as the driver answered just before the
              yield, so that a thread that only looks (a memory monitor) is
              not held; it waits like the others when there is no such answer.

RULES is matched against the entry point's name in cuda.h (cuMemcpyHtoD, not
its exported cuMemcpyHtoD_v2), first match wins; the last rule takes the rest,
so an entry point a newer cuda.h adds waits until someone decides otherwise.
tools/gen_hooks.py turns it into the hooks and into site/docs/driver-calls.md.
"""
import re

PASSES, WAITS, ANSWERED = "passes", "waits", "answered"

RULES = [
    # -- passes
    (r"cuGetError(String|Name)|cuDriverGetVersion|cuInit", PASSES,
     "the driver's version and error texts"),
    (r"cuGetProcAddress|cuGetExportTable", PASSES,
     "looking up entry points; the shim puts its hooks into the answer"),
    (r"cuCheckpointProcess\w+", PASSES,
     "the driver's own checkpoint API: what takes and gives back the checkpoint"),
    (r"cuDevice(Get|GetCount|GetName|GetUuid|GetLuid|TotalMem|GetAttribute|GetProperties|ComputeCapability"
     r"|GetByPCIBusId|GetPCIBusId|CanAccessPeer|GetP2PAttribute|GetP2PAtomicCapabilities"
     r"|GetHostAtomicCapabilities|GetTexture1DLinearMaxWidth|GetExecAffinitySupport|GetNvSciSyncAttributes"
     r"|PrimaryCtxGetState|GetDevResource)", PASSES,
     "properties of the device, the same before and after"),
    (r"cuCtx(GetCurrent|SetCurrent|PushCurrent|PopCurrent|GetDevice|GetDevice_v2|GetFlags|GetId|GetApiVersion"
     r"|GetLimit|GetCacheConfig|GetSharedMemConfig|GetStreamPriorityRange|GetExecAffinity|GetDevResource"
     r"|FromGreenCtx)", PASSES,
     "the calling thread's current context and the context's settings, kept by the host"),
    (r"cuFunc(GetAttribute|GetName|GetParamInfo|GetModule|IsLoaded)|cuKernel(GetAttribute|GetName"
     r"|GetParamInfo|GetFunction|GetLibrary)|cuModuleGetLoadingMode|cuOccupancy\w+", PASSES,
     "properties of loaded code and occupancy arithmetic"),
    (r"cuStream(GetPriority|GetFlags|GetId|GetDevice|GetCtx|GetCtx_v2|GetGreenCtx|IsCapturing|GetCaptureInfo)"
     r"|cuThreadExchangeStreamCaptureMode", PASSES,
     "a stream's settings and capture state, kept by the host"),
    (r"cuDevSmResourceSplitByCount|cuDevResourceGenerateDesc|cuGreenCtxGetId|cuMulticastGetGranularity"
     r"|cuMemGetAllocationGranularity|cuTensorMap\w+", PASSES,
     "arithmetic on descriptors; no GPU state"),
    (r"cuLogs\w+|cuCoredump\w+", PASSES, "the driver's logs and coredump settings"),
    # -- answered
    (r"cuMemGetInfo", ANSWERED,
     "the free and total memory of the device, as the driver last gave them before the yield"),
    # -- waits
    (r"cuPointer\w+|cuMemGetAddressRange|cuMemRangeGetAttributes?|cuMemGetAccess|cuMemHostGetDevicePointer"
     r"|cuMemHostGetFlags|cuMemGetHandleForAddressRange", WAITS,
     "asks about an address whose memory is yielded (Triton's launcher asks before every launch)"),
    (r"cuMemHost(Register|Unregister|Alloc)|cuMemAllocHost|cuMemFreeHost", WAITS,
     "pins or allocates host memory in the context"),
    (r"cuMem(Alloc|AllocManaged|Free|Create|Release|Map|Unmap|SetAccess|RetainAllocationHandle"
     r"|GetAllocationPropertiesFromHandle|ExportToShareableHandle|ImportFromShareableHandle|AllocAsync"
     r"|AllocFromPoolAsync|FreeAsync|Pool\w+)|cuIpc\w+|cuMulticastCreate", WAITS,
     "allocates, maps or shares GPU memory; the shim records what the checkpoint needs"),
    (r"cuMemcpy\w*|cuMemset\w+|cuMem(Prefetch|Discard|Advise|BatchDecompress)\w*|cuLaunch\w*", WAITS,
     "GPU work: copies, fills and launches"),
    (r"cuStream\w+|cuEvent\w+|cuCtxSynchronize\w*|cuCtx(Record|Wait)Event", WAITS,
     "streams and events: work in flight and its state in the driver"),
    (r"cu(Module|Library|Link)\w+|cuFunc\w+|cuKernel\w+", WAITS,
     "loads code or globals into the context"),
    (r"cuGraph\w+|cuUserObject\w+", WAITS, "builds, instantiates or launches CUDA graphs"),
    (r"\w+", WAITS, "reaches into the context's state on the GPU"),
]

_COMPILED = [(re.compile(pattern), cls, why) for pattern, cls, why in RULES]


def classify(name: str) -> tuple:
    """(class, why) of a cuda.h entry point's name."""
    for pattern, cls, why in _COMPILED:
        if pattern.fullmatch(name):
            return cls, why
    raise ValueError(name)  # unreachable: the last rule takes every name
