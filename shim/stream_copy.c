/* A memcpy whose stores bypass the caches (non-temporal), for the bounce data
 * path: between the staging ring and the arena, every byte crosses host memory
 * three times (DMA, load, store) while the copy engines run, and host memory
 * bandwidth is what limits the rate. A plain store first reads the line it
 * writes (read-for-ownership) and leaves it in the cache, where nothing will
 * read it soon; a streaming store does neither. glibc's memcpy streams only
 * above a threshold it derives from the cache size, which a VM may report
 * oddly, so the choice is made here and measured (gpu-checks/gpu-datapath tune).
 * SSE2 only: it is part of x86-64, and the copy is bound by memory, not by
 * instruction width. Elsewhere this is plain memcpy. */
#include <stdint.h>
#include <string.h>

#include "stream_copy.h"

#if defined(__x86_64__)
#include <emmintrin.h>

void gpucr_stream_copy(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (n < 256 || head >= n) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head); /* the destination is 16-byte aligned from here */
    d += head;
    s += head;
    n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        _mm_prefetch(s + i + 1024, _MM_HINT_NTA);
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence(); /* streaming stores are weakly ordered: visible before we say done */
    memcpy(d + body, s + body, n - body);
}
#else
void gpucr_stream_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif
