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
// The fast mode (issue 12, the default; CALLA_PREFILL_FAST=0 selects this kernel): k_qmatmul_bf16
// (qmatmul_bf16.cuh) reads x already in bf16 (k_to_bf16 here converts it once per product input,
// or its producer writes it: k_rmsnorm's bf16 copy, k_qmatmul_bf16_swiglu's epilogue) with one
// MMA per product; this exact kernel stays as it is, the verification mode.
#include "qmatmul_bf16.cuh"   // the fast kernel; the segment table (qm_segs: several products, one launch)

enum { MM_BM = 128, MM_BN = 64, MM_BK = 64, MM_THREADS = 256 };
static_assert(MM_BK == QGROUP, "one quantization group per K step");

// S: the products (one, or several dense ones of x: qm_segs in qmatmul_bf16.cuh).
template <int BITS, bool SEGS>
static __global__ void __launch_bounds__(MM_THREADS)
    qmatmul_kernel(const qm_segs S, const float *x, int ldx, const int *xmap, int xdiv, const int *ymap, int M,
                   const int *counts, const int *offs) {
    constexpr int PER = 32 / BITS, WPT = 16 / PER;   // codes per word; words per thread per step
    constexpr uint32_t MASK = (1u << BITS) - 1;
    __shared__ __align__(16) uint16_t Xh[MM_BM * MM_BK], Xl[MM_BM * MM_BK], Wq[MM_BN * MM_BK];
    __shared__ float Ssc[MM_BN], Sbi[MM_BN], Xsum[MM_BM];
    __shared__ int xrow[MM_BM], yrow[MM_BM];

    const int e = blockIdx.z;
    int base = 0, cnt = M;
    if (counts) {
        base = offs[e];
        cnt = counts[e];
    }
    const int r0 = blockIdx.y * MM_BM;
    if (r0 >= cnt) return;
    const int seg = qm_seg_of<SEGS>(S, blockIdx.x);
    int n0;
    const struct dqt W = qm_matrix<SEGS, MM_BN, BITS>(S, seg, blockIdx.x, &n0);
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, N = W.rows, K = W.cols;
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
    // Loader roles: x row xl, columns [xc, xc + 32); weight row wl, codes [wc, wc + 16); thread
    // tid < MM_BN also fetches the scale and bias of feature n0 + tid.
    const int xl = tid / 2, xc = (tid % 2) * 32, wl = tid / 4, wc = (tid % 4) * 16;
    const uint32_t *wrow = n0 + wl < N ? W.w + (mat * N + n0 + wl) * wpr : nullptr;
    const size_t sgrow = (mat * N + n0 + tid) * gpr;
    const bool has_sc = tid < MM_BN && n0 + tid < N;
    __syncthreads();
    const int xg = xrow[xl];
    const float *xsrc = xg >= 0 ? x + (size_t)xg * ldx + xc : nullptr;

    float4 xv[8];
    uint32_t wv[WPT];
    float scv = 0, biv = 0;
    auto fetch = [&](int k0) {
#pragma unroll
        for (int q = 0; q < 8; q++) xv[q] = xsrc ? ((const float4 *)(xsrc + k0))[q] : make_float4(0, 0, 0, 0);
        const uint32_t *wp = wrow + (k0 + wc) / PER;
        if constexpr (WPT == 2) {
            const uint2 v = wrow ? *(const uint2 *)wp : make_uint2(0, 0);
            wv[0] = v.x;
            wv[1] = v.y;
        } else {
            static_assert(WPT == 4, "4 or 8 bits");
            const uint4 v = wrow ? *(const uint4 *)wp : make_uint4(0, 0, 0, 0);
            wv[0] = v.x;
            wv[1] = v.y;
            wv[2] = v.z;
            wv[3] = v.w;
        }
        if (has_sc) {
            scv = bf16f(W.scales[sgrow + k0 / QGROUP]);
            biv = bf16f(W.biases[sgrow + k0 / QGROUP]);
        }
    };
    auto stash = [&]() {
        float sum = 0;
        const float *xf = (const float *)xv;
#pragma unroll
        for (int q = 0; q < 4; q++) {   // 16-byte chunks of 8 values
            uint16_t h[8], l[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                split_bf16(xf[q * 8 + i], &h[i], &l[i]);
                sum += xf[q * 8 + i];
            }
            const int at = xl * MM_BK + swz(xl, xc / 8 + q) * 8;
            *(uint4 *)&Xh[at] = make_uint4(pack2(h[0], h[1]), pack2(h[2], h[3]), pack2(h[4], h[5]), pack2(h[6], h[7]));
            *(uint4 *)&Xl[at] = make_uint4(pack2(l[0], l[1]), pack2(l[2], l[3]), pack2(l[4], l[5]), pack2(l[6], l[7]));
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);   // the other half of the row
        if (!(tid & 1)) Xsum[xl] = sum;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            uint16_t b[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int code = q * 8 + i;
                b[i] = (uint16_t)(__float_as_uint((float)((wv[code / PER] >> ((code % PER) * BITS)) & MASK)) >> 16);
            }
            *(uint4 *)&Wq[wl * MM_BK + swz(wl, wc / 8 + q) * 8] =
                make_uint4(pack2(b[0], b[1]), pack2(b[2], b[3]), pack2(b[4], b[5]), pack2(b[6], b[7]));
        }
        if (tid < MM_BN) {
            Ssc[tid] = scv;
            Sbi[tid] = biv;
        }
    };

    const int wm = (warp / 2) * 32, wn = (warp % 2) * 32, g = lane / 4, c4 = lane % 4;
    float acc[2][4][4] = {};
    fetch(0);
    stash();
    __syncthreads();
    for (int k0 = 0; k0 < K; k0 += MM_BK) {
        const bool more = k0 + MM_BK < K;
        if (more) fetch(k0 + MM_BK);
        float tmp[2][4][4] = {};
#pragma unroll
        for (int kk = 0; kk < MM_BK / 16; kk++) {
            uint32_t ah[2][4], al[2][4], bq[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const int r = wm + mi * 16 + lane % 16, c = kk * 2 + lane / 16;
                ldsm_x4(ah[mi], &Xh[r * MM_BK + swz(r, c) * 8]);
                ldsm_x4(al[mi], &Xl[r * MM_BK + swz(r, c) * 8]);
            }
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const int n = wn + p * 16 + lane % 8 + 8 * (lane / 16), c = kk * 2 + (lane / 8) % 2;
                uint32_t r4[4];
                ldsm_x4(r4, &Wq[n * MM_BK + swz(n, c) * 8]);
                bq[2 * p][0] = r4[0];
                bq[2 * p][1] = r4[1];
                bq[2 * p + 1][0] = r4[2];
                bq[2 * p + 1][1] = r4[3];
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    mma_bf16(tmp[mi][ni], ah[mi], bq[ni][0], bq[ni][1]);
                    mma_bf16(tmp[mi][ni], al[mi], bq[ni][0], bq[ni][1]);
                }
        }
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int r = wm + mi * 16 + g, c = wn + ni * 8 + 2 * c4;
                const float s0 = Ssc[c], s1 = Ssc[c + 1], b0 = Sbi[c], b1 = Sbi[c + 1];
                const float xa = Xsum[r], xb = Xsum[r + 8];
                acc[mi][ni][0] += s0 * tmp[mi][ni][0] + b0 * xa;
                acc[mi][ni][1] += s1 * tmp[mi][ni][1] + b1 * xa;
                acc[mi][ni][2] += s0 * tmp[mi][ni][2] + b0 * xb;
                acc[mi][ni][3] += s1 * tmp[mi][ni][3] + b1 * xb;
            }
        __syncthreads();
        if (more) {
            stash();
            __syncthreads();
        }
    }
    float *const y = qm_get<SEGS>(S, seg, [](const qm_seg &o) { return o.y; });
    const int ldy = qm_get<SEGS>(S, seg, [](const qm_seg &o) { return o.ldy; });
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int yr = yrow[wm + mi * 16 + g + 8 * h];
            if (yr < 0) continue;
            float *yp = y + (size_t)yr * ldy;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int n = n0 + wn + ni * 8 + 2 * c4;
                if (n < N) yp[n] = acc[mi][ni][2 * h];
                if (n + 1 < N) yp[n + 1] = acc[mi][ni][2 * h + 1];
            }
        }
}

