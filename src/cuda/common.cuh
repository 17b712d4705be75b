// common.cuh: device helpers shared by the kernels (warp reductions, bf16, dequantization).
#pragma once

#include "kernels.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define WARP_SIZE 32   // warpSize is not a compile-time constant
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define QGROUP 64      // quantization group (QWEN_GROUP)

static __device__ __forceinline__ float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

static __device__ __forceinline__ uint16_t f2bf16(float f) {   // round to nearest even, as f32_to_bf16
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

// Block-wide sum; every thread gets the result. sh: >= 32 floats of shared memory.
static __device__ __forceinline__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE, nw = CEIL_DIV(blockDim.x, WARP_SIZE);
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(t);
}

static __device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

static inline int launch_status(void) { return (int)cudaGetLastError(); }
