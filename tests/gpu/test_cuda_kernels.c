// test_cuda_kernels.c: every CUDA kernel against its CPU twin at the production shapes
// (issue 5, item 4). Fresh random inputs (seeded), outputs poisoned with NaN bytes before each
// run so that unwritten elements show, and a normalised error |gpu - cpu|_2 / |cpu|_2 checked
// against a per-op tolerance. The CPU twins are the formulas of backend_cpu.c.
//
//   test_cuda_kernels [seed [subset]]   prints one row per check; exit 0 when all pass (subsets: main)
#include "checkpoint.h"
#include "cuda/kernels.h"
#include "backend_cuda.h"
#include "engine.h"
#include "gpu/gpu_test.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float grand(void) { return (frand() + frand() + frand()) * 0.6f; }

static int fails, checks;
static void *dup_d(const void *h, size_t bytes) {
    void *d;
    if (cudaMalloc(&d, bytes) != cudaSuccess) abort();
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}
static void *poisoned(size_t bytes) {
    void *d;
    if (cudaMalloc(&d, bytes) != cudaSuccess) abort();
    cudaMemset(d, 0xff, bytes);   // NaN as fp32, -1 as int
    return d;
}
static float *back(const void *d, size_t n) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
        exit(1);
    }
    float *h = malloc(n * sizeof(float));
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
}
static float *randv(size_t n, float s) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = grand() * s;
    return v;
}
static void report(const char *name, const char *shape, const float *g, const float *c, size_t n, double tol) {
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)g[i] - c[i];
        if (isnan(g[i]) != isnan(c[i])) bad++;
        num += d * d;
        den += (double)c[i] * c[i];
    }
    double ne = sqrt(num / (den > 0 ? den : 1));
    int ok = !bad && ne <= tol;
    checks++;
    fails += !ok;
    printf("%-22s %-34s nerr %.3e  tol %.0e  %s\n", name, shape, ne, tol, ok ? "PASS" : "FAIL");
}

// ---- quantized matrices -------------------------------------------------------------------

struct hq {
    struct qtensor h;
    struct dqt d;
};
static struct hq make_q(int n_mat, int rows, int cols, int bits) {
    struct hq q;
    memset(&q, 0, sizeof q);
    const size_t nm = n_mat > 0 ? n_mat : 1, R = nm * rows, wpr = (size_t)cols * bits / 32, gpr = cols / 64;
    uint32_t *w = malloc(R * wpr * 4);
    uint16_t *s = malloc(R * gpr * 2), *b = malloc(R * gpr * 2);
    for (size_t i = 0; i < R * wpr; i++) w[i] = rnd() ^ (rnd() << 16);
    const float amp = 2.0f / sqrtf((float)cols) / (float)((1 << bits) - 1);
    for (size_t i = 0; i < R * gpr; i++) {
        float sc = amp * (0.5f + 0.5f * (frand() + 1));
        s[i] = f32_to_bf16(sc);
        b[i] = f32_to_bf16(-sc * (float)((1 << bits) - 1) / 2 + 0.1f * sc * frand());
    }
    q.h = (struct qtensor){w, s, b, n_mat, rows, cols, bits};
    q.d = (struct dqt){dup_d(w, R * wpr * 4), dup_d(s, R * gpr * 2), dup_d(b, R * gpr * 2), n_mat, rows, cols, bits};
    return q;
}
// Row n of matrix mat: its codes, scales and biases (k / 64) and the dequantized fp32 values.
static uint32_t qcode(const struct qtensor *W, size_t row, int k) {
    const int per = 32 / W->bits;
    return (qt_load_u32(W->w, row * qt_words_per_row(W) + k / per) >> ((k % per) * W->bits)) & ((1u << W->bits) - 1);
}
static float qscale(const struct qtensor *W, size_t row, int k) {
    return bf16_to_f32(qt_load_u16(W->scales, row * qt_groups_per_row(W) + k / 64));
}
static float qbias(const struct qtensor *W, size_t row, int k) {
    return bf16_to_f32(qt_load_u16(W->biases, row * qt_groups_per_row(W) + k / 64));
}
static void deq_row(const struct qtensor *W, int mat, int n, float *out) {
    const size_t row = (size_t)mat * W->rows + n;
    for (int k = 0; k < W->cols; k++) out[k] = qscale(W, row, k) * (float)qcode(W, row, k) + qbias(W, row, k);
}
static void cpu_mm(const struct qtensor *W, int mat, const float *x, float *y) {   // one row of x
    float *row = malloc(sizeof(float) * W->cols);
    for (int n = 0; n < W->rows; n++) {
        deq_row(W, mat, n, row);
        double s = 0;
        for (int k = 0; k < W->cols; k++) s += (double)row[k] * x[k];
        y[n] = (float)s;
    }
    free(row);
}

// ---- the fast products (k_qmatmul_bf16 on x converted by k_to_bf16) ---------------------------
//
// Two CPU twins per output:
//  (a) the fp32 formula on the bf16-rounded x, xr = bf16(x), and the bf16-rounded weights,
//      wr = bf16(s q + b) rounded once (bf16_fma_round: the kernel dequantizes by one fused bf16
//      multiply-add, as MLX does). The kernel computes exactly that product; only the fp32
//      accumulation order differs (the tensor cores'), so the normalised error is held to 2e-5. A
//      layout or pipeline bug gives O(1), a weight rounded differently ~1e-3.
//  (b) the fp32 formula on the fp32 x and the exact weights, elementwise: rounding to bf16 (nearest
//      even, 8 significant bits) moves each x_k by at most 2^-9 |x_k| and each w_nk by at most
//      2^-9 |w_nk|, so |y_n - y'_n| <= (2^-8 + 2^-18) sum_k |W_nk x_k|. The test allows
//      2^-7 sum_k |W_nk x_k| + 1e-6: twice the rounding bound, as before the weights were rounded
//      (then 2^-8, x alone), the rest covering the fp32 accumulation (~K 2^-24 sum |W x|, K <= 4096).
static void cpu_mm2(const struct qtensor *W, int mat, const float *x, const float *xr, float *y, float *yr,
                    float *yabs) {   // one row of x: y = W x, yr = bf16(W) xr, yabs = sum |W x|
    float *row = malloc(sizeof(float) * W->cols);
    for (int n = 0; n < W->rows; n++) {
        const size_t r = (size_t)mat * W->rows + n;
        deq_row(W, mat, n, row);
        double s = 0, sr = 0, sa = 0;
        for (int k = 0; k < W->cols; k++) {
            const float wr = bf16_to_f32(bf16_fma_round((float)qcode(W, r, k), qscale(W, r, k), qbias(W, r, k)));
            s += (double)row[k] * x[k];
            sr += (double)wr * xr[k];
            sa += fabs((double)row[k] * x[k]);
        }
        y[n] = (float)s;
        yr[n] = (float)sr;
        yabs[n] = (float)sa;
    }
    free(row);
}
// |g_i - c_i| <= bound_i for every i (NaN fails).
static void report_within(const char *name, const char *shape, const float *g, const float *c, const double *bound,
                          size_t n) {
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)g[i] - c[i]);
        if (!(d <= bound[i])) bad++;   // NaN too
        if (d / bound[i] > worst) worst = d / bound[i];
    }
    checks++;
    fails += bad > 0;
    printf("%-22s %-34s err/bound max %.3f, %zu over  %s\n", name, shape, worst, bad, bad ? "FAIL" : "PASS");
}
static void report_bound(const char *name, const char *shape, const float *g, const float *c, const float *cabs,
                         size_t n) {
    double *b = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) b[i] = ldexp((double)cabs[i], -7) + 1e-6;   // (b) above
    report_within(name, shape, g, c, b, n);
    free(b);
}
// x [n] fp32 on the device -> bf16 by k_to_bf16, checked bit for bit against f32_to_bf16; returns the
// device copy and fills xr (host, bf16 values as fp32).
static uint16_t *to_bf16_checked(const float *x, const float *dx, size_t n, float *xr) {
    uint16_t *dxb = poisoned(n * 2), *h = malloc(n * 2);
    k_to_bf16(dx, dxb, (long)n, NULL);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "CUDA error in k_to_bf16\n");
        exit(1);
    }
    cudaMemcpy(h, dxb, n * 2, cudaMemcpyDeviceToHost);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) {
        const uint16_t want = f32_to_bf16(x[i]);
        diff += h[i] != want;
        xr[i] = bf16_to_f32(want);
    }
    checks++;
    fails += diff > 0;
    printf("%-22s %-34s %zu of %zu differ  %s\n", "to_bf16", "(product input)", diff, n, diff ? "FAIL" : "PASS");
    free(h);
    return dxb;
}
static void test_matmul_fast(int T, int rows, int cols, int bits, const char *name) {
    struct hq q = make_q(0, rows, cols, bits);
    const size_t nx = (size_t)T * cols, ny = (size_t)T * rows;
    float *x = randv(nx, 1), *xr = malloc(nx * 4), *dx = dup_d(x, nx * 4), *dy = poisoned(ny * 4);
    uint16_t *dxb = to_bf16_checked(x, dx, nx, xr);
    const int rc = k_qmatmul_bf16(q.d, dxb, cols, NULL, 1, dy, rows, NULL, T, NULL, NULL, 0, NULL);
    float *yc = malloc(ny * 4), *ycr = malloc(ny * 4), *yabs = malloc(ny * 4);
    for (int t = 0; t < T; t++)
        cpu_mm2(&q.h, 0, x + (size_t)t * cols, xr + (size_t)t * cols, yc + (size_t)t * rows, ycr + (size_t)t * rows,
                yabs + (size_t)t * rows);
    float *yg = back(dy, ny);
    char sh[64], nm[64];
    snprintf(sh, sizeof sh, "T %d [%d x %d] %d-bit%s", T, rows, cols, bits, rc ? " LAUNCH FAILED" : "");
    snprintf(nm, sizeof nm, "%s bf16", name);
    report(nm, sh, yg, ycr, ny, 2e-5);
    report_bound(nm, "vs fp32 x", yg, yc, yabs, ny);
    free(x), free(xr), free(yc), free(ycr), free(yabs), free(yg);
    cudaFree(dx), cudaFree(dy), cudaFree(dxb);
}

