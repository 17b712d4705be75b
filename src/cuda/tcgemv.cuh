// tcgemv.cuh: the tensor-core GEMV building block for 4-bit MLX weights (batch-1 decode).
//
// y[n] = sum_g s_ng * sum_{k in g} q_nk x_k + b_ng * sum_{k in g} x_k, groups of 64 inputs. The
// codes go to the tensor cores as bf16 (128 + q) (one LOP3 per two codes, no conversion or
// subtraction), x as bf16 (round to nearest even), one mma.m16n8k16 per 16 rows x 16 inputs with
// fp32 accumulation; each of the 4 groups of a 256-input super-step gets its own column of the
// accumulator (B carries each group's x in its own column, zeros elsewhere), so 16 mma steps
// accumulate 4 groups at once and the scale / bias epilogue runs once per super-step on distinct
// (row, group) pairs in every lane: acc += s (d - 128 sum bf16(x)) + b sum(x).
// The register / shared-memory layout is in tcgemv_layout.h (plain C, shared with the host
// emulation of tests/gpu/test_tcgemv.c).
//
// Per lane and super-step (128 codes a lane: 16 rows x 256 inputs / 32 lanes = 64 bytes of codes),
// the loop body of the K % 256 == 0 path as compiled (sm_90a, nvcc 13.1; 339 SASS instructions per
// two super-steps, i.e. ~42 per 16 bytes of codes, 1.32 per code; rows_dot: ~3.5):
//   16 HMMA.16816.F32.BF16
//   64 LOP3 + 48 SHF for the A fragments: per 32-bit word of 8 codes 3 shifts (4, 8, 12) and 4
//      LOP3 (w & 0x000F000F) | 0x43004300 (one LOP3 with the constants in registers: written in C
//      the two immediates cost a second LOP3), no HADD2 / HFMA2 (the 128 is folded into the group
//      correction), no SHFL, no PRMT
//   6 LDG (4 LDG.128 codes, 2 LDG.32 scale / bias pairs), 9 LDS.128 (8 B, each for two mma steps,
//      1 group sums), ~20 for the epilogue (2 FSEL, 2 FADD, 4 FFMA, 4 bf16 -> f32) and addresses.
// The floor of this code format is 7 ALU + 1 HMMA per 8 codes (4 A registers per word, each one
// LOP3, three of them after a shift): the rest is ~0.3 per code.
// Loads: a quad's 4 lanes read 64 contiguous bytes of one row per LDG.128 (two full sectors); the
// warp reads 128-byte lines of 16 rows a super-step; the next super-step's codes, scales and biases
// are loaded before the current one is used (register double buffering: 64 bytes of codes a lane
// in flight). Rows past R are clamped to R - 1 (the caller skips their stores); a K that is not a
// multiple of 256 ends in a partial super-step: its missing groups load clamped codes (finite
// (128 + q)) against zero x in B and zero scale / bias, contributing exactly 0.
#pragma once

#include "common.cuh"
#include "tcgemv_layout.h"

// Dropping into gemv.cu's dv_kernel in place of rows_dot: stage with tc_stage_x_by (the
// lambda form of tc_stage_x) reading its swizzled fp32 xs (get8(u, v): x4[swz(2u)], x4[swz(2u + 1)]) into a
// tc_smem_bytes(K) area, then per 16-row task tc_rows16(W.w, W.scales, W.biases, W.rows, K, n0, sm)
// and the epilogue by the lanes with lane % 2 == 0 on row n0 + tc_lane_row(lane) (< R).
// Alignment: codes 16-byte aligned rows (K / 2 bytes, K % 64 == 0), scales / biases 4-byte aligned
// (the K % 256 == 0 path loads them by pairs).

