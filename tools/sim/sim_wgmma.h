// sim_wgmma.h: a host model of the sm_90a warpgroup products of src/cuda/wgmma.cuh (wg_desc, wg_fence,
// wg_commit, wg_wait, fence_async_smem, wgmma_64x64_ss, wgmma_64x256_rs, wgmma_64x128_ss) for the host
// simulators (tools/sim/flash_sim.cpp, tools/sim/qmatmul_sim.cpp), which include it in place of wgmma.cuh and
// define __CUDA_ARCH_FEAT_SM90_ALL so that the kernels' wgmma bodies compile. Include after
// sim_block.h. A launch creates the 128-thread barriers g_wgbar (one per warpgroup: two, or three for
// the warp-specialized FlashAttention kernel's 384 threads) and each thread registers the block's
// dynamic shared memory (sim_smem_region). Also modelled for that kernel: mbarriers (init, arrive,
// wait on a phase's parity; a thread waiting blocks until the phase completes), named barriers (a
// launch creates g_named[1] and [2] for 256 threads: bar.sync waits, bar.arrive does not), and
// setmaxnreg and the mbarrier-init fence as no-ops.
//
// Shared addresses. smem_u32(p) is p's byte offset from the start of the simulated dynamic shared
// memory plus g_smem_addr0 (by default 1024: a multiple of 1024, as if 1 KB of static shared memory
// came first); a sim may set g_smem_addr0 to another multiple of 16 to show that a kernel's own 1 KB
// alignment of its swizzled tiles (needed because the hardware swizzles on address bits, below) does
// not depend on where its dynamic shared memory starts.
//
// Descriptors, decoded as the PTX ISA's "Matrix Descriptor Format" (wgmma, asynchronous warpgroup
// level matrix shared memory layout) states them: bits 0-13 start address >> 4, 16-29 leading byte
// offset (LBO) >> 4, 32-45 stride byte offset (SBO) >> 4, 49-51 base offset, 62-63 swizzle mode (1:
// 128-byte). Only what these kernels use is modelled; anything else (another swizzle, a base offset)
// stops the sim.
//
// Where an element is. The PTX ISA describes the operand tiles by "canonical layouts": core matrices
// of 8 rows, each row 16 bytes, repeated along K and along M/N, with the 128-byte swizzle widening a
// row to 128 bytes (64 bf16) and XOR-ing the 16-byte chunk index with the row within the 8-row group.
// Written out for bf16 (2 bytes):
//   K-major (A, or B with trans-b 0; one instruction reads k < 16, i.e. 32 bytes of each 128-byte row,
//   so LBO, the step between swizzle atoms along K, is never used): element (m, k) at
//       start + (m / 8) SBO + (m % 8) 128 + 2 k
//   MN-major (B with trans-b 1: rows of 64 consecutive n, one row per k): element (k, n) at
//       start + (n / 64) LBO + (k / 8) SBO + (k % 8) 128 + 2 (n % 64)
// and then the 128-byte swizzle on the absolute shared address: bits 4-6 ^= bits 7-9. Applying it to
// the absolute address (not to an offset from start) is what lets a kernel step along K inside a
// swizzled row by adding 32 bytes to the start address (wgmma.cuh), and is why the tiles must sit on
// 1024-byte boundaries (the pattern repeats every 8 rows of 128 bytes).
//
// Execution. The four warps of a warpgroup all call the operation; the model is collective: each
// thread posts its descriptors (and for the rs form its A fragment) to shared arrays, a warpgroup
// barrier, then every thread checks that the descriptors are the same across the warpgroup (the
// hardware takes them from the warpgroup as one) and computes its own accumulator fragment, and a
// second barrier keeps the arrays until all have read them (as sim_block.h's mma_bf16 with warp
// barriers). Fragments (m64nN, f32 accumulator): warp w % 4 of the warpgroup holds rows 16 (w % 4) ..
// + 15; d[4 i + e] is row 16 (w % 4) + lane / 4 + 8 (e >= 2), column 8 i + 2 (lane % 4) + (e & 1):
// mma.m16n8's C layout per 8 columns. The rs form's A (registers) is, per warp, mma.m16n8k16's A
// fragment of the warp's 16 rows: a0 row g, k 2c, 2c + 1; a1 row g + 8; a2 row g, k 2c + 8, +9; a3
// row g + 8, k 2c + 8, +9 (g = lane / 4, c = lane % 4; low half the lower k).
//
// Arithmetic: each output's 16 products of one instruction are summed in double (every bf16 product
// is exact in double) and added to the accumulator once, rounded to float per instruction; scale-d 0
// (the ss form's acc = 0) overwrites d with the rounded sum. That is sim_block.h's model of
// mma.m16n8k16, so a wgmma kernel and an mma.sync kernel stepping through K in the same k16 order
// give bit-identical results in the sims (flash_sim checks the fast FlashAttention kernels so), while
// the hardware's own internal rounding differs slightly in both: the twins' tolerances cover it.
//
// Timing is not modelled: an operation reads shared memory and writes the accumulators when it is
// issued, so wg_fence, wg_commit, wg_wait and fence_async_smem are no-ops. A kernel that overwrote an
// operand in shared memory after issuing a wgmma but before its wait_group (or read the accumulator
// before the wait) would not be caught here; the barrier-and-fence discipline before each issue is
// what the sims check (with cp.async landing at once or as late as allowed, sim_block.h).
#pragma once

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

