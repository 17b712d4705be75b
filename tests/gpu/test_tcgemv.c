// test_tcgemv.c: the tensor-core 4-bit GEMV (src/cuda/gemv.cu, k_tcgemv) against a double
// reference, then timed.
//
//   test_tcgemv            host emulation of the warp (below), then the GPU shapes: one line each,
//                          "shape PASS/FAIL err time_us GB/s" (err = max |y - ref| / max |ref|;
//                          time: median of 50 launches with CUDA events, L2 flushed before each:
//                          the weights of a decode step are never in L2; warm numbers after)
//   test_tcgemv emu        the host emulation only (no GPU needed)
//
// The emulation runs the kernel's layout maps (src/cuda/tcgemv_layout.h, the same header the
// kernel uses) lane by lane: per lane the 16-byte code chunks it loads, the A registers it builds,
// the B registers it reads from an emulated shared memory (staged as the kernel stages it, the
// rest poisoned with NaN), an mma.m16n8k16 gathered and scattered by the PTX ISA fragment layouts
// (row.col, bf16: A a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..); B b0 (k 2t..2t+1,
// col g) b1 (k 2t+8.., col g); C c0,c1 (g, 2t..2t+1) c2,c3 (g+8, 2t..2t+1)), the epilogue and the
// final xor-1 shuffle. It proves the lane / k / group mapping (a wrong permutation gives errors of
// the size of y, not of bf16 rounding). `make tcgemv-sim` (tools/sim/tcgemv_sim.cpp) goes further: it
// runs the device code of tcgemv.cuh itself on 32 host threads.
//
// The error bound: the only approximation the kernel makes against the exact sum is x rounded to
// bf16 (relative error <= 2^-9 per element, round to nearest even with 8 significant bits); the
// codes (128 + q, q < 16) are exact in bf16, the products of two bf16 are exact in fp32, and fp32
// accumulation adds ~2^-24 relative per step. The 128 offset cancels against 128 * sum(bf16(x))
// (the same rounded x), leaving fp32 rounding of terms ~128 |x| ~ 2^-17 |x| per group, far below.
// So |err_n| <= 2^-9 sum_k |W_nk x_k| + (fp32 terms); the test asserts, per row,
//   |err_n| <= 2^-8 sum_k |W_nk x_k| + 1e-6
// (a factor 2 of headroom for the fp32 accumulation and the cancellation of the offset).
//
// Exit 0 when every check passes, 1 when one fails, 2 on a CUDA error, 77 when there is no GPU
// (after the emulation, which must pass).
#include "checkpoint.h"
#include "cuda/kernels.h"
#include "cuda/tcgemv_layout.h"
#include "gpu/gpu_test.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails, checks;

