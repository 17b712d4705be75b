// backend_cpu.c: the reference forward pass (docs/MODEL.md §2) in portable C11, fp32 throughout.
//
// This is the oracle for every GPU test, so it stays obviously correct first, fast second:
// weights stay 4/8-bit and are dequantized row by row (w = scale * q + bias), every op is the
// formula from the spec, and the DeltaNet runs the token-by-token delta rule (§2.5) for prefill
// and decode alike. Threads (OpenMP) split matrix rows, heads and tokens, never a reduction, so
// results do not depend on the thread count.
//
// Out of memory is an error, never an abort: every function that allocates returns 0 or -1, and
// forward_chunk turns -1 into "out of memory" for the caller (the server answers 500 and goes on).
// A chunk that fails part way may have advanced some layers' DeltaNet state: the caller resets or
// copies into the sequence before using it again (engine.h).
//
// Fast paths (qmatmul, attention), because the GPU tests need the oracle's prefill of 4,096 tokens:
// the reference's loops are kept (qmatmul_ref, attend_ref) and engine_options.cpu_reference
// (CALLA_CPU_REFERENCE=1) selects them. The fast ones give the same bits: they change which values
// are computed together, never the operations that make one value. Every output is still one
// accumulator that starts at 0 and adds w * x over k in ascending order, one expression per step as
// in the reference (so a compiler that contracts a*b+s into an fma does so in both; GCC in ISO C
// mode does not); the lanes of a vector are different outputs, never parts of one sum. tests/test_cpu_reference.c
// compares the two.
//
// Speculative verification (engine_verify) is a prefill chunk of up to CPU_VERIFY_MAX tokens with
// every row's logits: a T-token forward computes what T decode steps compute, bit for bit, so the
// argmax of each row is the decode step's token. For verify_keep the DeltaNet layers save their
// state before the chunk and the delta rule's inputs per token, and replay the kept ones.
//
// Shapes: T = tokens in this chunk, p0 = position of the first, H = hidden, D = head_dim,
// C = conv_dim, Hk/Hv = DeltaNet key/value heads, Dk/Dv their dims, E = experts.
#include "backend.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CPU_VERIFY_MAX = 8 }; // tokens a verification takes (engine_verify_max)

// What a verification keeps of one DeltaNet layer, so that verify_keep can rebuild the state after
// any prefix of its tokens: the state before it, and the delta rule's inputs per token. The replay
// runs the same step function on the same inputs, so the state it gives is the one the forward
// had after that token, bit for bit; the KV rows past the prefix need nothing (attention reads
// positions below seq.pos only).
struct gdn_saved {
    float *S0;    // [Hv, Dk, Dv] the recurrent state before the verification
    float *xe;    // [conv_kernel - 1 + CPU_VERIFY_MAX, C] the conv window, then each token's pre-conv input
    float *y;     // [CPU_VERIFY_MAX, C] each token's q, k (normalised) and v after the conv
    float *b, *a; // [CPU_VERIFY_MAX, Hv] each token's beta and decay inputs
};

struct cpu_seq {
    bool kv_f32;                         // KV cache precision (bf16 by default, as on the GPU)
    void *k[QWEN_LAYERS];                // attention layers: [n_kv_heads, cap, D] bf16 or f32 (post-norm, post-RoPE)
    void *v[QWEN_LAYERS];                // [n_kv_heads, cap, D]
    float *conv[QWEN_LAYERS];            // DeltaNet layers: [conv_kernel - 1, C] last pre-conv inputs, oldest first
    float *S[QWEN_LAYERS];               // [Hv, Dk, Dv] fp32 recurrent state
    bool saving;                         // a verification's forward: deltanet fills saved[]
    struct gdn_saved saved[QWEN_LAYERS]; // DeltaNet layers, allocated by the first verification
};

// ---- primitives -----------------------------------------------------------------------------

// Row n of matrix mat of W, dequantized: out[k] = scale[k/64] * q[k] + bias[k/64].
// The weights are read in place from the mapped file at its alignment (qt_load_*): an MLX file's
// tensors start at arbitrary offsets, and an aligned copy would hold the checkpoint twice in RAM.
static void dequant_row(const struct qtensor *W, int mat, int n, float *out) {
    const size_t row = (size_t)mat * W->rows + (size_t)n, w0 = row * qt_words_per_row(W),
                 g0 = row * qt_groups_per_row(W);
    const int bits = W->bits, per = 32 / bits, words = QWEN_GROUP / per;
    const uint32_t mask = (1u << bits) - 1;
    for (int g = 0; g < W->cols / QWEN_GROUP; g++) {
        const float sc = bf16_to_f32(qt_load_u16(W->scales, g0 + g)), bi = bf16_to_f32(qt_load_u16(W->biases, g0 + g));
        for (int j = 0; j < words; j++) {
            const uint32_t word = qt_load_u32(W->w, w0 + (size_t)g * words + j); // first element in the low bits
            for (int e = 0; e < per; e++)
                out[g * QWEN_GROUP + j * per + e] = sc * (float)((word >> (e * bits)) & mask) + bi;
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// y[t, n] = sum_k W[mat][n, k] * x[t, k] for t < T; x is [T, cols], y is [T, rows]. The reference:
// one serial dot per output.
static void qmatmul_ref(const struct qtensor *W, int mat, const float *x, int T, float *y) {
    const int N = W->rows, K = W->cols;
#pragma omp parallel
    {
        float row[K]; // one dequantized row: at most q_dim (4,096) floats
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            dequant_row(W, mat, n, row);
            for (int t = 0; t < T; t++) y[(size_t)t * N + n] = dot(row, x + (size_t)t * K, K);
        }
    }
}

// y = x * rsqrt(mean(x^2) + eps) * w   (kind (a): the stored weight already holds the +1)
static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static float silu(float x) {
    return x / (1.0f + expf(-x));
}
static float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}
static float softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
} // torch threshold 20

// Scratch allocations of the forward pass. engine_options.cpu_alloc_limit (a test hook,
// CALLA_CPU_ALLOC_LIMIT=BYTES) makes every one larger than BYTES fail, as if memory had run out.
static size_t alloc_limit;

static void *scratch(size_t n) {
    return alloc_limit && n > alloc_limit ? NULL : malloc(n ? n : 1);
}

// ---- the fast kernels ---------------------------------------------------------------------------

// engine_options.cpu_reference (a test hook, set at load): the reference loops (qmatmul_ref, attend_ref).
static bool cpu_reference;

enum {
    QR = 16,   // lanes of a tile: 16 rows of a matrix (or 16 keys), each its own accumulator
    QTC = 512, // tokens per pass of qmatmul: the slice of x that all threads read stays in cache
    AQ = 16,   // queries per attention work item (heads of one KV head times tokens)
    AVT = 64,  // keys per V tile (a bf16 cache is converted a tile at a time)
};

