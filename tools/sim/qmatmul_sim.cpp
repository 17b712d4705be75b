// qmatmul_sim.cpp: runs the device code of src/cuda/qmatmul_bf16.cuh (the fast-mode qmatmul kernel)
// on the host, a block as 256 threads: __syncthreads is a block barrier; ldmatrix, mma and shuffles
// are warp-collective exchanges through shared arrays between warp barriers, by the PTX ISA fragment
// layouts (ldmatrix .x4: lanes 8j..8j+7 give the row addresses of matrix j, lane l receives row l / 4,
// columns 2 (l % 4), +1 of each; mma.m16n8k16.row.col bf16 with fp32 accumulation, the exact
// kernel's). cp.async copies land at once or as late as their wait_group allows (the pipeline's
// timing is not simulated, its index math is). Checks the dense and grouped forms (xmap / xdiv,
// ymap, empty experts, row and feature tails, 4 and 8 bits) against a double reference on the same
// bf16 x and the same bf16 weights (s q + b rounded once). Each case then runs
// the GLU form (k_qmatmul_bf16_swiglu's epilogue) on a random gate and checks its bf16 output bit for
// bit against the unfused computation on the plain form's y (k_swiglu's silu(g) u, then k_to_bf16's
// rounding), and that it writes nothing else.
// The products (wgmma m64n128k16 from shared memory) run on the warpgroup-product model of
// tools/sim/sim_wgmma.h (descriptors decoded, the 128-byte swizzle on shared addresses, fragments by
// the PTX layouts). Every case runs twice: with the copies landing at once, then deferred to their
// wait_group with the dynamic shared memory starting off a 1 KB boundary, which the kernel's own
// alignment must absorb. The segmented launch (several products of one x: the kernel's SEGS form,
// k_qmatmul_bf16_segs) must equal each product's own launch bit for bit.
// The exact kernel (qmatmul_exact.cuh: k_qmatmul, k_qmatmul_segs) runs too: each product alone against
// a double reference, and its segmented launch against them bit for bit. The add form of both kernels
// (k_qmatmul_bf16_add, k_qmatmul_add: y += W x) must equal y's start plus the plain form's output bit
// for bit, and leave every other element of y as it was.
//
//   make qmatmul-sim
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "bf16.h"
#include "cuda/kernels.h"
#include "sim_bf16.h"

// ---- the shim ----------------------------------------------------------------------------------------
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define QB_HOST_SIM 1
#define WARP_SIZE 32
#define QGROUP 64
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define QB_DYNAMIC_SMEM(name)                                                    \
    alignas(16) static unsigned char name[QB_SMEM<BITS>]; \
    sim_smem_region(name, sizeof name)
#define __align__(n) __attribute__((aligned(n)))
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
static uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
static float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static float silu_f(float x) { return x / (1.0f + expf(-x)); }   // common.cuh's
#include "sim_block.h"
#include "sim_wgmma.h"
static uint32_t bf2_minus128(uint32_t v) {   // fma.rn.bf16x2 v * 1 + (-128): exact for 128 + q
    const uint16_t lo = f2bf16(bf16f((uint16_t)v) - 128.0f), hi = f2bf16(bf16f((uint16_t)(v >> 16)) - 128.0f);
    return lo | (uint32_t)hi << 16;
}
static uint32_t bf2_fma(uint32_t a, uint32_t s, uint32_t b) {   // fma.rn.bf16x2: each half rounded once
    const uint16_t lo = bf16_fma_round(bf16f((uint16_t)a), bf16f((uint16_t)s), bf16f((uint16_t)b));
    const uint16_t hi = bf16_fma_round(bf16f((uint16_t)(a >> 16)), bf16f((uint16_t)(s >> 16)), bf16f((uint16_t)(b >> 16)));
    return lo | (uint32_t)hi << 16;
}
static uint32_t pack2(uint16_t lo_half, uint16_t hi_half) { return (uint32_t)lo_half | ((uint32_t)hi_half << 16); }
static void split_bf16(float f, uint16_t *hi, uint16_t *lo) {   // mma.cuh's
    *hi = f2bf16(f);
    *lo = f2bf16(f - __uint_as_float((uint32_t)*hi << 16));
}
#define __CUDA_ARCH_FEAT_SM90_ALL 1   // the kernel's wgmma body, on sim_wgmma.h's model
#include "qmatmul_bf16.cuh"
#include "qmatmul_exact.cuh"

