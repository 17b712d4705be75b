// gemv.cuh: the building blocks of the decode step's products (gemv.cu's k_dv, moe.cu's decode MoE):
// 4-bit and 8-bit codes dotted with a staged fp32 input on the CUDA cores (the exact mode's
// products and the 8-bit ones), the input's staging in shared memory, L2 prefetch, and the grid of a
// grid-stride kernel.
//
// A decode step streams ~1.9 GB of 4-bit weights and does ~6 GFLOP: every kernel is a matrix-vector
// product, memory-bound, that must keep many 16-byte loads in flight. On the CUDA cores the
// activations stay fp32 (per group of 64, scale * sum(q x) + bias * sum(x)), and codes become floats
// without conversion instructions: byte-permute a code under the exponent of 2^23, subtract 2^23.
#pragma once

#include "common.cuh"

// 4 warps a block, at least 8 blocks an SM (64 registers): 32 warps of loads in flight per SM.
// DV_ONE_WAVE: warps resident at once on an H200 (132 SMs x 8 blocks x 4 warps).
enum { DV_WARPS = 4, DV_THREADS = DV_WARPS * WARP_SIZE, DV_MIN_BLOCKS = 8, DV_ONE_WAVE = 132 * 8 * DV_WARPS };

static inline int sm_count(void) {
    static int n;
    if (!n) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        if (n < 1) n = 1;
    }
    return n;
}

// ---- building blocks --------------------------------------------------------------------------

// Code byte `sel` of v (bits 0..7 of that byte) as a float: 2^23 + code under the exponent, minus 2^23.
#define CODE_F(v, sel) (__int_as_float((int)__byte_perm((v), 0x4B000000u, 0x7440u | (sel))) - 8388608.0f)

// The staged input lives in shared memory as float4 units, unit u at swz(u): the lanes of a warp
// read the same unit of consecutive chunks (8 units apart for 4-bit codes, 4 for 8-bit), which
// would all fall in the same four banks; the swizzle spreads them over all 32.
static __device__ __forceinline__ int swz(int u) {
    return u ^ ((u >> 3) & 7);
}

// d[i] += sum_j code_ij * x[j] over chunk c (16 bytes of codes: 32 4-bit or 16 8-bit, first in the
// low bits) of each of RW rows; x4: the swizzled input, read once for all rows.
template <int BITS, int RW>
static __device__ __forceinline__ void chunk_dot(const uint4 (&q)[RW], const float4 *x4, int c, float (&d)[RW]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (BITS == 4) {
            const float4 a = x4[swz(8 * c + 2 * i)], b = x4[swz(8 * c + 2 * i + 1)];
#pragma unroll
            for (int r = 0; r < RW; r++) {
                const uint32_t w = i == 0 ? q[r].x : i == 1 ? q[r].y : i == 2 ? q[r].z : q[r].w;
                const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu; // codes 0,2,4,6 | 1,3,5,7
                float d0 = CODE_F(lo, 0) * a.x;
                float d1 = CODE_F(hi, 0) * a.y;
                d0 = fmaf(CODE_F(lo, 1), a.z, d0);
                d1 = fmaf(CODE_F(hi, 1), a.w, d1);
                d0 = fmaf(CODE_F(lo, 2), b.x, d0);
                d1 = fmaf(CODE_F(hi, 2), b.y, d1);
                d0 = fmaf(CODE_F(lo, 3), b.z, d0);
                d1 = fmaf(CODE_F(hi, 3), b.w, d1);
                d[r] += d0 + d1;
            }
        } else {
            const float4 a = x4[swz(4 * c + i)];
#pragma unroll
            for (int r = 0; r < RW; r++) {
                const uint32_t w = i == 0 ? q[r].x : i == 1 ? q[r].y : i == 2 ? q[r].z : q[r].w;
                float d0 = CODE_F(w, 0) * a.x;
                float d1 = CODE_F(w, 1) * a.y;
                d0 = fmaf(CODE_F(w, 2), a.z, d0);
                d1 = fmaf(CODE_F(w, 3), a.w, d1);
                d[r] += d0 + d1;
            }
        }
    }
}

// The sum of the inputs of chunk c (xs16: sums of 16 inputs; a 4-bit chunk spans two of them).
template <int BITS> static __device__ __forceinline__ float chunk_xsum(const float *xs16, int c) {
    return BITS == 4 ? xs16[2 * c] + xs16[2 * c + 1] : xs16[c];
}

// One quantized row as pointers: codes (16-byte chunks), bf16 scales and biases per group of 64.
struct qrow {
    const uint4 *w;
    const uint16_t *s, *b;
};
static __device__ __forceinline__ qrow qrow_of(const struct dqt &W, size_t row) {
    const size_t wpr = (size_t)W.cols * W.bits / 32, gpr = W.cols / QGROUP;
    return {(const uint4 *)(W.w + row * wpr), W.scales + row * gpr, W.biases + row * gpr};
}

// How the lanes of a warp cover rows of K inputs at BITS: a group of lpr lanes per row (one
// 16-byte chunk per lane and step; a whole warp once a row has 32 chunks or more), rpp rows per
// pass, cpl chunks per lane; sub = lane within its group, rip = its row within the pass.
struct lanes {
    int lpr, rpp, cpl, sub, rip;
};
template <int BITS> static __device__ __forceinline__ lanes lanes_of(int K) {
    const int cpr = K / (128 / BITS), lpr = cpr < WARP_SIZE ? cpr : WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    return {lpr, WARP_SIZE / lpr, cpr / lpr, lane % lpr, lane / lpr};
}

