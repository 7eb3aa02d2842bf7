/* Finalizing a process's communicators for a teardown, within a deadline.
 *
 * NCCL's finalize waits for the peers (its bootstrap talks to them); a peer that
 * never finalizes (dead, unreachable, or not asked) would hold the control
 * thread forever, and with it every later request to this process. So the
 * finalizes run in a thread of their own while the caller waits; at the
 * deadline the caller aborts every communicator, which is how NCCL lets a
 * blocked finalize go (PyTorch's watchdog does the same). */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"
#include "nccl_api.h"
#include "nccl_finalize.h"

struct finalizing {
    struct gpucr_nccl_finalize_fns fns;
    ncclComm_t *comms;
    size_t n, next; /* comms[next..] not started yet */
    int aborted, done;
    ncclResult_t worst;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* A non-blocking communicator's finalize goes on in the background. */
static ncclResult_t settle(const struct gpucr_nccl_finalize_fns *f, ncclComm_t c, ncclResult_t r)
{
    while (r == GPUCR_NCCL_IN_PROGRESS && f->async_error) {
        ncclResult_t e = GPUCR_NCCL_SUCCESS;
        if (f->async_error(c, &e) != GPUCR_NCCL_SUCCESS)
            break;
        r = e;
        if (r == GPUCR_NCCL_IN_PROGRESS)
            usleep(1000);
    }
    return r;
}

static void *finalize_all(void *arg)
{
    struct finalizing *f = arg;
    pthread_mutex_lock(&f->mu);
    while (!f->aborted && f->next < f->n) {
        ncclComm_t c = f->comms[f->next++];
        pthread_mutex_unlock(&f->mu);
        ncclResult_t r = settle(&f->fns, c, f->fns.finalize(c));
        pthread_mutex_lock(&f->mu);
        if (r != GPUCR_NCCL_SUCCESS)
            f->worst = r;
    }
    f->done = 1;
    pthread_cond_broadcast(&f->cv);
    int last = f->aborted; /* the caller gave up on us: we free what we share */
    pthread_mutex_unlock(&f->mu);
    if (last) {
        free(f->comms);
        free(f);
    }
    return NULL;
}

int gpucr_nccl_finalize_all(const struct gpucr_nccl_finalize_fns *fns, ncclComm_t *comms, size_t n, long timeout_ms,
                            ncclResult_t *worst)
{
    struct finalizing *f = calloc(1, sizeof *f);
    ncclComm_t *copy = calloc(n ? n : 1, sizeof *copy);
    if (!f || !copy) {
        free(f);
        free(copy);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        copy[i] = comms[i];
    *f = (struct finalizing){.fns = *fns, .comms = copy, .n = n, .worst = GPUCR_NCCL_SUCCESS};
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    pthread_t th;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* it takes no signal of the program */
    int started = pthread_create(&th, NULL, finalize_all, f) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!started) {
        finalize_all(f); /* no thread to spare: here, without a deadline */
    } else {
        struct timespec dl = gpucr_deadline_in(timeout_ms);
        pthread_mutex_lock(&f->mu);
        while (!f->done && pthread_cond_timedwait(&f->cv, &f->mu, &dl) == 0)
            ;
        if (!f->done) {
            /* Every communicator aborted, the one whose finalize blocks too; the
             * thread then stops at once and frees what it shares with us. */
            f->aborted = 1;
            pthread_mutex_unlock(&f->mu);
            for (size_t i = 0; i < n; i++)
                fns->abort(comms[i]);
            pthread_detach(th);
            return -1;
        }
        pthread_mutex_unlock(&f->mu);
        pthread_join(th, NULL);
    }
    *worst = f->worst;
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f->comms);
    free(f);
    return 0;
}
