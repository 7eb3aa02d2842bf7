/* Measures what the driver checkpoint costs per byte of pinned host memory,
 * and how fast pinning and unpinning are (threads, piece size, during copies).
 * Driven over stdin by pinprobe.py, which calls the driver checkpoint API on it.
 *   pinprobe DIR ARENA_GIB DEV_GIB */
#define _GNU_SOURCE
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define CK(x) do { CUresult r_ = (x); if (r_) { printf("{\"error\": \"%s = %d\"}\n", #x, (int)r_); fflush(stdout); exit(1); } } while (0)

static CUcontext ctx;
static char *arena;
static size_t asize, dsize, piece;
static CUdeviceptr dva;
static CUmemGenericAllocationHandle dh;
static CUmemAllocationProp prop;
static CUstream st[2];
static int npieces;
static char *pinned; /* per piece */

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

struct job { int t, nt, op; };
static void *worker(void *a)
{
    struct job *j = a;
    cuCtxSetCurrent(ctx);
    for (int i = j->t; i < npieces; i += j->nt) {
        char *b = arena + (size_t)i * piece;
        size_t n = asize - (size_t)i * piece < piece ? asize - (size_t)i * piece : piece;
        if (j->op == 0) madvise(b, n, MADV_POPULATE_WRITE);
        else if (j->op == 1 && !pinned[i]) { CK(cuMemHostRegister(b, n, CU_MEMHOSTREGISTER_PORTABLE)); pinned[i] = 1; }
        else if (j->op == 2 && pinned[i]) { CK(cuMemHostUnregister(b)); pinned[i] = 0; }
    }
    return NULL;
}

static double parallel(int op, int nt)
{
    pthread_t th[64];
    struct job j[64];
    double t0 = now();
    for (int t = 0; t < nt; t++) { j[t] = (struct job){t, nt, op}; pthread_create(&th[t], NULL, worker, &j[t]); }
    for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
    return now() - t0;
}

static void set_piece(size_t mib)
{
    piece = mib ? mib << 20 : asize;
    npieces = (int)((asize + piece - 1) / piece);
}

static double copy(int to_host, size_t bytes)
{
    double t0 = now();
    int k = 0;
    for (size_t off = 0; off < bytes; off += 256u << 20) {
        size_t n = bytes - off < (256u << 20) ? bytes - off : 256u << 20;
        if (to_host) CK(cuMemcpyDtoHAsync(arena + off, dva + off, n, st[k++ & 1]));
        else CK(cuMemcpyHtoDAsync(dva + off, arena + off, n, st[k++ & 1]));
    }
    CK(cuStreamSynchronize(st[0]));
    CK(cuStreamSynchronize(st[1]));
    return now() - t0;
}

static double dev_create(void)
{
    double t0 = now();
    CK(cuMemCreate(&dh, dsize, &prop, 0));
    CK(cuMemMap(dva, dsize, 0, dh, 0));
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(cuMemSetAccess(dva, dsize, &acc, 1));
    return now() - t0;
}

static void *memcpy_worker(void *a)
{
    long t = (long)a, nt = 8;
    size_t half = asize / 2, part = half / nt;
    memcpy(arena + half + t * part, arena + t * part, part);
    return NULL;
}

int main(int argc, char **argv)
{
    asize = (size_t)(atof(argv[2]) * (1 << 30));
    dsize = (size_t)(atof(argv[3]) * (1 << 30));
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&st[0], CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&st[1], CU_STREAM_NON_BLOCKING));
    char path[256];
    snprintf(path, sizeof path, "%s/pinprobe-%d", argv[1], getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)asize) < 0) { printf("{\"error\": \"arena file\"}\n"); return 1; }
    arena = mmap(NULL, asize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    unlink(path);
    close(fd);
    if (arena == MAP_FAILED) { printf("{\"error\": \"mmap\"}\n"); return 1; }
    pinned = calloc(asize / (1 << 20) + 1, 1);
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CK(cuMemAddressReserve(&dva, dsize, 0, 0, 0));
    printf("{\"ready\": 1}\n");
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32];
        int a = 0, b = 0;
        sscanf(line, "%31s %d %d", cmd, &a, &b);
        double s = 0;
        if (!strcmp(cmd, "pop")) { set_piece(1024); s = parallel(0, a); }
        else if (!strcmp(cmd, "reg")) { set_piece((size_t)b); s = parallel(1, a); }
        else if (!strcmp(cmd, "unreg")) s = parallel(2, a);
        else if (!strcmp(cmd, "dev")) { s = dev_create(); CK(cuMemsetD32(dva, 0x5a5a5a5a, dsize / 4)); CK(cuCtxSynchronize()); }
        else if (!strcmp(cmd, "recreate")) s = dev_create();
        else if (!strcmp(cmd, "release")) { double t0 = now(); CK(cuMemUnmap(dva, dsize)); CK(cuMemRelease(dh)); s = now() - t0; }
        else if (!strcmp(cmd, "d2h")) s = copy(1, dsize);
        else if (!strcmp(cmd, "h2d")) s = copy(0, dsize);
        else if (!strcmp(cmd, "reserve")) { CUdeviceptr v; double t0 = now(); CK(cuMemAddressReserve(&v, (size_t)a << 30, 0, 0, 0)); s = now() - t0; }
        else if (!strcmp(cmd, "memcpy")) { /* 8 threads copy the arena's first half onto its second */
            pthread_t th[8];
            double t0 = now();
            for (long t = 0; t < 8; t++) pthread_create(&th[t], NULL, memcpy_worker, (void *)t);
            for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
            s = now() - t0;
        } else if (!strcmp(cmd, "overlap")) {
            /* a D2H of all device memory in flight, then unpin / pin / release-like
             * calls on pieces the copy does not touch: do they wait for it? */
            int k = 0;
            double t0 = now();
            for (size_t off = 0; off < dsize; off += 256u << 20)
                CK(cuMemcpyDtoHAsync(arena + off, dva + off, 256u << 20, st[k++ & 1]));
            double t1 = now();
            int last = npieces - 1;
            CK(cuMemHostUnregister(arena + (size_t)last * piece));
            double t2 = now();
            int busy_after_unreg = cuStreamQuery(st[0]) == CUDA_ERROR_NOT_READY || cuStreamQuery(st[1]) == CUDA_ERROR_NOT_READY;
            CK(cuMemHostRegister(arena + (size_t)last * piece, asize - (size_t)last * piece, CU_MEMHOSTREGISTER_PORTABLE));
            double t3 = now();
            int busy_after_reg = cuStreamQuery(st[0]) == CUDA_ERROR_NOT_READY || cuStreamQuery(st[1]) == CUDA_ERROR_NOT_READY;
            CUevent ev;
            CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
            CK(cuEventRecord(ev, st[0]));
            CK(cuStreamSynchronize(st[0]));
            CK(cuStreamSynchronize(st[1]));
            double t4 = now();
            printf("{\"cmd\": \"overlap\", \"issue_s\": %.6f, \"unreg_s\": %.6f, \"busy_after_unreg\": %d, \"reg_s\": %.6f, "
                   "\"busy_after_reg\": %d, \"copy_total_s\": %.6f}\n", t1 - t0, t2 - t1, busy_after_unreg, t3 - t2, busy_after_reg, t4 - t0);
            fflush(stdout);
            continue;
        } else if (!strcmp(cmd, "quit")) break;
        printf("{\"cmd\": \"%s\", \"a\": %d, \"b\": %d, \"s\": %.6f}\n", cmd, a, b, s);
        fflush(stdout);
    }
    return 0;
}
