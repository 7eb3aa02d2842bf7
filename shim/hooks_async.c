/* Stream-ordered allocation and memory pools (cudaMallocAsync).
 *
 * Pool memory belongs to the driver's pools, so the shim cannot release it
 * piecewise: it tracks live stream-ordered allocations (reported as the bytes
 * left to the driver checkpoint), trims the pools at checkpoint so only live
 * bytes remain, and refuses when a pool has been shared with another process. */
#include "contexts.h"
#include "driver.h"
#include "export.h"
#include "gate.h"
#include "hooks_async.h"
#include "table.h"

unsigned long gpucr_ipc_sticky;

static void track(uint64_t ptr, size_t size, CUmemoryPool pool)
{
    gpucr_table_lock();
    gpucr_set_put(SET_ASYNC, ptr, size);
    if (pool)
        gpucr_set_put(SET_POOLS, (uint64_t)(uintptr_t)pool, 1);
    gpucr_table_unlock();
}

static void untrack(uint64_t ptr)
{
    gpucr_table_lock();
    gpucr_set_take(SET_ASYNC, ptr, NULL);
    gpucr_table_unlock();
}

#define ALLOC_ASYNC(name, real)                                                             \
    GPUCR_EXPORT CUresult CUDAAPI name(CUdeviceptr *dptr, size_t bytesize, CUstream hStream); \
    GPUCR_EXPORT CUresult CUDAAPI name(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)  \
    {                                                                                       \
        GPUCR_LOAD_OR_FAIL();                                                               \
        if (!real)                                                                          \
            return CUDA_ERROR_NOT_SUPPORTED;                                                \
        gpucr_gate_enter();                                                                 \
        CUresult r = real(dptr, bytesize, hStream);                                         \
        if (r == CUDA_SUCCESS) {                                                            \
            track(*dptr, bytesize, NULL);                                                   \
            gpucr_note_context();                                                           \
        }                                                                                   \
        gpucr_gate_exit();                                                                  \
        return r;                                                                           \
    }

#define ALLOC_POOL(name, real)                                                               \
    GPUCR_EXPORT CUresult CUDAAPI name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, \
                                       CUstream hStream);                                    \
    GPUCR_EXPORT CUresult CUDAAPI name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, \
                                       CUstream hStream)                                     \
    {                                                                                        \
        GPUCR_LOAD_OR_FAIL();                                                                \
        if (!real)                                                                           \
            return CUDA_ERROR_NOT_SUPPORTED;                                                 \
        gpucr_gate_enter();                                                                  \
        CUresult r = real(dptr, bytesize, pool, hStream);                                    \
        if (r == CUDA_SUCCESS) {                                                             \
            track(*dptr, bytesize, pool);                                                    \
            gpucr_note_context();                                                            \
        }                                                                                    \
        gpucr_gate_exit();                                                                   \
        return r;                                                                            \
    }

#define FREE_ASYNC(name, real)                                                \
    GPUCR_EXPORT CUresult CUDAAPI name(CUdeviceptr dptr, CUstream hStream);   \
    GPUCR_EXPORT CUresult CUDAAPI name(CUdeviceptr dptr, CUstream hStream)    \
    {                                                                         \
        GPUCR_LOAD_OR_FAIL();                                                 \
        if (!real)                                                            \
            return CUDA_ERROR_NOT_SUPPORTED;                                  \
        gpucr_gate_enter();                                                   \
        CUresult r = real(dptr, hStream);                                     \
        if (r == CUDA_SUCCESS)                                                \
            untrack(dptr);                                                    \
        gpucr_gate_exit();                                                    \
        return r;                                                             \
    }

ALLOC_ASYNC(cuMemAllocAsync, gpucr_drv.cuMemAllocAsync)
ALLOC_ASYNC(cuMemAllocAsync_ptsz, gpucr_drv.cuMemAllocAsync_ptsz)
ALLOC_POOL(cuMemAllocFromPoolAsync, gpucr_drv.cuMemAllocFromPoolAsync)
ALLOC_POOL(cuMemAllocFromPoolAsync_ptsz, gpucr_drv.cuMemAllocFromPoolAsync_ptsz)
FREE_ASYNC(cuMemFreeAsync, gpucr_drv.cuMemFreeAsync)
FREE_ASYNC(cuMemFreeAsync_ptsz, gpucr_drv.cuMemFreeAsync_ptsz)

static void mark_shared(void)
{
    gpucr_table_lock();
    gpucr_ipc_sticky++;
    gpucr_table_unlock();
}

GPUCR_EXPORT CUresult CUDAAPI cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                               CUmemAllocationHandleType handleType,
                                                               unsigned long long flags)
{
    GPUCR_LOAD_OR_FAIL();
    CUresult r = gpucr_drv.cuMemPoolExportToShareableHandle(handle_out, pool, handleType, flags);
    if (r == CUDA_SUCCESS)
        mark_shared();
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                                 CUmemAllocationHandleType handleType,
                                                                 unsigned long long flags)
{
    GPUCR_LOAD_OR_FAIL();
    CUresult r = gpucr_drv.cuMemPoolImportFromShareableHandle(pool_out, handle, handleType, flags);
    if (r == CUDA_SUCCESS)
        mark_shared();
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
{
    GPUCR_LOAD_OR_FAIL();
    CUresult r = gpucr_drv.cuMemPoolExportPointer(shareData_out, ptr);
    if (r == CUDA_SUCCESS)
        mark_shared();
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                                     CUmemPoolPtrExportData *shareData)
{
    GPUCR_LOAD_OR_FAIL();
    CUresult r = gpucr_drv.cuMemPoolImportPointer(ptr_out, pool, shareData);
    if (r == CUDA_SUCCESS)
        mark_shared();
    return r;
}
