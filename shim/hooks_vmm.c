/* The application's own VMM calls (PyTorch expandable segments, NCCL, ...).
 * Tracked so a checkpoint can save and release their physical memory and a
 * restore can re-create it at the same addresses. The application keeps the
 * handle values it was given ("vhandles"); we translate to the driver's. */
#include <string.h>

#include "driver.h"
#include "export.h"
#include "gate.h"
#include "hooks_async.h"
#include "hooks_vmm.h"
#include "table.h"

static uint64_t real_of(uint64_t vh, struct gpucr_phys **out)
{
    struct gpucr_phys *p = gpucr_phys_get(vh);
    if (out)
        *out = p;
    return p ? p->rhandle : vh;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                          const CUmemAllocationProp *prop, unsigned long long flags)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    CUmemGenericAllocationHandle rh = 0;
    CUresult r = gpucr_drv.cuMemCreate(&rh, size, prop, flags);
    if (r == CUDA_SUCCESS) {
        CUcontext ctx = NULL;
        gpucr_drv.cuCtxGetCurrent(&ctx);
        gpucr_table_lock();
        struct gpucr_phys *p = gpucr_phys_add(rh, size);
        if (p) {
            memcpy(p->prop, prop, sizeof *prop);
            p->create_flags = flags;
            p->device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
            p->ctx = ctx;
            if (ctx && p->device >= 0)
                gpucr_set_put(SET_CTX, (uint64_t)(uintptr_t)ctx, (uint64_t)p->device);
            *handle = p->vhandle;
        } else {
            *handle = rh; /* out of memory for bookkeeping: untracked */
        }
        gpucr_table_unlock();
    }
    gpucr_gate_exit();
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    CUresult r = CUDA_SUCCESS;
    struct gpucr_phys *p;
    gpucr_table_lock();
    uint64_t rh = real_of(handle, &p);
    if (!p) {
        gpucr_table_unlock();
        r = gpucr_drv.cuMemRelease(handle);
    } else {
        if (--p->user_refs <= 0) {
            p->user_refs = 0;
            r = gpucr_drv.cuMemRelease(rh);
            if (p->nmaps == 0)
                gpucr_phys_del(handle);
        }
        gpucr_table_unlock();
    }
    gpucr_gate_exit();
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                       CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    struct gpucr_phys *p;
    gpucr_table_lock();
    uint64_t rh = real_of(handle, &p);
    gpucr_table_unlock();
    CUresult r = gpucr_drv.cuMemMap(ptr, size, offset, rh, flags);
    if (r == CUDA_SUCCESS && p) {
        gpucr_table_lock();
        gpucr_map_add(ptr, size, offset, handle);
        gpucr_table_unlock();
    }
    gpucr_gate_exit();
    return r;
}

static void drop_map(struct gpucr_map *m, void *arg)
{
    (void)arg;
    uint64_t vh = m->vhandle;
    gpucr_map_del(m->va);
    struct gpucr_phys *p = gpucr_phys_get(vh);
    if (p && p->nmaps == 0 && p->user_refs == 0 && !(p->flags & PHYS_SHIM_OWNED))
        gpucr_phys_del(vh);
}

GPUCR_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    CUresult r = gpucr_drv.cuMemUnmap(ptr, size);
    if (r == CUDA_SUCCESS) {
        gpucr_table_lock();
        gpucr_map_foreach_in(ptr, size, drop_map, NULL);
        gpucr_table_unlock();
    }
    gpucr_gate_exit();
    return r;
}

struct access_arg {
    const CUmemAccessDesc *desc;
    size_t count;
};

static void set_access(struct gpucr_map *m, void *arg)
{
    struct access_arg *a = arg;
    size_t n = a->count < GPUCR_MAX_ACCESS ? a->count : GPUCR_MAX_ACCESS;
    for (size_t i = 0; i < n; i++) {
        /* replace the entry for the same location, else append */
        int slot = -1;
        for (int k = 0; k < m->naccess; k++)
            if (!memcmp(m->access[k], &a->desc[i].location, sizeof(CUmemLocation)))
                slot = k;
        if (slot < 0 && m->naccess < GPUCR_MAX_ACCESS)
            slot = m->naccess++;
        if (slot >= 0)
            memcpy(m->access[slot], &a->desc[i], sizeof(CUmemAccessDesc));
    }
}

