// test_speculative.c: speculative decoding on the CPU engine (tiny geometry), where it must be exact:
//   - every row of a T-token forward has the logits of T decode steps, bit for bit
//   - engine_verify's argmax of every row is the decode steps' token, and engine_verify_keep of
//     every keep leaves the sequence as if only those tokens had been forwarded (the logits of the
//     next forward bit-identical, a second verification after it too, seq_copy of it too)
//   - the API's refusals (lengths, an unsettled verification)
//   - generate() with speculation gives the tokens, the text, the finish and the end state (the
//     session cache's) of generate() without it: prompts alone, the request's draft tokens (the
//     model's own continuation: accepted; corrupted: partly), ending by max_tokens, by a stop
//     string, by the reasoning budget's forced close and by cancellation in the middle of a draft;
//     with logprobs nothing is drafted.
// The stop-string case decodes with the real vocabulary (build/tokenizer/tokenizer.json or
// $CALLA_TOKENIZER_JSON; skipped without it, a failure under CI=true): the synthetic one decodes
// only the few ids below 448.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "generate.h"
#include "harness/bench.h"
#include "tiny_engine.h"
#include "tokenizer.h"

static char dir[256];
static struct engine *eng;
static struct tokenizer *synth_tok, *real_tok;
static int V;

enum { P = 24, CAP = 160 };

// The bench rule's tokens from position salt on.
static void prompt(int32_t *t, int n, uint32_t salt) {
    for (int i = 0; i < n; i++) t[i] = bench_prompt_token(i + salt, V);
}

static struct seq *new_seq(int cap) {
    struct seq *s;
    char err[256];
    if (seq_new(eng, cap, &s, err, sizeof err)) fail_msg("seq_new: %s", err);
    return s;
}

// n tokens; logits [n, V] of every row when not NULL; *next the last row's argmax.
static void forward_rows(struct seq *s, const int32_t *t, int n, float *logits, int32_t *next) {
    char err[256];
    int rows[64];
    for (int i = 0; i < n; i++) rows[i] = i;
    struct forward_opts o = {.logit_rows = rows, .n_logit_rows = logits ? n : 0, .logits = logits};
    if (engine_forward(eng, s, t, n, &o, next, err, sizeof err)) fail_msg("forward: %s", err);
}

// ---- the engine ----------------------------------------------------------------------------------