// Dot products of RW rows with the staged input xs [K] (xs16: sums of 16 inputs), each row by a
// group of lanes; every lane of the group gets its row's sum. NB chunks per row are loaded before
// any is used (4 16-byte loads in flight per lane, scales and biases with them): a
// row of up to 4 chunks a lane (K <= 4096 at 4 bits) is one round trip (2 chunks a row for RW = 2).
template <int BITS, int RW>
static __device__ __forceinline__ void rows_dot(const qrow (&r)[RW], const lanes &L, const float *xs, const float *xs16,
                                                float (&acc)[RW]) {
    constexpr int CODES = 128 / BITS, CPG = QGROUP / CODES; // chunks per group
    constexpr int NB = RW == 1 ? 4 : 2;
#pragma unroll
    for (int i = 0; i < RW; i++) acc[i] = 0;
    for (int j = 0; j < L.cpl; j += NB) {
        uint4 q[NB][RW];
        float sc[NB][RW], bi[NB][RW];
        int c[NB];
#pragma unroll
        for (int b = 0; b < NB; b++) {
            c[b] = L.sub + min(j + b, L.cpl - 1) * L.lpr;
#pragma unroll
            for (int i = 0; i < RW; i++) {
                q[b][i] = __ldg(r[i].w + c[b]);
                sc[b][i] = bf16f(r[i].s[c[b] / CPG]), bi[b][i] = bf16f(r[i].b[c[b] / CPG]);
            }
        }
        // acc += scale * sum(q x) + bias * sum(x), per row, for chunk c
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (b > 0 && j + b >= L.cpl) continue;
            float d[RW] = {};
            chunk_dot<BITS, RW>(q[b], (const float4 *)xs, c[b], d);
            const float xsum = chunk_xsum<BITS>(xs16, c[b]);
#pragma unroll
            for (int i = 0; i < RW; i++) acc[i] = fmaf(sc[b][i], d[i], fmaf(bi[b][i], xsum, acc[i]));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < L.lpr)
#pragma unroll
            for (int i = 0; i < RW; i++) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
}

static __device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
// Prefetch bytes [p, p + n) into L2, the lanes of a warp taking 128-byte lines in turn.
static __device__ __forceinline__ void prefetch_range(const void *p, size_t n, int lane) {
    for (size_t off = (size_t)lane * 128; off < n; off += WARP_SIZE * 128) prefetch_l2((const char *)p + off);
}

// For each float4 i < n4 of src (global, 16-byte aligned): f(i, src[i]), with 8 loads in flight per
// thread before the first f. (A plain `dst[i] = src[i]` loop serialises: the compiler cannot move
// the next load above a store through a generic pointer, so each iteration would wait a round trip.)
// Threads tid of nt take the float4s in turn (by default the whole block).
template <typename F>
static __device__ __forceinline__ void for_float4(const float *__restrict__ src, int n4, F f, int tid = threadIdx.x,
                                                  int nt = blockDim.x) {
    const float4 *s4 = (const float4 *)src;
    for (int base = 0; base < n4; base += 8 * nt) {
        float4 v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = base + j * nt + tid;
            if (i < n4) v[j] = __ldg(s4 + i);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = base + j * nt + tid;
            if (i < n4) f(i, v[j]);
        }
    }
}

// Copy n floats (n % 4 == 0) from global to shared memory, swizzled (SWZ) or not, by threads tid of nt.
template <bool SWZ>
static __device__ __forceinline__ void copy_to_smem(float *__restrict__ dst, const float *__restrict__ src, int n,
                                                    int tid = threadIdx.x, int nt = blockDim.x) {
    float4 *d4 = (float4 *)dst;
    for_float4(
        src, n / 4, [&](int i, float4 v) { d4[SWZ ? swz(i) : i] = v; }, tid, nt);
}

// xs[i] *= r * w[i] over n floats (n % 4 == 0; xs swizzled).
static __device__ __forceinline__ void smem_scale(float *__restrict__ xs, const float *__restrict__ w, float r, int n) {
    float4 *x4 = (float4 *)xs;
    for_float4(w, n / 4, [&](int i, float4 wv) {
        const float4 x = x4[swz(i)];
        x4[swz(i)] = make_float4(x.x * r * wv.x, x.y * r * wv.y, x.z * r * wv.z, x.w * r * wv.w);
    });
}

// The sums of 16 consecutive inputs (the bias term of a group is bias * sum(x)); xs swizzled.
static __device__ __forceinline__ void sums16(const float *xs, float *xs16, int n) {
    const float4 *x4 = (const float4 *)xs;
    for (int c = threadIdx.x; c < n / 16; c += blockDim.x) {
        const float4 a = x4[swz(4 * c)], b = x4[swz(4 * c + 1)], e = x4[swz(4 * c + 2)], f = x4[swz(4 * c + 3)];
        xs16[c] = a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w + e.x + e.y + e.z + e.w + f.x + f.y + f.z + f.w;
    }
}

// Blocks for a grid-stride kernel: enough for the tasks, at most what fits on the GPU at once.
// (The occupancy is asked once per kernel: every call site passes the same block size, and the
// shared memory of these kernels never limits them below their registers.)
template <auto KERN> static int grid_for_tasks(long tasks, int threads, size_t smem) {
    static int per_sm; // one per kernel
    if (!per_sm &&
        (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KERN, threads, smem) != cudaSuccess || per_sm < 1))
        per_sm = 1;
    const long want = CEIL_DIV(tasks, threads / WARP_SIZE), cap = (long)per_sm * sm_count();
    return (int)(want < cap ? (want > 0 ? want : 1) : cap);
}

// Rows a warp covers per pass at K inputs and BITS (lanes_of's rpp, on the host).
static inline int rows_per_pass(int K, int bits) {
    const int cpr = K / (128 / bits);
    return cpr < WARP_SIZE ? WARP_SIZE / cpr : 1;
}
