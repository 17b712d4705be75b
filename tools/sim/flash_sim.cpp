// flash_sim.cpp: runs the device code of src/cuda/flash.cuh (the prefill FlashAttention kernel, both
// modes) on the host, a block as 256 threads, with the shim of tools/sim/sim_block.h: __syncthreads
// is a block barrier; ldmatrix (.trans too), mma and shuffles are warp-collective exchanges through
// shared arrays between warp barriers, by the PTX ISA fragment layouts; cp.async copies land at once
// or as late as their wait_group allows (so a buffer overwritten while still read, or read before
// its wait, shows). The products run in double, so both modes are checked tightly against CPU twins
// of their own arithmetic: exact vs the softmax formula on fp32 q; fast vs q rounded to bf16 and the
// online softmax over the same 64-key tiles with bf16(P) times V. Also: rows past the chunk and other
// heads' outputs are never written.
// The wgmma kernel (flash_wg.cuh's flash_ws_kernel, D = 256: 384 threads, a producer warpgroup,
// mbarriers, named barriers for the ping-pong) runs on the models of tools/sim/sim_wgmma.h
// (descriptors decoded, the 128-byte swizzle on shared addresses, fragments by the PTX layouts)
// against the same fast twin and bounds, and must equal the mma.sync fast kernel bit for bit on the
// same inputs (both models round each k16 product sum to float once, in the same k order); with the
// copies landing at once, a producer that refilled a stage still being read would show. It also runs
// with the dynamic shared memory starting off a 1 KB boundary (its own alignment must absorb it).
// The bf16 store (the fast mode's o_proj input, k_flash_attention's ob; fa_store on uint16_t): every
// fast kernel (mma.sync at D 64 and 256, wgmma) run again with it must write f2bf16 of its own fp32
// output, bit for bit, and nothing past the chunk.
//
//   make flash-sim
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

// ---- the shim ----------------------------------------------------------------------------------------
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define FA_HOST_SIM 1
#define WARP_SIZE 32
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define FA_DYNAMIC_SMEM(name)                                           \
    alignas(16) static uint16_t name[(2 * FA_BM + 4 * FA_BN) * D]; \
    sim_smem_region(name, sizeof name)
struct uint4 { uint32_t x, y, z, w; };
struct float4 { float x, y, z, w; };
static uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
#include "sim_bf16.h"
#include "sim_block.h"
#include "sim_wgmma.h"
static int min(int a, int b) { return a < b ? a : b; }
static float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
static void split_bf16(float f, uint16_t *hi, uint16_t *lo) {
    *hi = f2bf16(f);
    *lo = f2bf16(f - __uint_as_float((uint32_t)*hi << 16));
}
static uint32_t pack2(uint16_t lo_half, uint16_t hi_half) { return (uint32_t)lo_half | ((uint32_t)hi_half << 16); }
static uint32_t bf16x2_rn(float lo_half, float hi_half) { return pack2(f2bf16(lo_half), f2bf16(hi_half)); }
static void ldsm_x4_t(uint32_t r[4], const void *p) {   // transposed: rows 2 (l % 4), +1 of column l / 4
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_addr[w][l] = p;
    wsync();
    for (int j = 0; j < 4; j++) {
        const uint16_t *r0 = (const uint16_t *)g_addr[w][8 * j + 2 * (l % 4)];
        const uint16_t *r1 = (const uint16_t *)g_addr[w][8 * j + 2 * (l % 4) + 1];
        r[j] = pack2(r0[l / 4], r1[l / 4]);
    }
    wsync();
}
#include "flash.cuh"
#define __CUDA_ARCH_FEAT_SM90_ALL 1   // flash_wg.cuh's wgmma body, on sim_wgmma.h's model
#include "flash_wg.cuh"

// ---- the check -----------------------------------------------------------------------------------------
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd() { rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; return (uint32_t)(rng >> 11); }
static float frand() { return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }

