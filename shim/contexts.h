/* contexts.c: the process's CUDA contexts, as the hooks see them used. */
#ifndef GPUCR_CONTEXTS_H
#define GPUCR_CONTEXTS_H

#include <cuda.h>

void gpucr_note_context(void);   /* remember the calling thread's current context */
CUcontext gpucr_any_context(void); /* one of the process's contexts, or NULL */

#endif
