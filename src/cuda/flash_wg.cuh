// flash_wg.cuh: the fast-mode prefill FlashAttention kernel on warpgroup products (sm_90a wgmma), for
// this model's head dimension (256). Included by attention.cu after flash.cuh, whose mma.sync kernel
// runs the exact mode (and the fast mode of the test geometries' head dimensions), and whose tiling,
// causal limits and arithmetic it keeps:
//   - a block takes 128 query rows that share one kv head (TPB tokens x G heads), keys in tiles of 64
//     at absolute positions from key 0, so the result does not depend on how the prompt was cut into
//     chunks (the session cache's continued prefill matches one prefill bit for bit);
//   - Q and P rounded once to bf16, fp32 accumulation, the online softmax in base 2 in fp32.
// What changes: two consumer warpgroups of 64 rows each, and the products are wgmma that read K and V
// straight from shared memory once per warpgroup. The mma.sync kernel's warps each read the whole K
// and V tile through ldmatrix (576 KB of shared-memory reads per tile for 128 rows; at 128 bytes a
// clock that alone is ~4,600 cycles against ~2,050 of tensor work): here Q K^T is 16 wgmma m64n64k16
// per warpgroup with Q and K from shared memory, and P V 4 wgmma m64n256k16 with P from registers
// (the S accumulator converted in place) and V read MN-major, so the tile's shared-memory traffic is
// about 160 KB.
// Shared memory (bf16, 128-byte swizzle, wgmma.cuh): Q [4 slabs][128][64], K and V [2 stages][4
// slabs][64][64]: 192 KB plus 1 KB to align the slabs to 1024 bytes; K(j + 1) and V(j + 1) load
// under all of tile j. One block an SM (the output accumulator is 128 floats a consumer thread).
// tools/sim/flash_sim.cpp runs this code on the host (make flash-sim) on the wgmma model of
// tools/sim/sim_wgmma.h (with models of the mbarriers and named barriers), which stands in for wgmma.cuh
// there; test_cuda_kernels holds it on the GPU to the CPU twins of its arithmetic.
#pragma once

#include "wgmma.cuh"

enum { FW_D = 256 }; // the head dimension this kernel is written for

static size_t flash_wg_smem_bytes(void) {
    return (size_t)(FA_BM + 4 * FA_BN) * FW_D * sizeof(uint16_t) + 1024;
}