// KIND 0: flash_attention_kernel<D, EXACT> (mma.sync), 256 threads; 3: flash_ws_kernel (wgmma,
// warp-specialized, with ping-pong), 384 threads. OT: the output's type (float; uint16_t: the bf16
// store, fast mode only).
template <int D, bool EXACT, int KIND = 0, typename OT = float>
static void launch(const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, OT *o, int T, int p0,
                   int cap, int n_heads, int n_kv) {
    constexpr int NT = KIND >= 2 ? (int)FW_WS_THREADS : (int)FA_THREADS;
    gridDim = {(unsigned)CEIL_DIV(T, FA_BM / (n_heads / n_kv)), (unsigned)n_kv, 1};
    for (unsigned by = 0; by < gridDim.y; by++)
        for (unsigned bx = 0; bx < gridDim.x; bx++) {
            blockIdx = {bx, by, 0};
            std::barrier<> bar(NT);
            for (int w = 0; w < NT / 32; w++) g_wbar[w] = new std::barrier<>(32);
            for (int w = 0; w < NT / 128; w++) g_wgbar[w] = new std::barrier<>(128);
            for (int i = 1; i <= 2; i++) g_named[i] = new std::barrier<>(256);
            g_mbars.clear();
            g_bar = &bar;
            std::vector<std::thread> th;
            for (int t = 0; t < NT; t++)
                th.emplace_back([&, t] {
                    threadIdx = {(unsigned)t, 0, 0};
                    t_groups.clear();
                    t_open.clear();
                    if constexpr (KIND >= 2) flash_ws_kernel(q, qg, kc, vc, o, T, p0, cap, n_heads, n_kv);
                    else flash_attention_kernel<D, EXACT>(q, qg, kc, vc, o, T, p0, cap, n_heads, n_kv);
                });
            for (auto &h : th) h.join();
            for (int w = 0; w < NT / 32; w++) delete g_wbar[w];
            for (int w = 0; w < NT / 128; w++) delete g_wgbar[w];
            for (int i = 1; i <= 2; i++) delete g_named[i];
        }
}

static int fails;
static std::vector<std::vector<float>> g_out;   // each case's output with the copies at once

