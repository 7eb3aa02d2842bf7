/* What the shim tracks: physical allocations, their mappings, and small sets
 * (managed memory, stream-ordered allocations, IPC use, contexts). One lock. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"

/* ---- u64map: open addressing, linear probing -------------------------- */

static size_t slot(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

static int grow(struct u64map *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 64;
    while (m->n * 2 >= ncap)
        ncap *= 2;
    uint64_t *k = calloc(ncap, sizeof *k), *v = calloc(ncap, sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] < 2)
            continue;
        size_t s = slot(m->keys[i], ncap);
        while (k[s])
            s = (s + 1) & (ncap - 1);
        k[s] = m->keys[i];
        v[s] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = k;
    m->vals = v;
    m->cap = ncap;
    m->used = m->n;
    return 0;
}

static long find(const struct u64map *m, uint64_t key)
{
    if (!m->cap)
        return -1;
    size_t s = slot(key, m->cap);
    for (size_t probe = 0; probe < m->cap; probe++) {
        if (m->keys[s] == key)
            return (long)s;
        if (m->keys[s] == 0)
            return -1;
        s = (s + 1) & (m->cap - 1);
    }
    return -1;
}

int u64map_put(struct u64map *m, uint64_t key, uint64_t val)
{
    if (key < 2)
        return -1;
    long i = find(m, key);
    if (i >= 0) {
        m->vals[i] = val;
        return 0;
    }
    if ((m->used + 1) * 10 >= m->cap * 7 && grow(m) < 0)
        return -1;
    size_t s = slot(key, m->cap);
    while (m->keys[s] >= 2)
        s = (s + 1) & (m->cap - 1);
    if (m->keys[s] == 0)
        m->used++;
    m->keys[s] = key;
    m->vals[s] = val;
    m->n++;
    return 0;
}

int u64map_get(const struct u64map *m, uint64_t key, uint64_t *val)
{
    long i = key >= 2 ? find(m, key) : -1;
    if (i < 0)
        return 0;
    if (val)
        *val = m->vals[i];
    return 1;
}

int u64map_del(struct u64map *m, uint64_t key)
{
    long i = key >= 2 ? find(m, key) : -1;
    if (i < 0)
        return 0;
    m->keys[i] = 1;
    m->n--;
    return 1;
}