static double nrand(void) {   // N(0, 1), Box-Muller
    double u1 = (rnd() + 1.0) / 4294967297.0, u2 = rnd() / 4294967296.0;   // rnd: 32 bits
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

struct mat {
    int R, K;
    uint32_t *w;
    uint16_t *s, *b;
    float *x;
};
static struct mat mat_new(int R, int K) {
    struct mat m = {R, K, NULL, NULL, NULL, NULL};
    const size_t nw = (size_t)R * K / 8, ng = (size_t)R * K / 64;
    m.w = malloc(nw * 4), m.s = malloc(ng * 2), m.b = malloc(ng * 2), m.x = malloc((size_t)K * 4);
    for (size_t i = 0; i < nw; i++) m.w[i] = rnd() ^ (rnd() << 21);
    for (size_t i = 0; i < ng; i++) {
        const float sc = (float)(0.02 * nrand());
        m.s[i] = f32_to_bf16(sc);
        m.b[i] = f32_to_bf16(-8.0f * sc);
    }
    for (int i = 0; i < K; i++) m.x[i] = (float)nrand();
    return m;
}
static void mat_free(struct mat *m) { free(m->w), free(m->s), free(m->b), free(m->x); }
static int code(const struct mat *m, int n, int k) { return (m->w[((size_t)n * m->K + k) / 8] >> (4 * (k % 8))) & 15; }

// ref[n] = sum_k W_nk x_k, abs[n] = sum_k |W_nk x_k| (double).
static void reference(const struct mat *m, double *ref, double *abs_) {
    const int K = m->K, ng = K / 64;
    for (int n = 0; n < m->R; n++) {
        double acc = 0, aa = 0;
        for (int gi = 0; gi < ng; gi++) {
            const double s = bf16_to_f32(m->s[(size_t)n * ng + gi]), b = bf16_to_f32(m->b[(size_t)n * ng + gi]);
            for (int k = 64 * gi; k < 64 * gi + 64; k++) {
                const double p = (s * code(m, n, k) + b) * m->x[k];
                acc += p, aa += fabs(p);
            }
        }
        ref[n] = acc, abs_[n] = aa;
    }
}

// Per-row check against the bound; returns max |err| / max |ref|, sets *ok.
static double check(const float *y, const double *ref, const double *abs_, int R, int *ok) {
    double emax = 0, ymax = 0;
    *ok = 1;
    for (int n = 0; n < R; n++) {
        const double e = fabs((double)y[n] - ref[n]);
        if (!(e <= ldexp(abs_[n], -8) + 1e-6)) {
            if (*ok) fprintf(stderr, "  row %d: y %.9g ref %.9g err %.3g bound %.3g\n", n, y[n], ref[n], e,
                             ldexp(abs_[n], -8) + 1e-6);
            *ok = 0;
        }
        if (!(e <= emax)) emax = e;   // NaN-propagating
        if (fabs(ref[n]) > ymax) ymax = fabs(ref[n]);
    }
    return emax / (ymax > 0 ? ymax : 1);
}

// ---- the host emulation of tc_stage_x + tc_rows16 ----------------------------------------------

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void emu_stage(const float *x, int K, unsigned char *sm) {
    const int nc = 32 * tc_nsuper(K), kc = K / 8;
    float sf8[8], sb8[8];   // the 8 chunks of a group (the shuffle tree of the kernel: any order)
    for (int u = 0; u < nc; u++) {
        float v[8];
        for (int j = 0; j < 8; j++) v[j] = u < kc ? x[8 * u + j] : 0.0f;
        uint32_t h[8];
        float sf = 0, sb = 0;
        for (int j = 0; j < 8; j++) h[j] = f32_to_bf16(v[j]), sf += v[j], sb += bf16_to_f32((uint16_t)h[j]);
        uint32_t o[4] = {h[0] | h[4] << 16, h[1] | h[5] << 16, h[2] | h[6] << 16, h[3] | h[7] << 16};
        for (int j = 0; j < 8; j++)   // the packing agrees with tc_pack_order
            if (((o[j / 2] >> (16 * (j & 1))) & 0xffff) != h[tc_pack_order(j)]) {
                fprintf(stderr, "emu: pack order\n");
                exit(1);
            }
        memcpy(sm + 16 * tc_xb_chunk(u), o, 16);
        sf8[u & 7] = sf, sb8[u & 7] = sb;
        if ((u & 7) == 7) {
            float a = 0, c = 0;
            for (int j = 0; j < 8; j++) a += sf8[j], c += sb8[j];
            float xs2[2] = {a, 128.0f * c};
            memcpy(sm + tc_xs_byte(K) + 8 * (u >> 3), xs2, 8);
        }
    }
    memset(sm + 16 * tc_zero_chunk(K), 0, 64);
}

// c += A B by the PTX fragment layouts of mma.m16n8k16.row.col (bf16 in, fp32 accumulate).
static void emu_mma(float c[32][4], uint32_t a[32][4], uint32_t b[32][2], int acc) {
    double A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int r = 0; r < 4; r++)
            for (int hh = 0; hh < 2; hh++) A[g + 8 * (r & 1)][2 * t + hh + 8 * (r >> 1)] = bf16_to_f32((uint16_t)(a[l][r] >> (16 * hh)));
        for (int r = 0; r < 2; r++)
            for (int hh = 0; hh < 2; hh++) B[2 * t + hh + 8 * r][g] = bf16_to_f32((uint16_t)(b[l][r] >> (16 * hh)));
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            double s = 0;
            for (int k = 0; k < 16; k++) s += A[i][k] * B[k][j];
            C[i][j] = s;
        }
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int r = 0; r < 4; r++) {
            const double v = C[g + 8 * (r >> 1)][2 * t + (r & 1)];
            c[l][r] = (float)(acc ? c[l][r] + v : v);
        }
    }
}