// ---- shared addresses ------------------------------------------------------------------------------
static uint32_t g_smem_addr0 = 1024;   // the shared address of the dynamic shared memory's first byte
static thread_local const unsigned char *t_smem;
static thread_local size_t t_smem_bytes;
static void sim_smem_region(const void *p, size_t bytes) {
    t_smem = (const unsigned char *)p;
    t_smem_bytes = bytes;
}
[[noreturn]] static void wg_fail(const char *what, unsigned long long v) {
    fprintf(stderr, "sim_wgmma: %s (0x%llx), thread %u block (%u, %u, %u)\n", what, v, threadIdx.x, blockIdx.x,
            blockIdx.y, blockIdx.z);
    exit(2);
}
static uint32_t smem_u32(const void *p) {
    const unsigned char *b = (const unsigned char *)p;
    if (!t_smem || b < t_smem || b > t_smem + t_smem_bytes) wg_fail("smem_u32 of a pointer outside the dynamic shared memory", (uintptr_t)p);
    return g_smem_addr0 + (uint32_t)(b - t_smem);
}
static float smem_bf16(uint32_t addr) {   // the bf16 at shared address addr, as a float
    if (addr & 1 || addr < g_smem_addr0 || addr - g_smem_addr0 + 2 > t_smem_bytes) wg_fail("wgmma reads outside the dynamic shared memory", addr);
    uint16_t h;
    memcpy(&h, t_smem + (addr - g_smem_addr0), 2);
    return bf16f(h);
}

// ---- descriptors -------------------------------------------------------------------------------------
[[maybe_unused]] static uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {   // as wgmma.cuh's (128-byte swizzle)
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}
struct wg_mat { uint32_t start, lbo, sbo; };
static wg_mat wg_decode(uint64_t desc) {
    if (desc >> 62 != 1) wg_fail("descriptor: only the 128-byte swizzle is modelled", desc);
    if ((desc >> 49) & 7) wg_fail("descriptor: a nonzero base offset is not modelled", desc);
    return {(uint32_t)(desc & 0x3FFF) << 4, (uint32_t)((desc >> 16) & 0x3FFF) << 4, (uint32_t)((desc >> 32) & 0x3FFF) << 4};
}
static uint32_t swz128(uint32_t addr) { return addr ^ (((addr >> 7) & 7) << 4); }   // bits 4-6 ^= bits 7-9
static float wg_kmajor(const wg_mat &t, int m, int k) {   // element (m, k) of a K-major operand, k < 16
    return smem_bf16(swz128(t.start + (uint32_t)(m / 8) * t.sbo + (uint32_t)(m % 8) * 128 + 2 * k));
}
static float wg_mnmajor(const wg_mat &t, int k, int n) {   // element (k, n) of an MN-major B
    return smem_bf16(swz128(t.start + (uint32_t)(n / 64) * t.lbo + (uint32_t)(k / 8) * t.sbo + (uint32_t)(k % 8) * 128 + 2 * (n % 64)));
}