// Every row of one forward of T tokens == T decode steps, bit for bit: what makes a verification
// exact on this backend.
static void test_rows_equal_steps(void **state) {
    enum { T = 8 };
    int32_t t[P + T], a, b;
    prompt(t, P + T, 3);
    float *la = malloc(sizeof(float) * V * T), *lb = malloc(sizeof(float) * V * T);
    struct seq *s1 = new_seq(CAP), *s2 = new_seq(CAP);
    forward_rows(s1, t, P, NULL, &a);
    forward_rows(s2, t, P, NULL, &b);
    forward_rows(s1, t + P, T, la, &a);
    for (int i = 0; i < T; i++) forward_rows(s2, t + P + i, 1, lb + (size_t)i * V, &b);
    assert_int_equal(a, b);
    for (int i = 0; i < T; i++)
        if (memcmp(la + (size_t)i * V, lb + (size_t)i * V, sizeof(float) * V)) fail_msg("row %d differs", i);
    seq_free(s1);
    seq_free(s2);
    free(la);
    free(lb);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// For each length n and each keep: verify n tokens, keep some, then forward a token; the twin
// forwards the same tokens one at a time. The argmaxes, the next logits, a second verification
// after the keep and a copy of the kept sequence must all be the twin's.
static void test_verify_keep_every_keep(void **state) {
    const int lens[] = {2, 3, 5, 8};
    char err[256];
    assert_int_equal(engine_verify_max(eng), 8);
    int32_t t[P + 20];
    prompt(t, P + 20, 7);
    float *la = malloc(sizeof(float) * V * 8), *lb = malloc(sizeof(float) * V * 8);
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int n = lens[li];
        for (int keep = 1; keep <= n; keep++) {
            struct seq *s = new_seq(CAP), *twin = new_seq(CAP), *copy = new_seq(CAP);
            int32_t a, b, all[8];
            forward_rows(s, t, P, NULL, &a);
            forward_rows(twin, t, P, NULL, &b);
            if (engine_verify(eng, s, t + P, n, all, err, sizeof err)) fail_msg("verify: %s", err);
            assert_int_equal(seq_pos(s), P + n);
            for (int i = 0; i < n; i++) {
                forward_rows(twin, t + P + i, 1, lb, &b);
                if (all[i] != b) fail_msg("n %d: row %d argmax %d, decode step %d", n, i, all[i], b);
            }
            // The twin back to P + keep tokens: a fresh one.
            seq_free(twin);
            twin = new_seq(CAP);
            forward_rows(twin, t, P, NULL, &b);
            for (int i = 0; i < keep; i++) forward_rows(twin, t + P + i, 1, NULL, &b);
            if (engine_verify_keep(eng, s, keep, err, sizeof err)) fail_msg("keep: %s", err);
            assert_int_equal(seq_pos(s), P + keep);
            if (seq_copy(copy, s, err, sizeof err)) fail_msg("copy: %s", err);
            // Then a second verification of 3 from there (all kept), against 3 steps; and the copy.
            const int32_t *u = t + P + 10;
            if (engine_verify(eng, s, u, 3, all, err, sizeof err)) fail_msg("verify 2: %s", err);
            if (engine_verify_keep(eng, s, 3, err, sizeof err)) fail_msg("keep 2: %s", err);
            for (int i = 0; i < 3; i++) {
                forward_rows(twin, u + i, 1, lb, &b);
                if (all[i] != b || all[i] != argmax(lb, V)) fail_msg("n %d keep %d: second verify row %d", n, keep, i);
            }
            forward_rows(s, t + P + 15, 1, la, &a);
            forward_rows(twin, t + P + 15, 1, lb, &b);
            if (memcmp(la, lb, sizeof(float) * V)) fail_msg("n %d keep %d: the next logits differ", n, keep);
            forward_rows(copy, u, 3, NULL, &a);
            forward_rows(copy, t + P + 15, 1, la, &a);
            if (memcmp(la, lb, sizeof(float) * V)) fail_msg("n %d keep %d: the copy's next logits differ", n, keep);
            seq_free(s);
            seq_free(twin);
            seq_free(copy);
        }
    }
    free(la);
    free(lb);
}

static void test_verify_refusals(void **state) {
    char err[256];
    int32_t t[16], all[16], a;
    prompt(t, 16, 9);
    struct seq *s = new_seq(12), *c = new_seq(12);
    forward_rows(s, t, 4, NULL, &a);
    assert_int_equal(engine_verify(eng, s, t, 1, all, err, sizeof err), ENGINE_ERROR); // nothing to verify
    assert_int_equal(engine_verify(eng, s, t, 9, all, err, sizeof err), ENGINE_ERROR); // past verify_max
    assert_non_null(strstr(err, "2 to 8"));
    assert_int_equal(engine_verify_keep(eng, s, 1, err, sizeof err), ENGINE_ERROR); // no verification
    assert_int_equal(seq_pos(s), 4);
    int32_t bad[2] = {t[0], V};
    assert_int_equal(engine_verify(eng, s, bad, 2, all, err, sizeof err), ENGINE_ERROR);
    assert_int_equal(engine_verify(eng, s, t, 8, all, err, sizeof err), ENGINE_OK);          // 4 + 8 = 12: fits
    assert_int_equal(engine_forward(eng, s, t, 1, NULL, &a, err, sizeof err), ENGINE_ERROR); // unsettled
    assert_int_equal(engine_verify(eng, s, t, 2, all, err, sizeof err), ENGINE_ERROR);
    assert_int_equal(seq_copy(c, s, err, sizeof err), -1);
    assert_int_equal(engine_verify_keep(eng, s, 0, err, sizeof err), ENGINE_ERROR);
    assert_int_equal(engine_verify_keep(eng, s, 9, err, sizeof err), ENGINE_ERROR);
    assert_int_equal(engine_verify_keep(eng, s, 2, err, sizeof err), ENGINE_OK);
    assert_int_equal(seq_pos(s), 6);
    assert_int_equal(engine_verify(eng, s, t, 7, all, err, sizeof err), ENGINE_ERROR); // 6 + 7 > 12
    assert_non_null(strstr(err, "capacity"));
    seq_free(s);
    seq_free(c);
}

