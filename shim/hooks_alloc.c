/* Plain allocations (cuMemAlloc/cuMemFree), backed by VMM inside the shim so a
 * checkpoint can release their physical memory and keep their addresses.
 * Also: managed memory, which is only tracked (it makes a checkpoint refuse).
 * Legacy IPC on these allocations: ipc_legacy.c. */
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "export.h"
#include "gate.h"
#include "hooks_alloc.h"
#include "ipc_legacy.h"
#include "log.h"
#include "table.h"

int gpucr_vmm_backing = 1;

_Static_assert(sizeof(CUmemAllocationProp) <= GPUCR_PROP_BYTES, "prop blob too small");
_Static_assert(sizeof(CUmemAccessDesc) <= GPUCR_ACCESS_BYTES, "access blob too small");

#define MAX_DEV 64
static signed char vmm_ok[MAX_DEV]; /* 0 unknown, 1 yes, -1 no */
static signed char fd_ok[MAX_DEV];  /* exportable as a POSIX fd: 0 unknown, 1 yes, -1 no */

static int device_has_vmm(CUdevice dev)
{
    if (dev < 0 || dev >= MAX_DEV)
        return 0;
    if (!vmm_ok[dev]) {
        int v = 0;
        gpucr_drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
        vmm_ok[dev] = v ? 1 : -1;
    }
    return vmm_ok[dev] > 0;
}

/* Allocations are created exportable (POSIX fd) where the device can, so that
 * legacy IPC on them works (ipc_legacy.c); the driver says this costs nothing
 * until a handle is actually exported. */
static int device_has_fd_export(CUdevice dev)
{
    if (!fd_ok[dev]) {
        int v = 0;
        gpucr_drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
        fd_ok[dev] = v ? 1 : -1;
    }
    return fd_ok[dev] > 0;
}

/* reserve + create + map + set access; 1 = not applicable (use the real call) */
static CUresult vmm_alloc(CUdeviceptr *dptr, size_t bytes, int *fallback)
{
    CUcontext ctx = NULL;
    CUdevice dev = 0;
    *fallback = 1;
    if (!gpucr_vmm_backing || bytes == 0 || gpucr_drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx ||
        gpucr_drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS || !device_has_vmm(dev))
        return CUDA_SUCCESS;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    if (device_has_fd_export(dev))
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    if (gpucr_drv.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !gran)
        return CUDA_SUCCESS;
    size_t size = (bytes + gran - 1) / gran * gran;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = gpucr_drv.cuMemAddressReserve(&va, size, 0, 0, 0);
    if (r != CUDA_SUCCESS)
        return CUDA_SUCCESS;
    r = gpucr_drv.cuMemCreate(&h, size, &prop, 0);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && prop.requestedHandleTypes) {
        fd_ok[dev] = -1; /* no exportable memory here: plain VMM still serves */
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
        r = gpucr_drv.cuMemCreate(&h, size, &prop, 0);
    }
    if (r != CUDA_SUCCESS) {
        /* out of memory is the answer; anything else: VMM does not serve here */
        *fallback = r != CUDA_ERROR_OUT_OF_MEMORY;
        if (*fallback && vmm_ok[dev] > 0) {
            gpucr_log("VMM allocation failed (CUDA error %d): plain allocations on device %d go to the driver", (int)r, (int)dev);
            vmm_ok[dev] = -1;
        }
        goto free_va;
    }
    *fallback = 0;
    r = gpucr_drv.cuMemMap(va, size, 0, h, 0);
    if (r != CUDA_SUCCESS)
        goto release;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = gpucr_drv.cuMemSetAccess(va, size, &acc, 1);
    if (r != CUDA_SUCCESS)
        goto unmap;
    gpucr_table_lock();
    struct gpucr_phys *p = gpucr_phys_add(h, size);
    struct gpucr_map *m = p ? gpucr_map_add(va, size, 0, p->vhandle) : NULL;
    if (m) {
        p->flags = PHYS_SHIM_OWNED;
        p->device = dev;
        p->ctx = ctx;
        memcpy(p->prop, &prop, sizeof prop);
        m->naccess = 1;
        memcpy(m->access[0], &acc, sizeof acc);
        gpucr_set_put(SET_CTX, (uint64_t)(uintptr_t)ctx, (uint64_t)dev);
    } else if (p) {
        gpucr_phys_del(p->vhandle);
    }
    gpucr_table_unlock();
    if (!m) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto unmap;
    }
    *dptr = va;
    return CUDA_SUCCESS;
unmap:
    gpucr_drv.cuMemUnmap(va, size);
release:
    gpucr_drv.cuMemRelease(h);
free_va:
    gpucr_drv.cuMemAddressFree(va, size);
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    int fallback;
    CUresult r = vmm_alloc(dptr, bytesize, &fallback);
    if (fallback)
        r = gpucr_drv.cuMemAlloc_v2(dptr, bytesize);
    gpucr_gate_exit();
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    CUresult r = CUDA_SUCCESS;
    gpucr_table_lock();
    struct gpucr_map *m = gpucr_map_get(dptr);
    struct gpucr_phys *p = m ? gpucr_phys_get(m->vhandle) : NULL;
    if (p && (p->flags & PHYS_SHIM_OWNED)) {
        size_t size = m->size;
        uint64_t rh = p->rhandle;
        uint64_t vh = p->vhandle;
        int exported = (p->flags & PHYS_EXPORTED) != 0;
        gpucr_map_del(dptr);
        gpucr_phys_del(vh);
        gpucr_set_take(SET_IPC_LEGACY, dptr, NULL);
        gpucr_table_unlock();
        if (exported)
            gpucr_ipc_forget(vh);
        gpucr_drv.cuCtxSynchronize(); /* cuMemFree waits for work using the memory */
        gpucr_drv.cuMemUnmap(dptr, size);
        gpucr_drv.cuMemRelease(rh);
        r = gpucr_drv.cuMemAddressFree(dptr, size);
    } else {
        gpucr_set_take(SET_MANAGED, dptr, NULL);
        gpucr_set_take(SET_ASYNC, dptr, NULL);
        gpucr_set_take(SET_IPC_LEGACY, dptr, NULL);
        gpucr_table_unlock();
        r = gpucr_drv.cuMemFree_v2(dptr);
    }
    gpucr_gate_exit();
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    CUresult r = gpucr_drv.cuMemAllocManaged(dptr, bytesize, flags);
    if (r == CUDA_SUCCESS) {
        gpucr_table_lock();
        gpucr_set_put(SET_MANAGED, *dptr, bytesize);
        gpucr_table_unlock();
    }
    gpucr_gate_exit();
    return r;
}