// ---- the check -----------------------------------------------------------------------------------------
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd() { rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; return (uint32_t)(rng >> 11); }
static float frand() { return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }

template <int BITS, bool GLU, bool SEGS = false, bool ADD = false>
static void launch_segs(dim3s grid, const qm_segs &S, const uint16_t *x, int ldx, const int *xmap, int xdiv,
                        const int *ymap, int M, const int *counts, const int *offs, const float *gate, uint16_t *yb) {
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                blockIdx = {bx, by, bz};
                std::barrier<> bar(QB_THREADS);
                for (int w = 0; w < 8; w++) g_wbar[w] = new std::barrier<>(32);
                for (int w = 0; w < 2; w++) g_wgbar[w] = new std::barrier<>(128);
                g_bar = &bar;
                std::vector<std::thread> th;
                for (int t = 0; t < QB_THREADS; t++)
                    th.emplace_back([&, t] {
                        threadIdx = {(unsigned)t, 0, 0};
                        t_groups.clear();
                        t_open.clear();
                        qmatmul_bf16_kernel<BITS, GLU, SEGS, ADD>(S.s[0].W, x, ldx, xmap, xdiv, S.s[0].y,
                                                                  S.s[0].ldy, ymap, M, counts, offs, gate, yb, S);
                    });
                for (auto &h : th) h.join();
                for (int w = 0; w < 8; w++) delete g_wbar[w];
                for (int w = 0; w < 2; w++) delete g_wgbar[w];
            }
}

// One product, as the single-product launchers run it: a table of one segment (qm_table), SEGS off.
template <int BITS, bool GLU>
static void launch(dim3s grid, struct dqt W, const uint16_t *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                   const int *ymap, int M, const int *counts, const int *offs, const float *gate, uint16_t *yb) {
    const qm_seg seg = {W, y, ldy};
    qm_segs S;
    if (qm_table(&seg, 1, QB_BN, &S) != (int)grid.x) {
        printf("qm_table: one segment of %d rows is not %u tiles\n", W.rows, grid.x);
        exit(1);
    }
    launch_segs<BITS, GLU>(grid, S, x, ldx, xmap, xdiv, ymap, M, counts, offs, gate, yb);
}