// Byte offset of 16-byte chunk c (0 .. 31) of row r in a tile of `rows` rows stored as 4 slabs.
static __device__ __forceinline__ uint32_t fw_at(int r, int c, int rows) {
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Pins accumulator registers after a wgmma wait: their reads may not move above it. (Not in the host
// simulator: its wgmma model is synchronous, and a host compiler has no "f" register class for this.)
template <int N> static __device__ __forceinline__ void fw_pin(float (&d)[N]) {
#ifndef FA_HOST_SIM
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
#endif
}

// S = Q K^T for warpgroup wg's 64 rows against the 64 keys of the K stage at shared address kt: 16
// k16 steps, 4 per 64-column slab, Q and K from shared memory.
static __device__ __forceinline__ void fw_qk(float (&s)[FA_BN / 2], uint32_t sQ, uint32_t kt, int wg) {
#pragma unroll
    for (int ks = 0; ks < FW_D / 16; ks++) {
        const uint32_t qa = sQ + (ks / 4) * FA_BM * 128 + wg * 64 * 128 + (ks % 4) * 32;
        const uint32_t kb = kt + (ks / 4) * FA_BN * 128 + (ks % 4) * 32;
        wgmma_64x64_ss(s, wg_desc(qa, 16, 1024), wg_desc(kb, 16, 1024), ks > 0);
    }
}

// P (the S accumulator after the softmax, fp32) as bf16 A fragments of the four k16 steps of P V.
static __device__ __forceinline__ void fw_p(const float (&s)[FA_BN / 2], uint32_t (&pa)[FA_BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < FA_BN / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float *sv = &s[4 * (2 * kk + r / 2) + 2 * (r % 2)];
            pa[kk][r] = bf16x2_rn(sv[0], sv[1]);
        }
}

// O += P V over the V stage at shared address vt: 4 steps of 16 keys; V's 16 rows of a step are 2
// groups of 8 (SBO), its 256 columns 4 slabs (LBO).
static __device__ __forceinline__ void fw_pv(float (&acc)[FW_D / 2], const uint32_t (&pa)[FA_BN / 16][4], uint32_t vt) {
#pragma unroll
    for (int kk = 0; kk < FA_BN / 16; kk++)
        wgmma_64x256_rs(acc, pa[kk], wg_desc(vt + kk * 16 * 128, FA_BN * 128, 1024));
}

// ---- the kernel: warp-specialized, with ping-pong -------------------------------------------------
// A producer warpgroup (warps 0-3) copies K and V into the two stages, and mbarriers stand in for
// block barriers: full_k / full_v [stage] (each producer warp
// arrives once its copies landed and were fenced for the async proxy), empty [stage] (each consumer
// warp arrives once its warpgroup's P V product of the stage is complete). The two consumer
// warpgroups (warps 4-7 and 8-11) never meet at a block barrier, so one can run its softmax while the
// other's products occupy the tensor cores. Registers: 384 threads get 168 each at launch; the
// producer gives back to 56 and the consumers take 224 (setmaxnreg: regs_producer, regs_consumer in
// wgmma.cuh), more than the 194 the arithmetic needs. Ping-pong (FlashAttention-3's scheduling):
// named barriers 1 and 2 make the consumer warpgroups issue their Q K^T products in turn, so that
// they settle half a tile apart. OT: the output's type, float or uint16_t (bf16: fa_store).
enum { FW_CONSUMERS = FA_THREADS, FW_WS_THREADS = FA_THREADS + 128 };

template <typename OT>
static __global__ void __launch_bounds__(FW_WS_THREADS, 1)
    flash_ws_kernel(const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, OT *o, int T, int p0,
                    int cap, int n_heads, int n_kv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = FW_D, CH = D / 8;
    FA_DYNAMIC_SMEM(fw_raw);
    __shared__ __align__(8) uint64_t bars[6]; // mbarriers a stage: full_k[2], full_v[2], empty[2]
    uint64_t *const full_k = bars, *const full_v = bars + 2, *const empty = bars + 4;
    const uint32_t raw = smem_u32(fw_raw), base = (raw + 1023) & ~1023u;
    char *sm = (char *)fw_raw + (base - raw);
    const uint32_t sQ = base, sK = sQ + FA_BM * D * 2, sV = sK + 2 * FA_BN * D * 2;
    char *Qp = sm, *Kp = sm + (sK - base), *Vp = sm + (sV - base);
    const int G = n_heads / n_kv, TPB = FA_BM / G;
    const int kvh = blockIdx.y, t0 = (gridDim.x - 1 - blockIdx.x) * TPB; // longest rows first
    const int lane = threadIdx.x % WARP_SIZE;
    const bool producer = threadIdx.x < 128;
    const int tid = threadIdx.x - 128, warp = tid / WARP_SIZE, g = lane / 4, c4 = lane % 4; // consumers'
    const int wg = warp / 4;
    const int n_keys = p0 + min(T - 1, t0 + TPB - 1) + 1;
    const int n_tiles = CEIL_DIV(n_keys, FA_BN);
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; s++) {
            mbar_init(&full_k[s], 4);
            mbar_init(&full_v[s], 4);
            mbar_init(&empty[s], FW_CONSUMERS / WARP_SIZE);
        }
        mbar_init_fence();
    }
    if (!producer) {
        for (int i = tid; i < FA_BM * CH; i += FW_CONSUMERS) { // Q rows -> bf16
            const int r = i / CH, c = i % CH;
            float v[8];
            fa_q_load<D>(q, t0 + r / G, kvh * G + r % G, c, T, n_heads, v);
            *(uint4 *)(Qp + fw_at(r, c, FA_BM)) =
                make_uint4(bf16x2_rn(v[0], v[1]), bf16x2_rn(v[2], v[3]), bf16x2_rn(v[4], v[5]), bf16x2_rn(v[6], v[7]));
        }
        fence_async_smem();
    }
    __syncthreads(); // Q and the barriers' initialisation, for every warp
    if (producer) {
        regs_producer();
        const uint16_t *kbase = kc + (size_t)kvh * cap * D, *vbase = vc + (size_t)kvh * cap * D;
        auto load_tile = [&](char *dst, const uint16_t *src, int j) { // keys past n_keys: zeros
            for (int i = threadIdx.x; i < FA_BN * CH; i += 128) {
                const int r = i / CH, c = i % CH, key = j * FA_BN + r;
                const bool ok = key < n_keys;
                cp_async16(dst + fw_at(r, c, FA_BN), src + (size_t)(ok ? key : 0) * D + c * 8, ok ? 16 : 0);
            }
            cp_async_commit();
        };
        for (int j = 0; j < n_tiles; j++) {
            const int s = j & 1;
            if (j >= 2) mbar_wait(&empty[s], ((j >> 1) - 1) & 1); // tile j - 2's products are done
            load_tile(Kp + s * FA_BN * D * 2, kbase, j);
            load_tile(Vp + s * FA_BN * D * 2, vbase, j);
            cp_async_wait<1>();
            fence_async_smem();
            __syncwarp();
            if (lane == 0) mbar_arrive(&full_k[s]);
            cp_async_wait<0>();
            fence_async_smem();
            __syncwarp();
            if (lane == 0) mbar_arrive(&full_v[s]);
        }
        return;
    }
    regs_consumer();
    const int ra = warp * 16 + g, rb = ra + 8;
    const int lim_a = p0 + min(T - 1, t0 + ra / G), lim_b = p0 + min(T - 1, t0 + rb / G);
    const float sl2 = rsqrtf((float)D) * 1.4426950408889634f; // 1/sqrt(D) * log2(e)
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) acc[i] = 0;
    fa_rows rows = {-INFINITY, -INFINITY, 0, 0};
    if (wg == 1) named_arrive(1, FW_CONSUMERS); // warpgroup 0 issues first
    for (int j = 0; j < n_tiles; j++) {
        const int s = j & 1, ph = (j >> 1) & 1;
        const uint32_t kt = sK + s * FA_BN * D * 2, vt = sV + s * FA_BN * D * 2;
        mbar_wait(&full_k[s], ph);
        float sc[FA_BN / 2];
        named_sync(1 + wg, FW_CONSUMERS);
        wg_fence();
        fw_qk(sc, sQ, kt, wg);
        wg_commit();
        if (wg == 0 || j + 1 < n_tiles) named_arrive(2 - wg, FW_CONSUMERS); // the other's turn
        wg_wait<0>();
        fw_pin(sc);
        float corr_a, corr_b;
        fa_softmax(sc, j * FA_BN, c4, lim_a, lim_b, sl2, rows, corr_a, corr_b);
        fa_rescale(acc, corr_a, corr_b);
        uint32_t pa[FA_BN / 16][4];
        fw_p(sc, pa);
        mbar_wait(&full_v[s], ph);
        wg_fence();
        fw_pv(acc, pa, vt);
        wg_commit();
        wg_wait<0>();
        fw_pin(acc);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]); // this warp is done with stage s
    }
    fa_store<D>(acc, rows, o, qg, ra, t0, G, kvh, T, n_heads, c4);
#else
    __trap();
#endif
}
