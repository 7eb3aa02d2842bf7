/* Virtual NCCL communicators: the application gets one of ours for every
 * communicator it makes and keeps it for life; the real one behind it is torn
 * down at a checkpoint and made anew after the restore (nccl_cut.c). Here: the
 * entry points that make, end and describe communicators, groups, and the
 * registrations replayed after a rebuild. Every other entry point that takes a
 * communicator is generated (nccl_hooks.c).
 *
 * A communicator's key is the same on each of its ranks, so the agents can
 * match them: a hash of the unique id it was made from, or for a split, its
 * parent's key, the split's number on the parent and the colour. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "export.h"
#include "log.h"
#include "nccl_api.h"
#include "nccl_comms.h"
#include "nccl_hooks.h"
#include "nccl_lib.h"

#define GPUCR_VCOMM_MAGIC 0x6770637276636f6dULL /* "gpcrvcom" */

pthread_mutex_t gpucr_nccl_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t gpucr_nccl_cv = PTHREAD_COND_INITIALIZER;
const char *gpucr_nccl_foreign;
__thread int gpucr_nccl_inner;
long gpucr_nccl_inflight;
long gpucr_nccl_in_group;
enum gpucr_cut_state gpucr_cut;
static __thread int group_depth; /* ncclGroupStart calls not yet ended, on this thread */
static struct gpucr_vcomm *first, *last;
static struct gpucr_vreg *regs;
static int nseq;

struct gpucr_vcomm *gpucr_vcomm_first(void) { return first; }
struct gpucr_vreg *gpucr_vreg_first(void) { return regs; }

/* ---- where the cut holds the calls (nccl_cut.c moves it) ----------------- */

static int at_targets(void)
{
    for (struct gpucr_vcomm *vc = first; vc; vc = vc->next)
        if (!vc->ended && vc->ops < vc->target)
            return 0;
    return 1;
}

/* An operation waits. */
static int must_park(void)
{
    return gpucr_cut == CUT_FROZEN || gpucr_cut >= CUT_PARKED || (gpucr_cut == CUT_TO_TARGETS && at_targets());
}

static int parked(void) { return gpucr_cut >= CUT_PARKED; } /* every call waits */
int gpucr_nccl_torn_down(void) { return gpucr_cut == CUT_TORN_DOWN; }

#define REAL(pname, type) ((type)gpucr_nccl_real(&real_##pname, #pname))
#define NCCL_MISSING 3 /* ncclInternalError: the real entry point is not there */

/* A real communicator behind one of ours (NCCL calling its own names), under gpucr_nccl_mu. */
static int gpucr_nccl_known_real(ncclComm_t comm)
{
    for (struct gpucr_vcomm *vc = first; vc; vc = vc->next)
        if (vc->real == comm)
            return 1;
    return 0;
}

/* NULL: not one of ours */
static struct gpucr_vcomm *vcomm_of(ncclComm_t comm)
{
    struct gpucr_vcomm *vc = (struct gpucr_vcomm *)comm;
    return vc && vc->magic == GPUCR_VCOMM_MAGIC ? vc : NULL;
}

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static uint64_t key_of_id(const ncclUniqueId *id) { return fnv(14695981039346656037ULL, id, sizeof *id) | 2; }

static uint64_t key_of_child(uint64_t parent, uint64_t n, int color)
{
    uint64_t h = fnv(parent, &n, sizeof n);
    return fnv(h, &color, sizeof color) | 2;
}

/* ---- around every hooked call ------------------------------------------- */

