/* mapping.c: where the copies reach an allocation (p->copy_va), and the old
 * addresses mapped again at a restore; callers hold the table lock. */
#ifndef GPUCR_MAPPING_H
#define GPUCR_MAPPING_H

#include <cuda.h>

struct gpucr_phys;

void gpucr_pick_sources(void); /* copy_va: an application mapping of the whole allocation */
CUresult gpucr_scratch_map(struct gpucr_phys *p); /* copy_va: one of our own */
void gpucr_scratch_unmap(struct gpucr_phys *p);
void gpucr_remap_refilling(CUresult *rc); /* PHYS_REFILLING memory at its old addresses */
void gpucr_unmap_refilling(void);

#endif