#if defined(__GNUC__)
// Four lanes in a vector register (GCC and clang vector extensions; plain C below otherwise). The
// operations are per lane, so a lane holds exactly the scalar loop's value.
typedef float vf4 __attribute__((vector_size(16)));
static inline vf4 vload(const float *p) {
    vf4 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vstore(float *p, vf4 v) {
    memcpy(p, &v, sizeof v);
}
#endif

#if defined(__GNUC__) && defined(__x86_64__)
// tile_dot with eight lanes to a register where the CPU has AVX (cpu_avx, set at load; the build
// targets plain x86-64). vmulps and vaddps round each lane as mulps and addps do, and FMA is not
// enabled here, so the bits are tile_dot's. engine_options.cpu_no_avx (CALLA_CPU_AVX=0, a test hook)
// keeps the SSE loop.
#define CPU_AVX 1
static bool cpu_avx;
typedef float vf8 __attribute__((vector_size(32)));

__attribute__((target("avx"))) static void tile_dot_avx(const float *wt, int K, const float *x0, const float *x1,
                                                        float *y0, float *y1) {
    vf8 a0 = {0}, a1 = {0}, w0, w1;
    if (x1) {
        vf8 c0 = {0}, c1 = {0};
        for (int k = 0; k < K; k++) {
            memcpy(&w0, wt + (size_t)k * QR, sizeof w0);
            memcpy(&w1, wt + (size_t)k * QR + 8, sizeof w1);
            const float b0 = x0[k], b1 = x1[k];
            a0 += w0 * b0, a1 += w1 * b0;
            c0 += w0 * b1, c1 += w1 * b1;
        }
        memcpy(y1, &c0, sizeof c0), memcpy(y1 + 8, &c1, sizeof c1);
    } else {
        for (int k = 0; k < K; k++) {
            memcpy(&w0, wt + (size_t)k * QR, sizeof w0);
            memcpy(&w1, wt + (size_t)k * QR + 8, sizeof w1);
            const float b0 = x0[k];
            a0 += w0 * b0, a1 += w1 * b0;
        }
    }
    memcpy(y0, &a0, sizeof a0), memcpy(y0 + 8, &a1, sizeof a1);
}

// Four tokens at once: eight independent sums in flight, enough to hide the add latency.
__attribute__((target("avx"))) static void tile_dot4_avx(const float *wt, int K, const float *const x[4],
                                                         float y[4][QR]) {
    vf8 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, c0 = {0}, c1 = {0}, d0 = {0}, d1 = {0}, w0, w1;
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    for (int k = 0; k < K; k++) {
        memcpy(&w0, wt + (size_t)k * QR, sizeof w0);
        memcpy(&w1, wt + (size_t)k * QR + 8, sizeof w1);
        const float e0 = x0[k], e1 = x1[k], e2 = x2[k], e3 = x3[k];
        a0 += w0 * e0, a1 += w1 * e0;
        b0 += w0 * e1, b1 += w1 * e1;
        c0 += w0 * e2, c1 += w1 * e2;
        d0 += w0 * e3, d1 += w1 * e3;
    }
    memcpy(y[0], &a0, sizeof a0), memcpy(y[0] + 8, &a1, sizeof a1);
    memcpy(y[1], &b0, sizeof b0), memcpy(y[1] + 8, &b1, sizeof b1);
    memcpy(y[2], &c0, sizeof c0), memcpy(y[2] + 8, &c1, sizeof c1);
    memcpy(y[3], &d0, sizeof d0), memcpy(y[3] + 8, &d1, sizeof d1);
}
#endif

// y0[r] = sum_k wt[k][r] * x0[k] for the QR lanes r of a transposed tile wt [K, QR], and y1 from x1
// when x1 is not NULL. Per lane: s = 0; s += w * x for k ascending, the reference's dot.
static void tile_dot(const float *wt, int K, const float *x0, const float *x1, float *y0, float *y1) {
#if defined(CPU_AVX)
    if (cpu_avx) {
        tile_dot_avx(wt, K, x0, x1, y0, y1);
        return;
    }
#endif
#if defined(__GNUC__)
    vf4 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    if (x1) {
        vf4 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
        for (int k = 0; k < K; k++) {
            const float *w = wt + (size_t)k * QR;
            const vf4 w0 = vload(w), w1 = vload(w + 4), w2 = vload(w + 8), w3 = vload(w + 12);
            const float b0 = x0[k], b1 = x1[k];
            a0 += w0 * b0, a1 += w1 * b0, a2 += w2 * b0, a3 += w3 * b0;
            c0 += w0 * b1, c1 += w1 * b1, c2 += w2 * b1, c3 += w3 * b1;
        }
        vstore(y1, c0), vstore(y1 + 4, c1), vstore(y1 + 8, c2), vstore(y1 + 12, c3);
    } else {
        for (int k = 0; k < K; k++) {
            const float *w = wt + (size_t)k * QR;
            const float b0 = x0[k];
            a0 += vload(w) * b0, a1 += vload(w + 4) * b0, a2 += vload(w + 8) * b0, a3 += vload(w + 12) * b0;
        }
    }
    vstore(y0, a0), vstore(y0 + 4, a1), vstore(y0 + 8, a2), vstore(y0 + 12, a3);
#else
    float a[QR] = {0}, c[QR] = {0};
    for (int k = 0; k < K; k++)
        for (int r = 0; r < QR; r++) {
            a[r] += wt[(size_t)k * QR + r] * x0[k];
            if (x1) c[r] += wt[(size_t)k * QR + r] * x1[k];
        }
    for (int r = 0; r < QR; r++) {
        y0[r] = a[r];
        if (x1) y1[r] = c[r];
    }
#endif
}

// Rows n0..n0+QR-1 of matrix mat of W dequantized into wt [K, QR]: lane r is row n0 + r with
// dequant_row's values (the same scale * q + bias per element, four rows per vector); rows past
// the matrix are zeros. row [K] is scratch for the plain-C version.
static void dequant_tile(const struct qtensor *W, int mat, int n0, float *row, float *wt) {
    const int K = W->cols;
#if defined(__GNUC__)
    typedef uint32_t vu4 __attribute__((vector_size(16)));
    typedef int32_t vi4 __attribute__((vector_size(16)));
    const int bits = W->bits, per = 32 / bits, words = QWEN_GROUP / per, groups = K / QWEN_GROUP;
    const uint32_t mask = (1u << bits) - 1;
    const size_t wpr = qt_words_per_row(W), gpr = qt_groups_per_row(W);
    for (int r0 = 0; r0 < QR; r0 += 4) {
        size_t at[4]; // row index in the tensor; rows past the matrix read row n0 with scale and bias 0
        bool in[4];
        for (int i = 0; i < 4; i++) {
            in[i] = n0 + r0 + i < W->rows;
            at[i] = (size_t)mat * W->rows + (size_t)(in[i] ? n0 + r0 + i : n0);
        }
        for (int g = 0; g < groups; g++) {
            float s4[4], b4[4];
            for (int i = 0; i < 4; i++) {
                s4[i] = in[i] ? bf16_to_f32(qt_load_u16(W->scales, at[i] * gpr + g)) : 0.0f;
                b4[i] = in[i] ? bf16_to_f32(qt_load_u16(W->biases, at[i] * gpr + g)) : 0.0f;
            }
            const vf4 sc = {s4[0], s4[1], s4[2], s4[3]}, bi = {b4[0], b4[1], b4[2], b4[3]};
            const size_t w0 = (size_t)g * words;
            for (int j = 0; j < words; j++) {
                const vu4 w = {qt_load_u32(W->w, at[0] * wpr + w0 + j), qt_load_u32(W->w, at[1] * wpr + w0 + j),
                               qt_load_u32(W->w, at[2] * wpr + w0 + j), qt_load_u32(W->w, at[3] * wpr + w0 + j)};
                float *o = wt + (size_t)(g * QWEN_GROUP + j * per) * QR + r0;
                for (int e = 0; e < per; e++) {
                    const vf4 q = __builtin_convertvector((vi4)((w >> (e * bits)) & mask), vf4); // exact: q < 2^bits
                    vstore(o + (size_t)e * QR, sc * q + bi);
                }
            }
        }
    }
#else
    for (int r = 0; r < QR; r++) {
        if (n0 + r < W->rows)
            dequant_row(W, mat, n0 + r, row);
        else
            memset(row, 0, sizeof(float) * (size_t)K);
        for (int k = 0; k < K; k++) wt[(size_t)k * QR + r] = row[k];
    }
#endif
}

// qmatmul_ref's result, QR rows at a time: a dequantized tile serves every token, and each token
// (two at a time, four with AVX) fills 16 lanes. Tokens go in passes of QTC so that the slice of x
// the threads share stays in cache; a tile is dequantized again per pass. -1: out of memory.
static int qmatmul(const struct qtensor *W, int mat, const float *x, int T, float *y) {
    if (cpu_reference) {
        qmatmul_ref(W, mat, x, T, y);
        return 0;
    }
    const int N = W->rows, K = W->cols, tiles = (N + QR - 1) / QR;
    bool failed = false;
#pragma omp parallel
    {
        float *row = scratch(sizeof(float) * (size_t)K), *wt = scratch(sizeof(float) * (size_t)K * QR);
        if (!row || !wt) {
#pragma omp atomic write
            failed = true;
        }
        for (int t0 = 0; t0 < T; t0 += QTC) {
            const int t1 = T - t0 < QTC ? T : t0 + QTC;
#pragma omp for schedule(static)
            for (int i = 0; i < tiles; i++) {
                if (!row || !wt) continue; // this thread is out of memory: the call fails
                const int n0 = i * QR, nr = N - n0 < QR ? N - n0 : QR;
                dequant_tile(W, mat, n0, row, wt);
                for (int t = t0; t < t1;) {
                    float o[4][QR];
                    int nt = t1 - t;
#if defined(CPU_AVX)
                    if (cpu_avx && nt >= 3) { // with three left, the fourth lane group repeats the third
                        const float *xs[4] = {x + (size_t)t * K, x + (size_t)(t + 1) * K, x + (size_t)(t + 2) * K,
                                              x + (size_t)(nt > 3 ? t + 3 : t + 2) * K};
                        tile_dot4_avx(wt, K, xs, o);
                        nt = nt > 3 ? 4 : 3;
                    } else
#endif
                    {
                        nt = nt > 1 ? 2 : 1;
                        tile_dot(wt, K, x + (size_t)t * K, nt == 2 ? x + (size_t)(t + 1) * K : NULL, o[0], o[1]);
                    }
                    for (int j = 0; j < nt; j++)
                        for (int r = 0; r < nr; r++) y[(size_t)(t + j) * N + n0 + r] = o[j][r];
                    t += nt;
                }
            }
        }
        free(row);
        free(wt);
    }
    return failed ? -1 : 0;
}

// ---- full attention (§2.4) --------------------------------------------------------------------

static float kv_get(const struct cpu_seq *cs, const void *base, size_t i) {
    return cs->kv_f32 ? ((const float *)base)[i] : bf16_to_f32(((const uint16_t *)base)[i]);
}
static void kv_put(const struct cpu_seq *cs, void *base, size_t i, float v) {
    if (cs->kv_f32)
        ((float *)base)[i] = v;
    else
        ((uint16_t *)base)[i] = f32_to_bf16(v);
}

// Rotate-half RoPE on dims [0, rope_dim) of one head at position p.
static void rope(float *x, int rope_dim, double theta, int p) {
    const int half = rope_dim / 2;
    for (int m = 0; m < half; m++) {
        float inv_freq = (float)(1.0 / pow(theta, (double)(2 * m) / rope_dim));
        float ang = (float)p * inv_freq;
        float c = (float)cos((double)ang), s = (float)sin((double)ang);
        float a = x[m], b = x[m + half];
        x[m] = a * c - b * s;
        x[m + half] = a * s + b * c;
    }
}

// Query (t, h) of the chunk: q_norm and RoPE at position p0 + t into q [D].
static void attn_query(const struct geometry *g, const struct layer_weights *L, const float *qg, int p0, int t, int h,
                       float *q) {
    const int D = g->head_dim, QD = geom_q_dim(g);
    const float *qh = qg + (size_t)t * 2 * QD + (size_t)h * 2 * D; // [query | gate] per head
    rmsnorm(q, qh, L->q_norm, D, (float)g->rms_eps);
    rope(q, g->rope_dim, g->rope_theta, p0 + t);
}

// The reference: one query (t, h) at a time, a serial dot per key and a serial sum per output.
// o [T, QD] gets the gated heads. -1: out of memory.
static int attend_ref(const struct geometry *g, const struct layer_weights *L, const struct cpu_seq *cs, int layer,
                      int cap, int p0, const float *qg, int T, float *o) {
    const int D = g->head_dim, NH = g->n_heads, NKV = g->n_kv_heads, QD = geom_q_dim(g);
    const float scale = 1.0f / sqrtf((float)D);
    bool failed = false;
#pragma omp parallel
    {
        float q[D];
        float *sc = scratch(sizeof(float) * (size_t)(p0 + T));
        if (!sc) {
#pragma omp atomic write
            failed = true;
        }
#pragma omp for collapse(2) schedule(dynamic, 4)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                if (!sc) continue; // this thread is out of memory: the call fails
                const float *gate = qg + (size_t)t * 2 * QD + (size_t)h * 2 * D + D;
                attn_query(g, L, qg, p0, t, h, q);
                const int kvh = h / (NH / NKV), n_keys = p0 + t + 1;
                const size_t kvbase = (size_t)kvh * cap * D;
                float mx = -INFINITY;
                for (int j = 0; j < n_keys; j++) {
                    float s = 0;
                    for (int d = 0; d < D; d++) s += q[d] * kv_get(cs, cs->k[layer], kvbase + (size_t)j * D + d);
                    sc[j] = s * scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                float sum = 0;
                for (int j = 0; j < n_keys; j++) sum += sc[j] = expf(sc[j] - mx);
                float *oh = o + (size_t)t * QD + (size_t)h * D;
                for (int d = 0; d < D; d++) oh[d] = 0;
                for (int j = 0; j < n_keys; j++) {
                    float w = sc[j] / sum;
                    for (int d = 0; d < D; d++) oh[d] += w * kv_get(cs, cs->v[layer], kvbase + (size_t)j * D + d);
                }
                for (int d = 0; d < D; d++) oh[d] *= sigmoid(gate[d]);
            }
        free(sc);
    }
    return failed ? -1 : 0;
}

// Keys j0..j0+QR-1 of one KV head (rows of kv at element offset base) as fp32, transposed to
// kt [D, QR]; keys at or past n are zeros.
static void key_tile(const struct cpu_seq *cs, const void *kv, size_t base, int j0, int n, int D, float *kt) {
    for (int r = 0; r < QR; r++) {
        const size_t at = base + (size_t)(j0 + r) * D;
        if (j0 + r >= n)
            for (int d = 0; d < D; d++) kt[(size_t)d * QR + r] = 0;
        else if (cs->kv_f32)
            for (int d = 0; d < D; d++) kt[(size_t)d * QR + r] = ((const float *)kv)[at + d];
        else
            for (int d = 0; d < D; d++) kt[(size_t)d * QR + r] = bf16_to_f32(((const uint16_t *)kv)[at + d]);
    }
}

// Rows j0..j0+n-1 of one KV head as fp32 [n, D]: the cache itself when it is fp32, else converted
// into buf.
static const float *value_rows(const struct cpu_seq *cs, const void *kv, size_t base, int j0, int n, int D,
                               float *buf) {
    const size_t at = base + (size_t)j0 * D;
    if (cs->kv_f32) return (const float *)kv + at;
    for (size_t i = 0; i < (size_t)n * D; i++) buf[i] = bf16_to_f32(((const uint16_t *)kv)[at + i]);
    return buf;
}

// oh[d] += w[j] * v[j][d] for j < n, j ascending per d (the reference's order), v [n, D].
static void weighted_rows(float *oh, const float *w, const float *v, int n, int D) {
    int d = 0;
#if defined(__GNUC__)
    for (; d + 16 <= D; d += 16) {
        vf4 a0 = vload(oh + d), a1 = vload(oh + d + 4), a2 = vload(oh + d + 8), a3 = vload(oh + d + 12);
        for (int j = 0; j < n; j++) {
            const float *vr = v + (size_t)j * D + d;
            const float wj = w[j];
            a0 += wj * vload(vr), a1 += wj * vload(vr + 4), a2 += wj * vload(vr + 8), a3 += wj * vload(vr + 12);
        }
        vstore(oh + d, a0), vstore(oh + d + 4, a1), vstore(oh + d + 8, a2), vstore(oh + d + 12, a3);
    }
#endif
    for (; d < D; d++)
        for (int j = 0; j < n; j++) oh[d] += w[j] * v[(size_t)j * D + d];
}

// attend_ref's result, a work item at a time: the AQ queries (heads of one KV head, then tokens)
// that share keys. Scores: a tile of QR keys, transposed, gives 16 lanes per query (tile_dot, two
// queries at a time); the softmax is the reference's loop per query; P.V: 16 output dims per
// vector lane group over keys in order, from a tile of AVT value rows.
static int attend(const struct geometry *g, const struct layer_weights *L, const struct cpu_seq *cs, int layer, int cap,
                  int p0, const float *qg, int T, float *o) {
    const int D = g->head_dim, NH = g->n_heads, NKV = g->n_kv_heads, QD = geom_q_dim(g), G = NH / NKV;
    const int per = G * T, items = (per + AQ - 1) / AQ; // queries of one KV head; items per KV head
    const float scale = 1.0f / sqrtf((float)D);
    bool failed = false;
#pragma omp parallel
    {
        float *q = scratch(sizeof(float) * (size_t)AQ * D), *kt = scratch(sizeof(float) * (size_t)D * QR);
        float *vb = scratch(sizeof(float) * (size_t)AVT * D);
        float *sc = scratch(sizeof(float) * (size_t)AQ * (p0 + T)); // [AQ, p0 + T] scores, then weights
        const bool ok = q && kt && vb && sc;
        if (!ok) {
#pragma omp atomic write
            failed = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < NKV * items; it++) {
            if (!ok) continue; // this thread is out of memory: the call fails
            const int kvh = it / items, i0 = (it % items) * AQ, nq = per - i0 < AQ ? per - i0 : AQ;
            const size_t kvbase = (size_t)kvh * cap * D, ld = (size_t)(p0 + T);
            int tq[AQ], hq[AQ], nk[AQ] = {0}; // query i: token, head, keys it sees
            for (int i = 0; i < nq; i++) {
                tq[i] = (i0 + i) / G, hq[i] = kvh * G + (i0 + i) % G, nk[i] = p0 + tq[i] + 1;
                attn_query(g, L, qg, p0, tq[i], hq[i], q + (size_t)i * D);
            }
            const int nmax = nk[nq - 1]; // queries go by token: nk ascends
            for (int j0 = 0; j0 < nmax; j0 += QR) {
                key_tile(cs, cs->k[layer], kvbase, j0, nmax, D, kt);
                int i = 0;
                while (nk[i] <= j0) i++; // queries that see none of these keys
                for (; i < nq; i += 2) {
                    float s0[QR], s1[QR];
                    const bool two = i + 1 < nq;
                    tile_dot(kt, D, q + (size_t)i * D, two ? q + (size_t)(i + 1) * D : NULL, s0, s1);
                    for (int r = 0; r < QR && j0 + r < nk[i]; r++) sc[i * ld + j0 + r] = s0[r] * scale;
                    if (two)
                        for (int r = 0; r < QR && j0 + r < nk[i + 1]; r++) sc[(i + 1) * ld + j0 + r] = s1[r] * scale;
                }
            }
            for (int i = 0; i < nq; i++) { // softmax: the reference's loops; sc becomes the weights
                float *s = sc + i * ld, mx = -INFINITY, sum = 0;
                for (int j = 0; j < nk[i]; j++)
                    if (s[j] > mx) mx = s[j];
                for (int j = 0; j < nk[i]; j++) sum += s[j] = expf(s[j] - mx);
                for (int j = 0; j < nk[i]; j++) s[j] = s[j] / sum;
                float *oh = o + (size_t)tq[i] * QD + (size_t)hq[i] * D;
                for (int d = 0; d < D; d++) oh[d] = 0;
            }
            for (int j0 = 0; j0 < nmax; j0 += AVT) {
                const int n = nmax - j0 < AVT ? nmax - j0 : AVT;
                const float *v = value_rows(cs, cs->v[layer], kvbase, j0, n, D, vb);
                for (int i = 0; i < nq; i++)
                    if (nk[i] > j0)
                        weighted_rows(o + (size_t)tq[i] * QD + (size_t)hq[i] * D, sc + i * ld + j0, v,
                                      nk[i] - j0 < n ? nk[i] - j0 : n, D);
            }
            for (int i = 0; i < nq; i++) {
                float *oh = o + (size_t)tq[i] * QD + (size_t)hq[i] * D;
                const float *gate = qg + (size_t)tq[i] * 2 * QD + (size_t)hq[i] * 2 * D + D;
                for (int d = 0; d < D; d++) oh[d] *= sigmoid(gate[d]);
            }
        }
        free(q);
        free(kt);
        free(vb);
        free(sc);
    }
    return failed ? -1 : 0;
}

static int attention(const struct geometry *g, const struct layer_weights *L, struct cpu_seq *cs, int layer, int cap,
                     int p0, const float *u, int T, float *out) {
    const int D = g->head_dim, NKV = g->n_kv_heads, QD = geom_q_dim(g), KVD = geom_kv_dim(g);
    float *qg = scratch(sizeof(float) * (size_t)T * 2 * QD);
    float *k = scratch(sizeof(float) * (size_t)T * KVD), *v = scratch(sizeof(float) * (size_t)T * KVD);
    float *o = scratch(sizeof(float) * (size_t)T * QD);
    int rc = -1;
    if (!qg || !k || !v || !o) goto out;
    if (qmatmul(&L->q_proj, 0, u, T, qg) || qmatmul(&L->k_proj, 0, u, T, k) || qmatmul(&L->v_proj, 0, u, T, v))
        goto out;
        // k: norm, RoPE, append; v: append raw.
#pragma omp parallel for collapse(2) schedule(static)
    for (int t = 0; t < T; t++)
        for (int j = 0; j < NKV; j++) {
            float *kh = k + (size_t)t * KVD + (size_t)j * D;
            rmsnorm(kh, kh, L->k_norm, D, (float)g->rms_eps);
            rope(kh, g->rope_dim, g->rope_theta, p0 + t);
            size_t base = ((size_t)j * cap + (size_t)(p0 + t)) * D;
            for (int d = 0; d < D; d++) {
                kv_put(cs, cs->k[layer], base + d, kh[d]);
                kv_put(cs, cs->v[layer], base + d, v[(size_t)t * KVD + (size_t)j * D + d]);
            }
        }
    if ((cpu_reference ? attend_ref : attend)(g, L, cs, layer, cap, p0, qg, T, o)) goto out;
    if (qmatmul(&L->o_proj, 0, o, T, out)) goto out;
    rc = 0;
out:
    free(qg);
    free(k);
    free(v);
    free(o);
    return rc;
}

// ---- Gated DeltaNet (§2.5) --------------------------------------------------------------------

// One token of the delta rule on value head h's state S [Dk, Dv]: decay, delta, rank-1 update. yt
// [C] is the token's q | k | v after the conv and the normalisation, bt and at its beta and decay
// inputs; m [Dv] is scratch. The forward and verify_keep's replay both run this, so a replayed
// state is the forward's.
static void gdn_step(const struct geometry *g, const struct layer_weights *L, int h, const float *yt, float bt,
                     float at, float *S, float *m) {
    const int KD = geom_lin_key_dim(g), Dk = g->lin_k_dim, Dv = g->lin_v_dim;
    const int kh = h / (g->lin_v_heads / g->lin_k_heads);
    const float *k = yt + KD + (size_t)kh * Dk;
    const float *v = yt + 2 * KD + (size_t)h * Dv;
    const float beta = sigmoid(bt);
    const float gl = -expf(L->A_log[h]) * softplus(at + L->dt_bias[h]);
    const float alpha = expf(gl);
    // omp simd: the dv loops' iterations are independent outputs (vector lanes), each with the
    // same operations in the same order.
#pragma omp simd
    for (int i = 0; i < Dk * Dv; i++) S[i] *= alpha;
    for (int dv = 0; dv < Dv; dv++) m[dv] = 0;
    for (int dk = 0; dk < Dk; dk++)
#pragma omp simd
        for (int dv = 0; dv < Dv; dv++) m[dv] += S[(size_t)dk * Dv + dv] * k[dk];
    for (int dv = 0; dv < Dv; dv++) m[dv] = beta * (v[dv] - m[dv]); // delta
    for (int dk = 0; dk < Dk; dk++)
#pragma omp simd
        for (int dv = 0; dv < Dv; dv++) S[(size_t)dk * Dv + dv] += k[dk] * m[dv];
}

static int deltanet(const struct geometry *g, const struct layer_weights *L, struct cpu_seq *cs, int layer,
                    const float *u, int T, float *out) {
    const int C = geom_conv_dim(g), VD = geom_lin_value_dim(g);
    const int Hk = g->lin_k_heads, Hv = g->lin_v_heads, Dk = g->lin_k_dim, Dv = g->lin_v_dim, KW = g->conv_kernel;
    float *xe = scratch(sizeof(float) * (size_t)(T + KW - 1) * C); // conv window rows, then this chunk
    float *y = scratch(sizeof(float) * (size_t)T * C);
    float *z = scratch(sizeof(float) * (size_t)T * VD);
    float *b = scratch(sizeof(float) * (size_t)T * Hv), *a = scratch(sizeof(float) * (size_t)T * Hv);
    float *o = scratch(sizeof(float) * (size_t)T * VD);
    int rc = -1;
    if (!xe || !y || !z || !b || !a || !o) goto out; // before any state changes
    memcpy(xe, cs->conv[layer], sizeof(float) * (size_t)(KW - 1) * C);
    if (qmatmul(&L->in_qkv, 0, u, T, xe + (size_t)(KW - 1) * C) || qmatmul(&L->in_z, 0, u, T, z) ||
        qmatmul(&L->in_b, 0, u, T, b) || qmatmul(&L->in_a, 0, u, T, a))
        goto out;
        // Causal depthwise conv + SiLU over all C channels; tap KW-1 is the current token.
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            float s = 0;
            for (int j = 0; j < KW; j++) s += L->conv_w[(size_t)c * KW + j] * xe[(size_t)(t + j) * C + c];
            y[(size_t)t * C + c] = silu(s);
        }
    memcpy(cs->conv[layer], xe + (size_t)T * C, sizeof(float) * (size_t)(KW - 1) * C);
    // L2-normalise q and k per key head; q also by 1/sqrt(Dk).
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int kh = 0; kh < 2 * Hk; kh++) {
            float *x = y + (size_t)t * C + (size_t)kh * Dk; // q heads then k heads
            float ss = 0;
            for (int d = 0; d < Dk; d++) ss += x[d] * x[d];
            float r = 1.0f / sqrtf(ss + 1e-6f);
            if (kh < Hk) r /= sqrtf((float)Dk);
            for (int d = 0; d < Dk; d++) x[d] *= r;
        }
    if (cs->saving) { // a verification: what verify_keep replays from (T <= CPU_VERIFY_MAX)
        const struct gdn_saved *sv = &cs->saved[layer];
        memcpy(sv->S0, cs->S[layer], sizeof(float) * (size_t)Hv * Dk * Dv);
        memcpy(sv->xe, xe, sizeof(float) * (size_t)(T + KW - 1) * C);
        memcpy(sv->y, y, sizeof(float) * (size_t)T * C);
        memcpy(sv->b, b, sizeof(float) * (size_t)T * Hv);
        memcpy(sv->a, a, sizeof(float) * (size_t)T * Hv);
    }
    // The delta rule, token by token; value head h reads key head h / (Hv / Hk).