static int qmatmul_launch(const struct qm_seg *seg, int nseg, const float *x, int ldx, const int *xmap, int xdiv,
                          const int *ymap, int M, const int *counts, const int *offs, int maxrows, void *stream) {
    const int rows = counts ? maxrows : M;
    if (rows <= 0) return 0;
    qm_segs S;
    const int tiles = qm_table(seg, nseg, MM_BN, &S);
    const struct dqt W = seg[0].W;
    if (!tiles || W.cols % MM_BK || ldx % 4) return (int)cudaErrorInvalidValue;
    dim3 grid(tiles, CEIL_DIV(rows, MM_BM), counts ? (W.n_mat > 0 ? W.n_mat : 1) : 1);
    if (grid.y > 65535) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
#define MM_ARGS <<<grid, MM_THREADS, 0, st>>>(S, x, ldx, xmap, xdiv, ymap, M, counts, offs)
    if (W.bits == 4 && nseg > 1) qmatmul_kernel<4, true> MM_ARGS;
    else if (W.bits == 4) qmatmul_kernel<4, false> MM_ARGS;
    else if (W.bits == 8 && nseg > 1) qmatmul_kernel<8, true> MM_ARGS;
    else if (W.bits == 8) qmatmul_kernel<8, false> MM_ARGS;
    else return (int)cudaErrorInvalidValue;
#undef MM_ARGS
    return launch_status();
}

