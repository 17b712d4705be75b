// qmatmul.cu: 4/8-bit dequantizing matrix-matrix products for prefill, dense or grouped by expert.
//
// Tile: 64 input rows (tokens) x 64 output features, K stepped one quantization group (64) at a
// time; the group's codes are dequantized into shared memory as fp32, and each of the 256
// threads accumulates a 4 x 4 block in fp32. The grouped form takes the per-expert row counts
// and offsets from device memory (blockIdx.z = expert); blocks past an expert's count exit, so
// the grid is sized on the host from a bound alone and nothing is read back.
#include "common.cuh"

enum { MM_BM = 64, MM_BN = 64, MM_BK = 64, MM_THREADS = 256, MM_PAD = 4 };
static_assert(MM_BK == QGROUP, "one quantization group per K step");

template <int BITS>
static __global__ void __launch_bounds__(MM_THREADS)
    qmatmul_kernel(struct dqt W, const float *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                   const int *ymap, int M, const int *counts, const int *offs) {
    constexpr int PER = 32 / BITS, WPT = 16 / PER;   // words per thread per K step (16 codes)
    constexpr uint32_t MASK = (1u << BITS) - 1;
    __shared__ __align__(16) float Xs[MM_BK][MM_BM + MM_PAD];
    __shared__ __align__(16) float Ws[MM_BK][MM_BN + MM_PAD];
    __shared__ int xrow[MM_BM];
    __shared__ int yrow[MM_BM];

    const int e = blockIdx.z;
    int base = 0, cnt = M;
    if (counts) {
        base = offs[e];
        cnt = counts[e];
    }
    const int r0 = blockIdx.y * MM_BM;
    if (r0 >= cnt) return;
    const int n0 = blockIdx.x * MM_BN;
    const int tid = threadIdx.x, N = W.rows, K = W.cols;
    if (tid < MM_BM) {
        int r = r0 + tid;
        if (r < cnt) {
            r += base;
            xrow[tid] = xmap ? xmap[r] / xdiv : r;
            yrow[tid] = ymap ? ymap[r] : r;
        } else {
            xrow[tid] = -1;
            yrow[tid] = -1;
        }
    }
    const size_t mat = counts ? (size_t)e : 0;
    const int wpr = K / PER, gpr = K / QGROUP;
    // Loader roles: row lr (0..63) of the tile, codes [lk, lk + 16) of the K step.
    const int lr = tid / 4, lk = (tid % 4) * 16;
    const int wn = n0 + lr;
    const uint32_t *wrow = wn < N ? W.w + (mat * N + wn) * wpr : nullptr;
    const uint16_t *srow = wn < N ? W.scales + (mat * N + wn) * gpr : nullptr;
    const uint16_t *brow = wn < N ? W.biases + (mat * N + wn) * gpr : nullptr;
    const int ty = tid / 16, tx = tid % 16;
    float acc[4][4] = {};
    __syncthreads();
    const int xr = xrow[lr];
    for (int k0 = 0; k0 < K; k0 += MM_BK) {
        // x tile, transposed into Xs[k][row]
        if (xr >= 0) {
            const float4 *src = (const float4 *)(x + (size_t)xr * ldx + k0 + lk);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float4 v = src[q];
                Xs[lk + 4 * q + 0][lr] = v.x;
                Xs[lk + 4 * q + 1][lr] = v.y;
                Xs[lk + 4 * q + 2][lr] = v.z;
                Xs[lk + 4 * q + 3][lr] = v.w;
            }
        } else {
#pragma unroll
            for (int q = 0; q < 16; q++) Xs[lk + q][lr] = 0.0f;
        }
        // weight tile, dequantized into Ws[k][feature]
        if (wrow) {
            const int g = k0 / QGROUP;
            const float sc = bf16f(srow[g]), bi = bf16f(brow[g]);
            const uint32_t *wp = wrow + (k0 + lk) / PER;
#pragma unroll
            for (int q = 0; q < WPT; q++) {
                const uint32_t word = wp[q];
#pragma unroll
                for (int c = 0; c < PER; c++) Ws[lk + q * PER + c][lr] = sc * (float)((word >> (c * BITS)) & MASK) + bi;
            }
        } else {
#pragma unroll
            for (int q = 0; q < 16; q++) Ws[lk + q][lr] = 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < MM_BK; k++) {
            const float4 a = *(const float4 *)&Xs[k][ty * 4];
            const float4 b = *(const float4 *)&Ws[k][tx * 4];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int yr = yrow[ty * 4 + i];
        if (yr < 0) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int n = n0 + tx * 4 + j;
            if (n < N) y[(size_t)yr * ldy + n] = acc[i][j];
        }
    }
}

extern "C" int k_qmatmul(struct dqt W, const float *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                         const int *ymap, int M, const int *counts, const int *offs, int maxrows, void *stream) {
    const int rows = counts ? maxrows : M;
    if (rows <= 0) return 0;
    if (W.cols % MM_BK || ldx % 4) return (int)cudaErrorInvalidValue;
    dim3 grid(CEIL_DIV(W.rows, MM_BN), CEIL_DIV(rows, MM_BM), counts ? (W.n_mat > 0 ? W.n_mat : 1) : 1);
    if (grid.y > 65535) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    if (W.bits == 4) qmatmul_kernel<4><<<grid, MM_THREADS, 0, st>>>(W, x, ldx, xmap, xdiv, y, ldy, ymap, M, counts, offs);
    else if (W.bits == 8) qmatmul_kernel<8><<<grid, MM_THREADS, 0, st>>>(W, x, ldx, xmap, xdiv, y, ldy, ymap, M, counts, offs);
    else return (int)cudaErrorInvalidValue;
    return launch_status();
}
