/* cuGetProcAddress (both versions): the driver answers, we swap in our hooks. */
#include "driver.h"
#include "export.h"
#include "hooks.h"

#undef cuGetProcAddress
GPUCR_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                               cuuint64_t flags);

static void swap_in(void **pfn)
{
    void *h = pfn ? gpucr_hook_for_real(*pfn) : NULL;
    if (h && h != *pfn) {
        *pfn = h;
        __atomic_fetch_add(&gpucr_stat_getproc_hooked, 1, __ATOMIC_RELAXED);
    }
}

GPUCR_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                                  cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    GPUCR_LOAD_OR_FAIL();
    if (!gpucr_drv.cuGetProcAddress_v2)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = gpucr_drv.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, status);
    if (r == CUDA_SUCCESS)
        swap_in(pfn);
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                               cuuint64_t flags)
{
    GPUCR_LOAD_OR_FAIL();
    CUresult r;
    if (gpucr_drv.cuGetProcAddress_v1)
        r = gpucr_drv.cuGetProcAddress_v1(symbol, pfn, cudaVersion, flags);
    else if (gpucr_drv.cuGetProcAddress_v2)
        r = gpucr_drv.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
    else
        return CUDA_ERROR_NOT_SUPPORTED;
    if (r == CUDA_SUCCESS)
        swap_in(pfn);
    return r;
}
