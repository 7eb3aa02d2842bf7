/* The copy engines: how allocation contents move between the GPU and the host
 * arena at a checkpoint (out) and a restore (in).
 *
 * helper: the copy helper process moves the data (helper.c); at a restore it
 *   makes the memory and fills it while this process imports and maps it.
 * direct, bounce: this process moves the data itself (datapath.c), straight
 *   to and from a pinned arena (GPUCR_ARENA_PIN) or through the staging ring.
 *
 * One engine is chosen at start-up: the helper where one is configured, else
 * the process's own (direct or bounce, as the arena is pinned or not). One
 * fallback rule: when an engine that is not the process's own fails at any
 * step, the process's own engine does that operation over, and the reply says
 * why. That loses nothing: until an out succeeds the data is still on the GPU,
 * and an in leaves it in the arena. The process's own engine has no fallback:
 * its failure fails the operation. */
#include <string.h>

#include "copy_engine.h"
#include "copy_stats.h"
#include "datapath.h"
#include "driver.h"
#include "helper.h"
#include "log.h"
#include "mapping.h"
#include "table.h"

/* Undoes an in: what it mapped and created goes, the data stays in the arena
 * for the next attempt. */
static void undo_in(struct gpucr_phys *const *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        gpucr_scratch_unmap(p[i]);
    gpucr_unmap_refilling();
    for (size_t i = 0; i < n; i++)
        if (p[i]->dropped == PHYS_REFILLING) {
            gpucr_drv.cuMemRelease(p[i]->rhandle);
            p[i]->dropped = PHYS_DROPPED;
            if (p[i]->flags & PHYS_HELPER_HELD)
                gpucr_helper_forget(p[i]); /* the helper's handle of it too */
        }
}

/* ---- this process: direct or bounce ---------------------------------------- */

static const char *own_out(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x)
{
    for (size_t i = 0; i < n; i++)
        if (!p[i]->copy_va && (x->rc = gpucr_scratch_map(p[i])) != CUDA_SUCCESS)
            return "mapping an allocation for copying failed";
    if ((x->rc = gpucr_copy(p, n, 1, &x->cs)) != CUDA_SUCCESS)
        return "copying GPU memory to the host failed";
    return NULL;
}

static const char *own_in(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x)
{
    const char *fail = NULL;
    x->tc = gpucr_now();
    for (size_t i = 0; i < n && !fail; i++) {
        if (p[i]->dropped == PHYS_RESIDENT)
            continue;
        CUmemGenericAllocationHandle h;
        if ((x->rc = gpucr_use_ctx(p[i]->ctx)) != CUDA_SUCCESS ||
            (x->rc = gpucr_drv.cuMemCreate(&h, p[i]->size, (const CUmemAllocationProp *)p[i]->prop,
                                           p[i]->create_flags)) != CUDA_SUCCESS)
            fail = x->rc == CUDA_ERROR_OUT_OF_MEMORY ? "not enough free GPU memory to restore"
                                                     : "re-creating GPU memory failed";
        else {
            p[i]->rhandle = h;
            p[i]->dropped = PHYS_REFILLING; /* re-created, not yet filled */
        }
    }
    if (!fail) {
        gpucr_remap_refilling(&x->rc);
        if (x->rc != CUDA_SUCCESS)
            fail = "mapping GPU memory at its old address failed";
    }
    if (!fail) {
        for (size_t i = 0; i < n; i++)
            p[i]->copy_va = 0;
        gpucr_pick_sources();
        for (size_t i = 0; i < n && !fail; i++)
            if (!p[i]->copy_va && (x->rc = gpucr_scratch_map(p[i])) != CUDA_SUCCESS)
                fail = "mapping an allocation for copying failed";
        x->tc = gpucr_now();
        if (!fail && (x->rc = gpucr_copy(p, n, 0, &x->cs)) != CUDA_SUCCESS)
            fail = "copying data back to the GPU failed";
    }
    if (fail)
        undo_in(p, n);
    return fail;
}

/* ---- the copy helper ------------------------------------------------------- */

static const char *helper_out(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x)
{
    return gpucr_helper_out(p, n, &x->cs) == CUDA_SUCCESS ? NULL : "the copy helper did not copy the memory out";
}

/* The helper's copies run while this process imports and maps the memory. */
static const char *helper_in(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x)
{
    const char *fail = NULL;
    if (gpucr_use_ctx(p[0]->ctx) != CUDA_SUCCESS)
        return "no CUDA context to import the copy helper's memory into";
    x->tc = gpucr_now();
    if (gpucr_helper_in(p, n, &x->cs) != CUDA_SUCCESS) {
        undo_in(p, n); /* what it imported before it failed */
        return "the copy helper did not make the memory";
    }
    gpucr_remap_refilling(&x->rc);
    if (x->rc != CUDA_SUCCESS)
        fail = "mapping GPU memory at its old address failed";
    /* always: it ends the exchange; keep only what is mapped */
    if (gpucr_helper_in_wait(p, n, !fail, &x->cs) != CUDA_SUCCESS && !fail)
        fail = "the copy helper's copies failed";
    if (fail)
        undo_in(p, n);
    return fail;
}

static const struct gpucr_engine helper = {"helper", helper_out, helper_in, gpucr_helper_prefill, gpucr_helper_error};
static const struct gpucr_engine direct = {"direct", own_out, own_in, NULL, NULL};
static const struct gpucr_engine bounce = {"bounce", own_out, own_in, NULL, NULL};

/* ---- the choice and the fallback rule -------------------------------------- */

static const struct gpucr_engine *chosen, *own;

/* After gpucr_datapath_init() and gpucr_helper_enabled(): both settle what they
 * read at start-up and keep it, so the choice holds for the process's life. A
 * helper that cannot be reached is found out per operation, and falls back. */
void gpucr_engine_choose(void)
{
    own = gpucr_pin_arena ? &direct : &bounce;
    chosen = gpucr_helper_enabled() ? &helper : own;
}

const struct gpucr_engine *gpucr_engine(void)
{
    if (!chosen) /* the shim was loaded disabled: nothing chose yet */
        gpucr_engine_choose();
    return chosen;
}

/* in 0: out, 1: in. With nothing to move the process's own engine runs (it
 * reports its name and moves nothing), and no fallback is told. */
static const char *run(int in, struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x)
{
    const struct gpucr_engine *e = gpucr_engine();
    if (!n)
        e = own;
    x->fallback = NULL;
    for (;;) {
        x->cs = (struct gpucr_copy_stats){0};
        x->rc = CUDA_SUCCESS;
        x->by = e;
        const char *fail = in ? e->in(p, n, x) : e->out(p, n, x);
        if (!fail || e == own)
            return fail;
        x->fallback = e->error ? e->error() : fail; /* the one fallback rule */
        e = own;
    }
}

const char *gpucr_engine_out(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x) { return run(0, p, n, x); }
const char *gpucr_engine_in(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x) { return run(1, p, n, x); }