// ---- generate ------------------------------------------------------------------------------------

enum { MAXN = 64 };

// One generation's outcome, and the state it leaves.
struct outcome {
    int rc, n, stop, drafted, accepted, pos;
    enum gen_finish finish;
    int32_t ids[MAXN + 1];
    float *after; // [V] the logits of forwarding the last generated token from the end state
    struct sbuf text;
};

struct counter {
    int tokens, cancel_after; // cancel once this many tokens are out (0: never)
};
static void count_token(void *ctx, int32_t id) {
    ((struct counter *)ctx)->tokens++;
}
static bool counter_cancelled(void *arg) {
    const struct counter *c = arg;
    return c->cancel_after && c->tokens >= c->cancel_after;
}
static void keep_text(void *ctx, enum gen_channel ch, const char *s, size_t n) {
    sbuf_add(ctx, s, n);
}

struct sink_ctx {
    struct counter c;
    struct sbuf text;
};
static void sink_token(void *ctx, int32_t id) {
    count_token(&((struct sink_ctx *)ctx)->c, id);
}
static void sink_text(void *ctx, enum gen_channel ch, const char *s, size_t n) {
    keep_text(&((struct sink_ctx *)ctx)->text, ch, s, n);
}

static void generate_once(const struct gen_request *req, bool speculative, const struct tokenizer *tok,
                          int cancel_after, struct outcome *o) {
    struct seq *s = new_seq(CAP);
    struct sink_ctx k = {.c = {.cancel_after = cancel_after}};
    const struct gen_sink sink = {.ctx = &k, .token = sink_token, .text = sink_text};
    const struct gen_env env = {.e = eng,
                                .s = s,
                                .tok = tok,
                                .vocab = V,
                                .speculative = speculative,
                                .cancelled = counter_cancelled,
                                .arg = &k.c};
    struct gen_result res;
    memset(o, 0, sizeof *o);
    o->rc = generate(&env, req, 0, NULL, &sink, &res);
    o->n = res.n, o->finish = res.finish, o->stop = res.stop, o->drafted = res.drafted, o->accepted = res.accepted;
    o->pos = seq_pos(s);
    assert_true(res.n <= MAXN);
    if (res.n) memcpy(o->ids, res.ids, sizeof *res.ids * (size_t)res.n);
    o->text = k.text;
    if (o->rc == ENGINE_OK && res.n) { // the end state continues as the twin's
        int32_t nx;
        o->after = malloc(sizeof(float) * V);
        forward_rows(s, &res.ids[res.n - 1], 1, o->after, &nx);
    }
    free(res.ids);
    seq_free(s);
}

static void outcome_free(struct outcome *o) {
    free(o->after);
    sbuf_free(&o->text);
}

// The speculative outcome is the plain one: tokens, finish, state. Returns the speculative
// outcome's accepted count.
static int expect_same(const char *what, const struct gen_request *req, const struct tokenizer *tok, int cancel_after,
                       int *drafted) {
    struct outcome a, b;
    generate_once(req, false, tok, cancel_after, &a);
    generate_once(req, true, tok, cancel_after, &b);
    if (a.rc != b.rc || a.n != b.n || a.finish != b.finish || a.stop != b.stop)
        fail_msg("%s: plain rc %d n %d finish %d stop %d, speculative rc %d n %d finish %d stop %d", what, a.rc, a.n,
                 a.finish, a.stop, b.rc, b.n, b.finish, b.stop);
    if (memcmp(a.ids, b.ids, sizeof a.ids[0] * (size_t)a.n)) fail_msg("%s: the tokens differ", what);
    assert_int_equal(a.drafted, 0);
    if (a.rc == ENGINE_OK) {
        if (a.pos != b.pos) fail_msg("%s: end state at %d, plain %d", what, b.pos, a.pos);
        assert_int_equal(a.pos, req->n_prompt + a.n - 1); // every generated token but the last
        if (a.n && memcmp(a.after, b.after, sizeof(float) * V)) fail_msg("%s: the end states differ", what);
    }
    if (a.text.len != b.text.len || (a.text.len && memcmp(a.text.p, b.text.p, a.text.len)))
        fail_msg("%s: the texts differ", what);
    const int acc = b.accepted;
    if (drafted) *drafted = b.drafted;
    outcome_free(&a);
    outcome_free(&b);
    return acc;
}

