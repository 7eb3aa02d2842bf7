/* The copy engine's choice and its one fallback rule (copy_engine.c), against
 * a fake helper, a fake own copy and a fake driver: which engine moves the
 * data, what the reply is told, and that a failed in is undone before the
 * process's own engine does it over. Needs cuda.h (types only). */
#include <string.h>

#include "check.h"
#include "copy_engine.h"
#include "copy_stats.h"
#include "datapath.h"
#include "driver.h"
#include "helper.h"
#include "mapping.h"
#include "table.h"

struct gpucr_driver gpucr_drv;
int gpucr_pin_arena;

static int helper_on;
static CUresult helper_out_rc, helper_in_rc, helper_wait_rc, copy_rc;
static int helper_outs, helper_ins, waits, wait_keep, copies, copy_to_host, creates, releases, forgets;

int gpucr_helper_enabled(void) { return helper_on; }
const char *gpucr_helper_error(void) { return "cannot connect to /x (is gpucr-hpc copy-helper running?)"; }
int gpucr_helper_prefill(struct gpucr_phys *const *p, size_t n) { return (void)p, (void)n, 0; }
void gpucr_helper_forget(struct gpucr_phys *p) { (void)p, forgets++; }

static void add_step(struct gpucr_copy_stats *st)
{
    snprintf(st->steps[0].name, sizeof st->steps[0].name, "import_s");
    st->steps[0].s = 1;
    st->nsteps = 1;
}

CUresult gpucr_helper_out(struct gpucr_phys *const *p, size_t n, struct gpucr_copy_stats *st)
{
    (void)p, (void)n, helper_outs++;
    add_step(st);
    return helper_out_rc;
}

/* imports the first allocation, then fails where told to */
CUresult gpucr_helper_in(struct gpucr_phys *const *p, size_t n, struct gpucr_copy_stats *st)
{
    (void)n, helper_ins++;
    add_step(st);
    p[0]->dropped = PHYS_REFILLING;
    return helper_in_rc;
}

CUresult gpucr_helper_in_wait(struct gpucr_phys *const *p, size_t n, int keep, struct gpucr_copy_stats *st)
{
    (void)p, (void)n, (void)st, waits++;
    wait_keep = keep;
    return helper_wait_rc;
}

CUresult gpucr_copy(struct gpucr_phys *const *p, size_t n, int to_host, struct gpucr_copy_stats *st)
{
    (void)p, (void)n, copies++;
    copy_to_host = to_host;
    memset(st, 0, sizeof *st);
    st->bounce = !gpucr_pin_arena;
    return copy_rc;
}

CUresult gpucr_use_ctx(CUcontext ctx) { return (void)ctx, CUDA_SUCCESS; }
void gpucr_pick_sources(void) {}
CUresult gpucr_scratch_map(struct gpucr_phys *p) { return p->copy_va = 1, CUDA_SUCCESS; }
void gpucr_scratch_unmap(struct gpucr_phys *p) { p->copy_va = 0; }
void gpucr_remap_refilling(CUresult *rc) { (void)rc; }
void gpucr_unmap_refilling(void) {}

static CUresult fake_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    (void)size, (void)prop, (void)flags, creates++;
    *h = 7;
    return CUDA_SUCCESS;
}

static CUresult fake_release(CUmemGenericAllocationHandle h) { return (void)h, releases++, CUDA_SUCCESS; }

static struct gpucr_phys a, b;
static struct gpucr_phys *ps[] = {&a, &b};

/* a fresh start: both allocations checkpointed, every counter 0 */
static void reset(int helper, int pinned)
{
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.size = b.size = 4096;
    a.dropped = b.dropped = PHYS_DROPPED;
    helper_on = helper;
    gpucr_pin_arena = pinned;
    gpucr_engine_choose();
    helper_out_rc = helper_in_rc = helper_wait_rc = copy_rc = CUDA_SUCCESS;
    helper_outs = helper_ins = waits = wait_keep = copies = copy_to_host = creates = releases = forgets = 0;
}

