/* The bounce data path (datapath.c) against a fake GPU: two streams, each run by
 * its own thread with random delays, so copies and events complete late and out
 * of order between streams. Every byte must arrive, both ways, for any number of
 * worker threads, with tiny slots (many slot reuses). Needs cuda.h (types only). */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "copy_stats.h"
#include "datapath.h"
#include "driver.h"
#include "table.h"

struct gpucr_driver gpucr_drv;

/* ---- the fake GPU ---------------------------------------------------------- */
#define QMAX 4096
struct op {
    int kind; /* 0 copy, 1 event */
    void *dst;
    const void *src;
    size_t n;
    long ev;
    unsigned long seq;
};
struct fstream {
    struct op q[QMAX];
    unsigned long head, tail; /* ops queued / done */
    pthread_t th;
};
#define MAX_FS 16 /* each gpucr_datapath_after_fork_child() makes the next copy create its streams anew */
static struct fstream fs[MAX_FS];
static int nfs;
#define MAX_EV 512
static unsigned long ev_recorded[MAX_EV], ev_done[MAX_EV];
static int nev;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int stop;

static void *gpu(void *arg)
{
    struct fstream *s = arg;
    unsigned seed = (unsigned)(uintptr_t)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!stop && s->tail == s->head)
            pthread_cond_wait(&cv, &mu);
        if (stop)
            break;
        struct op o = s->q[s->tail % QMAX];
        pthread_mutex_unlock(&mu);
        usleep(rand_r(&seed) % 200);
        if (o.kind == 0)
            memcpy(o.dst, o.src, o.n);
        pthread_mutex_lock(&mu);
        if (o.kind == 1 && ev_done[o.ev] < o.seq)
            ev_done[o.ev] = o.seq;
        s->tail++;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static unsigned long seq;