static void emu_rows16(const struct mat *m, const unsigned char *sm, int n0, float out[32]) {
    const int R = m->R, K = m->K, rowbytes = K / 2, ng = K / 64, nS = tc_nsuper(K), lim = rowbytes - 16;
    const unsigned char *w = (const unsigned char *)m->w;
    float acc[32] = {0}, c[32][4];
    for (int S = 0; S < nS; S++) {
        uint32_t ga[32][2][4], gb[32][2][4];   // lane, half, word
        for (int l = 0; l < 32; l++) {
            const int g = l / 4, t = l % 4;
            const int rA = n0 + g < R ? n0 + g : R - 1, rB = n0 + g + 8 < R ? n0 + g + 8 : R - 1;
            for (int h = 0; h < 2; h++) {
                int o = tc_code_byte(S, h, t);
                o = o < lim ? o : lim;
                memcpy(ga[l][h], w + (size_t)rA * rowbytes + o, 16);
                memcpy(gb[l][h], w + (size_t)rB * rowbytes + o, 16);
            }
        }
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 4; i++)
                for (int e = 0; e < 2; e++) {
                    uint32_t a[32][4], b[32][2];
                    for (int l = 0; l < 32; l++) {
                        const int g = l / 4, t = l % 4;
                        a[l][0] = tc_a_reg(ga[l][h][i], e, 0), a[l][1] = tc_a_reg(gb[l][h][i], e, 0);
                        a[l][2] = tc_a_reg(ga[l][h][i], e, 1), a[l][3] = tc_a_reg(gb[l][h][i], e, 1);
                        const int off = tc_b_byte(K, g, t, h) + S * (tc_b_real(g, t, h) ? TC_B_STEP : 0) + 16 * i;
                        uint32_t xb[4];
                        memcpy(xb, sm + off, 16);
                        b[l][0] = xb[2 * e], b[l][1] = xb[2 * e + 1];
                    }
                    emu_mma(c, a, b, !(h == 0 && i == 0 && e == 0));
                }
        for (int l = 0; l < 32; l++) {
            const int g = l / 4, t = l % 4, ge = 2 * (t & 1), G = 4 * S + ge;
            const int rE = t < 2 ? (n0 + g < R ? n0 + g : R - 1) : (n0 + g + 8 < R ? n0 + g + 8 : R - 1);
            float xs[4];
            memcpy(xs, sm + tc_xs_byte(K) + 8 * G, 16);
            const float s0 = G < ng ? bf16_to_f32(m->s[(size_t)rE * ng + G]) : 0, b0 = G < ng ? bf16_to_f32(m->b[(size_t)rE * ng + G]) : 0;
            const float s1 = G + 1 < ng ? bf16_to_f32(m->s[(size_t)rE * ng + G + 1]) : 0;
            const float b1 = G + 1 < ng ? bf16_to_f32(m->b[(size_t)rE * ng + G + 1]) : 0;
            const float d0 = t < 2 ? c[l][0] : c[l][2], d1 = t < 2 ? c[l][1] : c[l][3];
            acc[l] = fmaf(s0, d0 - xs[1], fmaf(b0, xs[0], acc[l]));
            acc[l] = fmaf(s1, d1 - xs[3], fmaf(b1, xs[2], acc[l]));
        }
    }
    for (int l = 0; l < 32; l++) out[l] = acc[l] + acc[l ^ 1];
}

static void emu_case(int R, int K) {
    struct mat m = mat_new(R, K);
    unsigned char *sm = malloc((size_t)tc_smem_bytes(K));
    memset(sm, 0xff, (size_t)tc_smem_bytes(K));   // NaN everywhere the staging does not write
    emu_stage(m.x, K, sm);
    float *y = malloc(sizeof(float) * R);
    for (int n = 0; n < R; n++) y[n] = bits_f(0x7fc00000u);   // poison
    for (int n0 = 0; n0 < R; n0 += TC_ROWS) {
        float out[32];
        emu_rows16(&m, sm, n0, out);
        for (int l = 0; l < 32; l++) {
            const int row = n0 + l / 4 + 8 * ((l % 4) >> 1);
            if (!(l & 1) && row < R) y[row] = out[l];
        }
    }
    double *ref = malloc(sizeof(double) * R), *ab = malloc(sizeof(double) * R);
    reference(&m, ref, ab);
    int ok;
    const double e = check(y, ref, ab, R, &ok);
    checks++;
    if (!ok) fails++;
    printf("emu %6dx%-5d %s %.3e\n", R, K, ok ? "PASS" : "FAIL", e);
    free(sm), free(y), free(ref), free(ab);
    mat_free(&m);
}

// ---- the GPU -----------------------------------------------------------------------------------

