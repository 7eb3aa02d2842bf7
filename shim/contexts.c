/* The process's CUDA contexts, each with its device (the table's SET_CTX), as
 * the hooks see them in use; the shim's own threads make one of them current
 * before they register or copy memory. */
#include <stdint.h>

#include "contexts.h"
#include "driver.h"
#include "table.h"

void gpucr_note_context(void)
{
    CUcontext ctx = NULL;
    CUdevice dev = 0;
    if (gpucr_drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || gpucr_drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return;
    gpucr_table_lock();
    gpucr_set_put(SET_CTX, (uint64_t)(uintptr_t)ctx, (uint64_t)dev);
    gpucr_table_unlock();
}

CUcontext gpucr_any_context(void)
{
    CUcontext ctx = NULL;
    if (!gpucr_driver_loaded())
        return NULL;
    gpucr_table_lock();
    const struct u64map *ctxs = gpucr_set_map(SET_CTX);
    U64MAP_FOREACH(ctxs, i) if (!ctx) ctx = (CUcontext)(uintptr_t)ctxs->keys[i];
    gpucr_table_unlock();
    return ctx;
}
