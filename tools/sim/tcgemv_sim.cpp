// tcgemv_sim.cpp: runs the device code of src/cuda/tcgemv.cuh itself (tc_stage_x, tc_rows16, both
// the K % 256 == 0 path and the tail path) on the host, one warp as 32 threads: shuffles and the
// mma are warp-collective exchanges through shared arrays between barriers, the mma gathered and
// scattered by the PTX ISA fragment layouts of mma.m16n8k16.row.col (bf16, fp32 accumulate).
// It checks y = W x against a double reference with the bound of tests/gpu/test_tcgemv.c.
//
//   make tcgemv-sim      (or by hand: mkdir -p /tmp/tcsim && cp src/cuda/tcgemv.cuh src/cuda/tcgemv_layout.h /tmp/tcsim/ && : > /tmp/tcsim/common.cuh &&
//   g++ -std=c++20 -O2 -pthread -DTC_HOST_SIM -I/tmp/tcsim -o /tmp/tcsim/sim tools/sim/tcgemv_sim.cpp && /tmp/tcsim/sim)
// (tcgemv.cuh includes "common.cuh": in the copy it gets an empty one, the shim below stands in.)
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

// ---- the shim: what tcgemv.cuh uses from CUDA and common.cuh ---------------------------------------
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define WARP_SIZE 32
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
struct uint4 { uint32_t x, y, z, w; };
struct uint2 { uint32_t x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
static float2 make_float2(float a, float b) { return {a, b}; }
struct dim { unsigned x; };
static thread_local dim threadIdx;
static dim blockDim = {32};
static std::barrier<> *g_bar;
static void __syncthreads() { g_bar->arrive_and_wait(); }
template <typename T> static T __ldg(const T *p) { return *p; }
#include "sim_bf16.h"
using std::min;
static float g_slot[32];
static float __shfl_xor_sync(unsigned, float v, int o) {
    const int l = threadIdx.x;
    g_slot[l] = v;
    g_bar->arrive_and_wait();
    const float r = g_slot[l ^ o];
    g_bar->arrive_and_wait();
    return r;
}
static uint32_t g_a[32][4], g_b[32][2];
static void tc_sim_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                       bool acc) {
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    g_a[l][0] = a0, g_a[l][1] = a1, g_a[l][2] = a2, g_a[l][3] = a3, g_b[l][0] = b0, g_b[l][1] = b1;
    g_bar->arrive_and_wait();
    double A[16][16], B[16][8];
    for (int ln = 0; ln < 32; ln++) {
        const int gg = ln / 4, tt = ln % 4;
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 2; h++) A[gg + 8 * (r & 1)][2 * tt + h + 8 * (r >> 1)] = bf16f((uint16_t)(g_a[ln][r] >> (16 * h)));
        for (int r = 0; r < 2; r++)
            for (int h = 0; h < 2; h++) B[2 * tt + h + 8 * r][gg] = bf16f((uint16_t)(g_b[ln][r] >> (16 * h)));
    }
    g_bar->arrive_and_wait();
    for (int r = 0; r < 4; r++) {   // c_r = (row g + 8 (r / 2), col 2t + r % 2)
        double s = 0;
        for (int k = 0; k < 16; k++) s += A[g + 8 * (r >> 1)][k] * B[k][2 * t + (r & 1)];
        c[r] = (float)(acc ? c[r] + s : s);
    }
}
#include "tcgemv.cuh"

