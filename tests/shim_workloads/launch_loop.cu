// A launch-bound CUDA C loop: the worst case for the shim's API gate, which
// every kernel launch passes. Each step launches LAUNCHES tiny kernels on one
// stream and waits for them; the wall time of each measured step is printed.
//   launch_loop STEPS WARMUP LAUNCHES
// Output: one line `RESULT {"times": [...seconds], "shim_loaded": B, "launch_hooked": B}`;
// launch_hooked: the runtime's cuLaunchKernel entry point lies in the shim.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__global__ void tick(float *x) { x[threadIdx.x] += 1.0f; }

#define CK(x) do { cudaError_t e = (x); if (e) { fprintf(stderr, "CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__); return 2; } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int in_maps(const char *name) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        found |= strstr(line, name) != NULL;
    if (f)
        fclose(f);
    return found;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s STEPS WARMUP LAUNCHES\n", argv[0]); return 2; }
    int steps = atoi(argv[1]), warmup = atoi(argv[2]), launches = atoi(argv[3]);
    float *x;
    cudaStream_t s;
    CK(cudaMalloc(&x, 256 * sizeof *x));
    CK(cudaMemset(x, 0, 256 * sizeof *x));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double *times = (double *)malloc(sizeof(double) * steps);
    for (int i = 0; i < warmup + steps; i++) {
        double t0 = now();
        for (int j = 0; j < launches; j++)
            tick<<<1, 256, 0, s>>>(x);
        CK(cudaStreamSynchronize(s));
        if (i >= warmup)
            times[i - warmup] = now() - t0;
    }
    CK(cudaGetLastError());
    void *launch = NULL;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &launch, 12000, cudaEnableDefault, &q));
    Dl_info info;
    int hooked = launch && dladdr(launch, &info) && info.dli_fname && strstr(info.dli_fname, "libgpucr-cuda.so");
    printf("RESULT {\"times\": [");
    for (int i = 0; i < steps; i++)
        printf("%s%.9f", i ? ", " : "", times[i]);
    printf("], \"shim_loaded\": %s, \"launch_hooked\": %s}\n", in_maps("libgpucr-cuda.so") ? "true" : "false",
           hooked ? "true" : "false");
    return 0;
}
