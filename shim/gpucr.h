/* Internal interfaces of libgpucr-cuda.so that do not need cuda.h.
 * gate.c, table.c, arena.c, protocol.c and log.c only include this file, so they
 * build and are unit-tested on machines without the CUDA toolkit. */
#ifndef GPUCR_H
#define GPUCR_H

#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "json.h" /* the JSON reader and writer (jb_*) */

#define GPUCR_EXPORT __attribute__((visibility("default")))

/* ---- log.c ---------------------------------------------------------- */
void gpucr_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double gpucr_now(void); /* monotonic seconds */
/* The CLOCK_REALTIME time ms from now, for pthread_cond_timedwait. */
struct timespec gpucr_deadline_in(long ms);

/* ---- stream_copy.c: memcpy with non-temporal stores ------------------ */
void gpucr_stream_copy(void *dst, const void *src, size_t n);

/* ---- gate.c: the API gate --------------------------------------------
 * Every work-submitting call runs between gpucr_gate_enter/exit. Closing the
 * gate makes new calls wait and waits (bounded) for in-flight calls to drain.
 * Calls nested on one thread pass straight through. */
void gpucr_gate_enter(void);
void gpucr_gate_exit(void);
int gpucr_gate_close(long timeout_ms); /* 0 drained; -1 timed out (gate reopened) */
void gpucr_gate_open(void);
int gpucr_gate_is_closed(void);
long gpucr_gate_inflight(void);
uint64_t gpucr_gate_waits(void); /* calls that had to wait, since start */
void gpucr_gate_after_fork_child(void);

/* ---- table.c: u64 -> u64 hash map --------------------------------- */
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

/* ---- table.c: tracked GPU memory ------------------------------------
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
/* Called by gpucr_phys_del for a PHYS_HELPER_HELD allocation (table lock held). */
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
size_t gpucr_map_count(void);
/* Simple tracked sets: pointer -> size. */
enum { SET_MANAGED, SET_ASYNC, SET_IPC_LEGACY, SET_IPC_OPENED, SET_POOLS, SET_CTX, SET_COUNT };
void gpucr_set_put(int set, uint64_t key, uint64_t val);
int gpucr_set_take(int set, uint64_t key, uint64_t *val); /* 1 if it was there */
size_t gpucr_set_count(int set);
uint64_t gpucr_set_sum(int set);
const struct u64map *gpucr_set_map(int set); /* caller holds the table lock */
void gpucr_table_after_fork_child(void);

/* ---- arena.c: pinned host arena ------------------------------------- */
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
/* Host memory this process may still take: its memory cgroups' limits and the
 * node's MemAvailable, the least (SIZE_MAX when none is known); `where` says
 * which. mem_room_for: 0 when `more` fits with a reserve, else -1 and why. */
size_t gpucr_mem_room(char *where, size_t wlen);
int gpucr_mem_room_for(size_t more, char *why, size_t len);
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
/* The copy helper (helper.c) maps the segments too. Every mapped segment keeps
 * its descriptor open anyway (closed when detached or destroyed, and in a
 * forked child): this asks for nothing more. */
void gpucr_arena_keep_fds(void);
/* Which segment holds host, and where: 0, or -1 when it is not in the arena. */
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

/* ---- numa.c: the arena and the copy threads on the GPU's NUMA node --- */
/* Set by the CUDA side (numa_gpu.c): the PCI bus id of the calling thread's GPU
 * ("0000:3b:00.0"); 0, or -1 while there is none to name (no context yet). */
extern int (*gpucr_numa_gpu_busid)(char *busid, size_t len);
/* The GPU's node, settled once a GPU can be named; -1 when off (GPUCR_NUMA=0),
 * unknown, or the machine has one node. _known never asks the driver. */
int gpucr_numa_node(void);
int gpucr_numa_node_known(void);
void gpucr_numa_bind(void *p, size_t len); /* before first touch; MPOL_PREFERRED */
void gpucr_numa_pin_thread(void); /* onto the node's CPUs the thread may use */
const char *gpucr_numa_error(void); /* the last placement failure, "" when none */
/* Forget the node (the process may be on another machine now); sysfs: the root
 * to read instead of /sys (tests), NULL to keep it. */
void gpucr_numa_reset(const char *sysfs);
void gpucr_numa_after_fork_child(void);
/* The parts, for tests: a cpulist ("0-3,8-11"): CPUs set, -1 when malformed;
 * a PCI device's node (-1 unknown); a node's CPUs; mbind to node n (0, -1 errno). */
int gpucr_numa_parse_cpulist(const char *list, cpu_set_t *set);
int gpucr_numa_pci_node(const char *sysfs, const char *busid);
int gpucr_numa_node_cpus(const char *sysfs, int node, cpu_set_t *set);
int gpucr_numa_bind_to(void *p, size_t len, int node);