static int fails;
// One case: n_mat matrices [N, K]; dense (counts empty) over M rows, or grouped with counts.
static void run_case(const char *name, int bits, int N, int K, int M, std::vector<int> counts, int xdiv, bool use_xmap,
                     bool use_ymap) {
    const bool grouped = !counts.empty();
    const int E = grouped ? (int)counts.size() : 1, per = 32 / bits, wpr = K / per, gpr = K / 64;
    std::vector<int> offs(E, 0);
    int R = M, maxrows = 0;
    if (grouped) {
        R = 0;
        for (int e = 0; e < E; e++) offs[e] = R, R += counts[e], maxrows = counts[e] > maxrows ? counts[e] : maxrows;
    }
    const int xrows = use_xmap ? (R + xdiv - 1) / xdiv + 3 : R, ldx = K + 8, ldy = N + 3;
    std::vector<uint32_t> w((size_t)E * N * wpr);
    std::vector<uint16_t> sc((size_t)E * N * gpr), bi((size_t)E * N * gpr);
    for (auto &v : w) v = rnd() ^ (rnd() << 16);
    for (size_t i = 0; i < sc.size(); i++) sc[i] = f2bf16(0.01f * (1.5f + frand())), bi[i] = f2bf16(-0.05f + 0.02f * frand());
    std::vector<uint16_t> xb((size_t)xrows * ldx + 64);
    uint16_t *x = (uint16_t *)(((uintptr_t)xb.data() + 15) & ~(uintptr_t)15);
    for (int i = 0; i < xrows * ldx; i++) x[i] = f2bf16(frand());
    std::vector<int> xmap(R), ymap(R);
    for (int r = 0; r < R; r++) xmap[r] = (int)(rnd() % (uint32_t)(xrows * xdiv));   // any x row
    const int yrows = use_ymap ? R + 5 : R;
    for (int r = 0; r < R; r++) ymap[r] = r;
    if (use_ymap)
        for (int r = R - 1; r > 0; r--) std::swap(ymap[r], ymap[rnd() % (r + 1)]);   // a permutation
    std::vector<float> y((size_t)yrows * ldy, NAN), gate((size_t)yrows * ldy);
    for (auto &v : gate) v = 4.0f * frand();   // silu's curved part and both tails
    std::vector<uint16_t> yb((size_t)yrows * ldy, 0xffff);   // the GLU form's output, poisoned (a NaN)
    struct dqt W = {w.data(), sc.data(), bi.data(), grouped ? E : 0, N, K, bits};
    const int rows = grouped ? maxrows : M;
    dim3s grid = {(unsigned)CEIL_DIV(N, QB_BN), (unsigned)CEIL_DIV(rows, QB_BM), (unsigned)(grouped ? E : 1)};
    if (grouped && M > 0) grid = {grid.x, (unsigned)(CEIL_DIV(M, QB_BM) + E), 1};   // the compact grid (qb_tile_of)
    // reference: y[yrow] = W[e] x[xrow] in double, with sum |w x| for the bound; every other element
    // of y untouched (NaN)
    std::vector<char> written((size_t)yrows * ldy, 0);
    std::vector<double> ref((size_t)yrows * ldy, 0), refa((size_t)yrows * ldy, 0);
    for (int e = 0; e < E; e++)
        for (int r = offs[e]; r < offs[e] + (grouped ? counts[e] : M); r++) {
            const int xr = use_xmap ? xmap[r] / xdiv : r, yr = use_ymap ? ymap[r] : r;
            for (int n = 0; n < N; n++) {
                const size_t row = (size_t)e * N + n;
                double s = 0, sa = 0;
                for (int k = 0; k < K; k++) {
                    const uint32_t q = (w[row * wpr + k / per] >> ((k % per) * bits)) & ((1u << bits) - 1);
                    const double wk = bf16f(bf16_fma_round((float)q, bf16f(sc[row * gpr + k / 64]), bf16f(bi[row * gpr + k / 64])));
                    s += wk * bf16f(x[(size_t)xr * ldx + k]);
                    sa += fabs(wk * bf16f(x[(size_t)xr * ldx + k]));
                }
                written[(size_t)yr * ldy + n] = 1;
                ref[(size_t)yr * ldy + n] = s;
                refa[(size_t)yr * ldy + n] = sa;
            }
        }
    std::fill(y.begin(), y.end(), NAN);
    std::fill(yb.begin(), yb.end(), (uint16_t)0xffff);
    if (rows > 0) {
        auto go = [&](auto kern, float *yo, const float *g, uint16_t *ybo) {
            kern(grid, W, x, ldx, use_xmap ? xmap.data() : nullptr, xdiv, yo, ldy, use_ymap ? ymap.data() : nullptr, M,
                 grouped ? counts.data() : nullptr, offs.data(), g, ybo);
        };
        auto forms = [&](auto b) {   // the plain form into y, the GLU form into yb
            constexpr int B = decltype(b)::value;
            go(launch<B, false>, y.data(), nullptr, nullptr);
            go(launch<B, true>, nullptr, gate.data(), yb.data());
        };
        if (bits == 4) forms(std::integral_constant<int, 4>{});
        else forms(std::integral_constant<int, 8>{});
    }
    double worst = 0;
    long bad = 0, stray = 0, glu_diff = 0, glu_stray = 0;
    for (size_t i = 0; i < y.size(); i++) {
        if (!written[i]) {
            stray += !std::isnan(y[i]);
            continue;
        }
        const double err = fabs(y[i] - ref[i]) / (refa[i] * 1e-6 + 1e-30);
        if (!(err <= 1)) bad++;
        if (err > worst) worst = err;
    }
    // GLU: the unfused pair on the plain form's y, swiglu into fp32 memory then to_bf16
    for (size_t i = 0; i < y.size(); i++) {
        if (!written[i]) {
            glu_stray += yb[i] != 0xffff;
            continue;
        }
        volatile float act = silu_f(gate[i]) * y[i];   // k_swiglu's store
        glu_diff += yb[i] != f2bf16(act);
    }
    const bool ok = !bad && !stray && !glu_diff && !glu_stray;
    fails += !ok;
    printf("%-8s %-38s %d-bit N %4d K %4d rows %4d: err/(1e-6 sum|wx|) max %.3f, %ld bad, %ld stray; GLU %ld "
           "differ, %ld stray  %s\n",
           "wgmma", name, bits, N, K, R, worst, bad, stray, glu_diff, glu_stray, ok ? "PASS" : "FAIL");
}

