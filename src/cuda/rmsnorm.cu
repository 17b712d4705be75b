// rmsnorm.cu: RMSNorm kind (a) of docs/MODEL.md §2.2 (the stored weight holds the +1), one block per row.
// Optionally also the bf16 copy of the output (yb, the fast prefill products' input, issue 12): the
// same value rounded by f2bf16 as k_to_bf16 does, so bit-identical to k_rmsnorm then k_to_bf16, in
// one pass instead of a second read and write of the row.
#include "common.cuh"

static __global__ void rmsnorm_kernel(const float *x, const int *xrow, const float *w, float *y, uint16_t *yb, int n,
                                      float eps) {
    __shared__ float sh[32];
    const int t = blockIdx.x;
    const float *xr = x + (size_t)(xrow ? xrow[t] : t) * n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    float *yr = y + (size_t)t * n;
    if (yb) {
        uint16_t *br = yb + (size_t)t * n;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = xr[i] * r * w[i];
            yr[i] = v;
            br[i] = f2bf16(v);
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * w[i];
    }
}

extern "C" int k_rmsnorm(const float *x, const int *xrow, const float *w, float *y, uint16_t *yb, int T, int n,
                         float eps, void *stream) {
    if (T <= 0) return 0;
    rmsnorm_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(x, xrow, w, y, yb, n, eps);
    return launch_status();
}
