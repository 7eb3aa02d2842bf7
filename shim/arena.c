/* The host arena: where a process's GPU data goes while its GPU memory is yielded.
 *
 * Segments are files in a hugetlbfs mount (when the configured directory is one)
 * or in /dev/shm, mapped MAP_SHARED and pre-faulted by several threads (first
 * touch is slow in a VM: ~1 GB/s per thread), without a name (so they never
 * outlive the process, unless the agent links one into a stage folder to keep
 * its pages: arena_files; the next checkpoint then writes into a new file
 * instead), and registered with the driver (pinned) only when the
 * caller passes a register function (GPUCR_ARENA_PIN; datapath.c says why not by
 * default). The arena only grows, by one segment at a time, so the same
 * footprint checkpointed again reuses the same memory. Each segment prefers the
 * GPU's NUMA node, and its fault threads run there (numa.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "arena.h"
#include "log.h"
#include "mem_room.h"
#include "numa.h"

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
    /* Its file, open while it is mapped (-1 while detached): the copy helper
     * maps it too, the agent links it into a stage folder (arena_files). */
    int fd;
    int tmpfile;  /* made with O_TMPFILE: may be linked though it has no name */
    dev_t dev;    /* fd's file, to tell that fd is still ours: the program */
    ino_t ino;    /* may close it and open another file in its place */
    unsigned gen; /* a new file each time it is (re)mapped */
};

static struct seg segs[MAX_SEGS];
static int nsegs;
static char dir[200] = "/dev/shm";
static int hugetlb;
static size_t page = 4096;
static unsigned seq;
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

/* A named file in dir, unlinked at once: for a file system without O_TMPFILE. */
static int named_file(void)
{
    char path[256];
    int fd;
    do {
        snprintf(path, sizeof path, "%s/gpucr-arena-%d-%u", dir, (int)getpid(), seq++);
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    } while (fd < 0 && errno == EEXIST);
    if (fd >= 0)
        unlink(path);
    return fd;
}

/* A new file of `size` bytes with no name, so its memory goes away with the
 * process however it ends (a killed process runs no destructor), unless someone
 * links it. O_TMPFILE without O_EXCL where the file system has it: the agent may
 * link it into a stage folder (arena_files); else named and unlinked at once,
 * which the kernel never lets anyone link again. -1 with errno. */
static int tmpfile_ok = -1; /* the directory takes O_TMPFILE: 1, 0, -1 not tried yet */