static void test_matmul(int T, int rows, int cols, int bits, const char *name) {
    struct hq q = make_q(0, rows, cols, bits);
    float *x = randv((size_t)T * cols, 1), *yc = malloc(sizeof(float) * T * rows);
    float *dx = dup_d(x, (size_t)T * cols * 4), *dy = poisoned((size_t)T * rows * 4);
    k_qmatmul(q.d, dx, cols, NULL, 1, dy, rows, NULL, T, NULL, NULL, 0, NULL);
    for (int t = 0; t < T; t++) cpu_mm(&q.h, 0, x + (size_t)t * cols, yc + (size_t)t * rows);
    char sh[64];
    snprintf(sh, sizeof sh, "T %d [%d x %d] %d-bit", T, rows, cols, bits);
    report(name, sh, back(dy, (size_t)T * rows), yc, (size_t)T * rows, 1e-5);
}

// Routing + dispatch + grouped expert products (gate, down) + combine.
static void test_moe(int T) {
    const int E = QWEN_EXPERTS, K = QWEN_EXPERTS_USED, H = QWEN_HIDDEN, I = QWEN_MOE_INTER;
    float *lg = randv((size_t)T * E, 2), *x = randv((size_t)T * H, 1);
    for (int t = 0; t < T; t += 3)   // ties: equal logits must go to the lower id
        for (int e = 0; e < E; e += 5) lg[t * E + e] = lg[t * E + (e * 7) % E] = 1.5f + (float)(t % 4);
    int *ids = malloc(sizeof(int) * T * K);
    float *w = malloc(sizeof(float) * T * K);
    // CPU twin of route(): softmax, top-k lowest id on ties, renormalise
    for (int t = 0; t < T; t++) {
        float mx = -INFINITY, p[E], sum = 0, top = 0;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, lg[t * E + e]);
        for (int e = 0; e < E; e++) sum += p[e] = expf(lg[t * E + e] - mx);
        for (int e = 0; e < E; e++) p[e] /= sum;
        for (int i = 0; i < K; i++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < i; j++) taken |= ids[t * K + j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ids[t * K + i] = best;
            w[t * K + i] = p[best];
            top += p[best];
        }
        for (int i = 0; i < K; i++) w[t * K + i] /= top;
    }
    float *dl = dup_d(lg, (size_t)T * E * 4), *dw = poisoned((size_t)T * K * 4);
    int *di = poisoned((size_t)T * K * 4);
    k_route(dl, T, E, K, di, dw, NULL);
    int *gi = (int *)back(di, (size_t)T * K);
    float *gw = back(dw, (size_t)T * K);
    int same = !memcmp(gi, ids, sizeof(int) * T * K);
    checks++;
    fails += !same;
    printf("%-22s %-34s ids %s\n", "route top-k ids", "T 64.. E 256 k 8", same ? "identical  PASS" : "DIFFER  FAIL");
    report("route weights", "T, k 8", gw, w, (size_t)T * K, 1e-5);
    {   // the decode kernels' routing (route_warp): the same experts in the same order
        int *dj = poisoned((size_t)T * K * 4);
        float *dv = poisoned((size_t)T * K * 4);
        k_route_warp(dl, T, E, K, dj, dv, NULL);
        int *wi = (int *)back(dj, (size_t)T * K);
        const int same_w = !memcmp(wi, ids, sizeof(int) * T * K);
        checks++;
        fails += !same_w;
        printf("%-22s %-34s ids %s\n", "route_warp top-k ids", "T 64.. E 256 k 8, ties", same_w ? "identical  PASS" : "DIFFER  FAIL");
        report("route_warp weights", "T, k 8", back(dv, (size_t)T * K), w, (size_t)T * K, 1e-5);
        cudaFree(dj), cudaFree(dv), free(wi);
    }
    // grouped gate product over the routed experts
    struct hq g = make_q(E, I, H, 4);
    float *dx = dup_d(x, (size_t)T * H * 4), *dy = poisoned((size_t)T * K * I * 4);
    int *counts = poisoned(E * 4), *offs = poisoned(E * 4), *slots = poisoned((size_t)T * K * 4);
    k_moe_dispatch(di, T, E, K, counts, offs, slots, NULL);
    k_qmatmul(g.d, dx, H, slots, K, dy, I, NULL, 0, counts, offs, T, NULL);
    int *hs = (int *)back(slots, (size_t)T * K);
    float *yg = back(dy, (size_t)T * K * I);
    // reorder the GPU rows (expert-sorted) back to slot order
    float *ygs = malloc(sizeof(float) * T * K * I), *yc = malloc(sizeof(float) * T * K * I);
    for (int r = 0; r < T * K; r++) memcpy(ygs + (size_t)hs[r] * I, yg + (size_t)r * I, sizeof(float) * I);
    for (int sl = 0; sl < T * K; sl++) cpu_mm(&g.h, ids[sl], x + (size_t)(sl / K) * H, yc + (size_t)sl * I);
    char sh[64];
    snprintf(sh, sizeof sh, "T %d E %d [%d x %d] grouped", T, E, I, H);
    report("dispatch+grouped mm", sh, ygs, yc, (size_t)T * K * I, 1e-5);
    {   // the same grouped gate product in the fast mode (x gathered by slot), then the grouped down
        // product (rows in expert order, y scattered by slot), each against both twins
        const size_t nx = (size_t)T * H, ny = (size_t)T * K * I, nd = (size_t)T * K * H;
        float *xr = malloc(nx * 4), *yr = malloc(ny * 4), *yab = malloc(ny * 4);
        uint16_t *dxb = to_bf16_checked(x, dx, nx, xr);
        float *dyf = poisoned(ny * 4);
        int rc = k_qmatmul_bf16(g.d, dxb, H, slots, K, dyf, I, NULL, 0, counts, offs, T, NULL);
        float *yf = back(dyf, ny);
        for (int r = 0; r < T * K; r++) memcpy(ygs + (size_t)hs[r] * I, yf + (size_t)r * I, sizeof(float) * I);
        for (int sl = 0; sl < T * K; sl++)
            cpu_mm2(&g.h, ids[sl], x + (size_t)(sl / K) * H, xr + (size_t)(sl / K) * H, yc + (size_t)sl * I,
                    yr + (size_t)sl * I, yab + (size_t)sl * I);
        snprintf(sh, sizeof sh, "T %d E %d [%d x %d] grouped%s", T, E, I, H, rc ? " LAUNCH FAILED" : "");
        report("grouped mm bf16", sh, ygs, yr, ny, 2e-5);
        report_bound("grouped mm bf16", "vs fp32 x", ygs, yc, yab, ny);
        // down: act rows r in expert order (as the swiglu of the grouped gate/up leaves them)
        struct hq dq = make_q(E, H, I, 4);
        float *act = randv(ny, 1), *actr = malloc(ny * 4), *dact = dup_d(act, ny * 4), *ddn = poisoned(nd * 4);
        uint16_t *dab = to_bf16_checked(act, dact, ny, actr);
        rc = k_qmatmul_bf16(dq.d, dab, I, NULL, 1, ddn, H, slots, 0, counts, offs, T, NULL);
        float *yd = back(ddn, nd), *dc = malloc(nd * 4), *dr = malloc(nd * 4), *da = malloc(nd * 4);
        int *hc = (int *)back(counts, E), *ho = (int *)back(offs, E);
        for (int e = 0; e < E; e++)
            for (int r = ho[e]; r < ho[e] + hc[e]; r++)
                cpu_mm2(&dq.h, e, act + (size_t)r * I, actr + (size_t)r * I, dc + (size_t)hs[r] * H,
                        dr + (size_t)hs[r] * H, da + (size_t)hs[r] * H);
        snprintf(sh, sizeof sh, "T %d E %d [%d x %d] grouped%s", T, E, H, I, rc ? " LAUNCH FAILED" : "");
        report("grouped down bf16", sh, yd, dr, nd, 2e-5);
        report_bound("grouped down bf16", "vs fp32 x", yd, dc, da, nd);
        // the compact grid (M = T K): the same tiles, so the same bits, gate and down
        {
            float *dyc = poisoned(ny * 4), *ddc = poisoned(nd * 4), *dy0 = poisoned(ny * 4), *dd0 = poisoned(nd * 4);
            int rcc = k_qmatmul_bf16(g.d, dxb, H, slots, K, dy0, I, NULL, 0, counts, offs, T, NULL);
            rcc = rcc ? rcc : k_qmatmul_bf16(g.d, dxb, H, slots, K, dyc, I, NULL, T * K, counts, offs, T, NULL);
            rcc = rcc ? rcc : k_qmatmul_bf16(dq.d, dab, I, NULL, 1, dd0, H, slots, 0, counts, offs, T, NULL);
            rcc = rcc ? rcc : k_qmatmul_bf16(dq.d, dab, I, NULL, 1, ddc, H, slots, T * K, counts, offs, T, NULL);
            float *a0 = back(dy0, ny), *a1 = back(dyc, ny), *b0 = back(dd0, nd), *b1 = back(ddc, nd);
            size_t dif = 0;
            for (size_t i = 0; i < ny; i++) dif += memcmp(&a0[i], &a1[i], 4) != 0;
            for (size_t i = 0; i < nd; i++) dif += memcmp(&b0[i], &b1[i], 4) != 0;
            checks++;
            fails += dif || rcc;
            printf("%-22s %-34s %zu of %zu differ from the full grid%s  %s\n", "grouped compact grid",
                   "gate + down, M = T K", dif, ny + nd, rcc ? " LAUNCH FAILED" : "", dif || rcc ? "FAIL" : "PASS");
            free(a0), free(a1), free(b0), free(b1);
            cudaFree(dyc), cudaFree(ddc), cudaFree(dy0), cudaFree(dd0);
        }
        free(xr), free(yr), free(yab), free(yf), free(act), free(actr), free(yd), free(dc), free(dr);
        free(da), free(hc), free(ho);
        cudaFree(dxb), cudaFree(dyf), cudaFree(dact), cudaFree(ddn), cudaFree(dab);
    }
    // combine
    float *sh_ = randv((size_t)T * H, 1), *sg = randv(T, 1), *ye = randv((size_t)T * K * H, 1);
    float *dsh = dup_d(sh_, (size_t)T * H * 4), *dsg = dup_d(sg, T * 4), *dye2 = dup_d(ye, (size_t)T * K * H * 4);
    float *dout = poisoned((size_t)T * H * 4), *oc = malloc(sizeof(float) * T * H);
    k_moe_combine(dsh, dsg, dw, dye2, dout, T, K, H, 0, NULL);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H; c++) {
            float acc = sh_[t * H + c] * (1.0f / (1.0f + expf(-sg[t])));
            for (int i = 0; i < K; i++) acc += w[t * K + i] * ye[((size_t)t * K + i) * H + c];
            oc[t * H + c] = acc;
        }
    report("moe combine", "T x 2048, k 8", back(dout, (size_t)T * H), oc, (size_t)T * H, 1e-6);
}

