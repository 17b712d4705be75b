// common.cuh: device helpers shared by the kernels (warp reductions, bf16, dequantization).
#pragma once

#include "kernels.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define WARP_SIZE      32 // warpSize is not a compile-time constant
#define CEIL_DIV(a, b) (((a) + (b)-1) / (b))
#define QGROUP         64 // quantization group (QWEN_GROUP)

static __device__ __forceinline__ float bf16f(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

static __device__ __forceinline__ uint16_t f2bf16(float f) { // round to nearest even, as f32_to_bf16
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide reduction of v by warp (a warp_sum or warp_max) with identity id; every thread gets
// the result. sh: >= 32 floats of shared memory.
template <float (*WARP)(float)> static __device__ __forceinline__ float block_reduce(float v, float *sh, float id) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE, nw = CEIL_DIV(blockDim.x, WARP_SIZE);
    v = WARP(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : id;
    return WARP(t);
}
static __device__ __forceinline__ float block_sum(float v, float *sh) {
    return block_reduce<warp_sum>(v, sh, 0.0f);
}
// Two block sums at once (a and b each exactly as block_sum would give), with one pair of barriers.
// sh: >= 64 floats.
static __device__ __forceinline__ float2 block_sum2(float a, float b, float *sh) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE, nw = CEIL_DIV(blockDim.x, WARP_SIZE);
    a = warp_sum(a), b = warp_sum(b);
    __syncthreads();
    if (lane == 0) sh[wid] = a, sh[WARP_SIZE + wid] = b;
    __syncthreads();
    return make_float2(warp_sum(lane < nw ? sh[lane] : 0.0f), warp_sum(lane < nw ? sh[WARP_SIZE + lane] : 0.0f));
}
static __device__ __forceinline__ float block_max(float v, float *sh) {
    return block_reduce<warp_max>(v, sh, -INFINITY);
}

static __device__ __forceinline__ float silu_f(float x) {
    return x / (1.0f + expf(-x));
}
static __device__ __forceinline__ float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x));
}
static __device__ __forceinline__ float softplus_f(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
} // torch threshold 20

// out[k] = dequant(E[row, k]) for k < E.cols, by the threads of one block (an embedding row, §2.1).
// Element k of a row (codes w, scales s, biases b of that row; per codes a word): s q + b in fp32.
static __device__ __forceinline__ float dequant_at(const uint32_t *w, const uint16_t *s, const uint16_t *b, int k,
                                                   int bits, int per, uint32_t mask) {
    const uint32_t q = (w[k / per] >> ((k % per) * bits)) & mask;
    return bf16f(s[k / QGROUP]) * (float)q + bf16f(b[k / QGROUP]);
}
static __device__ __forceinline__ void dequant_row(const struct dqt &E, size_t row, float *out) {
    const int K = E.cols, per = 32 / E.bits;
    const uint32_t *w = E.w + row * (size_t)(K / per);
    const uint16_t *s = E.scales + row * (size_t)(K / QGROUP), *b = E.biases + row * (size_t)(K / QGROUP);
    const uint32_t mask = (1u << E.bits) - 1;
    for (int k = threadIdx.x; k < K; k += blockDim.x) out[k] = dequant_at(w, s, b, k, E.bits, per, mask);
}

static inline int launch_status(void) {
    return (int)cudaGetLastError();
}

enum { RT_MAXE = 1024 }; // most experts route_block handles

// MoE routing of one token by one block (docs/MODEL.md §2.6): softmax over the E logits into p (shared,
// >= E floats), then the top k (ties: lower id) by rank: expert e is chosen when fewer than k
// experts beat it (a larger probability, or an equal one and a lower id), all experts at once;
// the chosen weights are renormalised by their sum taken in rank order (the CPU's order).
// Writes ids[k] and w[k] (shared or global). Every thread of the block must call it.
static __device__ void route_block(const float *x, int E, int k, float *p, int *ids, float *w) {
    __shared__ float sh[32];
    __shared__ float pw[WARP_SIZE];
    __shared__ int pid[WARP_SIZE];
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, x[e]);
    mx = block_max(mx, sh);
    float sum = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) sum += p[e] = expf(x[e] - mx);
    sum = block_sum(sum, sh);
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] /= sum;
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float pe = p[e];
        int rank = 0; // no early exit: the comparisons are independent and pipeline
#pragma unroll 16
        for (int j = 0; j < E; j++) {
            const float pj = p[j];
            rank += pj > pe || (pj == pe && j < e);
        }
        if (rank < k) pid[rank] = e, pw[rank] = pe;
    }
    __syncthreads();
    if (threadIdx.x < k) {
        float top = 0;
        for (int i = 0; i < k; i++) top += pw[i];
        ids[threadIdx.x] = pid[threadIdx.x];
        w[threadIdx.x] = pw[threadIdx.x] / top;
    }
    __syncthreads();
}