// One unit of the staging (inputs 8u .. 8u+7, values v): their bf16 codes in tc's layout, and the
// group's (sum, 128 sum bf16) by the 8 aligned lanes holding its units. Called by whole warps.
static __device__ __forceinline__ void tc_stage_unit(int u, const float (&v)[8], int K, unsigned char *sm) {
    uint4 *xb = (uint4 *)sm;
    float2 *xs = (float2 *)(sm + tc_xs_byte(K));
    uint32_t h[8];
    float sf = 0.0f, sb = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        h[j] = f2bf16(v[j]);
        sf += v[j];
        sb += bf16f((uint16_t)h[j]);
    }
    // position j holds input tc_pack_order(j): words (x0,x4) (x1,x5) (x2,x6) (x3,x7)
    xb[tc_xb_chunk(u)] = make_uint4(h[0] | h[4] << 16, h[1] | h[5] << 16, h[2] | h[6] << 16, h[3] | h[7] << 16);
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) { // the 8 chunks of a group are 8 aligned lanes
        sf += __shfl_xor_sync(0xffffffffu, sf, o);
        sb += __shfl_xor_sync(0xffffffffu, sb, o);
    }
    if ((u & 7) == 0) xs[u >> 3] = make_float2(sf, 128.0f * sb);
}

// The end of a staging: the zero chunk (thread tid < 4 of the staging threads), then
// __syncthreads() by the whole block.
static __device__ __forceinline__ void tc_stage_close(int K, unsigned char *sm, int tid) {
    if (tid >= 0 && tid < 4) ((uint4 *)sm)[tc_zero_chunk(K) + tid] = make_uint4(0, 0, 0, 0);
    __syncthreads();
}

// Stage the input for tc_rows16, by threads tid of nt (by default every thread of the block; nt and
// the first thread a multiple of 32: whole warps), then __syncthreads() by the whole block. get8(u, v)
// writes inputs 8u .. 8u+7 (u < K / 8) into float v[8]. sm: at least tc_smem_bytes(K) bytes of shared
// memory, 16-byte aligned.
template <typename GET8>
static __device__ __forceinline__ void tc_stage_x_by(GET8 get8, int K, unsigned char *sm, int tid = threadIdx.x,
                                                     int nt = blockDim.x) {
    const int nc = 32 * tc_nsuper(K), kc = K / 8;
    for (int base = 0; tid >= 0 && base < nc; base += nt) {
        const int u = base + tid;
        if (u < nc) { // warp-uniform: nc and base are multiples of 32
            float v[8];
            if (u < kc)
                get8(u, v);
            else
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = 0.0f;
            tc_stage_unit(u, v, K, sm);
        }
    }
    tc_stage_close(K, sm, tid);
}

// Plain fp32 input in global or shared memory (16-byte aligned), by threads tid of nt as above.
static __device__ __forceinline__ void tc_stage_x(const float *x, int K, unsigned char *sm, int tid = threadIdx.x,
                                                  int nt = blockDim.x) {
    tc_stage_x_by(
        [&](int u, float(&v)[8]) {
            const float4 a = ((const float4 *)x)[2 * u], b = ((const float4 *)x)[2 * u + 1];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        },
        K, sm, tid, nt);
}

// c = a b (+ c when ACC), m16n8k16, bf16 inputs, fp32 accumulate.
template <bool ACC>
static __device__ __forceinline__ void tc_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
#ifdef TC_HOST_SIM // tools/sim/tcgemv_sim.cpp: the warp on 32 host threads
    tc_sim_mma(c, a0, a1, a2, a3, b0, b1, ACC);
#else
    if (ACC)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%10,%10,%10,%10};\n"
            : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
#endif
}

static __device__ __forceinline__ uint32_t tc_word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// What one super-step loads per lane: the two 16-byte chunks (halves) of rows g and g + 8, the
// scales and biases of its epilogue row and groups (bf16 bits).
struct tc_stage {
    uint4 ga[2], gb[2];
    uint32_t s0, s1, b0, b1;
};

// The row (of the warp's 16) whose result this lane holds after tc_rows16: g + 8 (t / 2); lanes
// with t even store it.
static __device__ __forceinline__ int tc_lane_row(int lane) {
    return lane / 4 + 8 * ((lane % 4) >> 1);
}

// tc_a_reg in one LOP3: (w & 0x000F000F) | 0x43004300 after the shift. (Written in C, the two
// 32-bit immediates make two LOP3: a LOP3 encodes one immediate; here the constants are registers.)
static __device__ __forceinline__ uint32_t tc_a_dev(uint32_t w, int e, int hi) {
    const uint32_t v = w >> (4 * (2 * e + hi)), m = 0x000F000Fu, x = 0x43004300u;
    uint32_t r;
#ifdef TC_HOST_SIM
    r = (v & m) | x;
#else
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(v), "r"(m), "r"(x)); // (a & b) | c
#endif
    return r;
}