/* ---- protocol.c: the control requests (JSON lines, read with json.c) -- */
struct gpucr_req {
    char cmd[32];
    long timeout_ms; /* -1 when absent */
    uint64_t id;     /* "id" of ipc_fd requests; 0 when absent */
    int linkable;    /* "linkable": true of arena_attach: its files may be linked */
};
int gpucr_req_parse(const char *line, struct gpucr_req *req); /* 0 ok, -1 bad */

/* ---- control.c: the per-process control socket ---------------------- */
int gpucr_control_start(void);
void gpucr_control_stop(void);
void gpucr_control_after_fork_child(void);
const char *gpucr_control_path(void);
int gpucr_run_dir(char *out, size_t len); /* creates it (0700) if missing; 0 ok */
/* Answers one request line into out (one JSON object, no newline). */
void gpucr_control_dispatch(const char *line, struct jbuf *out);

/* ---- commands (checkpoint.c; a stub without CUDA in unit tests) ----- */
/* What checkpoint and restore did, besides their reply: callers decide by this,
 * never by the reply's text. The reply's "reason" names the same for clients. */
enum gpucr_outcome {
    GPUCR_DONE = 0,
    GPUCR_FAILED,               /* refused or failed; the reply says why */
    GPUCR_ALREADY_CHECKPOINTED, /* someone else's checkpoint holds it (the agent's) */
    GPUCR_NOT_CHECKPOINTED,     /* nothing to restore (restored through the socket) */
};
void gpucr_cmd_status(struct jbuf *out);
int gpucr_cmd_checkpoint(long timeout_ms, struct jbuf *out); /* enum gpucr_outcome */
int gpucr_cmd_restore(struct jbuf *out);                    /* enum gpucr_outcome */
void gpucr_cmd_arena_detach(struct jbuf *out); /* migration: see checkpoint.c */
void gpucr_cmd_staging_drop(struct jbuf *out); /* migration: see checkpoint.c */
void gpucr_cmd_arena_attach(int linkable, struct jbuf *out); /* linkable: see gpucr_arena_attach_files */
void gpucr_cmd_arena_files(const char *line, struct jbuf *out);  /* preemption: see checkpoint.c */
/* The descriptors that came with the request being answered (SCM_RIGHTS), taken
 * by the caller: their number, or -1 when more came than `max` or than fit. */
int gpucr_control_take_fds(int *out, int max);
struct msghdr;
struct iovec;
/* m: one buffer (iov) and room for descriptors (ctl), for sendmsg/recvmsg. */
void gpucr_msghdr(struct msghdr *m, struct iovec *iov, void *ctl, size_t ctl_len);
/* Ahead of the driver restore: the copy helper starts re-making and filling the
 * GPU memory meanwhile (helper.c). No CUDA call: the driver holds the process. */
void gpucr_cmd_prefill(struct jbuf *out);
/* ipc_legacy.c: a new descriptor for legacy IPC export ID (the caller closes
 * it) and its size; -1 when there is no such export. */
int gpucr_ipc_export_fd(uint64_t id, uint64_t *size);
/* Serializes the commands above between the control thread and suspend.c. */
extern pthread_mutex_t gpucr_cmd_mu;

/* ---- nccl_cut.c: NCCL communicators across a checkpoint (a stub in unit tests) */
/* An nccl_* control request answered into out: 1; 0 when cmd is not one. */
/* The requests of NCCL's cut (nccl_cut.c), each answered by cmd_<name> there;
 * gpucr_hpc/shim/protocol.py names the same. */
#define GPUCR_NCCL_COMMANDS(X)                                                                              \
    X(nccl_counts) X(nccl_freeze) X(nccl_targets) X(nccl_park) X(nccl_thaw) X(nccl_teardown) X(nccl_reload) \
    X(nccl_ids) X(nccl_rebuild)
int gpucr_cmd_nccl(const char *cmd, const char *line, long timeout_ms, struct jbuf *out);
void gpucr_nccl_status(struct jbuf *out);          /* nccl_comms, nccl_cut */
int gpucr_nccl_refusal(char *why, size_t len);     /* 1: communicators still up */
void gpucr_nccl_cut_after_fork_child(void);
void gpucr_nccl_comms_after_fork_child(void);

/* ---- suspend.c: VRAM yield on SIGTSTP, restore on SIGCONT ------------- */
#ifndef GPUCR_YIELD_ON_TSTP_DEFAULT
#define GPUCR_YIELD_ON_TSTP_DEFAULT 1 /* GPUCR_YIELD_ON_TSTP unset or empty */
#endif
/* Installs the handlers and their thread if enabled and the program left both
 * signals at SIG_DFL: 1 installed, 0 not (disabled or the program's own), -1 error. */
int gpucr_tstp_install(void);
int gpucr_tstp_installed(void); /* our SIGTSTP handler is in place in this process */
void gpucr_tstp_after_fork_child(void);

#endif