// Segments (k_qmatmul_bf16_segs): n dense products of one x [M, K] (the same K and bits), each into
// its own poisoned output with its own row stride, in one launch (the kernel's SEGS form), against
// each product run alone (one segment, as k_qmatmul_bf16 runs it): every output buffer, padding and
// poison included, equal bit for bit. Also the table's refusals (n, K, bits, rows).
template <int BITS>
static void run_segs_case(const char *name, std::vector<int> Ns, int K, int M) {
    const int n = (int)Ns.size(), per = 32 / BITS, wpr = K / per, gpr = K / 64, ldx = K + 16;
    std::vector<std::vector<uint32_t>> w(n);
    std::vector<std::vector<uint16_t>> sc(n), bi(n);
    std::vector<qm_seg> seg(n);
    std::vector<std::vector<float>> ys(n), ya(n);
    std::vector<uint16_t> xb((size_t)M * ldx + 64);
    uint16_t *x = (uint16_t *)(((uintptr_t)xb.data() + 15) & ~(uintptr_t)15);
    for (int i = 0; i < M * ldx; i++) x[i] = f2bf16(frand());
    int tiles = 0;
    for (int i = 0; i < n; i++) {
        const int N = Ns[i], ldy = N + 1 + 2 * i;   // strides of their own
        w[i].resize((size_t)N * wpr), sc[i].resize((size_t)N * gpr), bi[i].resize((size_t)N * gpr);
        for (auto &v : w[i]) v = rnd() ^ (rnd() << 16);
        for (size_t j = 0; j < sc[i].size(); j++)
            sc[i][j] = f2bf16(0.01f * (1.5f + frand())), bi[i][j] = f2bf16(-0.05f + 0.02f * frand());
        ys[i].assign((size_t)M * ldy + 7, NAN);
        ya[i].assign((size_t)M * ldy + 7, NAN);
        seg[i] = {{w[i].data(), sc[i].data(), bi[i].data(), 0, N, K, BITS}, ys[i].data(), ldy};
        tiles += CEIL_DIV(N, QB_BN);
    }
    const unsigned gy = (unsigned)CEIL_DIV(M, QB_BM);
    for (int i = 0; i < n; i++)   // alone: one segment each
        launch<BITS, false>({(unsigned)CEIL_DIV(Ns[i], QB_BN), gy, 1}, seg[i].W, x, ldx, nullptr, 1, ys[i].data(),
                            seg[i].ldy, nullptr, M, nullptr, nullptr, nullptr, nullptr);
    std::vector<qm_seg> sa = seg;
    for (int i = 0; i < n; i++) sa[i].y = ya[i].data();
    qm_segs S;
    const int got = qm_table(sa.data(), n, QB_BN, &S);
    const dim3s grid = {(unsigned)got, gy, 1};
    if (n > 1)   // as k_qmatmul_bf16_segs: the SEGS form past one segment
        launch_segs<BITS, false, true>(grid, S, x, ldx, nullptr, 1, nullptr, M, nullptr, nullptr, nullptr, nullptr);
    else
        launch_segs<BITS, false>(grid, S, x, ldx, nullptr, 1, nullptr, M, nullptr, nullptr, nullptr, nullptr);
    long differ = 0, written = 0, want = 0;
    for (int i = 0; i < n; i++) {
        differ += memcmp(ys[i].data(), ya[i].data(), ys[i].size() * sizeof(float)) != 0;
        for (float v : ya[i]) written += !std::isnan(v);
        want += (long)M * Ns[i];
    }
    // the table refuses what cannot share a launch
    qm_segs R;
    std::vector<qm_seg> bad = seg;
    bool refuses = !qm_table(seg.data(), 0, QB_BN, &R) && !qm_table(seg.data(), QM_MAX_SEGS + 1, QB_BN, &R);
    if (n > 1) {
        bad[n - 1].W.cols += 64;
        refuses = refuses && !qm_table(bad.data(), n, QB_BN, &R);
        bad = seg, bad[n - 1].W.bits = 12 - BITS;
        refuses = refuses && !qm_table(bad.data(), n, QB_BN, &R);
        bad = seg, bad[n - 1].W.rows = 0;
        refuses = refuses && !qm_table(bad.data(), n, QB_BN, &R);
    }
    const bool ok = got == tiles && !differ && written == want && refuses;
    fails += !ok;
    printf("%-8s %-38s %d-bit K %4d rows %4d: %d segments, %d tiles; %ld of %d outputs differ from alone, %ld of %ld "
           "written%s  %s\n", "wgmma", name, BITS, K, M, n, got, differ, n, written, want,
           refuses ? "" : "; a bad table accepted", ok ? "PASS" : "FAIL");
}

