/* Around every hook of an NCCL entry point that takes a communicator: those
 * generated into nccl_hooks.c (tools/gen_nccl_hooks.py) and those written by
 * hand in nccl_comms.c, which keeps the virtual communicators behind them. */
#ifndef GPUCR_NCCL_HOOKS_H
#define GPUCR_NCCL_HOOKS_H

#include "nccl_api.h"

struct gpucr_vcomm;

/* One hooked call in progress. */
struct gpucr_nccl_call {
    struct gpucr_vcomm *vc; /* NULL: a communicator the shim did not make */
    ncclComm_t real;
};

enum gpucr_nccl_kind {
    GPUCR_NCCL_OPERATION,    /* counted; may park at a cut */
    GPUCR_NCCL_PLAIN,        /* waits only while the communicators are torn down */
    GPUCR_NCCL_UNRESTORABLE, /* plain, and marks its communicator as one a checkpoint refuses */
};

/* Around every hooked call. enter: GPUCR_NCCL_SUCCESS, or the error to return.
 * The real entry point named pname ("pncclAllReduce") is looked up once, into
 * *cache (nccl_lib.c). */
ncclResult_t gpucr_nccl_enter(struct gpucr_nccl_call *c, ncclComm_t comm, enum gpucr_nccl_kind kind, void **cache,
                              const char *pname, cudaStream_t stream);
void gpucr_nccl_exit(struct gpucr_nccl_call *c);

#endif