static int new_file(size_t size, int *tmpfile)
{
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    *tmpfile = fd >= 0;
    tmpfile_ok = fd >= 0;
    if (fd < 0) /* EOPNOTSUPP, EISDIR, EINVAL...: whatever the reason, a named one */
        fd = named_file();
    if (fd >= 0 && ftruncate(fd, (off_t)size) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* An unbacked, inaccessible reservation of [at, at+size): nothing else is
 * mapped there, and it costs no memory. */
static int reserve(void *at, size_t size)
{
    void *p = mmap(at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return p == MAP_FAILED ? -1 : 0;
}

/* fd's first `size` bytes mapped shared (at `at` when not NULL), bound to the
 * GPU's node and pre-faulted; MAP_FAILED with errno (at `at`: a reservation
 * holds the range then). */
static void *map_file(int fd, size_t size, void *at)
{
    void *p = mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0);
    int e = errno;
    if (p != MAP_FAILED) /* before any page is touched; a shared file keeps the policy */
        gpucr_numa_bind(p, size);
    if (p != MAP_FAILED && (e = prefault(p, size)) == EINVAL) { /* an old kernel */
        p = mmap(p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE | MAP_FIXED, fd, 0);
        e = errno;
    } else if (p != MAP_FAILED && e) { /* out of shared memory or huge pages */
        if (at)
            reserve(at, size);
        else
            munmap(p, size);
        p = MAP_FAILED;
    }
    if (p == MAP_FAILED)
        errno = e == 0 ? ENOMEM : e;
    return p;
}

/* fd is s's file from now on, a new generation (the copy helper maps it anew). */
static void take_fd(struct seg *s, int fd, int tmpfile)
{
    struct stat st;
    s->fd = fd;
    s->tmpfile = tmpfile;
    s->gen = ++seq;
    s->dev = 0;
    s->ino = 0;
    if (fstat(fd, &st) == 0) {
        s->dev = st.st_dev;
        s->ino = st.st_ino;
    }
}

/* Whether s->fd is still s's file; st gets its status. */
static int own_fd(const struct seg *s, struct stat *st)
{
    return s->fd >= 0 && fstat(s->fd, st) == 0 && st->st_dev == s->dev && st->st_ino == s->ino;
}

/* A new file of `size` bytes mapped (at `at` when not NULL) and pre-faulted:
 * s's file from now on. MAP_FAILED with errno. */
static void *map_new_file(struct seg *s, size_t size, void *at)
{
    int tmpfile, fd = new_file(size, &tmpfile);
    if (fd < 0)
        return MAP_FAILED;
    void *p = map_file(fd, size, at);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        errno = e;
    } else
        take_fd(s, fd, tmpfile);
    return p;
}

static void close_fd(struct seg *s)
{
    struct stat st;
    if (own_fd(s, &st)) /* never a descriptor the program opened in its place */
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

/* Whether s's file is linked in a folder: the agent staged its pages there
 * (arena_files), and a drain may be reading them at any moment. A descriptor
 * that is no longer ours cannot tell: as if it were. */
static int linked(const struct seg *s)
{
    struct stat st;
    return !own_fd(s, &st) || st.st_nlink > 0;
}

/* After a failed swap (refile): s's own file at its range again, else a
 * reservation holds the range and s counts as detached (nothing goes there). */
static void put_back(struct seg *s)
{
    struct stat st;
    if (own_fd(s, &st) &&
        mmap(s->base, s->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, s->fd, 0) != MAP_FAILED)
        return;
    reserve(s->base, s->size);
    s->detached = 1;
    close_fd(s);
}

/* s gets a new file at the same range, so that nothing is written into its
 * staged pages again; its contents are not kept (the checkpoint overwrites
 * them). The new file is made and pre-faulted aside first: without room, s
 * stays as it was. The caller registers it again (register_pending). 0, or -1
 * with errno. */
static int refile(struct seg *s, gpucr_register_fn unreg)
{
    int tmpfile, fd = new_file(s->size, &tmpfile);
    void *p = fd < 0 ? MAP_FAILED : map_file(fd, s->size, NULL);
    int e = errno;
    if (p != MAP_FAILED && s->registered && (!unreg || unreg(s->base, s->size) != 0)) {
        munmap(p, s->size); /* the driver keeps the old pages pinned: no swap under it */
        p = MAP_FAILED;
        e = EIO;
    }
    if (p == MAP_FAILED) {
        if (fd >= 0)
            close(fd);
        errno = e;
        return -1;
    }
    s->registered = 0;
    /* the pages are in the new file already: only the tables are made */
    void *q = mmap(s->base, s->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, 0);
    e = errno;
    munmap(p, s->size);
    if (q == MAP_FAILED) {
        close(fd);
        put_back(s);
        errno = e;
        return -1;
    }
    close_fd(s);
    take_fd(s, fd, tmpfile);
    return 0;
}

static int refile_said; /* last_error says why refile_linked failed */

/* Before anything is written into the arena: each segment linked in a folder
 * gets a new file. The staged pages stay, charged to this job's memory cgroups
 * (mem_room.c), so the new ones must fit beside them. */
static int refile_linked(gpucr_register_fn unreg)
{
    char why[500];
    size_t need = 0;
    int rc = 0, e = 0;
    if (refile_said) /* that was the last placement's */
        last_error[0] = '\0';
    refile_said = 0;
    for (int i = 0; i < nsegs; i++)
        need += !segs[i].detached && linked(&segs[i]) ? segs[i].size : 0;
    if (!need)
        return 0;
    double t0 = gpucr_now();
    if (!hugetlb && gpucr_mem_room_for(need, why, sizeof why) != 0) {
        e = ENOMEM;
        rc = -1;
    }
    for (int i = 0; i < nsegs && rc == 0; i++)
        if (!segs[i].detached && linked(&segs[i]) && (rc = refile(&segs[i], unreg)) != 0) {
            e = errno;
            snprintf(why, sizeof why, "no new file for segment %d in %s (%s)", i, dir, strerror(e));
        }
    setup_s += gpucr_now() - t0;
    if (rc) {
        snprintf(last_error, sizeof last_error, "the arena's pages staged for a drain stay until it ends, and "
                 "new ones for this checkpoint could not be made: %.480s", why);
        refile_said = 1;
        gpucr_log("arena: %s", last_error);
        errno = e;
    }
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

/* While the program runs: a segment whose file can never be linked again (one
 * mapped from a stage folder whose drain is done: the kernel lets a file that
 * had a name and lost it get none again) gets a new file, so that the next
 * preemption can keep the arena's pages without copying them. Its contents are
 * not needed any more; its pages go once nobody maps them. One still linked is
 * left to the drain (a new file now would hold twice the memory while it
 * reads); the checkpoint moves off it if it comes first. The number of
 * segments given a new file, or -1 with errno. */
int gpucr_arena_refresh(gpucr_register_fn reg, gpucr_register_fn unreg)
{
    int n = 0, rc = 0;
    struct stat st;
    pthread_mutex_lock(&grow_mu);
    pthread_mutex_lock(&mu);
    double t0 = gpucr_now();
    for (int i = 0; i < nsegs && rc == 0 && tmpfile_ok == 1; i++) {
        struct seg *s = &segs[i];
        if (s->detached || s->tmpfile || !own_fd(s, &st) || st.st_nlink > 0)
            continue;
        if (!hugetlb && gpucr_mem_room_for(s->size, NULL, 0) != 0) {
            errno = ENOMEM;
            rc = -1;
        } else if ((rc = refile(s, unreg)) == 0)
            n++;
    }
    if (n && reg && register_pending(reg) < 0)
        rc = -1;
    setup_s += gpucr_now() - t0;
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&grow_mu);
    return rc ? -1 : n;
}

int gpucr_arena_place(const size_t *sizes, size_t n, void **out, gpucr_register_fn reg, gpucr_register_fn unreg)
{
    pthread_mutex_lock(&grow_mu);
    pthread_mutex_lock(&mu);
    int rc = refile_linked(unreg);
    if (rc == 0)
        rc = place_locked(sizes, n, out, reg);
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
        if (reserve(s->base, s->size) != 0)
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
 * (kept as the segment's file, like one made here). -1 with errno, nothing
 * attached, when they do not match the detached segments one for one. */
int gpucr_arena_attach_files(gpucr_register_fn reg, const int *fds, int n, int linkable)
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
        take_fd(s, fd, linkable); /* else linkable only while linked (gpucr_arena_segment_file) */
        kept++;
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

/* Segment i when it is mapped with a descriptor still ours (st: its file), else NULL. Under mu. */
static struct seg *mapped_seg(int i, struct stat *st)
{
    return i >= 0 && i < nsegs && !segs[i].detached && own_fd(&segs[i], st) ? &segs[i] : NULL;
}

int gpucr_arena_segment(int i, int *fd, size_t *size, unsigned *gen)
{
    struct stat st;
    pthread_mutex_lock(&mu);
    struct seg *s = mapped_seg(i, &st);
    if (s) {
        *fd = s->fd;
        *size = s->size;
        *gen = s->gen;
    }
    pthread_mutex_unlock(&mu);
    return s ? 0 : -1;
}

/* Every segment's file linked into the folder `into` as "0", "1", ... in
 * segment order, from here: this process's mounts are the ones its files are
 * on (a restored process may have a mount namespace of its own, where the
 * agent's link would cross mounts: EXDEV). All or none: 0, or -1 with errno
 * and nothing left in the folder. */
int gpucr_arena_link_into(const char *into)
{
    int rc = 0, done = 0, e = 0;
    int dfd = open(into, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (dfd < 0)
        return -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nsegs && rc == 0; i++, done++) {
        struct stat st;
        char proc[64], name[16];
        if (!mapped_seg(i, &st)) {
            e = EBADF;
            rc = -1;
            break;
        }
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", segs[i].fd);
        snprintf(name, sizeof name, "%d", i);
        if (linkat(AT_FDCWD, proc, dfd, name, AT_SYMLINK_FOLLOW) != 0) {
            e = errno;
            rc = -1;
            break;
        }
    }
    for (int i = 0; rc && i < done; i++) { /* none: what was linked goes */
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        unlinkat(dfd, name, 0);
    }
    pthread_mutex_unlock(&mu);
    close(dfd);
    if (rc)
        errno = e;
    return rc;
}

int gpucr_arena_segment_file(int i, int *fd, int *linkable)
{
    struct stat st;
    pthread_mutex_lock(&mu);
    struct seg *s = mapped_seg(i, &st);
    *fd = s ? s->fd : -1;
    /* A file with a name may always get another; one without, only if it was
     * made with O_TMPFILE (and never linked: not to be told here). */
    *linkable = s && (s->tmpfile || st.st_nlink > 0);
    pthread_mutex_unlock(&mu);
    return s ? 0 : -1;
}
