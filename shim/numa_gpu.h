/* numa_gpu.c: which GPU the calling thread uses, for numa.c. */
#ifndef GPUCR_NUMA_GPU_H
#define GPUCR_NUMA_GPU_H

#include <stddef.h>

int gpucr_gpu_busid(char *busid, size_t len); /* gpucr_numa_gpu_busid's answer */

#endif
