// prefill_kernels.c: times the prefill kernels at the full shape on random inputs (CUDA events,
// best of 3 after a warmup) and prints achieved TFLOP/s or GB/s. A benchmark, not a test: it
// asserts nothing; correctness is tests/gpu/test_cuda_kernels' job.
//
//   prefill_kernels [T=4096]
#include "cuda/kernels.h"
#include "backend_cuda.h"
#include "engine.h"
#include "model.h"
#include "gpu/gpu_test.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *dev_random(size_t bytes, int kind) {   // kind 0: bf16 in [-1, 1), 1: fp32 in [-1, 1), 2: raw bits
    void *h = malloc(bytes), *d;
    for (size_t i = 0; i < bytes / 4; i++) {
        uint32_t r = rnd();
        float f = (float)((r & 0xffffff) / 16777216.0 * 2.0 - 1.0);
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint32_t *)h)[i] = kind == 2 ? r ^ (rnd() << 16) : kind == 1 ? u : (u >> 16) | (u & 0xffff0000u);
    }
    if (cudaMalloc(&d, bytes) != cudaSuccess) abort();
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    free(h);
    return d;
}
static struct dqt qmat(int n_mat, int rows, int cols, int bits) {
    const size_t R = (size_t)(n_mat > 0 ? n_mat : 1) * rows;
    struct dqt q = {dev_random(R * cols * bits / 8, 2), dev_random(R * cols / 64 * 2, 0), dev_random(R * cols / 64 * 2, 0),
                    n_mat, rows, cols, bits};
    // scales and biases: random bf16 of either sign, magnitude < 1 (values are irrelevant to speed)
    return q;
}

typedef int (*launch_fn)(void *ctx);
static double time_ms(launch_fn f, void *ctx) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    if (f(ctx)) {
        fprintf(stderr, "launch failed\n");
        exit(1);
    }
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        cudaEventRecord(a, 0);
        f(ctx);
        cudaEventRecord(b, 0);
        cudaEventSynchronize(b);
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        if (ms < best) best = ms;
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
        exit(1);
    }
    return best;
}

struct actx {
    float *q, *qg, *o;
    uint16_t *kc, *vc, *ob;   // ob: the fast mode's bf16 o (NULL: fp32 o)
    int T, p0, cap, exact;
};
static int run_flash(void *c) {
    struct actx *a = c;
    return k_flash_attention(a->q, a->qg, a->kc, a->vc, a->o, a->ob, a->T, a->p0, a->cap, QWEN_HEADS, QWEN_KV_HEADS,
                             QWEN_HEAD_DIM, a->exact, NULL);
}
// The fast mode's o_proj input as before the bf16 store: fp32 o, then k_to_bf16 into ob.
static int run_flash_conv(void *c) {
    struct actx *a = c;
    uint16_t *ob = a->ob;
    a->ob = NULL;
    int rc = run_flash(a);
    a->ob = ob;
    return rc ? rc : k_to_bf16(a->o, ob, (long)a->T * QWEN_HEADS * QWEN_HEAD_DIM, NULL);
}
struct mctx {
    struct dqt W;
    float *x, *y;
    int T;
    const int *xmap, *ymap, *counts, *offs;
    int xdiv, maxrows;
    const uint16_t *xb;   // the fast mode's bf16 x
    const float *gate;    // the SwiGLU epilogue form's gate input and bf16 output
    uint16_t *yb;
};
static int run_mm(void *c) {
    struct mctx *m = c;
    return k_qmatmul(m->W, m->x, m->W.cols, m->xmap, m->xdiv, m->y, m->W.rows, m->ymap, m->T, m->counts, m->offs,
                     m->maxrows, NULL);
}
static int run_mmb(void *c) {
    struct mctx *m = c;
    return k_qmatmul_bf16(m->W, m->xb, m->W.cols, m->xmap, m->xdiv, m->y, m->W.rows, m->ymap, m->T, m->counts,
                          m->offs, m->maxrows, NULL);
}
static int run_mmg(void *c) {
    struct mctx *m = c;
    return k_qmatmul_bf16_swiglu(m->W, m->xb, m->W.cols, m->xmap, m->xdiv, m->gate, m->yb, m->W.rows, m->ymap, m->T,
                                 m->counts, m->offs, m->maxrows, NULL);
}
struct cctx {
    const float *x;
    uint16_t *y;
    long n;
};
static int run_cvt(void *c) {
    struct cctx *v = c;
    return k_to_bf16(v->x, v->y, v->n, NULL);
}
struct gctx {
    float *y, *b, *a, *z, *Al, *dtb, *gn, *S, *o;
    int T;
};
static int run_gdn(void *c) {
    struct gctx *g = c;
    return k_gdn_recurrent(g->y, g->b, g->a, g->z, g->Al, g->dtb, g->gn, g->S, g->o, g->T, QWEN_LIN_K_HEADS,
                           QWEN_LIN_V_HEADS, QWEN_LIN_K_DIM, QWEN_LIN_V_DIM, 1e-6f, NULL);
}
struct cvctx {
    float *xin, *state, *w, *y;
    int T, C;
};
static int run_conv(void *c) {
    struct cvctx *v = c;
    return k_gdn_conv(v->xin, v->state, v->w, v->y, v->T, v->C, QWEN_CONV_KERNEL, QWEN_LIN_K_HEADS, QWEN_LIN_K_DIM,
                      NULL);
}

