// test_engine.c: properties of the CPU engine that the golden fixtures do not cover: prefill then
// decode equals one longer prefill; chunked equals unchunked; snapshots (seq_copy) continue
// identically; results do not depend on the thread count; bad input is refused without touching
// the state; running out of memory is an error, not an abort; an unaligned (MLX-layout) checkpoint
// gives the logits of an aligned one without copying its weights; the layer probe chained over
// every layer is the forward pass.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h" // the layer probe test moves a sequence's position as engine_forward does
#include "engine.h"
#include "synth.h"
#include "tiny_engine.h"

static char dir[256];
static struct engine *eng;
static int V;

enum { N = 37, K = 5 };

static void prompt(int32_t *t, int n, uint32_t salt) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)((((uint64_t)(i + salt) * 2654435761u) & 0xffffffffu) % (uint32_t)V);
}

static struct seq *new_seq(int cap) {
    struct seq *s;
    char err[256];
    if (seq_new(eng, cap, &s, err, sizeof err)) fail_msg("seq_new: %s", err);
    return s;
}

static void forward(struct seq *s, const int32_t *t, int n, int chunk, int row, float *logits, int32_t *next) {
    char err[256];
    struct forward_opts o = {.chunk = chunk, .logit_rows = &row, .n_logit_rows = logits ? 1 : 0, .logits = logits};
    if (engine_forward(eng, s, t, n, &o, next, err, sizeof err)) fail_msg("forward: %s", err);
}

// Prefill N, then K single-token steps feeding the given tokens == prefill of all N+K at once.
static void test_decode_equals_prefill(void **state) {
    int32_t t[N + K], a, b;
    prompt(t, N + K, 3);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    struct seq *s1 = new_seq(N + K), *s2 = new_seq(N + K);
    forward(s1, t, N, 0, N - 1, la, &a);
    for (int k = 0; k < K; k++) forward(s1, &t[N + k], 1, 0, 0, la, &a);
    forward(s2, t, N + K, 0, N + K - 1, lb, &b);
    assert_int_equal(a, b);
    assert_memory_equal(la, lb, sizeof(float) * V); // same ops per token: bit-identical
    assert_int_equal(seq_pos(s1), N + K);
    seq_free(s1);
    seq_free(s2);
    free(la);
    free(lb);
}

static void test_chunked_equals_unchunked(void **state) {
    int32_t t[N], a, b;
    prompt(t, N, 11);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    struct seq *s1 = new_seq(N), *s2 = new_seq(N);
    forward(s1, t, N, 7, N - 1, la, &a); // chunks of 7: 7,7,7,7,7,2
    forward(s2, t, N, 0, N - 1, lb, &b);
    assert_int_equal(a, b);
    assert_memory_equal(la, lb, sizeof(float) * V);
    seq_free(s1);
    seq_free(s2);
    free(la);
    free(lb);
}

// The progress callback: once per chunk, tokens done ascending by the chunk size, ending at the total.
struct progress_log {
    int calls, done[16], total;
};
static void log_progress(void *arg, int done, int total) {
    struct progress_log *l = arg;
    if (l->calls < 16) l->done[l->calls] = done;
    l->calls++;
    l->total = total;
}
static void test_progress_per_chunk(void **state) {
    int32_t t[N], a;
    prompt(t, N, 5);
    struct seq *s = new_seq(N);
    struct progress_log l = {0};
    struct forward_opts o = {.chunk = 10, .progress = log_progress, .progress_arg = &l};
    char err[256];
    if (engine_forward(eng, s, t, N, &o, &a, err, sizeof err)) fail_msg("forward: %s", err);
    assert_int_equal(l.calls, 4); // 10, 20, 30, 37
    assert_int_equal(l.done[0], 10);
    assert_int_equal(l.done[2], 30);
    assert_int_equal(l.done[3], N);
    assert_int_equal(l.total, N);
    seq_free(s);
}