static int stream_capturing(cudaStream_t stream)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!gpucr_driver_loaded() || !gpucr_drv.cuStreamIsCapturing)
        return 0;
    return gpucr_drv.cuStreamIsCapturing((CUstream)stream, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

ncclResult_t gpucr_nccl_enter(struct gpucr_nccl_call *c, ncclComm_t comm, enum gpucr_nccl_kind kind, void **cache,
                              const char *pname, cudaStream_t stream)
{
    struct gpucr_vcomm *vc = vcomm_of(comm);
    c->vc = NULL;
    c->real = vc ? vc->real : comm;
    if (gpucr_nccl_inner) {
        if (!gpucr_nccl_real(cache, pname))
            return NCCL_MISSING;
        gpucr_nccl_inner++;
        return GPUCR_NCCL_SUCCESS;
    }
    int graph = kind == GPUCR_NCCL_OPERATION && vc && stream_capturing(stream);
    c->vc = vc;
    pthread_mutex_lock(&gpucr_nccl_mu);
    if (!vc) {
        if (comm && !gpucr_nccl_known_real(comm) && !gpucr_nccl_foreign) {
            gpucr_nccl_foreign = pname + 1; /* passed through as it is: the checkpoint refuses */
            gpucr_log("nccl: %s got communicator %p, not one the shim made", pname + 1, (void *)comm);
        }
    } else {
        if (kind == GPUCR_NCCL_OPERATION && group_depth == 0) {
            while (must_park())
                pthread_cond_wait(&gpucr_nccl_cv, &gpucr_nccl_mu);
        } else {
            while (parked())
                pthread_cond_wait(&gpucr_nccl_cv, &gpucr_nccl_mu);
        }
        if (kind == GPUCR_NCCL_OPERATION)
            vc->ops++;
        if (graph)
            vc->unrestorable = "it runs NCCL operations inside a CUDA graph";
        if (kind == GPUCR_NCCL_UNRESTORABLE)
            vc->unrestorable = pname + 1; /* the entry point's name */
        c->real = vc->real;
    }
    /* looked up only now: a reload while this call waited replaced the library */
    if (!gpucr_nccl_real(cache, pname)) {
        pthread_mutex_unlock(&gpucr_nccl_mu);
        return NCCL_MISSING;
    }
    gpucr_nccl_inflight++;
    gpucr_nccl_inner++;
    pthread_mutex_unlock(&gpucr_nccl_mu);
    return GPUCR_NCCL_SUCCESS;
}

void gpucr_nccl_exit(struct gpucr_nccl_call *c)
{
    (void)c;
    if (--gpucr_nccl_inner > 0)
        return;
    pthread_mutex_lock(&gpucr_nccl_mu);
    if (--gpucr_nccl_inflight == 0)
        pthread_cond_broadcast(&gpucr_nccl_cv);
    pthread_mutex_unlock(&gpucr_nccl_mu);
}

/* ---- making communicators ----------------------------------------------- */

static struct gpucr_vcomm *adopt(ncclComm_t real, uint64_t key, int nranks, int rank, const ncclConfig_t *config)
{
    struct gpucr_vcomm *vc = calloc(1, sizeof *vc);
    if (!vc)
        return NULL;
    vc->magic = GPUCR_VCOMM_MAGIC;
    vc->real = real;
    vc->key = key;
    vc->nranks = nranks;
    vc->rank = rank;
    CUcontext ctx = NULL;
    if (gpucr_driver_load() == 0 && gpucr_drv.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS)
        vc->ctx = ctx;
    if (config) {
        if (config->size > sizeof vc->config)
            vc->unrestorable = "its ncclConfig_t is larger than this shim knows";
        vc->config_size = config->size < sizeof vc->config ? config->size : sizeof vc->config;
        memcpy(vc->config, config, vc->config_size);
    }
    pthread_mutex_lock(&gpucr_nccl_mu);
    vc->seq = nseq++;
    if (last)
        last->next = vc;
    else
        first = vc;
    last = vc;
    pthread_mutex_unlock(&gpucr_nccl_mu);
    return vc;
}

/* The application's handle: ours, or the real one when ours could not be made
 * (out of memory; the checkpoint then refuses it as foreign). */
static void hand_out(ncclComm_t *out, ncclComm_t real, uint64_t key, int nranks, int rank, const ncclConfig_t *config)
{
    struct gpucr_vcomm *vc = real ? adopt(real, key, nranks, rank, config) : NULL;
    *out = vc ? (ncclComm_t)vc : real;
}

static int made(ncclResult_t r) { return r == GPUCR_NCCL_SUCCESS || r == GPUCR_NCCL_IN_PROGRESS; }

static void *real_pncclCommInitRank, *real_pncclCommInitRankConfig, *real_pncclCommInitAll,
    *real_pncclCommInitRankScalable, *real_pncclCommSplit, *real_pncclCommShrink, *real_pncclCommGrow,
    *real_pncclCommFinalize, *real_pncclCommDestroy, *real_pncclCommAbort, *real_pncclGetLastError,
    *real_pncclCommGetAsyncError, *real_pncclCommCount, *real_pncclCommCuDevice, *real_pncclCommUserRank,
    *real_pncclCommRegister, *real_pncclCommDeregister, *real_pncclGroupStart, *real_pncclGroupEnd;

/* Around a call that makes a communicator: it waits while the communicators are
 * parked or torn down (then counts as in flight); 1 when it is the outermost. */
static int begin_call(void)
{
    if (gpucr_nccl_inner++)
        return 0;
    pthread_mutex_lock(&gpucr_nccl_mu);
    while (parked())
        pthread_cond_wait(&gpucr_nccl_cv, &gpucr_nccl_mu);
    gpucr_nccl_inflight++;
    pthread_mutex_unlock(&gpucr_nccl_mu);
    return 1;
}

static void end_call(void)
{
    struct gpucr_nccl_call c = {NULL, NULL};
    gpucr_nccl_exit(&c);
}

typedef ncclResult_t (*init_rank_fn)(ncclComm_t *, int, ncclUniqueId, int);
typedef ncclResult_t (*init_config_fn)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);

