/* The API gate: work submission waits here while a checkpoint holds it closed.
 *
 * Fast path (gate open): one atomic increment, one load, one decrement.
 * gpucr_gate_close() sets `closed` and waits until `inflight` drops to zero;
 * a caller that sees `closed` after announcing itself backs out and waits. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "gate.h"
#include "log.h"

static atomic_long inflight;
static atomic_int closed;
static atomic_ulong waits;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static __thread int depth; /* nesting on this thread */

static void wake_all(void)
{
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

void gpucr_gate_enter(void)
{
    if (depth++ > 0)
        return;
    for (;;) {
        atomic_fetch_add(&inflight, 1);
        if (!atomic_load(&closed))
            return;
        if (atomic_fetch_sub(&inflight, 1) == 1)
            wake_all();
        atomic_fetch_add(&waits, 1);
        pthread_mutex_lock(&mu);
        while (atomic_load(&closed))
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
    }
}

void gpucr_gate_exit(void)
{
    if (--depth > 0)
        return;
    if (atomic_fetch_sub(&inflight, 1) == 1 && atomic_load(&closed))
        wake_all();
}

int gpucr_gate_close(long timeout_ms)
{
    struct timespec deadline = gpucr_deadline_in(timeout_ms < 0 ? 0 : timeout_ms);
    pthread_mutex_lock(&mu);
    atomic_store(&closed, 1);
    while (atomic_load(&inflight) > 0) {
        int rc = pthread_cond_timedwait(&cv, &mu, &deadline);
        if (rc == ETIMEDOUT && atomic_load(&inflight) > 0) {
            atomic_store(&closed, 0);
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&mu);
            return -1;
        }
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

void gpucr_gate_open(void)
{
    pthread_mutex_lock(&mu);
    atomic_store(&closed, 0);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

int gpucr_gate_is_closed(void) { return atomic_load(&closed); }
long gpucr_gate_inflight(void) { return atomic_load(&inflight); }
uint64_t gpucr_gate_waits(void) { return atomic_load(&waits); }

/* Only the forking thread survives in the child: no call is in flight there,
 * and the locks may have been held by threads that no longer exist. */
void gpucr_gate_after_fork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&cv, NULL);
    atomic_store(&inflight, depth > 0 ? 1 : 0);
    atomic_store(&closed, 0);
}
