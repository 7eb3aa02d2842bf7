/* gpucr_stream_copy: every length and alignment around the edges of its
 * aligned body arrives whole, and it never writes outside [dst, dst + n). */
#include <string.h>

#include "check.h"
#include "stream_copy.h"

#define GUARD 64

int main(void)
{
    enum { MAX = 3 * 4096 + 300 };
    static unsigned char src[MAX + 64], dst[MAX + 64 + 2 * GUARD], want[MAX + 64 + 2 * GUARD];
    unsigned seed = 1;
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (unsigned char)(rand_r(&seed) >> 5);
    size_t lens[] = {0, 1, 15, 16, 63, 64, 255, 256, 257, 319, 320, 1000, 4096, 4097, MAX};
    int cases = 0;
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
        for (size_t so = 0; so < 17; so += 3)
            for (size_t dof = 0; dof < 17; dof++) {
                size_t n = lens[l];
                memset(dst, 0xa5, sizeof dst);
                memset(want, 0xa5, sizeof want);
                memcpy(want + GUARD + dof, src + so, n);
                gpucr_stream_copy(dst + GUARD + dof, src + so, n);
                CHECK(memcmp(dst, want, sizeof dst) == 0);
                cases++;
            }
    CHECK(cases > 1000);
    PASS("stream_copy: every length and alignment arrives whole, nothing outside written");

    /* a large copy, as the data path makes them (several MiB) */
    size_t big = (8u << 20) + 123;
    unsigned char *a = malloc(big), *b = malloc(big + 7);
    CHECK(a && b);
    for (size_t i = 0; i < big; i++)
        a[i] = (unsigned char)(i * 131u + (i >> 12));
    gpucr_stream_copy(b + 7, a, big);
    CHECK(memcmp(b + 7, a, big) == 0);
    free(a);
    free(b);
    PASS("stream_copy: 8 MiB, unaligned destination");
    return 0;
}