GPUCR_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    int outer = begin_call();
    init_rank_fn f = REAL(pncclCommInitRank, init_rank_fn);
    ncclComm_t real = NULL;
    ncclResult_t r = f ? f(&real, nranks, id, rank) : NCCL_MISSING;
    end_call();
    if (outer && made(r))
        hand_out(comm, real, key_of_id(&id), nranks, rank, NULL);
    return r;
}

GPUCR_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                                 ncclConfig_t *config)
{
    int outer = begin_call();
    init_config_fn f = REAL(pncclCommInitRankConfig, init_config_fn);
    ncclComm_t real = NULL;
    ncclResult_t r = f ? f(&real, nranks, id, rank, config) : NCCL_MISSING;
    end_call();
    if (outer && made(r))
        hand_out(comm, real, key_of_id(&id), nranks, rank, config);
    return r;
}

GPUCR_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nid, ncclUniqueId *ids,
                                                   ncclConfig_t *config)
{
    typedef ncclResult_t (*fn)(ncclComm_t *, int, int, int, ncclUniqueId *, ncclConfig_t *);
    int outer = begin_call();
    fn f = REAL(pncclCommInitRankScalable, fn);
    ncclComm_t real = NULL;
    ncclResult_t r = f ? f(&real, nranks, rank, nid, ids, config) : NCCL_MISSING;
    end_call();
    if (outer && made(r) && nid > 0)
        hand_out(comm, real, key_of_id(&ids[0]), nranks, rank, config);
    else if (made(r))
        *comm = real;
    return r;
}

/* Several GPUs in one process: made and kept, but not rebuilt (refused at checkpoint). */
GPUCR_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    typedef ncclResult_t (*fn)(ncclComm_t *, int, const int *);
    int outer = begin_call();
    fn f = REAL(pncclCommInitAll, fn);
    ncclResult_t r = f ? f(comms, ndev, devlist) : NCCL_MISSING;
    end_call();
    if (!outer || !made(r))
        return r;
    for (int i = 0; i < ndev; i++) {
        struct gpucr_vcomm *vc = adopt(comms[i], key_of_child((uint64_t)nseq, (uint64_t)i, 0), ndev, i, NULL);
        if (vc) {
            vc->unrestorable = "it drives several GPUs from one process (ncclCommInitAll)";
            comms[i] = (ncclComm_t)vc;
        }
    }
    return r;
}

/* A child of parent: its key numbers the parent's children, on every rank alike. */
static uint64_t child_key(struct gpucr_vcomm *parent, int color)
{
    pthread_mutex_lock(&gpucr_nccl_mu);
    uint64_t n = parent->children++;
    pthread_mutex_unlock(&gpucr_nccl_mu);
    return key_of_child(parent->key, n, color);
}

GPUCR_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    typedef ncclResult_t (*fn)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
    struct gpucr_nccl_call c;
    ncclResult_t r = gpucr_nccl_enter(&c, comm, GPUCR_NCCL_PLAIN, &real_pncclCommSplit, "pncclCommSplit", NULL);
    if (r != GPUCR_NCCL_SUCCESS)
        return r;
    ncclComm_t real = NULL;
    int outer = gpucr_nccl_inner == 1;
    r = ((fn)real_pncclCommSplit)(c.real, color, key, &real, config);
    gpucr_nccl_exit(&c);
    /* every rank of the parent numbers the split, also one that gets no child */
    uint64_t k = outer && c.vc ? child_key(c.vc, color) : 0;
    if (outer && c.vc && made(r) && real)
        hand_out(newcomm, real, k, 0, 0, config); /* its size and rank: asked once it is ready */
    else if (made(r))
        *newcomm = real;
    return r;
}