// The 16 mma steps of one super-step (the codes of st; B from bx0 / bx1, 16 i per word) into c.
static __device__ __forceinline__ void tc_mma16(const tc_stage &st, const unsigned char *bx0, const unsigned char *bx1,
                                                float (&c)[4]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 xb = *(const uint4 *)((h ? bx1 : bx0) + 16 * i);
            const uint32_t wa = tc_word(st.ga[h], i), wb = tc_word(st.gb[h], i);
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t a0 = tc_a_dev(wa, e, 0), a1 = tc_a_dev(wb, e, 0);
                const uint32_t a2 = tc_a_dev(wa, e, 1), a3 = tc_a_dev(wb, e, 1);
                const uint32_t b0 = e ? xb.z : xb.x, b1 = e ? xb.w : xb.y;
                if (h == 0 && i == 0 && e == 0)
                    tc_mma<false>(c, a0, a1, a2, a3, b0, b1);
                else
                    tc_mma<true>(c, a0, a1, a2, a3, b0, b1);
            }
        }
    }
}

// acc += s (d - 128 sum bf16(x)) + b sum(x) for this lane's two (row, group) pairs; xs = (sum x,
// 128 sum bf16 x) of the two groups; s0 / b0 ... bf16 bits in the high half of a word.
static __device__ __forceinline__ float tc_epilogue(float acc, const float (&c)[4], int t, float4 xs, uint32_t s0,
                                                    uint32_t s1, uint32_t b0, uint32_t b1) {
    const float d0 = t < 2 ? c[0] : c[2], d1 = t < 2 ? c[1] : c[3];
    acc = fmaf(__uint_as_float(s0), d0 - xs.y, fmaf(__uint_as_float(b0), xs.x, acc));
    return fmaf(__uint_as_float(s1), d1 - xs.w, fmaf(__uint_as_float(b1), xs.z, acc));
}

