/* Moving the contents of tracked allocations between the GPU and the host arena.
 *
 * Bounce (default): the arena is not pinned. Pinned host memory is what made the
 * driver checkpoint grow with the footprint: the driver unpins it at checkpoint
 * and re-pins it at restore (+19 ms/GiB and +24..36 ms/GiB on the H100 machine,
 * bench/probe), and unpinning it ourselves costs as much, in one driver lock,
 * and waits for every copy in flight. So the copy engines go through a small
 * pinned staging ring, allocated once, and worker threads memcpy between ring
 * and arena while the next DMAs run.
 * Host memory bandwidth is what limits that copy (each byte crosses it three
 * times), so the defaults, tuned on the H100 machine (bench/datapath_tune.py,
 * bench/results/datapath-tune-h100-*.json), keep traffic down: 8 MiB slots, so
 * the ring (2 slots a worker, 240 MiB at 15 workers) stays inside its 300 MiB L3
 * and the DMA and the worker meet there, not in DRAM; streaming stores into the
 * arena (nothing reads it soon) but cached stores into the ring (the DMA reads
 * them next); workers sleep while they wait for their DMA. A smaller ring is
 * also less pinned memory for the driver checkpoint to handle.
 * Direct (GPUCR_ARENA_PIN=1): the arena is pinned once at start-up and the copy
 * engines read and write it directly; best where no driver checkpoint follows
 * (the SIGTSTP yield), slower control where one does.
 * The workers run on the GPU's NUMA node, where the arena is (numa.c). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "copy_stats.h"
#include "datapath.h"
#include "driver.h"
#include "log.h"
#include "numa.h"
#include "stream_copy.h"
#include "table.h"

#define DIRECT_CHUNK (256u << 20)
#ifndef GPUCR_SLOT
#define GPUCR_SLOT (8u << 20) /* one DMA: 0.15 ms; one memcpy of it: ~2 ms per thread */
#endif
#ifndef GPUCR_COPY_NT_DEFAULT
#define GPUCR_COPY_NT_DEFAULT "out"
#endif
#ifndef GPUCR_COPY_WAIT_DEFAULT
#define GPUCR_COPY_WAIT_DEFAULT "block"
#endif
#define MAX_THREADS 32
#define DEFAULT_THREADS 16 /* at most; one CPU is left to the thread that issues the DMAs */
#define MAX_SLOTS (2 * MAX_THREADS)
#define NSTREAMS 2
#define MAX_CTX 16

int gpucr_pin_arena;

struct ctx_res {
    CUcontext ctx;
    CUstream s[NSTREAMS];
    CUevent ev[MAX_SLOTS]; /* one per staging slot: streams and events belong to a context */
};
static struct ctx_res res[MAX_CTX];
static int nres;

static int nt_out = -1, nt_in = -1; /* GPUCR_COPY_NT, read once */
static int wait_block = -1;          /* GPUCR_COPY_WAIT, read once */

static char *staging;
static size_t slot_bytes; /* one DMA, one memcpy: GPUCR_COPY_SLOT_MIB */
static int nslots, nthreads;
static double staging_s;
static pthread_mutex_t staging_mu = PTHREAD_MUTEX_INITIALIZER;

/* GPUCR_COPY_NT: which direction's memcpy between ring and arena uses
 * streaming stores (stream_copy.c): out (to the host arena), in (into the ring,
 * on the way to the GPU), both, or 0. */
static void copy_nt_read(void)
{
    const char *v = getenv("GPUCR_COPY_NT");
    if (!(v && *v))
        v = GPUCR_COPY_NT_DEFAULT;
    int both = !strcmp(v, "1") || !strcmp(v, "both") || !strcmp(v, "on") || !strcmp(v, "yes");
    int none = !strcmp(v, "0") || !strcmp(v, "no") || !strcmp(v, "off");
    if (!both && !none && strcmp(v, "out") && strcmp(v, "in")) {
        fprintf(stderr, "gpucr: GPUCR_COPY_NT=%s is not one of out, in, both, 0; using %s\n", v,
                GPUCR_COPY_NT_DEFAULT);
        v = GPUCR_COPY_NT_DEFAULT;
    }
    nt_out = both || !strcmp(v, "out");
    nt_in = both || !strcmp(v, "in");
}

/* GPUCR_COPY_WAIT=block: a worker waiting for its DMA sleeps instead of
 * spinning (the context's own scheduling), leaving the CPUs to the workers
 * that copy and to the thread that issues the DMAs. */
