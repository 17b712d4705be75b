// mma.cuh: tensor-core building blocks (sm_80+ warp-level mma.sync, ldmatrix, cp.async).
//
// Fragment layouts of mma.m16n8k16 with bf16 inputs and fp32 accumulators (lane = 4 g + c):
//   A 16x16 row-major, 4 regs of bf16x2: (row g, k 2c..2c+1), (row g+8, k 2c..), (row g, k 2c+8..),
//     (row g+8, k 2c+8..)
//   B 16x8, 2 regs: (k 2c..2c+1, col g), (k 2c+8.., col g)
//   C 16x8, 4 floats: (row g, cols 2c, 2c+1), (row g+8, cols 2c, 2c+1)
// Shared-memory tiles hold rows of 16-byte chunks (8 bf16) with chunk c of row r stored at
// c ^ (r & 7), so that the 8 row addresses of one ldmatrix matrix hit distinct banks.
#pragma once

#include "common.cuh"

static __device__ __forceinline__ int swz(int r, int c) {
    return c ^ (r & 7);
}

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// c += a b  (m16n8k16, bf16 inputs, fp32 accumulate)
static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16-byte asynchronous copy global -> shared; src_bytes 0 fills the 16 bytes with zeros.
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n");
}
template <int N> static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Round to bf16 (nearest even) and the residual, so that hi + lo carries ~16 mantissa bits:
// products on the tensor cores with hi and lo as two operands lose almost nothing against fp32.
static __device__ __forceinline__ void split_bf16(float f, uint16_t *hi, uint16_t *lo) {
    *hi = f2bf16(f);
    *lo = f2bf16(f - __uint_as_float((uint32_t)*hi << 16));
}
static __device__ __forceinline__ uint32_t pack2(uint16_t lo_half, uint16_t hi_half) {
    return (uint32_t)lo_half | ((uint32_t)hi_half << 16);
}
// bf16x2 of (lo_half, hi_half), each rounded to nearest even (as f2bf16 for finite values), in one
// instruction (cvt packs its first source into the upper half): the fast mode's A operands.
static __device__ __forceinline__ uint32_t bf16x2_rn(float lo_half, float hi_half) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi_half), "f"(lo_half));
    return r;
}