#pragma omp parallel for schedule(static)
    for (int h = 0; h < Hv; h++) {
        float *S = cs->S[layer] + (size_t)h * Dk * Dv;
        const int kh = h / (Hv / Hk);
        float m[Dv > 0 ? Dv : 1];
        for (int t = 0; t < T; t++) {
            const float *q = y + (size_t)t * C + (size_t)kh * Dk;
            gdn_step(g, L, h, y + (size_t)t * C, b[(size_t)t * Hv + h], a[(size_t)t * Hv + h], S, m);
            float *oh = o + (size_t)t * VD + (size_t)h * Dv;
            for (int dv = 0; dv < Dv; dv++) oh[dv] = 0;
            for (int dk = 0; dk < Dk; dk++)
#pragma omp simd
                for (int dv = 0; dv < Dv; dv++) oh[dv] += S[(size_t)dk * Dv + dv] * q[dk];
            // Gated RMSNorm (kind (b), no +1): w * norm(o) * silu(z).
            float ss = 0;
            for (int dv = 0; dv < Dv; dv++) ss += oh[dv] * oh[dv];
            float r = 1.0f / sqrtf(ss / (float)Dv + (float)g->rms_eps);
            const float *zh = z + (size_t)t * VD + (size_t)h * Dv;
            for (int dv = 0; dv < Dv; dv++) oh[dv] = L->gdn_norm[dv] * (oh[dv] * r) * silu(zh[dv]);
        }
    }
    if (qmatmul(&L->out_proj, 0, o, T, out)) goto out;
    rc = 0;
