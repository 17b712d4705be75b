// gdn_emu.h: just enough of CUDA to run src/cuda/gdn_chunked.cu's kernels on the CPU, for checking
// their indexing without a GPU (gdn_emu.cpp). One block at a time; every thread of the block is a
// std::thread; __syncthreads is a block barrier; warp shuffles and mma.sync exchange through a
// per-warp buffer between two warp barriers. mma.m16n8k16 is computed from the fragment layout in
// the PTX ISA (the one mma.cuh documents), products exact, sums in fp32. cp.async copies at once.
#pragma once

#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define WARP_SIZE 32
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

struct EmuWarp {
    std::barrier<> bar{32};
    uint32_t a[32][4], b[32][2];
    float c[32][4], v[32];
};
struct EmuBlock {
    std::barrier<> *bar;
    float *smem;
    EmuWarp *warps;
};
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 gridDim, blockDim;
extern EmuBlock *emu_blk;

static inline void __syncthreads() { emu_blk->bar->arrive_and_wait(); }
static inline float *gdn_smem() { return emu_blk->smem; }
static inline EmuWarp &emu_warp() { return emu_blk->warps[threadIdx.x / 32]; }

// Every lane of the warp publishes v and reads lane src's value (src < 0: keeps its own v).
static inline float emu_exchange(float v, int src) {
    EmuWarp &w = emu_warp();
    w.v[threadIdx.x % 32] = v;
    w.bar.arrive_and_wait();
    const float r = src < 0 ? v : w.v[src & 31];
    w.bar.arrive_and_wait();
    return r;
}
static inline float __shfl_sync(unsigned, float v, int src) { return emu_exchange(v, src); }
static inline float __shfl_up_sync(unsigned, float v, int off) {
    const int lane = threadIdx.x % 32;
    return emu_exchange(v, lane >= off ? lane - off : -1);
}
static inline float __shfl_xor_sync(unsigned, float v, int m) { return emu_exchange(v, (threadIdx.x % 32) ^ m); }

static inline float emu_bf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f2bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline void split_bf16(float f, uint16_t *hi, uint16_t *lo) {
    *hi = f2bf16(f);
    *lo = f2bf16(f - emu_bf(*hi));
}
static inline uint32_t pack2(uint16_t lo_half, uint16_t hi_half) { return (uint32_t)lo_half | ((uint32_t)hi_half << 16); }

// c += a b, m16n8k16, lane = 4 g + c:
//   A reg q of lane (g, c): row g + 8 (q & 1), k 2c + 8 (q >> 1) + {0 (low half), 1 (high half)}
//   B reg q: k 2c + 8 q + {0, 1}, col g;  C: (row g, cols 2c, 2c+1), (row g + 8, cols 2c, 2c+1)
static inline void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    EmuWarp &w = emu_warp();
    const int lane = threadIdx.x % 32;
    for (int i = 0; i < 4; i++) w.a[lane][i] = a[i], w.c[lane][i] = c[i];
    w.b[lane][0] = b0, w.b[lane][1] = b1;
    w.bar.arrive_and_wait();
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        const int g = L >> 2, cc = L & 3;
        for (int q = 0; q < 4; q++)
            for (int e = 0; e < 2; e++) A[g + 8 * (q & 1)][2 * cc + 8 * (q >> 1) + e] = emu_bf((uint16_t)(w.a[L][q] >> (16 * e)));
        for (int q = 0; q < 2; q++)
            for (int e = 0; e < 2; e++) B[2 * cc + 8 * q + e][g] = emu_bf((uint16_t)(w.b[L][q] >> (16 * e)));
    }
    const int g = lane >> 2, cc = lane & 3;
    float out[4];
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * cc + (i & 1);
        float s = w.c[lane][i];
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        out[i] = s;
    }
    w.bar.arrive_and_wait();
    for (int i = 0; i < 4; i++) c[i] = out[i];
}

static inline void cp_async16(void *dst, const void *src, int src_bytes) {
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) {
        fprintf(stderr, "cp_async16: misaligned %p <- %p\n", dst, src);
        abort();
    }
    memset(dst, 0, 16);
    if (src_bytes) memcpy(dst, src, src_bytes);
}
static inline void cp_async_commit(void) {}
template <int N>
static inline void cp_async_wait(void) {}

static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static inline float silu_f(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
