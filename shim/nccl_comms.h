/* nccl_comms.c: the virtual communicators, and where the cut holds their calls.
 * The application holds virtual communicators (struct gpucr_vcomm) for its
 * whole life; the real ones behind them change at each checkpoint. The cut's
 * requests (nccl_cut.c) move gpucr_cut; the hooks wait by it. Every field and
 * variable here is under gpucr_nccl_mu unless it says otherwise. */
#ifndef GPUCR_NCCL_COMMS_H
#define GPUCR_NCCL_COMMS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl_api.h"

#define GPUCR_NCCL_CONFIG_MAX 512

struct gpucr_vcomm {
    uint64_t magic;
    ncclComm_t real;  /* NULL while torn down */
    uint64_t key;     /* the same on every rank of the communicator */
    int nranks, rank, seq; /* seq: creation order in this process */
    void *ctx;        /* the CUDA context current when it was made */
    unsigned char config[GPUCR_NCCL_CONFIG_MAX];
    size_t config_size; /* 0: made without a config */
    uint64_t ops;     /* operations issued on it */
    uint64_t target;  /* where the cut wants it (nccl_cut.c) */
    uint64_t children; /* communicators split off it, numbering their keys */
    int ended;        /* finalized, destroyed or aborted by the application */
    const char *unrestorable; /* why a checkpoint must refuse it, or NULL */
    struct gpucr_vcomm *next; /* in creation order */
};

/* A registration (ncclCommRegister): the application's handle, replayed at the
 * same address after a rebuild. */
struct gpucr_vreg {
    uint64_t magic;
    struct gpucr_vcomm *vc;
    void *buff;
    size_t size;
    void *real;
    int gone;
    struct gpucr_vreg *next;
};

extern pthread_mutex_t gpucr_nccl_mu;
extern pthread_cond_t gpucr_nccl_cv; /* the cut moved, or a call left NCCL */
struct gpucr_vcomm *gpucr_vcomm_first(void);
struct gpucr_vreg *gpucr_vreg_first(void);
extern const char *gpucr_nccl_foreign; /* the first entry point given a communicator the shim did not make */
/* Calls from inside NCCL (or from the shim's own teardown and rebuild) pass
 * straight through: NCCL may call its public names itself. Per thread, no lock. */
extern __thread int gpucr_nccl_inner;
extern long gpucr_nccl_inflight; /* hooked calls inside the real NCCL */
extern long gpucr_nccl_in_group; /* threads between ncclGroupStart and ncclGroupEnd */

/* Where the cut is. Frozen: operations park at their hook; to targets: each
 * runs on until every communicator reached its target; parked, torn down: every
 * call waits (but the end of a torn-down communicator). */
enum gpucr_cut_state { CUT_NONE, CUT_FROZEN, CUT_TO_TARGETS, CUT_PARKED, CUT_TORN_DOWN };
extern enum gpucr_cut_state gpucr_cut;
int gpucr_nccl_torn_down(void);
void gpucr_nccl_comms_after_fork_child(void);

#endif