out:
    free(xe);
    free(y);
    free(z);
    free(b);
    free(a);
    free(o);
    return rc;
}

// ---- MoE (§2.6) -------------------------------------------------------------------------------

// What the router trace records of one decision (tools/dev/router_stats.py plots it).
struct route_stats {
    float gap;    // k-th probability minus the largest one not chosen
    float lgap;   // the same in logits: k-th logit minus the (k+1)-th
    float w1, wk; // the largest and the k-th renormalised weight
    float lstd;   // standard deviation of the logits over the experts
};

// Softmax over all experts, top-k (ties: lower id), renormalised over the k. With st, one more
// round of the selection gives the (k+1)-th expert for the gaps.
static void route(const float *logits, int E, int k, int *ids, float *w, struct route_stats *st) {
    float mx = -INFINITY, p[E];
    for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    float sum = 0;
    for (int e = 0; e < E; e++) sum += p[e] = expf(logits[e] - mx);
    for (int e = 0; e < E; e++) p[e] /= sum;
    float top = 0;
    for (int i = 0; i < k + (st != NULL); i++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < i; j++) taken |= ids[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        if (i == k) {
            st->gap = p[ids[k - 1]] - p[best];
            st->lgap = logits[ids[k - 1]] - logits[best];
            break;
        }
        ids[i] = best;
        w[i] = p[best];
        top += p[best];
    }
    for (int i = 0; i < k; i++) w[i] /= top;
    if (!st) return;
    double m = 0, v = 0;
    for (int e = 0; e < E; e++) m += logits[e] / (double)E;
    for (int e = 0; e < E; e++) v += (logits[e] - m) * (logits[e] - m) / E;
    st->w1 = w[0], st->wk = w[k - 1], st->lstd = (float)sqrt(v);
}

