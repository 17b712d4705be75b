// test_sampling.c: opt-in sampling (--allow-sampling), from the host's choice of a token to the
// generation loop.
//
//   1. pick.c, the reference of every backend's draw (engine.h, struct engine_sampling), on rows
//      made here: greedy without sampling; top_k 1 and a temperature near 0 are the argmax; the
//      draws follow the softmax at the temperature (counts within 5 sigma); top_p, min_p and the
//      constraint's mask keep exactly the ids they should; the presence penalty moves the draw
//      off the ids seen; a draw is a function of (seed, step) alone.
//   2. generate() on the tiny synthetic checkpoint (CPU backend): the same seed gives the same
//      tokens, another seed others; temperature -> 0 and top_k 1 give the greedy output; logprobs
//      report the drawn tokens and change none of them; token i is pick.c's draw of step i from
//      the row after the tokens before it (the loop done by hand); the presence penalty reads the
//      ids generated so far.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "generate.h"
#include "pick.h"
#include "tiny_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- pick.c ---------------------------------------------------------------------------------------

enum { V = 512 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

// A row of V logits in [-4, 4) whose argmax (returned) leads the next one by at least 0.5.
static int row(float *x) {
    int best = 0;
    for (int i = 0; i < V; i++) {
        x[i] = (float)(8 * uniform() - 4);
        if (x[i] > x[best]) best = i;
    }
    x[best] += 0.5f;
    return best;
}

static int cmp_desc_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

static int32_t draw(const float *x, int n, const struct engine_sampling *s, uint64_t step, const uint32_t *allow,
                    const uint32_t *seen) {
    static float scratch[V];
    const struct engine_pick p = {.n_top = -1, .sampling = s, .step = step, .seen = seen};
    struct engine_choice c;
    assert_int_equal(pick_row(x, n, &p, allow, scratch, &c), 0);
    return c.chosen;
}

static void test_pick_limits(void **state) {
    float x[V];
    for (int r = 0; r < 20; r++) {
        const int best = row(x);
        struct engine_choice c;
        assert_int_equal(pick_row(x, V, &(struct engine_pick){.n_top = -1}, NULL, NULL, &c), 0);
        assert_int_equal(c.chosen, best); // greedy: the argmax
        assert_int_equal(c.greedy, best);
        for (uint64_t step = 0; step < 50; step++) {
            const struct engine_sampling k1 = {.temperature = 1, .top_p = 1, .top_k = 1, .seed = 7 + (uint64_t)r};
            const struct engine_sampling cold = {.temperature = 1e-3f, .top_p = 1, .seed = 7 + (uint64_t)r};
            assert_int_equal(draw(x, V, &k1, step, NULL, NULL), best);   // top_k 1: the argmax, whatever the draw
            assert_int_equal(draw(x, V, &cold, step, NULL, NULL), best); // temperature -> 0: the argmax
        }
    }
}

// The draws at temperature t over a small row follow softmax(x / t): each id's count within 5
// sigma of its expectation, over 20,000 steps of one seed.
static void test_pick_distribution(void **state) {
    const float x[6] = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
    const int n = 6, steps = 20000;
    for (int k = 0; k < 2; k++) {
        const float t = k ? 0.7f : 1.0f;
        const struct engine_sampling s = {.temperature = t, .top_p = 1, .seed = 12345};
        int count[6] = {0};
        for (int step = 0; step < steps; step++) count[draw(x, n, &s, (uint64_t)step, NULL, NULL)]++;
        double z = 0, p[6];
        for (int i = 0; i < n; i++) z += exp(x[i] / t);
        for (int i = 0; i < n; i++) {
            p[i] = exp(x[i] / t) / z;
            const double mean = steps * p[i], sd = sqrt(steps * p[i] * (1 - p[i]));
            if (fabs(count[i] - mean) > 5 * sd)
                fail_msg("t %.1f: id %d drawn %d times, expected %.0f +- %.0f", t, i, count[i], mean, sd);
        }
    }
}

// top_p, min_p, top_k and the mask keep exactly the ids they should; every kept id is drawn.
static void test_pick_cuts(void **state) {
    const float x[6] = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f}; // by probability: 2, 5, 1, 3, 0, 4
    const int n = 6;
    const struct {
        struct engine_sampling s;
        unsigned kept; // bit i: id i may be drawn
    } cases[] = {
        {{.temperature = 1, .top_p = 1, .top_k = 2}, 1u << 2 | 1u << 5},
        {{.temperature = 1, .top_p = 1, .top_k = 3}, 1u << 2 | 1u << 5 | 1u << 1},
        // softmax: 2 .43, 5 .26, 1 .16, 3 .10, 0 .06, 4 .02; top_p 0.5 needs 2 and 5
        {{.temperature = 1, .top_p = 0.5f}, 1u << 2 | 1u << 5},
        {{.temperature = 1, .top_p = 0.4f}, 1u << 2},
        // min_p 0.3: p_i >= 0.3 p_max, i.e. x_i >= 2 + ln 0.3 = 0.80
        {{.temperature = 1, .top_p = 1, .min_p = 0.3f}, 1u << 2 | 1u << 5 | 1u << 1},
        {{.temperature = 1, .top_p = 1}, 0x3f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct engine_sampling s = cases[c].s;
        s.seed = 99;
        unsigned seen_ids = 0;
        for (int step = 0; step < 4000; step++) {
            const int32_t id = draw(x, n, &s, (uint64_t)step, NULL, NULL);
            if (!(cases[c].kept >> id & 1))
                fail_msg("case %zu: drew %d, outside the kept set %#x", c, id, cases[c].kept);
            seen_ids |= 1u << id;
        }
        assert_int_equal(seen_ids, cases[c].kept);
    }
    // The constraint's mask applies first: only the allowed ids, drawn among themselves.
    float y[V];
    row(y);
    uint32_t allow[V / 32] = {0};
    for (int i = 0; i < V; i += 3) allow[i >> 5] |= 1u << (i & 31);
    const struct engine_sampling s = {.temperature = 2, .top_p = 1, .seed = 5};
    for (int step = 0; step < 500; step++) assert_int_equal(draw(y, V, &s, (uint64_t)step, allow, NULL) % 3, 0);
}

static void test_pick_penalty_and_seed(void **state) {
    float x[V];
    const int best = row(x);
    // The argmax seen, a penalty of 2 over its 0.5 lead, nearly greedy: the draw leaves it.
    uint32_t seen[V / 32] = {0};
    seen[best >> 5] |= 1u << (best & 31);
    const struct engine_sampling pen = {.temperature = 1e-3f, .top_p = 1, .presence_penalty = 2, .seed = 1};
    const struct engine_sampling none = {.temperature = 1e-3f, .top_p = 1, .seed = 1};
    for (int step = 0; step < 20; step++) {
        assert_int_not_equal(draw(x, V, &pen, (uint64_t)step, NULL, seen), best);
        assert_int_equal(draw(x, V, &none, (uint64_t)step, NULL, seen), best); // no penalty: seen changes nothing
    }
    // A draw is a function of (seed, step): the same pair, the same id; two seeds, two streams.
    const struct engine_sampling a = {.temperature = 1.5f, .top_p = 1, .seed = 1},
                                 b = {.temperature = 1.5f, .top_p = 1, .seed = 2};
    int differ = 0;
    for (uint64_t step = 0; step < 64; step++) {
        assert_int_equal(draw(x, V, &a, step, NULL, NULL), draw(x, V, &a, step, NULL, NULL));
        differ += draw(x, V, &a, step, NULL, NULL) != draw(x, V, &b, step, NULL, NULL);
    }
    assert_true(differ > 32);
}

// The definition of engine.h's struct engine_sampling written out with a sort of the whole row:
// what pick.c computes with its histogram and a sort of the top bins only.
static int by_definition(const float *x, int n, const struct engine_sampling *s, uint64_t step, const uint32_t *allow,
                         const uint32_t *seen) {
    float *z = malloc(sizeof *z * (size_t)n), *w = malloc(sizeof *w * (size_t)n), *zs = malloc(sizeof *zs * (size_t)n);
    bool *keep = calloc((size_t)n, sizeof *keep);
    assert_true(z && w && zs && keep);
    int best = -1, m = 0;
    for (int i = 0; i < n; i++) {
        keep[i] = (!allow || (allow[i >> 5] >> (i & 31) & 1u)) && !isnan(x[i]);
        if (!keep[i]) continue;
        const float l = x[i] - (seen && (seen[i >> 5] >> (i & 31) & 1u) ? s->presence_penalty : 0.0f);
        z[i] = l / s->temperature;
        if (best < 0 || z[i] > z[best]) best = i;
        zs[m++] = z[i];
    }
    qsort(zs, (size_t)m, sizeof *zs, cmp_desc_float);
    const float zk = s->top_k > 0 && s->top_k < m ? zs[s->top_k - 1] : -INFINITY;
    int nk = 0;
    for (int i = 0; i < n; i++) {
        if (!keep[i]) continue;
        w[i] = z[i] - z[best] >= -87.0f ? expf(z[i] - z[best]) : 0.0f;
        keep[i] = z[i] >= zk && w[i] >= s->min_p && w[i] > 0;
        if (keep[i]) zs[nk++] = z[i];
    }
    if (s->top_p < 1.0f) { // the largest tau whose ids hold top_p of the kept mass
        double mass = 0, acc = 0;
        for (int i = 0; i < n; i++) mass += keep[i] ? w[i] : 0;
        qsort(zs, (size_t)nk, sizeof *zs, cmp_desc_float);
        for (int j = 0; j < nk; j++) {
            acc += zs[j] - z[best] >= -87.0f ? expf(zs[j] - z[best]) : 0.0f;
            if (acc >= s->top_p * mass) {
                for (int i = 0; i < n; i++) keep[i] = keep[i] && z[i] >= zs[j];
                break;
            }
        }
    }
    double mass = 0, acc = 0;
    for (int i = 0; i < n; i++) mass += keep[i] ? w[i] : 0;
    const double target = pick_uniform(s->seed, step) * mass;
    int id = best;
    for (int i = 0; i < n; i++) {
        if (!keep[i]) continue;
        acc += w[i];
        id = i;
        if (acc > target) break;
    }
    free(z), free(w), free(zs), free(keep);
    return id;
}

// pick.c's draw is the definition's, id for id, on rows of the vocabulary's size and on small ones:
// Gaussian logits of several spreads, rows of many equal values, masks, penalties, and every cut
// alone and together. The two add their masses in different orders, which could move a draw only
// where u or top_p lies within a rounding (~1e-16) of a boundary: exact equality is the right test.
static void test_pick_is_the_definition(void **state) {
    enum { VF = 248320 };
    float *x = malloc(sizeof *x * VF), *scratch = malloc(sizeof *scratch * VF);
    uint32_t *allow = malloc(sizeof *allow * (VF / 32)), *seen_ids = malloc(sizeof *seen_ids * (VF / 32));
    assert_true(x && scratch && allow && seen_ids);
    const float temps[] = {0.3f, 0.7f, 1.0f, 1.6f}, top_ps[] = {1.0f, 0.95f, 0.8f, 0.3f},
                min_ps[] = {0.0f, 0.05f, 0.5f};
    const int top_ks[] = {0, 1, 20, 400};
    int checked = 0;
    for (int r = 0; r < 24; r++) {
        const int n = r % 6 ? 4096 : VF;
        const double spread = 0.5 + r % 4 * 1.5;
        for (int i = 0; i < n; i++) {
            const double g = sqrt(-2 * log(uniform() + 1e-300)) * cos(6.283185307179586 * uniform());
            x[i] = r % 5 == 4 ? (float)floor(g * 2) : (float)(spread * g); // (r % 5 == 4: ties everywhere)
        }
        if (r % 7 == 3) x[n / 2] = NAN;
        for (int i = 0; i < n / 32; i++) allow[i] = r % 2 ? (uint32_t)(uniform() * 4294967296.0) : ~0u;
        for (int i = 0; i < n / 32; i++) seen_ids[i] = (uint32_t)(uniform() * 4294967296.0) & 0x01010101u;
        for (int c = 0; c < 12; c++) {
            const struct engine_sampling s = {.temperature = temps[(r + c) % 4],
                                              .top_p = top_ps[c % 4],
                                              .top_k = top_ks[(c / 4 + r) % 4],
                                              .min_p = min_ps[(c + r / 3) % 3],
                                              .presence_penalty = r % 3 == 1 ? 1.5f : 0.0f,
                                              .seed = (uint64_t)(r * 100 + c)};
            for (uint64_t step = 0; step < 3; step++) {
                const struct engine_pick p = {.n_top = -1, .sampling = &s, .step = step, .seen = seen_ids};
                struct engine_choice ch;
                assert_int_equal(pick_row(x, n, &p, allow, scratch, &ch), 0);
                const int want = by_definition(x, n, &s, step, allow, seen_ids);
                if (ch.chosen != want)
                    fail_msg("row %d (n %d) t %.1f top_p %.2f top_k %d min_p %.2f step %d: %d, the definition %d", r, n,
                             s.temperature, s.top_p, s.top_k, s.min_p, (int)step, ch.chosen, want);
                checked++;
            }
        }
    }
    printf("pick.c = the definition on %d draws\n", checked);
    free(x), free(scratch), free(allow), free(seen_ids);
}

// ---- generate() on the tiny checkpoint -------------------------------------------------------------

static struct engine *eng;
static char dir[256];

static int setup(void **state) {
    return tiny_engine_open("sampling", 3, dir, sizeof dir, &eng);
}
static int teardown(void **state) {
    return tiny_engine_close(dir, eng);
}

enum { N_GEN = 16 };
static const int32_t prompt[] = {11, 2024, 7, 31337, 5, 900};
enum { N_PROMPT = sizeof prompt / sizeof prompt[0] };

struct lp_sink {
    int32_t ids[N_GEN + 1];
    int n;
};

static int on_logprobs(void *ctx, const struct token_lp *lp) {
    struct lp_sink *k = ctx;
    if (k->n <= N_GEN) k->ids[k->n++] = lp->id;
    return 0;
}

// N_GEN tokens after a fixed prompt under s (NULL: greedy) -> out; logprobs on: the ids they report
// -> *lps (when not NULL).
static void gen(const struct gen_sampling *s, bool logprobs, int32_t *out, struct lp_sink *lps) {
    char err[256];
    struct seq *sq;
    assert_int_equal(seq_new(eng, 128, &sq, err, sizeof err), 0);
    const int vocab = engine_geometry(eng)->vocab;
    float *logits = engine_logits_alloc(eng, (size_t)vocab);
    assert_non_null(logits);
    struct gen_request r = {.prompt = (int32_t *)prompt,
                            .n_prompt = N_PROMPT,
                            .max_tokens = N_GEN,
                            .ignore_stop = true,
                            .logprobs = logprobs ? 2 : -1};
    if (s) r.sampling = *s;
    const struct gen_env env = {.e = eng, .s = sq, .logits = logits, .vocab = vocab};
    struct lp_sink dummy = {0};
    const struct gen_sink sink = {.ctx = lps ? lps : &dummy, .logprobs = on_logprobs};
    struct gen_result res;
    assert_int_equal(generate(&env, &r, 0, NULL, &sink, &res), ENGINE_OK);
    assert_int_equal(res.n, N_GEN);
    memcpy(out, res.ids, sizeof *out * N_GEN);
    free(res.ids);
    engine_logits_free(eng, logits);
    seq_free(sq);
}

static bool same(const int32_t *a, const int32_t *b) {
    return !memcmp(a, b, sizeof *a * N_GEN);
}

// The greedy output, made once.
static const int32_t *greedy_ids(void) {
    static int32_t ids[N_GEN];
    static bool made;
    if (!made) gen(NULL, false, ids, NULL);
    made = true;
    return ids;
}

static void test_generate_sampled(void **state) {
    const int32_t *greedy = greedy_ids();
    int32_t a[N_GEN], b[N_GEN], c[N_GEN], t0[N_GEN], k1[N_GEN], lp[N_GEN];
    const struct gen_sampling s = {.on = true, .temperature = 1.0f, .top_p = 1, .seed = 42, .has_seed = true};
    gen(&s, false, a, NULL);
    gen(&s, false, b, NULL);
    assert_true(same(a, b));       // the same seed: the same tokens
    assert_false(same(a, greedy)); // and drawn, not the argmax
    struct gen_sampling s2 = s;
    s2.seed = 43;
    gen(&s2, false, c, NULL);
    assert_false(same(a, c)); // another seed: other tokens
    struct gen_sampling cold = s;
    cold.temperature = 1e-4f;
    gen(&cold, false, t0, NULL);
    assert_true(same(t0, greedy)); // temperature -> 0: greedy
    struct gen_sampling top1 = s;
    top1.top_k = 1;
    gen(&top1, false, k1, NULL);
    assert_true(same(k1, greedy)); // top_k 1: greedy
    // With logprobs the engine reports the row besides the draw: the same tokens, and the ids the
    // logprobs name are the drawn ones.
    struct lp_sink lps = {0};
    gen(&s, true, lp, &lps);
    assert_true(same(lp, a));
    assert_int_equal(lps.n, N_GEN);
    assert_memory_equal(lps.ids, a, sizeof a);
}

// The loop by hand on the engine's rows: each step the row after the tokens so far, penalized
// (penalty at every id already taken) and chosen by pick.c as step i of s's stream (s NULL: the
// argmax of the penalized row, by hand).
static void by_hand(const struct engine_sampling *s, float penalty, int32_t *out) {
    char err[256];
    struct seq *sq;
    assert_int_equal(seq_new(eng, 128, &sq, err, sizeof err), 0);
    const int vocab = engine_geometry(eng)->vocab;
    float *x = malloc(sizeof *x * (size_t)vocab), *scratch = malloc(sizeof *scratch * (size_t)vocab);
    uint32_t *seen = calloc(((size_t)vocab + 31) / 32, sizeof *seen);
    assert_true(x && scratch && seen);
    const struct engine_pick greedy = {.n_top = -1};
    struct engine_choice ch;
    const struct forward_opts fo = {.pick = &greedy, .choice = &ch};
    int32_t next;
    assert_int_equal(engine_forward(eng, sq, prompt, N_PROMPT, &fo, &next, err, sizeof err), ENGINE_OK);
    for (int i = 0; i < N_GEN; i++) {
        assert_int_equal(engine_last_logits(eng, x, err, sizeof err), 0);
        int best = 0;
        if (s) {
            const struct engine_pick p = {.n_top = -1, .sampling = s, .step = (uint64_t)i, .seen = seen};
            assert_int_equal(pick_row(x, vocab, &p, NULL, scratch, &ch), 0);
            best = ch.chosen;
        } else {
            for (int k = 0; k < vocab; k++) {
                x[k] -= seen[k >> 5] >> (k & 31) & 1 ? penalty : 0.0f;
                if (x[k] > x[best]) best = k;
            }
        }
        out[i] = best;
        seen[best >> 5] |= 1u << (best & 31);
        if (i + 1 < N_GEN)
            assert_int_equal(engine_forward(eng, sq, &out[i], 1, &fo, &next, err, sizeof err), ENGINE_OK);
    }
    free(x), free(scratch), free(seen);
    seq_free(sq);
}

// Token i is the draw of step i of the request's seed, from the row after the tokens before it.
static void test_generate_is_the_draw(void **state) {
    const struct engine_sampling es = {.temperature = 0.8f, .top_p = 0.95f, .top_k = 50, .seed = 7};
    const struct gen_sampling s = {
        .on = true, .temperature = 0.8f, .top_p = 0.95f, .top_k = 50, .seed = 7, .has_seed = true};
    int32_t ref[N_GEN], got[N_GEN];
    by_hand(&es, 0, ref);
    gen(&s, false, got, NULL);
    for (int i = 0; i < N_GEN; i++) assert_int_equal(got[i], ref[i]);
    assert_false(same(got, greedy_ids()));
}

// The presence penalty reads the ids generated so far: greedy under a penalty (top_k 1), against
// the same done by hand.  A large negative penalty (past the API's -2: the tiny checkpoint's top
// logits lie far apart), which favours the ids already taken, so that the output surely differs
// from the greedy one.
static void test_generate_presence_penalty(void **state) {
    const float penalty = -20;
    int32_t ref[N_GEN], pen[N_GEN];
    by_hand(NULL, penalty, ref);
    if (same(ref, greedy_ids())) fail_msg("the penalty changes nothing here: the test says nothing (another prompt)");
    const struct gen_sampling s = {
        .on = true, .temperature = 1, .top_p = 1, .top_k = 1, .presence_penalty = penalty, .seed = 1};
    gen(&s, false, pen, NULL);
    for (int i = 0; i < N_GEN; i++) assert_int_equal(pen[i], ref[i]);
}

int main(void) {
    const struct CMUnitTest pick[] = {
        cmocka_unit_test(test_pick_limits),
        cmocka_unit_test(test_pick_distribution),
        cmocka_unit_test(test_pick_cuts),
        cmocka_unit_test(test_pick_penalty_and_seed),
        cmocka_unit_test(test_pick_is_the_definition),
    };
    const struct CMUnitTest loop[] = {
        cmocka_unit_test(test_generate_sampled),
        cmocka_unit_test(test_generate_is_the_draw),
        cmocka_unit_test(test_generate_presence_penalty),
    };
    int failed = cmocka_run_group_tests_name("pick.c", pick, NULL, NULL);
    return failed + cmocka_run_group_tests_name("generate, tiny checkpoint", loop, setup, teardown);
}
