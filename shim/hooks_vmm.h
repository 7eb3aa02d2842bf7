/* hooks_vmm.c: the application's own VMM calls. */
#ifndef GPUCR_HOOKS_VMM_H
#define GPUCR_HOOKS_VMM_H

extern unsigned long gpucr_multicast; /* multicast objects made (NVLS): never rebuilt, refused */

#endif
