// rmsnorm.cu: RMSNorm kind (a) of docs/MODEL.md §2.2 (the stored weight holds the +1), one block per row.
// Optionally also the bf16 copy of the output (yb, the fast prefill products' input): the
// same value rounded by f2bf16 as k_to_bf16 does, so bit-identical to k_rmsnorm then k_to_bf16, in
// one pass instead of a second read and write of the row.
// k_rmsnorm_gate: the same kernel also forms one quantized row's product with the normed row, the
// MoE's shared-expert gate logit, while y is in registers: as a 1-row product in the router's exact
// launch it gets blocks of its own that each walk all of K for one row, a second wave (0.222 ms
// against the router's 0.111 ms alone at 4,096 tokens).
#include "common.cuh"

// GATE: gy[t] = sum_k y[t, k] G[0, k].
template <bool GATE>
static __global__ void rmsnorm_kernel(const float *x, const int *xrow, const float *w, float *y, uint16_t *yb, int n,
                                      float eps, struct dqt G, float *gy) {
    __shared__ float sh[32];
    const int t = blockIdx.x;
    const float *xr = x + (size_t)(xrow ? xrow[t] : t) * n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    float *yr = y + (size_t)t * n;
    float dot = 0; // GATE: this thread's part of the gate logit
    const int per = 32 / G.bits;
    const uint32_t mask = (1u << G.bits) - 1;
    if (yb) {
        uint16_t *br = yb + (size_t)t * n;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = xr[i] * r * w[i];
            yr[i] = v;
            br[i] = f2bf16(v);
            if constexpr (GATE) dot += v * dequant_at(G.w, G.scales, G.biases, i, G.bits, per, mask);
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = xr[i] * r * w[i];
            yr[i] = v;
            if constexpr (GATE) dot += v * dequant_at(G.w, G.scales, G.biases, i, G.bits, per, mask);
        }
    }
    if constexpr (GATE) {
        dot = block_sum(dot, sh);
        if (threadIdx.x == 0) gy[t] = dot;
    }
}

extern "C" int k_rmsnorm(const float *x, const int *xrow, const float *w, float *y, uint16_t *yb, int T, int n,
                         float eps, void *stream) {
    if (T <= 0) return 0;
    const struct dqt none = {NULL, NULL, NULL, 0, 0, 0, 8}; // unread (GATE off)
    rmsnorm_kernel<false><<<T, 256, 0, (cudaStream_t)stream>>>(x, xrow, w, y, yb, n, eps, none, NULL);
    return launch_status();
}

extern "C" int k_rmsnorm_gate(const float *x, const int *xrow, const float *w, float *y, uint16_t *yb, int T, int n,
                              float eps, struct dqt G, float *gy, void *stream) {
    if (T <= 0) return 0;
    if (!gy || G.rows != 1 || G.cols != n || n % QGROUP || (G.bits != 4 && G.bits != 8))
        return (int)cudaErrorInvalidValue;
    rmsnorm_kernel<true><<<T, 256, 0, (cudaStream_t)stream>>>(x, xrow, w, y, yb, n, eps, G, gy);
    return launch_status();
}
