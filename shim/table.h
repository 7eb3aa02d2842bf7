/* table.c: what the shim tracks of the process's GPU memory, under one lock. */
#ifndef GPUCR_TABLE_H
#define GPUCR_TABLE_H

#include <stddef.h>
#include <stdint.h>

/* ---- u64 -> u64 hash map ----------------------------------------------- */
struct u64map {
    uint64_t *keys; /* 0 = empty, 1 = deleted */
    uint64_t *vals;
    size_t cap, n, used;
};
int u64map_put(struct u64map *m, uint64_t key, uint64_t val); /* key >= 2 */
int u64map_get(const struct u64map *m, uint64_t key, uint64_t *val);
int u64map_del(struct u64map *m, uint64_t key);
void u64map_clear(struct u64map *m);
#define U64MAP_FOREACH(m, i) \
    for (size_t i = 0; i < (m)->cap; i++) if ((m)->keys[i] >= 2)

/* ---- tracked GPU memory -------------------------------------------------
 * A phys is one physical allocation (a VMM handle); a map is one mapping of a
 * phys at a virtual address. Handles the application sees ("vhandle") stay the
 * same across checkpoints; the real driver handle ("rhandle") changes. */
#define GPUCR_PROP_BYTES 128
#define GPUCR_ACCESS_BYTES 16
#define GPUCR_MAX_ACCESS 8

enum {
    PHYS_SHIM_OWNED = 1, /* a plain allocation the shim backs with VMM */
    PHYS_EXPORTED = 2,   /* exported to a shareable handle (IPC) */
    PHYS_IMPORTED = 4,   /* imported from a shareable handle (IPC) */
    PHYS_HELPER_HELD = 8, /* made by the copy helper, which keeps a handle to it (helper.c) */
};

/* Where an allocation's memory is (gpucr_phys.dropped); checkpoint.c and its copy
 * engine (copy_engine.c) move it
 * RESIDENT -> DROPPED (checkpoint) -> REFILLING -> RESIDENT (restore). */
enum gpucr_phys_state {
    PHYS_RESIDENT = 0,  /* its physical memory is on the GPU */
    PHYS_DROPPED = 1,   /* released by a checkpoint; the data is in the arena (host) */
    PHYS_REFILLING = 2, /* re-created (or imported from the copy helper), not yet filled */
};

struct gpucr_phys {
    uint64_t vhandle, rhandle;
    size_t size;
    int device;
    void *ctx;
    unsigned flags;
    int user_refs; /* outstanding cuMemRelease calls the app owes */
    int nmaps;
    unsigned char prop[GPUCR_PROP_BYTES];
    uint64_t create_flags;
    uint64_t copy_va;  /* where the data path reads/writes it */
    int scratch;       /* copy_va is a temporary mapping */
    void *host;  /* arena copy while checkpointed */
    enum gpucr_phys_state dropped; /* physical memory released by a checkpoint? */
};

struct gpucr_map {
    uint64_t va;
    size_t size, offset;
    uint64_t vhandle;
    int naccess;
    unsigned char access[GPUCR_MAX_ACCESS][GPUCR_ACCESS_BYTES];
};

void gpucr_table_lock(void);
void gpucr_table_unlock(void);
struct gpucr_phys *gpucr_phys_add(uint64_t rhandle, size_t size); /* picks vhandle */
struct gpucr_phys *gpucr_phys_get(uint64_t vhandle);
void gpucr_phys_del(uint64_t vhandle);
/* Called by gpucr_phys_del for a PHYS_HELPER_HELD allocation (table lock held);
 * set by the copy helper (helper.c), which the table does not call otherwise. */
extern void (*gpucr_phys_on_forget)(struct gpucr_phys *);
struct gpucr_map *gpucr_map_add(uint64_t va, size_t size, size_t offset, uint64_t vhandle);
struct gpucr_map *gpucr_map_get(uint64_t va);
void gpucr_map_del(uint64_t va);
/* Calls fn for each map overlapping [va, va+size); fn may delete that map. */
void gpucr_map_foreach_in(uint64_t va, size_t size, void (*fn)(struct gpucr_map *, void *), void *arg);
void gpucr_phys_foreach(void (*fn)(struct gpucr_phys *, void *), void *arg);
void gpucr_map_foreach(void (*fn)(struct gpucr_map *, void *), void *arg);
size_t gpucr_phys_count(void);
size_t gpucr_phys_bytes(void); /* their sizes summed; read without the lock */
/* Allocations exported to other processes (PHYS_EXPORTED), and imported from them. */
void gpucr_phys_count_shared(size_t *exported, size_t *imported);
size_t gpucr_map_count(void);
/* Simple tracked sets: pointer -> size. */
enum { SET_MANAGED, SET_ASYNC, SET_IPC_LEGACY, SET_IPC_OPENED, SET_POOLS, SET_CTX, SET_COUNT };
void gpucr_set_put(int set, uint64_t key, uint64_t val);
int gpucr_set_take(int set, uint64_t key, uint64_t *val); /* 1 if it was there */
size_t gpucr_set_count(int set);
uint64_t gpucr_set_sum(int set);
const struct u64map *gpucr_set_map(int set); /* caller holds the table lock */
void gpucr_table_after_fork_child(void);

#endif
