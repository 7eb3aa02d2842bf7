/* The shim's half of a checkpoint: quiesce, then data; and its mirror, restore.
 *
 * checkpoint: refuse what cannot be checkpointed -> close the gate (bounded) ->
 *   synchronize every known context (bounded) -> trim memory pools -> copy every
 *   tracked physical allocation into the host arena (copy_engine.c) -> unmap and release it,
 *   keeping the virtual addresses. The gate stays closed: the agent now calls the
 *   driver checkpoint API for what is left (contexts, modules, pool memory).
 * restore (after the agent's driver restore + unlock): re-create each physical
 *   allocation, map it at the same addresses with the same access, copy the data
 *   back, reopen the gate.
 * Both replies list the arena placements ("blobs": handle, va, size, device,
 * host address), the checkpoint reply also the UUIDs of the GPUs the process
 * sees ("device_uuids", by ordinal); whole-process migration saves them from
 * there (store/gpu_data.py) and takes the arena out of the address space around the
 * CRIU dump (arena_detach / arena_attach, arena.c). A preempted job's agent
 * keeps the arena's pages on the node without copying them (arena_files). */
#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "checkpoint.h"
#include "contexts.h"
#include "control.h"
#include "copy_engine.h"
#include "copy_stats.h"
#include "datapath.h"
#include "driver.h"
#include "gate.h"
#include "helper.h"
#include "hooks_async.h"
#include "hooks_vmm.h"
#include "json.h"
#include "log.h"
#include "mapping.h"
#include "nccl_cut.h"
#include "protocol_keys.h"
#include "table.h"

#define MAX_CTX 16

enum process_state { ST_RUNNING, ST_CHECKPOINTED };
static enum process_state state = ST_RUNNING;
static int state_cuda; /* the checkpoint moved GPU state */
static int sync_busy;  /* a timed-out context sync still runs */
static uint64_t last_bytes;

/* ---- helpers ------------------------------------------------------------ */

/* {"ok": false, "error": msg, "reason": reason}; returns outcome */
static int fail(struct jbuf *out, int outcome, const char *reason, const char *msg)
{
    jb_begin(out);
    jb_bool(out, KEY_ok, 0);
    jb_str(out, KEY_error, msg);
    jb_str(out, KEY_reason, reason);
    jb_end(out);
    return outcome;
}

static void err(struct jbuf *out, const char *msg) { fail(out, GPUCR_FAILED, "failed", msg); }

/* {"ok": true, key: v}: the whole answer of a command with nothing else to say */
static void ok_with(struct jbuf *out, const char *key, int v)
{
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_bool(out, key, v);
    jb_end(out);
}

static const char *cu_name(CUresult r)
{
    static char buf[32];
    snprintf(buf, sizeof buf, "CUDA error %d", (int)r);
    return buf;
}

/* how the data moved: the engine that moved it (copy_engine.c), why not the
 * chosen one where that failed, and the knobs of datapath.c */
static void jb_data_path(struct jbuf *out, const struct gpucr_xfer *x)
{
    const struct gpucr_copy_stats *cs = &x->cs;
    jb_str(out, KEY_data_path, x->by->name);
    if (x->fallback)
        jb_str(out, KEY_helper_fallback, x->fallback);
    jb_i64(out, KEY_copy_threads, cs->threads);
    if (cs->nsteps) {
        jb_key_obj(out, KEY_helper_steps);
        for (int i = 0; i < cs->nsteps; i++)
            jb_f64(out, cs->steps[i].name, cs->steps[i].s);
        jb_end(out);
    }
    if (!cs->bounce)
        return;
    jb_str(out, KEY_copy_stores, cs->streaming ? "streaming" : "cached");
    jb_str(out, KEY_copy_wait, cs->blocking ? "block" : "spin");
}

