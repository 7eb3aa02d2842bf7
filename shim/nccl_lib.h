/* nccl_lib.c: which libnccl the hooks call. */
#ifndef GPUCR_NCCL_LIB_H
#define GPUCR_NCCL_LIB_H

#include <stddef.h>

/* The real NCCL entry point named pname ("pncclAllReduce"), looked up once in
 * the libnccl the process loaded, into *cache. NULL when there is none. */
void *gpucr_nccl_real(void **cache, const char *pname);
/* A fresh copy of libnccl for every hook (after a restore on another node; only
 * with every communicator torn down): 0, or -1 and why. */
int gpucr_nccl_reload(char *why, size_t len);

#endif
