// decode_lab.c: the decode step's kernels one by one, and measurements of the step (the lab; none
// of it is a test of speed).
//
//   decode_lab lab [CASE]                   k_dv at this model's decode shapes against a double CPU
//                                           reference (outputs poisoned first), both modes, then
//                                           timed: GB/s of each against its bytes; the MoE gate/up
//                                           and down kernels, fast against exact (CASE 100: only them)
//   decode_lab profile MODEL_DIR N          one eager decode step at context N between
//                                           cudaProfilerStart/Stop (run under ncu)
//   decode_lab replay MODEL_DIR N STEPS     the host's share of a decode step: STEPS steps through
//                                           engine_forward, then the captured step replayed back to back
//   decode_lab stages MODEL_DIR N STEPS     what each stage costs in the captured step (skipped,
//                                           doubled)
// Exit 0 when every check the lab makes passes, 1 when one fails, 2 on a CUDA error or bad arguments,
// 77 when there is no GPU (ran nothing).
#include "backend_cuda.h"
#include "checkpoint.h"
#include "cuda/kernels.h"
#include "engine.h"
#include "gpu/gpu_test.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails, checks;

static double nerr(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        num += isnan(a[i]) ? INFINITY : d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static void *to_dev(const void *h, size_t bytes) {
    void *d;
    CUDA_OK(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

// ---- the kernel lab -----------------------------------------------------------------------------

struct hq {   // a random quantized matrix, host and device
    uint32_t *w;
    uint16_t *s, *b;
    struct dqt d;
};
static struct hq hq_new(int rows, int cols, int bits) {
    struct hq m;
    const size_t nw = (size_t)rows * cols * bits / 32, ng = (size_t)rows * cols / 64;
    m.w = malloc(nw * 4);
    m.s = malloc(ng * 2);
    m.b = malloc(ng * 2);
    for (size_t i = 0; i < nw; i++) m.w[i] = rnd() ^ (rnd() << 21);
    const float lev = (float)((1 << bits) - 1);
    for (size_t i = 0; i < ng; i++) {
        const float sc = (0.5f + 0.5f * fabsf(frand())) * 2.0f / lev / sqrtf((float)cols);
        m.s[i] = f32_to_bf16(sc);
        m.b[i] = f32_to_bf16(-sc * lev / 2 * (1.0f + 0.1f * frand()));
    }
    m.d = (struct dqt){.w = to_dev(m.w, nw * 4), .scales = to_dev(m.s, ng * 2), .biases = to_dev(m.b, ng * 2),
                       .n_mat = 0, .rows = rows, .cols = cols, .bits = bits};
    return m;
}
static void hq_free(struct hq *m) {
    free(m->w), free(m->s), free(m->b);
    cudaFree((void *)m->d.w), cudaFree((void *)m->d.scales), cudaFree((void *)m->d.biases);
}
static size_t hq_bytes(const struct hq *m) {
    return (size_t)m->d.rows * m->d.cols * m->d.bits / 8 + (size_t)m->d.rows * m->d.cols / 64 * 4;
}
static double hq_dot(const struct hq *m, int row, const double *x) {
    const int K = m->d.cols, per = 32 / m->d.bits;
    const uint32_t mask = (1u << m->d.bits) - 1;
    double acc = 0;
    for (int k = 0; k < K; k++) {
        const uint32_t q = (m->w[((size_t)row * K + k) / per] >> ((k % per) * m->d.bits)) & mask;
        const size_t g = ((size_t)row * K + k) / 64;
        acc += ((double)bf16_to_f32(m->s[g]) * q + bf16_to_f32(m->b[g])) * x[k];
    }
    return acc;
}

// One k_dv configuration: rows of each segment, K, bits, input and output modes.
// How the lab launches: the default stream, PDL as the backend's default, the mode as a check asks.
static struct dec_launch lab_l = {.stream = NULL, .pdl = true};

struct lab_case {
    const char *name;
    int K, n_seg, rows[DV_MAXSEG], bits[DV_MAXSEG], in_mode, out_mode;
};

static void lab_run(const struct lab_case *c, FILE *table) {
    const int K = c->K;
    float *x = malloc(sizeof(float) * K), *nw = malloc(sizeof(float) * K);
    for (int i = 0; i < K; i++) x[i] = frand() * 3, nw[i] = 1 + 0.2f * frand();
    // The reference input transform (double).
    double *xs = malloc(sizeof(double) * K);
    const float eps = 1e-6f;
    if (c->in_mode == DV_IN_RMS) {
        double ss = 0;
        for (int i = 0; i < K; i++) ss += (double)x[i] * x[i];
        for (int i = 0; i < K; i++) xs[i] = x[i] / sqrt(ss / K + eps) * nw[i];
    } else {
        for (int i = 0; i < K; i++) xs[i] = x[i];
    }
    struct dv_desc d = {.n_seg = c->n_seg, .x = to_dev(x, 4 * (size_t)K), .K = K, .in_mode = c->in_mode,
                        .norm_w = to_dev(nw, 4 * (size_t)K), .eps = eps};
    struct hq m[DV_MAXSEG];
    size_t bytes = 0;
    int maxrows = 0;
    for (int s = 0; s < c->n_seg; s++) {
        m[s] = hq_new(c->rows[s], K, c->bits[s]);
        bytes += hq_bytes(&m[s]);
        if (c->rows[s] > maxrows) maxrows = c->rows[s];
    }
    // conv: C = rows of segment 0, KW 4, random state
    const int KW = 4, C = c->rows[0];
    float *cw = malloc(sizeof(float) * (size_t)C * KW), *cst = malloc(sizeof(float) * (size_t)C * (KW - 1));
    for (size_t i = 0; i < (size_t)C * KW; i++) cw[i] = frand() * 0.5f;
    for (size_t i = 0; i < (size_t)C * (KW - 1); i++) cst[i] = frand();
    float *y0 = malloc(sizeof(float) * (size_t)maxrows);
    for (int i = 0; i < maxrows; i++) y0[i] = frand();
    unsigned long long *dbest;
    CUDA_OK(cudaMalloc((void **)&dbest, 8));
    for (int s = 0; s < c->n_seg; s++) {
        float *dy;
        CUDA_OK(cudaMalloc((void **)&dy, 4 * (size_t)c->rows[s]));
        if (c->out_mode == DV_OUT_ADD) CUDA_OK(cudaMemcpy(dy, y0, 4 * (size_t)c->rows[s], cudaMemcpyHostToDevice));
        else CUDA_OK(cudaMemset(dy, 0xff, 4 * (size_t)c->rows[s]));   // poison: NaN
        d.seg[s] = (struct dv_seg){m[s].d, dy, s == 0 ? c->out_mode : DV_OUT_STORE};
    }
    if (c->out_mode == DV_OUT_CONV) {
        d.conv_w = to_dev(cw, sizeof(float) * (size_t)C * KW);
        d.conv_state = to_dev(cst, sizeof(float) * (size_t)C * (KW - 1));
        d.C = C, d.KW = KW;
    }
    if (c->out_mode == DV_OUT_ARGMAX) {
        d.best = dbest;
        CUDA_OK(cudaMemset(dbest, 0, 8));
    }
    CUDA_OK((cudaError_t)k_dv(&d, &lab_l));
    CUDA_OK(cudaDeviceSynchronize());
    // Check every segment.
    double worst = 0;
    for (int s = 0; s < c->n_seg; s++) {
        const int R = c->rows[s];
        double *ref = malloc(sizeof(double) * R);
        float *got = malloc(sizeof(float) * R);
        CUDA_OK(cudaMemcpy(got, d.seg[s].y, 4 * (size_t)R, cudaMemcpyDeviceToHost));
        for (int r = 0; r < R; r++) {
            double v = hq_dot(&m[s], r, xs);
            const int mode = d.seg[s].mode;
            if (mode == DV_OUT_ADD) v += y0[r];
            if (mode == DV_OUT_CONV) {
                double a = cw[(size_t)r * KW + KW - 1] * v;
                for (int j = 0; j < KW - 1; j++) a += cw[(size_t)r * KW + j] * cst[(size_t)j * C + r];
                v = a / (1 + exp(-a));
            }
            ref[r] = v;
        }
        const double e = nerr(got, ref, (size_t)R);
        if (e > worst) worst = e;
        if (d.seg[s].mode == DV_OUT_ARGMAX) {   // the key names the first maximum of what was stored
            unsigned long long key;
            CUDA_OK(cudaMemcpy(&key, dbest, 8, cudaMemcpyDeviceToHost));
            const int idx = (int)(0xffffffffu - (uint32_t)(key & 0xffffffffu));
            int b = 0;
            for (int r = 1; r < R; r++)
                if (got[r] > got[b]) b = r;
            checks++;
            if (idx != b) {
                fails++;
                printf("FAIL %s: argmax %d, stored values say %d\n", c->name, idx, b);
            }
        }
        free(ref);
        free(got);
    }
    // The bound. Exact mode: fp32 sums of K products, ~sqrt(K) * 2^-24 relative, with headroom.
    // Fast mode (the large 4-bit products on the tensor cores, input rounded to bf16): each input
    // carries a relative error up to 2^-9, so a product's error is up to 2^-9 sum_k |W_nk x_k|
    // (test_tcgemv checks that per row); over random rows that is ~2^-9 / sqrt(3) of |y| on
    // average with |y| ~ sum |W x| / sqrt(K)-scale cancellation: 1e-2 of the normalised error
    // holds that with headroom and still fails on a wrong layout (errors of order 1).
    const double tol = lab_l.exact ? 1e-5 : 1e-2;
    checks++;
    if (!(worst <= tol)) fails++;
    // Time it: 50 launches in a graph-free loop after a warm-up, restoring nothing (the conv state
    // and the residual drift, which changes no timing).
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int i = 0; i < 5; i++) k_dv(&d, &lab_l);
    const int reps = 50;
    cudaEventRecord(a, NULL);
    for (int i = 0; i < reps; i++) k_dv(&d, &lab_l);
    cudaEventRecord(b, NULL);
    CUDA_OK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    const double us = 1000.0 * ms / reps;
    fprintf(table, "%-28s %-5s %-6s %9.2e  %7.2f MB %8.2f us %7.0f GB/s\n", c->name, lab_l.exact ? "exact" : "fast",
            worst <= tol ? "PASS" : "FAIL", worst,
            bytes / 1e6, us, bytes / (us * 1e-6) / 1e9);
    for (int s = 0; s < c->n_seg; s++) {
        hq_free(&m[s]);
        cudaFree(d.seg[s].y);
    }
    cudaFree((void *)d.x), cudaFree((void *)d.norm_w), cudaFree(dbest);
    if (d.conv_w) cudaFree((void *)d.conv_w), cudaFree(d.conv_state);
    free(x), free(nw), free(xs), free(cw), free(cst), free(y0);
}

// Microseconds a launch of fn(m), 50 back to back after 5 of warm-up (the lab's timing).
static double moe_us(int (*fn)(const struct dv_moe *, const struct dec_launch *), const struct dv_moe *m) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int i = 0; i < 55; i++) {
        if (i == 5) cudaEventRecord(a, NULL);
        fn(m, &lab_l);
    }
    cudaEventRecord(b, NULL);
    CUDA_OK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return 1000.0 * ms / 50;
}

