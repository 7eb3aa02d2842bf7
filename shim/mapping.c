/* Where the copies reach an allocation, and its old addresses mapped again.
 *
 * The copy engines (copy_engine.c) read and write an allocation through one
 * mapping of all of it (p->copy_va): one of the application's where there is
 * one, else a scratch mapping of its own. A restore maps the re-made memory
 * (PHYS_REFILLING) at every address the application had mapped, with the same
 * access. Callers hold the table lock. */
#include <string.h>

#include "driver.h"
#include "mapping.h"
#include "table.h"

static void pick_source(struct gpucr_map *m, void *arg)
{
    (void)arg;
    struct gpucr_phys *p = gpucr_phys_get(m->vhandle);
    if (p && !p->copy_va && m->offset == 0 && m->size >= p->size)
        p->copy_va = m->va;
}

void gpucr_pick_sources(void) { gpucr_map_foreach(pick_source, NULL); }

/* A temporary mapping for a physical allocation that is not mapped whole. */
CUresult gpucr_scratch_map(struct gpucr_phys *p)
{
    CUdeviceptr va = 0;
    CUresult r = gpucr_drv.cuMemAddressReserve(&va, p->size, 0, 0, 0);
    if (r != CUDA_SUCCESS)
        return r;
    r = gpucr_drv.cuMemMap(va, p->size, 0, p->rhandle, 0);
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof acc);
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = p->device;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = gpucr_drv.cuMemSetAccess(va, p->size, &acc, 1);
        if (r != CUDA_SUCCESS)
            gpucr_drv.cuMemUnmap(va, p->size);
    }
    if (r != CUDA_SUCCESS) {
        gpucr_drv.cuMemAddressFree(va, p->size);
        return r;
    }
    p->copy_va = va;
    p->scratch = 1;
    return CUDA_SUCCESS;
}

void gpucr_scratch_unmap(struct gpucr_phys *p)
{
    if (!p->scratch)
        return;
    gpucr_drv.cuMemUnmap(p->copy_va, p->size);
    gpucr_drv.cuMemAddressFree(p->copy_va, p->size);
    p->scratch = 0;
    p->copy_va = 0;
}

static void remap(struct gpucr_map *m, void *arg)
{
    CUresult *rc = arg;
    struct gpucr_phys *p = gpucr_phys_get(m->vhandle);
    if (!p || p->dropped != PHYS_REFILLING || *rc != CUDA_SUCCESS)
        return;
    CUresult r = gpucr_drv.cuMemMap(m->va, m->size, m->offset, p->rhandle, 0);
    if (r == CUDA_SUCCESS && m->naccess)
        r = gpucr_drv.cuMemSetAccess(m->va, m->size, (const CUmemAccessDesc *)m->access, (size_t)m->naccess);
    if (r != CUDA_SUCCESS)
        *rc = r;
}

/* Stops at the first failure, into *rc (CUDA_SUCCESS on entry). */
void gpucr_remap_refilling(CUresult *rc) { gpucr_map_foreach(remap, rc); }

static void undo_remap(struct gpucr_map *m, void *arg)
{
    (void)arg;
    struct gpucr_phys *p = gpucr_phys_get(m->vhandle);
    if (p && p->dropped == PHYS_REFILLING)
        gpucr_drv.cuMemUnmap(m->va, m->size); /* fails harmlessly where it was not mapped */
}

void gpucr_unmap_refilling(void) { gpucr_map_foreach(undo_remap, NULL); }
