// flash.cuh: the prefill FlashAttention kernel of attention.cu (k_flash_attention), in a header of its
// own so that tools/sim/flash_sim.cpp can run the same device code on the host (make flash-sim).
#pragma once

#include "mma.cuh"

// A block takes 128 query rows that share one kv head: TPB = 128 / G consecutive tokens x the G
// heads of the group, so each K/V tile read from memory serves G heads. 8 warps of 16 rows; keys
// in tiles of 64 at absolute positions (tile j = keys 64 j .. 64 j + 63 from position 0), so a
// query's arithmetic does not depend on how the prompt was cut into chunks nor on which block or
// row it lands in (fully masked trailing tiles leave its state exactly unchanged): the session
// cache's continued prefill matches one prefill bit for bit.
// Precision (template EXACT): K and V are bf16 already (the cache). EXACT (the verification mode):
// Q and the probabilities P go to the tensor cores as two bf16 terms each (hi + lo), so scores and
// outputs carry fp32-level error (~1e-6), not bf16's. Fast (the default): Q and P rounded
// once to bf16 (nearest even), one mma per product, fp32 accumulation, as FlashAttention, MLX and
// llama.cpp do; the softmax statistics (max, sum, rescaling) stay fp32 in both.
// Shared memory, bf16, loaded with cp.async:
//   EXACT: Q hi and lo [128][D], K [2][64][D], V [64][D] (224 KB at D = 256, the most an SM has):
//          K(j + 1) flies under all of tile j, V(j + 1) only under tile j + 1's scores and softmax.
//   fast:  Q [128][D], K [2][64][D], V [2][64][D] (192 KB at D = 256): the 64 KB of Q lo buy a
//          second V stage, so K(j + 1) and V(j + 1) both fly under all of tile j, and one barrier
//          a tile goes. Two blocks an SM would need <= 128 registers a thread, but the output
//          accumulator alone is 16 x D / 32 = 128 floats a thread at D = 256: one block of 8 warps.
// tools/sim/flash_sim.cpp runs this code on the host (make flash-sim), with the copies landing at once
// or as late as their wait_group allows.
enum { FA_BM = 128, FA_BN = 64, FA_THREADS = 256 };

#ifndef FA_HOST_SIM
#define FA_DYNAMIC_SMEM(name) extern __shared__ __align__(16) uint16_t name[]
#endif

static size_t flash_smem_bytes(int D, bool exact) {
    return (size_t)(exact ? 2 * FA_BM + 3 * FA_BN : FA_BM + 4 * FA_BN) * D * sizeof(uint16_t);
}

// ---- pieces shared with the wgmma kernel (flash_wg.cuh) ----------------------------------------------
// A thread holds two rows of its warp's 16, a (row g) and b (g + 8), and its scores and outputs in
// mma.m16n8's C layout, flat: x[4 n + e] is row a (e < 2) or b, column 8 n + 2 c4 + (e & 1).