// k_dv_moe_gateup at the model's shape (256 experts, top 8, H 2048, I 512), fast (the 8-warp
// tensor-core tile) and exact (the CUDA cores), both against a double reference of silu(gate u) *
// (up u) for the routed and shared experts; ids and weights identical; then k_dv_moe_down in both
// modes on the fast output against a double reference; each timed.
static void lab_gateup(void) {
    const int E = 256, K = 8, H = 2048, I = 512;
    struct hq gate = hq_new(E * I, H, 4), up = hq_new(E * I, H, 4), sg = hq_new(I, H, 4), su = hq_new(I, H, 4);
    struct hq down = hq_new(E * H, I, 4), sd = hq_new(H, I, 4);   // prefetched by the kernel only
    float *lg = malloc(4 * E), *u = malloc(4 * (size_t)H), sl = 0.3f;
    for (int e = 0; e < E; e++) lg[e] = 2 * frand();
    for (int i = 0; i < H; i++) u[i] = frand();
    float *dact, *dw;
    int *dids;
    CUDA_OK(cudaMalloc((void **)&dact, 4 * (size_t)(K + 1) * I));
    CUDA_OK(cudaMalloc((void **)&dw, 4 * (K + 1)));
    CUDA_OK(cudaMalloc((void **)&dids, 4 * (K + 1)));
    struct dv_moe m = {.logits = to_dev(lg, 4 * E), .shared_logit = to_dev(&sl, 4), .u = to_dev(u, 4 * (size_t)H),
                       .gate = gate.d, .up = up.d, .down = down.d, .sgate = sg.d, .sup = su.d, .sdown = sd.d,
                       .E = E, .k = K, .H = H, .I = I, .act = dact, .ids = dids, .w = dw};
    m.gate.n_mat = m.up.n_mat = E, m.down.n_mat = E;
    float *act[2] = {malloc(4 * (size_t)(K + 1) * I), malloc(4 * (size_t)(K + 1) * I)}, w[2][K + 1];
    int ids[2][K + 1];
    double us[2];
    for (int f = 0; f < 2; f++) {   // f = 0: fast, 1: exact
        lab_l.exact = f;
        CUDA_OK(cudaMemset(dact, 0xff, 4 * (size_t)(K + 1) * I));   // poison: NaN
        CUDA_OK((cudaError_t)k_dv_moe_gateup(&m, &lab_l));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(act[f], dact, 4 * (size_t)(K + 1) * I, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(w[f], dw, 4 * (K + 1), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(ids[f], dids, 4 * (K + 1), cudaMemcpyDeviceToHost));
        us[f] = moe_us(k_dv_moe_gateup, &m);
    }
    lab_l.exact = false;
    double *ud = malloc(8 * (size_t)H), *ref = malloc(8 * (size_t)(K + 1) * I);
    for (int i = 0; i < H; i++) ud[i] = u[i];
    for (int e = 0; e <= K; e++)
        for (int n = 0; n < I; n++) {
            const bool shared = e == K;
            const int row = shared ? n : ids[1][e] * I + n;
            const double g = hq_dot(shared ? &sg : &gate, row, ud), v = hq_dot(shared ? &su : &up, row, ud);
            ref[(size_t)e * I + n] = g / (1 + exp(-g)) * v;
        }
    const size_t n = (size_t)(K + 1) * I;
    const double ef = nerr(act[0], ref, n), ex = nerr(act[1], ref, n);
    const int same = !memcmp(ids[0], ids[1], sizeof ids[0]) && !memcmp(w[0], w[1], sizeof w[0]);
    // Bounds: the lab's (lab_run): the fast products' bf16 input 1e-2, the exact mode's fp32 1e-5.
    checks += 3;
    fails += !(ef <= 1e-2) + !(ex <= 1e-5) + !same;
    printf("gate/up fast      nerr %.2e (exact %.2e)  ids, weights %s  %.2f us (exact %.2f us)\n", ef, ex,
           same ? "identical" : "DIFFER", us[0], us[1]);
    // The down product on that act: x + sum_e w_e down_e act_e, fast (tensor cores) and exact (CUDA
    // cores), against a double reference of the update (act and w as the device has them).
    float *x0 = malloc(4 * (size_t)H), *xo[2] = {malloc(4 * (size_t)H), malloc(4 * (size_t)H)};
    for (int i = 0; i < H; i++) x0[i] = 3 * frand();
    m.x = to_dev(x0, 4 * (size_t)H);
    CUDA_OK(cudaMemcpy(dact, act[0], 4 * n, cudaMemcpyHostToDevice));
    for (int f = 0; f < 2; f++) {   // f = 0: fast, 1: exact
        lab_l.exact = f;
        CUDA_OK(cudaMemcpy(m.x, x0, 4 * (size_t)H, cudaMemcpyHostToDevice));
        CUDA_OK((cudaError_t)k_dv_moe_down(&m, &lab_l));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(xo[f], m.x, 4 * (size_t)H, cudaMemcpyDeviceToHost));
        us[f] = moe_us(k_dv_moe_down, &m);
    }
    lab_l.exact = false;
    double *ad = malloc(8 * (size_t)I), *dref = malloc(8 * (size_t)H);
    float *dd[2] = {malloc(4 * (size_t)H), malloc(4 * (size_t)H)};
    for (int r = 0; r < H; r++) dref[r] = 0;
    for (int e = 0; e <= K; e++) {
        for (int i = 0; i < I; i++) ad[i] = act[0][(size_t)e * I + i];
        for (int r = 0; r < H; r++)
            dref[r] += (double)w[0][e] * hq_dot(e == K ? &sd : &down, e == K ? r : ids[0][e] * H + r, ad);
    }
    for (int r = 0; r < H; r++) dd[0][r] = xo[0][r] - x0[r], dd[1][r] = xo[1][r] - x0[r];
    const double et = nerr(dd[0], dref, (size_t)H), ec = nerr(dd[1], dref, (size_t)H);
    // Bounds: the tensor-core form rounds act to bf16 (the lab's fast bound 1e-2); the CUDA-core form
    // is fp32 throughout (the lab's exact bound 1e-5; the update is small against x, so it is compared
    // as the update, not as x).
    checks += 2;
    fails += !(et <= 1e-2) + !(ec <= 1e-5);
    printf("down fast         nerr %.2e (exact %.2e)  %.2f us (exact %.2f us)\n", et, ec, us[0], us[1]);
    cudaFree(m.x);
    free(x0), free(xo[0]), free(xo[1]), free(ad), free(dref), free(dd[0]), free(dd[1]);
    hq_free(&gate), hq_free(&up), hq_free(&sg), hq_free(&su), hq_free(&down), hq_free(&sd);
    cudaFree((void *)m.logits), cudaFree((void *)m.shared_logit), cudaFree((void *)m.u), cudaFree(dact), cudaFree(dw),
        cudaFree(dids);
    free(lg), free(u), free(act[0]), free(act[1]), free(ud), free(ref);
}