// Developer diagnostic: with engine_options.router_trace (CALLA_ROUTER_TRACE=FILE), every routing
// decision is appended to FILE as
// "layer position gap id,id,... lgap w1 wk lstd" (ids ascending; struct route_stats says what the
// numbers are): tools/dev/router_diff.py compares two such traces (tools/gen/make_golden.py --router-trace
// writes HF's) and finds the first decision that differs; tools/dev/router_stats.py plots them.
// The file is opened by the first load that names one and stays open for the process; router_trace()
// is it, or NULL when not asked for.
static FILE *trace_file;
static bool trace_tried;
static void router_trace_open(const char *path) {
    if (trace_tried || !path || !*path) return;
    trace_tried = true;
    if (!(trace_file = fopen(path, "a"))) fprintf(stderr, "calla: cannot open %s\n", path);
}
static FILE *router_trace(void) {
    return trace_file;
}

static void trace_route(FILE *f, int layer, int pos, const struct route_stats *st, const int *ids, int k) {
    int s[64];
    for (int i = 0; i < k; i++) { // insertion sort of k <= 64 ids
        int j = i;
        for (; j > 0 && s[j - 1] > ids[i]; j--) s[j] = s[j - 1];
        s[j] = ids[i];
    }
    fprintf(f, "%d %d %.9g ", layer, pos, (double)st->gap);
    for (int i = 0; i < k; i++) fprintf(f, i ? ",%d" : "%d", s[i]);
    fprintf(f, " %.6g %.6g %.6g %.6g\n", (double)st->lgap, (double)st->w1, (double)st->wk, (double)st->lstd);
    fflush(f);
}