// A backend that says short forwards are cheaper (short_split) gets a forward of up to that many
// tokens as consecutive forwards of verify_max tokens: the CPU backend's ops with short_split 20
// below position 100 (0 from there) and forward_chunk counted. 20 tokens: chunks of 8, 8 and 4, the same logits as one
// chunk (the CPU's chunks compute the same values: bit-identical); 21: one chunk; a caller's chunk that cuts the
// forward wins (one that does not, such as the server's 4,096, does not); a wanted row other than the last: one chunk.
static int chunks_seen[8], n_chunks_seen;
static const struct backend_ops *cpu_ops;
static int counted_chunk(struct engine *e, struct seq *s, const int32_t *tokens, int n, const int *rows, int n_rows,
                         float *logits, int32_t *next, char *err, size_t errlen) {
    if (n_chunks_seen < 8) chunks_seen[n_chunks_seen] = n;
    n_chunks_seen++;
    return cpu_ops->forward_chunk(e, s, tokens, n, rows, n_rows, logits, next, err, errlen);
}
static int split_20(const struct engine *e, int pos) {
    return pos < 100 ? 20 : 0;
}

static void test_short_split(void **state) {
    cpu_ops = eng->ops;
    assert_true(engine_verify_max(eng) == 8);
    static struct backend_ops split; // (static: a failed assertion leaves eng->ops pointing here)
    split = *cpu_ops;
    split.forward_chunk = counted_chunk, split.short_split = split_20, split.forward_pick = NULL;
    int32_t t[21], a, b;
    prompt(t, 21, 9);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    struct seq *s1 = new_seq(32), *s2 = new_seq(32);
    forward(s1, t, 20, 0, 19, la, &a); // the CPU's own ops: one chunk
    eng->ops = &split;
    n_chunks_seen = 0;
    forward(s2, t, 20, 0, 19, lb, &b);
    assert_int_equal(n_chunks_seen, 3);
    assert_int_equal(chunks_seen[0], 8), assert_int_equal(chunks_seen[1], 8), assert_int_equal(chunks_seen[2], 4);
    assert_int_equal(a, b);
    assert_memory_equal(la, lb, sizeof(float) * V);
    assert_int_equal(seq_pos(s2), 20);
    seq_reset(s2);
    n_chunks_seen = 0;
    forward(s2, t, 21, 0, 20, lb, &b); // past the split: one chunk
    assert_int_equal(n_chunks_seen, 1);
    seq_reset(s2);
    n_chunks_seen = 0;
    forward(s2, t, 20, 16, 19, lb, &b); // the caller's chunk, where it cuts the forward
    assert_int_equal(n_chunks_seen, 2);
    seq_reset(s2);
    n_chunks_seen = 0;
    forward(s2, t, 20, 4096, 19, lb, &b); // (the server's: one chunk, so the short forwards)
    assert_int_equal(n_chunks_seen, 3);
    seq_reset(s2);
    n_chunks_seen = 0;
    forward(s2, t, 20, 0, 3, lb, &b); // a row short forwards do not give: one chunk
    assert_int_equal(n_chunks_seen, 1);
    struct seq *far = new_seq(160);
    int32_t pad[100];
    prompt(pad, 100, 4);
    forward(far, pad, 100, 0, 0, NULL, &b); // (past the backend's split at this position: one chunk)
    n_chunks_seen = 0;
    forward(far, t, 20, 0, 19, lb, &b);
    assert_int_equal(n_chunks_seen, 1);
    seq_free(far);
    eng->ops = cpu_ops;
    free(la), free(lb);
    seq_free(s1);
    seq_free(s2);
}

static void test_snapshot_continues_identically(void **state) {
    int32_t t[N], a, b;
    char err[256];
    prompt(t, N, 5);
    struct seq *s1 = new_seq(N + K), *snap = new_seq(N + K);
    forward(s1, t, 20, 0, 0, NULL, &a);
    assert_int_equal(seq_copy(snap, s1, err, sizeof err), 0);
    forward(s1, t + 20, N - 20, 0, 0, NULL, &a);
    forward(snap, t + 20, N - 20, 0, 0, NULL, &b);
    assert_int_equal(a, b);
    for (int k = 0; k < K; k++) { // greedy continuation from both
        forward(s1, &a, 1, 0, 0, NULL, &a);
        forward(snap, &b, 1, 0, 0, NULL, &b);
        assert_int_equal(a, b);
    }
    // Reset gives the same first token as a fresh sequence.
    seq_reset(s1);
    assert_int_equal(seq_pos(s1), 0);
    struct seq *fresh = new_seq(N);
    forward(s1, t, N, 0, 0, NULL, &a);
    forward(fresh, t, N, 0, 0, NULL, &b);
    assert_int_equal(a, b);
    seq_free(s1);
    seq_free(snap);
    seq_free(fresh);
}

