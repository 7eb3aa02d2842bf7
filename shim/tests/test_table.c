/* The tracking table: hash map, phys/map bookkeeping, handle translation,
 * range queries, sets. */
#include "check.h"
#include "table.h"

static void count(struct gpucr_map *m, void *arg) { (void)m; ++*(int *)arg; }
static void del(struct gpucr_map *m, void *arg) { (void)arg; gpucr_map_del(m->va); }

int main(void)
{
    struct u64map m = {0};
    for (uint64_t k = 2; k < 20000; k++)
        CHECK(u64map_put(&m, k * 4096, k) == 0);
    CHECK(m.n == 19998);
    for (uint64_t k = 2; k < 20000; k += 2)
        CHECK(u64map_del(&m, k * 4096));
    uint64_t v;
    CHECK(!u64map_get(&m, 4 * 4096, &v));
    CHECK(u64map_get(&m, 5 * 4096, &v) && v == 5);
    for (uint64_t k = 2; k < 20000; k += 2) /* reuse deleted slots */
        CHECK(u64map_put(&m, k * 4096, k + 1) == 0);
    CHECK(u64map_get(&m, 4 * 4096, &v) && v == 5);
    CHECK(u64map_put(&m, 0, 1) == -1 && u64map_put(&m, 1, 1) == -1);
    u64map_clear(&m);
    PASS("u64map");

    gpucr_table_lock();
    struct gpucr_phys *a = gpucr_phys_add(0x1000, 2 << 20);
    CHECK(a && a->vhandle == 0x1000 && a->user_refs == 1);
    /* a new driver handle equal to one the application still holds gets a
     * synthetic application handle */
    struct gpucr_phys *b = gpucr_phys_add(0x1000, 4 << 20);
    CHECK(b && b->vhandle != 0x1000 && b->rhandle == 0x1000);
    CHECK(gpucr_phys_get(0x1000) == a && gpucr_phys_get(b->vhandle) == b);
    CHECK(gpucr_map_add(0x7f0000000000, 2 << 20, 0, a->vhandle));
    CHECK(gpucr_map_add(0x7f0000200000, 2 << 20, 0, b->vhandle));
    CHECK(gpucr_map_add(0x7f0000400000, 2 << 20, 2 << 20, b->vhandle));
    CHECK(a->nmaps == 1 && b->nmaps == 2 && gpucr_map_count() == 3);
    int n = 0;
    gpucr_map_foreach_in(0x7f0000200000, 4 << 20, count, &n);
    CHECK(n == 2);
    n = 0;
    gpucr_map_foreach_in(0x7f0000000000 + 4096, 1, count, &n); /* inside a mapping */
    CHECK(n == 1);
    gpucr_map_foreach_in(0x7f0000200000, 4 << 20, del, NULL);
    CHECK(b->nmaps == 0 && gpucr_map_count() == 1);
    gpucr_phys_del(b->vhandle);
    CHECK(gpucr_phys_count() == 1);
    PASS("phys/map");

    gpucr_set_put(SET_ASYNC, 0x5000, 100);
    gpucr_set_put(SET_ASYNC, 0x6000, 200);
    CHECK(gpucr_set_count(SET_ASYNC) == 2 && gpucr_set_sum(SET_ASYNC) == 300);
    CHECK(gpucr_set_take(SET_ASYNC, 0x5000, &v) && v == 100);
    CHECK(!gpucr_set_take(SET_ASYNC, 0x5000, &v));
    CHECK(gpucr_set_sum(SET_ASYNC) == 200);
    gpucr_table_unlock();
    PASS("sets");
    return 0;
}
