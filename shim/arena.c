/* The host arena: where a process's GPU data goes while its GPU memory is yielded.
 *
 * Segments are files in a hugetlbfs mount (when the configured directory is one)
 * or in /dev/shm, mapped MAP_SHARED and pre-faulted by several threads (first
 * touch is slow in a VM: ~1 GB/s per thread), unlinked at once (so they never
 * outlive the process), and registered with the driver (pinned) only when the
 * caller passes a register function (GPUCR_ARENA_PIN; datapath.c says why not by
 * default). The arena only grows, by one segment at a time, so the same
 * footprint checkpointed again reuses the same memory. Each segment prefers the
 * GPU's NUMA node, and its fault threads run there (numa.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "gpucr.h"

#define HUGETLBFS_MAGIC_ 0x958458f6
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define MAX_FAULT_THREADS 8
#define MAX_SEGS GPUCR_ARENA_MAX_SEGS
#define BLOB_ALIGN 4096

struct seg {
    char *base;
    size_t size, used;
    int registered;
    int detached; /* a placeholder holds its range (migration) */
    int fd;       /* kept open for the copy helper (gpucr_arena_keep_fds), else -1 */
    unsigned gen; /* a new file each time it is (re)mapped */
    char path[256];
};

static struct seg segs[MAX_SEGS];
static int nsegs;
static char dir[200] = "/dev/shm";
static int hugetlb;
static size_t page = 4096;
static unsigned seq;
static int keep_fds; /* the copy helper maps the segments too (helper.c) */
static double setup_s;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* Held while a segment is created (map_new_file only runs under it): a
 * checkpoint that needs room waits for a growth in progress (arena_ready.c)
 * instead of creating a second segment beside it. Taken before mu. */
static pthread_mutex_t grow_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static int detached_locked(void)
{
    int n = 0;
    for (int i = 0; i < nsegs; i++)
        n += segs[i].detached;
    return n;
}

static size_t gpucr_arena_capacity_locked(void)
{
    size_t c = 0;
    for (int i = 0; i < nsegs; i++)
        c += segs[i].size;
    return c;
}

int gpucr_arena_configure(const char *d)
{
    struct statfs fs;
    const char *use = (d && *d) ? d : "/dev/shm";
    if (statfs(use, &fs) < 0)
        return -1;
    if (strlen(use) >= sizeof dir) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(dir, use);
    hugetlb = ((unsigned long)fs.f_type == HUGETLBFS_MAGIC_);
    page = hugetlb ? (size_t)fs.f_bsize : 4096;
    return 0;
}

const char *gpucr_arena_dir(void) { return dir; }
int gpucr_arena_is_hugetlb(void) { return hugetlb; }

struct fault_job {
    char *base;
    size_t size;
    int err;
};

static void *fault_thread(void *arg)
{
    struct fault_job *j = arg;
    if (madvise(j->base, j->size, MADV_POPULATE_WRITE) < 0)
        j->err = errno;
    return NULL;
}

/* Our own threads only: the caller's affinity (the program's) is left alone. */
static void *fault_thread_pinned(void *arg)
{
    gpucr_numa_pin_thread();
    return fault_thread(arg);
}

/* Pre-faults [p, p+size) with up to MAX_FAULT_THREADS threads: 0, or an errno
 * (EINVAL: the kernel has no MADV_POPULATE_WRITE; ENOMEM/EFAULT: no room). */
static int prefault(char *p, size_t size)
{
    cpu_set_t cpus;
    int n = MAX_FAULT_THREADS;
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < n)
        n = CPU_COUNT(&cpus);
    size_t slice = round_up((size + (size_t)n - 1) / (size_t)n, page > (2u << 20) ? page : (2u << 20));
    struct fault_job jobs[MAX_FAULT_THREADS];
    pthread_t th[MAX_FAULT_THREADS];
    int started[MAX_FAULT_THREADS] = {0};
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < n; i++) {
        size_t off = (size_t)i * slice;
        jobs[i] = (struct fault_job){p + off, off < size ? (size - off < slice ? size - off : slice) : 0, 0};
        if (jobs[i].size && i > 0)
            started[i] = pthread_create(&th[i], NULL, fault_thread_pinned, &jobs[i]) == 0;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    for (int i = 1; i < n; i++) /* the ones that did not start, here */
        if (jobs[i].size && !started[i])
            fault_thread(&jobs[i]);
    fault_thread(&jobs[0]);
    int err = jobs[0].err;
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        if (!err)
            err = jobs[i].err;
    }
    return err;
}