// The model's plain continuation of req, decoded with tok.
static void continuation(const struct gen_request *req, const struct tokenizer *tok, int32_t *ids, int *n) {
    struct outcome o;
    generate_once(req, false, tok, 0, &o);
    assert_int_equal(o.rc, ENGINE_OK);
    memcpy(ids, o.ids, sizeof *ids * (size_t)o.n);
    *n = o.n;
    outcome_free(&o);
}

// A request on prompt p [n] that runs to max_tokens.
static struct gen_request request(int32_t *p, int n, int max_tokens) {
    return (struct gen_request){
        .prompt = p, .n_prompt = n, .max_tokens = max_tokens, .logprobs = -1, .ignore_stop = true};
}

// Prompts alone: a repetitive one and a hash one. This model (random weights) repeats neither its
// prompt nor itself, so the drafts come from the request's draft tokens below.
static void test_generate_prompt_only(void **state) {
    int32_t p[P];
    for (int i = 0; i < P; i++) p[i] = (int32_t)(100 + i % 5);
    struct gen_request r = request(p, P, 24);
    expect_same("repetitive prompt", &r, NULL, 0, NULL);
    prompt(p, P, 41);
    r = request(p, P, 24);
    expect_same("hash prompt", &r, NULL, 0, NULL);
}

// The request's draft tokens: the model's own continuation (all accepted), a corrupted copy (some),
// and every max_tokens, so the output ends at each place of a draft.
static void test_generate_request_draft(void **state) {
    int32_t p[P], cont[MAXN];
    int nc;
    prompt(p, P, 43);
    struct gen_request r = request(p, P, 40);
    continuation(&r, NULL, cont, &nc);
    assert_int_equal(nc, 40);
    r.draft = cont, r.n_draft = nc;
    int drafted, acc = expect_same("own continuation", &r, NULL, 0, &drafted);
    assert_true(acc >= 28); // the first draft comes after the first token; a few tokens are bonus ones
    assert_int_equal(acc, drafted);
    int32_t bad[MAXN];
    memcpy(bad, cont, sizeof bad[0] * (size_t)nc);
    for (int i = 3; i < nc; i += 4) bad[i] = (bad[i] + 1) % V;
    r.draft = bad;
    acc = expect_same("corrupted continuation", &r, NULL, 0, &drafted);
    assert_true(acc > 0 && acc < drafted);
    bad[5] = V; // an id outside the vocabulary: the draft is dropped, the request still served
    r.draft = bad;
    acc = expect_same("draft with a bad id", &r, NULL, 0, &drafted);
    assert_int_equal(acc, 0);
    r.draft = cont;
    for (int m = 1; m <= 14; m++) {
        char what[64];
        snprintf(what, sizeof what, "max_tokens %d", m);
        r.max_tokens = m;
        expect_same(what, &r, NULL, 0, NULL);
    }
    // Cancelled after k tokens: where a plain step would have noticed.
    r.max_tokens = 40;
    for (int k = 1; k <= 12; k += 3) {
        char what[64];
        snprintf(what, sizeof what, "cancelled after %d", k);
        expect_same(what, &r, NULL, k, NULL);
    }
}

// The reasoning budget forces "\n</think>" after 3 reasoning tokens: in the middle of a draft of
// what the model says without a budget (right up to there, and at the forced place too).
static void test_generate_reasoning_budget(void **state) {
    int32_t p[P], cont[MAXN];
    int nc;
    prompt(p, P, 47);
    struct gen_request r = request(p, P, 30);
    r.reasoning = true;
    continuation(&r, synth_tok, cont, &nc);
    r.reasoning_budget = 3; // the first draft (4 tokens, after the first token) holds the forced place
    r.draft = cont, r.n_draft = nc;
    const int acc = expect_same("reasoning budget", &r, synth_tok, 0, NULL);
    assert_true(acc > 0);
}

