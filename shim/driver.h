/* driver.c: the real driver, loaded lazily, and what the shim calls of it. */
#ifndef GPUCR_DRIVER_H
#define GPUCR_DRIVER_H

#include <cuda.h>

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
/* Called once the driver is loaded, by the thread that loaded it: set by init.c
 * (the VRAM yield on SIGTSTP, suspend.c, is for CUDA processes only). */
extern int (*gpucr_on_driver_load)(void);
void *gpucr_real_dlsym(void *handle, const char *name);
/* Driver pointers the program was handed our hooks for: by cuGetProcAddress, by dlsym */
extern unsigned long gpucr_stat_getproc_hooked, gpucr_stat_dlsym_hooked;

#define GPUCR_LOAD_OR_FAIL()                        \
    do {                                            \
        if (gpucr_driver_load())                    \
            return CUDA_ERROR_NOT_INITIALIZED;      \
    } while (0)

#endif