extern "C" int k_qmatmul(struct dqt W, const float *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                         const int *ymap, int M, const int *counts, const int *offs, int maxrows, void *stream) {
    const struct qm_seg seg = {W, y, ldy};
    return qmatmul_launch(&seg, 1, x, ldx, xmap, xdiv, ymap, M, counts, offs, maxrows, stream);
}

extern "C" int k_qmatmul_segs(const struct qm_seg *segs, int n, const float *x, int ldx, int M, void *stream) {
    return qmatmul_launch(segs, n, x, ldx, NULL, 1, NULL, M, NULL, NULL, 0, stream);
}

// CALLA_QB_BLOCKS (k_set_qb_blocks): 2 (default) the 3-stage form at two blocks an SM, 1 the
// 4-stage form at one (qmatmul_bf16.cuh).
static int g_qb_blocks = 2;
extern "C" void k_set_qb_blocks(int n) { g_qb_blocks = n == 1 ? 1 : 2; }
// CALLA_QB=mma (k_set_qb_wgmma(0)): the products on mma.sync instead of wgmma (A/B).
static int g_qb_wg = 1;
extern "C" void k_set_qb_wgmma(int on) { g_qb_wg = on && k_has_sm90a(); }

template <int BITS, int STAGES, bool GLU, bool WG, bool SEGS>
static int launch_qmatmul_bf16_form(dim3 grid, cudaStream_t st, const qm_segs &S, const uint16_t *x, int ldx,
                                    const int *xmap, int xdiv, const int *ymap, int M, const int *counts,
                                    const int *offs, const float *gate, uint16_t *yb) {
    static int attr_set;   // once per process and form (idempotent, so a race is harmless)
    const size_t smem = QB_SMEM<BITS, STAGES, WG>;
    if (!attr_set) {
        const cudaError_t e = cudaFuncSetAttribute(qmatmul_bf16_kernel<BITS, STAGES, GLU, WG, SEGS>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        attr_set = 1;
    }
    qmatmul_bf16_kernel<BITS, STAGES, GLU, WG, SEGS>
        <<<grid, QB_THREADS, smem, st>>>(S, x, ldx, xmap, xdiv, ymap, M, counts, offs, gate, yb);
    return launch_status();
}

template <int BITS, int STAGES, bool GLU, bool SEGS>
static int launch_qmatmul_bf16(dim3 grid, cudaStream_t st, const qm_segs &S, const uint16_t *x, int ldx,
                               const int *xmap, int xdiv, const int *ymap, int M, const int *counts, const int *offs,
                               const float *gate, uint16_t *yb) {
    if (g_qb_wg && k_has_sm90a())
        return launch_qmatmul_bf16_form<BITS, STAGES, GLU, true, SEGS>(grid, st, S, x, ldx, xmap, xdiv, ymap, M,
                                                                       counts, offs, gate, yb);
    return launch_qmatmul_bf16_form<BITS, STAGES, GLU, false, SEGS>(grid, st, S, x, ldx, xmap, xdiv, ymap, M, counts,
                                                                    offs, gate, yb);
}

// Both launchers: y = W x (fp32) per segment, or with gate != NULL (one segment) yb = bf16(silu(gate)
// (W x)) (the GLU form). SEGS: the kernels' segment lookup (more than one segment).
template <bool GLU, bool SEGS>
static int qmatmul_bf16_form(const struct qm_seg *seg, int nseg, const uint16_t *x, int ldx, const int *xmap,
                             int xdiv, const int *ymap, int M, const int *counts, const int *offs, int maxrows,
                             const float *gate, uint16_t *yb, void *stream) {
    const int rows = counts ? maxrows : M;
    if (rows <= 0) return 0;
    qm_segs S;
    const int tiles = qm_table(seg, nseg, QB_BN, &S);
    const struct dqt W = seg[0].W;
    if (!tiles || W.cols % QB_BK || ldx % 8 || (uintptr_t)x % 16) return (int)cudaErrorInvalidValue;
    for (int i = 0; i < nseg; i++)
        if ((uintptr_t)seg[i].W.w % 16) return (int)cudaErrorInvalidValue;
    dim3 grid(tiles, CEIL_DIV(rows, QB_BM), counts ? (W.n_mat > 0 ? W.n_mat : 1) : 1);
    if (grid.y > 65535) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
#define QB_ARGS grid, st, S, x, ldx, xmap, xdiv, ymap, M, counts, offs, gate, yb
    if (W.bits == 4)
        return g_qb_blocks == 2 ? launch_qmatmul_bf16<4, 3, GLU, SEGS>(QB_ARGS)
                                : launch_qmatmul_bf16<4, 4, GLU, SEGS>(QB_ARGS);
    if (W.bits == 8)
        return g_qb_blocks == 2 ? launch_qmatmul_bf16<8, 3, GLU, SEGS>(QB_ARGS)
                                : launch_qmatmul_bf16<8, 4, GLU, SEGS>(QB_ARGS);
#undef QB_ARGS
    return (int)cudaErrorInvalidValue;
}

extern "C" int k_qmatmul_bf16(struct dqt W, const uint16_t *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                              const int *ymap, int M, const int *counts, const int *offs, int maxrows, void *stream) {
    const struct qm_seg seg = {W, y, ldy};
    return qmatmul_bf16_form<false, false>(&seg, 1, x, ldx, xmap, xdiv, ymap, M, counts, offs, maxrows, NULL, NULL,
                                           stream);
}

extern "C" int k_qmatmul_bf16_segs(const struct qm_seg *segs, int n, const uint16_t *x, int ldx, int M,
                                   void *stream) {
    if (n == 1)   // the single-product kernel
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
