/* Interfaces between the NCCL-facing files of the shim:
 *   nccl_hooks.c  generated hooks of NCCL's entry points (tools/gen_nccl_hooks.py);
 *   nccl_comms.c  virtual communicators: made, ended and described by hand;
 *   nccl_cut.c    the consistent cut, and every communicator torn down at a
 *                 checkpoint and rebuilt after its restore.
 * The application holds virtual communicators (struct gpucr_vcomm) for its
 * whole life; the real ones behind them change at each checkpoint. */
#ifndef GPUCR_NCCL_HOOKS_H
#define GPUCR_NCCL_HOOKS_H

#include "gpucr.h"
#include "nccl_api.h"

#define GPUCR_VCOMM_MAGIC 0x6770637276636f6dULL /* "gpcrvcom" */
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

/* The real NCCL entry point named pname ("pncclAllReduce"), looked up once in
 * the libnccl the process loaded, into *cache. NULL when there is none. */
void *gpucr_nccl_real(void **cache, const char *pname);
/* nccl_lib.c: a fresh copy of libnccl for every hook (after a restore on another
 * node; only with every communicator torn down): 0, or -1 and why. */
int gpucr_nccl_reload(char *why, size_t len);
/* Around every hooked call. enter: GPUCR_NCCL_SUCCESS, or the error to return. */
ncclResult_t gpucr_nccl_enter(struct gpucr_nccl_call *c, ncclComm_t comm, enum gpucr_nccl_kind kind, void **cache,
                              const char *pname, cudaStream_t stream);
void gpucr_nccl_exit(struct gpucr_nccl_call *c);
struct gpucr_vcomm *gpucr_vcomm_of(ncclComm_t comm); /* NULL: not one of ours */

/* nccl_comms.c: the table (callers hold gpucr_nccl_mu) */
extern pthread_mutex_t gpucr_nccl_mu;
extern pthread_cond_t gpucr_nccl_cv;
struct gpucr_vcomm *gpucr_vcomm_first(void);
void gpucr_nccl_comms_after_fork_child(void);
struct gpucr_vreg *gpucr_vreg_first(void);
extern const char *gpucr_nccl_foreign; /* the first entry point given a communicator the shim did not make */
/* Calls from inside NCCL (or from the shim's own teardown and rebuild) pass
 * straight through: NCCL may call its public names itself. */
extern __thread int gpucr_nccl_inner;

/* nccl_finalize.c: finalizes the n communicators in order within timeout_ms: 0
 * (*worst: the worst finalize result; destroy them next), or -1 (the deadline
 * passed: every one was aborted, so none is left to destroy). */
struct gpucr_nccl_finalize_fns {
    ncclResult_t (*finalize)(ncclComm_t);
    ncclResult_t (*abort)(ncclComm_t);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *); /* NULL: none */
};
int gpucr_nccl_finalize_all(const struct gpucr_nccl_finalize_fns *fns, ncclComm_t *comms, size_t n, long timeout_ms,
                            ncclResult_t *worst);

/* nccl_cut.c */
int gpucr_nccl_must_park(void); /* gpucr_nccl_mu held: an operation waits */
int gpucr_nccl_parked(void);    /* gpucr_nccl_mu held: every call waits */
int gpucr_nccl_torn_down(void); /* gpucr_nccl_mu held */
extern long gpucr_nccl_inflight; /* hooked calls inside the real NCCL */
extern long gpucr_nccl_in_group; /* threads between ncclGroupStart and ncclGroupEnd */
extern __thread int gpucr_nccl_group_depth;

#endif