static void test_rmsnorm_embed(void) {
    const int T = 7, H = QWEN_HIDDEN;
    float *x = randv((size_t)T * H, 3), *w = randv(H, 1), *yc = malloc(sizeof(float) * T * H);
    for (int t = 0; t < T; t++) {
        float ss = 0;
        for (int i = 0; i < H; i++) ss += x[t * H + i] * x[t * H + i];
        float r = 1.0f / sqrtf(ss / H + 1e-6f);
        for (int i = 0; i < H; i++) yc[t * H + i] = x[t * H + i] * r * w[i];
    }
    float *dx = dup_d(x, (size_t)T * H * 4), *dw = dup_d(w, H * 4), *dy = poisoned((size_t)T * H * 4);
    k_rmsnorm(dx, NULL, dw, dy, NULL, T, H, 1e-6f, NULL);
    report("rmsnorm", "T 7 x 2048", back(dy, (size_t)T * H), yc, (size_t)T * H, 1e-6);
    {   // the fast prefill form: the same y and its bf16 copy, bit-identical to k_rmsnorm, k_to_bf16
        const size_t n = (size_t)T * H;
        float *dy2 = poisoned(n * 4);
        uint16_t *dyb = poisoned(n * 2), *dref = poisoned(n * 2);
        k_rmsnorm(dx, NULL, dw, dy2, dyb, T, H, 1e-6f, NULL);
        k_to_bf16(dy, dref, (long)n, NULL);
        float *y1 = back(dy, n), *y2 = back(dy2, n);
        uint16_t *b1 = malloc(n * 2), *b2 = malloc(n * 2);
        cudaMemcpy(b1, dref, n * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(b2, dyb, n * 2, cudaMemcpyDeviceToHost);
        size_t dif = 0, difb = 0;
        for (size_t i = 0; i < n; i++) dif += memcmp(&y1[i], &y2[i], 4) != 0, difb += b1[i] != b2[i];
        checks++;
        fails += dif || difb;
        printf("%-22s %-34s y: %zu, bf16: %zu of %zu differ  %s\n", "rmsnorm + bf16 copy", "T 7 x 2048 vs +to_bf16",
               dif, difb, n, dif || difb ? "FAIL" : "PASS");
        free(y1), free(y2), free(b1), free(b2);
        cudaFree(dy2), cudaFree(dyb), cudaFree(dref);
    }
    // embed: 4-bit [V, H]; a few tokens
    struct hq e = make_q(0, QWEN_VOCAB, H, 4);
    int32_t tok[5] = {0, 1, 248319, 12345, 248044};
    float *ec = malloc(sizeof(float) * 5 * H);
    for (int t = 0; t < 5; t++) deq_row(&e.h, 0, tok[t], ec + (size_t)t * H);
    int32_t *dt = dup_d(tok, sizeof tok);
    float *de = poisoned((size_t)5 * H * 4);
    k_embed(e.d, dt, 5, de, NULL);
    report("embed", "5 tokens of [248320 x 2048]", back(de, (size_t)5 * H), ec, (size_t)5 * H, 0);
    // argmax over the vocabulary, with a planted tie at the maximum (lowest id wins)
    float *lg = randv(QWEN_VOCAB, 1);
    lg[200000] = 50;
    lg[170001] = 50;
    float *dl = dup_d(lg, QWEN_VOCAB * 4);
    int *da = poisoned(4);
    k_argmax(dl, QWEN_VOCAB, da, NULL);
    int *ga = (int *)back(da, 1);
    checks++;
    fails += *ga != 170001;
    printf("%-22s %-34s got %d want 170001  %s\n", "argmax", "248320, planted tie", *ga, *ga == 170001 ? "PASS" : "FAIL");
}

// attention: prep (norm, RoPE, cache append) + the tensor-core FlashAttention (prefill, any T: the
// layer probe passes one row) in both modes, vs the CPU formula.
//
// FlashAttention's exact mode (Q and P as bf16 hi + lo) is held to the fp32 formula's 1e-4. Its fast mode (Q and P rounded once to bf16) gets two CPU twins, as the fast
// products do:
//  (a) the kernel's own arithmetic in double: q rounded to bf16, the online softmax in base 2 over
//      the same 64-key tiles from key 0 (running max, fp32-valued P, sum l of the unrounded P), and
//      bf16(P) times V. Accumulation order and exp2f differ, and where that moves a P across a bf16
//      rounding boundary the two round it 2^-8 apart: a numpy model of those flips gives ~5e-5
//      normalised at 8K keys (1e-4 at worst for one head). Held to 5e-4, a third of the bf16 error
//      itself (~1.7e-3 against the fp32 formula); one lost 64-key tile of 8K would show as ~9e-2.
//      (tools/sim/flash_sim.cpp runs the kernel code on the host against the bit-exact float twin.)
//  (b) the fp32 formula, elementwise. Rounding to bf16 (nearest even) moves each value by at most
//      2^-9 of itself. With s_j = q . k_j / sqrt(D), rounding q moves score j by
//      |ds_j| <= 2^-9 sum_d |q_d k_jd| / sqrt(D) <= E (E: the largest over the query's keys), so the
//      softmax weights pi_j = e^s_j / sum_i e^s_i become pi'_j with pi'_j / pi_j in [e^-2E, e^2E].
//      The kernel then multiplies V by bf16(P) but divides by the sum of the unrounded P, so key j
//      weighs pi'_j (1 + r_j), |r_j| <= 2^-9. Hence, for output element d (gate sigma_d in (0, 1)):
//        |o'_d - o_d| = sigma_d |sum_j (pi'_j (1 + r_j) - pi_j) v_jd|
//                    <= sigma_d (e^2E (1 + 2^-9) - 1) sum_j pi_j |v_jd|.
//      The test allows that plus 2^-12 sigma_d sum_j pi_j |v_jd| + 1e-6 for the fp32 accumulation
//      and exp2f (the exact mode measures ~5e-6 against the formula). With this test's inputs
//      (|q_d|, |k_d| ~ 0.5, D = 256) E ~ 2^-9 x 4: the bound is ~1.6% of sum pi |v|; the errors
//      themselves have random signs and stay far below it. A lost tile or a wrong row is caught by (a).
static void rope_c(float *x, int rd, double theta, int p) {
    for (int m = 0; m < rd / 2; m++) {
        float inv = (float)(1.0 / pow(theta, (double)(2 * m) / rd)), ang = (float)p * inv;
        float c = (float)cos((double)ang), s = (float)sin((double)ang), a = x[m], b = x[m + rd / 2];
        x[m] = a * c - b * s;
        x[m + rd / 2] = a * s + b * c;
    }
}
// NH query heads over NKV kv heads of D (64, 128, 256: this model's, and the test geometries' with
// their own fast kernel), RoPE on D / 4 dimensions as in every geometry.
static void test_attention(int T, int p0, int cap, int NH, int NKV, int D) {
    const int QD = NH * D, KVD = NKV * D, RD = D / 4;
    const double theta = 1e7;
    float *qg = randv((size_t)T * 2 * QD, 1), *k = randv((size_t)T * KVD, 1), *v = randv((size_t)T * KVD, 1);
    float *qn = randv(D, 1), *kn = randv(D, 1);
    uint16_t *kc = malloc((size_t)NKV * cap * D * 2), *vc = malloc((size_t)NKV * cap * D * 2);
    for (size_t i = 0; i < (size_t)NKV * cap * D; i++) kc[i] = f32_to_bf16(grand()), vc[i] = f32_to_bf16(grand());
    uint16_t *dkc = dup_d(kc, (size_t)NKV * cap * D * 2), *dvc = dup_d(vc, (size_t)NKV * cap * D * 2);
    float *dqg = dup_d(qg, (size_t)T * 2 * QD * 4), *dk = dup_d(k, (size_t)T * KVD * 4), *dv = dup_d(v, (size_t)T * KVD * 4);
    float *dqn = dup_d(qn, D * 4), *dkn = dup_d(kn, D * 4), *dq = poisoned((size_t)T * QD * 4);
    k_attn_prep(dqg, dk, dv, dqn, dkn, dq, dkc, dvc, T, p0, cap, NH, NKV, D, RD, theta, 1e-6f, NULL);
    // Exact, then fast (D = 256: the warp-specialized wgmma kernel; D = 64, 128: the mma.sync one) with
    // o in fp32 and with its bf16 store (ob: o_proj's input in the fast mode, no fp32 o), poisoned
    // (0xffff), so an element left unwritten differs from the rounded fp32 o (which the checks below
    // hold to be no NaN). The exact mode must refuse ob.
    float *dflash = poisoned((size_t)T * QD * 4), *dfast = poisoned((size_t)T * QD * 4);
    uint16_t *dob = poisoned((size_t)T * QD * 2);
    const int rc_exact = k_flash_attention(dq, dqg, dkc, dvc, dflash, NULL, T, p0, cap, NH, NKV, D, 1, NULL);
    const int rc_ob_exact = k_flash_attention(dq, dqg, dkc, dvc, dflash, dob, T, p0, cap, NH, NKV, D, 1, NULL);
    const int rc_fast = k_flash_attention(dq, dqg, dkc, dvc, dfast, NULL, T, p0, cap, NH, NKV, D, 0, NULL);
    const int rc_ob = k_flash_attention(dq, dqg, dkc, dvc, NULL, dob, T, p0, cap, NH, NKV, D, 0, NULL);
    // CPU twin
    for (int t = 0; t < T; t++)
        for (int j = 0; j < NKV; j++) {
            float kh[256];
            float ss = 0;
            for (int d = 0; d < D; d++) ss += k[t * KVD + j * D + d] * k[t * KVD + j * D + d];
            float r = 1.0f / sqrtf(ss / D + 1e-6f);
            for (int d = 0; d < D; d++) kh[d] = k[t * KVD + j * D + d] * r * kn[d];
            rope_c(kh, RD, theta, p0 + t);
            for (int d = 0; d < D; d++) {
                kc[((size_t)j * cap + p0 + t) * D + d] = f32_to_bf16(kh[d]);
                vc[((size_t)j * cap + p0 + t) * D + d] = f32_to_bf16(v[t * KVD + j * D + d]);
            }
        }
    const size_t n_out = (size_t)T * QD;
    float *oc = malloc(sizeof(float) * n_out), *sc = malloc(sizeof(float) * (p0 + T));
    float *of = malloc(sizeof(float) * n_out), *sf = malloc(sizeof(float) * (p0 + T));   // fast twin (a)
    double *bound = malloc(sizeof(double) * n_out);                                        // fast twin (b)
    const float sl2 = 1.0f / sqrtf((float)D) * 1.4426950408889634f;                        // the kernel's
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            const float *qh = qg + (size_t)t * 2 * QD + (size_t)h * 2 * D, *gate = qh + D;
            float q[256], qb[256], ss = 0;
            for (int d = 0; d < D; d++) ss += qh[d] * qh[d];
            float r = 1.0f / sqrtf(ss / D + 1e-6f);
            for (int d = 0; d < D; d++) q[d] = qh[d] * r * qn[d];
            rope_c(q, RD, theta, p0 + t);
            for (int d = 0; d < D; d++) qb[d] = bf16_to_f32(f32_to_bf16(q[d]));
            const int kvh = h / (NH / NKV), nk = p0 + t + 1;
            float mx = -INFINITY, sum = 0;
            double amax = 0;   // max_j sum_d |q_d k_jd| / sqrt(D)
            for (int j = 0; j < nk; j++) {
                const uint16_t *kj = kc + ((size_t)kvh * cap + j) * D;
                float s = 0;
                double sb = 0, sa = 0;
                for (int d = 0; d < D; d++) {
                    const float kv = bf16_to_f32(kj[d]);
                    s += q[d] * kv;
                    sb += (double)qb[d] * kv;
                    sa += fabs((double)q[d] * kv);
                }
                sc[j] = s / sqrtf((float)D);
                sf[j] = (float)sb * sl2;
                mx = fmaxf(mx, sc[j]);
                if (sa / sqrt((double)D) > amax) amax = sa / sqrt((double)D);
            }
            for (int j = 0; j < nk; j++) sum += sc[j] = expf(sc[j] - mx);
            float *o = oc + (size_t)t * QD + (size_t)h * D, *o2 = of + (size_t)t * QD + (size_t)h * D;
            double acc[256], vab[256], m = -INFINITY, l = 0;
            for (int d = 0; d < D; d++) o[d] = 0, acc[d] = 0, vab[d] = 0;
            for (int j = 0; j < nk; j++)
                for (int d = 0; d < D; d++) {
                    const float vv = bf16_to_f32(vc[((size_t)kvh * cap + j) * D + d]);
                    o[d] += sc[j] / sum * vv;
                    vab[d] += (double)sc[j] / sum * fabs(vv);
                }
            for (int j0 = 0; j0 < nk; j0 += 64) {   // the kernel's tiles: online softmax, bf16(P) V
                const int j1 = j0 + 64 < nk ? j0 + 64 : nk;
                double mt = m;
                for (int j = j0; j < j1; j++) mt = fmax(mt, sf[j]);
                const double corr = exp2(m - mt);   // 0 on the first tile
                l *= corr;
                for (int d = 0; d < D; d++) acc[d] *= corr;
                for (int j = j0; j < j1; j++) {
                    const float p = (float)exp2(sf[j] - mt), pb = bf16_to_f32(f32_to_bf16(p));
                    l += p;
                    for (int d = 0; d < D; d++) acc[d] += (double)pb * bf16_to_f32(vc[((size_t)kvh * cap + j) * D + d]);
                }
                m = mt;
            }
            const double E = ldexp(amax, -9), rel = exp(2 * E) * (1 + ldexp(1, -9)) - 1 + ldexp(1, -12);
            for (int d = 0; d < D; d++) {
                const float sig = 1.0f / (1.0f + expf(-gate[d]));
                o[d] *= sig;
                o2[d] = (float)(acc[d] / l * sig);
                bound[(size_t)t * QD + (size_t)h * D + d] = rel * sig * vab[d] + 1e-6;
            }
        }
    char sh[80];
    snprintf(sh, sizeof sh, "T %d p0 %d cap %d D %d G %d", T, p0, cap, D, NH / NKV);
    uint16_t *gk = malloc((size_t)NKV * cap * D * 2);
    cudaMemcpy(gk, dkc, (size_t)NKV * cap * D * 2, cudaMemcpyDeviceToHost);
    float *a = malloc(sizeof(float) * T * KVD), *b = malloc(sizeof(float) * T * KVD);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < NKV; j++)
            for (int d = 0; d < D; d++) {
                a[t * KVD + j * D + d] = bf16_to_f32(gk[((size_t)j * cap + p0 + t) * D + d]);
                b[t * KVD + j * D + d] = bf16_to_f32(kc[((size_t)j * cap + p0 + t) * D + d]);
            }
    report("attn prep (k cache)", sh, a, b, (size_t)T * KVD, 1e-2 / 4);
    char shf[96];
    snprintf(shf, sizeof shf, "%s%s", sh, rc_exact ? " LAUNCH FAILED" : "");
    report("flash attention", shf, back(dflash, n_out), oc, n_out, 1e-4);
    snprintf(shf, sizeof shf, "%s%s", sh, rc_fast ? " LAUNCH FAILED" : "");
    float *gf = back(dfast, n_out);
    report("flash fast (bf16 QP)", shf, gf, of, n_out, 5e-4);
    report_within("flash fast (bf16 QP)", "vs fp32 formula", gf, oc, bound, n_out);
    // The bf16 store (k_flash_attention's ob, the fast mode's o_proj input): the fast kernel's bf16
    // output must be its own fp32 output rounded by f32_to_bf16 (k_to_bf16's rounding), every element,
    // bit for bit. The exact mode refuses ob (its o_proj reads the fp32 o).
    uint16_t *hb = malloc(n_out * 2);
    cudaMemcpy(hb, dob, n_out * 2, cudaMemcpyDeviceToHost);
    size_t dif = 0;
    for (size_t i = 0; i < n_out; i++) dif += hb[i] != f32_to_bf16(gf[i]);
    const bool bad = dif || rc_ob || rc_fast;
    checks++;
    fails += bad;
    printf("%-22s %-34s %zu of %zu differ from bf16(fp32 o)%s  %s\n", "flash bf16 o", sh, dif, n_out,
           rc_ob || rc_fast ? " LAUNCH FAILED" : "", bad ? "FAIL" : "PASS");
    free(gf), free(hb);
    checks++;
    fails += rc_ob_exact != (int)cudaErrorInvalidValue;
    printf("%-22s %-34s rc %d  %s\n", "flash bf16 o exact", "refused (cudaErrorInvalidValue)", rc_ob_exact,
           rc_ob_exact == (int)cudaErrorInvalidValue ? "PASS" : "FAIL");
    cudaFree(dflash), cudaFree(dfast), cudaFree(dob);
    free(oc), free(sc), free(of), free(sf), free(bound), free(a), free(b), free(gk);
}