// The fast form KIND run with the bf16 store on the inputs that gave the fp32 output o ([T + 2] rows):
// whether it wrote f2bf16(o) over the chunk's T rows and nothing past them (poison 0xffff kept).
template <int D, int KIND>
static bool bf16_store_ok(const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc,
                          const std::vector<float> &o, int T, int p0, int cap, int n_heads, int n_kv) {
    std::vector<uint16_t> ob(o.size(), 0xffff);
    launch<D, false, KIND>(q, qg, kc, vc, ob.data(), T, p0, cap, n_heads, n_kv);
    const size_t n = (size_t)T * n_heads * D;
    for (size_t i = 0; i < ob.size(); i++)
        if (ob[i] != (i < n ? f2bf16(o[i]) : (uint16_t)0xffff)) return false;
    return true;
}
// WG: the wgmma kernel (fast, D = 256), also compared bit for bit with the mma.sync fast kernel
template <int D, bool EXACT, bool WG = false>
static void run_case(int idx, int T, int p0, int n_heads, int n_kv) {
    static_assert(!WG || (D == FW_D && !EXACT), "the wgmma kernel: fast mode, D = 256");
    if (flash_smem_bytes(D, EXACT) > (size_t)(2 * FA_BM + 4 * FA_BN) * D * 2) abort();
    if (WG && flash_wg_smem_bytes() > (size_t)(2 * FA_BM + 4 * FA_BN) * D * 2) abort();
    rng = 88172645463325252ull + (uint64_t)idx;   // the same inputs in both cp.async modes
    const int cap = p0 + T + 5, G = n_heads / n_kv, QD = n_heads * D;
    std::vector<float> q((size_t)T * QD), qg((size_t)T * 2 * QD), o((size_t)(T + 2) * QD, NAN);
    std::vector<uint16_t> kc((size_t)n_kv * cap * D), vc((size_t)n_kv * cap * D);
    for (auto &v : q) v = 1.5f * frand();
    for (auto &v : qg) v = 2.0f * frand();
    for (size_t i = 0; i < kc.size(); i++) kc[i] = f2bf16(frand()), vc[i] = f2bf16(frand());
    launch<D, EXACT, WG ? 3 : 0>(q.data(), qg.data(), kc.data(), vc.data(), o.data(), T, p0, cap, n_heads, n_kv);
    bool eq_mma = true, bf_ok = true;
    if constexpr (WG) {   // the mma.sync fast kernel on the same inputs; both kernels' bf16 stores
        std::vector<float> o2(o.size(), NAN);
        launch<D, false>(q.data(), qg.data(), kc.data(), vc.data(), o2.data(), T, p0, cap, n_heads, n_kv);
        eq_mma = !memcmp(o2.data(), o.data(), o.size() * sizeof(float));
        bf_ok = bf16_store_ok<D, 3>(q.data(), qg.data(), kc.data(), vc.data(), o, T, p0, cap, n_heads, n_kv) &&
                bf16_store_ok<D, 0>(q.data(), qg.data(), kc.data(), vc.data(), o2, T, p0, cap, n_heads, n_kv);
    } else if constexpr (!EXACT) {   // the mma.sync kernel's bf16 store
        bf_ok = bf16_store_ok<D, 0>(q.data(), qg.data(), kc.data(), vc.data(), o, T, p0, cap, n_heads, n_kv);
    }
    // twins in double; error relative to sigma_d sum_j pi_j |v_jd|
    const double sl2 = 1.0 / sqrt((double)D) * 1.4426950408889634;
    double worst = 0;
    long bad = 0, stray = 0;
    for (size_t i = (size_t)T * QD; i < o.size(); i++) stray += !std::isnan(o[i]);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *qh = &q[((size_t)t * n_heads + h) * D];
            const int kvh = h / G, nk = p0 + t + 1;
            const uint16_t *K = &kc[(size_t)kvh * cap * D], *V = &vc[(size_t)kvh * cap * D];
            std::vector<double> s(nk), acc(D, 0), vab(D, 0);
            double l = 0;
            for (int j = 0; j < nk; j++) {
                double d2 = 0;
                for (int d = 0; d < D; d++)
                    d2 += (double)(EXACT ? qh[d] : bf16f(f2bf16(qh[d]))) * bf16f(K[(size_t)j * D + d]);
                s[j] = d2 * sl2;
            }
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < nk; j++) mx = std::max(mx, s[j]);
            for (int j = 0; j < nk; j++) sum += exp2(s[j] - mx);
            for (int j = 0; j < nk; j++)
                for (int d = 0; d < D; d++) vab[d] += exp2(s[j] - mx) / sum * fabs(bf16f(V[(size_t)j * D + d]));
            if (EXACT) {
                for (int j = 0; j < nk; j++)
                    for (int d = 0; d < D; d++) acc[d] += exp2(s[j] - mx) / sum * bf16f(V[(size_t)j * D + d]);
                l = 1;
            } else {   // the kernel's float steps: scores summed in float per k16 (as the sim's mma), base 2
                const float sl2f = rsqrtf((float)D) * 1.4426950408889634f;
                float mf = -INFINITY;
                for (int j0 = 0; j0 < nk; j0 += 64) {
                    const int j1 = std::min(j0 + 64, nk);
                    float xs[64], mt = mf;
                    for (int j = j0; j < j1; j++) {
                        float sf = 0;
                        for (int k0 = 0; k0 < D; k0 += 16) {
                            double c = 0;
                            for (int k = k0; k < k0 + 16; k++)
                                c += (double)bf16f(f2bf16(qh[k])) * bf16f(K[(size_t)j * D + k]);
                            sf = (float)(sf + c);
                        }
                        xs[j - j0] = sf * sl2f;
                        mt = fmaxf(mt, xs[j - j0]);
                    }
                    const double corr = exp2f(mf - mt);
                    l *= corr;
                    for (int d = 0; d < D; d++) acc[d] *= corr;
                    for (int j = j0; j < j1; j++) {
                        const float p = exp2f(xs[j - j0] - mt);
                        l += p;
                        for (int d = 0; d < D; d++) acc[d] += (double)bf16f(f2bf16(p)) * bf16f(V[(size_t)j * D + d]);
                    }
                    mf = mt;
                }
            }
            const float *gate = &qg[((size_t)t * n_heads + h) * 2 * D + D];
            for (int d = 0; d < D; d++) {
                const double sig = 1.0 / (1.0 + exp(-(double)gate[d])), want = acc[d] / l * sig;
                const double err = fabs(o[((size_t)t * n_heads + h) * D + d] - want) / (sig * vab[d] * 1e-5 + 1e-30);
                if (!(err <= 1)) bad++;
                if (err > worst) worst = err;
            }
        }
    bool same = true;   // the pipeline must not change a bit: copies at once or as late as allowed
    if (!g_defer) g_out.push_back(o);
    else same = !memcmp(g_out[idx].data(), o.data(), o.size() * sizeof(float));
    const bool ok = !bad && !stray && same && eq_mma && bf_ok;
    fails += !ok;
    char smem[40] = "";
    if (g_smem_addr0 % 1024) snprintf(smem, sizeof smem, " (smem at 1 KB + %u)", g_smem_addr0 % 1024);
    printf("%-11s D %3d G %3d T %3d p0 %4d%s: err/(1e-5 sigma sum pi|v|) max %.3f, %ld bad, %ld stray%s%s%s  %s\n",
           WG ? "fast wgmma" : EXACT ? "exact" : "fast", D, G, T, p0, smem, worst, bad, stray,
           WG ? eq_mma ? ", = mma.sync" : ", != mma.sync" : "",
           EXACT ? "" : bf_ok ? ", bf16 o = bf16(o)" : ", bf16 o != bf16(o)", g_defer ? same ? ", = at once" : ", != at once" : "",
           ok ? "PASS" : "FAIL");
}

