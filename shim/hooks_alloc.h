/* hooks_alloc.c: plain allocations, backed by VMM. */
#ifndef GPUCR_HOOKS_ALLOC_H
#define GPUCR_HOOKS_ALLOC_H

extern int gpucr_vmm_backing; /* plain allocations are backed by VMM (GPUCR_VMM_BACKING) */

#endif
