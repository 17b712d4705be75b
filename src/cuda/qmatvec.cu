// qmatvec.cu: 4/8-bit dequantizing matrix-vector products (decode), one warp per output row.
//
// Slot j of the grid's y dimension multiplies matrix ids[j] (an expert id read on the device)
// by input row j / xdiv, so a decode step's 8 experts run in one launch with no host round trip.
#include "common.cuh"

enum { MV_ROWS = 8 };   // warps (rows) per block

template <int BITS>
static __global__ void __launch_bounds__(MV_ROWS * WARP_SIZE)
    qmatvec_kernel(struct dqt W, const int *ids, const float *x, int ldx, int xdiv, float *y, int ldy) {
    constexpr int PER = 32 / BITS;              // codes per word
    constexpr uint32_t MASK = (1u << BITS) - 1;
    const int lane = threadIdx.x % WARP_SIZE;
    const int n = blockIdx.x * MV_ROWS + threadIdx.x / WARP_SIZE;
    const int j = blockIdx.y;
    if (n >= W.rows) return;
    const int K = W.cols, wpr = K / PER, gpr = K / QGROUP;
    const size_t mat = ids ? (size_t)ids[j] : 0;
    const size_t row = mat * W.rows + n;
    const uint32_t *w = W.w + row * wpr;
    const uint16_t *s = W.scales + row * gpr, *b = W.biases + row * gpr;
    const float *xr = x + (size_t)(j / xdiv) * ldx;
    float acc = 0;
    for (int i = lane; i < wpr; i += WARP_SIZE) {
        const uint32_t word = w[i];
        const int k0 = i * PER, g = k0 / QGROUP;
        const float sc = bf16f(s[g]), bi = bf16f(b[g]);
#pragma unroll
        for (int e = 0; e < PER; e++) acc += (sc * (float)((word >> (e * BITS)) & MASK) + bi) * xr[k0 + e];
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)j * ldy + n] = acc;
}

extern "C" int k_qmatvec(struct dqt W, const int *ids, const float *x, int ldx, int xdiv, float *y, int ldy, int S,
                         void *stream) {
    if (S <= 0) return 0;
    dim3 grid(CEIL_DIV(W.rows, MV_ROWS), S);
    if (W.bits == 4) qmatvec_kernel<4><<<grid, MV_ROWS * WARP_SIZE, 0, (cudaStream_t)stream>>>(W, ids, x, ldx, xdiv, y, ldy);
    else if (W.bits == 8) qmatvec_kernel<8><<<grid, MV_ROWS * WARP_SIZE, 0, (cudaStream_t)stream>>>(W, ids, x, ldx, xdiv, y, ldy);
    else return (int)cudaErrorInvalidValue;
    return launch_status();
}