static void test_thread_count_does_not_matter(void **state) {
    int32_t t[N], a, b;
    prompt(t, N, 17);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    struct seq *s1 = new_seq(N);
    forward(s1, t, N, 0, N - 1, la, &a);
    omp_set_num_threads(3);
    struct seq *s2 = new_seq(N);
    forward(s2, t, N, 0, N - 1, lb, &b);
    omp_set_num_threads(saved);
    assert_int_equal(a, b);
    assert_memory_equal(la, lb, sizeof(float) * V);
    seq_free(s1);
    seq_free(s2);
    free(la);
    free(lb);
}

static void test_bad_input_refused_state_unchanged(void **state) {
    int32_t t[N], a, b;
    char err[256];
    prompt(t, N, 23);
    struct seq *s = new_seq(N), *ref = new_seq(N);
    forward(s, t, 10, 0, 0, NULL, &a);
    forward(ref, t, 10, 0, 0, NULL, &b);
    int32_t bad[2] = {t[10], V}; // id past the vocabulary
    assert_int_equal(engine_forward(eng, s, bad, 2, NULL, &a, err, sizeof err), ENGINE_ERROR);
    assert_non_null(strstr(err, "outside the vocabulary"));
    int32_t neg = -1;
    assert_int_equal(engine_forward(eng, s, &neg, 1, NULL, &a, err, sizeof err), ENGINE_ERROR);
    assert_int_equal(engine_forward(eng, s, t, N, NULL, &a, err, sizeof err), ENGINE_ERROR); // 10 + 37 > 37
    assert_non_null(strstr(err, "capacity"));
    assert_int_equal(engine_forward(eng, s, t, 0, NULL, &a, err, sizeof err), ENGINE_ERROR);
    assert_int_equal(seq_pos(s), 10);
    forward(s, t + 10, N - 10, 0, 0, NULL, &a); // still continues exactly like the untouched twin
    forward(ref, t + 10, N - 10, 0, 0, NULL, &b);
    assert_int_equal(a, b);
    struct seq *x;
    assert_int_equal(seq_new(eng, 0, &x, err, sizeof err), -1);
    assert_int_equal(seq_new(eng, QWEN_MAX_CTX + 1, &x, err, sizeof err), -1);
    seq_free(s);
    seq_free(ref);
}

// Out of memory in the CPU forward pass is an error with a message, never an abort (the server
// answers 500 and goes on serving). CALLA_CPU_ALLOC_LIMIT, read when a CPU engine loads, makes
// every scratch allocation above it fail; the limit is process-wide, so the test loads an engine
// without it afterwards.
static void test_out_of_memory_is_an_error(void **state) {
    enum { LONG = 1000 };
    int32_t t[LONG], a, b;
    char err[256];
    prompt(t, LONG, 31);
    struct engine *lim, *plain;
    struct engine_options eo = {.backend = "cpu"};
    // Above one row of logits (993,280 bytes at this vocabulary), below the first DeltaNet layer's
    // conv input for 1,000 tokens (1,027,072 bytes): the long call fails before any work.
    setenv("CALLA_CPU_ALLOC_LIMIT", "1000000", 1);
    int rc = engine_open(dir, &eo, &lim, err, sizeof err);
    unsetenv("CALLA_CPU_ALLOC_LIMIT");
    assert_int_equal(rc, 0);
    struct seq *s;
    assert_int_equal(seq_new(lim, LONG, &s, err, sizeof err), 0);
    assert_int_equal(engine_forward(lim, s, t, LONG, NULL, &a, err, sizeof err), ENGINE_ERROR);
    assert_non_null(strstr(err, "out of memory"));
    assert_int_equal(seq_pos(s), 0);
    seq_reset(s);
    assert_int_equal(engine_forward(lim, s, t, 8, NULL, &a, err, sizeof err), ENGINE_OK); // small steps still run
    seq_free(s);
    engine_close(lim);
    assert_int_equal(engine_open(dir, &eo, &plain, err, sizeof err), 0); // and clears the limit
    assert_int_equal(seq_new(plain, LONG, &s, err, sizeof err), 0);
    assert_int_equal(engine_forward(plain, s, t, 8, NULL, &b, err, sizeof err), ENGINE_OK);
    assert_int_equal(a, b);
    seq_free(s);
    engine_close(plain);
}

