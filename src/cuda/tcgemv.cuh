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
// Per lane and super-step (128 codes a lane: 16 rows x 256 inputs / 32 lanes), in the loop body:
//   16 HMMA, 112 ALU for the A fragments (per 32-bit word of 8 codes: 3 shifts + 4 LOP3),
//   4 LDG.128 (codes), 4 LDG.U16 (2 scales, 2 biases), 8 LDS.128 (B, two mma steps each),
//   1 LDS.128 (group sums), ~12 for the epilogue and a few address updates:
//   about 160 instructions for 128 codes = ~1.25 per code (rows_dot: ~3.5).
// Loads: a quad's 4 lanes read 64 contiguous bytes of one row per LDG.128 (two full sectors); the
// warp reads 128-byte lines of 16 rows a super-step; the next super-step's codes, scales and biases
// are loaded before the current one is used (register double buffering: 64 bytes of codes a lane
// in flight). Rows past R are clamped to R - 1 (the caller skips their stores); a K that is not a
// multiple of 256 ends in a partial super-step: its missing groups load clamped codes (finite
// (128 + q)) against zero x in B and zero scale / bias, contributing exactly 0.
#pragma once

#include "common.cuh"
#include "tcgemv_layout.h"

// Stage the input for tc_rows16, by every thread of the block (blockDim.x a multiple of 32), then
// __syncthreads(). get8(u, v) writes inputs 8u .. 8u+7 (u < K / 8) into float v[8]. sm: at least
// tc_smem_bytes(K) bytes of shared memory, 16-byte aligned.
template <typename GET8>
static __device__ __forceinline__ void tc_stage_x(GET8 get8, int K, unsigned char *sm) {
    const int nc = 32 * tc_nsuper(K), kc = K / 8;
    uint4 *xb = (uint4 *)sm;
    float2 *xs = (float2 *)(sm + tc_xs_byte(K));
    for (int base = 0; base < nc; base += blockDim.x) {
        const int u = base + (int)threadIdx.x;
        if (u < nc) {   // warp-uniform: nc and base are multiples of 32
            float v[8];
            if (u < kc) get8(u, v);
            else
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = 0.0f;
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
            for (int o = 4; o > 0; o >>= 1) {   // the 8 chunks of a group are 8 aligned lanes
                sf += __shfl_xor_sync(0xffffffffu, sf, o);
                sb += __shfl_xor_sync(0xffffffffu, sb, o);
            }
            if ((u & 7) == 0) xs[u >> 3] = make_float2(sf, 128.0f * sb);
        }
    }
    if (threadIdx.x < 4) xb[tc_zero_chunk(K) + threadIdx.x] = make_uint4(0, 0, 0, 0);
    __syncthreads();
}

// Plain fp32 input in global or shared memory (16-byte aligned).
static __device__ __forceinline__ void tc_stage_x(const float *x, int K, unsigned char *sm) {
    tc_stage_x(
        [&](int u, float (&v)[8]) {
            const float4 a = ((const float4 *)x)[2 * u], b = ((const float4 *)x)[2 * u + 1];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        },
        K, sm);
}

// c = a b (+ c when ACC), m16n8k16, bf16 inputs, fp32 accumulate.
template <bool ACC>
static __device__ __forceinline__ void tc_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
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
static __device__ __forceinline__ int tc_lane_row(int lane) { return lane / 4 + 8 * ((lane % 4) >> 1); }