// CPU twin of the conv (backend_cpu.c): y [T, C] = the q/k-normalised silu(conv) of xe = [state |
// xin]; xe [(T + KW - 1) C] keeps the rows, so the new state is xe + T C. Both malloc'd.
static void cpu_gdn_conv(const float *xin, const float *st, const float *cw, int T, int C, int KW, int Hk, int Dk,
                         float **py, float **pxe) {
    float *xe = malloc(sizeof(float) * (size_t)(T + KW - 1) * C), *y = malloc(sizeof(float) * (size_t)T * C);
    memcpy(xe, st, sizeof(float) * (KW - 1) * C);
    memcpy(xe + (size_t)(KW - 1) * C, xin, sizeof(float) * (size_t)T * C);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            float s = 0;
            for (int j = 0; j < KW; j++) s += cw[c * KW + j] * xe[(size_t)(t + j) * C + c];
            y[(size_t)t * C + c] = s / (1.0f + expf(-s));
        }
    for (int t = 0; t < T; t++)
        for (int kh = 0; kh < 2 * Hk; kh++) {
            float *x = y + (size_t)t * C + kh * Dk, ss = 0;
            for (int d = 0; d < Dk; d++) ss += x[d] * x[d];
            float r = 1.0f / sqrtf(ss + 1e-6f);
            if (kh < Hk) r /= sqrtf((float)Dk);
            for (int d = 0; d < Dk; d++) x[d] *= r;
        }
    *py = y, *pxe = xe;
}