int gpucr_host_register(void *base, size_t size)
{
    return gpucr_drv.cuMemHostRegister_v2(base, size, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS ? 0 : -1;
}

static int host_unregister(void *base, size_t size)
{
    (void)size;
    return gpucr_drv.cuMemHostUnregister(base) == CUDA_SUCCESS ? 0 : -1;
}

int gpucr_checkpoint_running(void) { return __atomic_load_n(&state, __ATOMIC_RELAXED) == ST_RUNNING; }

/* ---- what cannot be checkpointed ---------------------------------------- */

static int refusal(char *why, size_t len)
{
    size_t exported, imported;
    gpucr_table_lock();
    size_t managed = gpucr_set_count(SET_MANAGED);
    size_t legacy = gpucr_set_count(SET_IPC_LEGACY), opened = gpucr_set_count(SET_IPC_OPENED);
    gpucr_phys_count_shared(&exported, &imported);
    int mps = 0;
    const struct u64map *ctxs = gpucr_set_map(SET_CTX);
    U64MAP_FOREACH(ctxs, i) {
        int v = 0;
        if (gpucr_drv.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, (CUdevice)ctxs->vals[i]) == CUDA_SUCCESS && v)
            mps = 1;
    }
    gpucr_table_unlock();
    if (managed)
        snprintf(why, len, "checkpoint refused: the process uses managed (UVM) memory (%zu allocation%s), which the driver "
                 "cannot checkpoint; it keeps running (cudaMalloc instead of cudaMallocManaged makes it checkpointable)",
                 managed, managed == 1 ? "" : "s");
    else if (exported || legacy || gpucr_ipc_sticky)
        snprintf(why, len, "checkpoint refused: the process exports GPU memory to other processes (CUDA IPC), which the "
                 "driver cannot checkpoint; it keeps running");
    else if (imported || opened)
        snprintf(why, len, "checkpoint refused: the process maps GPU memory of another process (CUDA IPC), which the "
                 "driver cannot checkpoint; it keeps running");
    else if (__atomic_load_n(&gpucr_multicast, __ATOMIC_RELAXED))
        snprintf(why, len, "checkpoint refused: the process uses NVLink multicast (NVLS), which cannot be made again "
                 "at a restore; it keeps running (NCCL_NVLS_ENABLE=0 keeps NCCL from using it)");
    else if (mps)
        snprintf(why, len, "checkpoint refused: the process is an MPS client, which the driver cannot checkpoint; it keeps "
                 "running (run it without MPS to make it checkpointable)");
    else
        return 0;
    return 1;
}

/* ---- quiesce ------------------------------------------------------------ */

struct sync_job {
    CUcontext ctx[MAX_CTX];
    int n;
    int done;
    CUresult rc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *sync_thread(void *arg)
{
    struct sync_job *j = arg;
    CUresult rc = CUDA_SUCCESS;
    for (int i = 0; i < j->n && rc == CUDA_SUCCESS; i++) {
        rc = gpucr_drv.cuCtxSetCurrent(j->ctx[i]);
        if (rc == CUDA_SUCCESS)
            rc = gpucr_drv.cuCtxSynchronize();
    }
    pthread_mutex_lock(&j->mu);
    j->rc = rc;
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    __atomic_store_n(&sync_busy, 0, __ATOMIC_SEQ_CST);
    return NULL;
}

/* Synchronizes all known contexts within timeout_ms: 0, 1 timeout, -1 error. */
static int sync_contexts(long timeout_ms, CUresult *rc)
{
    static struct sync_job job; /* outlives a timed-out wait */
    double deadline = gpucr_now() + timeout_ms / 1000.0;
    /* the sync of an earlier, timed-out checkpoint may still run: wait for it */
    while (__atomic_load_n(&sync_busy, __ATOMIC_SEQ_CST)) {
        if (gpucr_now() >= deadline)
            return 1;
        usleep(1000);
    }
    timeout_ms = (long)((deadline - gpucr_now()) * 1000);
    if (timeout_ms < 1)
        timeout_ms = 1;
    memset(&job, 0, sizeof job);
    pthread_mutex_init(&job.mu, NULL);
    pthread_cond_init(&job.cv, NULL);
    gpucr_table_lock();
    const struct u64map *ctxs = gpucr_set_map(SET_CTX);
    U64MAP_FOREACH(ctxs, i) if (job.n < MAX_CTX) job.ctx[job.n++] = (CUcontext)(uintptr_t)ctxs->keys[i];
    gpucr_table_unlock();
    sync_busy = 1;
    pthread_t t;
    if (pthread_create(&t, NULL, sync_thread, &job) != 0) {
        sync_busy = 0;
        return -1;
    }
    pthread_detach(t);
    struct timespec dl = gpucr_deadline_in(timeout_ms);
    pthread_mutex_lock(&job.mu);
    while (!job.done)
        if (pthread_cond_timedwait(&job.cv, &job.mu, &dl) == ETIMEDOUT)
            break;
    int done = job.done;
    *rc = job.rc;
    pthread_mutex_unlock(&job.mu);
    if (!done)
        return 1;
    return *rc == CUDA_SUCCESS ? 0 : -1;
}

static void trim_pools(void)
{
    gpucr_table_lock();
    const struct u64map *ctxs = gpucr_set_map(SET_CTX);
    U64MAP_FOREACH(ctxs, i) {
        CUmemoryPool pool;
        if (gpucr_drv.cuDeviceGetDefaultMemPool && gpucr_drv.cuDeviceGetDefaultMemPool(&pool, (CUdevice)ctxs->vals[i]) == CUDA_SUCCESS)
            gpucr_drv.cuMemPoolTrimTo(pool, 0);
    }
    const struct u64map *pools = gpucr_set_map(SET_POOLS);
    U64MAP_FOREACH(pools, i) gpucr_drv.cuMemPoolTrimTo((CUmemoryPool)(uintptr_t)pools->keys[i], 0);
    gpucr_table_unlock();
}

/* ---- data ----------------------------------------------------------------- */

struct work {
    struct gpucr_phys **p;
    size_t n, cap;
};

static void collect(struct gpucr_phys *p, void *arg)
{
    struct work *w = arg;
    if (p->size == 0 || (p->flags & (PHYS_IMPORTED | PHYS_EXPORTED)))
        return;
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 256;
        void *np = realloc(w->p, nc * sizeof *w->p);
        if (!np)
            return;
        w->p = np;
        w->cap = nc;
    }
    if (!p->ctx) { /* created with no current context: any on its device */
        const struct u64map *ctxs = gpucr_set_map(SET_CTX);
        U64MAP_FOREACH(ctxs, i) if (!p->ctx || (int)ctxs->vals[i] == p->device) p->ctx = (void *)(uintptr_t)ctxs->keys[i];
    }
    w->p[w->n++] = p;
}