static void *to_dev(const void *h, size_t bytes) {
    void *d;
    CUDA_OK(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void gpu_case(int R, int K, void *flush, size_t flush_bytes) {
    struct mat m = mat_new(R, K);
    const size_t nw = (size_t)R * K / 8, ng = (size_t)R * K / 64;
    struct dqt W = {.w = to_dev(m.w, nw * 4), .scales = to_dev(m.s, ng * 2), .biases = to_dev(m.b, ng * 2),
                    .n_mat = 1, .rows = R, .cols = K, .bits = 4};
    float *dx = to_dev(m.x, (size_t)K * 4), *dy;
    CUDA_OK(cudaMalloc((void **)&dy, (size_t)R * 4));
    CUDA_OK(cudaMemset(dy, 0xff, (size_t)R * 4));   // poison: NaN
    CUDA_OK((cudaError_t)k_tcgemv(&W, dx, dy, NULL));
    CUDA_OK(cudaDeviceSynchronize());
    float *y = malloc(sizeof(float) * R);
    CUDA_OK(cudaMemcpy(y, dy, (size_t)R * 4, cudaMemcpyDeviceToHost));
    double *ref = malloc(sizeof(double) * R), *ab = malloc(sizeof(double) * R);
    reference(&m, ref, ab);
    int ok;
    const double e = check(y, ref, ab, R, &ok);
    checks++;
    if (!ok) fails++;
    // Timing: 50 launches, each between two events, median; cold (L2 flushed) and warm.
    const size_t bytes = nw * 4 + ng * 4 + (size_t)K * 4;
    cudaEvent_t ev[2];
    cudaEventCreate(&ev[0]), cudaEventCreate(&ev[1]);
    float t[2][50];
    for (int warm = 0; warm < 2; warm++)
        for (int i = 0; i < 50; i++) {
            if (!warm) CUDA_OK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, NULL));
            else k_tcgemv(&W, dx, dy, NULL);
            cudaEventRecord(ev[0], NULL);
            CUDA_OK((cudaError_t)k_tcgemv(&W, dx, dy, NULL));
            cudaEventRecord(ev[1], NULL);
            CUDA_OK(cudaEventSynchronize(ev[1]));
            cudaEventElapsedTime(&t[warm][i], ev[0], ev[1]);
        }
    qsort(t[0], 50, sizeof(float), cmp_f), qsort(t[1], 50, sizeof(float), cmp_f);
    const double us = 1000.0 * t[0][25], usw = 1000.0 * t[1][25];
    char shape[32];
    snprintf(shape, sizeof shape, "%dx%d", R, K);
    printf("%-12s %s %.3e %9.2f us %7.0f GB/s   (warm L2: %8.2f us %7.0f GB/s)\n", shape, ok ? "PASS" : "FAIL", e, us,
           bytes / (us * 1e-6) / 1e9, usw, bytes / (usw * 1e-6) / 1e9);
    cudaEventDestroy(ev[0]), cudaEventDestroy(ev[1]);
    cudaFree((void *)W.w), cudaFree((void *)W.scales), cudaFree((void *)W.biases), cudaFree(dx), cudaFree(dy);
    free(y), free(ref), free(ab);
    mat_free(&m);
}

int main(int argc, char **argv) {
    rng = 0x9E3779B97F4A7C15ull;
    // Emulation: the tails (K = 64, 192, 320: partial super-steps, an odd group count), rows not a
    // multiple of 16, and two model shapes.
    static const int emu[][2] = {{17, 128}, {320, 128}, {16, 64}, {33, 192}, {40, 320}, {24, 768}, {48, 2048}, {32, 4096}};
    for (size_t i = 0; i < sizeof emu / sizeof emu[0]; i++) emu_case(emu[i][0], emu[i][1]);
    if (argc >= 2 && !strcmp(argv[1], "emu")) {
        printf("%d passed, %d failed\n", checks - fails, fails);
        return fails ? 1 : 0;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "test_tcgemv: no CUDA device: this test needs an sm_90 GPU: ran only the emulation\n");
        return 77;
    }
    static const int shapes[][2] = {{2048, 4096}, {12352, 2048}, {8192, 2048}, {512, 2048}, {2048, 512}, {248320, 2048},
                                    {320, 128},   {17, 128},     {40, 320},   {33, 192},   {16, 64}};
    const size_t flush_bytes = 256u << 20;
    void *flush;
    CUDA_OK(cudaMalloc(&flush, flush_bytes));
    printf("%-12s %s %s %s %s\n", "shape", "PASS/FAIL", "err", "time_us", "GB/s");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) gpu_case(shapes[i][0], shapes[i][1], flush, flush_bytes);
    cudaFree(flush);
    printf("%d passed, %d failed\n", checks - fails, fails);
    return fails ? 1 : 0;
}
