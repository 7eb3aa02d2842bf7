/* The host arena made ready ahead of any checkpoint (GPUCR_ARENA_PREALLOC), so
 * that creating and pre-faulting it, the staging ring and the copy helper's
 * pinning -- seconds for tens of GiB -- are never paid on the checkpoint path.
 *
 *   SIZE  create and pre-fault SIZE bytes at start-up (`gpucr-hpc run --arena-size`);
 *   auto  follow the GPU footprint: whenever the tracked GPU memory no longer
 *         fits in the arena, grow it in the background (a Slurm job has no
 *         size to give; plugstack arena_prealloc=auto); and give segments a
 *         restore mapped from a drained stage folder new files
 *         (gpucr_arena_refresh), so the next preemption need not copy them.
 *
 * Once the program has a CUDA context: the staging ring (or the pinned arena,
 * GPUCR_ARENA_PIN), and with a copy helper (GPUCR_COPY_HELPER) each new
 * segment is handed to it to map and pin. GPUCR_COPY_HELPER_START starts the
 * helper first when none serves, also without GPUCR_ARENA_PREALLOC (then the
 * first checkpoint makes the arena); a helper that cannot start is tried
 * again a minute later, a few times. With GPUCR_ARENA_REPORT these one-time
 * costs are told on stderr. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "arena_ready.h"
#include "checkpoint.h"
#include "contexts.h"
#include "datapath.h"
#include "driver.h"
#include "helper.h"
#include "log.h"
#include "table.h"

#define POLL_US 200000           /* how often auto looks at the footprint */
#define HELPER_RETRY_S 60.0      /* auto: how often to look for a missing helper again */
#define HELPER_START_WAIT_S 120.0
#define HELPER_STARTS 3          /* at most, per process: each failure is a line in the job's output */

enum mode { MODE_OFF, MODE_SIZE, MODE_AUTO, MODE_HELPER };
static enum mode mode;
static size_t fixed_size; /* MODE_SIZE */
static int report;
static int ready;          /* the arena is there and the copy set up */
static double helper_s;    /* the copy helper's mapping and pinning, summed */
static pthread_t thread;
static int running;
static int said_no_room;  /* the job was told once that the arena had no room */

int gpucr_arena_ready(void) { return __atomic_load_n(&ready, __ATOMIC_ACQUIRE); }
const char *gpucr_arena_ready_mode(void)
{
    return mode == MODE_SIZE ? "size" : mode == MODE_AUTO ? "auto" : "off";
}
double gpucr_arena_helper_seconds(void) { return helper_s; }

static void collect_size(struct gpucr_phys *p, void *arg)
{
    size_t **at = arg;
    if (p->size && !(p->flags & (PHYS_IMPORTED | PHYS_EXPORTED))) /* what a checkpoint places */
        *(*at)++ = p->size;
}

/* Bytes of the tracked allocations that the arena could not take now. */
static size_t shortfall(void)
{
    gpucr_table_lock();
    size_t n = gpucr_phys_count();
    size_t *sizes = malloc((n ? n : 1) * sizeof *sizes), *at = sizes;
    if (sizes)
        gpucr_phys_foreach(collect_size, &at);
    gpucr_table_unlock();
    if (!sizes)
        return 0;
    size_t missing = gpucr_arena_shortfall(sizes, (size_t)(at - sizes));
    free(sizes);
    return missing;
}

/* The copy helper maps and pins the segments it does not have yet; started
 * first when none serves (start). 0 when it has them all. */
static int starts;

static int share_with_helper(int start, double *secs)
{
    double t0 = gpucr_now(), shared = 0;
    if (start && starts++ < HELPER_STARTS && gpucr_helper_start(HELPER_START_WAIT_S) != 0)
        return -1;
    int rc = gpucr_helper_share_arena(&shared);
    helper_s += shared;
    *secs = gpucr_now() - t0;
    return rc;
}