// The exact kernel (qmatmul_exact.cuh, k_qmatmul / k_qmatmul_segs), a block as 256 threads.
template <int BITS, bool SEGS, bool ADD = false>
static void launch_exact(dim3s grid, const qm_segs &S, const float *x, int ldx, int M) {
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx = {bx, by, 0};
            std::barrier<> bar(MM_THREADS);
            for (int w = 0; w < 8; w++) g_wbar[w] = new std::barrier<>(32);
            g_bar = &bar;
            std::vector<std::thread> th;
            for (int t = 0; t < MM_THREADS; t++)
                th.emplace_back([&, t] {
                    threadIdx = {(unsigned)t, 0, 0};
                    qmatmul_kernel<BITS, SEGS, ADD>(S.s[0].W, x, ldx, nullptr, 1, S.s[0].y, S.s[0].ldy, nullptr, M, nullptr,
                                               nullptr, S);
                });
            for (auto &h : th) h.join();
            for (int w = 0; w < 8; w++) delete g_wbar[w];
        }
}

// The exact kernel's segments: each product alone (one segment, SEGS off: k_qmatmul) against a double
// reference (|y - ref| <= 2e-5 sum_k (|s q| + |b|) |x|: x as hi + lo keeps ~16 bits), then the
// segmented launch (k_qmatmul_segs) against the products alone, every output buffer bit for bit.
template <int BITS>
static void run_exact_segs_case(const char *name, std::vector<int> Ns, int K, int M) {
    const int n = (int)Ns.size(), per = 32 / BITS, wpr = K / per, gpr = K / 64, ldx = K + 4;
    std::vector<std::vector<uint32_t>> w(n);
    std::vector<std::vector<uint16_t>> sc(n), bi(n);
    std::vector<qm_seg> seg(n);
    std::vector<std::vector<float>> ys(n), ya(n);
    std::vector<float> xv((size_t)M * ldx + 4);
    float *x = (float *)(((uintptr_t)xv.data() + 15) & ~(uintptr_t)15);
    for (int i = 0; i < M * ldx; i++) x[i] = frand();
    long bad = 0, differ = 0, written = 0, want = 0;
    double worst = 0;
    const unsigned gy = (unsigned)CEIL_DIV(M, MM_BM);
    for (int i = 0; i < n; i++) {
        const int N = Ns[i], ldy = N + 3 + i;
        w[i].resize((size_t)N * wpr), sc[i].resize((size_t)N * gpr), bi[i].resize((size_t)N * gpr);
        for (auto &v : w[i]) v = rnd() ^ (rnd() << 16);
        for (size_t j = 0; j < sc[i].size(); j++)
            sc[i][j] = f2bf16(0.01f * (1.5f + frand())), bi[i][j] = f2bf16(-0.05f + 0.02f * frand());
        ys[i].assign((size_t)M * ldy + 5, NAN);
        ya[i].assign((size_t)M * ldy + 5, NAN);
        seg[i] = {{w[i].data(), sc[i].data(), bi[i].data(), 0, N, K, BITS}, ys[i].data(), ldy};
        qm_segs S1;
        const int t1 = qm_table(&seg[i], 1, MM_BN, &S1);
        launch_exact<BITS, false>({(unsigned)t1, gy, 1}, S1, x, ldx, M);
        for (int r = 0; r < M; r++)
            for (int c = 0; c < N; c++) {
                double s = 0, sa = 0;
                for (int k = 0; k < K; k++) {
                    const uint32_t q = (w[i][(size_t)c * wpr + k / per] >> ((k % per) * BITS)) & ((1u << BITS) - 1);
                    const size_t gi = (size_t)c * gpr + k / 64;
                    const double sg = bf16f(sc[i][gi]), bg = bf16f(bi[i][gi]);
                    s += (sg * q + bg) * x[(size_t)r * ldx + k];
                    sa += (fabs(sg * q) + fabs(bg)) * fabs(x[(size_t)r * ldx + k]);
                }
                const double e = fabs(ys[i][(size_t)r * ldy + c] - s) / (2e-5 * sa + 1e-30);
                bad += !(e <= 1);
                worst = e > worst ? e : worst;
            }
        want += (long)M * N;
    }
    std::vector<qm_seg> sa = seg;
    for (int i = 0; i < n; i++) sa[i].y = ya[i].data();
    qm_segs S;
    const int tiles = qm_table(sa.data(), n, MM_BN, &S);
    if (n > 1) launch_exact<BITS, true>({(unsigned)tiles, gy, 1}, S, x, ldx, M);
    else launch_exact<BITS, false>({(unsigned)tiles, gy, 1}, S, x, ldx, M);
    for (int i = 0; i < n; i++) {
        differ += memcmp(ys[i].data(), ya[i].data(), ys[i].size() * sizeof(float)) != 0;
        for (float v : ya[i]) written += !std::isnan(v);
    }
    const bool ok = !bad && !differ && written == want;
    fails += !ok;
    printf("%-8s %-38s %d-bit K %4d rows %4d: %d segments, %d tiles; alone err/bound max %.3f, %ld bad; %ld of %d "
           "outputs differ from alone, %ld of %ld written  %s\n", "exact", name, BITS, K, M, n, tiles, worst, bad,
           differ, n, written, want, ok ? "PASS" : "FAIL");
}

