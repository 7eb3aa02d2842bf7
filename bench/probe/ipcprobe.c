/* Can GPU memory made by another process come and go around a driver checkpoint?
 * Two roles of one program, each driven over stdin by ipcprobe.py:
 *   ipcprobe target GIB   reserves GIB of virtual addresses; imports, maps, checks,
 *                         fills and releases memory another process exported
 *                         (or makes its own, exportable: the checkpoint direction)
 *   ipcprobe helper GIB   creates GIB of exportable memory (POSIX fd), fills it
 *                         from its own pinned buffer, exports it, drops it; or
 *                         imports the target's and copies it out
 * The target takes the helper's fd with pidfd_getfd (same user or root).
 * Replies: one JSON object per command line. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#define PIECE (256u << 20)

static size_t dsize;
static CUdeviceptr va;
static CUmemGenericAllocationHandle h;
static int mapped, fd = -1;
static CUstream st[2];
static uint32_t *pinned;
static uint32_t pinned_val;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int fail(const char *what, CUresult r)
{
    const char *name = NULL;
    cuGetErrorName(r, &name);
    printf("{\"error\": \"%s: %s (%d)\"}\n", what, name ? name : "?", (int)r);
    fflush(stdout);
    return 1;
}
#define CK(x) do { CUresult r_ = (x); if (r_) return fail(#x, r_); } while (0)

static int map_access(void)
{
    CK(cuMemMap(va, dsize, 0, h, 0));
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(cuMemSetAccess(va, dsize, &acc, 1));
    mapped = 1;
    return 0;
}

/* 16 samples of 1 MiB spread over the memory must all hold v */
static int check(uint32_t v, int *ok)
{
    static uint32_t buf[(1u << 20) / 4];
    *ok = 1;
    for (int i = 0; i < 16; i++) {
        size_t off = (dsize - sizeof buf) / 15 * (size_t)i & ~(size_t)4095;
        CK(cuMemcpyDtoH(buf, va + off, sizeof buf));
        for (size_t k = 0; k < sizeof buf / 4; k++)
            if (buf[k] != v)
                *ok = 0;
    }
    return 0;
}

/* exportable memory of our own, mapped at va, its fd in `fd` */
static int create_export(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CK(cuMemCreate(&h, dsize, &prop, 0));
    if (map_access())
        return 1;
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    return 0;
}

/* the memory behind fd FD of process PID, mapped at va */
static int import_from(pid_t pid, int theirs)
{
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    int mine = pfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pfd, theirs, 0);
    if (pfd >= 0)
        close(pfd);
    if (mine < 0) {
        printf("{\"error\": \"pidfd_getfd failed\"}\n");
        fflush(stdout);
        return 1;
    }
    CK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)mine, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(mine);
    return map_access();
}

static int target(const char *cmd, long a, long b, double *s, int *ok)
{
    double t0 = now();
    if (!strcmp(cmd, "import")) { /* import HELPER_PID FD */
        if (import_from((pid_t)a, (int)b))
            return 1;
    } else if (!strcmp(cmd, "own")) { /* our own exportable memory: the checkpoint direction */
        if (create_export())
            return 1;
    } else if (!strcmp(cmd, "unexport")) {
        if (fd >= 0)
            close(fd);
        fd = -1;
    } else if (!strcmp(cmd, "check")) {
        if (check((uint32_t)a, ok))
            return 1;
    } else if (!strcmp(cmd, "fill")) {
        CK(cuMemsetD32(va, (unsigned)a, dsize / 4));
        CK(cuCtxSynchronize());
    } else if (!strcmp(cmd, "release")) {
        CK(cuMemUnmap(va, dsize));
        CK(cuMemRelease(h));
        mapped = 0;
    } else if (!strcmp(cmd, "compute")) { /* the context still does work */
        CUdeviceptr p;
        uint32_t back[256];
        CK(cuMemAlloc(&p, sizeof back));
        CK(cuMemsetD32(p, 0x5eed, 256));
        CK(cuMemcpyDtoH(back, p, sizeof back));
        CK(cuMemFree(p));
        *ok = back[0] == 0x5eed && back[255] == 0x5eed;
    } else {
        printf("{\"error\": \"unknown command %s\"}\n", cmd);
        fflush(stdout);
        return 1;
    }
    *s = now() - t0;
    return 0;
}

