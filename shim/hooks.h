/* Interfaces between the CUDA-facing files of the shim. */
#ifndef GPUCR_HOOKS_H
#define GPUCR_HOOKS_H

#include <cuda.h>

#include "gpucr.h"

/* One intercepted entry point: its exported name, our hook, the real one. */
struct gpucr_hook {
    const char *name;
    void *hook;
    void **real;
};

/* Every hooked entry point, ended by {0}: hooks_registry.c, generated from
 * cuda.h by tools/gen_hooks.py (make gen; make check-generated). */
extern const struct gpucr_hook gpucr_hooks[];

/* The real driver functions the shim itself calls (exported names). */
typedef CUresult CUDAAPI (*gpucr_pfn_getproc_v1)(const char *, void **, int, cuuint64_t);
#define GPUCR_DRIVER_FUNCS(ENTRY)                                                                    \
    ENTRY(cuInit) ENTRY(cuDriverGetVersion) ENTRY(cuCtxGetCurrent) ENTRY(cuCtxSetCurrent)            \
    ENTRY(cuCtxGetDevice) ENTRY(cuCtxSynchronize) ENTRY(cuDeviceGetAttribute)                        \
    ENTRY(cuDeviceGetDefaultMemPool) ENTRY(cuStreamCreate) ENTRY(cuStreamSynchronize) ENTRY(cuStreamIsCapturing) \
    ENTRY(cuMemcpyDtoHAsync_v2) ENTRY(cuMemcpyHtoDAsync_v2) ENTRY(cuMemAddressReserve)               \
    ENTRY(cuMemAddressFree) ENTRY(cuMemCreate) ENTRY(cuMemMap) ENTRY(cuMemUnmap) ENTRY(cuMemRelease) \
    ENTRY(cuMemSetAccess) ENTRY(cuMemGetAllocationGranularity) ENTRY(cuMemHostRegister_v2)           \
    ENTRY(cuMemHostUnregister) ENTRY(cuMemPoolTrimTo) ENTRY(cuMemRetainAllocationHandle)             \
    ENTRY(cuMemExportToShareableHandle) ENTRY(cuMemImportFromShareableHandle)                        \
    ENTRY(cuMemGetAllocationPropertiesFromHandle) ENTRY(cuMemAlloc_v2) ENTRY(cuMemFree_v2)           \
    ENTRY(cuMemAllocManaged) ENTRY(cuMemAllocAsync) ENTRY(cuMemAllocFromPoolAsync)                   \
    ENTRY(cuMemFreeAsync) ENTRY(cuIpcGetMemHandle) ENTRY(cuIpcOpenMemHandle_v2)                      \
    ENTRY(cuIpcCloseMemHandle) ENTRY(cuMemPoolExportToShareableHandle)                               \
    ENTRY(cuMemPoolImportFromShareableHandle) ENTRY(cuMemPoolExportPointer)                          \
    ENTRY(cuMemPoolImportPointer) ENTRY(cuGetProcAddress_v2) ENTRY(cuEventCreate)                    \
    ENTRY(cuEventRecord) ENTRY(cuEventSynchronize) ENTRY(cuMemHostAlloc) ENTRY(cuDeviceGetCount)     \
    ENTRY(cuDeviceGet) ENTRY(cuDeviceGetUuid_v2) ENTRY(cuMulticastCreate)                            \
    ENTRY(cuDeviceGetPCIBusId) ENTRY(cuMemGetInfo_v2)

struct gpucr_driver {
#define GPUCR_FIELD(fn) __typeof__(&fn) fn;
    GPUCR_DRIVER_FUNCS(GPUCR_FIELD)
#undef GPUCR_FIELD
    /* per-thread-default-stream variants and old entry points */
    __typeof__(&cuMemAllocAsync) cuMemAllocAsync_ptsz;
    __typeof__(&cuMemAllocFromPoolAsync) cuMemAllocFromPoolAsync_ptsz;
    __typeof__(&cuMemFreeAsync) cuMemFreeAsync_ptsz;
    gpucr_pfn_getproc_v1 cuGetProcAddress_v1;
};
extern struct gpucr_driver gpucr_drv; /* resolved by gpucr_driver_load() */

int gpucr_driver_load(void);   /* 0 once libcuda is loaded and resolved */
int gpucr_driver_loaded(void); /* the process has used the driver through the shim */
void *gpucr_hook_for_real(void *real);
void *gpucr_real_dlsym(void *handle, const char *name);

extern unsigned long gpucr_stat_getproc_hooked, gpucr_stat_dlsym_hooked;
extern int gpucr_vmm_backing; /* plain allocations are backed by VMM */
extern unsigned long gpucr_ipc_sticky; /* pools exported/imported: never forgets */
extern unsigned long gpucr_multicast; /* multicast objects made (NVLS): never rebuilt, refused */

