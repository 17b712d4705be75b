// qmatmul.cu: 4/8-bit dequantizing matrix-matrix products for prefill on the tensor cores, dense
// or grouped by expert.
//
// Exact to fp32 rounding, not bf16: an MLX weight is s_g * q + b_g with an integer code q (exact
// in bf16) and a bf16 scale and bias per group of 64, so one group's contribution to y[r, n] is
//     s_g[n] * sum_k q[n, k] x[r, k]  +  b_g[n] * sum_k x[r, k].
// The tensor cores form sum_k q x with x split into two bf16 terms (hi + lo, ~16 mantissa bits),
// accumulating in fp32; the scale, the bias and sum_k x are applied in fp32 once per group. So
// the result matches the fp32 CPU reference to ~1e-6, and the MoE routing downstream does not
// flip on rounding that the reference does not have.
//
// Tile: 128 input rows (tokens) x 64 output features, K stepped one quantization group at a
// time; 8 warps of 32 x 32; mma.m16n8k16. The next group's x and codes are fetched into
// registers while the tensor cores work on the current one. The grouped form takes the
// per-expert row counts and offsets from device memory (blockIdx.z = expert); blocks past an
// expert's count exit, so the grid is sized on the host from a bound alone and nothing is read back.
//
// The fast mode (the default; the verification mode runs this exact kernel): k_qmatmul_bf16
// (qmatmul_bf16.cuh) reads x already in bf16 (k_to_bf16 here converts it once per product input,
// or its producer writes it: k_rmsnorm's bf16 copy, k_qmatmul_bf16_swiglu's epilogue) with one
// MMA per product. Its device code is in
// qmatmul_exact.cuh (run on the host by make qmatmul-sim, as the fast kernel's); both kernels also run
// several products of one input in one launch (segments: qmatmul_bf16.cuh, k_qmatmul_segs).
#include "qmatmul_bf16.cuh"  // the fast kernel; the segment table (qm_segs: several products, one launch)
#include "qmatmul_exact.cuh" // the exact kernel

// add: y += W x (one dense product: k_qmatmul_add).
static int qmatmul_launch(const struct qm_seg *seg, int nseg, const float *x, int ldx, const int *xmap, int xdiv,
                          const int *ymap, int M, const int *counts, const int *offs, int maxrows, bool add,
                          void *stream) {
    const int rows = counts ? maxrows : M;
    if (rows <= 0) return 0;
    qm_segs S;
    const int tiles = qm_table(seg, nseg, MM_BN, &S);
    const struct dqt W = seg[0].W;
    if (!tiles || W.cols % MM_BK || ldx % 4 || (add && (nseg > 1 || counts))) return (int)cudaErrorInvalidValue;
    dim3 grid(tiles, CEIL_DIV(rows, MM_BM), counts ? (W.n_mat > 0 ? W.n_mat : 1) : 1);
    if (grid.y > 65535) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
#define MM_ARGS <<<grid, MM_THREADS, 0, st>>>(W, x, ldx, xmap, xdiv, seg[0].y, seg[0].ldy, ymap, M, counts, offs, S)
    if (W.bits == 4 && add)
        qmatmul_kernel<4, false, true> MM_ARGS;
    else if (W.bits == 8 && add)
        qmatmul_kernel<8, false, true> MM_ARGS;
    else if (W.bits == 4 && nseg > 1)
        qmatmul_kernel<4, true> MM_ARGS;
    else if (W.bits == 4)
        qmatmul_kernel<4, false> MM_ARGS;
    else if (W.bits == 8 && nseg > 1)
        qmatmul_kernel<8, true> MM_ARGS;
    else if (W.bits == 8)
        qmatmul_kernel<8, false> MM_ARGS;
    else
        return (int)cudaErrorInvalidValue;
#undef MM_ARGS
    return launch_status();
}

extern "C" int k_qmatmul(struct dqt W, const float *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                         const int *ymap, int M, const int *counts, const int *offs, int maxrows, void *stream) {
    const struct qm_seg seg = {W, y, ldy};
    return qmatmul_launch(&seg, 1, x, ldx, xmap, xdiv, ymap, M, counts, offs, maxrows, false, stream);
}

extern "C" int k_qmatmul_add(struct dqt W, const float *x, int ldx, float *y, int ldy, int M, void *stream) {
    const struct qm_seg seg = {W, y, ldy};
    return qmatmul_launch(&seg, 1, x, ldx, NULL, 1, NULL, M, NULL, NULL, 0, true, stream);
}

extern "C" int k_qmatmul_segs(const struct qm_seg *segs, int n, const float *x, int ldx, int M, void *stream) {
    return qmatmul_launch(segs, n, x, ldx, NULL, 1, NULL, M, NULL, NULL, 0, false, stream);
}

