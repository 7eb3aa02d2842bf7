/* Which GPU the process uses, for NUMA placement (numa.c): the device of the
 * calling thread's current context, named by its PCI bus id. The shim's threads
 * that place memory or copy (the checkpoint, the arena's growth, the copy
 * workers) make one of the process's contexts current first, so that is the
 * GPU whose data they move. No context, or no driver yet: nothing to name. */
#include "driver.h"
#include "numa_gpu.h"

int gpucr_gpu_busid(char *busid, size_t len)
{
    CUcontext ctx = NULL;
    CUdevice dev;
    if (!gpucr_driver_loaded() || !gpucr_drv.cuDeviceGetPCIBusId ||
        gpucr_drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx ||
        gpucr_drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS ||
        gpucr_drv.cuDeviceGetPCIBusId(busid, (int)len, dev) != CUDA_SUCCESS)
        return -1;
    return 0;
}