// ---- the warpgroup-collective product ------------------------------------------------------------------
enum { SIM_WGS = 3 };
static std::barrier<> *g_wgbar[SIM_WGS];
static void wgsync() { g_wgbar[threadIdx.x / 128]->arrive_and_wait(); }
static uint64_t g_wg_desc[SIM_WGS][128][2];
static uint32_t g_wg_a[SIM_WGS][128][4];
// d (+)= A B for this thread's fragment of the warpgroup's 64 x N: A from registers (a, the rs form)
// or K-major shared memory (da), B (16 x N) K-major or, b_mn, MN-major; scale_d 0 overwrites d.
template <int N>
static void wg_mma(float d[N / 2], const uint32_t *a, uint64_t da, uint64_t db, bool b_mn, bool scale_d) {
    const int wgi = threadIdx.x / 128, t = threadIdx.x % 128, w = t / 32, g = t % 32 / 4, c = t % 4;
    g_wg_desc[wgi][t][0] = a ? 0 : da;
    g_wg_desc[wgi][t][1] = db;
    if (a)
        for (int r = 0; r < 4; r++) g_wg_a[wgi][t][r] = a[r];
    wgsync();   // the warpgroup has issued it
    for (int u = 0; u < 128; u++)
        if (g_wg_desc[wgi][u][0] != g_wg_desc[wgi][t][0] || g_wg_desc[wgi][u][1] != g_wg_desc[wgi][t][1])
            wg_fail("wgmma: descriptors differ across the warpgroup", g_wg_desc[wgi][u][1]);
    double A[2][16];   // this thread's rows: 16 w + g (h 0) and + 8 (h 1) of the warpgroup's 64
    if (a) {
        for (int cc = 0; cc < 4; cc++)   // lane 4 g + cc holds k 2 cc, +1 (a0, a1) and 2 cc + 8, +9 (a2, a3)
            for (int r = 0; r < 4; r++)
                for (int half = 0; half < 2; half++)
                    A[r & 1][2 * cc + 8 * (r >> 1) + half] = bf16f((uint16_t)(g_wg_a[wgi][32 * w + 4 * g + cc][r] >> (16 * half)));
    } else {
        const wg_mat ta = wg_decode(da);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 16; k++) A[h][k] = wg_kmajor(ta, 16 * w + g + 8 * h, k);
    }
    const wg_mat tb = wg_decode(db);
    for (int i = 0; i < N / 8; i++)
        for (int j = 0; j < 2; j++) {
            const int n = 8 * i + 2 * c + j;
            double B[16];
            for (int k = 0; k < 16; k++) B[k] = b_mn ? wg_mnmajor(tb, k, n) : wg_kmajor(tb, n, k);
            for (int h = 0; h < 2; h++) {
                double s = 0;
                for (int k = 0; k < 16; k++) s += A[h][k] * B[k];
                float &o = d[4 * i + 2 * h + j];
                o = scale_d ? (float)(o + s) : (float)s;
            }
        }
    wgsync();   // everyone has read the posted descriptors and fragments
}

// wgmma.cuh's operations (the instructions' immediate operands: scale-a = scale-b = 1; trans-a 0;
// trans-b 0 for the ss forms, 1 for the rs form)
[[maybe_unused]] static void wgmma_64x64_ss(float d[32], uint64_t da, uint64_t db, int acc) { wg_mma<64>(d, nullptr, da, db, false, acc != 0); }
[[maybe_unused]] static void wgmma_64x256_rs(float d[128], const uint32_t a[4], uint64_t db) { wg_mma<256>(d, a, 0, db, true, true); }
[[maybe_unused]] static void wgmma_64x128_ss(float d[64], uint64_t da, uint64_t db) { wg_mma<128>(d, nullptr, da, db, false, true); }
// Synchronous model: nothing is in flight, so nothing to fence, commit or wait for (see above).
[[maybe_unused]] static void wg_fence() {}
[[maybe_unused]] static void wg_commit() {}
template <int N> static void wg_wait() {}
[[maybe_unused]] static void fence_async_smem() {}

// ---- mbarriers, named barriers, setmaxnreg ---------------------------------------------------------------
// An mbarrier is keyed by its address (the kernel's 8 bytes are not used): the arrivals a phase
// counts, those still missing, and the phase number.
struct sim_mbar {
    int count, pending;
    unsigned phase;
};
static std::mutex g_mbar_mu;
static std::condition_variable g_mbar_cv;
static std::map<const void *, sim_mbar> g_mbars;   // cleared by each launch
[[maybe_unused]] static void mbar_init(uint64_t *b, int count) {
    std::lock_guard<std::mutex> lk(g_mbar_mu);
    g_mbars[b] = {count, count, 0};
}
[[maybe_unused]] static void mbar_init_fence() {}
[[maybe_unused]] static void mbar_arrive(uint64_t *b) {
    std::lock_guard<std::mutex> lk(g_mbar_mu);
    auto it = g_mbars.find(b);
    if (it == g_mbars.end()) wg_fail("mbarrier arrive before init", (uintptr_t)b);
    if (--it->second.pending == 0) {
        it->second.pending = it->second.count;
        it->second.phase++;
        g_mbar_cv.notify_all();
    }
}
// Waits until the phase of parity `parity` has completed: the current phase's parity is the other one.
[[maybe_unused]] static void mbar_wait(uint64_t *b, int parity) {
    std::unique_lock<std::mutex> lk(g_mbar_mu);
    auto it = g_mbars.find(b);
    if (it == g_mbars.end()) wg_fail("mbarrier wait before init", (uintptr_t)b);
    g_mbar_cv.wait(lk, [&] { return (int)(it->second.phase & 1) != parity; });
}
static std::barrier<> *g_named[3];   // ids 1 and 2, 256 threads each
[[maybe_unused]] static void named_sync(int id, int n) {
    if (id < 1 || id > 2 || n != 256) wg_fail("named barrier: only ids 1 and 2 of 256 threads are modelled", (unsigned)id);
    g_named[id]->arrive_and_wait();
}
[[maybe_unused]] static void named_arrive(int id, int n) {
    if (id < 1 || id > 2 || n != 256) wg_fail("named barrier: only ids 1 and 2 of 256 threads are modelled", (unsigned)id);
    (void)g_named[id]->arrive();
}
[[maybe_unused]] static void regs_producer() {}
[[maybe_unused]] static void regs_consumer() {}
