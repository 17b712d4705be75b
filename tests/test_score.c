// test_score.c: `calla score` on the tiny geometry with the CPU backend: the scores are the
// engine's own log-softmax, independent of how the sequence is cut; a run compared with itself
// gives KL 0, agreement 1 and no logit error (top-k and full rows); a perturbed reference is
// detected; --decode-from (the later tokens one at a time through the decode path) gives the same
// rows as prefill; bad input (files, token ids, lengths, reference JSON) fails cleanly with exit status 2.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "score.h"
#include "tiny_engine.h"

static char dir[256], tok_path[300], ref_path[300], tmp_path[300];
static struct engine *eng;
static int V;

enum { N = 40 };

static void prompt(int32_t *t, int n) { // the bench rule (docs/BENCH.md)
    for (int i = 0; i < n; i++) t[i] = (int32_t)(((uint64_t)i * 2654435761u & 0xffffffffu) % (uint32_t)V);
}

static void score_from(const int32_t *t, int n, int k, int chunk, bool full, int decode_from,
                       const struct score_run *ref, struct score_run *r, struct score_cmp *c) {
    char err[512];
    struct score_options o = {.top_k = k, .chunk = chunk, .full_logits = full, .decode_from = decode_from, .ref = ref};
    if (score_sequence(eng, t, n, &o, r, c, err, sizeof err)) fail_msg("score: %s", err);
}

static void score(const int32_t *t, int n, int k, int chunk, bool full, const struct score_run *ref,
                  struct score_run *r, struct score_cmp *c) {
    score_from(t, n, k, chunk, full, 0, ref, r, c);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void write_tokens(const char *path, const int32_t *t, int n) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) fprintf(f, i % 10 == 9 ? "%d\n" : "%d, ", t[i]);
    fclose(f);
}