// out[t] = sum_e w_e * down_e(silu(gate_e x) * up_e x) over the rows of x (one expert's tokens).
static int mlp(const struct qtensor *gate, const struct qtensor *up, const struct qtensor *down, int mat,
               const float *x, int T, float *out) {
    const int I = gate->rows;
    float *a = scratch(sizeof(float) * (size_t)T * I), *b = scratch(sizeof(float) * (size_t)T * I);
    int rc = -1;
    if (a && b && !qmatmul(gate, mat, x, T, a) && !qmatmul(up, mat, x, T, b)) {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < (size_t)T * I; i++) a[i] = silu(a[i]) * b[i];
        rc = qmatmul(down, mat, a, T, out);
    }
    free(a);
    free(b);
    return rc;
}

// rl_out [T, E], when not NULL, gets the router's logits (the layer probe).
static int moe(const struct geometry *g, const struct layer_weights *L, int layer, int p0, const float *u, int T,
               float *out, float *rl_out) {
    const int H = g->hidden, E = g->n_experts, K = g->n_experts_used;
    float *rl = scratch(sizeof(float) * (size_t)T * E), *sg = scratch(sizeof(float) * (size_t)T);
    int *ids = scratch(sizeof(int) * (size_t)T * K);
    float *w = scratch(sizeof(float) * (size_t)T * K);
    float *xe = scratch(sizeof(float) * (size_t)T * H), *ye = scratch(sizeof(float) * (size_t)T * H);
    int *tok = scratch(sizeof(int) * (size_t)T);
    float *tw = scratch(sizeof(float) * (size_t)T);
    int rc = -1;
    if (!rl || !sg || !ids || !w || !xe || !ye || !tok || !tw) goto out;
    if (qmatmul(&L->router, 0, u, T, rl) || qmatmul(&L->shared_gate, 0, u, T, sg)) goto out;
    if (rl_out) memcpy(rl_out, rl, sizeof(float) * (size_t)T * E);
    FILE *trace = router_trace();
#pragma omp parallel for schedule(static) if (!trace) // the trace is written in token order
    for (int t = 0; t < T; t++) {
        struct route_stats st;
        route(rl + (size_t)t * E, E, K, ids + (size_t)t * K, w + (size_t)t * K, trace ? &st : NULL);
        if (trace) trace_route(trace, layer, p0 + t, &st, ids + (size_t)t * K, K);
    }
    // Shared expert, scaled by sigmoid of its gate.
    if (mlp(&L->se_gate, &L->se_up, &L->se_down, 0, u, T, out)) goto out;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++) out[(size_t)t * H + i] *= sigmoid(sg[t]);
    // Routed experts: gather each expert's tokens, run them together, scatter-add.
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < K; i++)
                if (ids[(size_t)t * K + i] == e) {
                    tok[n] = t;
                    tw[n] = w[(size_t)t * K + i];
                    n++;
                }
        if (!n) continue;