/* Pass-through of a work-submission call inside the API gate. */
#define GPUCR_GATED_CALL(name, args)                                     \
    do {                                                                 \
        if (!real_##name && (gpucr_driver_load() || !real_##name))       \
            return CUDA_ERROR_NOT_INITIALIZED;                           \
        gpucr_gate_enter();                                              \
        CUresult r_ = ((__typeof__(&name))real_##name) args;             \
        gpucr_gate_exit();                                               \
        return r_;                                                       \
    } while (0)

#define GPUCR_LOAD_OR_FAIL()                        \
    do {                                            \
        if (gpucr_driver_load())                    \
            return CUDA_ERROR_NOT_INITIALIZED;      \
    } while (0)

void gpucr_ipc_forget(uint64_t vhandle); /* an exported allocation is freed */
void gpucr_note_context(void); /* remember the calling thread's current context */
int gpucr_gpu_busid(char *busid, size_t len); /* numa_gpu.c: for gpucr_numa_gpu_busid */
void gpucr_checkpoint_after_fork_child(void);

/* datapath.c: allocation contents to/from the host arena (p->host, p->copy_va) */
extern int gpucr_pin_arena; /* pinned arena, direct DMA (GPUCR_ARENA_PIN) */
void gpucr_datapath_init(void);
struct gpucr_copy_stats {
    double seconds; /* the copy itself */
    double setup_s; /* one-time staging setup paid by this copy */
    int bounce, threads;
    int streaming; /* ring <-> arena with non-temporal stores (GPUCR_COPY_NT) */
    int blocking;  /* workers sleep on the DMA events (GPUCR_COPY_WAIT) */
    /* the copy helper's steps as it timed them ("import_s", "wait_s", ...),
     * summed over its answers: where a helped copy's time went */
    int nsteps;
    struct {
        char name[32];
        double s;
    } steps[16];
};
CUresult gpucr_copy(struct gpucr_phys *const *p, size_t n, int to_host, struct gpucr_copy_stats *st);
CUresult gpucr_staging_setup(void); /* needs a current context */
int gpucr_staging_drop(void);        /* no CUDA call */
double gpucr_staging_seconds(void);
size_t gpucr_staging_bytes(void);
CUresult gpucr_use_ctx(CUcontext ctx);
void gpucr_datapath_after_fork_child(void);
/* arena_ready.c: the arena made ready ahead of checkpoints (GPUCR_ARENA_PREALLOC) */
void gpucr_arena_ready_init(const char *spec); /* a size, or auto */
void gpucr_arena_ready_after_fork_child(void);
int gpucr_arena_ready(void);
const char *gpucr_arena_ready_mode(void); /* "auto", "size" or "off" */
double gpucr_arena_helper_seconds(void); /* the copy helper's mapping and pinning */
int gpucr_host_register(void *base, size_t size); /* checkpoint.c: pins for the arena */
int gpucr_checkpoint_running(void);              /* not checkpointed now */
CUcontext gpucr_any_context(void);               /* one of the process's contexts, or NULL */
/* helper.c: the copy helper path (GPUCR_COPY_HELPER) */
int gpucr_helper_enabled(void);
CUresult gpucr_helper_out(struct gpucr_phys *const *p, size_t n, struct gpucr_copy_stats *st);
CUresult gpucr_helper_in(struct gpucr_phys *const *p, size_t n, struct gpucr_copy_stats *st);
/* after a successful gpucr_helper_in, always: its copies done (keep: the helper keeps its handles) */
CUresult gpucr_helper_in_wait(struct gpucr_phys *const *p, size_t n, int keep, struct gpucr_copy_stats *st);
int gpucr_helper_prefill(struct gpucr_phys *const *p, size_t n); /* no CUDA call */
int gpucr_helper_share_arena(double *secs); /* no CUDA call */
int gpucr_helper_start(double timeout_s);   /* GPUCR_COPY_HELPER_START; no CUDA call */
void gpucr_helper_after_fork_child(void);
void gpucr_helper_disconnect(void); /* before CRIU dumps the process (arena_detach) */
void gpucr_helper_forget(struct gpucr_phys *p); /* the helper lets go of its handle of p */
const char *gpucr_helper_error(void); /* why its last use failed */
const char *gpucr_helper_path(void);  /* its socket */
int gpucr_helper_segments(void);      /* arena segments it has mapped, as they are */
int gpucr_helper_connected(void);     /* a connection is open (none after a migration) */
void gpucr_checkpoint_at_exit(void);
/* mapping.c: where the copies reach an allocation (p->copy_va), and the old
 * addresses mapped again at a restore; callers hold the table lock */
void gpucr_pick_sources(void); /* copy_va: an application mapping of the whole allocation */
CUresult gpucr_scratch_map(struct gpucr_phys *p); /* copy_va: one of our own */
void gpucr_scratch_unmap(struct gpucr_phys *p);
void gpucr_remap_refilling(CUresult *rc); /* PHYS_REFILLING memory at its old addresses */
void gpucr_unmap_refilling(void);
/* copy_engine.c: how allocation contents move between the GPU and the arena */
struct gpucr_engine;
struct gpucr_xfer { /* one out or in */
    struct gpucr_copy_stats cs;
    CUresult rc;                   /* the CUDA error of a failure, or CUDA_SUCCESS */
    double tc;                     /* in: when the copying began */
    const struct gpucr_engine *by; /* the engine that ran last (the one that moved the data) */
    const char *fallback;          /* why the chosen engine did not (the reply's helper_fallback), or NULL */
};
struct gpucr_engine {
    const char *name; /* "helper", "direct" or "bounce": the replies' data_path */
    /* every allocation's contents into p[i]->host; NULL, or why not */
    const char *(*out)(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x);
    /* every allocation re-made at its old addresses and filled from p[i]->host;
     * NULL, or why not (then undone: the data stays in the arena) */
    const char *(*in)(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x);
    /* or NULL: starts an in ahead, while the driver restores; no CUDA call; 0 once started */
    int (*prefill)(struct gpucr_phys *const *p, size_t n);
    const char *(*error)(void); /* or NULL: why its last use failed, in its own words */
};
void gpucr_engine_choose(void); /* at start-up, once */
const struct gpucr_engine *gpucr_engine(void);
/* out or in by the chosen engine, by the process's own where it fails: NULL, or why not */
const char *gpucr_engine_out(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x);
const char *gpucr_engine_in(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x);

#endif
