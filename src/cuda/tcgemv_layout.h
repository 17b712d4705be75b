// tcgemv_layout.h: the index maps of the tensor-core GEMV (tcgemv.cuh), plain C so that the host
// emulation in tests/gpu/test_tcgemv.c runs the very same maps as the kernel.
//
// Terms: a warp computes 16 rows; lane = 4 g + t (g = lane / 4, t = lane % 4) as in the mma
// fragments. A super-step S covers 256 inputs k = 256 S .. 256 S + 255 (4 groups of 64, 128 bytes
// of codes per row) in 16 mma steps m = 8 h + 2 i + e (half h, word i, e).
//
// A (codes): lane t loads, for its rows g and g + 8, the 16-byte chunks at row byte 128 S + 16 t
// (half 0) and 128 S + 64 + 16 t (half 1): a quad reads 64 contiguous bytes per instruction, two
// full 32-byte sectors. So in half h lane t holds 32 codes of group 2 h + t / 2 (codes 32 (t & 1) ..
// of that group). In step (h, i, e) it feeds word i of its half-h chunk: a0 / a1 (rows g / g + 8,
// k = 2t, 2t+1) = the codes (2e, 2e+4) of the word, a2 / a3 (k = 2t+8, 2t+9) = codes (2e+1, 2e+5).
// A code q becomes bf16 (128 + q): (word >> 4 j) & 0x000F000F | 0x43004300 puts codes j and j + 4
// of the word in the low and high half. The 128 is not subtracted: it is folded into the group's
// correction 128 * sum(bf16(x)) (one FADD per group instead of one HSUB2 per two codes).
// B (x): column n of B stands for group n & 3 of the super-step (columns 4..7 repeat 0..3); its
// entries are x where the k of the mma carry codes of that group and 0 elsewhere. So lane (g, t)
// has real x in half h iff g & 3 == 2 h + t / 2 (8 lanes a half; the others read a zero area) and
// then b0 = x at the codes (2e, 2e+4), b1 = x at (2e+1, 2e+5) of the word its own A uses.
// C: column n accumulates group n & 3 over the 16 steps: lane t holds columns 2t, 2t+1 = groups
// 2 (t & 1), 2 (t & 1) + 1 of rows g (c0, c1) and g + 8 (c2, c3). Lane t < 2 finishes row g,
// lane t >= 2 row g + 8 (its two groups), one xor-1 shuffle at the end adds the other two groups.
//
// Shared memory (bytes from the base, 16-byte units = chunks):
//   XB    the input as bf16, chunk u (inputs 8u .. 8u+7, zero past K) at chunk u + u / 8 (one pad
//         chunk per 8: the 4 chunks a B load reads at once, u = 4t + i for t = 0..3, fall in 4
//         distinct 16-byte bank groups), its 8 values in the order 0,4,1,5,2,6,3,7 (word e = the
//         pair (2e, 2e+4)... see tc_pack_order) so that one LDS.128 gives b0, b1 of two steps.
//   ZERO  4 zero chunks at a chunk index = 2 mod 8 (off the bank groups of the real reads)
//   XS    float2 per group (padded to a multiple of 4 groups): (sum of x in fp32, 128 * sum of
//         bf16(x)) for the bias term and the 128 correction.
#pragma once

#ifdef __CUDACC__
#define TC_HD static __host__ __device__ __forceinline__
#else
#define TC_HD static inline
#endif

#include <stdint.h>

enum { TC_ROWS = 16, TC_SUPER = 256 };

TC_HD int tc_nsuper(int K) { return (K + TC_SUPER - 1) / TC_SUPER; }
TC_HD int tc_xb_chunk(int u) { return u + (u >> 3); }                     // position of input chunk u
TC_HD int tc_zero_chunk(int K) { return ((36 * tc_nsuper(K) + 7) & ~7) + 2; }
TC_HD int tc_xs_byte(int K) { return 16 * (tc_zero_chunk(K) + 6); }
TC_HD int tc_smem_bytes(int K) { return tc_xs_byte(K) + 8 * 4 * tc_nsuper(K); }

// Position j (0..7) of a staged chunk holds input 8u + tc_pack_order(j): words (x0,x4) (x1,x5)
// (x2,x6) (x3,x7), low half first.
TC_HD int tc_pack_order(int j) { return (j >> 1) + 4 * (j & 1); }

// A register of step e from a word of codes: lo = 0 -> a0/a1 (codes 2e, 2e+4), 1 -> a2/a3 (2e+1, 2e+5).
TC_HD uint32_t tc_a_reg(uint32_t w, int e, int hi) {
    return ((w >> (4 * (2 * e + hi))) & 0x000F000Fu) | 0x43004300u;
}

// Byte offset (within its row) of the 16-byte chunk lane t loads in half h of super-step S.
TC_HD int tc_code_byte(int S, int h, int t) { return 128 * S + 64 * h + 16 * t; }

// Whether lane (g, t) reads real x in half h, and the byte offset of its first B chunk in
// super-step 0 (word i at + 16 i); a real reader advances 16 * 36 = 576 bytes a super-step.
TC_HD int tc_b_real(int g, int t, int h) { return (g & 3) == 2 * h + (t >> 1); }
TC_HD int tc_b_byte(int K, int g, int t, int h) {
    return tc_b_real(g, t, h) ? 16 * tc_xb_chunk(16 * h + 4 * t) : 16 * tc_zero_chunk(K);
}
enum { TC_B_STEP = 16 * 36 };