static void unmap_dropped(struct gpucr_map *m, void *arg)
{
    CUresult *rc = arg;
    struct gpucr_phys *p = gpucr_phys_get(m->vhandle);
    if (p && p->host && p->dropped == PHYS_RESIDENT) {
        CUresult r = gpucr_drv.cuMemUnmap(m->va, m->size);
        if (r != CUDA_SUCCESS && *rc == CUDA_SUCCESS)
            *rc = r;
    }
}

/* The arena placements of a checkpointed process, one object per allocation. */
struct blob_list {
    struct jbuf *out;
    int n;
};

static void put_blob(struct gpucr_phys *p, void *arg)
{
    struct blob_list *b = arg;
    char key[24];
    if (!p->host || p->dropped != PHYS_DROPPED)
        return;
    snprintf(key, sizeof key, "%d", b->n++);
    jb_key_obj(b->out, key);
    jb_u64(b->out, KEY_handle, p->vhandle);
    jb_u64(b->out, KEY_va, p->copy_va); /* its whole mapping; 0 when not mapped whole */
    jb_u64(b->out, KEY_size, p->size);
    jb_i64(b->out, KEY_device, p->device);
    jb_u64(b->out, KEY_host, (uint64_t)(uintptr_t)p->host);
    jb_end(b->out);
}

static void put_blobs(struct jbuf *out)
{
    struct blob_list b = {out, 0};
    jb_key_obj(out, KEY_blobs);
    gpucr_table_lock();
    gpucr_phys_foreach(put_blob, &b);
    gpucr_table_unlock();
    jb_end(out);
}

/* The UUIDs of the GPUs this process sees, by CUDA ordinal ("0": "GPU-..."). The
 * image records them so that a restore on another GPU can map each one onto a GPU
 * of the same model there (the driver's gpuPairs): the ordinals stay, so nothing
 * the shim keeps (allocation properties, contexts, streams) names a physical GPU. */
static void put_device_uuids(struct jbuf *out)
{
    int n = 0;
    if (!gpucr_drv.cuDeviceGetCount || !gpucr_drv.cuDeviceGet || !gpucr_drv.cuDeviceGetUuid_v2 || gpucr_drv.cuDeviceGetCount(&n) != CUDA_SUCCESS)
        return;
    jb_key_obj(out, KEY_device_uuids);
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        CUuuid u;
        if (gpucr_drv.cuDeviceGet(&dev, i) != CUDA_SUCCESS || gpucr_drv.cuDeviceGetUuid_v2(&u, dev) != CUDA_SUCCESS)
            break;
        const unsigned char *b = (const unsigned char *)u.bytes;
        char key[12], text[48];
        snprintf(key, sizeof key, "%d", i);
        snprintf(text, sizeof text,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        jb_str(out, key, text);
    }
    jb_end(out);
}