// The conv + SiLU + q/k L2 norms (one fused kernel) and its state update against the CPU twin
// (backend_cpu.c's formulas), at the model's heads and the test geometries' (Dk 32, 64), whole and
// partial token tiles, and v channels that are not a whole number of Dk (a partial slice). Some
// weights and inputs are zeros of either sign.
static void test_gdn_conv(int T, int Hk, int Dk, int Hv, int Dv) {
    const int KW = 4, C = 2 * Hk * Dk + Hv * Dv;
    float *xin = randv((size_t)T * C, 1), *st = randv((size_t)(KW - 1) * C, 1), *cw = randv((size_t)C * KW, 0.5f);
    for (size_t i = 0; i < (size_t)T * C; i += 61) xin[i] = i % 2 ? -0.0f : 0.0f;
    for (int c = 0; c < C; c += 53)
        for (int j = 0; j < KW; j++) cw[c * KW + j] = 0.0f;
    float *dxin = dup_d(xin, (size_t)T * C * 4), *dcw = dup_d(cw, (size_t)C * KW * 4);
    float *dst = dup_d(st, (size_t)(KW - 1) * C * 4), *dy = poisoned((size_t)T * C * 4);
    const int rc = k_gdn_conv(dxin, dst, dcw, dy, T, C, KW, Hk, Dk, NULL);
    float *xe, *y;
    cpu_gdn_conv(xin, st, cw, T, C, KW, Hk, Dk, &y, &xe);
    char sh[64];
    snprintf(sh, sizeof sh, "T %d C %d Dk %d%s", T, C, Dk, rc ? " LAUNCH FAILED" : "");
    report("gdn conv+l2norm", sh, back(dy, (size_t)T * C), y, (size_t)T * C, 1e-5);
    report("gdn conv state", sh, back(dst, (size_t)(KW - 1) * C), xe + (size_t)T * C, (size_t)(KW - 1) * C, 0);
    free(xin), free(st), free(cw), free(xe), free(y);
    cudaFree(dxin), cudaFree(dcw), cudaFree(dst), cudaFree(dy);
}

static void test_deltanet(int T) {
    const int Hk = QWEN_LIN_K_HEADS, Hv = QWEN_LIN_V_HEADS, Dk = QWEN_LIN_K_DIM, Dv = QWEN_LIN_V_DIM, KW = 4;
    const int KD = Hk * Dk, VD = Hv * Dv, C = 2 * KD + VD;
    float *xin = randv((size_t)T * C, 1), *st = randv((size_t)(KW - 1) * C, 1), *cw = randv((size_t)C * KW, 0.5f);
    float *bb = randv((size_t)T * Hv, 1), *aa = randv((size_t)T * Hv, 1), *z = randv((size_t)T * VD, 1);
    float *Al = randv(Hv, 1), *dtb = randv(Hv, 1), *gn = randv(Dv, 1), *S = randv((size_t)Hv * Dk * Dv, 0.1f);
    float *dxin = dup_d(xin, (size_t)T * C * 4), *dst = dup_d(st, (size_t)(KW - 1) * C * 4), *dcw = dup_d(cw, (size_t)C * KW * 4);
    float *dy = poisoned((size_t)T * C * 4), *dbb = dup_d(bb, (size_t)T * Hv * 4), *daa = dup_d(aa, (size_t)T * Hv * 4);
    float *dz = dup_d(z, (size_t)T * VD * 4), *dAl = dup_d(Al, Hv * 4), *ddtb = dup_d(dtb, Hv * 4), *dgn = dup_d(gn, Dv * 4);
    float *dS = dup_d(S, (size_t)Hv * Dk * Dv * 4), *dout = poisoned((size_t)T * VD * 4);
    k_gdn_conv(dxin, dst, dcw, dy, T, C, KW, Hk, Dk, NULL);
    k_gdn_recurrent(dy, dbb, daa, dz, dAl, ddtb, dgn, dS, dout, T, Hk, Hv, Dk, Dv, 1e-6f, NULL);
    // CPU twin (backend_cpu.c deltanet)
    float *xe, *y;
    cpu_gdn_conv(xin, st, cw, T, C, KW, Hk, Dk, &y, &xe);
    float *stc = xe + (size_t)T * C;   // new conv state
    float *yg = back(dy, (size_t)T * C);
    char sh[64];
    snprintf(sh, sizeof sh, "T %d C %d", T, C);
    report("gdn conv+l2norm", sh, yg, y, (size_t)T * C, 1e-5);
    report("gdn conv state", sh, back(dst, (size_t)(KW - 1) * C), stc, (size_t)(KW - 1) * C, 0);
    float *o = malloc(sizeof(float) * (size_t)T * VD);
    for (int h = 0; h < Hv; h++) {
        float *Sh = S + (size_t)h * Dk * Dv, m[128];
        const int kh = h / (Hv / Hk);
        for (int t = 0; t < T; t++) {
            const float *q = y + (size_t)t * C + kh * Dk, *k = y + (size_t)t * C + KD + kh * Dk;
            const float *v = y + (size_t)t * C + 2 * KD + h * Dv;
            float beta = 1.0f / (1.0f + expf(-bb[t * Hv + h])), xa = aa[t * Hv + h] + dtb[h];
            float sp = xa > 20 ? xa : log1pf(expf(xa)), alpha = expf(-expf(Al[h]) * sp);
            for (int i = 0; i < Dk * Dv; i++) Sh[i] *= alpha;
            for (int dv = 0; dv < Dv; dv++) m[dv] = 0;
            for (int dk = 0; dk < Dk; dk++)
                for (int dv = 0; dv < Dv; dv++) m[dv] += Sh[dk * Dv + dv] * k[dk];
            for (int dv = 0; dv < Dv; dv++) m[dv] = beta * (v[dv] - m[dv]);
            for (int dk = 0; dk < Dk; dk++)
                for (int dv = 0; dv < Dv; dv++) Sh[dk * Dv + dv] += k[dk] * m[dv];
            float *oh = o + (size_t)t * VD + h * Dv, ss = 0;
            for (int dv = 0; dv < Dv; dv++) oh[dv] = 0;
            for (int dk = 0; dk < Dk; dk++)
                for (int dv = 0; dv < Dv; dv++) oh[dv] += Sh[dk * Dv + dv] * q[dk];
            for (int dv = 0; dv < Dv; dv++) ss += oh[dv] * oh[dv];
            float r = 1.0f / sqrtf(ss / Dv + 1e-6f);
            const float *zh = z + (size_t)t * VD + h * Dv;
            for (int dv = 0; dv < Dv; dv++) oh[dv] = gn[dv] * (oh[dv] * r) * (zh[dv] / (1.0f + expf(-zh[dv])));
        }
    }
    report("gdn recurrent+norm", sh, back(dout, (size_t)T * VD), o, (size_t)T * VD, 1e-4);
    report("gdn state", "[32, 128, 128] fp32", back(dS, (size_t)Hv * Dk * Dv), S, (size_t)Hv * Dk * Dv, 1e-5);
}