static int lab(int only) {
    const struct lab_case cases[] = {
        {"gdn in: qkv conv|z|b|a", 2048, 4, {8192, 4096, 32, 32}, {4, 4, 4, 4}, DV_IN_RMS, DV_OUT_CONV},
        {"attn in: q|k|v", 2048, 3, {8192, 512, 512}, {4, 4, 4}, DV_IN_RMS, DV_OUT_STORE},
        {"o_proj + residual", 4096, 1, {2048}, {4}, DV_IN_PLAIN, DV_OUT_ADD},
        {"router|shared gate (8-bit)", 2048, 2, {256, 1}, {8, 8}, DV_IN_RMS, DV_OUT_STORE},
        {"expert down shape 2048x512", 512, 1, {2048}, {4}, DV_IN_PLAIN, DV_OUT_STORE},
        {"lm_head + argmax", 2048, 1, {248320}, {4}, DV_IN_RMS, DV_OUT_ARGMAX},
        {"tiny geometry 128", 128, 2, {320, 8}, {4, 4}, DV_IN_RMS, DV_OUT_STORE},
        {"tiny 8-bit 128", 128, 2, {8, 1}, {8, 8}, DV_IN_PLAIN, DV_OUT_ADD},
    };
    printf("%-28s %-5s %-6s %9s  %10s %11s %12s\n", "k_dv case", "mode", "check", "nerr", "bytes", "time", "bandwidth");
    for (int ex = 1; ex >= 0; ex--) {
        lab_l.exact = ex;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            if (only < 0 || (size_t)only == i) lab_run(&cases[i], stdout);
    }
    if (only < 0 || only == 100) lab_gateup();   // fast mode (lab_l.exact 0 here)
    return 0;
}

