/* hooks_async.c: stream-ordered allocation and memory pools. */
#ifndef GPUCR_HOOKS_ASYNC_H
#define GPUCR_HOOKS_ASYNC_H

/* GPU memory shared with another process in a way the shim cannot track (pools
 * exported or imported; hooks_vmm.c counts untracked handles too): a checkpoint
 * refuses from then on. Under the table lock. */
extern unsigned long gpucr_ipc_sticky;

#endif
