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
#include "mma.cuh"

enum { MM_BM = 128, MM_BN = 64, MM_BK = 64, MM_THREADS = 256 };
static_assert(MM_BK == QGROUP, "one quantization group per K step");

template <int BITS>
static __global__ void __launch_bounds__(MM_THREADS)
    qmatmul_kernel(struct dqt W, const float *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                   const int *ymap, int M, const int *counts, const int *offs) {
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
    const int n0 = blockIdx.x * MM_BN;
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

// ---- fast mode: x already in bf16 (issue 12) ----------------------------------------------------
//
// y[r, n] = sum_g s_g[n] * sum_{k in g} q[n, k] xb[r, k]  +  b_g[n] * sum_{k in g} xb[r, k]
// with xb the bf16 activations (written once by k_to_bf16 or by their producer): one MMA per
// product, fp32 accumulation, the weights exact as in the exact kernel. The sum of x for the bias
// term is taken from the same bf16 tile in shared memory, so the result is the exact product of the
// dequantized weights with the bf16-rounded x, to fp32 rounding (the test checks it against that
// CPU twin at 1e-5, and against the fp32 x within the bf16 rounding bound).
//
// Tile: 128 rows x 128 features, K one group (64) per step; 8 warps as 2 (rows) x 4 (features),
// 64 x 32 each (4 x 4 mma.m16n8k16 per k16). 3-stage cp.async pipeline (16-byte copies straight
// into shared memory): per stage the x tile (128 x 64 bf16, rows of 8 swizzled 16-byte chunks) and
// the raw codes of the 128 weight rows (4/8-bit words, unswizzled). Each step: wait for its stage,
// one barrier, issue the copies two steps ahead, then all threads dequantize the stage's codes once
// into a bf16 tile (swizzled as the x tile; 4-bit codes by LOP3 into 0x4300 | q = 128 + q and one
// exact bf16x2 fma of -128) and take the 128 row sums of x (a thread pair per row); a second
// barrier; then ldmatrix + mma into a per-group accumulator that is folded into the result with the
// group's fp32 scale and bias. Scales and biases are fetched into registers two steps ahead and
// stored to their stage at the end of a step.
// The grid and the grouped (per-expert) form are those of qmatmul_kernel.
enum { QB_BM = 128, QB_BN = 128, QB_BK = 64, QB_THREADS = 256, QB_STAGES = 3 };
static_assert(QB_BK == QGROUP, "one quantization group per K step");

template <int BITS>
struct qb_layout {   // dynamic shared memory, in bytes from its start (every part 16-byte aligned)
    static constexpr int WPR = QB_BK * BITS / 32;                                     // words per row per group
    static constexpr size_t X = 0;                                                    // [STAGES][BM * BK] bf16
    static constexpr size_t WC = X + (size_t)QB_STAGES * QB_BM * QB_BK * 2;           // [STAGES][BN * WPR] u32
    static constexpr size_t WB = WC + (size_t)QB_STAGES * QB_BN * WPR * 4;            // [BN * BK] bf16
    static constexpr size_t SC = WB + (size_t)QB_BN * QB_BK * 2;                      // [STAGES][BN] float
    static constexpr size_t BI = SC + (size_t)QB_STAGES * QB_BN * 4;                  // [STAGES][BN] float
    static constexpr size_t XS = BI + (size_t)QB_STAGES * QB_BN * 4;                  // [BM] float
    static constexpr size_t BYTES = XS + (size_t)QB_BM * 4;
};

// bf16x2 {lo, hi} = {128 + q0, 128 + q1} -> {q0, q1}, exact (an fma of 1 and -128).
static __device__ __forceinline__ uint32_t bf2_minus128(uint32_t v) {
    uint32_t r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(0x3F803F80u), "r"(0xC300C300u));
    return r;
}
static __device__ __forceinline__ uint32_t bf16_of_code(uint32_t q) {   // q < 256: exact in bf16
    return __float_as_uint((float)q) >> 16;
}