// Rows n0 .. n0 + 15 of a 4-bit matrix (codes w [R][K / 8] words, scales / biases [R][K / 64]
// bf16) times the staged input (tc_stage_x, sm). Returns row n0 + tc_lane_row(lane)'s product in
// every lane (the lanes t = 0, 1 and t = 2, 3 of a quad agree). Rows >= R are computed on row
// R - 1 (skip their stores). K: a multiple of 64. Every lane of the warp must call it.
static __device__ __forceinline__ float tc_rows16(const uint32_t *__restrict__ w, const uint16_t *__restrict__ sc,
                                                  const uint16_t *__restrict__ bi, int R, int K, int n0,
                                                  const unsigned char *sm) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    const int rowbytes = K / 2, ng = K / 64, nS = tc_nsuper(K), lim = rowbytes - 16;
    const int rA = min(n0 + g, R - 1), rB = min(n0 + g + 8, R - 1), rE = t < 2 ? rA : rB;
    const unsigned char *pA = (const unsigned char *)w + (size_t)rA * rowbytes;
    const unsigned char *pB = (const unsigned char *)w + (size_t)rB * rowbytes;
    const int ge = 2 * (t & 1);   // first group of this lane's epilogue within a super-step
    const uint16_t *sp = sc + (size_t)rE * ng + ge, *bp = bi + (size_t)rE * ng + ge;
    const unsigned char *bx0 = sm + tc_b_byte(K, g, t, 0), *bx1 = sm + tc_b_byte(K, g, t, 1);
    const int inc0 = tc_b_real(g, t, 0) ? TC_B_STEP : 0, inc1 = tc_b_real(g, t, 1) ? TC_B_STEP : 0;
    const float4 *xs4 = (const float4 *)(sm + tc_xs_byte(K)) + (t & 1);   // (sum, 128 sum bf16) x 2 groups

    auto load = [&](tc_stage &st, int S) {
        const int o0 = min(tc_code_byte(S, 0, t), lim), o1 = min(tc_code_byte(S, 1, t), lim);
        st.ga[0] = __ldg((const uint4 *)(pA + o0));
        st.gb[0] = __ldg((const uint4 *)(pB + o0));
        st.ga[1] = __ldg((const uint4 *)(pA + o1));
        st.gb[1] = __ldg((const uint4 *)(pB + o1));
        const int G = 4 * S + ge;
        st.s0 = G < ng ? __ldg(sp + 4 * S) : 0u;
        st.b0 = G < ng ? __ldg(bp + 4 * S) : 0u;
        st.s1 = G + 1 < ng ? __ldg(sp + 4 * S + 1) : 0u;
        st.b1 = G + 1 < ng ? __ldg(bp + 4 * S + 1) : 0u;
    };
    float acc = 0.0f;
    auto use = [&](const tc_stage &st, int S) {
        float c[4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const unsigned char *bx = (h ? bx1 + S * inc1 : bx0 + S * inc0);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint4 xb = *(const uint4 *)(bx + 16 * i);
                const uint32_t wa = tc_word(st.ga[h], i), wb = tc_word(st.gb[h], i);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const uint32_t a0 = tc_a_reg(wa, e, 0), a1 = tc_a_reg(wb, e, 0);
                    const uint32_t a2 = tc_a_reg(wa, e, 1), a3 = tc_a_reg(wb, e, 1);
                    const uint32_t b0 = e ? xb.z : xb.x, b1 = e ? xb.w : xb.y;
                    if (h == 0 && i == 0 && e == 0) tc_mma<false>(c, a0, a1, a2, a3, b0, b1);
                    else tc_mma<true>(c, a0, a1, a2, a3, b0, b1);
                }
            }
        }
        const float4 xs = xs4[2 * S];
        const float d0 = t < 2 ? c[0] : c[2], d1 = t < 2 ? c[1] : c[3];
        acc = fmaf(bf16f((uint16_t)st.s0), d0 - xs.y, fmaf(bf16f((uint16_t)st.b0), xs.x, acc));
        acc = fmaf(bf16f((uint16_t)st.s1), d1 - xs.w, fmaf(bf16f((uint16_t)st.b1), xs.z, acc));
    };
    // Two buffers in turn: the loads of super-step S + 1 are issued before S is used.
    tc_stage A, B;
    load(A, 0);
    for (int S = 0; S < nS; S += 2) {
        if (S + 1 < nS) load(B, S + 1);
        use(A, S);
        if (S + 1 >= nS) break;
        if (S + 2 < nS) load(A, S + 2);
        use(B, S + 1);
    }
    return acc + __shfl_xor_sync(0xffffffffu, acc, 1);
}