GPUCR_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *exclude, int nexclude, ncclComm_t *newcomm,
                                         ncclConfig_t *config, int flags)
{
    typedef ncclResult_t (*fn)(ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int);
    struct gpucr_nccl_call c;
    ncclResult_t r = gpucr_nccl_enter(&c, comm, GPUCR_NCCL_PLAIN, &real_pncclCommShrink, "pncclCommShrink", NULL);
    if (r != GPUCR_NCCL_SUCCESS)
        return r;
    ncclComm_t real = NULL;
    int outer = gpucr_nccl_inner == 1;
    r = ((fn)real_pncclCommShrink)(c.real, exclude, nexclude, &real, config, flags);
    gpucr_nccl_exit(&c);
    if (!outer)
        *newcomm = real;
    else if (made(r) && real && c.vc)
        hand_out(newcomm, real, child_key(c.vc, -2), 0, 0, config);
    else if (made(r))
        *newcomm = real;
    return r;
}

GPUCR_EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nranks, const ncclUniqueId *id, int rank,
                                       ncclComm_t *newcomm, ncclConfig_t *config)
{
    typedef ncclResult_t (*fn)(ncclComm_t, int, const ncclUniqueId *, int, ncclComm_t *, ncclConfig_t *);
    struct gpucr_nccl_call c = {NULL, NULL};
    ncclResult_t r;
    int outer;
    if (comm) {
        r = gpucr_nccl_enter(&c, comm, GPUCR_NCCL_PLAIN, &real_pncclCommGrow, "pncclCommGrow", NULL);
        if (r != GPUCR_NCCL_SUCCESS)
            return r;
        outer = gpucr_nccl_inner == 1;
    } else {
        outer = begin_call(); /* a rank that joins */
    }
    fn f = REAL(pncclCommGrow, fn);
    ncclComm_t real = NULL;
    r = f ? f(c.real, nranks, id, rank, &real, config) : NCCL_MISSING;
    gpucr_nccl_exit(&c);
    if (outer && made(r) && real && id)
        hand_out(newcomm, real, key_of_id(id), nranks, rank, config);
    else if (made(r))
        *newcomm = real;
    return r;
}

/* ---- ending them -------------------------------------------------------- */

typedef ncclResult_t (*comm_fn)(ncclComm_t);

/* Finalize ends its use (only a destroy may follow); destroy and abort free it.
 * While the communicators are torn down there is nothing left to free. */
static ncclResult_t end(ncclComm_t comm, void **cache, const char *pname, int frees)
{
    struct gpucr_vcomm *vc = vcomm_of(comm);
    if (!gpucr_nccl_real(cache, pname))
        return NCCL_MISSING;
    if (!vc || gpucr_nccl_inner)
        return ((comm_fn)*cache)(vc ? vc->real : comm);
    pthread_mutex_lock(&gpucr_nccl_mu);
    while (parked() && !gpucr_nccl_torn_down())
        pthread_cond_wait(&gpucr_nccl_cv, &gpucr_nccl_mu);
    ncclComm_t real = vc->real;
    vc->ended = 1;
    if (frees)
        vc->real = NULL;
    gpucr_nccl_inflight += real != NULL;
    gpucr_nccl_inner += real != NULL;
    pthread_mutex_unlock(&gpucr_nccl_mu);
    if (!real)
        return GPUCR_NCCL_SUCCESS;
    comm_fn f = (comm_fn)gpucr_nccl_real(cache, pname); /* after the wait: a reload may have come */
    ncclResult_t r = f ? f(real) : NCCL_MISSING;
    struct gpucr_nccl_call c = {vc, real};
    gpucr_nccl_exit(&c);
    return r;
}

GPUCR_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    return end(comm, &real_pncclCommFinalize, "pncclCommFinalize", 0);
}

GPUCR_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    return end(comm, &real_pncclCommDestroy, "pncclCommDestroy", 1);
}

GPUCR_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    return end(comm, &real_pncclCommAbort, "pncclCommAbort", 1);
}

/* ---- describing them: answered from what is known while parked ----------- */