int main() {
    for (g_defer = 0; g_defer < 2; g_defer++) {
        printf("# cp.async %s\n", g_defer ? "deferred to its wait_group" : "at once");
        run_case<256, false>(0, 20, 70, 16, 2);   // the model's heads: GQA 8, D 256; mid-tile start, 2 blocks
        run_case<256, true>(1, 20, 70, 16, 2);
        run_case<64, false>(2, 45, 130, 8, 2);    // G 4: 32 tokens a block; 3 key tiles, a partial block
        run_case<64, true>(3, 45, 130, 8, 2);
        run_case<64, false>(4, 3, 0, 8, 2);       // one tile, mostly empty rows
        run_case<64, true>(5, 3, 0, 8, 2);
        run_case<256, false, true>(6, 20, 70, 16, 2);    // wgmma: the model's G 8, 2 blocks a kv head, 2 tiles
        run_case<256, false, true>(7, 45, 130, 8, 2);    // G 4: 3 key tiles, a partial block
        run_case<256, false, true>(8, 130, 0, 2, 2);     // G 1: 128 tokens a block, 2 blocks, 3 tiles
        run_case<256, false, true>(9, 3, 0, 32, 2);      // G 16: one tile, mostly empty rows
        g_smem_addr0 = 1024 + 528;                        // dynamic shared memory off a 1 KB boundary
        run_case<256, false, true>(10, 20, 70, 16, 2);
        g_smem_addr0 = 1024;
    }
    printf("flash-sim: %s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