// A group of products of one input (cuda_layer's mm_segs): one launch each, or one segmented launch;
// exact (fp32 x, k_qmatmul) or fast (bf16 x, k_qmatmul_bf16).
struct sctx {
    struct qm_seg s[QM_MAX_SEGS];
    int n, T, exact;
    const float *x;
    const uint16_t *xb;
};
static int run_sep(void *c) {
    struct sctx *g = c;
    int rc = 0;
    for (int i = 0; i < g->n && !rc; i++) {
        const struct qm_seg *s = &g->s[i];
        rc = g->exact ? k_qmatmul(s->W, g->x, s->W.cols, NULL, 1, s->y, s->ldy, NULL, g->T, NULL, NULL, 0, NULL)
                      : k_qmatmul_bf16(s->W, g->xb, s->W.cols, NULL, 1, s->y, s->ldy, NULL, g->T, NULL, NULL, 0, NULL);
    }
    return rc;
}
static int run_seg(void *c) {
    struct sctx *g = c;
    return g->exact ? k_qmatmul_segs(g->s, g->n, g->x, g->s[0].W.cols, g->T, NULL)
                    : k_qmatmul_bf16_segs(g->s, g->n, g->xb, g->s[0].W.cols, g->T, NULL);
}

// o_proj / out_proj into the residual stream y: the product into d then k_add, or the add form
// (k_qmatmul_bf16_add, k_qmatmul_add: the sum in the epilogue); exact or fast.
struct rctx {
    struct dqt W;
    const float *x;
    const uint16_t *xb;
    float *y, *d;
    int T, exact;
};
static int run_res_sep(void *c) {
    struct rctx *r = c;
    const struct dqt W = r->W;
    const int rc = r->exact ? k_qmatmul(W, r->x, W.cols, NULL, 1, r->d, W.rows, NULL, r->T, NULL, NULL, 0, NULL)
                            : k_qmatmul_bf16(W, r->xb, W.cols, NULL, 1, r->d, W.rows, NULL, r->T, NULL, NULL, 0, NULL);
    return rc ? rc : k_add(r->y, r->d, (long)r->T * r->W.rows, NULL);
}
static int run_res_add(void *c) {
    struct rctx *r = c;
    return r->exact ? k_qmatmul_add(r->W, r->x, r->W.cols, r->y, r->W.rows, r->T, NULL)
                    : k_qmatmul_bf16_add(r->W, r->xb, r->W.cols, r->y, r->W.rows, r->T, NULL);
}
// The post-attention norm and the MoE's two gates (cuda_layer): before, k_rmsnorm then the router and
// the shared-expert gate as one exact segmented launch; now k_rmsnorm_gate (the shared gate's logit)
// then the router alone.
struct nctx {
    const float *x, *w;
    float *u, *rl, *sg;
    uint16_t *ub;
    struct dqt R, G;
    int T;
};
static int run_norm_segs(void *c) {
    struct nctx *n = c;
    const struct qm_seg s[2] = {{n->R, n->rl, n->R.rows}, {n->G, n->sg, 1}};
    const int rc = k_rmsnorm(n->x, NULL, n->w, n->u, n->ub, n->T, QWEN_HIDDEN, 1e-6f, NULL);
    return rc ? rc : k_qmatmul_segs(s, 2, n->u, QWEN_HIDDEN, n->T, NULL);
}
static int run_norm_gate(void *c) {
    struct nctx *n = c;
    const int rc = k_rmsnorm_gate(n->x, NULL, n->w, n->u, n->ub, n->T, QWEN_HIDDEN, 1e-6f, n->G, n->sg, NULL);
    return rc ? rc : k_qmatmul(n->R, n->u, QWEN_HIDDEN, NULL, 1, n->rl, n->R.rows, NULL, n->T, NULL, NULL, 0, NULL);
}
static int run_norm(void *c) {
    struct nctx *n = c;
    return k_rmsnorm(n->x, NULL, n->w, n->u, n->ub, n->T, QWEN_HIDDEN, 1e-6f, NULL);
}
static int run_norm_gate_only(void *c) {
    struct nctx *n = c;
    return k_rmsnorm_gate(n->x, NULL, n->w, n->u, n->ub, n->T, QWEN_HIDDEN, 1e-6f, n->G, n->sg, NULL);
}