// The SwiGLU epilogue of the fast up products (k_qmatmul_bf16_swiglu) against the unfused kernels
// run here on the GPU, bit for bit: k_qmatmul_bf16 (up), k_swiglu, k_to_bf16, as cuda_layer ran them
// before issue 12's fusion. The gate is the gate product's own output (k_qmatmul_bf16). Dense: the
// shared expert [N x H] (N = 200: a feature tail); grouped: the routed experts (x gathered by
// slot / k, rows in expert order) with skewed routing, so that some experts have no rows and a few
// more than one 128-row tile.
static void test_swiglu_epilogue(int T, int N, int grouped) {
    const int E = QWEN_EXPERTS, K = QWEN_EXPERTS_USED, H = QWEN_HIDDEN, R = grouped ? T * K : T;
    struct hq gq = make_q(grouped ? E : 0, N, H, 4), uq = make_q(grouped ? E : 0, N, H, 4);
    const size_t nx = (size_t)T * H, ny = (size_t)R * N;
    float *x = randv(nx, 1), *dx = dup_d(x, nx * 4);
    uint16_t *dxb = poisoned(nx * 2);
    k_to_bf16(dx, dxb, (long)nx, NULL);
    int *counts = NULL, *offs = NULL, *slots = NULL, *di = NULL, n_empty = 0, n_big = 0;
    if (grouped) {
        int *ids = malloc(sizeof(int) * R);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < K; i++) {
                int e, dup;
                do {   // half the draws among 4 hot experts
                    e = rnd() % 2 ? (int)(rnd() % 4) : (int)(rnd() % E);
                    dup = 0;
                    for (int j = 0; j < i; j++) dup |= ids[t * K + j] == e;
                } while (dup);
                ids[t * K + i] = e;
            }
        di = dup_d(ids, sizeof(int) * R);
        counts = poisoned(E * 4), offs = poisoned(E * 4), slots = poisoned((size_t)R * 4);
        k_moe_dispatch(di, T, E, K, counts, offs, slots, NULL);
        int *hc = (int *)back(counts, E);
        for (int e = 0; e < E; e++) n_empty += hc[e] == 0, n_big += hc[e] > 128;
        free(ids), free(hc);
    }
    float *dg = poisoned(ny * 4), *du = poisoned(ny * 4), *da = poisoned(ny * 4);
    uint16_t *dref = poisoned(ny * 2), *dfu = poisoned(ny * 2), *href = malloc(ny * 2), *hfu = malloc(ny * 2);
    {
        cudaMemset(dref, 0xff, ny * 2);
        cudaMemset(dfu, 0xff, ny * 2);
        int rc;
        if (grouped) {
            rc = k_qmatmul_bf16(gq.d, dxb, H, slots, K, dg, N, NULL, 0, counts, offs, T, NULL);
            rc = rc ? rc : k_qmatmul_bf16(uq.d, dxb, H, slots, K, du, N, NULL, 0, counts, offs, T, NULL);
            rc = rc ? rc : k_qmatmul_bf16_swiglu(uq.d, dxb, H, slots, K, dg, dfu, N, NULL, 0, counts, offs, T, NULL);
        } else {
            rc = k_qmatmul_bf16(gq.d, dxb, H, NULL, 1, dg, N, NULL, T, NULL, NULL, 0, NULL);
            rc = rc ? rc : k_qmatmul_bf16(uq.d, dxb, H, NULL, 1, du, N, NULL, T, NULL, NULL, 0, NULL);
            rc = rc ? rc : k_qmatmul_bf16_swiglu(uq.d, dxb, H, NULL, 1, dg, dfu, N, NULL, T, NULL, NULL, 0, NULL);
        }
        rc = rc ? rc : k_swiglu(dg, du, da, (long)ny, NULL);
        rc = rc ? rc : k_to_bf16(da, dref, (long)ny, NULL);
        if (cudaDeviceSynchronize() != cudaSuccess) {
            fprintf(stderr, "CUDA error in the swiglu epilogue test\n");
            exit(1);
        }
        cudaMemcpy(href, dref, ny * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(hfu, dfu, ny * 2, cudaMemcpyDeviceToHost);
        size_t dif = 0, unwritten = 0;
        for (size_t i = 0; i < ny; i++) dif += href[i] != hfu[i], unwritten += hfu[i] == 0xffff;
        char sh[96];
        const char *lf = rc ? " LAUNCH FAILED" : "";
        if (grouped) snprintf(sh, sizeof sh, "T %d E %d [%d x %d] grouped%s", T, E, N, H, lf);
        else snprintf(sh, sizeof sh, "T %d [%d x %d]%s", T, N, H, lf);
        const int ok = !rc && !dif && !unwritten;
        checks++;
        fails += !ok;
        printf("%-22s %-34s %zu of %zu differ, %zu unwritten  %s\n", "swiglu epilogue", sh, dif, ny, unwritten,
               ok ? "PASS" : "FAIL");
    }
    if (grouped) printf("%-22s %-34s %d empty experts, %d over one tile\n", "", "(routing)", n_empty, n_big);
    free(x), free(href), free(hfu);
    cudaFree(dx), cudaFree(dxb), cudaFree(dg), cudaFree(du), cudaFree(da), cudaFree(dref), cudaFree(dfu);
    if (grouped) cudaFree(di), cudaFree(counts), cudaFree(offs), cudaFree(slots);
}