/* A new shared file of `size` bytes, mapped (at `at` when not NULL) and
 * pre-faulted, then unlinked: no name once mapped, so the memory goes away with
 * the process, however it ends (a killed process runs no destructor). */
static void *map_new_file(struct seg *s, size_t size, void *at)
{
    int fd;
    do {
        snprintf(s->path, sizeof s->path, "%s/gpucr-arena-%d-%u", dir, (int)getpid(), seq++);
        fd = open(s->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    } while (fd < 0 && errno == EEXIST);
    if (fd < 0)
        return MAP_FAILED;
    if (ftruncate(fd, (off_t)size) < 0) {
        int e = errno;
        close(fd);
        unlink(s->path);
        errno = e;
        return MAP_FAILED;
    }
    void *p = mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0);
    int e = errno;
    if (p != MAP_FAILED) /* before any page is touched; a shared file keeps the policy */
        gpucr_numa_bind(p, size);
    if (p != MAP_FAILED && (e = prefault(p, size)) == EINVAL) { /* an old kernel */
        p = mmap(p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE | MAP_FIXED, fd, 0);
        e = errno;
    } else if (p != MAP_FAILED && e) { /* out of shared memory or huge pages */
        if (at)
            mmap(at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        else
            munmap(p, size);
        p = MAP_FAILED;
    }
    if (p != MAP_FAILED && keep_fds) {
        s->fd = fd;
        s->gen = seq;
    } else
        close(fd);
    unlink(s->path);
    if (p == MAP_FAILED)
        errno = e == 0 ? ENOMEM : e;
    return p;
}

static void close_fd(struct seg *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

/* s becomes a new segment of at least size bytes (rounded up to the page and
 * to 2 MiB), mapped and pre-faulted; -1 with errno when it cannot be. */
static int new_segment(struct seg *s, size_t size)
{
    *s = (struct seg){.fd = -1};
    size = round_up(size, page > (2u << 20) ? page : (2u << 20));
    void *p = map_new_file(s, size, NULL);
    if (p == MAP_FAILED)
        return -1;
    s->base = p;
    s->size = size;
    return 0;
}

static int add_segment(size_t size, gpucr_register_fn reg)
{
    if (nsegs == MAX_SEGS) {
        errno = ENOSPC;
        return -1;
    }
    double t0 = gpucr_now();
    struct seg *s = &segs[nsegs];
    if (new_segment(s, size) != 0)
        return -1;
    void *p = s->base;
    size = s->size;
    if (reg) {
        if (reg(p, size) != 0) {
            munmap(p, size);
            close_fd(s);
            errno = EIO;
            return -1;
        }
        s->registered = 1;
    }
    nsegs++;
    setup_s += gpucr_now() - t0;
    return 0;
}

/* First fit, in the order given; out[b] NULL for a blob that did not fit.
 * Returns the bytes that did not fit. */
static size_t fit_in_order(const size_t *sizes, const size_t *order, size_t n, void **out)
{
    size_t missing = 0;
    for (int i = 0; i < nsegs; i++)
        segs[i].used = 0;
    for (size_t k = 0; k < n; k++) {
        size_t b = order ? order[k] : k;
        size_t need = round_up(sizes[b], BLOB_ALIGN);
        out[b] = NULL;
        for (int i = 0; i < nsegs; i++) {
            if (!segs[i].detached && segs[i].size - segs[i].used >= need) {
                out[b] = segs[i].base + segs[i].used;
                segs[i].used += need;
                break;
            }
        }
        if (!out[b])
            missing += need;
    }
    return missing;
}

static const size_t *sort_sizes;
static int larger_first(const void *a, const void *b)
{
    size_t x = sort_sizes[*(const size_t *)a], y = sort_sizes[*(const size_t *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Places the blobs in the order given (so an unchanged footprint keeps its
 * places), else largest first, which packs segments of several sizes (an
 * arena grown step by step, arena_ready.c) far better. Returns the bytes that
 * did not fit either way, 0 when all did. Callers hold mu. */
static size_t try_fit(const size_t *sizes, size_t n, void **out)
{
    size_t missing = fit_in_order(sizes, NULL, n, out);
    if (!missing || n < 2)
        return missing;
    size_t *order = malloc(n * sizeof *order);
    if (!order)
        return missing;
    for (size_t k = 0; k < n; k++)
        order[k] = k;
    sort_sizes = sizes;
    qsort(order, n, sizeof *order, larger_first);
    missing = fit_in_order(sizes, order, n, out);
    free(order);
    return missing;
}

static int try_place(const size_t *sizes, size_t n, void **out)
{
    return try_fit(sizes, n, out) ? -1 : 0;
}

static int register_pending(gpucr_register_fn reg)
{
    for (int i = 0; i < nsegs && reg; i++) {
        if (segs[i].registered || segs[i].detached)
            continue;
        double t0 = gpucr_now();
        if (reg(segs[i].base, segs[i].size) != 0) {
            errno = EIO;
            return -1;
        }
        segs[i].registered = 1;
        setup_s += gpucr_now() - t0;
    }
    return 0;
}

static char last_error[600]; /* why the last growth was refused, "" when it was not */

const char *gpucr_arena_error(void) { return last_error; }

/* A new segment of at least `more` bytes, where the process's memory cgroups
 * and the node leave room for it (mem_room.c; not for hugetlbfs pages). It is created and pre-faulted
 * without holding mu (seconds for tens of GiB), so lookups and placements in
 * the segments there are go on meanwhile. Not while segments are detached. */
int gpucr_arena_grow(size_t more)
{
    pthread_mutex_lock(&grow_mu);
    pthread_mutex_lock(&mu);
    int busy = detached_locked() > 0, full = nsegs == MAX_SEGS;
    pthread_mutex_unlock(&mu);
    if (busy || full || more == 0) {
        pthread_mutex_unlock(&grow_mu);
        errno = busy ? EBUSY : full ? ENOSPC : EINVAL;
        return -1;
    }
    if (!hugetlb && gpucr_mem_room_for(more, last_error, sizeof last_error) != 0) {
        pthread_mutex_unlock(&grow_mu);
        gpucr_log("arena: %s", last_error);
        errno = ENOMEM;
        return -1;
    }
    last_error[0] = '\0';
    double t0 = gpucr_now();
    struct seg s;
    if (new_segment(&s, more) != 0) {
        pthread_mutex_unlock(&grow_mu);
        return -1;
    }
    pthread_mutex_lock(&mu);
    segs[nsegs++] = s; /* only grow_mu's holder adds segments: still room */
    setup_s += gpucr_now() - t0;
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&grow_mu);
    return 0;
}

size_t gpucr_arena_growth(size_t missing, size_t capacity)
{
    size_t more = missing > capacity / 8 ? missing : capacity / 8;
    return more > (256ul << 20) ? more : (256ul << 20);
}

int gpucr_arena_prealloc(size_t size)
{
    size_t cap = gpucr_arena_capacity();
    return size > cap ? gpucr_arena_grow(size - cap) : 0;
}

size_t gpucr_arena_shortfall(const size_t *sizes, size_t n)
{
    void **out = malloc((n ? n : 1) * sizeof *out);
    if (!out)
        return 0;
    pthread_mutex_lock(&mu);
    size_t missing = try_fit(sizes, n, out);
    for (int i = 0; i < nsegs; i++) /* a dry run: nothing is placed */
        segs[i].used = 0;
    pthread_mutex_unlock(&mu);
    free(out);
    return missing;
}

int gpucr_arena_register_pending(gpucr_register_fn reg)
{
    pthread_mutex_lock(&mu);
    int rc = register_pending(reg);
    pthread_mutex_unlock(&mu);
    return rc;
}

static int place_locked(const size_t *sizes, size_t n, void **out, gpucr_register_fn reg)
{
    if (register_pending(reg) < 0)
        return -1;
    if (try_place(sizes, n, out) == 0)
        return 0;
    /* Grow by what did not fit; then everything fits in the new segment at worst. */
    size_t missing = 0;
    for (size_t b = 0; b < n; b++)
        if (!out[b])
            missing += round_up(sizes[b], BLOB_ALIGN);
    for (int i = 0; i < nsegs; i++)
        segs[i].used = 0;
    if (add_segment(missing, reg) < 0)
        return -1;
    if (try_place(sizes, n, out) == 0)
        return 0;
    size_t total = 0;
    for (size_t b = 0; b < n; b++)
        total += round_up(sizes[b], BLOB_ALIGN);
    if (add_segment(total, reg) < 0)
        return -1;
    return try_place(sizes, n, out);
}

int gpucr_arena_place(const size_t *sizes, size_t n, void **out, gpucr_register_fn reg)
{
    pthread_mutex_lock(&grow_mu);
    pthread_mutex_lock(&mu);
    int rc = place_locked(sizes, n, out, reg);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&grow_mu);
    return rc;
}

void gpucr_arena_reset(void)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nsegs; i++)
        segs[i].used = 0;
    pthread_mutex_unlock(&mu);
}

size_t gpucr_arena_capacity(void)
{
    pthread_mutex_lock(&mu);
    size_t c = gpucr_arena_capacity_locked();
    pthread_mutex_unlock(&mu);
    return c;
}

size_t gpucr_arena_used(void)
{
    size_t u = 0;
    for (int i = 0; i < nsegs; i++)
        u += segs[i].used;
    return u;
}

int gpucr_arena_segments(void) { return nsegs; }
double gpucr_arena_setup_seconds(void) { return setup_s; }

void gpucr_arena_destroy(gpucr_register_fn unreg)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nsegs; i++) {
        if (segs[i].registered && unreg)
            unreg(segs[i].base, segs[i].size);
        munmap(segs[i].base, segs[i].size);
        close_fd(&segs[i]);
    }
    nsegs = 0;
    pthread_mutex_unlock(&mu);
}