static void clear_copy_state(struct gpucr_phys *p, void *arg)
{
    (void)arg;
    p->copy_va = 0;
    p->host = NULL;
}

/* ---- commands -------------------------------------------------------------- */

int gpucr_cmd_checkpoint(long timeout_ms, struct jbuf *out)
{
    char why[256];
    if (state != ST_RUNNING)
        return fail(out, GPUCR_ALREADY_CHECKPOINTED, "already_checkpointed", "already checkpointed: restore it first");
    double t0 = gpucr_now();
    if (gpucr_nccl_refusal(why, sizeof why)) /* its peers would wait for it forever */
        return fail(out, GPUCR_FAILED, "refused", why);
    if (!gpucr_driver_loaded()) { /* a CPU process: nothing on the GPU */
        state = ST_CHECKPOINTED;
        state_cuda = 0;
        ok_with(out, KEY_cuda, 0);
        return GPUCR_DONE;
    }
    if (refusal(why, sizeof why))
        return fail(out, GPUCR_FAILED, "refused", why);
    if (timeout_ms < 0)
        timeout_ms = 10000;

    /* quiesce */
    if (gpucr_gate_close(timeout_ms) != 0) {
        snprintf(why, sizeof why, "quiesce timed out after %ld ms with %ld calls still in the driver; checkpoint aborted, the process keeps running",
                 timeout_ms, gpucr_gate_inflight());
        return fail(out, GPUCR_FAILED, "quiesce_timeout", why);
    }
    long left = timeout_ms - (long)((gpucr_now() - t0) * 1000);
    CUresult rc = CUDA_SUCCESS;
    int s = sync_contexts(left > 0 ? left : 1, &rc);
    if (s != 0) {
        gpucr_gate_open();
        if (s > 0)
            snprintf(why, sizeof why, "quiesce timed out after %ld ms waiting for GPU work to finish; checkpoint aborted, the process keeps running", timeout_ms);
        else
            snprintf(why, sizeof why, "synchronizing the GPU failed (%s); checkpoint aborted, the process keeps running", cu_name(rc));
        return fail(out, GPUCR_FAILED, s > 0 ? "quiesce_timeout" : "failed", why);
    }
    if (refusal(why, sizeof why)) { /* shared or managed while we waited */
        gpucr_gate_open();
        return fail(out, GPUCR_FAILED, "refused", why);
    }
    trim_pools();
    double t1 = gpucr_now();

    /* data: copy out */
    struct work w = {0, 0, 0};
    gpucr_table_lock();
    gpucr_phys_foreach(collect, &w);
    gpucr_pick_sources();
    size_t *sizes = calloc(w.n ? w.n : 1, sizeof *sizes);
    void **hosts = calloc(w.n ? w.n : 1, sizeof *hosts);
    uint64_t bytes = 0;
    for (size_t i = 0; i < w.n && sizes; i++)
        bytes += (sizes[i] = w.p[i]->size);
    rc = CUDA_SUCCESS;
    const char *fail = NULL;
    double reg0 = gpucr_arena_setup_seconds();
    if (!sizes || !hosts)
        fail = "out of host memory";
    if (!fail && w.n) {
        gpucr_use_ctx(w.p[0]->ctx);
        if (gpucr_arena_place(sizes, w.n, hosts, gpucr_pin_arena ? gpucr_host_register : NULL,
                              gpucr_pin_arena ? host_unregister : NULL) != 0)
            fail = *gpucr_arena_error() ? gpucr_arena_error()
                                         : "the host arena could not grow (out of shared memory or huge pages?)";
    }
    for (size_t i = 0; !fail && i < w.n; i++)
        w.p[i]->host = hosts[i];
    struct gpucr_xfer x = {0};
    double tc = gpucr_now();
    if (!fail) {
        fail = gpucr_engine_out(w.p, w.n, &x);
        rc = x.rc;
    }
    if (fail) {
        for (size_t i = 0; i < w.n; i++)
            gpucr_scratch_unmap(w.p[i]);
        gpucr_phys_foreach(clear_copy_state, NULL);
        gpucr_arena_reset();
        gpucr_table_unlock();
        gpucr_gate_open();
        free(sizes);
        free(hosts);
        free(w.p);
        snprintf(why, sizeof why, "%s (%s); checkpoint aborted, the process keeps running", fail, cu_name(rc));
        err(out, why);
        return GPUCR_FAILED;
    }
    /* every byte is on the host: release the physical memory, keep the VAs */
    double tr = gpucr_now();
    rc = CUDA_SUCCESS;
    gpucr_map_foreach(unmap_dropped, &rc);
    for (size_t i = 0; i < w.n; i++) {
        struct gpucr_phys *p = w.p[i];
        gpucr_scratch_unmap(p);
        if (p->user_refs > 0 || (p->flags & PHYS_SHIM_OWNED)) {
            CUresult r = gpucr_drv.cuMemRelease(p->rhandle);
            if (r != CUDA_SUCCESS && rc == CUDA_SUCCESS)
                rc = r;
        }
        p->dropped = PHYS_DROPPED;
    }
    size_t n = w.n;
    gpucr_table_unlock();
    free(sizes);
    free(hosts);
    free(w.p);
    double t2 = gpucr_now();
    state = ST_CHECKPOINTED;
    state_cuda = 1;
    last_bytes = bytes;
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_bool(out, KEY_cuda, 1);
    jb_f64(out, KEY_quiesce_s, t1 - t0);
    jb_f64(out, KEY_data_s, t2 - t1);
    /* data_s = prepare (placement, one-time growth) + copy + release */
    jb_f64(out, KEY_prepare_s, tc - t1);
    jb_f64(out, KEY_copy_s, x.cs.seconds);
    jb_f64(out, KEY_release_s, t2 - tr);
    jb_data_path(out, &x);
    jb_bool(out, KEY_arena_pinned, gpucr_pin_arena); /* then arena_detach needs CUDA */
    jb_u64(out, KEY_bytes, bytes);
    jb_u64(out, KEY_allocations, n);
    jb_f64(out, KEY_arena_setup_s, gpucr_arena_setup_seconds() - reg0 + x.cs.setup_s);
    jb_u64(out, KEY_driver_path_bytes, gpucr_set_sum(SET_ASYNC));
    if (rc != CUDA_SUCCESS)
        jb_str(out, KEY_warning, cu_name(rc));
    put_device_uuids(out);
    put_blobs(out);
    jb_end(out);
    return GPUCR_DONE;
}

