/* ipc_legacy.c: legacy CUDA IPC on the allocations the shim backs with VMM. */
#ifndef GPUCR_IPC_LEGACY_H
#define GPUCR_IPC_LEGACY_H

#include <stdint.h>

void gpucr_ipc_forget(uint64_t vhandle); /* an exported allocation is freed */
/* A new descriptor for legacy IPC export ID (the caller closes it) and its
 * size; -1 when there is no such export. */
int gpucr_ipc_export_fd(uint64_t id, uint64_t *size);

#endif