static int helper(const char *cmd, long a, long b, double *s, int *ok)
{
    double t0 = now();
    if (!strcmp(cmd, "create")) {
        if (create_export())
            return 1;
    } else if (!strcmp(cmd, "import")) { /* import TARGET_PID FD */
        if (import_from((pid_t)a, (int)b))
            return 1;
    } else if (!strcmp(cmd, "d2h")) { /* d2h VALUE: the whole memory into the pinned buffer, checked */
        int k = 0;
        for (size_t off = 0; off < dsize; off += PIECE)
            CK(cuMemcpyDtoHAsync(pinned, va + off, dsize - off < PIECE ? dsize - off : PIECE, st[k++ & 1]));
        CK(cuStreamSynchronize(st[0]));
        CK(cuStreamSynchronize(st[1]));
        *s = now() - t0;
        *ok = pinned[0] == (uint32_t)a && pinned[PIECE / 8] == (uint32_t)a;
        pinned_val = 0;
        return 0;
    } else if (!strcmp(cmd, "h2d")) { /* h2d VALUE: the whole memory from the pinned buffer */
        if (pinned_val != (uint32_t)a || !pinned_val) {
            for (size_t k = 0; k < PIECE / 4; k++)
                pinned[k] = (uint32_t)a;
            pinned_val = (uint32_t)a;
        }
        t0 = now();
        int k = 0;
        for (size_t off = 0; off < dsize; off += PIECE)
            CK(cuMemcpyHtoDAsync(va + off, pinned, dsize - off < PIECE ? dsize - off : PIECE, st[k++ & 1]));
        CK(cuStreamSynchronize(st[0]));
        CK(cuStreamSynchronize(st[1]));
    } else if (!strcmp(cmd, "drop")) {
        CK(cuMemUnmap(va, dsize));
        CK(cuMemRelease(h));
        if (fd >= 0)
            close(fd);
        fd = -1;
        mapped = 0;
    } else {
        printf("{\"error\": \"unknown command %s\"}\n", cmd);
        fflush(stdout);
        return 1;
    }
    *s = now() - t0;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    int is_helper = !strcmp(argv[1], "helper");
    dsize = (size_t)(atof(argv[2]) * (1 << 30));
    CUcontext ctx;
    CUdevice dev;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&st[0], CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&st[1], CU_STREAM_NON_BLOCKING));
    CK(cuMemAddressReserve(&va, dsize, 0, 0, 0));
    if (is_helper)
        CK(cuMemHostAlloc((void **)&pinned, PIECE, 0));
    printf("{\"ready\": 1, \"pid\": %d}\n", getpid());
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32];
        long a = 0, b = 0;
        if (sscanf(line, "%31s %ld %ld", cmd, &a, &b) < 1)
            continue;
        if (!strcmp(cmd, "quit"))
            break;
        double s = 0;
        int ok = -1;
        if (is_helper ? helper(cmd, a, b, &s, &ok) : target(cmd, a, b, &s, &ok))
            continue;
        printf("{\"cmd\": \"%s\", \"s\": %.6f", cmd, s);
        if (ok >= 0)
            printf(", \"ok\": %s", ok ? "true" : "false");
        if (!strcmp(cmd, "create") || !strcmp(cmd, "own"))
            printf(", \"fd\": %d", fd);
        if (is_helper && (!strcmp(cmd, "h2d") || !strcmp(cmd, "d2h")))
            printf(", \"GBps\": %.2f", (double)dsize / s / 1e9);
        printf("}\n");
        fflush(stdout);
    }
    return 0;
}