enum { RW_MAXE = 256 }; // most experts route_warp handles (8 a lane)

// The same routing by one warp (E <= RW_MAXE), a few microseconds sooner than route_block: lane l
// holds experts l, l + 32, ...; the top k by k rounds of a warp-wide max over 64-bit keys
// (probability, then the lower id), the weights renormalised by their sum in rank order. Each lane
// sorts its 8 keys once (a network of 19 compare-exchanges); a round is two redux.sync (the high words,
// then the low words of the lanes holding that high word) on each lane's first key, and the winning
// lane shifts its list (predicated moves: no branch). FULL (E == RW_MAXE, the model's 256 experts):
// no lane holds padding, so the softmax and the keys are straight-line code.
// Writes ids[0..k) and w[0..k) from lanes 0..k-1.
template <bool FULL>
static __device__ __forceinline__ void route_warp_of(const float *x, int E, int k, int *ids, float *w) {
    constexpr int N = RW_MAXE / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    float v[N];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < N; j++) {
        const int e = lane + WARP_SIZE * j;
        v[j] = FULL || e < E ? x[e] : -INFINITY;
        mx = fmaxf(mx, v[j]);
    }
    mx = warp_max(mx);
    float sum = 0;
#pragma unroll
    for (int j = 0; j < N; j++) {
        v[j] = FULL || lane + WARP_SIZE * j < E ? expf(v[j] - mx) : 0.0f;
        sum += v[j];
    }
    sum = warp_sum(sum);
    unsigned long long key[N]; // 0: padding or taken
#pragma unroll
    for (int j = 0; j < N; j++) {
        const uint32_t e = lane + WARP_SIZE * j;
        key[j] = FULL || e < (uint32_t)E ? ((unsigned long long)__float_as_uint(v[j] / sum) << 32) | (0xFFFFFFFFu - e)
                                         : 0ull;
    }
    // descending (Batcher's odd-even merge sort of 8)
    constexpr int net[19][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 2}, {1, 3}, {4, 6}, {5, 7}, {1, 2}, {5, 6},
                                {0, 4}, {1, 5}, {2, 6}, {3, 7}, {2, 4}, {3, 5}, {1, 2}, {3, 4}, {5, 6}};
    static_assert(N == 8, "the sorting network is for 8 keys a lane");
#pragma unroll
    for (int c = 0; c < 19; c++) {
        const unsigned long long a = key[net[c][0]], b = key[net[c][1]];
        key[net[c][0]] = a > b ? a : b;
        key[net[c][1]] = a > b ? b : a;
    }
    float top = 0, my_p = 0;
    int my_e = 0;
    for (int i = 0; i < k; i++) {
        const unsigned long long mine = key[0];
        const uint32_t hi = __reduce_max_sync(0xffffffffu, (uint32_t)(mine >> 32));
        const uint32_t lo = __reduce_max_sync(0xffffffffu, (uint32_t)(mine >> 32) == hi ? (uint32_t)mine : 0u);
        const unsigned long long b = (unsigned long long)hi << 32 | lo; // the warp's largest key
        const bool won = mine == b;                                     // one lane: the ids in the low words differ
#pragma unroll
        for (int j = 0; j + 1 < N; j++) key[j] = won ? key[j + 1] : key[j];
        key[N - 1] = won ? 0ull : key[N - 1];
        const float p = __uint_as_float(hi);
        top += p;
        if (lane == i) my_e = (int)(0xFFFFFFFFu - (uint32_t)b), my_p = p;
    }
    if (lane < k) ids[lane] = my_e, w[lane] = my_p / top;
}
// Out of line: inlined, its registers pushed the gate/up kernel's spills from 24 to 40 bytes of stack.
static __device__ __noinline__ void route_warp(const float *x, int E, int k, int *ids, float *w) {
    if (E == RW_MAXE)
        route_warp_of<true>(x, E, k, ids, w);
    else
        route_warp_of<false>(x, E, k, ids, w);
}

// Programmatic dependent launch (sm_90): a kernel launched with the attribute may start while its
// predecessor finishes; it must wait before reading what the predecessor wrote. Both are no-ops
// for a kernel launched without the attribute.
static __device__ __forceinline__ void pdl_wait(void) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
static __device__ __forceinline__ void pdl_trigger(void) {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// A decode kernel's launch on l's stream, with programmatic dependent launch where l asks for it.
// Returns 0 or the CUDA error of the launch.
template <typename... P, typename... A>
static int launch_k(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, const struct dec_launch *l, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)l->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = l->pdl ? 1 : 0;
    return (int)cudaLaunchKernelEx(&cfg, kern, ((P)args)...);
}