// On warpgroup products: cudaErrorInvalidDeviceFunction where the device does not run this binary's
// sm_90a code (the backend refuses such a device at load).
template <int BITS, bool GLU, bool SEGS, bool ADD>
static int launch_qmatmul_bf16(dim3 grid, cudaStream_t st, const qm_segs &S, const uint16_t *x, int ldx,
                               const int *xmap, int xdiv, const int *ymap, int M, const int *counts, const int *offs,
                               const float *gate, uint16_t *yb) {
    if (!k_has_sm90a()) return (int)cudaErrorInvalidDeviceFunction;
    static int attr_set; // once per process and form (idempotent, so a race is harmless)
    const size_t smem = QB_SMEM<BITS>;
    if (!attr_set) {
        const cudaError_t e = cudaFuncSetAttribute(qmatmul_bf16_kernel<BITS, GLU, SEGS, ADD>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        attr_set = 1;
    }
    qmatmul_bf16_kernel<BITS, GLU, SEGS, ADD><<<grid, QB_THREADS, smem, st>>>(
        S.s[0].W, x, ldx, xmap, xdiv, S.s[0].y, S.s[0].ldy, ymap, M, counts, offs, gate, yb, S);
    return launch_status();
}

// Both launchers: y = W x (fp32) per segment, or with gate != NULL (one segment) yb = bf16(silu(gate)
// (W x)) (the GLU form), or for ADD (one dense segment) y += W x. SEGS: the kernels' segment lookup
// (more than one segment).
template <bool GLU, bool SEGS, bool ADD = false>
static int qmatmul_bf16_form(const struct qm_seg *seg, int nseg, const uint16_t *x, int ldx, const int *xmap, int xdiv,
                             const int *ymap, int M, const int *counts, const int *offs, int maxrows, const float *gate,
                             uint16_t *yb, void *stream) {
    const int rows = counts ? maxrows : M;
    if (rows <= 0) return 0;
    qm_segs S;
    const int tiles = qm_table(seg, nseg, QB_BN, &S);
    const struct dqt W = seg[0].W;
    if (!tiles || W.cols % QB_BK || ldx % 8 || (uintptr_t)x % 16) return (int)cudaErrorInvalidValue;
    if (ADD && (nseg > 1 || counts)) return (int)cudaErrorInvalidValue;
    for (int i = 0; i < nseg; i++)
        if ((uintptr_t)seg[i].W.w % 16) return (int)cudaErrorInvalidValue;
    dim3 grid(tiles, CEIL_DIV(rows, QB_BM), counts ? (W.n_mat > 0 ? W.n_mat : 1) : 1);
    if (counts && M > 0) { // the compact grid (qb_tile_of): M bounds the rows of all experts together
        if (W.n_mat > QB_THREADS) return (int)cudaErrorInvalidValue;
        grid.y = CEIL_DIV(M, QB_BM) + grid.z;
        grid.z = 1;
    }
    if (grid.y > 65535) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
#define QB_ARGS grid, st, S, x, ldx, xmap, xdiv, ymap, M, counts, offs, gate, yb
    if (W.bits == 4) return launch_qmatmul_bf16<4, GLU, SEGS, ADD>(QB_ARGS);
    if (W.bits == 8) return launch_qmatmul_bf16<8, GLU, SEGS, ADD>(QB_ARGS);
#undef QB_ARGS
    return (int)cudaErrorInvalidValue;
}

extern "C" int k_qmatmul_bf16(struct dqt W, const uint16_t *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                              const int *ymap, int M, const int *counts, const int *offs, int maxrows, void *stream) {
    const struct qm_seg seg = {W, y, ldy};
    return qmatmul_bf16_form<false, false>(&seg, 1, x, ldx, xmap, xdiv, ymap, M, counts, offs, maxrows, NULL, NULL,
                                           stream);
}

extern "C" int k_qmatmul_bf16_add(struct dqt W, const uint16_t *x, int ldx, float *y, int ldy, int M, void *stream) {
    const struct qm_seg seg = {W, y, ldy};
    return qmatmul_bf16_form<false, false, true>(&seg, 1, x, ldx, NULL, 1, NULL, M, NULL, NULL, 0, NULL, NULL, stream);
}

extern "C" int k_qmatmul_bf16_segs(const struct qm_seg *segs, int n, const uint16_t *x, int ldx, int M, void *stream) {
    if (n == 1) // the single-product kernel
        return qmatmul_bf16_form<false, false>(segs, 1, x, ldx, NULL, 1, NULL, M, NULL, NULL, 0, NULL, NULL, stream);
    return qmatmul_bf16_form<false, true>(segs, n, x, ldx, NULL, 1, NULL, M, NULL, NULL, 0, NULL, NULL, stream);
}

extern "C" int k_qmatmul_bf16_swiglu(struct dqt W, const uint16_t *x, int ldx, const int *xmap, int xdiv,
                                     const float *gate, uint16_t *yb, int ldy, const int *ymap, int M,
                                     const int *counts, const int *offs, int maxrows, void *stream) {
    if (!gate || !yb) return (int)cudaErrorInvalidValue;
    const struct qm_seg seg = {W, NULL, ldy};
    return qmatmul_bf16_form<true, false>(&seg, 1, x, ldx, xmap, xdiv, ymap, M, counts, offs, maxrows, gate, yb,
                                          stream);
}

// y[i] = bf16(x[i]) (round to nearest even), 4 at a time where both are aligned.
static __global__ void to_bf16_kernel(const float *x, uint16_t *y, long n, int vec) {
    const long stride = (long)gridDim.x * blockDim.x;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        for (; i < n / 4; i += stride) {
            const float4 v = ((const float4 *)x)[i];
            ((uint2 *)y)[i] = make_uint2(pack2(f2bf16(v.x), f2bf16(v.y)), pack2(f2bf16(v.z), f2bf16(v.w)));
        }
        i = n / 4 * 4 + (long)blockIdx.x * blockDim.x + threadIdx.x;
    }
    for (; i < n; i += stride) y[i] = f2bf16(x[i]);
}

extern "C" int k_to_bf16(const float *x, uint16_t *y, long n, void *stream) {
    if (n <= 0) return 0;
    const int vec = (uintptr_t)x % 16 == 0 && (uintptr_t)y % 8 == 0;
    const long work = vec ? (n + 3) / 4 : n;
    const long blocks = CEIL_DIV(work, 256L);
    to_bf16_kernel<<<(unsigned)(blocks < 132L * 16 ? blocks : 132L * 16), 256, 0, (cudaStream_t)stream>>>(x, y, n, vec);
    return launch_status();
}