// Rows n0 .. n0 + 15 of a 4-bit matrix (codes w [R][K / 8] words, scales / biases [R][K / 64]
// bf16) times the staged input (tc_stage_x, sm). Returns row n0 + tc_lane_row(lane)'s product in
// every lane (the lanes t = 0, 1 and t = 2, 3 of a quad agree). Rows >= R are computed on row
// R - 1 (skip their stores). TAIL = false needs K % 256 == 0 (every model shape: no guard, scales
// by pairs in one 32-bit load); TAIL = true takes any multiple of 64. Every lane must call it.
// TAIL = false may take super-steps S0 .. S1 - 1 only (the inputs 256 S0 .. 256 S1 - 1): the sum of
// the parts of a split is the product (a block's warps splitting K, each part loaded at once).
template <bool TAIL>
static __device__ __forceinline__ float tc_rows16(const uint32_t *__restrict__ w, const uint16_t *__restrict__ sc,
                                                  const uint16_t *__restrict__ bi, int R, int K, int n0,
                                                  const unsigned char *sm, int S0 = 0, int S1 = -1) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    const int rowbytes = K / 2, ng = K / 64, lim = rowbytes - 16;
    if (TAIL || S1 < 0) S0 = 0, S1 = tc_nsuper(K);
    const int nS = S1 - S0;
    const int rA = min(n0 + g, R - 1), rB = min(n0 + g + 8, R - 1), rE = t < 2 ? rA : rB;
    const int ge = 2 * (t & 1); // first group of this lane's epilogue within a super-step
    // running pointers (advanced a super-step at a time)
    const int inc0 = tc_b_real(g, t, 0) ? TC_B_STEP : 0, inc1 = tc_b_real(g, t, 1) ? TC_B_STEP : 0;
    const unsigned char *pA = (const unsigned char *)w + (size_t)rA * rowbytes + 16 * t + 128 * S0;
    const unsigned char *pB = (const unsigned char *)w + (size_t)rB * rowbytes + 16 * t + 128 * S0;
    const uint16_t *sp = sc + (size_t)rE * ng + ge + 4 * S0, *bp = bi + (size_t)rE * ng + ge + 4 * S0;
    const unsigned char *bx0 = sm + tc_b_byte(K, g, t, 0) + S0 * inc0, *bx1 = sm + tc_b_byte(K, g, t, 1) + S0 * inc1;
    const float4 *xs4 = (const float4 *)(sm + tc_xs_byte(K)) + (t & 1) + 2 * S0; // (sum, 128 sum bf16) x 2 groups

    // Loads of super-step S + j (j = 0, 1, 2 relative to the pointers at S).
    auto load = [&](tc_stage &st, int j, int S) {
        if (!TAIL) {
            st.ga[0] = __ldg((const uint4 *)(pA + 128 * j));
            st.gb[0] = __ldg((const uint4 *)(pB + 128 * j));
            st.ga[1] = __ldg((const uint4 *)(pA + 128 * j + 64));
            st.gb[1] = __ldg((const uint4 *)(pB + 128 * j + 64));
            const uint32_t s01 = __ldg((const unsigned int *)(sp + 4 * j)),
                           b01 = __ldg((const unsigned int *)(bp + 4 * j));
            st.s0 = s01 << 16, st.s1 = s01 & 0xffff0000u, st.b0 = b01 << 16, st.b1 = b01 & 0xffff0000u;
        } else {
            // pA / pB stay at super-step 0 (+ 16 t) in the tail path; the offsets are clamped into the row
            const int SS = S + j;
            const int o0 = min(tc_code_byte(SS, 0, t), lim) - 16 * t, o1 = min(tc_code_byte(SS, 1, t), lim) - 16 * t;
            st.ga[0] = __ldg((const uint4 *)(pA + o0));
            st.gb[0] = __ldg((const uint4 *)(pB + o0));
            st.ga[1] = __ldg((const uint4 *)(pA + o1));
            st.gb[1] = __ldg((const uint4 *)(pB + o1));
            const int G = 4 * SS + ge;
            st.s0 = G < ng ? (uint32_t)__ldg(sp + 4 * SS) << 16 : 0u;
            st.b0 = G < ng ? (uint32_t)__ldg(bp + 4 * SS) << 16 : 0u;
            st.s1 = G + 1 < ng ? (uint32_t)__ldg(sp + 4 * SS + 1) << 16 : 0u;
            st.b1 = G + 1 < ng ? (uint32_t)__ldg(bp + 4 * SS + 1) << 16 : 0u;
        }
    };
    float acc = 0.0f;
    auto use = [&](const tc_stage &st, int j, int S) {
        float c[4];
        if (!TAIL)
            tc_mma16(st, bx0 + j * inc0, bx1 + j * inc1, c);
        else
            tc_mma16(st, bx0 + (S + j) * inc0, bx1 + (S + j) * inc1, c);
        acc = tc_epilogue(acc, c, t, TAIL ? xs4[2 * (S + j)] : xs4[2 * j], st.s0, st.s1, st.b0, st.b1);
    };
    // Two buffers in turn: the loads of super-step S + 1 are issued before S is used.
    tc_stage A, B;
    load(A, 0, 0);
    for (int S = 0; S < nS; S += 2) {
        if (S + 1 < nS) load(B, 1, S);
        use(A, 0, S);
        if (S + 1 >= nS) break;
        if (S + 2 < nS) load(A, 2, S);
        use(B, 1, S);
        if (!TAIL) {
            pA += 256, pB += 256, sp += 8, bp += 8, bx0 += 2 * inc0, bx1 += 2 * inc1, xs4 += 4;
        }
    }
    return acc + __shfl_xor_sync(0xffffffffu, acc, 1);
}

// The dispatch on K (uniform): the guard-free path when K % 256 == 0.
static __device__ __forceinline__ float tc_rows16(const uint32_t *__restrict__ w, const uint16_t *__restrict__ sc,
                                                  const uint16_t *__restrict__ bi, int R, int K, int n0,
                                                  const unsigned char *sm) {
    return K % TC_SUPER ? tc_rows16<true>(w, sc, bi, R, K, n0, sm) : tc_rows16<false>(w, sc, bi, R, K, n0, sm);
}