/* The real communicator for a question, or NULL to answer it ourselves. */
static ncclComm_t askable(struct gpucr_vcomm *vc)
{
    if (gpucr_nccl_inner) { /* from inside NCCL or the shim's own rebuild */
        gpucr_nccl_inner += vc->real != NULL;
        return vc->real;
    }
    pthread_mutex_lock(&gpucr_nccl_mu);
    ncclComm_t real = parked() ? NULL : vc->real;
    gpucr_nccl_inflight += real != NULL;
    gpucr_nccl_inner += real != NULL;
    pthread_mutex_unlock(&gpucr_nccl_mu);
    return real;
}

static void asked(struct gpucr_vcomm *vc, ncclComm_t real)
{
    struct gpucr_nccl_call c = {vc, real};
    gpucr_nccl_exit(&c);
}

/* While parked or torn down, the application's watchdog hears "no error". */
GPUCR_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    typedef ncclResult_t (*fn)(ncclComm_t, ncclResult_t *);
    struct gpucr_vcomm *vc = vcomm_of(comm);
    if (!vc) {
        fn f = REAL(pncclCommGetAsyncError, fn);
        return f ? f(comm, err) : NCCL_MISSING;
    }
    ncclComm_t real = askable(vc);
    if (!real) {
        *err = GPUCR_NCCL_SUCCESS;
        return GPUCR_NCCL_SUCCESS;
    }
    fn f = REAL(pncclCommGetAsyncError, fn); /* looked up once it may be called: see nccl_lib.c */
    ncclResult_t r = f ? f(real, err) : NCCL_MISSING;
    asked(vc, real);
    return r;
}

GPUCR_EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
    typedef const char *(*fn)(ncclComm_t);
    struct gpucr_vcomm *vc = vcomm_of(comm);
    if (!vc) {
        fn f = REAL(pncclGetLastError, fn);
        return f ? f(comm) : "";
    }
    ncclComm_t real = askable(vc);
    if (!real)
        return "";
    fn f = REAL(pncclGetLastError, fn);
    const char *s = f ? f(real) : "";
    asked(vc, real);
    return s;
}

typedef ncclResult_t (*int_fn)(ncclComm_t, int *);

static ncclResult_t describe(ncclComm_t comm, int *out, void **cache, const char *pname, int which)
{
    struct gpucr_vcomm *vc = vcomm_of(comm);
    if (!vc) {
        int_fn f = (int_fn)gpucr_nccl_real(cache, pname);
        return f ? f(comm, out) : NCCL_MISSING;
    }
    ncclComm_t real = askable(vc);
    if (!real) {
        if (which == 2) { /* the device: the context it was made in */
            CUdevice dev = 0;
            if (!vc->ctx || !gpucr_driver_loaded())
                return GPUCR_NCCL_INVALID_USAGE;
            CUcontext old = NULL;
            gpucr_drv.cuCtxGetCurrent(&old);
            gpucr_drv.cuCtxSetCurrent(vc->ctx);
            gpucr_drv.cuCtxGetDevice(&dev);
            gpucr_drv.cuCtxSetCurrent(old);
            *out = (int)dev;
        } else {
            *out = which == 0 ? vc->nranks : vc->rank;
        }
        return GPUCR_NCCL_SUCCESS;
    }
    int_fn f = (int_fn)gpucr_nccl_real(cache, pname);
    ncclResult_t r = f ? f(real, out) : NCCL_MISSING;
    asked(vc, real);
    return r;
}

GPUCR_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    return describe(comm, count, &real_pncclCommCount, "pncclCommCount", 0);
}

GPUCR_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    return describe(comm, rank, &real_pncclCommUserRank, "pncclCommUserRank", 1);
}

GPUCR_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    return describe(comm, device, &real_pncclCommCuDevice, "pncclCommCuDevice", 2);
}

/* ---- registrations ------------------------------------------------------ */

#define GPUCR_VREG_MAGIC 0x6770637276726567ULL /* "gpcrvreg" */

GPUCR_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    typedef ncclResult_t (*fn)(ncclComm_t, void *, size_t, void **);
    struct gpucr_nccl_call c;
    ncclResult_t r = gpucr_nccl_enter(&c, comm, GPUCR_NCCL_PLAIN, &real_pncclCommRegister, "pncclCommRegister", NULL);
    if (r != GPUCR_NCCL_SUCCESS)
        return r;
    void *real = NULL;
    r = ((fn)real_pncclCommRegister)(c.real, buff, size, &real);
    gpucr_nccl_exit(&c);
    struct gpucr_vreg *reg = r == GPUCR_NCCL_SUCCESS && c.vc ? calloc(1, sizeof *reg) : NULL;
    if (!reg) {
        *handle = real;
        return r;
    }
    *reg = (struct gpucr_vreg){GPUCR_VREG_MAGIC, c.vc, buff, size, real, 0, NULL};
    pthread_mutex_lock(&gpucr_nccl_mu);
    reg->next = regs;
    regs = reg;
    pthread_mutex_unlock(&gpucr_nccl_mu);
    *handle = reg;
    return r;
}

