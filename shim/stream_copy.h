/* stream_copy.c: memcpy with non-temporal stores. */
#ifndef GPUCR_STREAM_COPY_H
#define GPUCR_STREAM_COPY_H

#include <stddef.h>

void gpucr_stream_copy(void *dst, const void *src, size_t n);

#endif