// The add form (k_qmatmul_bf16_add, k_qmatmul_add: the kernels' ADD epilogue, y += W x): y starts
// with values of its own (row padding and rows past M included), and after the launch must equal
// bit for bit that start plus the plain form's output (k_add's x[i] += d[i]) where the plain form
// writes, and the start elsewhere. The fast kernel, then (EXACT) the exact one.
template <int BITS, bool EXACT = false>
static void run_add_case(const char *name, int N, int K, int M) {
    const int per = 32 / BITS, wpr = K / per, gpr = K / 64, ldx = K + 16, ldy = N + 3, yrows = M + 2;
    std::vector<uint32_t> w((size_t)N * wpr);
    std::vector<uint16_t> sc((size_t)N * gpr), bi((size_t)N * gpr);
    for (auto &v : w) v = rnd() ^ (rnd() << 16);
    for (size_t j = 0; j < sc.size(); j++)
        sc[j] = f2bf16(0.01f * (1.5f + frand())), bi[j] = f2bf16(-0.05f + 0.02f * frand());
    std::vector<uint16_t> xb((size_t)M * ldx + 64);
    std::vector<float> xf((size_t)M * ldx + 4);
    uint16_t *x = (uint16_t *)(((uintptr_t)xb.data() + 15) & ~(uintptr_t)15);
    float *xe = (float *)(((uintptr_t)xf.data() + 15) & ~(uintptr_t)15);
    for (int i = 0; i < M * ldx; i++) xe[i] = frand(), x[i] = f2bf16(xe[i]);
    std::vector<float> y0((size_t)yrows * ldy), d((size_t)yrows * ldy, NAN);
    for (auto &v : y0) v = 3.0f * frand();
    std::vector<float> y = y0;
    const qm_seg sd = {{w.data(), sc.data(), bi.data(), 0, N, K, BITS}, d.data(), ldy};
    qm_seg sy = sd;
    sy.y = y.data();
    qm_segs Sd, Sy;
    const int bn = EXACT ? (int)MM_BN : (int)QB_BN, tiles = qm_table(&sd, 1, bn, &Sd);
    qm_table(&sy, 1, bn, &Sy);
    if constexpr (EXACT) {
        const dim3s grid = {(unsigned)tiles, (unsigned)CEIL_DIV(M, MM_BM), 1};
        launch_exact<BITS, false>(grid, Sd, xe, ldx, M);
        launch_exact<BITS, false, true>(grid, Sy, xe, ldx, M);
    } else {
        const dim3s grid = {(unsigned)tiles, (unsigned)CEIL_DIV(M, QB_BM), 1};
        launch_segs<BITS, false>(grid, Sd, x, ldx, nullptr, 1, nullptr, M, nullptr, nullptr, nullptr, nullptr);
        launch_segs<BITS, false, false, true>(grid, Sy, x, ldx, nullptr, 1, nullptr, M, nullptr, nullptr, nullptr,
                                              nullptr);
    }
    long differ = 0, added = 0;
    for (size_t i = 0; i < y.size(); i++) {
        float want = y0[i];
        if (!std::isnan(d[i])) want = y0[i] + d[i], added++;   // k_add's sum
        differ += memcmp(&want, &y[i], sizeof(float)) != 0;
    }
    const bool ok = !differ && added == (long)M * N;
    fails += !ok;
    printf("%-8s %-38s %d-bit N %4d K %4d rows %4d: %ld of %zu differ from start + plain form, %ld of %ld added  %s\n",
           EXACT ? "exact" : "wgmma", name, BITS, N, K, M, differ, y.size(), added, (long)M * N,
           ok ? "PASS" : "FAIL");
}