GPUCR_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                             size_t count)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    CUresult r = gpucr_drv.cuMemSetAccess(ptr, size, desc, count);
    if (r == CUDA_SUCCESS) {
        struct access_arg a = {desc, count};
        gpucr_table_lock();
        gpucr_map_foreach_in(ptr, size, set_access, &a);
        gpucr_table_unlock();
    }
    gpucr_gate_exit();
    return r;
}

struct find_arg {
    struct gpucr_map *found;
};

static void find_one(struct gpucr_map *m, void *arg) { ((struct find_arg *)arg)->found = m; }

GPUCR_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    GPUCR_LOAD_OR_FAIL();
    CUmemGenericAllocationHandle rh = 0;
    CUresult r = gpucr_drv.cuMemRetainAllocationHandle(&rh, addr);
    if (r != CUDA_SUCCESS)
        return r;
    struct find_arg f = {NULL};
    gpucr_table_lock();
    gpucr_map_foreach_in((uint64_t)(uintptr_t)addr, 1, find_one, &f);
    struct gpucr_phys *p = f.found ? gpucr_phys_get(f.found->vhandle) : NULL;
    if (p && p->rhandle == rh) {
        /* the shim holds one driver reference per tracked handle; count the
         * application's references itself */
        gpucr_drv.cuMemRelease(rh);
        p->user_refs++;
        *handle = p->vhandle;
    } else {
        *handle = rh;
    }
    gpucr_table_unlock();
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                                      CUmemGenericAllocationHandle handle)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_table_lock();
    uint64_t rh = real_of(handle, NULL);
    gpucr_table_unlock();
    return gpucr_drv.cuMemGetAllocationPropertiesFromHandle(prop, rh);
}

GPUCR_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                                           CUmemAllocationHandleType handleType,
                                                           unsigned long long flags)
{
    GPUCR_LOAD_OR_FAIL();
    struct gpucr_phys *p;
    gpucr_table_lock();
    uint64_t rh = real_of(handle, &p);
    gpucr_table_unlock();
    CUresult r = gpucr_drv.cuMemExportToShareableHandle(shareableHandle, rh, handleType, flags);
    if (r == CUDA_SUCCESS) {
        gpucr_table_lock();
        if ((p = gpucr_phys_get(handle)))
            p->flags |= PHYS_EXPORTED;
        else
            gpucr_ipc_sticky++;
        gpucr_table_unlock();
    }
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                             CUmemAllocationHandleType shHandleType)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    CUmemGenericAllocationHandle rh = 0;
    CUresult r = gpucr_drv.cuMemImportFromShareableHandle(&rh, osHandle, shHandleType);
    if (r == CUDA_SUCCESS) {
        gpucr_table_lock();
        struct gpucr_phys *p = gpucr_phys_add(rh, 0);
        if (p) {
            p->flags |= PHYS_IMPORTED;
            p->device = -1;
            *handle = p->vhandle;
        } else {
            gpucr_ipc_sticky++;
            *handle = rh;
        }
        gpucr_table_unlock();
    }
    gpucr_gate_exit();
    return r;
}

/* NVLink multicast (NCCL's NVLS): its objects span processes and cannot be made
 * again at a restore; a process that made one is refused (checkpoint.c). Only
 * counted here: the call itself goes to the driver unchanged. */
unsigned long gpucr_multicast;

GPUCR_EXPORT CUresult CUDAAPI cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop)
{
    __atomic_fetch_add(&gpucr_multicast, 1, __ATOMIC_RELAXED);
    GPUCR_LOAD_OR_FAIL();
    return gpucr_drv.cuMulticastCreate(mcHandle, prop);
}