#pragma omp parallel for schedule(static) if (n >= 64) // below that a thread team costs more than it saves
        for (int j = 0; j < n; j++) memcpy(xe + (size_t)j * H, u + (size_t)tok[j] * H, sizeof(float) * (size_t)H);
        if (mlp(&L->ex_gate, &L->ex_up, &L->ex_down, e, xe, n, ye)) goto out;
#pragma omp parallel for schedule(static) if (n >= 64) // a token is once in an expert's list
        for (int j = 0; j < n; j++)
            for (int i = 0; i < H; i++) out[(size_t)tok[j] * H + i] += tw[j] * ye[(size_t)j * H + i];
    }
    rc = 0;
out:
    free(rl);
    free(sg);
    free(ids);
    free(w);
    free(xe);
    free(ye);
    free(tok);
    free(tw);
    return rc;
}

// ---- the backend ------------------------------------------------------------------------------

static int cpu_load(struct engine *e, char *err, size_t errlen) {
    if (e->opts.threads > 0) omp_set_num_threads(e->opts.threads);
    alloc_limit = e->opts.cpu_alloc_limit;
    cpu_reference = e->opts.cpu_reference;
#if defined(CPU_AVX)
    cpu_avx = __builtin_cpu_supports("avx") && !e->opts.cpu_no_avx;
#endif
    router_trace_open(e->opts.router_trace);
    e->weight_bytes = e->model.file_bytes; // weights stay in the mapped files
    return 0;
}

static void cpu_unload(struct engine *e) {}

static void cpu_seq_release(struct seq *s) {
    struct cpu_seq *cs = s->impl;
    if (!cs) return;
    for (int i = 0; i < QWEN_LAYERS; i++) {
        free(cs->k[i]);
        free(cs->v[i]);
        free(cs->conv[i]);
        free(cs->S[i]);
        const struct gdn_saved *sv = &cs->saved[i];
        free(sv->S0);
        free(sv->xe);
        free(sv->y);
        free(sv->b);
        free(sv->a);
    }
    free(cs);
    s->impl = NULL;
}

static size_t kv_bytes(const struct engine *e, const struct cpu_seq *cs, int cap) {
    return state_kv_bytes(&e->model.state, cap, cs->kv_f32 ? 4 : 2);
}

static void cpu_seq_clear(struct seq *s) {
    const struct geometry *g = &s->e->model.g;
    const struct state_sizes *z = &s->e->model.state;
    struct cpu_seq *cs = s->impl;
    for (int i = 0; i < g->n_layers; i++)
        if (!geom_is_attn(g, i)) {
            memset(cs->conv[i], 0, (size_t)z->conv_bytes);
            memset(cs->S[i], 0, (size_t)z->recurrent_bytes);
        }
}

static int cpu_seq_alloc(struct engine *e, struct seq *s, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    const struct state_sizes *z = &e->model.state;
    struct cpu_seq *cs = calloc(1, sizeof *cs);
    if (!cs) goto oom;
    s->impl = cs;
    cs->kv_f32 = e->opts.kv_f32;
    for (int i = 0; i < g->n_layers; i++) {
        if (geom_is_attn(g, i)) {
            cs->k[i] = malloc(kv_bytes(e, cs, s->cap));
            cs->v[i] = malloc(kv_bytes(e, cs, s->cap));
            if (!cs->k[i] || !cs->v[i]) goto oom;
        } else {
            cs->conv[i] = calloc(1, (size_t)z->conv_bytes);
            cs->S[i] = calloc(1, (size_t)z->recurrent_bytes);
            if (!cs->conv[i] || !cs->S[i]) goto oom;
        }
    }
    return 0;
oom:
    cpu_seq_release(s);
    snprintf(err, errlen, "out of memory allocating a %d-token sequence", s->cap);
    return -1;
}

static int cpu_seq_copy(struct seq *dst, const struct seq *src, char *err, size_t errlen) {
    const struct geometry *g = &src->e->model.g;
    const struct state_sizes *z = &src->e->model.state;
    struct cpu_seq *d = dst->impl;
    const struct cpu_seq *sc = src->impl;
    const size_t el = sc->kv_f32 ? 4 : 2;
    for (int i = 0; i < g->n_layers; i++) {
        if (geom_is_attn(g, i)) {
            for (int j = 0; j < g->n_kv_heads; j++) { // per head: [cap, D] rows, copy the first pos
                size_t n = (size_t)src->pos * g->head_dim * el;
                memcpy((char *)d->k[i] + (size_t)j * dst->cap * g->head_dim * el,
                       (const char *)sc->k[i] + (size_t)j * src->cap * g->head_dim * el, n);
                memcpy((char *)d->v[i] + (size_t)j * dst->cap * g->head_dim * el,
                       (const char *)sc->v[i] + (size_t)j * src->cap * g->head_dim * el, n);
            }
        } else {
            memcpy(d->conv[i], sc->conv[i], (size_t)z->conv_bytes);
            memcpy(d->S[i], sc->S[i], (size_t)z->recurrent_bytes);
        }
    }
    return 0;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// Decoder layer i (§2.2) on the residual stream x [T, H] in place, at positions s->pos..: u, d are
// [T, H] scratch; rl [T, E] gets the router's logits when not NULL. forward_chunk runs it for every
// layer, the layer probe for one.
static int cpu_layer(const struct engine *e, struct seq *s, int i, float *x, float *u, float *d, int T, float *rl) {
    const struct geometry *g = &e->model.g;
    const struct layer_weights *L = &e->model.w.layers[i];
    struct cpu_seq *cs = s->impl;
    const int H = g->hidden, p0 = s->pos;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) rmsnorm(u + (size_t)t * H, x + (size_t)t * H, L->input_norm, H, (float)g->rms_eps);
    if (geom_is_attn(g, i) ? attention(g, L, cs, i, s->cap, p0, u, T, d) : deltanet(g, L, cs, i, u, T, d)) return -1;
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < (size_t)T * H; j++) x[j] += d[j];
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) rmsnorm(u + (size_t)t * H, x + (size_t)t * H, L->post_norm, H, (float)g->rms_eps);
    if (moe(g, L, i, p0, u, T, d, rl)) return -1;
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < (size_t)T * H; j++) x[j] += d[j];
    return 0;
}

