/* Entry points the shim answers itself while a process is yielded, as the
 * driver answered just before the yield (tools/driver_calls.py: "answered"), so
 * that a thread that only looks, such as a memory monitor, is not held at the
 * gate. Where there is no earlier answer, the call waits like the others. */
#include <pthread.h>

#include "driver.h"
#include "export.h"
#include "gate.h"

/* cuMemGetInfo: the last answer per context */
#define ANSWERS 64
static struct {
    CUcontext ctx;
    size_t free, total;
} answers[ANSWERS];
static pthread_mutex_t answers_mu = PTHREAD_MUTEX_INITIALIZER;

static int answer_slot(CUcontext ctx, int add)
{
    for (int i = 0; i < ANSWERS; i++)
        if (answers[i].ctx == ctx)
            return i;
    for (int i = 0; add && i < ANSWERS; i++)
        if (!answers[i].ctx)
            return answers[i].ctx = ctx, i;
    return -1;
}

GPUCR_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total)
{
    GPUCR_LOAD_OR_FAIL();
    CUcontext ctx = NULL;
    if (!free || !total || gpucr_drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
        ctx = NULL;
    if (ctx && gpucr_gate_is_closed()) {
        pthread_mutex_lock(&answers_mu);
        int i = answer_slot(ctx, 0);
        if (i >= 0)
            *free = answers[i].free, *total = answers[i].total;
        pthread_mutex_unlock(&answers_mu);
        if (i >= 0)
            return CUDA_SUCCESS;
    }
    gpucr_gate_enter();
    CUresult r = gpucr_drv.cuMemGetInfo_v2(free, total);
    gpucr_gate_exit();
    if (r == CUDA_SUCCESS && ctx) {
        pthread_mutex_lock(&answers_mu);
        int i = answer_slot(ctx, 1);
        if (i >= 0)
            answers[i].free = *free, answers[i].total = *total;
        pthread_mutex_unlock(&answers_mu);
    }
    return r;
}
