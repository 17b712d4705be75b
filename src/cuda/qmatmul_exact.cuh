// qmatmul_exact.cuh: the exact kernel of qmatmul.cu (fp32 x split into bf16 hi + lo), in a header of
// its own so that tools/sim/qmatmul_sim.cpp can run the same device code on the host (make qmatmul-sim).
// qmatmul.cu's header comment describes it.
#pragma once

#include "qmatmul_bf16.cuh" // the segment table (qm_segs: several products, one launch)

enum { MM_BM = 128, MM_BN = 64, MM_BK = 64, MM_THREADS = 256 };
static_assert(MM_BK == QGROUP, "one quantization group per K step");

// W1, y1, ldy1: the product (SEGS off); S: the products of one dense x (SEGS on; qm_segs in
// qmatmul_bf16.cuh). ADD (SEGS off, k_qmatmul_add): y1 += W x, as the fast kernel's ADD form (one
// thread reads and writes each element: bit-identical to the product into d, then k_add).
template <int BITS, bool SEGS, bool ADD = false>
static __global__ void __launch_bounds__(MM_THREADS)
    qmatmul_kernel(struct dqt W1, const float *x, int ldx, const int *xmap, int xdiv, float *y1, int ldy1,
                   const int *ymap, int M, const int *counts, const int *offs, const qm_segs S) {
    static_assert(!(ADD && SEGS), "the add form: one product");
    constexpr int PER = 32 / BITS, WPT = 16 / PER; // codes per word; words per thread per step
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
    const struct dqt W = qm_matrix<SEGS, MM_BN, BITS>(S, W1, seg, blockIdx.x, &n0);
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, N = W.rows, K = W.cols;
    qm_rows<MM_BM>(r0, cnt, base, xmap, xdiv, ymap, xrow, yrow);
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
        for (int q = 0; q < 4; q++) { // 16-byte chunks of 8 values
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
        sum += __shfl_xor_sync(0xffffffffu, sum, 1); // the other half of the row
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
            qm_b_frags(bq, Wq, wn, kk, lane);
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
    float *y;
    int ldy;
    qm_output<SEGS>(S, seg, y1, ldy1, &y, &ldy);
    qm_store_frags<false, ADD>(acc, yrow, wm, wn, g, c4, n0, N, y, ldy, nullptr, nullptr);
}