// `calla score ARGS...`, its exit status.
static int cli(const char *a0, ...) {
    char *argv[24] = {"score"};
    int argc = 1;
    va_list ap;
    va_start(ap, a0);
    for (const char *a = a0; a && argc < 23; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
    va_end(ap);
    return cmd_score(argc, argv);
}

// Each position's log-probability is the log-softmax of the engine's own row at the next token.
static void test_scores_are_the_engine_log_softmax(void **state) {
    int32_t t[N], next;
    prompt(t, N);
    struct score_run r;
    score(t, N, 8, 0, false, NULL, &r, NULL);
    const int rows[3] = {0, 17, N - 2};
    float *lg = malloc(sizeof(float) * 3 * (size_t)V);
    struct seq *s;
    char err[256];
    assert_int_equal(seq_new(eng, N, &s, err, sizeof err), 0);
    struct forward_opts fo = {.logit_rows = rows, .n_logit_rows = 3, .logits = lg};
    assert_int_equal(engine_forward(eng, s, t, N - 1, &fo, &next, err, sizeof err), 0);
    for (int j = 0; j < 3; j++) {
        const int p = rows[j];
        const float *row = lg + (size_t)j * V;
        double mx = -INFINITY, sum = 0;
        int best = 0;
        for (int v = 0; v < V; v++) {
            mx = row[v] > mx ? row[v] : mx;
            if (row[v] > row[best]) best = v;
        }
        for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
        double lp = row[t[p + 1]] - mx - log(sum);
        // lse is stored in fp32: |lse| ~ 20 has a rounding step of 2e-6
        assert_true(fabs(((double)r.target[p] - r.lse[p]) - lp) < 1e-5);
        assert_int_equal(r.top_ids[(size_t)p * 8], best);
        for (int k = 1; k < 8; k++) assert_true(r.top_logits[(size_t)p * 8 + k - 1] >= r.top_logits[(size_t)p * 8 + k]);
    }
    struct score_totals tt = score_totals_of(&r);
    double nll = 0;
    for (int p = 0; p < N - 1; p++) nll -= ((double)r.target[p] - r.lse[p]) / (N - 1);
    assert_int_equal(tt.positions, N - 1);
    assert_true(fabs(tt.nll - nll) < 1e-9);
    assert_true(fabs(tt.perplexity - exp(nll)) < 1e-6 * exp(nll));
    seq_free(s);
    free(lg);
    score_run_free(&r);
}

// Forward calls of 13 tokens or of all of them: the same numbers, bit for bit.
static void test_chunk_does_not_matter(void **state) {
    int32_t t[N];
    prompt(t, N);
    struct score_run a, b;
    score(t, N, 16, 13, false, NULL, &a, NULL);
    score(t, N, 16, 0, false, NULL, &b, NULL);
    assert_memory_equal(a.lse, b.lse, sizeof(float) * (N - 1));
    assert_memory_equal(a.target, b.target, sizeof(float) * (N - 1));
    assert_memory_equal(a.top_ids, b.top_ids, sizeof(int32_t) * 16 * (N - 1));
    assert_memory_equal(a.top_logits, b.top_logits, sizeof(float) * 16 * (N - 1));
    score_run_free(&a);
    score_run_free(&b);
}

// --decode-from D: tokens 0..D-1 as prefill (here in chunks of 7), tokens D..N-2 one at a time
// through engine_forward with n = 1 (the decode path). On the CPU backend the two give the same
// rows bit for bit, whole rows compared (measured: largest logit difference 0): backend_cpu.c
// runs one forward pass for any T (the DeltaNet's token-by-token delta rule for prefill and decode
// alike), and every output is one accumulator in a fixed order, whatever the tokens of a call. So
// the tolerance is 0: any difference is a bug in how score feeds the tokens (a skipped or
// repeated token, a row taken from the wrong call), not rounding. On CUDA the decode kernels are
// another path and differ by rounding; tools/device/score_gate.py --greedy measures that against HF.
static void test_decode_from_equals_prefill(void **state) {
    int32_t t[N];
    prompt(t, N);
    struct score_run a, b;
    const int from[] = {1, 13, 25, N - 2, N - 1};
    score(t, N, 16, 0, true, NULL, &a, NULL);
    for (size_t j = 0; j < sizeof from / sizeof *from; j++) {
        score_from(t, N, 16, 7, true, from[j], NULL, &b, NULL);
        double worst = 0;
        for (size_t i = 0; i < (size_t)(N - 1) * V; i++) {
            double d = fabs((double)a.full[i] - b.full[i]);
            worst = d > worst ? d : worst;
        }
        printf("    decode from %d: largest logit difference from the prefill run %.3g\n", from[j], worst);
        assert_true(worst == 0);
        assert_int_equal(b.decode_from, from[j]);
        for (int p = 0; p < N - 1; p++) assert_int_equal(a.top_ids[(size_t)p * 16], b.top_ids[(size_t)p * 16]);
        assert_memory_equal(a.lse, b.lse, sizeof(float) * (N - 1));
        assert_memory_equal(a.target, b.target, sizeof(float) * (N - 1));
        assert_memory_equal(a.top_logits, b.top_logits, sizeof(float) * 16 * (N - 1));
        score_run_free(&b);
    }
    score_run_free(&a);
    // Out of range: refused with a message naming the value, nothing allocated.
    char err[512];
    struct score_options o = {.top_k = 16, .decode_from = N};
    assert_int_equal(score_sequence(eng, t, N, &o, &b, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "--decode-from 40 is out of range"));
    o.decode_from = -3;
    assert_int_equal(score_sequence(eng, t, N, &o, &b, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "-3"));
}

// Scores t[0..n) into a, and a's JSON read back into ref.
static void scored_reference(const int32_t *t, int n, bool full, struct score_run *a, struct score_run *ref) {
    char err[512];
    score(t, n, 16, 0, full, NULL, a, NULL);
    if (score_write_json(ref_path, a, NULL, NULL, dir, err, sizeof err) ||
        score_read_json(ref_path, ref, err, sizeof err))
        fail_msg("%s", err);
}

// Written, read back as the reference, scored again: KL exactly 0, agreement 1, no logit error.
static void self_comparison(int n, bool full) {
    int32_t t[N];
    prompt(t, n);
    struct score_run a, ref, b;
    struct score_cmp c;
    scored_reference(t, n, full, &a, &ref);
    assert_int_equal(ref.n_tokens, n);
    assert_int_equal(!!ref.full, full);
    assert_memory_equal(ref.top_logits, a.top_logits, sizeof(float) * 16 * (size_t)(n - 1)); // %.9g round-trips
    score(t, n, 16, 0, false, &ref, &b, &c);
    assert_int_equal(c.positions, n - 1);
    assert_true(c.kl_mean == 0 && c.kl_p999 == 0 && c.kl_max == 0);
    assert_int_equal(c.top1_same, n - 1);
    assert_int_equal(c.top1_same_clear, c.n_clear);
    assert_true(c.nle_max == 0 && c.nle_all == 0);
    assert_true(full ? c.tail_max == 0 : c.tail_max > 0 && c.tail_max < 1); // a random model's rows are flat
    score_run_free(&a);
    score_run_free(&b);
    score_run_free(&ref);
    score_cmp_free(&c);
}

static void test_self_comparison(void **state) {
    self_comparison(N, false);
}
static void test_self_comparison_full_rows(void **state) {
    self_comparison(6, true);
}

// A reference whose top two are swapped at every third position, and whose logits are shifted at
// one position, is told apart: agreement drops by exactly those positions, KL and error rise.
static void test_perturbed_reference_detected(void **state) {
    int32_t t[N];
    prompt(t, N);
    struct score_run a, ref, b;
    struct score_cmp c;
    scored_reference(t, N, false, &a, &ref);
    int swapped = 0;
    for (int p = 0; p < N - 1; p += 3, swapped++) {
        int32_t *id = ref.top_ids + (size_t)p * 16;
        int32_t x = id[0];
        id[0] = id[1], id[1] = x;
    }
    for (int k = 0; k < 16; k++) ref.top_logits[5 * 16 + k] += 0.5f;
    score(t, N, 16, 0, false, &ref, &b, &c);
    assert_int_equal(c.top1_same, N - 1 - swapped);
    assert_true(c.kl_max > 1e-3);
    assert_true(c.kl_mean > 0);
    assert_true(c.nle_max > 1e-3);
    assert_true(c.kl[1] == 0); // an untouched position
    score_run_free(&a);
    score_run_free(&b);
    score_run_free(&ref);
    score_cmp_free(&c);
}

// The command end to end: a clean run with a reference writes JSON; every kind of bad input
// returns 2 with a message and no crash.
static void test_command_and_bad_input(void **state) {
    int32_t t[N];
    prompt(t, N);
    write_tokens(tok_path, t, N);
    assert_int_equal(cli("--model", dir, "--tokens", tok_path, "--backend", "cpu", "--json", ref_path, NULL), 0);
    assert_int_equal(
        cli("--model", dir, "--tokens", tok_path, "--backend", "cpu", "--reference", ref_path, "--top-k", "4", NULL),
        0);
    assert_int_equal(cli("--model", dir, "--tokens", "/nonexistent/tokens", "--backend", "cpu", NULL), 2);
    assert_int_equal(cli("--model", dir, "--text", "/nonexistent/text", "--backend", "cpu", NULL), 2);
    assert_int_equal(cli("--model", dir, "--backend", "cpu", NULL), 2);
    assert_int_equal(cli("--model", dir, "--tokens", tok_path, "--top-k", "0", NULL), 2);
    assert_int_equal(cli("--model", dir, "--tokens", tok_path, "--backend", "cpu", "--decode-from", "30", "--reference",
                         ref_path, "--json", tmp_path, NULL),
                     0);
    assert_int_equal(cli("--model", dir, "--tokens", tok_path, "--backend", "cpu", "--decode-from", "40", NULL), 2);
    assert_int_equal(cli("--model", dir, "--tokens", tok_path, "--backend", "cpu", "--decode-from", "0", NULL), 2);
    assert_int_equal(cli("--model", dir, "--tokens", tok_path, "--backend", "cpu", "--decode-from", "x", NULL), 2);
    const char *bad_tokens[] = {"1 2 248320", "1 2 -3", "1, 2, x", "7", "", "1 2 99999999999999999999"};
    for (size_t i = 0; i < sizeof bad_tokens / sizeof *bad_tokens; i++) {
        write_text(tmp_path, bad_tokens[i]);
        assert_int_equal(cli("--model", dir, "--tokens", tmp_path, "--backend", "cpu", NULL), 2);
    }
    char err[512];
    int32_t *ids;
    int n;
    write_text(tmp_path, "1 2 248320");
    assert_int_equal(score_read_tokens(tmp_path, V, &ids, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "outside the vocabulary"));
    FILE *f = fopen(tmp_path, "w"); // one token more than the context
    for (int i = 0; i <= QWEN_MAX_CTX; i++) fputs("1 ", f);
    fclose(f);
    assert_int_equal(score_read_tokens(tmp_path, V, &ids, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "more than"));
    // References: not JSON, not a score file, wrong fields, another sequence.
    const char *bad_refs[] = {
        "{\"format\": \"calla-score\", \"version\": 1,",
        "[1, 2, 3]",
        "{\"format\": \"calla-score\", \"version\": 2, \"vocab\": 248320, \"top_k\": 1, \"n_tokens\": 2}",
        "{\"format\": \"calla-score\", \"version\": 1, \"vocab\": 248320, \"top_k\": 1, \"n_tokens\": 2, "
        "\"tokens\": [1, 2], \"positions\": []}",
        "{\"format\": \"calla-score\", \"version\": 1, \"vocab\": 248320, \"top_k\": 1, \"n_tokens\": 2, "
        "\"tokens\": [1, 2], \"positions\": [{\"lse\": 1, \"target\": 0, \"ids\": [248320], \"logits\": [0]}]}",
        "{\"format\": \"calla-score\", \"version\": 1, \"vocab\": 248320, \"top_k\": 1, \"n_tokens\": 2, "
        "\"tokens\": [1, 2], \"positions\": [{\"lse\": 1, \"target\": 0, \"ids\": [3], \"logits\": [\"x\"]}]}",
        "{\"format\": \"calla-score\", \"version\": 1, \"vocab\": 248320, \"top_k\": 1, \"n_tokens\": 2, "
        "\"tokens\": [1, 2], \"positions\": [{\"lse\": 1, \"target\": 0, \"ids\": [3], \"logits\": [0]}]}",
    };
    for (size_t i = 0; i < sizeof bad_refs / sizeof *bad_refs; i++) {
        write_text(tmp_path, bad_refs[i]);
        struct score_run r;
        int rc = score_read_json(tmp_path, &r, err, sizeof err);
        if (rc == 0) { // the last one is well-formed: it fails only against another sequence
            assert_int_equal(score_check_reference(&r, t, N, V, err, sizeof err), -1);
            score_run_free(&r);
        }
        printf("    refused: %s\n", err);
        assert_int_equal(cli("--model", dir, "--tokens", tok_path, "--backend", "cpu", "--reference", tmp_path, NULL),
                         2);
    }
    // The same tokens, one shorter: a length mismatch.
    write_tokens(tmp_path, t, N - 1);
    assert_int_equal(cli("--model", dir, "--tokens", tmp_path, "--backend", "cpu", "--reference", ref_path, NULL), 2);
    f = fopen(tmp_path, "w");
    for (int i = 0; i < SCORE_FULL_MAX_POSITIONS + 2; i++) fprintf(f, "%d ", i);
    fclose(f);
    assert_int_equal(cli("--model", dir, "--tokens", tmp_path, "--backend", "cpu", "--full-logits", NULL), 2);
}

static int setup(void **state) {
    if (tiny_engine_open("score", 3, dir, sizeof dir, &eng)) return -1;
    snprintf(tok_path, sizeof tok_path, "%s.tokens", dir);
    snprintf(ref_path, sizeof ref_path, "%s.ref.json", dir);
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", dir);
    V = engine_geometry(eng)->vocab;
    return 0;
}

static int teardown(void **state) {
    unlink(tok_path);
    unlink(ref_path);
    unlink(tmp_path);
    return tiny_engine_close(dir, eng);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scores_are_the_engine_log_softmax),
        cmocka_unit_test(test_chunk_does_not_matter),
        cmocka_unit_test(test_decode_from_equals_prefill),
        cmocka_unit_test(test_self_comparison),
        cmocka_unit_test(test_self_comparison_full_rows),
        cmocka_unit_test(test_perturbed_reference_detected),
        cmocka_unit_test(test_command_and_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