// The 8 values of 16-byte chunk c of query row (token t, head h) as floats; zeros past the chunk.
template <int D>
static __device__ __forceinline__ void fa_q_load(const float *q, int t, int h, int c, int T, int n_heads, float v[8]) {
    for (int e = 0; e < 8; e++) v[e] = 0;
    if (t < T) {
        const float4 *src = (const float4 *)(q + ((size_t)t * n_heads + h) * D + c * 8);
        const float4 a = src[0], b = src[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
}

struct fa_rows { // the online softmax's running max m and sum l (of the fp32 P) of rows a and b
    float m_a, m_b, l_a, l_b;
};

// The online softmax of the tile whose first key is key0, in base 2: scores scaled by sl2, keys past
// a row's causal limit -inf whatever the key holds; updates r, leaves P (fp32) in s, and returns in
// corr_a / corr_b the factors the output accumulated so far is to be rescaled by.
template <int N>
static __device__ __forceinline__ void fa_softmax(float (&s)[N], int key0, int c4, int lim_a, int lim_b, float sl2,
                                                  fa_rows &r, float &corr_a, float &corr_b) {
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int e = i % 4, key = key0 + (i / 4) * 8 + 2 * c4 + (e & 1);
        const float v = key <= (e < 2 ? lim_a : lim_b) ? s[i] * sl2 : -INFINITY;
        s[i] = v;
        if (e < 2)
            mx_a = fmaxf(mx_a, v);
        else
            mx_b = fmaxf(mx_b, v);
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    const float mn_a = fmaxf(r.m_a, mx_a), mn_b = fmaxf(r.m_b, mx_b); // finite: key 0 is in every row
    corr_a = exp2f(r.m_a - mn_a);
    corr_b = exp2f(r.m_b - mn_b);
    r.m_a = mn_a;
    r.m_b = mn_b;
    float rs_a = 0, rs_b = 0;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const float p = exp2f(s[i] - (i % 4 < 2 ? mn_a : mn_b));
        s[i] = p;
        if (i % 4 < 2)
            rs_a += p;
        else
            rs_b += p;
    }
    r.l_a = r.l_a * corr_a + rs_a;
    r.l_b = r.l_b * corr_b + rs_b;
}

// acc *= corr per row, skipped where no row of the warp moved its max (a product by exactly 1
// changes nothing; once the maxima settle, most tiles of a long row skip its D / 2 multiplies).
template <int N> static __device__ __forceinline__ void fa_rescale(float (&acc)[N], float corr_a, float corr_b) {
    if (!__any_sync(0xffffffffu, corr_a != 1.0f || corr_b != 1.0f)) return;
#pragma unroll
    for (int i = 0; i < N; i++) acc[i] *= i % 4 < 2 ? corr_a : corr_b;
}

// The output of rows a (block row ra) and b (ra + 8): acc / l times the gate's sigmoid, rows past
// the chunk not written. OT float: o in fp32; OT uint16_t (the fast mode): only o's bf16 copy,
// o_proj's input, each value rounded by f2bf16 as k_to_bf16 rounds it, so bit-identical to the fp32
// store then k_to_bf16 without their round trip (a compile-time choice, so the fp32 form's code is
// not burdened by it).
template <int D, typename OT>
static __device__ __forceinline__ void fa_store(const float (&acc)[D / 2], fa_rows r, OT *o, const float *qg, int ra,
                                                int t0, int G, int kvh, int T, int n_heads, int c4) {
    static_assert(sizeof(OT) == 4 || sizeof(OT) == 2, "fp32 or bf16 output");
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        r.l_a += __shfl_xor_sync(0xffffffffu, r.l_a, off);
        r.l_b += __shfl_xor_sync(0xffffffffu, r.l_b, off);
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = ra + 8 * half, t = t0 + row / G;
        if (t >= T) continue;
        const int h = kvh * G + row % G;
        const float inv = 1.0f / (half ? r.l_b : r.l_a);
        OT *dst = o + ((size_t)t * n_heads + h) * D;
        const float *gate = qg + ((size_t)t * n_heads + h) * 2 * D + D;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) {
            const int d = dn * 8 + 2 * c4;
            if constexpr (sizeof(OT) == 4) {
                dst[d] = acc[4 * dn + 2 * half] * inv * sigmoid_f(gate[d]);
                dst[d + 1] = acc[4 * dn + 2 * half + 1] * inv * sigmoid_f(gate[d + 1]);
            } else { // columns d, d + 1 in one 4-byte store (d even; the caller checks ob's alignment)
                const float v0 = acc[4 * dn + 2 * half] * inv * sigmoid_f(gate[d]);
                const float v1 = acc[4 * dn + 2 * half + 1] * inv * sigmoid_f(gate[d + 1]);
                *(uint32_t *)(dst + d) = pack2(f2bf16(v0), f2bf16(v1));
            }
        }
    }
}