static void tell(const char *what, double create_s, double copy_s, int helper_rc, double helper_secs)
{
    char helper_part[400] = "";
    if (gpucr_helper_enabled() && helper_rc == 0)
        snprintf(helper_part, sizeof helper_part, ", pinned by the copy helper %.2f s", helper_secs);
    else if (gpucr_helper_enabled())
        snprintf(helper_part, sizeof helper_part, ", copy helper not ready (%s): checkpoints will try again",
                 gpucr_helper_error());
    gpucr_log("arena %s: %zu bytes, create + pre-fault %.2f s, %s %.2f s%s", what, gpucr_arena_capacity(), create_s,
              gpucr_pin_arena ? "pin" : "staging ring", copy_s, helper_part);
    if (report)
        fprintf(stderr, "gpucr: %.2f GiB arena in %s %s (one-time, off the checkpoint path: create + pre-fault %.2f s, "
                "%s %.2f s%s)\n", gpucr_arena_capacity() / 1073741824.0, gpucr_arena_dir(), what, create_s,
                gpucr_pin_arena ? "pin" : "staging ring", copy_s, helper_part);
}

/* auto: grow the arena whenever the footprint outgrows it (by
 * gpucr_arena_growth: a footprint that grows bit by bit makes few segments).
 * Both auto and helper-only: start a missing helper again now and then, and
 * one on the new node after a migration. */
static void follow(int helper_rc)
{
    size_t last = (size_t)-1;
    double helper_tried = gpucr_now();
    for (;;) {
        usleep(POLL_US);
        if (!gpucr_checkpoint_running() || gpucr_arena_detached())
            continue; /* the arena is in use */
        /* a restore that mapped the arena from a stage folder left files that can
         * never be linked again: new ones, for the next preemption (arena.c) */
        double r0 = gpucr_now();
        int fresh = gpucr_pin_arena ? 0 : gpucr_arena_refresh(NULL, NULL);
        if (fresh > 0) {
            double helper_secs = 0;
            if (gpucr_helper_enabled())
                helper_rc = share_with_helper(0, &helper_secs);
            tell("given new files after a restore", gpucr_now() - r0, 0, helper_rc, helper_secs);
        }
        double now = gpucr_now();
        if (now < helper_tried) /* restored on another machine: its clock */
            helper_tried = now - HELPER_RETRY_S - 1;
        /* none yet, or none here: a restored process (migration) connects anew */
        int retry_helper = gpucr_helper_enabled() && (helper_rc != 0 || !gpucr_helper_connected()) &&
                           starts < HELPER_STARTS && now - helper_tried > HELPER_RETRY_S;
        if (mode == MODE_HELPER && !retry_helper)
            continue;
        size_t bytes = gpucr_phys_bytes();
        if (bytes == last && !retry_helper)
            continue;
        last = bytes;
        size_t missing = mode == MODE_AUTO ? shortfall() : 0, cap = gpucr_arena_capacity();
        double create_s = 0, helper_secs = 0;
        if (missing) {
            size_t more = gpucr_arena_growth(missing, cap);
            double t0 = gpucr_now();
            if (gpucr_arena_grow(more) != 0) {
                int e = errno;
                gpucr_log("arena: growing by %zu bytes failed (%s)", more, strerror(e));
                if (report || (*gpucr_arena_error() && !said_no_room)) /* said once: it follows every change */
                    fprintf(stderr, "gpucr: growing the arena in %s by %.2f GiB failed (%s); a checkpoint will try "
                            "again\n", gpucr_arena_dir(), more / 1073741824.0,
                            *gpucr_arena_error() ? gpucr_arena_error() : strerror(e));
                said_no_room |= *gpucr_arena_error() != '\0';
                continue; /* again when the footprint changes */
            }
            create_s = gpucr_now() - t0;
        }
        if (gpucr_helper_enabled() && (missing || retry_helper)) {
            helper_tried = gpucr_now();
            helper_rc = share_with_helper(retry_helper, &helper_secs);
        }
        if (missing)
            tell("grown", create_s, 0, helper_rc, helper_secs);
    }
}