static int cpu_forward_chunk(struct engine *e, struct seq *s, const int32_t *tokens, int T, const int *rows, int n_rows,
                             float *logits, int32_t *next, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    const struct weights *W = &e->model.w;
    const int H = g->hidden, p0 = s->pos;
    // The rows whose final norm and lm_head are wanted: the asked ones and the last.
    int want[n_rows + 1], nw = 0;
    for (int r = 0; r < n_rows; r++) want[nw++] = rows[r];
    if (!nw || want[nw - 1] != T - 1) want[nw++] = T - 1;
    float *x = scratch(sizeof(float) * (size_t)T * H), *u = scratch(sizeof(float) * (size_t)T * H);
    float *d = scratch(sizeof(float) * (size_t)T * H);
    float *hn = scratch(sizeof(float) * (size_t)nw * H), *lg = scratch(sizeof(float) * (size_t)nw * g->vocab);
    int rc = -1;
    if (!x || !u || !d || !hn || !lg) goto out;
    for (int t = 0; t < T; t++) dequant_row(&W->embed, 0, tokens[t], x + (size_t)t * H);
    for (int i = 0; i < g->n_layers; i++)
        if (cpu_layer(e, s, i, x, u, d, T, NULL)) goto out;
    for (int r = 0; r < nw; r++)
        rmsnorm(hn + (size_t)r * H, x + (size_t)want[r] * H, W->final_norm, H, (float)g->rms_eps);
    if (qmatmul(&W->lm_head, 0, hn, nw, lg)) goto out;
    if (logits) memcpy(logits, lg, sizeof(float) * (size_t)n_rows * g->vocab);
    *next = argmax(lg + (size_t)(nw - 1) * g->vocab, g->vocab);
    rc = 0;
out:
    if (rc) snprintf(err, errlen, "out of memory in the CPU forward pass (%d tokens at position %d)", T, p0);
    free(hn);
    free(lg);
    free(x);
    free(u);
    free(d);
    return rc;
}

static int cpu_embed(struct engine *e, const int32_t *tokens, int T, float *out, char *err, size_t errlen) {
    const int H = e->model.g.hidden;
    for (int t = 0; t < T; t++) dequant_row(&e->model.w.embed, 0, tokens[t], out + (size_t)t * H);
    return 0;
}

static int cpu_layer_probe(struct engine *e, struct seq *s, int layer, const float *x_in, int T, float *x_out,
                           float *router_logits, char *err, size_t errlen) {
    const size_t n = (size_t)T * e->model.g.hidden;
    float *u = scratch(sizeof(float) * n), *d = scratch(sizeof(float) * n);
    int rc = -1;
    if (u && d) {
        memmove(x_out, x_in, sizeof(float) * n);
        rc = cpu_layer(e, s, layer, x_out, u, d, T, router_logits);
    }
    if (rc) snprintf(err, errlen, "out of memory in the CPU layer probe (%d tokens at position %d)", T, s->pos);
    free(u);
    free(d);
    return rc;
}

// ---- speculative verification -------------------------------------------------------------------

static int cpu_verify_max(const struct engine *e) {
    return CPU_VERIFY_MAX;
}

// The DeltaNet layers' saved[] buffers, once per sequence (the first verification); -1: out of memory.
static int saved_alloc(const struct engine *e, struct cpu_seq *cs) {
    const struct geometry *g = &e->model.g;
    const size_t C = (size_t)geom_conv_dim(g), Hv = (size_t)g->lin_v_heads;
    for (int i = 0; i < g->n_layers; i++) {
        struct gdn_saved *sv = &cs->saved[i];
        if (geom_is_attn(g, i) || sv->S0) continue;
        sv->S0 = scratch((size_t)e->model.state.recurrent_bytes);
        sv->xe = scratch(sizeof(float) * (size_t)(g->conv_kernel - 1 + CPU_VERIFY_MAX) * C);
        sv->y = scratch(sizeof(float) * CPU_VERIFY_MAX * C);
        sv->b = scratch(sizeof(float) * CPU_VERIFY_MAX * Hv);
        sv->a = scratch(sizeof(float) * CPU_VERIFY_MAX * Hv);
        if (!sv->S0 || !sv->xe || !sv->y || !sv->b || !sv->a) {
            free(sv->S0), free(sv->xe), free(sv->y), free(sv->b), free(sv->a);
            *sv = (struct gdn_saved){0};
            return -1;
        }
    }
    return 0;
}

// One forward of the n tokens, as a prefill chunk is (the same functions on the same rows, which
// give the bits n decode steps give: tests/test_speculative.c), with every row's logits.
static int cpu_verify(struct engine *e, struct seq *s, const int32_t *tokens, int n, int32_t *all_next, char *err,
                      size_t errlen) {
    const int V = e->model.g.vocab;
    struct cpu_seq *cs = s->impl;
    int rows[CPU_VERIFY_MAX];
    for (int i = 0; i < n; i++) rows[i] = i;
    float *lg = scratch(sizeof(float) * (size_t)n * V);
    if (!lg || saved_alloc(e, cs)) {
        free(lg);
        snprintf(err, errlen, "out of memory for a verification of %d tokens at position %d", n, s->pos);
        return -1;
    }
    int32_t last;
    cs->saving = true;
    const int rc = cpu_forward_chunk(e, s, tokens, n, rows, n, lg, &last, err, errlen);
    cs->saving = false;
    if (!rc)
        for (int i = 0; i < n; i++) all_next[i] = argmax(lg + (size_t)i * V, V);
    free(lg);
    return rc;
}

// Every DeltaNet layer back to its state after the first keep of the n verified tokens: the saved
// state, the delta rule replayed over those tokens, and the conv window of the keep-th token.
static int cpu_verify_keep(struct engine *e, struct seq *s, int n, int keep, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cpu_seq *cs = s->impl;
    const int C = geom_conv_dim(g), Hv = g->lin_v_heads, Dk = g->lin_k_dim, Dv = g->lin_v_dim, KW = g->conv_kernel;
    for (int i = 0; i < g->n_layers; i++) {
        if (geom_is_attn(g, i)) continue;
        const struct layer_weights *L = &e->model.w.layers[i];
        const struct gdn_saved *sv = &cs->saved[i];
        memcpy(cs->S[i], sv->S0, (size_t)e->model.state.recurrent_bytes);
        memcpy(cs->conv[i], sv->xe + (size_t)keep * C, sizeof(float) * (size_t)(KW - 1) * C);
#pragma omp parallel for schedule(static)
        for (int h = 0; h < Hv; h++) {
            float m[Dv > 0 ? Dv : 1];
            for (int t = 0; t < keep; t++)
                gdn_step(g, L, h, sv->y + (size_t)t * C, sv->b[(size_t)t * Hv + h], sv->a[(size_t)t * Hv + h],
                         cs->S[i] + (size_t)h * Dk * Dv, m);
        }
    }
    return 0;
}

static int cpu_available(int device, char *msg, size_t msglen) {
    return 1;
}

const struct backend_ops backend_cpu = {
    .name = "cpu",
    .available = cpu_available,
    .load = cpu_load,
    .unload = cpu_unload,
    .seq_alloc = cpu_seq_alloc,
    .seq_release = cpu_seq_release,
    .seq_clear = cpu_seq_clear,
    .seq_copy = cpu_seq_copy,
    .forward_chunk = cpu_forward_chunk,
    .verify_max = cpu_verify_max,
    .verify = cpu_verify,
    .verify_keep = cpu_verify_keep,
    .embed = cpu_embed,
    .layer_probe = cpu_layer_probe,
};
