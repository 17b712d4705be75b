// elementwise.cu: residual add and SwiGLU.
#include "common.cuh"

static __global__ void add_kernel(float *x, const float *d, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) x[i] += d[i];
}

static __global__ void swiglu_kernel(const float *g, const float *u, float *y, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = silu_f(g[i]) * u[i];
}

static int grid_for(long n) {
    long b = CEIL_DIV(n, 256);
    return (int)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

extern "C" int k_add(float *x, const float *d, long n, void *stream) {
    add_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(x, d, n);
    return launch_status();
}

extern "C" int k_swiglu(const float *g, const float *u, float *y, long n, void *stream) {
    swiglu_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(g, u, y, n);
    return launch_status();
}