// ---- the step ----------------------------------------------------------------------------------

// A CUDA engine on dir (prefill exact; decode fast, eager or on the graph, PDL on) and a sequence of
// n + extra positions holding
// an n-token prompt (token i = i * 2654435761 mod vocab); *next: the prompt's greedy token. 0 or -1.
static int open_prefilled(const char *dir, bool eager, int n, int extra, struct engine **pe, struct seq **ps,
                          int32_t *next) {
    char err[512];
    struct engine_options o = {.backend = "cuda"};
    if (engine_open(dir, &o, pe, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    struct cuda_tuning *tu = backend_cuda_tuning(*pe);
    tu->exact_prefill = true;   // as e2e's
    tu->eager = eager;
    const int V = engine_geometry(*pe)->vocab;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) p[i] = (int32_t)((uint32_t)((uint64_t)i * 2654435761u) % (uint32_t)V);
    const int rc = seq_new(*pe, n + extra, ps, err, sizeof err) || engine_forward(*pe, *ps, p, n, NULL, next, err, sizeof err);
    free(p);
    if (rc) fprintf(stderr, "%s\n", err);
    return rc ? -1 : 0;
}

// The host's share of a decode step (a measurement, not a check of speed): steps greedy steps as
// engine_forward runs them (launch, wait, read the token back), then the same captured step
// replayed back to back on the device with no host round trip between.
static int replay(const char *dir, int n, int steps) {
    char err[512];
    struct engine *e;
    struct seq *s;
    int32_t next;
    if (open_prefilled(dir, false, n, steps + 1, &e, &s, &next)) return 2;
    double t = 0, dev = 0;
    for (int k = 0; k < steps; k++) {
        const double t0 = now_s();
        if (engine_forward(e, s, &next, 1, NULL, &next, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 2;
        }
        if (k >= 2) t += now_s() - t0;
    }
    const double host = 1000 * t / (steps - 2);
    const int rc = backend_cuda_decode_replay(e, s, steps, &dev);
    checks++;
    if (rc || !(dev > 0)) fails++, printf("FAIL replay rc %d\n", rc);
    printf("decode step at %d: %.4f ms through engine_forward, %.4f ms replayed back to back: host share %.4f ms\n", n,
           host, dev, host - dev);
    seq_free(s);
    engine_close(e);
    return rc;
}

// What each stage of the decode step costs inside the captured step (a measurement, not a check of
// speed): the step replayed as it is, then with one stage's launches skipped and then doubled in
// every layer. A stage's cost on the step's chain is about "as is - skipped"; "doubled - as is" is
// its chain with its weights already in L2. The outputs of the probed steps are garbage.
static int stages(const char *dir, int n, int steps) {
    struct engine *e;
    struct seq *s;
    int32_t next;
    if (open_prefilled(dir, false, n, 2 * DS_COUNT + 2, &e, &s, &next)) return 2;
    char err[512];
    int rc = engine_forward(e, s, &next, 1, NULL, &next, err, sizeof err);   // captures the real step
    double base = 0, t0 = 0, t2 = 0;
    rc = rc || backend_cuda_decode_replay(e, s, steps, &base);
    printf("decode step at %d: %.4f ms replayed (%d steps a row)\n%-10s %10s %10s %10s %10s\n", n, base, steps, "stage",
           "skipped", "doubled", "as-skip", "dbl-as");
    for (int st = DS_NONE + 1; st < DS_COUNT && !rc; st++) {
        // engine_forward captures the probed step; its token is garbage (none at all with lm_head skipped)
        backend_cuda_probe_stage(e, (enum dec_stage)st, 0);
        engine_forward(e, s, &next, 1, NULL, &next, err, sizeof err);
        rc = backend_cuda_decode_replay(e, s, steps, &t0);
        backend_cuda_probe_stage(e, (enum dec_stage)st, 2);
        engine_forward(e, s, &next, 1, NULL, &next, err, sizeof err);
        rc = rc || backend_cuda_decode_replay(e, s, steps, &t2);
        printf("%-10s %10.4f %10.4f %10.4f %10.4f\n", dec_stage_names[st], t0, t2, base - t0, t2 - base);
    }
    checks++;
    if (rc) fails++, printf("FAIL stage probe rc %d\n", rc);
    backend_cuda_probe_stage(e, DS_NONE, 1);
    seq_free(s);
    engine_close(e);
    return rc;
}

// One decode step on the eager path between cudaProfilerStart/Stop, for
// `ncu --profile-from-start off` (per-kernel times of a step).
static int profile_step(const char *dir, int n) {
    char err[512];
    struct engine *e;
    struct seq *s;
    int32_t next;
    if (open_prefilled(dir, true, n, 4, &e, &s, &next)) return 2;
    if (engine_forward(e, s, &next, 1, NULL, &next, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    cudaProfilerStart();
    const int rc = engine_forward(e, s, &next, 1, NULL, &next, err, sizeof err);
    cudaProfilerStop();
    checks++;
    if (rc) fails++, fprintf(stderr, "%s\n", err);
    seq_free(s);
    engine_close(e);
    return rc;
}

int main(int argc, char **argv) {
    rng = 0x9E3779B97F4A7C15ull;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "decode_lab: no CUDA device: the lab needs an sm_90 GPU: ran nothing\n");
        return 77;
    }
    if (argc >= 2 && !strcmp(argv[1], "lab")) lab(argc >= 3 ? atoi(argv[2]) : -1);
    else if (argc >= 4 && !strcmp(argv[1], "profile")) profile_step(argv[2], atoi(argv[3]));
    else if (argc >= 5 && !strcmp(argv[1], "replay")) replay(argv[2], atoi(argv[3]), atoi(argv[4]));
    else if (argc >= 5 && !strcmp(argv[1], "stages")) stages(argv[2], atoi(argv[3]), atoi(argv[4]));
    else {
        fprintf(stderr, "usage: decode_lab lab [CASE] | profile MODEL_DIR N | replay MODEL_DIR N STEPS | stages MODEL_DIR N STEPS\n");
        return 2;
    }
    printf("%d passed, %d failed\n", checks - fails, fails);
    return fails ? 1 : checks ? 0 : 1;
}