static unsigned event_flags(void)
{
    if (wait_block < 0) {
        const char *v = getenv("GPUCR_COPY_WAIT");
        if (!(v && *v))
            v = GPUCR_COPY_WAIT_DEFAULT;
        if (strcmp(v, "block") && strcmp(v, "spin")) {
            fprintf(stderr, "gpucr: GPUCR_COPY_WAIT=%s is not block or spin; using %s\n", v,
                    GPUCR_COPY_WAIT_DEFAULT);
            v = GPUCR_COPY_WAIT_DEFAULT;
        }
        wait_block = !strcmp(v, "block");
    }
    return CU_EVENT_DISABLE_TIMING | (wait_block ? CU_EVENT_BLOCKING_SYNC : 0);
}

CUresult gpucr_use_ctx(CUcontext ctx)
{
    CUcontext cur = NULL;
    gpucr_drv.cuCtxGetCurrent(&cur);
    return cur == ctx ? CUDA_SUCCESS : gpucr_drv.cuCtxSetCurrent(ctx);
}

static struct ctx_res *res_for(CUcontext ctx)
{
    for (int i = 0; i < nres; i++)
        if (res[i].ctx == ctx)
            return &res[i];
    if (nres == MAX_CTX)
        return NULL;
    struct ctx_res *r = &res[nres];
    for (int k = 0; k < NSTREAMS; k++)
        if (gpucr_drv.cuStreamCreate(&r->s[k], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
            return NULL;
    for (int k = 0; k < MAX_SLOTS; k++)
        if (gpucr_drv.cuEventCreate(&r->ev[k], event_flags()) != CUDA_SUCCESS)
            return NULL;
    r->ctx = ctx;
    nres++;
    return r;
}

static int cpus_allowed(void)
{
    cpu_set_t cpus;
    return sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
}

/* GPUCR_COPY_THREADS, else one per allowed CPU but one, up to DEFAULT_THREADS:
 * the program is quiesced meanwhile, and the memcpy is what limits the rate
 * (~3.5 GB/s per thread while the copy engines write the same memory). */
static int copy_threads(void)
{
    const char *v = getenv("GPUCR_COPY_THREADS");
    int n = v && *v ? atoi(v) : DEFAULT_THREADS;
    if (!(v && *v) && cpus_allowed() - 1 < n)
        n = cpus_allowed() - 1;
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

/* GPUCR_COPY_SLOT_MIB: 1..256 MiB per DMA and per memcpy, else GPUCR_SLOT bytes */
static size_t copy_slot_bytes(void)
{
    const char *v = getenv("GPUCR_COPY_SLOT_MIB");
    if (!(v && *v))
        return GPUCR_SLOT;
    long mib = atol(v);
    return (size_t)(mib < 1 ? 1 : mib > 256 ? 256 : mib) << 20;
}

/* GPUCR_ARENA_PIN=1/0, else automatic: with fewer than 4 CPUs the workers
 * cannot keep up with the copy engines (~6.6 GB/s each), and pinning costs less. */
void gpucr_datapath_init(void)
{
    const char *v = getenv("GPUCR_ARENA_PIN");
    if (v && *v)
        gpucr_pin_arena = !(strcmp(v, "0") == 0 || strcmp(v, "no") == 0 || strcmp(v, "off") == 0);
    else
        gpucr_pin_arena = cpus_allowed() < 4;
}

/* The staging ring: a one-time cost, paid at start-up by the preallocation
 * thread when there is one. Needs a current context. */
CUresult gpucr_staging_setup(void)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&staging_mu);
    if (!staging && !gpucr_pin_arena) {
        double t0 = gpucr_now();
        int t = copy_threads();
        size_t sb = copy_slot_bytes();
        void *p = NULL;
        r = gpucr_drv.cuMemHostAlloc(&p, (size_t)2 * t * sb, CU_MEMHOSTALLOC_PORTABLE);
        if (r == CUDA_SUCCESS) {
            slot_bytes = sb;
            nthreads = t;
            nslots = 2 * t;
            staging = p;
            staging_s += gpucr_now() - t0;
        }
    }
    pthread_mutex_unlock(&staging_mu);
    return r;
}

/* The ring's pages dropped (its contents are scratch): see gpucr_cmd_staging_drop.
 * No CUDA call. A shared mapping keeps its pages behind it: MADV_REMOVE frees
 * them too (and fails, harmlessly, on a private one). */
int gpucr_staging_drop(void)
{
    int rc = 0;
    pthread_mutex_lock(&staging_mu);
    if (staging) {
        size_t len = (size_t)nslots * slot_bytes;
        rc = madvise(staging, len, MADV_DONTNEED);
        if (rc == 0)
            (void)madvise(staging, len, MADV_REMOVE);
    }
    pthread_mutex_unlock(&staging_mu);
    return rc;
}

double gpucr_staging_seconds(void) { return staging_s; }
size_t gpucr_staging_bytes(void) { return staging ? (size_t)nslots * slot_bytes : 0; }

/* ---- direct: the arena is pinned -------------------------------------------- */

static CUresult sync_all(void)
{
    CUresult r = CUDA_SUCCESS;
    for (int c = 0; c < nres; c++) {
        gpucr_use_ctx(res[c].ctx);
        for (int j = 0; j < NSTREAMS; j++) {
            CUresult s = gpucr_drv.cuStreamSynchronize(res[c].s[j]);
            if (r == CUDA_SUCCESS)
                r = s;
        }
    }
    return r;
}

static CUresult copy_direct(struct gpucr_phys *const *ps, size_t n, int to_host)
{
    CUresult r = CUDA_SUCCESS;
    int k = 0;
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
        const struct gpucr_phys *p = ps[i];
        struct ctx_res *cr;
        if ((r = gpucr_use_ctx(p->ctx)) != CUDA_SUCCESS)
            break;
        if (!(cr = res_for(p->ctx)))
            return CUDA_ERROR_OUT_OF_MEMORY;
        for (size_t off = 0; off < p->size && r == CUDA_SUCCESS; off += DIRECT_CHUNK) {
            size_t len = p->size - off < DIRECT_CHUNK ? p->size - off : DIRECT_CHUNK;
            CUstream s = cr->s[k++ % NSTREAMS];
            r = to_host ? gpucr_drv.cuMemcpyDtoHAsync_v2((char *)p->host + off, p->copy_va + off, len, s)
                        : gpucr_drv.cuMemcpyHtoDAsync_v2(p->copy_va + off, (char *)p->host + off, len, s);
        }
    }
    CUresult s = sync_all();
    return r != CUDA_SUCCESS ? r : s;
}