// OT: the output's type, float or uint16_t (bf16, the fast mode only: fa_store).
template <int D, bool EXACT, typename OT>
static __global__ void __launch_bounds__(FA_THREADS, 1)
    flash_attention_kernel(const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, OT *o, int T,
                           int p0, int cap, int n_heads, int n_kv) {
    static_assert(!EXACT || sizeof(OT) == 4, "the exact mode stores fp32 (the exact o_proj reads it)");
    constexpr int CH = D / 8; // 16-byte chunks per row
    FA_DYNAMIC_SMEM(fa_smem);
    // Ql: EXACT only; Vs: one stage (EXACT) or two
    uint16_t *Qh = fa_smem, *Ql = Qh + FA_BM * D, *Ks = Qh + (EXACT ? 2 : 1) * FA_BM * D, *Vs = Ks + 2 * FA_BN * D;
    const int G = n_heads / n_kv, TPB = FA_BM / G;
    const int kvh = blockIdx.y, t0 = (gridDim.x - 1 - blockIdx.x) * TPB; // longest rows first
    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE, g = lane / 4, c4 = lane % 4;
    const int n_keys = p0 + min(T - 1, t0 + TPB - 1) + 1; // keys this block needs
    const int n_tiles = CEIL_DIV(n_keys, FA_BN);
    const uint16_t *kbase = kc + (size_t)kvh * cap * D, *vbase = vc + (size_t)kvh * cap * D;
    auto load_tile = [&](uint16_t *dst, const uint16_t *src, int j) { // keys past n_keys: zeros
        for (int i = tid; i < FA_BN * CH; i += FA_THREADS) {
            const int r = i / CH, c = i % CH, key = j * FA_BN + r;
            const bool ok = key < n_keys;
            cp_async16(dst + r * D + swz(r, c) * 8, src + (size_t)(ok ? key : 0) * D + c * 8, ok ? 16 : 0);
        }
    };
    load_tile(Ks, kbase, 0);
    cp_async_commit();
    load_tile(Vs, vbase, 0);
    cp_async_commit();
    for (int i = tid; i < FA_BM * CH; i += FA_THREADS) { // Q rows -> bf16 (EXACT: hi and lo)
        const int r = i / CH, c = i % CH;
        float v[8];
        fa_q_load<D>(q, t0 + r / G, kvh * G + r % G, c, T, n_heads, v);
        const int at = r * D + swz(r, c) * 8;
        if constexpr (EXACT) {
            uint16_t hi[8], lo[8];
#pragma unroll
            for (int e = 0; e < 8; e++) split_bf16(v[e], &hi[e], &lo[e]);
            *(uint4 *)(Qh + at) =
                make_uint4(pack2(hi[0], hi[1]), pack2(hi[2], hi[3]), pack2(hi[4], hi[5]), pack2(hi[6], hi[7]));
            *(uint4 *)(Ql + at) =
                make_uint4(pack2(lo[0], lo[1]), pack2(lo[2], lo[3]), pack2(lo[4], lo[5]), pack2(lo[6], lo[7]));
        } else {
            *(uint4 *)(Qh + at) =
                make_uint4(bf16x2_rn(v[0], v[1]), bf16x2_rn(v[2], v[3]), bf16x2_rn(v[4], v[5]), bf16x2_rn(v[6], v[7]));
        }
    }
    // This thread's two rows (g and g + 8 of the warp's 16) and their causal limits; rows past
    // the chunk take the last token's limit (computed, never stored).
    const int ra = warp * 16 + g, rb = ra + 8;
    const int lim_a = p0 + min(T - 1, t0 + ra / G), lim_b = p0 + min(T - 1, t0 + rb / G);
    const float sl2 = rsqrtf((float)D) * 1.4426950408889634f; // 1/sqrt(D) * log2(e)
    float acc[D / 2] = {};                                    // acc[4 dn + e]: output columns 8 dn + 2 c4 + (e & 1)
    fa_rows rows = {-INFINITY, -INFINITY, 0, 0};
    for (int j = 0; j < n_tiles; j++) {
        const bool more = j + 1 < n_tiles;
        const uint16_t *Kt = Ks + (j & 1) * FA_BN * D, *Vt = EXACT ? Vs : Vs + (j & 1) * FA_BN * D;
        if constexpr (EXACT) {
            if (more) {
                load_tile(Ks + ((j + 1) & 1) * FA_BN * D, kbase, j + 1);
                cp_async_commit();
                cp_async_wait<2>(); // K(j) landed; V(j) and K(j + 1) may fly
            } else {
                cp_async_wait<1>();
            }
            __syncthreads();
        } else {
            cp_async_wait<1>(); // K(j) landed; V(j) may fly
            __syncthreads();    // ... and every warp is done with tile j - 1's K and V stages
            if (more) {
                load_tile(Ks + ((j + 1) & 1) * FA_BN * D, kbase, j + 1);
                cp_async_commit();
                load_tile(Vs + ((j + 1) & 1) * FA_BN * D, vbase, j + 1);
                cp_async_commit();
            }
        }
        float s[FA_BN / 2] = {};
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t ah[4], al[4];
            const int qr = warp * 16 + lane % 16, qc = ks * 2 + lane / 16;
            ldsm_x4(ah, Qh + qr * D + swz(qr, qc) * 8);
            if constexpr (EXACT) ldsm_x4(al, Ql + qr * D + swz(qr, qc) * 8);
#pragma unroll
            for (int p = 0; p < FA_BN / 16; p++) {
                uint32_t b[4];
                const int kr = p * 16 + lane % 8 + 8 * (lane / 16), kcn = ks * 2 + (lane / 8) % 2;
                ldsm_x4(b, Kt + kr * D + swz(kr, kcn) * 8);
                mma_bf16(&s[8 * p], ah, b[0], b[1]);
                if constexpr (EXACT) mma_bf16(&s[8 * p], al, b[0], b[1]);
                mma_bf16(&s[8 * p + 4], ah, b[2], b[3]);
                if constexpr (EXACT) mma_bf16(&s[8 * p + 4], al, b[2], b[3]);
            }
        }
        float corr_a, corr_b; // fp32 P; the fast mode's products see bf16(P)
        fa_softmax(s, j * FA_BN, c4, lim_a, lim_b, sl2, rows, corr_a, corr_b);
        fa_rescale(acc, corr_a, corr_b);
        if constexpr (EXACT) {
            if (more)
                cp_async_wait<1>(); // V(j) landed; K(j + 1) may fly
            else
                cp_async_wait<0>();
        } else {
            if (more)
                cp_async_wait<2>(); // V(j) landed; K(j + 1) and V(j + 1) may fly
            else
                cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; kk++) {
            uint32_t ph[4], pl[4];
#pragma unroll
            for (int r = 0; r < 4; r++) { // A fragment r: S tile 2 kk + r / 2, elements 2 (r % 2) ..
                const float *sv = &s[4 * (2 * kk + r / 2) + 2 * (r % 2)];
                if constexpr (EXACT) {
                    uint16_t h0, l0, h1, l1;
                    split_bf16(sv[0], &h0, &l0);
                    split_bf16(sv[1], &h1, &l1);
                    ph[r] = pack2(h0, h1);
                    pl[r] = pack2(l0, l1);
                } else {
                    ph[r] = bf16x2_rn(sv[0], sv[1]);
                }
            }
#pragma unroll
            for (int p = 0; p < D / 16; p++) {
                uint32_t b[4];
                const int vr = kk * 16 + lane % 8 + 8 * ((lane / 8) % 2), vcn = p * 2 + lane / 16;
                ldsm_x4_t(b, Vt + vr * D + swz(vr, vcn) * 8);
                mma_bf16(&acc[8 * p], ph, b[0], b[1]);
                if constexpr (EXACT) mma_bf16(&acc[8 * p], pl, b[0], b[1]);
                mma_bf16(&acc[8 * p + 4], ph, b[2], b[3]);
                if constexpr (EXACT) mma_bf16(&acc[8 * p + 4], pl, b[2], b[3]);
            }
        }
        if constexpr (EXACT) {
            __syncthreads(); // every warp is done with K(j) and V(j)
            if (more) {
                load_tile(Vs, vbase, j + 1);
                cp_async_commit();
            }
        } // fast: the barrier at the top of tile j + 1 guards the stages tile j read
    }
    fa_store<D>(acc, rows, o, qg, ra, t0, G, kvh, T, n_heads, c4);
}