GPUCR_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    typedef ncclResult_t (*fn)(ncclComm_t, void *);
    struct gpucr_vreg *reg = handle;
    int ours = reg && reg->magic == GPUCR_VREG_MAGIC;
    struct gpucr_nccl_call c;
    ncclResult_t r = gpucr_nccl_enter(&c, comm, GPUCR_NCCL_PLAIN, &real_pncclCommDeregister, "pncclCommDeregister", NULL);
    if (r != GPUCR_NCCL_SUCCESS)
        return r;
    r = ((fn)real_pncclCommDeregister)(c.real, ours ? reg->real : handle);
    gpucr_nccl_exit(&c);
    if (ours) {
        pthread_mutex_lock(&gpucr_nccl_mu);
        reg->gone = 1;
        pthread_mutex_unlock(&gpucr_nccl_mu);
    }
    return r;
}

/* ---- unique ids: from the copy of NCCL the hooks use (nccl_lib.c) ------- */

static void *real_pncclGetUniqueId;

GPUCR_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    typedef ncclResult_t (*fn)(ncclUniqueId *);
    begin_call(); /* after a cut, from the copy of NCCL the rebuilt communicators use */
    fn f = REAL(pncclGetUniqueId, fn);
    ncclResult_t r = f ? f(id) : NCCL_MISSING;
    end_call();
    return r;
}

/* ---- groups: the start of a group is where a cut may park it ------------ */

GPUCR_EXPORT ncclResult_t ncclGroupStart(void)
{
    typedef ncclResult_t (*fn)(void);
    if (gpucr_nccl_inner) {
        fn f = REAL(pncclGroupStart, fn);
        return f ? f() : NCCL_MISSING;
    }
    pthread_mutex_lock(&gpucr_nccl_mu);
    if (group_depth == 0) {
        while (must_park())
            pthread_cond_wait(&gpucr_nccl_cv, &gpucr_nccl_mu);
        gpucr_nccl_in_group++;
    }
    group_depth++;
    pthread_mutex_unlock(&gpucr_nccl_mu);
    fn f = REAL(pncclGroupStart, fn); /* after the wait: a reload may have come */
    gpucr_nccl_inner++;
    ncclResult_t r = f ? f() : NCCL_MISSING;
    gpucr_nccl_inner--;
    if (r != GPUCR_NCCL_SUCCESS) {
        pthread_mutex_lock(&gpucr_nccl_mu);
        if (--group_depth == 0) {
            gpucr_nccl_in_group--;
            pthread_cond_broadcast(&gpucr_nccl_cv);
        }
        pthread_mutex_unlock(&gpucr_nccl_mu);
    }
    return r;
}

GPUCR_EXPORT ncclResult_t ncclGroupEnd(void)
{
    typedef ncclResult_t (*fn)(void);
    fn f = REAL(pncclGroupEnd, fn);
    if (!f)
        return NCCL_MISSING;
    if (gpucr_nccl_inner)
        return f();
    gpucr_nccl_inner++;
    ncclResult_t r = f();
    gpucr_nccl_inner--;
    pthread_mutex_lock(&gpucr_nccl_mu);
    if (group_depth > 0 && --group_depth == 0) {
        gpucr_nccl_in_group--;
        pthread_cond_broadcast(&gpucr_nccl_cv);
    }
    pthread_mutex_unlock(&gpucr_nccl_mu);
    return r;
}

/* NCCL's communicators do not survive a fork: the child's are ended. */
void gpucr_nccl_comms_after_fork_child(void)
{
    pthread_mutex_init(&gpucr_nccl_mu, NULL);
    pthread_cond_init(&gpucr_nccl_cv, NULL);
    for (struct gpucr_vcomm *vc = first; vc; vc = vc->next) {
        vc->ended = 1;
        vc->real = NULL;
    }
    gpucr_nccl_inflight = 0;
    gpucr_nccl_in_group = 0;
    group_depth = 0;
    gpucr_nccl_inner = 0;
    gpucr_nccl_foreign = NULL;
}