int gpucr_cmd_restore(struct jbuf *out)
{
    char why[256];
    if (state != ST_CHECKPOINTED)
        return fail(out, GPUCR_NOT_CHECKPOINTED, "not_checkpointed", "not checkpointed: nothing to restore");
    if (gpucr_arena_detached())
        return fail(out, GPUCR_FAILED, "failed", "the arena is detached (a migration is under way): attach and refill it first");
    double t0 = gpucr_now();
    if (!state_cuda) {
        state = ST_RUNNING;
        ok_with(out, KEY_cuda, 0);
        return GPUCR_DONE;
    }
    struct work w = {0, 0, 0};
    gpucr_table_lock();
    gpucr_phys_foreach(collect, &w);
    struct gpucr_xfer x = {0};
    const char *fail = gpucr_engine_in(w.p, w.n, &x);
    if (fail) {
        /* Stay checkpointed: the data is still in the arena; a retry may work
         * once memory is free. */
        gpucr_table_unlock();
        free(w.p);
        snprintf(why, sizeof why, "%s (%s); the process stays checkpointed, retry restore when the GPU has room", fail, cu_name(x.rc));
        err(out, why);
        return GPUCR_FAILED;
    }
    for (size_t i = 0; i < w.n; i++) {
        struct gpucr_phys *p = w.p[i];
        gpucr_scratch_unmap(p);
        if (p->user_refs == 0 && !(p->flags & PHYS_SHIM_OWNED))
            gpucr_drv.cuMemRelease(p->rhandle); /* the application had released it */
        p->dropped = PHYS_RESIDENT;
        p->host = NULL;
        p->copy_va = 0;
    }
    gpucr_table_unlock();
    free(w.p);
    gpucr_arena_reset();
    double t1 = gpucr_now();
    state = ST_RUNNING;
    gpucr_gate_open();
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_bool(out, KEY_cuda, 1);
    jb_f64(out, KEY_data_s, t1 - t0);
    /* data_s = re-create + map physical memory, then copy; on the helper path
     * the copies run beside the import and mapping, from tc ~ t0 */
    jb_f64(out, KEY_create_s, x.tc - t0);
    jb_f64(out, KEY_copy_s, x.cs.seconds);
    jb_data_path(out, &x);
    jb_f64(out, KEY_arena_setup_s, x.cs.setup_s);
    jb_u64(out, KEY_bytes, last_bytes);
    jb_end(out);
    return GPUCR_DONE;
}

