/* nccl_finalize.c: finalizes the n communicators in order within timeout_ms: 0
 * (*worst: the worst finalize result; destroy them next), or -1 (the deadline
 * passed: every one was aborted, so none is left to destroy). */
#ifndef GPUCR_NCCL_FINALIZE_H
#define GPUCR_NCCL_FINALIZE_H

#include <stddef.h>

#include "nccl_api.h"

struct gpucr_nccl_finalize_fns {
    ncclResult_t (*finalize)(ncclComm_t);
    ncclResult_t (*abort)(ncclComm_t);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *); /* NULL: none */
};
int gpucr_nccl_finalize_all(const struct gpucr_nccl_finalize_fns *fns, ncclComm_t *comms, size_t n, long timeout_ms,
                            ncclResult_t *worst);

#endif