static void segs_cases() {
    run_segs_case<4>("segments: DeltaNet-like, tails", {200, 130, 32, 1}, 192, 150);
    run_segs_case<4>("segments: attention-like", {256, 64, 64}, 128, 37);
    run_segs_case<8>("segments: router + shared gate", {130, 1}, 128, 129);
    run_segs_case<8>("segments: one", {72}, 64, 5);
    run_add_case<4>("add: row and feature tails", 200, 192, 150);
    run_add_case<8>("add: one tile", 72, 64, 5);
}

int main() {
    for (g_defer = 0; g_defer < 2; g_defer++) {
    g_smem_addr0 = g_defer ? 1024 + 528 : 1024;   // where the dynamic shared memory starts (sim_wgmma.h)
    printf("# cp.async %s, dynamic shared memory at shared address %u\n",
           g_defer ? "deferred to its wait_group" : "at once", g_smem_addr0);
    run_case("dense, row and feature tails", 4, 200, 256, 150, {}, 1, false, false);
    run_case("dense, 3 groups", 8, 130, 192, 37, {}, 1, false, false);
    run_case("dense, 1 group, 1 feature", 8, 1, 64, 5, {}, 1, false, false);
    run_case("grouped gate (xmap / 2), empty expert", 4, 72, 128, 0, {5, 0, 140, 1}, 2, true, false);
    run_case("grouped down (ymap), empty expert", 4, 136, 320, 0, {3, 129, 0}, 1, false, true);
    // the compact grid: M = the rows of all experts (here exact, and a loose bound)
    run_case("grouped gate, compact grid", 4, 72, 128, 146, {5, 0, 140, 1}, 2, true, false);
    run_case("grouped down, compact grid, loose M", 4, 136, 320, 300, {3, 129, 0, 0, 7}, 1, false, true);
    segs_cases();
    }
    g_defer = 0;
    g_smem_addr0 = 1024;   // the exact kernel has no cp.async
    printf("# the exact kernel (qmatmul_exact.cuh)\n");
    run_exact_segs_case<4>("segments: DeltaNet-like, tails", {200, 130, 32, 1}, 192, 150);
    run_exact_segs_case<4>("segments: attention-like", {256, 64, 64}, 128, 37);
    run_exact_segs_case<8>("segments: router + shared gate", {130, 1}, 128, 129);
    run_exact_segs_case<8>("segments: one", {72}, 64, 5);
    run_add_case<4, true>("add: row and feature tails", 200, 192, 150);
    run_add_case<8, true>("add: one tile", 72, 64, 5);
    printf("qmatmul-sim: %s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