/* ---- bounce: DMA to/from the staging ring, memcpy by workers ---------------- */

struct unit {
    CUdeviceptr dev;
    char *host;
    size_t len;
    struct ctx_res *r;
};

struct pipe {
    struct unit *u;
    size_t n;
    int to_host;
    CUcontext ctx0;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t issued;       /* units whose DMA is queued (in order) */
    size_t next;         /* the next unit a worker takes */
    unsigned char *done; /* the memcpy of unit i is done */
    CUresult rc;
    int abort;
};

static void copy_bytes(int streaming, void *dst, const void *src, size_t n)
{
    if (streaming)
        gpucr_stream_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}

static char *slot_buf(size_t i) { return staging + (i % (size_t)nslots) * slot_bytes; }

static void pipe_fail(struct pipe *pp, CUresult rc)
{
    pthread_mutex_lock(&pp->mu);
    if (pp->rc == CUDA_SUCCESS)
        pp->rc = rc;
    pp->abort = 1;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
}

/* To the host: wait for unit i's DMA into its slot, copy the slot out.
 * To the GPU: wait until the slot's last DMA (unit i - nslots) is done, fill it. */
static void *worker(void *arg)
{
    struct pipe *pp = arg;
    gpucr_drv.cuCtxSetCurrent(pp->ctx0);
    gpucr_numa_pin_thread(); /* after the context: it names the GPU */
    pthread_mutex_lock(&pp->mu);
    while (!pp->abort && pp->next < pp->n) {
        size_t i = pp->next++;
        size_t wait_for = pp->to_host ? i + 1 : (i >= (size_t)nslots ? i - nslots + 1 : 0);
        while (!pp->abort && pp->issued < wait_for)
            pthread_cond_wait(&pp->cv, &pp->mu);
        if (pp->abort)
            break;
        pthread_mutex_unlock(&pp->mu);
        const struct unit *u = &pp->u[i];
        CUresult rc = CUDA_SUCCESS;
        if (wait_for) {
            const struct unit *w = &pp->u[wait_for - 1];
            rc = gpucr_drv.cuEventSynchronize(w->r->ev[(wait_for - 1) % nslots]);
        }
        if (rc != CUDA_SUCCESS) {
            pipe_fail(pp, rc);
            return NULL;
        }
        if (pp->to_host)
            copy_bytes(nt_out, u->host, slot_buf(i), u->len);
        else
            copy_bytes(nt_in, slot_buf(i), u->host, u->len);
        pthread_mutex_lock(&pp->mu);
        pp->done[i] = 1;
        pthread_cond_broadcast(&pp->cv);
    }
    pthread_mutex_unlock(&pp->mu);
    return NULL;
}