// The synthetic default is MLX's unpadded layout (tensors at odd offsets, read in place); an
// --aligned file of the same seed holds the same bytes at aligned offsets. Both give bit-identical
// logits, and loading the unaligned one copies nothing: its quantized matrices point into the
// mapped shard, and the host memory the load allocates (the fp32 vectors) is the aligned one's.
static void test_unaligned_equals_aligned(void **state) {
    char adir[300], err[512];
    snprintf(adir, sizeof adir, "%s-aligned", dir);
    struct synth_options so = {
        .g = geometry_find("tiny"), .seed = 5, .out_dir = adir, .max_shard_bytes = (int64_t)5 << 30, .aligned = true};
    struct engine_options eo = {.backend = "cpu"};
    struct engine *al;
    if (synth_write(&so, err, sizeof err) || engine_open(adir, &eo, &al, err, sizeof err)) fail_msg("%s", err);
    const struct model *mu = engine_model(eng), *ma = engine_model(al);
    assert_true(mu->n_unaligned > 0);
    assert_int_equal(ma->n_unaligned, 0);
    assert_int_equal(mu->owned_bytes, ma->owned_bytes);
    assert_true(mu->owned_bytes * 20 < mu->file_bytes); // the fp32 vectors only
    const uint8_t *w = mu->w.lm_head.w, *lo = mu->shards[0].map;
    assert_true(mu->n_shards == 1 && w >= lo && w < lo + mu->shards[0].size && (uintptr_t)w % 2 == 1);

    int32_t t[N], a, b;
    prompt(t, N, 11);
    int rows[2] = {7, N - 1};
    float *la = malloc(sizeof(float) * 2 * V), *lb = malloc(sizeof(float) * 2 * V);
    struct seq *su = new_seq(N), *sa;
    if (seq_new(al, N, &sa, err, sizeof err)) fail_msg("seq_new: %s", err);
    struct forward_opts o = {.logit_rows = rows, .n_logit_rows = 2, .logits = la};
    if (engine_forward(eng, su, t, N, &o, &a, err, sizeof err)) fail_msg("%s", err);
    o.logits = lb;
    if (engine_forward(al, sa, t, N, &o, &b, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(a, b);
    assert_memory_equal(la, lb, sizeof(float) * 2 * V);
    seq_free(su);
    seq_free(sa);
    free(la);
    free(lb);
    assert_int_equal(tiny_engine_close(adir, al), 0);
}

// The final norm and lm_head of backend_cpu.c, here from the weights: logits [V] of hidden x [H].
static void head(const float *x, float *logits) {
    const struct geometry *g = engine_geometry(eng);
    const struct model *m = engine_model(eng);
    const struct qtensor *W = &m->w.lm_head;
    const int H = g->hidden, per = 32 / W->bits, words = QWEN_GROUP / per;
    float hn[H], row[H], ss = 0;
    for (int i = 0; i < H; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)H + (float)g->rms_eps);
    for (int i = 0; i < H; i++) hn[i] = x[i] * r * m->w.final_norm[i];
    for (int n = 0; n < g->vocab; n++) {
        const size_t w0 = (size_t)n * qt_words_per_row(W), g0 = (size_t)n * qt_groups_per_row(W);
        for (int k = 0; k < H; k++) {
            const uint32_t word = qt_load_u32(W->w, w0 + k / QWEN_GROUP * words + k % QWEN_GROUP / per);
            const float q = (float)((word >> (k % per * W->bits)) & ((1u << W->bits) - 1));
            row[k] = bf16_to_f32(qt_load_u16(W->scales, g0 + k / QWEN_GROUP)) * q +
                     bf16_to_f32(qt_load_u16(W->biases, g0 + k / QWEN_GROUP));
        }
        float d = 0;
        for (int k = 0; k < H; k++) d += row[k] * hn[k];
        logits[n] = d;
    }
}

static double nerr(const float *a, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// The layer probe (tests/gpu/test_cuda_layers.c's CPU side): the embedding, then every layer in turn
// through engine_layer_probe, gives the hidden state engine_forward computes (its logits through the
// final norm and lm_head to 1e-6), updates the sequence's state as forward does (a decode step after
// it matches one after a prefill), asking for the router logits changes nothing, and bad calls are
// refused.
static void test_layer_probe_chain_equals_forward(void **state) {
    const struct geometry *g = engine_geometry(eng);
    const int H = g->hidden, E = g->n_experts;
    int32_t t[N + 1], a, b;
    char err[256];
    prompt(t, N + 1, 23);
    float *x = malloc(sizeof(float) * N * H), *y = malloc(sizeof(float) * N * H);
    float *rl = malloc(sizeof(float) * N * E), *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    struct seq *s1 = new_seq(N + 1), *s2 = new_seq(N + 1), *s3 = new_seq(N + 1);
    assert_int_equal(engine_embed(eng, t, N, x, err, sizeof err), ENGINE_OK);
    memcpy(y, x, sizeof(float) * N * H);
    for (int l = 0; l < g->n_layers; l++) {
        for (int i = 0; i < N * E; i++) rl[i] = NAN;
        assert_int_equal(engine_layer_probe(eng, s1, l, x, N, x, rl, err, sizeof err), ENGINE_OK);
        assert_int_equal(engine_layer_probe(eng, s3, l, y, N, y, NULL, err, sizeof err), ENGINE_OK);
        for (int i = 0; i < N * E; i++) assert_true(isfinite(rl[i]));
    }
    assert_memory_equal(x, y, sizeof(float) * N * H); // the router logits' copy changes nothing
    assert_int_equal(seq_pos(s1), 0);
    forward(s2, t, N, 0, N - 1, lb, &b);
    head(x + (size_t)(N - 1) * H, la);
    const double ne = nerr(la, lb, V);
    if (ne > 1e-6) fail_msg("probe chain vs forward: logits nerr %.3e > 1e-6", ne);
    // The state: the probe leaves the position to its caller (engine.h); advance it as forward does.
    s1->pos = N;
    forward(s1, &t[N], 1, 0, 0, la, &a);
    forward(s2, &t[N], 1, 0, 0, lb, &b);
    assert_int_equal(a, b);
    assert_memory_equal(la, lb, sizeof(float) * V);
    // Refused: a layer that does not exist, more rows than the sequence holds, no rows.
    assert_int_equal(engine_layer_probe(eng, s3, g->n_layers, y, 1, y, NULL, err, sizeof err), ENGINE_ERROR);
    assert_int_equal(engine_layer_probe(eng, s3, -1, y, 1, y, NULL, err, sizeof err), ENGINE_ERROR);
    assert_int_equal(engine_layer_probe(eng, s3, 0, y, N + 2, y, NULL, err, sizeof err), ENGINE_ERROR);
    assert_non_null(strstr(err, "capacity"));
    assert_int_equal(engine_layer_probe(eng, s3, 0, y, 0, y, NULL, err, sizeof err), ENGINE_ERROR);
    int32_t bad = (int32_t)V;
    assert_int_equal(engine_embed(eng, &bad, 1, y, err, sizeof err), ENGINE_ERROR);
    seq_free(s1);
    seq_free(s2);
    seq_free(s3);
    free(x);
    free(y);
    free(rl);
    free(la);
    free(lb);
}

static void test_unknown_backend(void **state) {
    struct engine *e;
    char err[256];
    struct engine_options o = {.backend = "tpu"};
    assert_int_equal(engine_open(dir, &o, &e, err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown backend \"tpu\""));
}

static int setup(void **state) {
    if (tiny_engine_open("engine", 5, dir, sizeof dir, &eng)) return -1;
    V = engine_geometry(eng)->vocab;
    return 0;
}

static int teardown(void **state) {
    return tiny_engine_close(dir, eng);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_equals_prefill),
        cmocka_unit_test(test_chunked_equals_unchunked),
        cmocka_unit_test(test_progress_per_chunk),
        cmocka_unit_test(test_short_split),
        cmocka_unit_test(test_snapshot_continues_identically),
        cmocka_unit_test(test_thread_count_does_not_matter),
        cmocka_unit_test(test_bad_input_refused_state_unchanged),
        cmocka_unit_test(test_out_of_memory_is_an_error),
        cmocka_unit_test(test_unaligned_equals_aligned),
        cmocka_unit_test(test_unknown_backend),
        cmocka_unit_test(test_layer_probe_chain_equals_forward),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