// ---- the test ------------------------------------------------------------------------------------
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd() { rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; return (uint32_t)(rng >> 11); }
static double nrand() {
    const double u1 = (rnd() + 1.0) / 4294967297.0, u2 = rnd() / 4294967296.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static int run(int R, int K) {
    const int ng = K / 64;
    std::vector<uint32_t> w((size_t)R * K / 8);
    std::vector<uint16_t> s((size_t)R * ng), b((size_t)R * ng);
    std::vector<float> x(K), y(R, NAN), ys(R, NAN);
    for (auto &v : w) v = rnd() ^ (rnd() << 21);
    for (size_t i = 0; i < s.size(); i++) {
        const float sc = (float)(0.02 * nrand());
        s[i] = f2bf16(sc), b[i] = f2bf16(-8.0f * sc);
    }
    for (auto &v : x) v = (float)nrand();
    std::vector<unsigned char> sm(tc_smem_bytes(K), 0xff);   // NaN where the staging does not write
    std::barrier<> bar(32);
    g_bar = &bar;
    std::vector<std::thread> th;
    for (int l = 0; l < 32; l++)
        th.emplace_back([&, l] {
            threadIdx.x = l;
            tc_stage_x(x.data(), K, sm.data());
            for (int n0 = 0; n0 < R; n0 += TC_ROWS) {   // the task loop of tc_kernel (one warp)
                const float v = tc_rows16(w.data(), s.data(), b.data(), R, K, n0, sm.data());
                const int row = n0 + tc_lane_row(l);
                if (!(l & 1) && row < R) y[row] = v;
                if (K % 1024) continue;   // gemv.cu's K split: four quarters of the super-steps, summed
                const int nS = tc_nsuper(K);
                float p[4];
                for (int q = 0; q < 4; q++)
                    p[q] = tc_rows16<false>(w.data(), s.data(), b.data(), R, K, n0, sm.data(), q * nS / 4, (q + 1) * nS / 4);
                if (!(l & 1) && row < R) ys[row] = (p[0] + p[1]) + (p[2] + p[3]);
            }
        });
    for (auto &t : th) t.join();
    double emax = 0, ymax = 0;
    int bad = 0;
    for (int n = 0; n < R; n++) {
        double ref = 0, ab = 0;
        for (int k = 0; k < K; k++) {
            const int q = (w[((size_t)n * K + k) / 8] >> (4 * (k % 8))) & 15;
            const double p = ((double)bf16f(s[(size_t)n * ng + k / 64]) * q + bf16f(b[(size_t)n * ng + k / 64])) * x[k];
            ref += p, ab += fabs(p);
        }
        const double e = fabs((double)y[n] - ref);
        if (!(e <= ldexp(ab, -8) + 1e-6)) {
            if (!bad) fprintf(stderr, "  %dx%d row %d: y %.9g ref %.9g\n", R, K, n, y[n], ref);
            bad++;
        }
        // the split sum: the same products, fp32 partial sums added in another order
        if (K % 1024 == 0 && !(fabs((double)ys[n] - ref) <= ldexp(ab, -8) + 1e-6)) {
            if (!bad) fprintf(stderr, "  %dx%d row %d (K split): y %.9g ref %.9g\n", R, K, n, ys[n], ref);
            bad++;
        }
        if (!(e <= emax)) emax = e;
        ymax = fmax(ymax, fabs(ref));
    }
    printf("sim %6dx%-5d %s %.3e (%s path%s)\n", R, K, bad ? "FAIL" : "PASS", emax / ymax, K % 256 ? "tail" : "main",
           K % 1024 ? "" : ", K split too");
    return bad != 0;
}

// tc_rows16_xq: T tokens (NQ quads) against the same rows, each token's outputs against its own
// double reference with tc_rows16's bound; the K split (four quarters summed) too.
template <int NQ>
static int run_q(int R, int K, int T) {
    const int ng = K / 64, ab = tc_area_bytes(K);
    std::vector<uint32_t> w((size_t)R * K / 8);
    std::vector<uint16_t> s((size_t)R * ng), b((size_t)R * ng);
    std::vector<float> x((size_t)T * K), y((size_t)T * R, NAN), ys((size_t)T * R, NAN);
    for (auto &v : w) v = rnd() ^ (rnd() << 21);
    for (size_t i = 0; i < s.size(); i++) {
        const float sc = (float)(0.02 * nrand());
        s[i] = f2bf16(sc), b[i] = f2bf16(-8.0f * sc);
    }
    for (auto &v : x) v = (float)nrand();
    std::vector<unsigned char> sm((size_t)T * ab, 0xff);
    std::barrier<> bar(32);
    g_bar = &bar;
    std::vector<std::thread> th;
    for (int l = 0; l < 32; l++)
        th.emplace_back([&, l] {
            threadIdx.x = l;
            tc_stage_xq(
                [&](int tau, int u, float (&v)[8]) {
                    for (int j = 0; j < 8; j++) v[j] = x[(size_t)tau * K + 8 * u + j];
                },
                T, K, sm.data());
            const int g = l / 4, t = l % 4, nS = tc_nsuper(K);
            for (int n0 = 0; n0 < R; n0 += TC_ROWS) {
                float o[NQ][2], p[4][NQ][2];
                tc_rows16_xq<NQ>(w.data(), s.data(), b.data(), R, K, n0, sm.data(), T, o);
                if (K % 1024 == 0)
                    for (int q = 0; q < 4; q++)
                        tc_rows16_xq<NQ>(w.data(), s.data(), b.data(), R, K, n0, sm.data(), T, p[q], q * nS / 4,
                                         (q + 1) * nS / 4);
                for (int q = 0; q < NQ; q++)
                    for (int r = 0; r < 2; r++) {
                        const int tok = 4 * q + t, row = n0 + g + 8 * r;
                        if (tok >= T || row >= R) continue;
                        y[(size_t)tok * R + row] = o[q][r];
                        if (K % 1024 == 0) ys[(size_t)tok * R + row] = (p[0][q][r] + p[1][q][r]) + (p[2][q][r] + p[3][q][r]);
                    }
            }
        });
    for (auto &t : th) t.join();
    int bad = 0;
    double emax = 0, ymax = 0;
    for (int tok = 0; tok < T; tok++)
        for (int n = 0; n < R; n++) {
            double ref = 0, a = 0;
            for (int k = 0; k < K; k++) {
                const int q = (w[((size_t)n * K + k) / 8] >> (4 * (k % 8))) & 15;
                const double pr = ((double)bf16f(s[(size_t)n * ng + k / 64]) * q + bf16f(b[(size_t)n * ng + k / 64])) *
                                  x[(size_t)tok * K + k];
                ref += pr, a += fabs(pr);
            }
            const double v = y[(size_t)tok * R + n], e = fabs(v - ref);
            if (!(e <= ldexp(a, -8) + 1e-6) ||
                (K % 1024 == 0 && !(fabs((double)ys[(size_t)tok * R + n] - ref) <= ldexp(a, -8) + 1e-6))) {
                if (!bad) fprintf(stderr, "  xq %dx%d T %d token %d row %d: y %.9g split %.9g ref %.9g\n", R, K, T, tok, n, v,
                                  ys[(size_t)tok * R + n], ref);
                bad++;
            }
            if (!(e <= emax)) emax = e;
            ymax = fmax(ymax, fabs(ref));
        }
    printf("sim xq %5dx%-5d T %d NQ %d %s %.3e\n", R, K, T, NQ, bad ? "FAIL" : "PASS", emax / ymax);
    return bad != 0;
}

int main() {
    static const int shapes[][2] = {{17, 128}, {320, 128}, {16, 64}, {33, 192}, {40, 320}, {24, 768},
                                    {48, 256}, {48, 512}, {40, 768}, {48, 2048}, {32, 4096}, {16, 8192}};
    int fails = 0;
    for (auto &sh : shapes) fails += run(sh[0], sh[1]);
    static const int qshapes[][3] = {{48, 256, 1}, {40, 512, 2}, {33, 1024, 3}, {48, 2048, 4}, {16, 4096, 4}};
    for (auto &sh : qshapes) fails += run_q<1>(sh[0], sh[1], sh[2]);
    fails += run_q<2>(40, 1024, 5) + run_q<2>(32, 2048, 8) + run_q<2>(17, 512, 7);
    printf("%d failed\n", fails);
    return fails ? 1 : 0;
}