/* Migration: CRIU cannot dump the segments (unlinked shared files, huge pages),
 * so while the process is dumped they are out of its address space. detach
 * unregisters each segment and replaces it by an inaccessible, unbacked
 * reservation of the same range (nothing else can be mapped there); its
 * contents are gone, the agent saved them first. attach maps a new file over
 * each reservation, pre-faulted and registered: the same addresses, so the
 * placements (host pointers) stay valid; the agent then refills them. */
int gpucr_arena_detach(gpucr_register_fn unreg)
{
    int rc = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nsegs && rc == 0; i++) {
        struct seg *s = &segs[i];
        if (s->detached)
            continue;
        if (s->registered && unreg) {
            if (unreg(s->base, s->size) != 0) {
                errno = EIO;
                rc = -1;
                break;
            }
            s->registered = 0;
        }
        if (mmap(s->base, s->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
            rc = -1;
        else {
            s->detached = 1;
            close_fd(s); /* CRIU would dump the deleted file's contents */
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* With the driver, when the arena is pinned: 0, or -1 with errno EIO. */
static int register_segment(struct seg *s, gpucr_register_fn reg)
{
    if (!reg)
        return 0;
    if (reg(s->base, s->size) != 0) {
        errno = EIO;
        return -1;
    }
    s->registered = 1;
    return 0;
}

int gpucr_arena_attach(gpucr_register_fn reg)
{
    int rc = 0;
    gpucr_numa_reset(NULL); /* restored, perhaps on another machine: its GPU's node */
    pthread_mutex_lock(&grow_mu);
    pthread_mutex_lock(&mu);
    double t0 = gpucr_now();
    for (int i = 0; i < nsegs && rc == 0; i++) {
        struct seg *s = &segs[i];
        if (!s->detached)
            continue;
        if (map_new_file(s, s->size, s->base) == MAP_FAILED) {
            rc = -1;
            break;
        }
        s->detached = 0;
        if ((rc = register_segment(s, reg)) != 0)
            break;
    }
    setup_s += gpucr_now() - t0;
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&grow_mu);
    return rc;
}

/* A restore that filled the segments' files ahead (the agent, while CRIU and the
 * driver restored the rest of the process) hands them over: fds[k] is the k-th
 * detached segment's file, of that segment's size, mapped at its range instead
 * of a new file, so its pages hold the data already. Every descriptor is taken
 * (kept for the copy helper, else closed). -1 with errno, nothing attached, when
 * they do not match the detached segments one for one. */
int gpucr_arena_attach_files(gpucr_register_fn reg, const int *fds, int n)
{
    int rc = 0, k = 0, kept = 0; /* fds[0..kept) went to segments */
    gpucr_numa_reset(NULL);
    pthread_mutex_lock(&grow_mu);
    pthread_mutex_lock(&mu);
    double t0 = gpucr_now();
    if (n != detached_locked()) {
        errno = EINVAL;
        rc = -1;
    }
    for (int i = 0; i < nsegs && rc == 0; i++) {
        struct stat st;
        if (!segs[i].detached)
            continue;
        if (fstat(fds[k], &st) < 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != segs[i].size) {
            errno = EINVAL;
            rc = -1;
        }
        k++;
    }
    k = 0;
    for (int i = 0; i < nsegs && rc == 0; i++) {
        struct seg *s = &segs[i];
        if (!s->detached)
            continue;
        int fd = fds[k++];
        /* populated: the pages are in the file already, only the tables are made */
        if (mmap(s->base, s->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, 0) == MAP_FAILED) {
            rc = -1;
            break;
        }
        s->detached = 0;
        s->path[0] = 0;
        seq++;
        if (keep_fds) {
            s->fd = fd;
            s->gen = seq;
            kept++;
        }
        if ((rc = register_segment(s, reg)) != 0)
            break;
    }
    for (int j = kept; j < n; j++) { /* taken in order: the rest is closed */
        int e = errno;
        close(fds[j]);
        errno = e;
    }
    setup_s += gpucr_now() - t0;
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&grow_mu);
    return rc;
}

int gpucr_arena_detached(void)
{
    pthread_mutex_lock(&mu);
    int n = detached_locked();
    pthread_mutex_unlock(&mu);
    return n;
}

/* The child shares the parent's MAP_SHARED segments: forget them (they are the
 * parent's), so the child never writes into them. */
void gpucr_arena_after_fork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    pthread_mutex_init(&grow_mu, NULL);
    for (int i = 0; i < nsegs; i++) {
        munmap(segs[i].base, segs[i].size);
        close_fd(&segs[i]);
    }
    nsegs = 0;
    setup_s = 0;
}

void gpucr_arena_keep_fds(void)
{
    pthread_mutex_lock(&mu);
    keep_fds = 1;
    pthread_mutex_unlock(&mu);
}

int gpucr_arena_locate(const void *host, int *seg, size_t *offset)
{
    int rc = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nsegs && rc; i++)
        if ((const char *)host >= segs[i].base && (const char *)host < segs[i].base + segs[i].size) {
            *seg = i;
            *offset = (size_t)((const char *)host - segs[i].base);
            rc = 0;
        }
    pthread_mutex_unlock(&mu);
    return rc;
}

size_t gpucr_arena_bounds(int i, uintptr_t *base)
{
    size_t size = 0;
    pthread_mutex_lock(&mu);
    if (i >= 0 && i < nsegs) {
        *base = (uintptr_t)segs[i].base;
        size = segs[i].size;
    }
    pthread_mutex_unlock(&mu);
    return size;
}

int gpucr_arena_segment(int i, int *fd, size_t *size, unsigned *gen)
{
    int rc = -1;
    pthread_mutex_lock(&mu);
    if (i >= 0 && i < nsegs && segs[i].fd >= 0 && !segs[i].detached) {
        *fd = segs[i].fd;
        *size = segs[i].size;
        *gen = segs[i].gen;
        rc = 0;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
