/* datapath.c: allocation contents to and from the host arena (p->host,
 * p->copy_va), by this process: direct to a pinned arena, or through the
 * staging ring. */
#ifndef GPUCR_DATAPATH_H
#define GPUCR_DATAPATH_H

#include <cuda.h>
#include <stddef.h>

struct gpucr_copy_stats;
struct gpucr_phys;

extern int gpucr_pin_arena; /* pinned arena, direct DMA (GPUCR_ARENA_PIN) */
void gpucr_datapath_init(void);
CUresult gpucr_copy(struct gpucr_phys *const *p, size_t n, int to_host, struct gpucr_copy_stats *st);
CUresult gpucr_staging_setup(void); /* needs a current context */
int gpucr_staging_drop(void);        /* no CUDA call */
double gpucr_staging_seconds(void);
size_t gpucr_staging_bytes(void);
CUresult gpucr_use_ctx(CUcontext ctx); /* makes ctx current, unless it is */
void gpucr_datapath_after_fork_child(void);

#endif