int main(void)
{
    gpucr_drv.cuMemCreate = fake_create;
    gpucr_drv.cuMemRelease = fake_release;
    struct gpucr_xfer x;

    reset(0, 0);
    CHECK(strcmp(gpucr_engine()->name, "bounce") == 0 && !gpucr_engine()->prefill);
    reset(0, 1);
    CHECK(strcmp(gpucr_engine()->name, "direct") == 0);
    reset(1, 1);
    CHECK(strcmp(gpucr_engine()->name, "helper") == 0 && gpucr_engine()->prefill);
    PASS("engine: helper where configured, else direct where pinned, else bounce");

    reset(1, 0);
    CHECK(gpucr_engine_out(ps, 2, &x) == NULL);
    CHECK(strcmp(x.by->name, "helper") == 0 && !x.fallback && helper_outs == 1 && copies == 0 && x.cs.nsteps == 1);
    reset(1, 0);
    CHECK(gpucr_engine_in(ps, 2, &x) == NULL);
    CHECK(strcmp(x.by->name, "helper") == 0 && !x.fallback && waits == 1 && wait_keep == 1 && creates == 0);
    PASS("engine: the helper moves the data where it works");

    reset(1, 0);
    helper_out_rc = CUDA_ERROR_NOT_READY;
    CHECK(gpucr_engine_out(ps, 2, &x) == NULL);
    CHECK(strcmp(x.by->name, "bounce") == 0 && copies == 1 && copy_to_host == 1);
    CHECK(x.fallback && strcmp(x.fallback, gpucr_helper_error()) == 0 && x.cs.nsteps == 0 && x.rc == CUDA_SUCCESS);
    PASS("engine: a failed helper out falls back to the process's own, and says why");

    reset(1, 1);
    helper_in_rc = CUDA_ERROR_NOT_READY; /* before the wait: no in_done from here */
    CHECK(gpucr_engine_in(ps, 2, &x) == NULL);
    CHECK(strcmp(x.by->name, "direct") == 0 && x.fallback && waits == 0);
    CHECK(releases == 1 && creates == 2 && copies == 1 && copy_to_host == 0 && x.cs.nsteps == 0);
    CHECK(a.dropped == PHYS_REFILLING && b.dropped == PHYS_REFILLING); /* re-made by the own engine */
    reset(1, 0);
    helper_wait_rc = CUDA_ERROR_NOT_READY;
    a.flags = PHYS_HELPER_HELD;
    CHECK(gpucr_engine_in(ps, 2, &x) == NULL);
    CHECK(strcmp(x.by->name, "bounce") == 0 && x.fallback && waits == 1 && wait_keep == 1);
    CHECK(releases == 1 && forgets == 1 && creates == 2 && copies == 1);
    PASS("engine: a failed helper in is undone, then the process's own engine does it");

    reset(0, 0);
    copy_rc = CUDA_ERROR_ILLEGAL_ADDRESS;
    CHECK(gpucr_engine_out(ps, 2, &x) != NULL);
    CHECK(x.rc == CUDA_ERROR_ILLEGAL_ADDRESS && !x.fallback && copies == 1);
    reset(1, 0);
    helper_in_rc = CUDA_ERROR_NOT_READY;
    copy_rc = CUDA_ERROR_ILLEGAL_ADDRESS;
    CHECK(gpucr_engine_in(ps, 2, &x) != NULL);
    CHECK(x.rc == CUDA_ERROR_ILLEGAL_ADDRESS && copies == 1 && a.dropped == PHYS_DROPPED && b.dropped == PHYS_DROPPED);
    PASS("engine: the process's own engine has no fallback; a failed in is undone");

    reset(1, 0);
    CHECK(gpucr_engine_out(ps, 0, &x) == NULL && gpucr_engine_in(ps, 0, &x) == NULL);
    CHECK(strcmp(x.by->name, "bounce") == 0 && !x.fallback && helper_outs == 0 && helper_ins == 0 && copies == 2);
    PASS("engine: nothing to move is the process's own, with no fallback told");
    return 0;
}