int main(int argc, char **argv) {
    rng = 0x2545F4914F6CDD1Dull;
    char why[256];
    if (!backend_cuda_available(why, sizeof why)) {
        printf("prefill_kernels: no suitable GPU (%s); ran nothing\n", why);
        return 77;   // ran nothing: never a pass (gpu_check records a FAIL)
    }
    const int T = argc > 1 ? atoi(argv[1]) : 4096;
    printf("# %s; T %d\n", why, T);
    // attention: one chunk of T queries ending at 4K .. 256K keys
    const int NH = QWEN_HEADS, NKV = QWEN_KV_HEADS, D = QWEN_HEAD_DIM, cap = 262144;
    struct actx a = {dev_random((size_t)T * NH * D * 4, 1), dev_random((size_t)T * NH * 2 * D * 4, 1), NULL,
                     dev_random((size_t)NKV * cap * D * 2, 0), dev_random((size_t)NKV * cap * D * 2, 0), NULL, T, 0, cap, 1};
    cudaMalloc((void **)&a.o, (size_t)T * NH * D * 4);
    uint16_t *obuf;
    cudaMalloc((void **)&obuf, (size_t)T * NH * D * 2);
    // useful FLOP, causal: 4 T keys_avg D n_heads (exact's hi/lo operands do twice that on the tensor cores)
    const int ends[] = {4096, 65536, 131072, 262144};
    for (int i = 0; i < 4; i++) {
        if (ends[i] < T) continue;
        a.p0 = ends[i] - T;
        a.exact = 1;
        const double ms = time_ms(run_flash, &a);
        a.exact = 0;
        const double msf = time_ms(run_flash, &a);   // the warp-specialized wgmma kernel with ping-pong
        a.ob = obuf;   // o_proj's bf16 input, default form: fp32 o then k_to_bf16 (before) vs the bf16 store
        const double mconv = time_ms(run_flash_conv, &a), mbf = time_ms(run_flash, &a);
        a.ob = NULL;
        const double flop = 4.0 * D * NH * ((double)T * a.p0 + (double)T * (T + 1) / 2);
        printf("flash attention T %d p0 %6d keys to %6d: exact (hi/lo) %8.3f ms %6.1f TFLOP/s | fast %8.3f ms "
               "%6.1f TFLOP/s\n", T, a.p0, ends[i], ms, flop / ms / 1e9, msf, flop / msf / 1e9);
        printf("flash attention T %d p0 %6d keys to %6d: o_proj's bf16 input (default form): fp32 o + k_to_bf16 "
               "%8.3f ms | bf16 store %8.3f ms\n", T, a.p0, ends[i], mconv, mbf);
    }
    // quantized products: dense DeltaNet projections and the grouped experts (uniform routing)
    const int H = QWEN_HIDDEN, E = QWEN_EXPERTS, K = QWEN_EXPERTS_USED, I = QWEN_MOE_INTER;
    const int C = 2 * QWEN_LIN_K_HEADS * QWEN_LIN_K_DIM + QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM;
    float *x = dev_random((size_t)T * K * I * 4 > (size_t)T * 4096 * 4 ? (size_t)T * K * I * 4 : (size_t)T * 4096 * 4, 1);
    const size_t nxb = (size_t)T * K * I > (size_t)T * 4096 ? (size_t)T * K * I : (size_t)T * 4096;
    uint16_t *xb = dev_random(nxb * 2, 0);   // bf16 x for the fast mode
    float *y;
    cudaMalloc((void **)&y, (size_t)T * K * H * 4);
    struct {
        const char *name;
        int rows, cols, bits;
    } dense[] = {{"in_qkv", C, H, 4},
                 {"out_proj", H, QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM, 4},
                 {"router", E, H, 8},
                 {"q_proj", 2 * QWEN_HEADS * QWEN_HEAD_DIM, H, 4},
                 {"o_proj", H, QWEN_HEADS * QWEN_HEAD_DIM, 4},
                 {"se_gate", QWEN_SHARED_INTER, H, 4}};
    for (int i = 0; i < 6; i++) {
        struct mctx m = {qmat(0, dense[i].rows, dense[i].cols, dense[i].bits), x, y, T, NULL, NULL, NULL, NULL, 1, 0,
                         xb, NULL, NULL};
        const double ms = time_ms(run_mm, &m), msf = time_ms(run_mmb, &m);
        const double flop = 2.0 * T * dense[i].rows * dense[i].cols;
        printf("qmatmul %-8s [%5d x %4d] %d-bit: exact %8.3f ms %6.1f TFLOP/s | fast (bf16 x) %8.3f ms %6.1f TFLOP/s\n",
               dense[i].name, dense[i].rows, dense[i].cols, dense[i].bits, ms, flop / ms / 1e9, msf, flop / msf / 1e9);
        cudaFree((void *)m.W.w), cudaFree((void *)m.W.scales), cudaFree((void *)m.W.biases);
    }
    {   // cuda_layer's groups of products of one input: one launch each vs one segmented launch (mm_segs)
        struct {
            const char *name;
            int n, bits, rows[QM_MAX_SEGS];
        } grp[] = {
            {"DeltaNet in_qkv+z+b+a", 4, 4, {C, QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM, QWEN_LIN_V_HEADS, QWEN_LIN_V_HEADS}},
            {"attention q+k+v", 3, 4, {2 * QWEN_HEADS * QWEN_HEAD_DIM, QWEN_KV_HEADS * QWEN_HEAD_DIM,
                                       QWEN_KV_HEADS * QWEN_HEAD_DIM}},
            {"router+shared gate", 2, 8, {E, 1}},
        };
        for (int i = 0; i < 3; i++) {
            struct sctx g = {.n = grp[i].n, .T = T, .x = x, .xb = xb};
            double flop = 0;
            for (int j = 0; j < g.n; j++) {
                g.s[j] = (struct qm_seg){qmat(0, grp[i].rows[j], H, grp[i].bits), NULL, grp[i].rows[j]};
                cudaMalloc((void **)&g.s[j].y, (size_t)T * grp[i].rows[j] * 4);
                flop += 2.0 * T * grp[i].rows[j] * H;
            }
            g.exact = 1;
            const double es = time_ms(run_sep, &g), eg = time_ms(run_seg, &g);
            g.exact = 0;
            const double fs = time_ms(run_sep, &g), fg = time_ms(run_seg, &g);
            printf("qmatmul group %-21s %d-bit, %d launches -> 1: exact %8.3f -> %8.3f ms | fast %8.3f -> %8.3f ms "
                   "%6.1f TFLOP/s\n", grp[i].name, grp[i].bits, g.n, es, eg, fs, fg, flop / fg / 1e9);
            for (int j = 0; j < g.n; j++) {
                cudaFree(g.s[j].y);
                cudaFree((void *)g.s[j].W.w), cudaFree((void *)g.s[j].W.scales), cudaFree((void *)g.s[j].W.biases);
            }
        }
    }
    {   // o_proj / out_proj into the residual stream: product + k_add against the add form
        const int cols[2] = {QWEN_HEADS * QWEN_HEAD_DIM, QWEN_LIN_V_HEADS * QWEN_LIN_V_DIM};
        const char *names[2] = {"o_proj", "out_proj"};
        float *d;
        cudaMalloc((void **)&d, (size_t)T * H * 4);
        for (int i = 0; i < 2; i++) {
            struct rctx r = {qmat(0, H, cols[i], 4), x, xb, y, d, T, 1};
            const double es = time_ms(run_res_sep, &r), ea = time_ms(run_res_add, &r);
            r.exact = 0;
            const double fs = time_ms(run_res_sep, &r), fa = time_ms(run_res_add, &r);
            printf("residual %-8s [%d x %d] 4-bit, product + k_add -> add form: exact %8.3f -> %8.3f ms | fast "
                   "%8.3f -> %8.3f ms\n", names[i], H, cols[i], es, ea, fs, fa);
            cudaFree((void *)r.W.w), cudaFree((void *)r.W.scales), cudaFree((void *)r.W.biases);
        }
        cudaFree(d);
    }
    {   // the post-attention norm with the router and the shared-expert gate
        struct nctx n = {.x = x, .w = x + (size_t)T * H, .ub = xb, .R = qmat(0, E, H, 8), .G = qmat(0, 1, H, 8),
                         .T = T};
        cudaMalloc((void **)&n.u, (size_t)T * H * 4);
        cudaMalloc((void **)&n.rl, (size_t)T * E * 4);
        cudaMalloc((void **)&n.sg, (size_t)T * 4);
        const double seg = time_ms(run_norm_segs, &n), gate = time_ms(run_norm_gate, &n);
        const double nm = time_ms(run_norm, &n), ng = time_ms(run_norm_gate_only, &n);
        printf("post-attention norm + router + shared gate: norm, segmented router+gate %8.3f ms -> norm with gate, "
               "router alone %8.3f ms (k_rmsnorm %8.3f ms, k_rmsnorm_gate %8.3f ms)\n", seg, gate, nm, ng);
        cudaFree(n.u), cudaFree(n.rl), cudaFree(n.sg);
        cudaFree((void *)n.R.w), cudaFree((void *)n.R.scales), cudaFree((void *)n.R.biases);
        cudaFree((void *)n.G.w), cudaFree((void *)n.G.scales), cudaFree((void *)n.G.biases);
    }
    {   // the fast mode's conversions of the product inputs: [T, 2048] (normed hidden) and [8T, 512]
        const long ns[2] = {(long)T * H, (long)T * K * I};
        for (int i = 0; i < 2; i++) {
            struct cctx v = {x, xb, ns[i]};
            const double ms = time_ms(run_cvt, &v);
            printf("to_bf16 %9ld values: %8.3f ms  %6.1f GB/s\n", ns[i], ms, 6.0 * ns[i] / ms / 1e6);
        }
    }
    int *counts = malloc(sizeof(int) * E), *offs = malloc(sizeof(int) * E), *slots = malloc(sizeof(int) * T * K);
    for (int e = 0; e < E; e++) counts[e] = 0;
    for (int i = 0; i < T * K; i++) counts[(i * 7919 + i / K) % E]++;
    for (int e = 0, acc = 0; e < E; e++) offs[e] = acc, acc += counts[e];
    for (int i = 0; i < T * K; i++) slots[i] = i;   // expert-sorted rows of any token: speed only
    int *dc, *doff, *ds;
    cudaMalloc((void **)&dc, E * 4);
    cudaMalloc((void **)&doff, E * 4);
    cudaMalloc((void **)&ds, (size_t)T * K * 4);
    cudaMemcpy(dc, counts, E * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(doff, offs, E * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(ds, slots, (size_t)T * K * 4, cudaMemcpyHostToDevice);
    struct mctx g = {qmat(E, I, H, 4), x, y, 0, ds, NULL, dc, doff, K, T, xb, NULL, NULL};
    double ms = time_ms(run_mm, &g), msf = time_ms(run_mmb, &g);
    const double eflop = 2.0 * T * K * I * H;
    printf("qmatmul experts gate/up [256 x %d x %d] grouped, %d rows: exact %8.3f ms %6.1f TFLOP/s | fast %8.3f ms "
           "%6.1f TFLOP/s\n", I, H, T * K, ms, eflop / ms / 1e9, msf, eflop / msf / 1e9);
    g.T = T * K;   // the compact grid (M = T K, the experts' row tiles only)
    const double msgc = time_ms(run_mmb, &g);
    g.T = 0;
    printf("qmatmul experts gate/up grouped, compact grid: fast %8.3f ms %6.1f TFLOP/s (full grid %8.3f ms)\n", msgc,
           eflop / msgc / 1e9, msf);
    {   // the up product with the SwiGLU in its epilogue (replaces fast up + k_swiglu + k_to_bf16)
        g.gate = x;
        cudaMalloc((void **)&g.yb, (size_t)T * K * I * 2);
        const double msg = time_ms(run_mmg, &g);
        printf("qmatmul experts up+swiglu epilogue, grouped, %d rows: fast %8.3f ms %6.1f TFLOP/s (plain %8.3f ms)\n",
               T * K, msg, eflop / msg / 1e9, msf);
        cudaFree(g.yb);
    }
    struct mctx dn = {qmat(E, H, I, 4), x, y, 0, NULL, ds, dc, doff, 1, T, xb, NULL, NULL};
    ms = time_ms(run_mm, &dn);
    msf = time_ms(run_mmb, &dn);
    printf("qmatmul experts down    [256 x %d x %d] grouped, %d rows: exact %8.3f ms %6.1f TFLOP/s | fast %8.3f ms "
           "%6.1f TFLOP/s\n", H, I, T * K, ms, eflop / ms / 1e9, msf, eflop / msf / 1e9);
    dn.T = T * K;
    const double msdc = time_ms(run_mmb, &dn);
    dn.T = 0;
    printf("qmatmul experts down grouped, compact grid: fast %8.3f ms %6.1f TFLOP/s (full grid %8.3f ms)\n", msdc,
           eflop / msdc / 1e9, msf);
    {   // the DeltaNet conv + SiLU + q/k L2 norms (+ the state update)
        struct cvctx v = {dev_random((size_t)T * C * 4, 1), dev_random((size_t)(QWEN_CONV_KERNEL - 1) * C * 4, 1),
                          dev_random((size_t)C * QWEN_CONV_KERNEL * 4, 1), NULL, T, C};
        cudaMalloc((void **)&v.y, (size_t)T * C * 4);
        const double msc = time_ms(run_conv, &v);
        const double bytes = 2.0 * T * C * 4;   // xin read once, y written once
        printf("gdn conv+l2norm T %d: %8.3f ms %6.1f GB/s\n", T, msc, bytes / msc / 1e6);
        cudaFree(v.xin), cudaFree(v.state), cudaFree(v.w), cudaFree(v.y);
    }
    // the DeltaNet recurrence over one chunk
    const int Hv = QWEN_LIN_V_HEADS, VD = Hv * QWEN_LIN_V_DIM;
    struct gctx gd = {dev_random((size_t)T * C * 4, 1), dev_random((size_t)T * Hv * 4, 1), dev_random((size_t)T * Hv * 4, 1),
                      dev_random((size_t)T * VD * 4, 1), dev_random(Hv * 4, 1), dev_random(Hv * 4, 1),
                      dev_random(QWEN_LIN_V_DIM * 4, 1), dev_random((size_t)Hv * QWEN_LIN_K_DIM * QWEN_LIN_V_DIM * 4, 1),
                      NULL, T};
    cudaMalloc((void **)&gd.o, (size_t)T * VD * 4);
    ms = time_ms(run_gdn, &gd);
    printf("gdn recurrent+norm T %d: %8.3f ms (x30 layers per chunk: %.1f ms)\n", T, ms, 30 * ms);
    return 0;
}