void gpucr_cmd_prefill(struct jbuf *out)
{
    if (state != ST_CHECKPOINTED || !state_cuda)
        return err(out, "not checkpointed: nothing to prefill");
    const struct gpucr_engine *e = gpucr_engine(); /* only the helper starts an in ahead */
    if (!e->prefill || gpucr_arena_detached()) {
        return ok_with(out, KEY_prefill, 0);
    }
    struct work w = {0, 0, 0};
    gpucr_table_lock();
    gpucr_phys_foreach(collect, &w);
    int started = w.n && e->prefill(w.p, w.n) == 0;
    gpucr_table_unlock();
    free(w.p);
    ok_with(out, KEY_prefill, started);
}

/* ---- migration: the arena out of the address space and back -------------- */

/* Any context: host registrations are portable. */
static CUresult any_ctx(void)
{
    CUcontext ctx = gpucr_any_context();
    return ctx ? gpucr_use_ctx(ctx) : CUDA_ERROR_INVALID_CONTEXT;
}

/* After the driver checkpoint of a migration, while the driver holds the
 * process locked (so no CUDA call): the staging ring is scratch, yet CRIU would
 * save all of it (1 GiB at 16 threads) into the image. Its pages are dropped;
 * the driver pins them again, zero-filled, at restore. Freeing it instead
 * (cuMemFreeHost, before the lock) took about 2 s on the H100. */
void gpucr_cmd_staging_drop(struct jbuf *out)
{
    size_t n = gpucr_staging_bytes();
    if (gpucr_staging_drop() != 0) {
        char why[200];
        snprintf(why, sizeof why, "dropping the staging ring's pages failed (%s)", strerror(errno));
        return err(out, why);
    }
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_u64(out, KEY_staging_bytes_dropped, n);
    jb_end(out);
}

/* "segment_ranges": [[base, size], ...] of the first n arena segments */
static void put_segment_ranges(struct jbuf *out, int n)
{
    jb_key_arr(out, KEY_segment_ranges);
    for (int i = 0; i < n; i++) {
        uintptr_t base = 0;
        size_t size = gpucr_arena_bounds(i, &base);
        jb_arr_begin(out);
        jb_elem_u64(out, base);
        jb_elem_u64(out, size);
        jb_arr_end(out);
    }
    jb_arr_end(out);
}

/* At a preemption, after the checkpoint: the agent keeps the arena's pages
 * without copying them, by linking each segment's file into a node-local stage
 * folder (linkat of /proc/<pid>/fd/<fd>, AT_SYMLINK_FOLLOW) before the process
 * ends. Changes nothing; a later checkpoint writes into new files instead
 * (gpucr_arena_place). fd -1: that segment has none to link. */
void gpucr_cmd_arena_files(const char *line, struct jbuf *out)
{
    int fds[GPUCR_ARENA_MAX_SEGS], linkable[GPUCR_ARENA_MAX_SEGS];
    char into[4096] = "", why[4300];
    struct json_value v;
    if (state != ST_CHECKPOINTED || !state_cuda)
        return err(out, "not checkpointed with GPU data: no arena files to hand over");
    if (gpucr_arena_detached())
        return err(out, "the arena is detached: its files are gone");
    int n = gpucr_arena_segments(); /* no growth while checkpointed (arena_ready.c) */
    for (int i = 0; i < n; i++)
        gpucr_arena_segment_file(i, &fds[i], &linkable[i]);
    /* "into": the shim links them there itself, in its own mount namespace */
    if (json_find(line, KEY_into, &v) == 1 && v.type == JSON_STRING) {
        long len = json_string(&v, into, sizeof into);
        if (len <= 0 || (size_t)len >= sizeof into)
            return err(out, "arena_files: \"into\" is not a folder's path");
        if (gpucr_arena_link_into(into) != 0) {
            snprintf(why, sizeof why, "linking the arena's files into %s failed (%s)", into, strerror(errno));
            return err(out, why);
        }
    }
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_bool(out, KEY_linked, into[0] != 0);
    jb_str(out, KEY_arena_dir, gpucr_arena_dir());
    jb_key_arr(out, KEY_segment_fds);
    for (int i = 0; i < n; i++)
        jb_elem_i64(out, fds[i]);
    jb_arr_end(out);
    jb_key_arr(out, KEY_segment_linkable);
    for (int i = 0; i < n; i++)
        jb_elem_bool(out, linkable[i]);
    jb_arr_end(out);
    put_segment_ranges(out, n);
    jb_end(out);
}