template <int BITS>
static __global__ void __launch_bounds__(QB_THREADS, 1)
    qmatmul_bf16_kernel(struct dqt W, const uint16_t *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                        const int *ymap, int M, const int *counts, const int *offs) {
    using L = qb_layout<BITS>;
    constexpr int PER = 32 / BITS, WPR = L::WPR, WCH = WPR / 4;   // codes per word; words, chunks per row
    constexpr int XT = QB_BM * QB_BK, WT = QB_BN * WPR;           // elements of one stage
    extern __shared__ __align__(16) unsigned char qb_smem[];
    uint16_t *const Xt = (uint16_t *)(qb_smem + L::X);
    uint32_t *const Wc = (uint32_t *)(qb_smem + L::WC);
    uint16_t *const Wb = (uint16_t *)(qb_smem + L::WB);
    float *const Sc = (float *)(qb_smem + L::SC), *const Bi = (float *)(qb_smem + L::BI);
    float *const Xsum = (float *)(qb_smem + L::XS);
    __shared__ int xrow[QB_BM], yrow[QB_BM];

    const int e = blockIdx.z;
    int base = 0, cnt = M;
    if (counts) {
        base = offs[e];
        cnt = counts[e];
    }
    const int r0 = blockIdx.y * QB_BM;
    if (r0 >= cnt) return;
    const int n0 = blockIdx.x * QB_BN;
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, N = W.rows, K = W.cols;
    if (tid < QB_BM) {
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
    const int wpr = K / PER, ng = K / QB_BK;
    const bool has_sc = tid < QB_BN && n0 + tid < N;
    const size_t sgrow = has_sc ? (mat * N + n0 + tid) * (size_t)ng : 0;
    __syncthreads();

    // Copies of step kt into stage st (one commit group per call, empty past the end).
    auto load_tile = [&](int kt, int st) {
        if (kt < ng) {
            const int k0 = kt * QB_BK;
            uint16_t *X = Xt + st * XT;
#pragma unroll
            for (int i = 0; i < QB_BM * 8 / QB_THREADS; i++) {   // 4 chunks of 8 x values
                const int id = tid + i * QB_THREADS, r = id / 8, ch = id % 8, xr = xrow[r];
                const uint16_t *src = xr >= 0 ? x + (size_t)xr * ldx + k0 + ch * 8 : x;
                cp_async16(&X[r * QB_BK + swz(r, ch) * 8], src, xr >= 0 ? 16 : 0);
            }
            uint32_t *Wd = Wc + st * WT;
#pragma unroll
            for (int i = 0; i < QB_BN * WCH / QB_THREADS; i++) {   // 1 (4-bit) or 2 (8-bit) chunks of codes
                const int id = tid + i * QB_THREADS, n = id / WCH, ch = id % WCH;
                const bool ok = n0 + n < N;
                const uint32_t *src = ok ? W.w + (mat * N + n0 + n) * (size_t)wpr + (size_t)kt * WPR + ch * 4 : W.w;
                cp_async16(&Wd[n * WPR + ch * 4], src, ok ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    auto load_sb = [&](int kt, float &sv, float &bv) {
        sv = 0;
        bv = 0;
        if (has_sc && kt < ng) {
            sv = bf16f(W.scales[sgrow + kt]);
            bv = bf16f(W.biases[sgrow + kt]);
        }
    };

    load_tile(0, 0);
    load_tile(1, 1);
    if (tid < QB_BN) {
#pragma unroll
        for (int kt = 0; kt < 2; kt++) {
            float sv, bv;
            load_sb(kt, sv, bv);
            Sc[kt * QB_BN + tid] = sv;
            Bi[kt * QB_BN + tid] = bv;
        }
    }

    const int wm = (warp / 4) * 64, wn = (warp % 4) * 32, g = lane / 4, c4 = lane % 4;
    float acc[4][4][4] = {};
    for (int kt = 0; kt < ng; kt++) {
        const int st = kt % QB_STAGES;
        cp_async_wait<QB_STAGES - 2>();   // this thread's copies of step kt have landed
        __syncthreads();                  // everyone's have, and every thread is done with step kt - 1
        load_tile(kt + 2, (kt + 2) % QB_STAGES);
        float nsv, nbv;
        load_sb(kt + 2, nsv, nbv);
        // Dequantize the codes of step kt into Wb (bf16, swizzled), and the row sums of x.
        {
            const uint32_t *Wd = Wc + st * WT;
#pragma unroll
            for (int i = 0; i < QB_BN * 8 / QB_THREADS; i++) {   // 4 chunks of 8 codes
                const int id = tid + i * QB_THREADS, n = id / 8, ch = id % 8;
                uint32_t o[4];
                if constexpr (BITS == 4) {
                    const uint32_t w = Wd[n * WPR + ch];   // codes 8 ch .. 8 ch + 7, code j at bits 4 j
#pragma unroll
                    for (int p = 0; p < 4; p++) {
                        const uint32_t t = w >> (8 * p);
                        o[p] = bf2_minus128((t & 0xFu) | ((t & 0xF0u) << 12) | 0x43004300u);
                    }
                } else {
                    static_assert(BITS == 8, "4 or 8 bits");
                    const uint2 w = *(const uint2 *)&Wd[n * WPR + ch * 2];   // code j at bits 8 (j % 4) of word j / 4
#pragma unroll
                    for (int p = 0; p < 4; p++) {
                        const uint32_t t = (p < 2 ? w.x : w.y) >> (16 * (p % 2));
                        o[p] = bf16_of_code(t & 0xFFu) | (bf16_of_code((t >> 8) & 0xFFu) << 16);
                    }
                }
                *(uint4 *)&Wb[n * QB_BK + swz(n, ch) * 8] = make_uint4(o[0], o[1], o[2], o[3]);
            }
            const uint16_t *X = Xt + st * XT;
            const int r = tid / 2, h = tid % 2;
            float sum = 0;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint4 v = *(const uint4 *)&X[r * QB_BK + swz(r, h * 4 + q) * 8];
                const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int j = 0; j < 4; j++) sum += __uint_as_float(u[j] << 16) + __uint_as_float(u[j] & 0xffff0000u);
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);   // the other half of the row
            if (!h) Xsum[r] = sum;
        }
        __syncthreads();
        const uint16_t *X = Xt + st * XT;
        float tmp[4][4][4];
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int j = 0; j < 4; j++) tmp[mi][ni][j] = 0;
#pragma unroll
        for (int kk = 0; kk < QB_BK / 16; kk++) {
            uint32_t bq[4][2];
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const int n = wn + p * 16 + lane % 8 + 8 * (lane / 16), c = kk * 2 + (lane / 8) % 2;
                uint32_t r4[4];
                ldsm_x4(r4, &Wb[n * QB_BK + swz(n, c) * 8]);
                bq[2 * p][0] = r4[0];
                bq[2 * p][1] = r4[1];
                bq[2 * p + 1][0] = r4[2];
                bq[2 * p + 1][1] = r4[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const int r = wm + mi * 16 + lane % 16, c = kk * 2 + lane / 16;
                uint32_t a[4];
                ldsm_x4(a, &X[r * QB_BK + swz(r, c) * 8]);
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma_bf16(tmp[mi][ni], a, bq[ni][0], bq[ni][1]);
            }
        }
        const float *S = Sc + st * QB_BN, *B = Bi + st * QB_BN;
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const int c = wn + ni * 8 + 2 * c4;
            const float2 s2 = *(const float2 *)&S[c], b2 = *(const float2 *)&B[c];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const int r = wm + mi * 16 + g;
                const float xa = Xsum[r], xb = Xsum[r + 8];
                acc[mi][ni][0] += s2.x * tmp[mi][ni][0] + b2.x * xa;
                acc[mi][ni][1] += s2.y * tmp[mi][ni][1] + b2.y * xa;
                acc[mi][ni][2] += s2.x * tmp[mi][ni][2] + b2.x * xb;
                acc[mi][ni][3] += s2.y * tmp[mi][ni][3] + b2.y * xb;
            }
        }
        if (tid < QB_BN) {   // stage (kt + 2) % 3 was last read in step kt - 1
            Sc[((kt + 2) % QB_STAGES) * QB_BN + tid] = nsv;
            Bi[((kt + 2) % QB_STAGES) * QB_BN + tid] = nbv;
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
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

template <int BITS>
static int launch_qmatmul_bf16(dim3 grid, cudaStream_t st, struct dqt W, const uint16_t *x, int ldx,
                               const int *xmap, int xdiv, float *y, int ldy, const int *ymap, int M,
                               const int *counts, const int *offs) {
    static int attr_set;   // once per process and bit width (idempotent, so a race is harmless)
    const size_t smem = qb_layout<BITS>::BYTES;
    if (!attr_set) {
        const cudaError_t e =
            cudaFuncSetAttribute(qmatmul_bf16_kernel<BITS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        attr_set = 1;
    }
    qmatmul_bf16_kernel<BITS><<<grid, QB_THREADS, smem, st>>>(W, x, ldx, xmap, xdiv, y, ldy, ymap, M, counts, offs);
    return launch_status();
}

extern "C" int k_qmatmul_bf16(struct dqt W, const uint16_t *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                              const int *ymap, int M, const int *counts, const int *offs, int maxrows, void *stream) {
    const int rows = counts ? maxrows : M;
    if (rows <= 0) return 0;
    if (W.cols % QB_BK || ldx % 8 || (uintptr_t)x % 16 || (uintptr_t)W.w % 16) return (int)cudaErrorInvalidValue;
    dim3 grid(CEIL_DIV(W.rows, QB_BN), CEIL_DIV(rows, QB_BM), counts ? (W.n_mat > 0 ? W.n_mat : 1) : 1);
    if (grid.y > 65535) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    if (W.bits == 4) return launch_qmatmul_bf16<4>(grid, st, W, x, ldx, xmap, xdiv, y, ldy, ymap, M, counts, offs);
    if (W.bits == 8) return launch_qmatmul_bf16<8>(grid, st, W, x, ldx, xmap, xdiv, y, ldy, ymap, M, counts, offs);
    return (int)cudaErrorInvalidValue;
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
