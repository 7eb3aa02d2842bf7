/* arena.c: the pinned host arena, where a process's GPU data goes while its GPU
 * memory is yielded. */
#ifndef GPUCR_ARENA_H
#define GPUCR_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef int (*gpucr_register_fn)(void *base, size_t size);
/* Segments an arena may have: one per growth (gpucr_arena_growth). */
#define GPUCR_ARENA_MAX_SEGS 256
int gpucr_arena_configure(const char *dir); /* NULL: /dev/shm; 0 ok, -1 errno */
const char *gpucr_arena_dir(void);
int gpucr_arena_is_hugetlb(void);
/* Places n blobs (sizes[i]) in the arena, growing it by one segment when they do
 * not fit, and registering the new segment with reg (may be NULL). out[i] gets
 * the host address of blob i. First every segment whose file is linked in a
 * folder (staged: arena_files) gets a new file at the same range, unregistered
 * with unreg before and registered with reg after (both NULL: not pinned), so
 * the caller never writes into staged pages. Returns 0, or -1 with errno (and
 * gpucr_arena_error saying why, when a linked segment had no room to move). */
int gpucr_arena_place(const size_t *sizes, size_t n, void **out, gpucr_register_fn reg, gpucr_register_fn unreg);
void gpucr_arena_reset(void); /* forget placements, keep capacity */
/* One-time costs ahead of the first checkpoint: create and pre-fault capacity
 * (no driver needed), later register what is not yet registered. */
int gpucr_arena_prealloc(size_t size);
/* A new segment of at least `more` bytes, created without blocking placements:
 * 0, or -1 with errno (EBUSY while detached, ENOSPC: no segment left). */
int gpucr_arena_grow(size_t more);
/* Why the last growth (or a placement's new files for staged segments) was
 * refused for lack of room ("" when it was not). */
const char *gpucr_arena_error(void);
/* How much to grow an arena of `capacity` that lacks `missing` bytes ahead of a
 * checkpoint: at least 1/8 of it and 256 MiB, so growth in small steps makes
 * few segments (far fewer than GPUCR_ARENA_MAX_SEGS). */
size_t gpucr_arena_growth(size_t missing, size_t capacity);
/* Bytes of these blobs that would not fit in the arena as it is (0: all fit). */
size_t gpucr_arena_shortfall(const size_t *sizes, size_t n);
int gpucr_arena_register_pending(gpucr_register_fn reg);
size_t gpucr_arena_capacity(void);
size_t gpucr_arena_used(void);
int gpucr_arena_segments(void);
double gpucr_arena_setup_seconds(void); /* time spent creating/faulting/registering */
void gpucr_arena_destroy(gpucr_register_fn unreg); /* unmaps and unlinks */
/* Migration: segments out of the address space while CRIU dumps (unregistered,
 * each range held by an inaccessible reservation; contents lost), and back at
 * the same addresses (new files, pre-faulted, registered, zero-filled). */
int gpucr_arena_detach(gpucr_register_fn unreg); /* 0, or -1 with errno */
int gpucr_arena_attach(gpucr_register_fn reg);   /* 0, or -1 with errno */
/* attach with the detached segments' files filled ahead, one per segment in
 * order; takes every descriptor. 0, or -1 with errno (EINVAL: they do not match).
 * linkable: the files were made with O_TMPFILE and never had a name, so a
 * preemption may link them into a stage folder (arena_files). */
int gpucr_arena_attach_files(gpucr_register_fn reg, const int *fds, int n, int linkable);
/* While the program runs: segments whose files can never be linked again get
 * new ones (arena_ready.c); how many, or -1 with errno. */
int gpucr_arena_refresh(gpucr_register_fn reg, gpucr_register_fn unreg);
int gpucr_arena_detached(void);                  /* segments detached now */
void gpucr_arena_after_fork_child(void);
/* Which segment holds host, and where: 0, or -1 when it is not in the arena.
 * Every mapped segment keeps its descriptor open (closed when detached or
 * destroyed, and in a forked child): the copy helper (helper.c) maps them too. */
int gpucr_arena_locate(const void *host, int *seg, size_t *offset);
/* Segment i's descriptor (still ours), size and generation (a new file each time
 * it is mapped): 0, or -1 when it has no open descriptor. */
int gpucr_arena_segment(int i, int *fd, size_t *size, unsigned *gen);
/* Segment i's file, for the agent to link into a stage folder (linkat of
 * /proc/<pid>/fd/<fd>, AT_SYMLINK_FOLLOW): 0 with our descriptor and whether
 * the kernel lets it be linked (made with O_TMPFILE, or linked somewhere now);
 * -1 with *fd = -1 when it has none (no such segment, detached). */
int gpucr_arena_segment_file(int i, int *fd, int *linkable);
/* Every segment's file linked into the folder `into` as "0", "1", ... (all or
 * none): 0, or -1 with errno. */
int gpucr_arena_link_into(const char *into);
/* Segment i's range (detached or not): its size, 0 when there is no such segment. */
size_t gpucr_arena_bounds(int i, uintptr_t *base);

#endif