/* After the agent saved the blobs. A pinned arena is unregistered first, which
 * needs CUDA (so: before the driver checkpoint); an unpinned one needs no CUDA
 * call, and may go after it, while the driver holds the process locked. */
void gpucr_cmd_arena_detach(struct jbuf *out)
{
    char why[200];
    if (state != ST_CHECKPOINTED || !state_cuda)
        return err(out, "not checkpointed with GPU data: nothing to detach");
    double t0 = gpucr_now();
    CUresult rc = gpucr_pin_arena ? any_ctx() : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) {
        snprintf(why, sizeof why, "no CUDA context to unregister the arena with (%s)", cu_name(rc));
        return err(out, why);
    }
    if (gpucr_arena_detach(gpucr_pin_arena ? host_unregister : NULL) != 0) {
        snprintf(why, sizeof why, "detaching the arena failed (%s)", strerror(errno));
        return err(out, why);
    }
    /* CRIU cannot dump a connection to another process: the helper lets go of
     * this process's old arena files; a later use connects anew */
    gpucr_helper_disconnect();
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_i64(out, KEY_segments, gpucr_arena_segments());
    jb_u64(out, KEY_arena_bytes, gpucr_arena_capacity());
    /* what a restore needs to fill the segments' files ahead (arena_attach) */
    jb_str(out, KEY_arena_dir, gpucr_arena_dir());
    put_segment_ranges(out, gpucr_arena_segments());
    jb_f64(out, KEY_detach_s, gpucr_now() - t0);
    jb_end(out);
}

/* After the driver restore (+ unlock), before the agent refills the blobs. With
 * descriptors, the agent filled the segments' files ahead: they are mapped as
 * they are ("filled": true), and the blobs need no refill. */
void gpucr_cmd_arena_attach(int linkable, struct jbuf *out)
{
    char why[200];
    int fds[GPUCR_ARENA_MAX_SEGS];
    int nfds = gpucr_control_take_fds(fds, GPUCR_ARENA_MAX_SEGS);
    if (nfds < 0)
        return err(out, "more descriptors came with arena_attach than the arena has segments");
    if (state != ST_CHECKPOINTED || !gpucr_arena_detached()) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        return err(out, "the arena is not detached: nothing to attach");
    }
    double t0 = gpucr_now();
    CUresult rc = any_ctx();
    if (rc != CUDA_SUCCESS) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        snprintf(why, sizeof why, "no CUDA context to register the arena with (%s); restore the driver state first", cu_name(rc));
        return err(out, why);
    }
    gpucr_register_fn reg = gpucr_pin_arena ? gpucr_host_register : NULL;
    if (nfds > 0 && gpucr_arena_attach_files(reg, fds, nfds, linkable) != 0) {
        snprintf(why, sizeof why, "mapping the arena's %d files filled ahead failed (%s)", nfds, strerror(errno));
        return err(out, why);
    }
    if (nfds == 0 && gpucr_arena_attach(reg) != 0) {
        snprintf(why, sizeof why, "re-creating the arena in %s failed (%s)", gpucr_arena_dir(), strerror(errno));
        return err(out, why);
    }
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_bool(out, KEY_filled, nfds > 0);
    jb_u64(out, KEY_arena_bytes, gpucr_arena_capacity());
    jb_f64(out, KEY_attach_s, gpucr_now() - t0);
    put_blobs(out);
    jb_end(out);
}

void gpucr_checkpoint_after_fork_child(void)
{
    state = ST_RUNNING;
    state_cuda = 0;
    sync_busy = 0;
    gpucr_datapath_after_fork_child();
    gpucr_helper_after_fork_child();
}

void gpucr_checkpoint_at_exit(void) { gpucr_arena_destroy(NULL); }
