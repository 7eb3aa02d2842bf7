// GPU programs that gpucr must refuse to checkpoint, or whose quiesce times out.
// Each iterates an exact integer kernel and prints its result per step, so a
// caller can check that the program kept running and stayed correct.
//
//   refusal_workload MODE STEPS PACE_MS [ARG]
//
//   plain        a cudaMalloc'ed buffer (run as an MPS client)
//   managed      the buffer is cudaMallocManaged; the host sums it directly
//   ipc_export   also fills a cudaMalloc'ed buffer with k%5 and writes its
//                cudaIpcGetMemHandle, in hex, to the file ARG
//   vmm_export   the buffer is cuMemCreate'd and exported with
//                cuMemExportToShareableHandle (POSIX fd)
//   ipc_import   opens the handle in the file ARG (waits for it) and sums the
//                imported buffer each step
//   spin_block   each step first spins ARG ms on the GPU, then reads the result
//                with a blocking cudaMemcpy (a call stays in the driver)
//   spin_poll    the same, but waits by polling cudaStreamQuery (no call stays
//                in the driver; the context sync is what cannot finish)
//
// Output per step: "step I SUM" (+ " IMPORTED_SUM" for ipc_import), where
// SUM = (I + 1) * sum_k (k % 7 + 1) over N = 2^20 elements; "done" at the end.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N (1u << 20)

__global__ void add(unsigned *x) {
    for (unsigned k = blockIdx.x * blockDim.x + threadIdx.x; k < N; k += gridDim.x * blockDim.x)
        x[k] += k % 7 + 1;
}

__global__ void fill5(unsigned *x) {
    for (unsigned k = blockIdx.x * blockDim.x + threadIdx.x; k < N; k += gridDim.x * blockDim.x)
        x[k] = k % 5;
}

__global__ void sum(const unsigned *x, unsigned long long *out) {
    unsigned long long acc = 0;
    for (unsigned k = blockIdx.x * blockDim.x + threadIdx.x; k < N; k += gridDim.x * blockDim.x)
        acc += x[k];
    atomicAdd(out, acc);
}

__global__ void spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while ((long long)(t - t0) < ns);
}

#define CK(x) do { cudaError_t e = (x); if (e) { printf("CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__); fflush(stdout); exit(2); } } while (0)
#define CU(x) do { CUresult e = (x); if (e) { printf("CUDA driver error %d at line %d\n", (int)e, __LINE__); fflush(stdout); exit(2); } } while (0)

/* Driver entry points the way frameworks get them: through the runtime
 * (cuGetProcAddress underneath), so no link against libcuda is needed. */
template <class F> static F drv(const char *name) {
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
    if (!p) { printf("no driver entry point %s\n", name); exit(2); }
    return (F)p;
}

static unsigned *vmm_exported_buffer(void) {
    CUdevice dev;
    CU(drv<decltype(&cuCtxGetDevice)>("cuCtxGetDevice")(&dev));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0, size;
    CU(drv<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity")(
        &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size = (N * sizeof(unsigned) + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    CU(drv<decltype(&cuMemCreate)>("cuMemCreate")(&h, size, &prop, 0));
    CU(drv<decltype(&cuMemAddressReserve)>("cuMemAddressReserve")(&va, size, 0, 0, 0));
    CU(drv<decltype(&cuMemMap)>("cuMemMap")(va, size, 0, h, 0));
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(drv<decltype(&cuMemSetAccess)>("cuMemSetAccess")(va, size, &acc, 1));
    int fd = -1;
    CU(drv<decltype(&cuMemExportToShareableHandle)>("cuMemExportToShareableHandle")(
        &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    printf("exported fd %d\n", fd);
    return (unsigned *)va;
}

static void write_handle(const char *path, const cudaIpcMemHandle_t *h) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    for (size_t i = 0; i < sizeof h->reserved; i++)
        fprintf(f, "%02x", (unsigned char)h->reserved[i]);
    fclose(f);
    rename(tmp, path);
}

static cudaIpcMemHandle_t read_handle(const char *path) {
    cudaIpcMemHandle_t h;
    FILE *f;
    while (!(f = fopen(path, "r")))
        usleep(20000);
    for (size_t i = 0; i < sizeof h.reserved; i++) {
        unsigned v;
        if (fscanf(f, "%2x", &v) != 1) { printf("bad handle file\n"); exit(2); }
        h.reserved[i] = (char)v;
    }
    fclose(f);
    return h;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s MODE STEPS PACE_MS [ARG]\n", argv[0]); return 2; }
    const char *mode = argv[1], *arg = argc > 4 ? argv[4] : "";
    int steps = atoi(argv[2]), pace = atoi(argv[3]);
    unsigned *x = NULL, *shared = NULL, *imported = NULL;
    unsigned long long *d, h[2];
    cudaStream_t s;
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc(&d, 2 * sizeof *d));
    int managed = !strcmp(mode, "managed");
    if (managed)
        CK(cudaMallocManaged(&x, N * sizeof *x));
    else if (!strcmp(mode, "vmm_export"))
        x = vmm_exported_buffer();
    else
        CK(cudaMalloc(&x, N * sizeof *x));
    CK(cudaMemset(x, 0, N * sizeof *x));
    if (!strcmp(mode, "ipc_export")) {
        cudaIpcMemHandle_t ih;
        CK(cudaMalloc(&shared, N * sizeof *shared));
        fill5<<<256, 256, 0, s>>>(shared);
        CK(cudaStreamSynchronize(s));
        CK(cudaIpcGetMemHandle(&ih, shared));
        write_handle(arg, &ih);
        printf("exported handle\n");
    } else if (!strcmp(mode, "ipc_import")) {
        cudaIpcMemHandle_t ih = read_handle(arg);
        CK(cudaIpcOpenMemHandle((void **)&imported, ih, cudaIpcMemLazyEnablePeerAccess));
        printf("imported handle\n");
    }
    long long spin_ns = (long long)atof(arg) * 1000000LL;
    int spinning = !strncmp(mode, "spin_", 5), block = !strcmp(mode, "spin_block");
    if (block)
        s = 0; /* the legacy stream: a plain cudaMemcpy waits for the spin */
    fflush(stdout);
    for (int i = 0; i < steps; i++) {
        CK(cudaMemsetAsync(d, 0, 2 * sizeof *d, s));
        if (spinning)
            spin<<<1, 1, 0, s>>>(spin_ns);
        add<<<256, 256, 0, s>>>(x);
        if (managed) {
            CK(cudaStreamSynchronize(s));
            h[0] = 0;
            for (unsigned k = 0; k < N; k++)
                h[0] += x[k]; /* the host reads managed memory directly */
        } else {
            sum<<<256, 256, 0, s>>>(x, d);
            if (imported)
                sum<<<256, 256, 0, s>>>(imported, d + 1);
            if (!strcmp(mode, "spin_poll")) {
                while (cudaStreamQuery(s) == cudaErrorNotReady)
                    usleep(1000);
            }
            if (block) {
                CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
            } else {
                CK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s));
                CK(cudaStreamSynchronize(s));
            }
        }
        if (imported)
            printf("step %d %llu %llu\n", i, h[0], h[1]);
        else
            printf("step %d %llu\n", i, h[0]);
        fflush(stdout);
        usleep(pace * 1000);
    }
    if (imported)
        CK(cudaIpcCloseMemHandle(imported));
    printf("done\n");
    fflush(stdout);
    return 0;
}