void u64map_clear(struct u64map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- the tracked GPU memory ------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct u64map phys;  /* vhandle -> struct gpucr_phys * */
static struct u64map maps;  /* va -> struct gpucr_map * */
static struct u64map sets[SET_COUNT];
static uint64_t next_synthetic = 0x6770000000000000ULL; /* "gp" */
static size_t phys_bytes; /* the sizes of the tracked allocations, summed */

void gpucr_table_lock(void) { pthread_mutex_lock(&lock); }
void gpucr_table_unlock(void) { pthread_mutex_unlock(&lock); }

struct gpucr_phys *gpucr_phys_add(uint64_t rhandle, size_t size)
{
    struct gpucr_phys *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    uint64_t vh = rhandle;
    /* A fresh driver handle may equal a handle the application still holds
     * from before a restore: then give the application a synthetic one. */
    while (vh < 2 || u64map_get(&phys, vh, NULL))
        vh = next_synthetic++;
    p->vhandle = vh;
    p->rhandle = rhandle;
    p->size = size;
    p->user_refs = 1;
    if (u64map_put(&phys, vh, (uint64_t)(uintptr_t)p) < 0) {
        free(p);
        return NULL;
    }
    phys_bytes += size;
    return p;
}

struct gpucr_phys *gpucr_phys_get(uint64_t vhandle)
{
    uint64_t v;
    return u64map_get(&phys, vhandle, &v) ? (struct gpucr_phys *)(uintptr_t)v : NULL;
}

void (*gpucr_phys_on_forget)(struct gpucr_phys *);

void gpucr_phys_del(uint64_t vhandle)
{
    struct gpucr_phys *p = gpucr_phys_get(vhandle);
    if (!p)
        return;
    if ((p->flags & PHYS_HELPER_HELD) && gpucr_phys_on_forget)
        gpucr_phys_on_forget(p);
    u64map_del(&phys, vhandle);
    phys_bytes -= p->size;
    free(p);
}

struct gpucr_map *gpucr_map_add(uint64_t va, size_t size, size_t offset, uint64_t vhandle)
{
    struct gpucr_map *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->va = va;
    m->size = size;
    m->offset = offset;
    m->vhandle = vhandle;
    if (u64map_put(&maps, va, (uint64_t)(uintptr_t)m) < 0) {
        free(m);
        return NULL;
    }
    struct gpucr_phys *p = gpucr_phys_get(vhandle);
    if (p)
        p->nmaps++;
    return m;
}

struct gpucr_map *gpucr_map_get(uint64_t va)
{
    uint64_t v;
    return u64map_get(&maps, va, &v) ? (struct gpucr_map *)(uintptr_t)v : NULL;
}

void gpucr_map_del(uint64_t va)
{
    struct gpucr_map *m = gpucr_map_get(va);
    if (!m)
        return;
    struct gpucr_phys *p = gpucr_phys_get(m->vhandle);
    if (p)
        p->nmaps--;
    u64map_del(&maps, va);
    free(m);
}

void gpucr_map_foreach_in(uint64_t va, size_t size, void (*fn)(struct gpucr_map *, void *), void *arg)
{
    struct gpucr_map *exact = gpucr_map_get(va);
    if (exact && exact->size >= size) { /* the common case: one whole mapping */
        fn(exact, arg);
        return;
    }
    U64MAP_FOREACH(&maps, i) {
        struct gpucr_map *m = (struct gpucr_map *)(uintptr_t)maps.vals[i];
        if (m->va < va + size && va < m->va + m->size)
            fn(m, arg); /* deleting marks the slot; iteration stays valid */
    }
}

void gpucr_phys_foreach(void (*fn)(struct gpucr_phys *, void *), void *arg)
{
    U64MAP_FOREACH(&phys, i) fn((struct gpucr_phys *)(uintptr_t)phys.vals[i], arg);
}

void gpucr_map_foreach(void (*fn)(struct gpucr_map *, void *), void *arg)
{
    U64MAP_FOREACH(&maps, i) fn((struct gpucr_map *)(uintptr_t)maps.vals[i], arg);
}

size_t gpucr_phys_count(void) { return phys.n; }
size_t gpucr_phys_bytes(void) { return __atomic_load_n(&phys_bytes, __ATOMIC_RELAXED); }
void gpucr_phys_count_shared(size_t *exported, size_t *imported)
{
    *exported = *imported = 0;
    U64MAP_FOREACH(&phys, i) {
        const struct gpucr_phys *p = (const struct gpucr_phys *)(uintptr_t)phys.vals[i];
        *exported += (p->flags & PHYS_EXPORTED) != 0;
        *imported += (p->flags & PHYS_IMPORTED) != 0;
    }
}

size_t gpucr_map_count(void) { return maps.n; }

void gpucr_set_put(int set, uint64_t key, uint64_t val) { u64map_put(&sets[set], key, val); }

int gpucr_set_take(int set, uint64_t key, uint64_t *val)
{
    if (!u64map_get(&sets[set], key, val))
        return 0;
    u64map_del(&sets[set], key);
    return 1;
}

size_t gpucr_set_count(int set) { return sets[set].n; }

uint64_t gpucr_set_sum(int set)
{
    uint64_t sum = 0;
    U64MAP_FOREACH(&sets[set], i) sum += sets[set].vals[i];
    return sum;
}

const struct u64map *gpucr_set_map(int set) { return &sets[set]; }

/* A forked child has no GPU state of its own: the parent's allocations are not
 * usable there, so the child starts with an empty table. */
void gpucr_table_after_fork_child(void)
{
    pthread_mutex_init(&lock, NULL);
    U64MAP_FOREACH(&phys, i) free((void *)(uintptr_t)phys.vals[i]);
    U64MAP_FOREACH(&maps, i) free((void *)(uintptr_t)maps.vals[i]);
    u64map_clear(&phys);
    u64map_clear(&maps);
    phys_bytes = 0;
    for (int s = 0; s < SET_COUNT; s++)
        u64map_clear(&sets[s]);
}