// A stop string in the middle of a draft (the real vocabulary, where every generated id has text).
static void test_generate_stop_string(void **state) {
    if (!real_tok) {
        const char *ci = getenv("CI");
        if (ci && *ci && strcmp(ci, "0") && strcmp(ci, "false")) fail_msg("the real vocabulary is missing in CI");
        print_message("SKIP: real vocabulary not built (tools/gen/fetch_tokenizer.sh)\n");
        skip();
    }
    int32_t p[P], cont[MAXN];
    int nc;
    prompt(p, P, 53);
    struct gen_request r = request(p, P, 40);
    continuation(&r, real_tok, cont, &nc);
    r.draft = cont, r.n_draft = nc;
    struct outcome o;
    generate_once(&r, false, real_tok, 0, &o);
    assert_true(o.text.len > 40);
    // A stop string from the middle of the text that does not occur before it.
    size_t at = o.text.len / 2;
    char stop[8];
    for (;; at++) {
        assert_true(at + 4 < o.text.len);
        memcpy(stop, o.text.p + at, 4);
        stop[4] = 0;
        if (!memmem(o.text.p, at + 3, stop, 4) && !memchr(stop, 0, 4)) break;
    }
    outcome_free(&o);
    assert_int_equal(gen_request_add_stop(&r, stop, 4), 0);
    expect_same("stop string", &r, real_tok, 0, NULL);
    struct outcome s;
    generate_once(&r, true, real_tok, 0, &s);
    assert_int_equal(s.finish, GEN_FINISH_STOP_SEQUENCE);
    assert_true(s.n < 40 && s.accepted > 0);
    outcome_free(&s);
    for (int i = 0; i < r.n_stops; i++) free(r.stops[i]);
    free(r.stops);
    free(r.stop_len);
}

// Logprobs and constraints turn speculation off: nothing is drafted.
static void test_generate_logprobs_plain(void **state) {
    int32_t p[P], cont[MAXN];
    int nc;
    prompt(p, P, 59);
    struct gen_request r = request(p, P, 12);
    continuation(&r, NULL, cont, &nc);
    r.draft = cont, r.n_draft = nc, r.logprobs = 2;
    float *row = engine_logits_alloc(eng, (size_t)V);
    struct seq *s = new_seq(CAP);
    const struct gen_env env = {.e = eng, .s = s, .vocab = V, .logits = row, .speculative = true};
    struct gen_result res;
    assert_int_equal(generate(&env, &r, 0, NULL, NULL, &res), ENGINE_OK);
    assert_int_equal(res.drafted, 0);
    assert_int_equal(res.n, 12);
    assert_memory_equal(res.ids, cont, sizeof cont[0] * 12);
    free(res.ids);
    seq_free(s);
    engine_logits_free(eng, row);
}

static int setup(void **state) {
    // One thread: the tiny geometry gains nothing from more, and a shared machine's spinning
    // OpenMP threads would make the many short forwards here slow (the results do not depend on it).
    omp_set_num_threads(1);
    if (tiny_engine_open("spec", 5, dir, sizeof dir, &eng)) return -1;
    V = engine_geometry(eng)->vocab;
    char err[256];
    if (tokenizer_load(dir, &synth_tok, err, sizeof err)) {
        fprintf(stderr, "tokenizer: %s\n", err);
        return -1;
    }
    const char *env = getenv("CALLA_TOKENIZER_JSON");
    const char *path = env && *env ? env : "build/tokenizer/tokenizer.json";
    if (access(path, R_OK) == 0 && tokenizer_load_file(path, &real_tok, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", path, err);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    tokenizer_free(synth_tok);
    tokenizer_free(real_tok);
    return tiny_engine_close(dir, eng) ? -1 : 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_equal_steps),       cmocka_unit_test(test_verify_keep_every_keep),
        cmocka_unit_test(test_verify_refusals),        cmocka_unit_test(test_generate_prompt_only),
        cmocka_unit_test(test_generate_request_draft), cmocka_unit_test(test_generate_reasoning_budget),
        cmocka_unit_test(test_generate_stop_string),   cmocka_unit_test(test_generate_logprobs_plain),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
