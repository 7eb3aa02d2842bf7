/* copy_engine.c: how allocation contents move between the GPU and the arena. */
#ifndef GPUCR_COPY_ENGINE_H
#define GPUCR_COPY_ENGINE_H

#include <cuda.h>
#include <stddef.h>

#include "copy_stats.h"

struct gpucr_phys;
struct gpucr_engine;

struct gpucr_xfer { /* one out or in */
    struct gpucr_copy_stats cs;
    CUresult rc;                   /* the CUDA error of a failure, or CUDA_SUCCESS */
    double tc;                     /* in: when the copying began */
    const struct gpucr_engine *by; /* the engine that ran last (the one that moved the data) */
    const char *fallback;          /* why the chosen engine did not (the reply's helper_fallback), or NULL */
};
struct gpucr_engine {
    const char *name; /* "helper", "direct" or "bounce": the replies' data_path */
    /* every allocation's contents into p[i]->host; NULL, or why not */
    const char *(*out)(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x);
    /* every allocation re-made at its old addresses and filled from p[i]->host;
     * NULL, or why not (then undone: the data stays in the arena) */
    const char *(*in)(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x);
    /* or NULL: starts an in ahead, while the driver restores; no CUDA call; 0 once started */
    int (*prefill)(struct gpucr_phys *const *p, size_t n);
    const char *(*error)(void); /* or NULL: why its last use failed, in its own words */
};
void gpucr_engine_choose(void); /* at start-up, once */
const struct gpucr_engine *gpucr_engine(void);
/* out or in by the chosen engine, by the process's own where it fails: NULL, or why not */
const char *gpucr_engine_out(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x);
const char *gpucr_engine_in(struct gpucr_phys *const *p, size_t n, struct gpucr_xfer *x);

#endif