// ---- several tokens against the same 16 rows (tc_rows16_xq) --------------------------------------
// For T <= 4 NQ tokens at once (a short forward: an append, a speculative draft's verification).
// The codes go to the tensor cores as in tc_rows16, once for all tokens; B's eight columns stand
// for (token 4 q + n / 2 of quad q, group parity n % 2) instead of (group n % 4): in half h lane t's
// codes are of group 2 h + t / 2, so lane (g, t) of B carries its token's x where g % 2 == t / 2
// (the same chunk tc_rows16's real lanes read, in the token's own area) and zeros elsewhere, and
// each half accumulates into an accumulator of its own. The scale / bias epilogue then runs per
// (row, group, token) at the end of each super-step: lane t of a quad finishes token 4 q + t of
// rows g and g + 8. Token tau's input is staged in area tau (tc_stage_xq: tc_stage_x's layout, one
// area a token, areas tc_area_bytes(K) apart: 16 bytes off a multiple of 128, so that the lanes
// reading the same chunk of four tokens fall in distinct bank groups).
TC_HD int tc_area_bytes(int K) {
    return ((tc_smem_bytes(K) + 127) & ~127) + 16;
}

// Stages tokens 0 .. T - 1: get8(tau, u, v) writes inputs 8u .. 8u+7 of token tau into v[8]; by
// threads tid of nt (whole warps), then __syncthreads() by the whole block. sm: T tc_area_bytes(K).
template <typename GET8>
static __device__ __forceinline__ void tc_stage_xq(GET8 get8, int T, int K, unsigned char *sm, int tid = threadIdx.x,
                                                   int nt = blockDim.x) {
    const int nc = 32 * tc_nsuper(K), kc = K / 8, ab = tc_area_bytes(K);
    for (int base = 0; tid >= 0 && base < T * nc; base += nt) {
        const int idx = base + tid;
        if (idx < T * nc) { // warp-uniform: nc and base are multiples of 32
            const int tau = idx / nc, u = idx % nc;
            float v[8];
            if (u < kc)
                get8(tau, u, v);
            else
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = 0.0f;
            tc_stage_unit(u, v, K, sm + (size_t)tau * ab);
        }
    }
    if (tid >= 0 && tid < 4) ((uint4 *)sm)[tc_zero_chunk(K) + tid] = make_uint4(0, 0, 0, 0); // area 0's zero chunk
    __syncthreads();
}

// Rows n0 .. n0 + 15 of a 4-bit matrix times the staged inputs of tokens 0 .. T - 1 (T <= 4 NQ),
// K % 256 == 0, super-steps S0 .. S1 - 1 (S1 < 0: all; the parts of a split sum to the product).
// out[q][0], out[q][1]: rows n0 + g and n0 + g + 8 for token 4 q + t (lane = 4 g + t), valid where
// that token is below T and the row below R (rows >= R computed on row R - 1). Every lane must call it.
template <int NQ>
static __device__ __forceinline__ void
tc_rows16_xq(const uint32_t *__restrict__ w, const uint16_t *__restrict__ sc, const uint16_t *__restrict__ bi, int R,
             int K, int n0, const unsigned char *sm, int T, float (&out)[NQ][2], int S0 = 0, int S1 = -1) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    const int rowbytes = K / 2, ng = K / 64, ab = tc_area_bytes(K);
    if (S1 < 0) S0 = 0, S1 = tc_nsuper(K);
    const int nS = S1 - S0;
    const int rA = min(n0 + g, R - 1), rB = min(n0 + g + 8, R - 1);
    const unsigned char *pA = (const unsigned char *)w + (size_t)rA * rowbytes + 16 * t + 128 * S0;
    const unsigned char *pB = (const unsigned char *)w + (size_t)rB * rowbytes + 16 * t + 128 * S0;
    const uint16_t *sA = sc + (size_t)rA * ng + 4 * S0, *sB = sc + (size_t)rB * ng + 4 * S0;
    const uint16_t *bA = bi + (size_t)rA * ng + 4 * S0, *bB = bi + (size_t)rB * ng + 4 * S0;
    const unsigned char *bx[NQ][2];
    const float4 *xs4[NQ];
    int inc[NQ];
#pragma unroll
    for (int q = 0; q < NQ; q++) {
        const int tau = 4 * q + g / 2, mine = 4 * q + t; // B's token; the epilogue's token
        const bool real = (g & 1) == (t >> 1) && tau < T;
        const unsigned char *area = sm + (size_t)(real ? tau : 0) * ab;
        inc[q] = real ? TC_B_STEP : 0;
#pragma unroll
        for (int h = 0; h < 2; h++)
            bx[q][h] = real ? area + 16 * tc_xb_chunk(16 * h + 4 * t) + S0 * TC_B_STEP : sm + 16 * tc_zero_chunk(K);
        xs4[q] = (const float4 *)(sm + (size_t)(mine < T ? mine : 0) * ab + tc_xs_byte(K)) + 2 * S0;
    }
    float acc[NQ][2];