static CUresult bounce_issue(struct pipe *pp)
{
    CUresult rc = CUDA_SUCCESS;
    for (size_t i = 0; i < pp->n; i++) {
        /* to the host: the slot is free once unit i - nslots is copied out;
         * to the GPU: unit i must be in its slot */
        pthread_mutex_lock(&pp->mu);
        if (pp->to_host)
            while (!pp->abort && i >= (size_t)nslots && !pp->done[i - nslots])
                pthread_cond_wait(&pp->cv, &pp->mu);
        else
            while (!pp->abort && !pp->done[i])
                pthread_cond_wait(&pp->cv, &pp->mu);
        int stop = pp->abort;
        pthread_mutex_unlock(&pp->mu);
        if (stop)
            break;
        struct unit *u = &pp->u[i];
        CUstream s = u->r->s[i % NSTREAMS];
        if ((rc = gpucr_use_ctx(u->r->ctx)) == CUDA_SUCCESS)
            rc = pp->to_host ? gpucr_drv.cuMemcpyDtoHAsync_v2(slot_buf(i), u->dev, u->len, s)
                             : gpucr_drv.cuMemcpyHtoDAsync_v2(u->dev, slot_buf(i), u->len, s);
        if (rc == CUDA_SUCCESS)
            rc = gpucr_drv.cuEventRecord(u->r->ev[i % nslots], s);
        if (rc != CUDA_SUCCESS) {
            pipe_fail(pp, rc);
            break;
        }
        pthread_mutex_lock(&pp->mu);
        pp->issued = i + 1;
        pthread_cond_broadcast(&pp->cv);
        pthread_mutex_unlock(&pp->mu);
    }
    return rc;
}

static CUresult copy_bounce(struct gpucr_phys *const *ps, size_t n, int to_host, int *threads)
{
    CUresult rc = n ? gpucr_use_ctx(ps[0]->ctx) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS && n)
        rc = gpucr_staging_setup();
    if (rc != CUDA_SUCCESS || !n)
        return rc;
    struct pipe pp;
    memset(&pp, 0, sizeof pp);
    pp.to_host = to_host;
    size_t nu = 0;
    for (size_t i = 0; i < n; i++)
        nu += (ps[i]->size + slot_bytes - 1) / slot_bytes;
    pp.u = calloc(nu ? nu : 1, sizeof *pp.u);
    pp.done = calloc(nu ? nu : 1, 1);
    if (!pp.u || !pp.done) {
        free(pp.u);
        free(pp.done);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        const struct gpucr_phys *p = ps[i];
        struct ctx_res *cr;
        if ((rc = gpucr_use_ctx(p->ctx)) != CUDA_SUCCESS || !(cr = res_for(p->ctx))) {
            free(pp.u);
            free(pp.done);
            return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_OUT_OF_MEMORY;
        }
        for (size_t off = 0; off < p->size; off += slot_bytes)
            pp.u[pp.n++] = (struct unit){p->copy_va + off, (char *)p->host + off,
                                         p->size - off < slot_bytes ? p->size - off : slot_bytes, cr};
    }
    pp.ctx0 = pp.n ? pp.u[0].r->ctx : NULL;
    pthread_mutex_init(&pp.mu, NULL);
    pthread_cond_init(&pp.cv, NULL);
    pthread_t th[MAX_THREADS];
    int nt = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* workers take no signal of the program */
    for (int t = 0; t < nthreads && (size_t)t < pp.n; t++)
        if (pthread_create(&th[nt], NULL, worker, &pp) == 0)
            nt++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pp.n && !nt)
        pipe_fail(&pp, CUDA_ERROR_OUT_OF_MEMORY);
    else
        bounce_issue(&pp);
    for (int t = 0; t < nt; t++)
        pthread_join(th[t], NULL);
    CUresult s = sync_all();
    rc = pp.rc != CUDA_SUCCESS ? pp.rc : s;
    *threads = nt;
    pthread_mutex_destroy(&pp.mu);
    pthread_cond_destroy(&pp.cv);
    free(pp.u);
    free(pp.done);
    return rc;
}

CUresult gpucr_copy(struct gpucr_phys *const *ps, size_t n, int to_host, struct gpucr_copy_stats *st)
{
    double t0 = gpucr_now();
    double s0 = staging_s;
    memset(st, 0, sizeof *st);
    CUresult rc;
    if (gpucr_pin_arena) {
        rc = copy_direct(ps, n, to_host);
    } else {
        if (nt_out < 0)
            copy_nt_read();
        st->bounce = 1;
        st->streaming = to_host ? nt_out : nt_in;
        rc = copy_bounce(ps, n, to_host, &st->threads);
        st->blocking = wait_block > 0;
    }
    st->setup_s = staging_s - s0;
    st->seconds = gpucr_now() - t0 - st->setup_s;
    return rc;
}

void gpucr_datapath_after_fork_child(void)
{
    /* the parent's streams, events and staging belong to its CUDA state */
    pthread_mutex_init(&staging_mu, NULL);
    nres = 0;
    staging = NULL;
    nslots = nthreads = 0;
    slot_bytes = 0;
    nt_out = nt_in = wait_block = -1;
    staging_s = 0;
}