// Segmented launches (k_qmatmul_bf16_segs, k_qmatmul_segs: cuda_layer's groups of products of one
// input) against each product's own launch (k_qmatmul_bf16, k_qmatmul) on the same x, bit for bit:
// every output buffer, poisoned before each run, must be equal (0 differing elements) and written.
// The fast products and the exact kernel.
// Then a group of two bit widths must be refused (cudaErrorInvalidValue, nothing launched).
static void test_segments(int T, const char *name, int n, const int *rows, int bits) {
    const int H = QWEN_HIDDEN;
    struct hq q[QM_MAX_SEGS];
    float *alone[QM_MAX_SEGS], *seg[QM_MAX_SEGS];
    size_t ny[QM_MAX_SEGS], total = 0;
    for (int i = 0; i < n; i++) {
        q[i] = make_q(0, rows[i], H, bits);
        ny[i] = (size_t)T * rows[i];
        total += ny[i];
        alone[i] = poisoned(ny[i] * 4);
        seg[i] = poisoned(ny[i] * 4);
    }
    const size_t nx = (size_t)T * H;
    float *x = randv(nx, 1), *dx = dup_d(x, nx * 4);
    uint16_t *dxb = poisoned(nx * 2);
    k_to_bf16(dx, dxb, (long)nx, NULL);
    float *ha = malloc(total * 4), *hs = malloc(total * 4);
    char shape[96] = "";
    for (int i = 0; i < n; i++)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%d", i ? " + " : "", rows[i]);
    for (int exact = 0; exact < 2; exact++) {
        struct qm_seg sg[QM_MAX_SEGS];
        int rc = 0;
        for (int i = 0; i < n; i++) {
            cudaMemset(alone[i], 0xff, ny[i] * 4);
            cudaMemset(seg[i], 0xff, ny[i] * 4);
            sg[i] = (struct qm_seg){q[i].d, seg[i], rows[i]};
            if (!rc)
                rc = exact ? k_qmatmul(q[i].d, dx, H, NULL, 1, alone[i], rows[i], NULL, T, NULL, NULL, 0, NULL)
                           : k_qmatmul_bf16(q[i].d, dxb, H, NULL, 1, alone[i], rows[i], NULL, T, NULL, NULL, 0, NULL);
        }
        if (!rc) rc = exact ? k_qmatmul_segs(sg, n, dx, H, T, NULL) : k_qmatmul_bf16_segs(sg, n, dxb, H, T, NULL);
        if (cudaDeviceSynchronize() != cudaSuccess) {
            fprintf(stderr, "CUDA error in the segments test\n");
            exit(1);
        }
        size_t dif = 0, unwritten = 0, o = 0;
        for (int i = 0; i < n; i++) {
            cudaMemcpy(ha + o, alone[i], ny[i] * 4, cudaMemcpyDeviceToHost);
            cudaMemcpy(hs + o, seg[i], ny[i] * 4, cudaMemcpyDeviceToHost);
            o += ny[i];
        }
        for (size_t j = 0; j < total; j++) dif += memcmp(ha + j, hs + j, 4) != 0, unwritten += isnan(hs[j]);
        char nm[64], sh[128];
        snprintf(nm, sizeof nm, "segments %s", name);
        snprintf(sh, sizeof sh, "T %d [%s] %d-bit %s%s", T, shape, bits, exact ? "exact" : "fast",
                 rc ? " LAUNCH FAILED" : "");
        const int ok = !rc && !dif && !unwritten;
        checks++;
        fails += !ok;
        printf("%-22s %-34s %zu of %zu differ, %zu unwritten  %s\n", nm, sh, dif, total, unwritten,
               ok ? "PASS" : "FAIL");
    }
    {   // another bit width in the group: refused, both kernels
        struct hq o = make_q(0, 32, H, 12 - bits);
        struct qm_seg sg[2] = {{q[0].d, seg[0], rows[0]}, {o.d, seg[0], 32}};
        const int r1 = k_qmatmul_segs(sg, 2, dx, H, T, NULL), r2 = k_qmatmul_bf16_segs(sg, 2, dxb, H, T, NULL);
        const int ok = r1 == (int)cudaErrorInvalidValue && r2 == (int)cudaErrorInvalidValue;
        checks++;
        fails += !ok;
        printf("%-22s %-34s %s\n", "segments mixed bits", "refused (cudaErrorInvalidValue)", ok ? "PASS" : "FAIL");
        cudaFree((void *)o.d.w), cudaFree((void *)o.d.scales), cudaFree((void *)o.d.biases);
        free((void *)o.h.w), free((void *)o.h.scales), free((void *)o.h.biases);
    }
    for (int i = 0; i < n; i++) {
        cudaFree(alone[i]), cudaFree(seg[i]);
        cudaFree((void *)q[i].d.w), cudaFree((void *)q[i].d.scales), cudaFree((void *)q[i].d.biases);
        free((void *)q[i].h.w), free((void *)q[i].h.scales), free((void *)q[i].h.biases);
    }
    free(x), free(ha), free(hs);
    cudaFree(dx), cudaFree(dxb);
}