#pragma unroll
    for (int q = 0; q < NQ; q++) acc[q][0] = acc[q][1] = 0.0f;
    struct ld {
        uint4 ga[2], gb[2];
        uint2 sa, sb, ba, bb; // 4 bf16 scales / biases of rows g and g + 8, groups 4 S .. 4 S + 3
    };
    auto load = [&](ld &l, int j) {
        l.ga[0] = __ldg((const uint4 *)(pA + 128 * j));
        l.gb[0] = __ldg((const uint4 *)(pB + 128 * j));
        l.ga[1] = __ldg((const uint4 *)(pA + 128 * j + 64));
        l.gb[1] = __ldg((const uint4 *)(pB + 128 * j + 64));
        l.sa = __ldg((const uint2 *)(sA + 4 * j)), l.sb = __ldg((const uint2 *)(sB + 4 * j));
        l.ba = __ldg((const uint2 *)(bA + 4 * j)), l.bb = __ldg((const uint2 *)(bB + 4 * j));
    };
    auto use = [&](const ld &l, int j) {
        float c[NQ][2][4];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint4 xb[NQ];
#pragma unroll
                for (int q = 0; q < NQ; q++) xb[q] = *(const uint4 *)(bx[q][h] + j * inc[q] + 16 * i);
                const uint32_t wa = tc_word(l.ga[h], i), wb = tc_word(l.gb[h], i);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const uint32_t a0 = tc_a_dev(wa, e, 0), a1 = tc_a_dev(wb, e, 0);
                    const uint32_t a2 = tc_a_dev(wa, e, 1), a3 = tc_a_dev(wb, e, 1);
#pragma unroll
                    for (int q = 0; q < NQ; q++) {
                        const uint32_t b0 = e ? xb[q].z : xb[q].x, b1 = e ? xb[q].w : xb[q].y;
                        if (i == 0 && e == 0)
                            tc_mma<false>(c[q][h], a0, a1, a2, a3, b0, b1);
                        else
                            tc_mma<true>(c[q][h], a0, a1, a2, a3, b0, b1);
                    }
                }
            }
        const uint32_t sw[4] = {l.sa.x, l.sa.y, l.sb.x, l.sb.y}, bw[4] = {l.ba.x, l.ba.y, l.bb.x, l.bb.y};
#pragma unroll
        for (int q = 0; q < NQ; q++) {
            const float4 x01 = xs4[q][2 * j], x23 = xs4[q][2 * j + 1]; // (sum, 128 sum bf16) of groups 0..3
            const float xsum[4] = {x01.x, x01.z, x23.x, x23.z}, x128[4] = {x01.y, x01.w, x23.y, x23.w};
#pragma unroll
            for (int gi = 0; gi < 4; gi++) { // group 4 S + gi: half gi / 2, parity gi % 2
                const int h = gi / 2, p = gi % 2;
#pragma unroll
                for (int r = 0; r < 2; r++) { // row g (scales word r = 0) and row g + 8 (r = 1)
                    const uint32_t s2 = sw[2 * r + h], b2 = bw[2 * r + h]; // groups 2h, 2h + 1 of the row
                    const float s = __uint_as_float(p ? s2 & 0xffff0000u : s2 << 16);
                    const float b = __uint_as_float(p ? b2 & 0xffff0000u : b2 << 16);
                    acc[q][r] = fmaf(s, c[q][h][2 * r + p] - x128[gi], fmaf(b, xsum[gi], acc[q][r]));
                }
            }
        }
    };
    ld A, B;
    load(A, 0);
    for (int S = 0; S < nS; S += 2) {
        if (S + 1 < nS) load(B, 1);
        use(A, 0);
        if (S + 1 >= nS) break;
        if (S + 2 < nS) load(A, 2);
        use(B, 1);
        pA += 256, pB += 256, sA += 8, sB += 8, bA += 8, bB += 8;
#pragma unroll
        for (int q = 0; q < NQ; q++) {
            bx[q][0] += 2 * inc[q], bx[q][1] += 2 * inc[q];
            xs4[q] += 4;
        }
    }
#pragma unroll
    for (int q = 0; q < NQ; q++) out[q][0] = acc[q][0], out[q][1] = acc[q][1];
}
