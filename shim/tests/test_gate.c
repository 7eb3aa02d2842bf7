/* The API gate: open pass-through, close drains in-flight calls, new calls wait
 * while closed, a close that cannot drain times out and reopens, nesting. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "check.h"
#include "gate.h"

static atomic_int phase, entered, finished;

static void *worker_in_call(void *arg)
{
    (void)arg;
    gpucr_gate_enter();
    atomic_store(&entered, 1);
    while (atomic_load(&phase) == 0)
        usleep(1000);
    gpucr_gate_exit();
    return NULL;
}

static void *worker_new_call(void *arg)
{
    (void)arg;
    gpucr_gate_enter();
    atomic_store(&finished, 1);
    gpucr_gate_exit();
    return NULL;
}

int main(void)
{
    /* open: nothing waits, nothing stays in flight */
    gpucr_gate_enter();
    CHECK(gpucr_gate_inflight() == 1);
    gpucr_gate_enter(); /* nested on one thread: counted once */
    CHECK(gpucr_gate_inflight() == 1);
    gpucr_gate_exit();
    gpucr_gate_exit();
    CHECK(gpucr_gate_inflight() == 0);
    CHECK(gpucr_gate_close(100) == 0);
    CHECK(gpucr_gate_is_closed());
    gpucr_gate_open();
    PASS("gate open/nesting");

    /* a call in flight that never ends: close times out and reopens */
    pthread_t t;
    pthread_create(&t, NULL, worker_in_call, NULL);
    while (!atomic_load(&entered))
        usleep(1000);
    CHECK(gpucr_gate_close(50) == -1);
    CHECK(!gpucr_gate_is_closed());
    PASS("gate close timeout reopens");

    /* the call finishes while close waits: close succeeds */
    atomic_store(&phase, 1);
    CHECK(gpucr_gate_close(5000) == 0);
    pthread_join(t, NULL);
    CHECK(gpucr_gate_inflight() == 0);

    /* while closed, a new call waits until the gate opens */
    uint64_t waits0 = gpucr_gate_waits();
    pthread_create(&t, NULL, worker_new_call, NULL);
    while (gpucr_gate_waits() == waits0)
        usleep(1000);
    usleep(20000);
    CHECK(atomic_load(&finished) == 0);
    gpucr_gate_open();
    pthread_join(t, NULL);
    CHECK(atomic_load(&finished) == 1);
    PASS("gate blocks new calls while closed");
    return 0;
}