// The add form of the dense products (k_qmatmul_bf16_add, k_qmatmul_add: cuda_layer's o_proj /
// out_proj into the residual stream) against the plain product into d, then k_add, bit for bit. y
// starts with random values (the stream's prior contents) and has 3 rows past M and 5 padding
// columns (ldy = rows + 5), which must keep them: d is zeroed first, so k_add over the whole buffer
// adds the plain form's output where it writes and +0 (exact) elsewhere. The fast kernel and
// the exact kernel; 0 differing elements to pass.
static void test_add(int T, int rows, int cols, int bits, const char *name) {
    const int ldy = rows + 5, Ty = T + 3;
    const size_t nx = (size_t)T * cols, ny = (size_t)Ty * ldy;
    struct hq q = make_q(0, rows, cols, bits);
    float *x = randv(nx, 1), *y0 = randv(ny, 2), *dx = dup_d(x, nx * 4);
    uint16_t *dxb = poisoned(nx * 2);
    k_to_bf16(dx, dxb, (long)nx, NULL);
    float *dd = poisoned(ny * 4), *dref = poisoned(ny * 4), *dadd = poisoned(ny * 4);
    float *href = malloc(ny * 4), *hadd = malloc(ny * 4);
    for (int exact = 0; exact < 2; exact++) {
        cudaMemset(dd, 0, ny * 4);
        cudaMemcpy(dref, y0, ny * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dadd, y0, ny * 4, cudaMemcpyHostToDevice);
        int rc = exact ? k_qmatmul(q.d, dx, cols, NULL, 1, dd, ldy, NULL, T, NULL, NULL, 0, NULL)
                       : k_qmatmul_bf16(q.d, dxb, cols, NULL, 1, dd, ldy, NULL, T, NULL, NULL, 0, NULL);
        rc = rc ? rc : k_add(dref, dd, (long)ny, NULL);
        rc = rc ? rc : exact ? k_qmatmul_add(q.d, dx, cols, dadd, ldy, T, NULL)
                             : k_qmatmul_bf16_add(q.d, dxb, cols, dadd, ldy, T, NULL);
        if (cudaDeviceSynchronize() != cudaSuccess) {
            fprintf(stderr, "CUDA error in the add test\n");
            exit(1);
        }
        cudaMemcpy(href, dref, ny * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(hadd, dadd, ny * 4, cudaMemcpyDeviceToHost);
        size_t dif = 0, changed = 0;   // changed: elements the add moved off y's start (most of T x rows)
        for (size_t i = 0; i < ny; i++) dif += memcmp(href + i, hadd + i, 4) != 0, changed += hadd[i] != y0[i];
        char nm[64], sh[128];
        snprintf(nm, sizeof nm, "add %s", name);
        snprintf(sh, sizeof sh, "T %d [%d x %d] %d-bit %s%s", T, rows, cols, bits, exact ? "exact" : "fast",
                 rc ? " LAUNCH FAILED" : "");
        const int ok = !rc && !dif && changed > 0;
        checks++;
        fails += !ok;
        printf("%-22s %-34s %zu of %zu differ from product + k_add, %zu changed  %s\n", nm, sh, dif, ny, changed,
               ok ? "PASS" : "FAIL");
    }
    cudaFree((void *)q.d.w), cudaFree((void *)q.d.scales), cudaFree((void *)q.d.biases);
    free((void *)q.h.w), free((void *)q.h.scales), free((void *)q.h.biases);
    free(x), free(y0), free(href), free(hadd);
    cudaFree(dx), cudaFree(dxb), cudaFree(dd), cudaFree(dref), cudaFree(dadd);
}

// k_rmsnorm_gate (the post-attention norm with the shared-expert gate's logit): y and yb bit-identical
// to k_rmsnorm's, and gy[t] = sum_k y[t, k] g[k] against a double twin on the kernel's own y (g
// dequantized exactly from the bf16 scale and bias). Bound: the kernel's g_k = s q + b is rounded once
// (s q is exact in fp32: 8 + 8 bits), each product y g_k once (or fused with its sum), and a term then
// passes at most n / 256 sequential sums in its thread, 5 in the warp's xor tree and 5 in the block's:
// with u = 2^-24, |gy - ref| <= (n / 256 + 12) u (1 + O(u)) sum_k |y g_k| = 20 u = 1.2e-6 of sum|y g| at
// n = 2048. Held to 1e-5 of sum|y g| (8x that); a lost or misread group of 64 weighs ~1/32 of it.
static void test_rmsnorm_gate(int T, int bits, int with_yb) {
    const int H = QWEN_HIDDEN;
    const size_t n = (size_t)T * H;
    float *x = randv(n, 3), *w = randv(H, 1);
    struct hq g = make_q(0, 1, H, bits);
    float *dx = dup_d(x, n * 4), *dw = dup_d(w, H * 4), *dy1 = poisoned(n * 4), *dy2 = poisoned(n * 4);
    float *dgy = poisoned((size_t)T * 4);
    uint16_t *db1 = with_yb ? poisoned(n * 2) : NULL, *db2 = with_yb ? poisoned(n * 2) : NULL;
    int rc = k_rmsnorm(dx, NULL, dw, dy1, db1, T, H, 1e-6f, NULL);
    rc = rc ? rc : k_rmsnorm_gate(dx, NULL, dw, dy2, db2, T, H, 1e-6f, g.d, dgy, NULL);
    float *y1 = back(dy1, n), *y2 = back(dy2, n), *gy = back(dgy, T);
    size_t dif = 0, difb = 0, bad = 0;
    for (size_t i = 0; i < n; i++) dif += memcmp(&y1[i], &y2[i], 4) != 0;
    if (with_yb) {
        uint16_t *b1 = malloc(n * 2), *b2 = malloc(n * 2);
        cudaMemcpy(b1, db1, n * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(b2, db2, n * 2, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < n; i++) difb += b1[i] != b2[i];
        free(b1), free(b2);
    }
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double ref = 0, mag = 0;
        for (int k = 0; k < H; k++) {   // s q + b exactly in double (bf16 s and b, integer q)
            const double gk = (double)qscale(&g.h, 0, k) * qcode(&g.h, 0, k) + qbias(&g.h, 0, k);
            ref += (double)y1[(size_t)t * H + k] * gk;
            mag += fabs((double)y1[(size_t)t * H + k] * gk);
        }
        const double e = fabs((double)gy[t] - ref) / (mag > 0 ? mag : 1);
        bad += !(e <= 1e-5);
        worst = e > worst ? e : worst;
    }
    char sh[96];
    snprintf(sh, sizeof sh, "T %d x %d, %d-bit gate%s%s", T, H, bits, with_yb ? ", yb" : "", rc ? " LAUNCH FAILED" : "");
    const int ok = !rc && !dif && !difb && !bad;
    checks++;
    fails += !ok;
    printf("%-22s %-34s y %zu, yb %zu differ; gy err/sum|yg| max %.2e (tol 1e-5), %zu over  %s\n",
           "rmsnorm + gate", sh, dif, difb, worst, bad, ok ? "PASS" : "FAIL");
    free(x), free(w), free(y1), free(y2), free(gy);
    cudaFree(dx), cudaFree(dw), cudaFree(dy1), cudaFree(dy2), cudaFree(dgy);
    if (with_yb) cudaFree(db1), cudaFree(db2);
    cudaFree((void *)g.d.w), cudaFree((void *)g.d.scales), cudaFree((void *)g.d.biases);
    free((void *)g.h.w), free((void *)g.h.scales), free((void *)g.h.biases);
}

static void test_swiglu(void) {
    const long n = 8L * QWEN_MOE_INTER * 37;
    float *g = randv(n, 2), *u = randv(n, 1), *yc = malloc(sizeof(float) * n);
    for (long i = 0; i < n; i++) yc[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    float *dg = dup_d(g, n * 4), *du = dup_d(u, n * 4), *dy = poisoned(n * 4);
    k_swiglu(dg, du, dy, n, NULL);
    report("swiglu", "37 x 8 x 512", back(dy, n), yc, n, 1e-6);
}

int main(int argc, char **argv) {
    char why[256];
    if (!backend_cuda_available(why, sizeof why)) {
        printf("test_cuda_kernels: no suitable GPU (%s); ran nothing\n", why);
        return 77;   // ran nothing: never a pass (gpu_check records a FAIL)
    }
    if (argc > 1) rng ^= strtoull(argv[1], NULL, 10) * 0x9E3779B97F4A7C15ull;
    // argv[2] "attention": only the attention checks; "fast": only the fast prefill's products, their
    // SwiGLU epilogue, segmented launches and the norm's bf16 copy; "segments": only the segmented
    // launches; "gdn": the DeltaNet checks; "moe": the MoE checks; "add": the products' add form
    // (o_proj / out_proj into the residual); "gate": the post-attention norm with the shared-expert
    // gate's logit (quick runs while working on those kernels; "fast" runs the last two as well)
    const char *only = argc > 2 ? argv[2] : "";
    const bool all = !*only, fast = !strcmp(only, "fast"), attn = all || !strcmp(only, "attention");
    const bool segs = !strcmp(only, "segments");
    printf("# %s%s%s\n", why, *only ? "; checks: " : "", only);
    if (!strcmp(only, "moe")) test_moe(64);   // routing, dispatch, the grouped products (both grids), combine
    if (all || fast) {
        test_rmsnorm_embed();
        test_swiglu();
        // the fast products (warpgroup products)
        test_matmul_fast(300, 2 * QWEN_LIN_K_HEADS * QWEN_LIN_K_DIM + QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM, QWEN_HIDDEN,
                         4, "qmatmul in_qkv");
        test_matmul_fast(130, QWEN_EXPERTS, QWEN_HIDDEN, 8, "qmatmul router");
        test_matmul_fast(65, QWEN_LIN_V_HEADS, QWEN_HIDDEN, 4, "qmatmul in_b");
        test_matmul_fast(33, 1, QWEN_HIDDEN, 8, "qmatmul shared gate");
        test_matmul_fast(257, QWEN_SHARED_INTER, QWEN_HIDDEN, 4, "qmatmul se_gate");
        test_swiglu_epilogue(257, QWEN_SHARED_INTER, 0);
        test_matmul_fast(77, QWEN_HIDDEN, QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM, 4, "qmatmul out_proj");
        test_swiglu_epilogue(77, 200, 0);
        test_swiglu_epilogue(200, QWEN_MOE_INTER, 1);
        test_moe(64);
    }
    if (all || fast || segs) {   // cuda_layer's groups of products of one input (mm_segs)
        const int dn[] = {2 * QWEN_LIN_K_HEADS * QWEN_LIN_K_DIM + QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM,
                          QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM, QWEN_LIN_V_HEADS, QWEN_LIN_V_HEADS};
        const int at[] = {2 * QWEN_HEADS * QWEN_HEAD_DIM, QWEN_KV_HEADS * QWEN_HEAD_DIM, QWEN_KV_HEADS * QWEN_HEAD_DIM};
        const int gt[] = {QWEN_EXPERTS, 1};
        test_segments(4096, "DeltaNet in", 4, dn, 4);
        test_segments(1000, "attention qkv", 3, at, 4);
        test_segments(4096, "router+sh.gate", 2, gt, 8);
        test_segments(77, "router+sh.gate", 2, gt, 8);
    }
    if (all || fast || !strcmp(only, "add")) {   // cuda_layer's o_proj / out_proj into the residual stream
        test_add(4096, QWEN_HIDDEN, QWEN_HEADS * QWEN_HEAD_DIM, 4, "o_proj");
        test_add(300, QWEN_HIDDEN, QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM, 4, "out_proj");
        test_add(77, 200, QWEN_HIDDEN, 8, "tails");   // rows and features not multiples of 128
    }
    if (all || fast || !strcmp(only, "gate")) {   // cuda_layer's post-attention norm, both modes' forms
        test_rmsnorm_gate(7, 8, 1);
        test_rmsnorm_gate(300, 8, 0);
        test_rmsnorm_gate(300, 8, 1);
        test_rmsnorm_gate(33, 4, 1);
    }
    if (all) {
        test_matmul(300, 2 * QWEN_LIN_K_HEADS * QWEN_LIN_K_DIM + QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM, QWEN_HIDDEN, 4, "qmatmul in_qkv");
        test_matmul(77, QWEN_HIDDEN, QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM, 4, "qmatmul out_proj");
        test_matmul(130, QWEN_EXPERTS, QWEN_HIDDEN, 8, "qmatmul router");
        test_matmul(65, QWEN_LIN_V_HEADS, QWEN_HIDDEN, 4, "qmatmul in_b");
    }
    if (attn) {
        const int NH = QWEN_HEADS, NKV = QWEN_KV_HEADS, D = QWEN_HEAD_DIM;
        test_attention(1, 3000, 4096, NH, NKV, D);   // one row (the layer probe's T = 1)
        test_attention(1, 0, 16, NH, NKV, D);
        test_attention(100, 700, 1024, NH, NKV, D);
        test_attention(37, 0, 64, NH, NKV, D);
        test_attention(129, 0, 200, NH, NKV, D);
        test_attention(300, 1990, 2400, NH, NKV, D);
        test_attention(64, 8192, 8256, NH, NKV, D);    // long keys: 64 queries after 8K cached keys
        test_attention(100, 8130, 8300, NH, NKV, D);   // long keys, the chunk starting mid-tile, a partial block
        test_attention(100, 300, 512, 8, 2, 128);      // the small geometry's heads (the mma.sync fast kernel)
        test_attention(70, 0, 128, 4, 2, 64);          // the tiny geometry's
    }
    if (all || !strcmp(only, "gdn")) {
        test_deltanet(1);
        test_deltanet(37);
        // the conv on the model's heads and the test checkpoints' (Dk 32, 64), whole and partial tiles
        const int cv_T[] = {1, 31, 37, 300, 4096};
        for (int i = 0; i < 5; i++)
            test_gdn_conv(cv_T[i], QWEN_LIN_K_HEADS, QWEN_LIN_K_DIM, QWEN_LIN_V_HEADS, QWEN_LIN_V_DIM);
        test_gdn_conv(45, 2, 32, 4, 32);
        test_gdn_conv(96, 4, 64, 8, 64);
        test_gdn_conv(40, 2, 32, 3, 48);   // v channels not a whole number of Dk: a partial slice
    }
    printf("test_cuda_kernels: %d checks, %d failed  %s\n", checks, fails, fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
