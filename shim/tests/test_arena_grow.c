/* Growing the arena ahead of checkpoints (arena_ready.c): a grown segment has
 * the size asked for, the shortfall is what would not fit, blobs that do not
 * fit in the order given are packed largest first before the arena grows, and
 * no segment is added while the arena is detached. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "arena.h"

#define MIB (1ul << 20)

int main(void)
{
    char dir[] = "/tmp/gpucr-arena-grow-test-XXXXXX";
    CHECK(mkdtemp(dir));
    CHECK(gpucr_arena_configure(dir) == 0);

    CHECK(gpucr_arena_grow(0) == -1 && errno == EINVAL);
    CHECK(gpucr_arena_grow(6 * MIB) == 0 && gpucr_arena_grow(12 * MIB) == 0 && gpucr_arena_grow(4 * MIB - 100) == 0);
    CHECK(gpucr_arena_segments() == 3 && gpucr_arena_capacity() == 22 * MIB); /* 2 MiB granules */
    PASS("arena grows by segments of the size asked");

    size_t fits[3] = {10 * MIB, 4 * MIB, 6 * MIB}; /* in this order: 10 -> 12, 4 -> 6, 6 -> nowhere */
    size_t too_big[2] = {20 * MIB, 4 * MIB};
    CHECK(gpucr_arena_shortfall(fits, 3) == 0);
    CHECK(gpucr_arena_shortfall(too_big, 2) == 20 * MIB); /* 20 fits in none of them, 4 does */
    CHECK(gpucr_arena_used() == 0); /* a dry run */
    void *out[3];
    CHECK(gpucr_arena_place(fits, 3, out, NULL, NULL) == 0);
    CHECK(gpucr_arena_segments() == 3); /* packed, not grown */
    for (int i = 0; i < 3; i++)
        memset(out[i], 'a' + i, fits[i]);
    for (int i = 0; i < 3; i++)
        CHECK(((char *)out[i])[0] == 'a' + i && ((char *)out[i])[fits[i] - 1] == 'a' + i);
    PASS("blobs packed largest first when the given order does not fit");

    gpucr_arena_reset();
    size_t unchanged[2] = {4 * MIB, 2 * MIB};
    void *first[2], *again[2];
    CHECK(gpucr_arena_place(unchanged, 2, first, NULL, NULL) == 0);
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(unchanged, 2, again, NULL, NULL) == 0);
    CHECK(first[0] == again[0] && first[1] == again[1]);
    PASS("an unchanged footprint keeps its places");

    CHECK(gpucr_arena_detach(NULL) == 0);
    CHECK(gpucr_arena_grow(2 * MIB) == -1 && errno == EBUSY && gpucr_arena_segments() == 3);
    CHECK(gpucr_arena_attach(NULL) == 0);
    CHECK(gpucr_arena_grow(2 * MIB) == 0 && gpucr_arena_segments() == 4);
    PASS("no growth while detached");

    /* a footprint growing 20 MiB at a time up to 80 GiB, followed: few segments,
     * never more than 1/8 + 256 MiB beyond what it needs */
    size_t cap = 0, segs = 0;
    for (size_t need = 20 * MIB; need <= (80ul << 30); need += 20 * MIB)
        if (need > cap) {
            size_t more = gpucr_arena_growth(need - cap, cap);
            CHECK(more >= need - cap && more <= need - cap + cap / 8 + 256 * MIB);
            cap += more;
            segs++;
        }
    CHECK(segs < GPUCR_ARENA_MAX_SEGS / 4 && cap >= (80ul << 30) && cap <= (80ul << 30) * 9 / 8 + 256 * MIB);
    PASS("a footprint growing in small steps makes few segments");

    gpucr_arena_destroy(NULL);
    rmdir(dir);
    return 0;
}
