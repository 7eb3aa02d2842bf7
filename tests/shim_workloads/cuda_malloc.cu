// A CUDA C program that calls cudaMalloc directly and iterates a kernel.
// cuda_malloc STEPS BALLAST_GIB PACE_MS   (SIGUSR1: no more pacing, finish now)
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <unistd.h>

static volatile sig_atomic_t hurry;
static void on_usr1(int) { hurry = 1; }

__global__ void step(float *x, size_t n, int i) {
    for (size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x)
        x[k] = x[k] * 0.999f + 0.001f * (float)((k * 7 + i) % 13);
}

__global__ void fill(float *x, size_t n) {
    for (size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x)
        x[k] = (float)(k % 1000) * 0.001f;
}

// per-block partial sums, added up in order on the host: deterministic
__global__ void sum(const float *x, size_t n, double *out) {
    __shared__ double s[256];
    double acc = 0;
    for (size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x)
        acc += x[k];
    s[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int j = 0; j < 256; j++) t += s[j];
        out[blockIdx.x] = t;
    }
}

#define CK(x) do { cudaError_t e = (x); if (e) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

int main(int argc, char **argv) {
    int steps = atoi(argv[1]);
    size_t nb = (size_t)(atof(argv[2]) * (1 << 30)) / 4, n = 1 << 24;
    int pace = atoi(argv[3]);
    signal(SIGUSR1, on_usr1);
    float *x, *ballast;
    double *d, hp[1024], h;
    CK(cudaMalloc(&x, n * 4));
    CK(cudaMalloc(&ballast, nb * 4));
    CK(cudaMalloc(&d, sizeof hp));
    fill<<<1024, 256>>>(x, n);
    fill<<<1024, 256>>>(ballast, nb);
    for (int i = 0; i < steps; i++) {
        step<<<1024, 256>>>(x, n, i);
        sum<<<1024, 256>>>(x, n, d);
        CK(cudaMemcpy(hp, d, sizeof hp, cudaMemcpyDeviceToHost));
        h = 0;
        for (int j = 0; j < 1024; j++) h += hp[j];
        printf("step %d %a\n", i, h);
        fflush(stdout);
        if (!hurry)
            usleep(pace * 1000);
    }
    sum<<<1024, 256>>>(ballast, nb, d);
    CK(cudaMemcpy(hp, d, sizeof hp, cudaMemcpyDeviceToHost));
    h = 0;
    for (int j = 0; j < 1024; j++) h += hp[j];
    printf("checksum %a\n", h);
    CK(cudaFree(x));
    CK(cudaFree(ballast));
    return 0;
}