static void *ready_thread(void *arg)
{
    (void)arg;
    double t0 = gpucr_now(), t1 = t0;
    if (mode == MODE_SIZE) {
        if (gpucr_arena_prealloc(fixed_size) != 0) {
            int e = errno;
            gpucr_log("arena preallocation of %zu bytes failed", fixed_size);
            if (report)
                fprintf(stderr, "gpucr: creating the %.2f GiB arena in %s failed (%s); checkpoints will grow it as "
                        "needed\n", fixed_size / 1073741824.0, gpucr_arena_dir(), strerror(e));
            return NULL;
        }
        t1 = gpucr_now();
    }
    CUcontext ctx;
    while (!(ctx = gpucr_any_context()))
        usleep(POLL_US);
    double t2 = gpucr_now();
    if (mode != MODE_HELPER && gpucr_drv.cuCtxSetCurrent(ctx) == CUDA_SUCCESS) {
        if (gpucr_pin_arena)
            gpucr_arena_register_pending(gpucr_host_register);
        else
            gpucr_staging_setup();
    }
    double t3 = gpucr_now(), helper_secs = 0;
    int helper_rc = gpucr_helper_enabled() ? share_with_helper(1, &helper_secs) : 0;
    if (mode == MODE_SIZE) {
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
        tell("ready", t1 - t0, t3 - t2, helper_rc, helper_secs);
        return NULL;
    }
    if (mode == MODE_AUTO) {
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
        tell("following the GPU footprint", 0, t3 - t2, helper_rc, helper_secs);
    }
    follow(helper_rc);
    return NULL;
}

static void start(void)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the program's signals are not for this thread */
    running = pthread_create(&thread, NULL, ready_thread, NULL) == 0;
    if (running)
        pthread_detach(thread);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* GPUCR_ARENA_PREALLOC: bytes with an optional K/M/G suffix, or auto. Without
 * it, only a helper to start (GPUCR_COPY_HELPER_START) needs the thread. */
void gpucr_arena_ready_init(const char *spec)
{
    const char *rep = getenv("GPUCR_ARENA_REPORT"), *helper_start = getenv("GPUCR_COPY_HELPER_START");
    report = rep && *rep && strcmp(rep, "0") != 0;
    mode = MODE_OFF;
    if (spec && strcmp(spec, "auto") == 0)
        mode = MODE_AUTO;
    else if (spec && *spec) {
        char *end;
        double v = strtod(spec, &end);
        double mul = (*end == 'G' || *end == 'g') ? 1073741824.0 : (*end == 'M' || *end == 'm') ? 1048576.0
                   : (*end == 'K' || *end == 'k') ? 1024.0 : 1.0;
        if (v > 0 && (!*end || (strchr("GgMmKk", *end) && !end[1]))) {
            mode = MODE_SIZE;
            fixed_size = (size_t)(v * mul);
        } else
            fprintf(stderr, "gpucr: GPUCR_ARENA_PREALLOC=%s is neither a size (e.g. 80G) nor auto; the arena is "
                    "created at the first checkpoint\n", spec);
    }
    if (mode == MODE_OFF && helper_start && *helper_start && gpucr_helper_enabled())
        mode = MODE_HELPER;
    if (mode != MODE_OFF)
        start();
}

/* A forked child has an arena of its own, empty: it follows its own footprint
 * (auto) or starts its helper; a fixed size was the parent's. */
void gpucr_arena_ready_after_fork_child(void)
{
    ready = 0;
    helper_s = 0;
    starts = 0;
    if (running && (mode == MODE_AUTO || mode == MODE_HELPER))
        start();
    else {
        running = 0;
        if (mode == MODE_SIZE)
            mode = MODE_OFF;
    }
}