static CUresult enqueue(CUstream st, struct op o)
{
    struct fstream *s = &fs[(uintptr_t)st - 1];
    pthread_mutex_lock(&mu);
    CHECK(s->head - s->tail < QMAX);
    o.seq = ++seq;
    if (o.kind == 1)
        ev_recorded[o.ev] = o.seq;
    s->q[s->head++ % QMAX] = o;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

static CUresult f_get(CUcontext *c) { *c = (CUcontext)1; return CUDA_SUCCESS; }
static CUresult f_set(CUcontext c) { (void)c; return CUDA_SUCCESS; }
static CUresult f_stream(CUstream *s, unsigned f)
{
    (void)f;
    pthread_mutex_lock(&mu);
    CHECK(nfs < MAX_FS);
    *s = (CUstream)(uintptr_t)(nfs + 1);
    pthread_create(&fs[nfs].th, NULL, gpu, &fs[nfs]);
    nfs++;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
static CUresult f_event(CUevent *e, unsigned f)
{
    (void)f;
    pthread_mutex_lock(&mu);
    CHECK(nev < MAX_EV);
    *e = (CUevent)(uintptr_t)nev++;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
static CUresult f_record(CUevent e, CUstream s) { return enqueue(s, (struct op){1, 0, 0, 0, (long)(uintptr_t)e, 0}); }
static CUresult f_evsync(CUevent e)
{
    long i = (long)(uintptr_t)e;
    pthread_mutex_lock(&mu);
    unsigned long want = ev_recorded[i];
    while (ev_done[i] < want)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
static CUresult f_ssync(CUstream st)
{
    struct fstream *s = &fs[(uintptr_t)st - 1];
    pthread_mutex_lock(&mu);
    while (s->tail != s->head)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
static int calls, fail_at; /* the fail_at-th copy fails (0: none) */
static CUresult f_d2h(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    if (fail_at && __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST) == fail_at)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    return enqueue(s, (struct op){0, dst, (const void *)(uintptr_t)src, n, 0, 0});
}
static CUresult f_h2d(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return enqueue(s, (struct op){0, (void *)(uintptr_t)dst, src, n, 0, 0});
}
static CUresult f_hostalloc(void **p, size_t n, unsigned f)
{
    (void)f;
    *p = malloc(n);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* ---- the test -------------------------------------------------------------- */
static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(rand_r(&seed) >> 3);
}

int main(void)
{
    gpucr_drv.cuCtxGetCurrent = f_get;
    gpucr_drv.cuCtxSetCurrent = f_set;
    gpucr_drv.cuStreamCreate = f_stream;
    gpucr_drv.cuEventCreate = f_event;
    gpucr_drv.cuEventRecord = f_record;
    gpucr_drv.cuEventSynchronize = f_evsync;
    gpucr_drv.cuStreamSynchronize = f_ssync;
    gpucr_drv.cuMemcpyDtoHAsync_v2 = f_d2h;
    gpucr_drv.cuMemcpyHtoDAsync_v2 = f_h2d;
    gpucr_drv.cuMemHostAlloc = f_hostalloc;

    /* allocation sizes around the slot size (GPUCR_SLOT = 4096 here) */
    size_t sizes[] = {1, 4096, 4097, 3 * 4096 - 1, 100000, 64 * 4096, 12345, 8192};
    enum { N = sizeof sizes / sizeof sizes[0] };
    struct gpucr_phys phys[N], *ps[N];
    unsigned char *dev[N], *host[N], *ref[N];
    for (int i = 0; i < N; i++) {
        memset(&phys[i], 0, sizeof phys[i]);
        dev[i] = malloc(sizes[i]);
        host[i] = malloc(sizes[i]);
        ref[i] = malloc(sizes[i]);
        phys[i].size = sizes[i];
        phys[i].ctx = (void *)1;
        phys[i].copy_va = (uint64_t)(uintptr_t)dev[i];
        phys[i].host = host[i];
        ps[i] = &phys[i];
    }
    const char *threads[] = {"1", "3", "8"};
    /* each worker count with the other store and wait modes too */
    const char *nt[] = {"0", "both", "out"}, *wait[] = {"spin", "block", "spin"};
    for (int t = 0; t < 3; t++) {
        setenv("GPUCR_COPY_THREADS", threads[t], 1);
        setenv("GPUCR_COPY_NT", nt[t], 1);
        setenv("GPUCR_COPY_WAIT", wait[t], 1);
        gpucr_datapath_after_fork_child(); /* a new staging ring with this many workers */
        for (int round = 0; round < 3; round++) {
            for (int i = 0; i < N; i++) {
                fill(ref[i], sizes[i], (unsigned)(t * 100 + round * 10 + i));
                memcpy(dev[i], ref[i], sizes[i]);
                memset(host[i], 0xee, sizes[i]);
            }
            struct gpucr_copy_stats st;
            CHECK(gpucr_copy(ps, N, 1, &st) == CUDA_SUCCESS);
            CHECK(st.bounce && st.threads >= 1);
            CHECK(st.streaming == (t > 0) && st.blocking == (t == 1));
            for (int i = 0; i < N; i++) {
                CHECK(memcmp(host[i], ref[i], sizes[i]) == 0);
                memset(dev[i], 0x11, sizes[i]);
            }
            CHECK(gpucr_copy(ps, N, 0, &st) == CUDA_SUCCESS);
            CHECK(st.streaming == (t == 1));
            for (int i = 0; i < N; i++)
                CHECK(memcmp(dev[i], ref[i], sizes[i]) == 0);
        }
    }
    /* a value that is no mode: the default, and one line on stderr (not checked here) */
    setenv("GPUCR_COPY_NT", "sideways", 1);
    setenv("GPUCR_COPY_WAIT", "nap", 1);
    gpucr_datapath_after_fork_child();
    {
        struct gpucr_copy_stats st;
        CHECK(gpucr_copy(ps, N, 1, &st) == CUDA_SUCCESS);
        CHECK(st.streaming == 1 && st.blocking == 1); /* out, block */
        CHECK(gpucr_copy(ps, N, 0, &st) == CUDA_SUCCESS);
        CHECK(st.streaming == 0);
        for (int i = 0; i < N; i++)
            CHECK(memcmp(dev[i], host[i], sizes[i]) == 0);
    }
    unsetenv("GPUCR_COPY_NT");
    unsetenv("GPUCR_COPY_WAIT");
    PASS("datapath: bounce copies arrive whole both ways (1, 3, 8 workers; streaming stores out, both, none; "
         "spinning and sleeping waits; slots reused)");

    /* GPUCR_COPY_SLOT_MIB=1: 1 MiB slots; buffers of 2.5 and 3 MiB span several */
    {
        size_t big[] = {(5u << 20) / 2, 3u << 20, 12345};
        enum { NB = sizeof big / sizeof big[0] };
        struct gpucr_phys bp[NB], *bps[NB];
        unsigned char *bd[NB], *bh[NB], *br[NB];
        setenv("GPUCR_COPY_THREADS", "3", 1);
        setenv("GPUCR_COPY_SLOT_MIB", "1", 1);
        gpucr_datapath_after_fork_child();
        for (int i = 0; i < NB; i++) {
            memset(&bp[i], 0, sizeof bp[i]);
            bd[i] = malloc(big[i]);
            bh[i] = malloc(big[i]);
            br[i] = malloc(big[i]);
            fill(br[i], big[i], 7u + (unsigned)i);
            memcpy(bd[i], br[i], big[i]);
            memset(bh[i], 0xee, big[i]);
            bp[i].size = big[i];
            bp[i].ctx = (void *)1;
            bp[i].copy_va = (uint64_t)(uintptr_t)bd[i];
            bp[i].host = bh[i];
            bps[i] = &bp[i];
        }
        struct gpucr_copy_stats st;
        CHECK(gpucr_copy(bps, NB, 1, &st) == CUDA_SUCCESS);
        CHECK(gpucr_staging_bytes() == (size_t)2 * 3 * (1u << 20)); /* two 1 MiB slots a worker */
        for (int i = 0; i < NB; i++) {
            CHECK(memcmp(bh[i], br[i], big[i]) == 0);
            memset(bd[i], 0x11, big[i]);
        }
        CHECK(gpucr_copy(bps, NB, 0, &st) == CUDA_SUCCESS);
        for (int i = 0; i < NB; i++) {
            CHECK(memcmp(bd[i], br[i], big[i]) == 0);
            free(bd[i]);
            free(bh[i]);
            free(br[i]);
        }
        unsetenv("GPUCR_COPY_SLOT_MIB");
        gpucr_datapath_after_fork_child(); /* back to GPUCR_SLOT for the tests below */
    }
    PASS("datapath: GPUCR_COPY_SLOT_MIB sets the slot; copies across several slots arrive whole");
    for (int k = 1; k < 40; k += 7) { /* a copy fails mid-way: the error, no hang */
        struct gpucr_copy_stats st;
        calls = 0;
        fail_at = k;
        CHECK(gpucr_copy(ps, N, 1, &st) == CUDA_ERROR_ILLEGAL_ADDRESS);
    }
    fail_at = 0;
    PASS("datapath: a failed copy is reported, workers end");
    CHECK(gpucr_copy(ps, 0, 1, &(struct gpucr_copy_stats){0}) == CUDA_SUCCESS);
    PASS("datapath: nothing to copy");
    pthread_mutex_lock(&mu);
    stop = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < nfs; i++)
        pthread_join(fs[i].th, NULL);
    return 0;
}
