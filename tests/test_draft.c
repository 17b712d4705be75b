// test_draft.c: the prompt-lookup drafter (src/draft.c): which occurrence it copies from (the
// longest n-gram, the latest, the cursor's), the extra sources, the repetition past the end of the
// history, the adaptive length, the gate; then a synthetic edit task replayed against it with a
// cost model of verification: a file of code-like lines rewritten with small changes is drafted
// mostly right, and text that copies nothing costs no more than plain decoding.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draft.h"

// A drafter over h [n] with the default policy but for a gate of 0 (every draft given).
static void init(struct drafter *d, const int32_t *h, int n, int len_max) {
    struct draft_policy p = DRAFT_POLICY_DEFAULT;
    p.gate = 0;
    assert_int_equal(draft_init(d, h, n, len_max, &p), 0);
}

static void expect_draft(struct drafter *d, int limit, const int32_t *want, int n) {
    int32_t out[DRAFT_LEN_MAX];
    const int k = draft_propose(d, limit, out);
    if (k != n) fail_msg("a draft of %d tokens, expected %d", k, n);
    for (int i = 0; i < n; i++)
        if (out[i] != want[i]) fail_msg("draft token %d is %d, expected %d", i, out[i], want[i]);
}

static void test_latest_and_longest(void **state) {
    struct drafter d;
    // "2" occurs at 2, 5 and 8; "1 2" only at 2: the longer n-gram wins.
    const int32_t h[] = {5, 1, 2, 9, 7, 2, 8, 3, 2, 6, 1, 2};
    init(&d, h, 12, 4);
    expect_draft(&d, 8, (int32_t[]){9, 7, 2, 8}, 4);
    draft_free(&d);
    // Only "2" matches: the latest occurrence (8), then what followed it.
    const int32_t h2[] = {5, 1, 2, 9, 7, 2, 8, 3, 2, 6, 4, 2};
    init(&d, h2, 12, 4);
    expect_draft(&d, 8, (int32_t[]){6, 4, 2, 6}, 4); // ...and past the end, the repetition of period 3
    expect_draft(&d, 2, (int32_t[]){6, 4}, 2);       // at most limit
    assert_int_equal(draft_propose(&d, 0, (int32_t[1]){0}), 0);
    draft_free(&d);
    // Nothing earlier: no draft; a push that makes a match: one.
    init(&d, (int32_t[]){1, 2, 3}, 3, 4);
    assert_int_equal(draft_propose(&d, 8, (int32_t[8]){0}), 0);
    assert_int_equal(draft_push(&d, 2), 0);
    expect_draft(&d, 8, (int32_t[]){3, 2, 3, 2}, 4);
    draft_free(&d);
    init(&d, NULL, 0, 4); // an empty history
    assert_int_equal(draft_propose(&d, 8, (int32_t[8]){0}), 0);
    draft_free(&d);
}

static void test_extra_source_and_cursor(void **state) {
    struct drafter d;
    // The prediction repeats "9 1 2" before 71 and 72; the history copies it from the start. With
    // n-grams of 3 at most, "9 1 2" is all the drafter sees of where it is.
    const int32_t pred[] = {0, 1, 2, 70, 9, 1, 2, 71, 9, 1, 2, 72, 9};
    struct draft_policy p = DRAFT_POLICY_DEFAULT;
    p.gate = 0, p.n_max = 3;
    assert_int_equal(draft_init(&d, (int32_t[]){40, 41, 0, 1}, 4, 4, &p), 0);
    assert_int_equal(draft_add_source(&d, pred, 13), 0);
    expect_draft(&d, 8, (int32_t[]){2, 70, 9, 1}, 4); // "0 1" in the prediction
    assert_int_equal(d.last_src, 1);
    draft_result(&d, 4, 4);                               // all right: the copy goes on at prediction[6]
    for (int i = 2; i <= 6; i++) draft_push(&d, pred[i]); // the four and the next token, 2
    // "9 1 2" ends at 6 and at 10: the copy's place (6), not the latest (10).
    expect_draft(&d, 8, (int32_t[]){71, 9, 1, 2}, 4);
    draft_result(&d, 4, 0);
    draft_free(&d);
    // The prediction's drafts stop at its end (no repetition past it); the history is tried after it.
    init(&d, (int32_t[]){3, 8, 5, 3}, 4, 4);
    assert_int_equal(draft_add_source(&d, (int32_t[]){7, 3, 6}, 3), 0);
    expect_draft(&d, 8, (int32_t[]){6}, 1);
    assert_int_equal(d.last_src, 1);
    draft_push(&d, 9); // "... 3 9": not in the prediction, and "9" not in the history before
    assert_int_equal(draft_propose(&d, 8, (int32_t[8]){0}), 0);
    draft_push(&d, 8); // "8" ends at 1 in the history: 5 3 9 8 5 ...
    expect_draft(&d, 8, (int32_t[]){5, 3, 9, 8}, 4);
    assert_int_equal(d.last_src, 0);
    draft_free(&d);
    int32_t one = 1;
    init(&d, &one, 1, 4);
    for (int i = 1; i < DRAFT_SOURCES; i++) assert_int_equal(draft_add_source(&d, &one, 1), 0);
    assert_int_equal(draft_add_source(&d, &one, 1), -1); // DRAFT_SOURCES taken
    draft_free(&d);
}

static void test_adaptive_length(void **state) {
    struct drafter d;
    int32_t h[64];
    for (int i = 0; i < 64; i++) h[i] = i % 4; // drafts of any length
    init(&d, h, 64, 7);
    int32_t out[DRAFT_LEN_MAX];
    assert_int_equal(draft_propose(&d, 16, out), 4); // len_init
    draft_result(&d, 4, 4);
    assert_int_equal(draft_propose(&d, 16, out), 5); // whole: one more
    draft_result(&d, 5, 2);
    assert_int_equal(draft_propose(&d, 16, out), 4); // partly: one fewer
    for (int i = 0; i < 8; i++) draft_result(&d, 4, 0);
    assert_int_equal(d.len, 1); // never under 1
    for (int i = 0; i < 12; i++) draft_result(&d, d.len, d.len);
    assert_int_equal(d.len, 7);                     // never over len_max
    assert_int_equal(draft_propose(&d, 3, out), 3); // nor over the caller's limit
    assert_int_equal(draft_accepted((int32_t[]){1, 2, 3}, 3, (int32_t[]){1, 2, 4, 5}), 2);
    assert_int_equal(draft_accepted((int32_t[]){1, 2, 3}, 3, (int32_t[]){1, 2, 3, 5}), 3);
    assert_int_equal(draft_accepted((int32_t[]){1}, 1, (int32_t[]){0, 1}), 0);
    assert_true(d.drafted > 0 && d.accepted > 0 && d.accepted <= d.drafted);
    draft_free(&d);
    // Out-of-range policies are refused.
    struct draft_policy p = DRAFT_POLICY_DEFAULT;
    assert_int_equal(draft_init(&d, h, 4, 0, NULL), -1);
    assert_int_equal(draft_init(&d, h, 4, DRAFT_LEN_MAX + 1, NULL), -1);
    p.n_min = 0;
    assert_int_equal(draft_init(&d, h, 4, 4, &p), -1);
    p = DRAFT_POLICY_DEFAULT, p.n_max = DRAFT_NGRAM_MAX + 1;
    assert_int_equal(draft_init(&d, h, 4, 4, &p), -1);
    p = DRAFT_POLICY_DEFAULT, p.gate = 1.5f;
    assert_int_equal(draft_init(&d, h, 4, 4, &p), -1);
}

// Below the gate the drafter only looks: its first token is checked against the next one pushed,
// and once those are right often enough, it drafts again.
static void test_gate(void **state) {
    struct drafter d;
    int32_t h[40], out[DRAFT_LEN_MAX];
    for (int i = 0; i < 40; i++) h[i] = i % 4;
    struct draft_policy p = DRAFT_POLICY_DEFAULT; // gate 0.5; a weight of 0.5 for round numbers
    p.rate_weight = 0.5f;
    assert_int_equal(draft_init(&d, h, 40, 4, &p), 0);
    assert_int_equal(draft_propose(&d, 8, out), 4);
    draft_result(&d, 4, 0); // rate 0.5: still at the gate
    assert_int_equal(draft_propose(&d, 8, out), 3);
    draft_result(&d, 3, 0); // 0.25: under it
    assert_int_equal(draft_propose(&d, 8, out), 0);
    assert_int_equal(d.gate.shadow, 0); // what it would have drafted first (h continues 0 1 2 3)
    draft_push(&d, 0);                  // right: 0.625
    assert_true(d.gate.rate >= d.gate.gate);
    assert_int_equal(draft_propose(&d, 8, out), 2);
    assert_int_equal(out[0], 1);
    draft_free(&d);
}

// The gate alone, as the bench's oracle drafts use it: shut by misses, opened by looked-at hits,
// and a looked-at draft is checked against the next token only.
static void test_gate_alone(void **state) {
    struct draft_gate g;
    draft_gate_init(&g, 0.8f, 0.5f);
    assert_true(draft_gate_pass(&g, 5)); // rate 1: verified
    draft_gate_result(&g, false);        // 0.5: shut
    assert_false(draft_gate_pass(&g, 7));
    draft_gate_next(&g, 7); // right: 0.75, still shut
    assert_false(draft_gate_pass(&g, 9));
    draft_gate_next(&g, 1); // wrong: 0.375
    assert_false(draft_gate_pass(&g, 2));
    draft_gate_next(&g, 2); // 0.6875
    draft_gate_next(&g, 2); // nothing pending: no change
    assert_false(draft_gate_pass(&g, 3));
    draft_gate_next(&g, 3); // 0.84: open
    assert_true(draft_gate_pass(&g, 4));
    draft_gate_result(&g, true);
    assert_true(g.rate > 0.9f);
}

// ---- the synthetic edit task ---------------------------------------------------------------------

static uint64_t rng = 88172645463325252ull;
static uint32_t next_rand(void) { // xorshift64
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

// A token of a code-like vocabulary: a few very common ones (punctuation, keywords), many rare
// ones (names).
static int32_t code_token(void) {
    const uint32_t r = next_rand() % 100;
    return r < 40   ? (int32_t)(r % 12)
           : r < 80 ? 12 + (int32_t)(next_rand() % 200)
                    : 212 + (int32_t)(next_rand() % 5000);
}

struct stream {
    int32_t v[20000];
    int n;
};
static void put(struct stream *s, int32_t t) {
    assert_true(s->n < (int)(sizeof s->v / sizeof s->v[0]));
    s->v[s->n++] = t;
}

enum { LINES = 160, NL = 11 }; // token 11: the newline

// A file of lines: a third of them one of a few common lines ("}", "return 0;"), the rest 3 to 12
// tokens of code_token. line[i] is where line i starts.
static void make_file(struct stream *f, int *line) {
    static const int32_t common[4][3] = {{1, NL, -1}, {2, 3, NL}, {4, 5, NL}, {1, 1, NL}};
    for (int i = 0; i < LINES; i++) {
        line[i] = f->n;
        if (next_rand() % 3 == 0) {
            const int32_t *c = common[next_rand() % 4];
            for (int j = 0; j < 3 && c[j] >= 0; j++) put(f, c[j]);
            continue;
        }
        const int len = 3 + (int)(next_rand() % 10);
        for (int j = 0; j < len; j++) put(f, code_token());
        put(f, NL);
    }
    line[LINES] = f->n;
}

// The cost of a verification of T tokens in decode steps: 1 + beta (T - 1).
struct replay {
    double steps; // decode steps plain decoding takes for the continuation
    double cost;  // what it costs with the drafter
    long long drafted, accepted;
};

// Runs the continuation c [n] through a drafter on prompt p as generate() does: the first token
// from the prefill, then each step a draft (verified) or a plain step.
static struct replay replay(const struct stream *p, const struct stream *c, int len_max, double beta) {
    struct drafter d;
    assert_int_equal(draft_init(&d, p->v, p->n, len_max, NULL), 0);
    struct replay r = {.steps = c->n - 1};
    draft_push(&d, c->v[0]);
    int32_t out[DRAFT_LEN_MAX];
    for (int i = 0; i < c->n - 1;) {
        const int k = draft_propose(&d, c->n - 1 - i, out);
        if (!k) {
            r.cost += 1;
            draft_push(&d, c->v[++i]);
            continue;
        }
        const int m = draft_accepted(out, k, c->v + i + 1);
        draft_result(&d, k, m);
        r.cost += 1 + beta * k;
        for (int j = 0; j <= m; j++) draft_push(&d, c->v[i + 1 + j]);
        i += m + 1;
    }
    r.drafted = d.drafted, r.accepted = d.accepted;
    draft_free(&d);
    return r;
}

static void test_edit_task(void **state) {
    static struct stream file, edited, prompt, other;
    int line[LINES + 1];
    make_file(&file, line);
    // The edit: one name renamed everywhere, a token changed in every 10th line, a line inserted
    // after every 15th.
    const int32_t from = file.v[line[1]] < 12 ? 300 : file.v[line[1]], to = 6000;
    for (int i = 0; i < LINES; i++) {
        for (int j = line[i]; j < line[i + 1]; j++) {
            int32_t t = file.v[j] == from ? to : file.v[j];
            if (i % 10 == 5 && j == line[i]) t = 6001 + i;
            put(&edited, t);
        }
        if (i % 15 == 14) put(&edited, 7000 + i), put(&edited, NL);
    }
    for (int j = 0; j < 20; j++) put(&prompt, 8000 + j); // "rewrite this file:"
    for (int j = 0; j < file.n; j++) put(&prompt, file.v[j]);
    const struct replay e7 = replay(&prompt, &edited, 7, 0.1), e3 = replay(&prompt, &edited, 3, 0.3);
    // Text that copies nothing: another file of the same kind.
    make_file(&other, line);
    const struct replay n7 = replay(&prompt, &other, 7, 0.1), n3 = replay(&prompt, &other, 3, 0.3);
    print_message("edit task (%d tokens): drafts %lld, accepted %lld (%.0f%%): %.2fx at beta 0.1 (D <= 7), %.2fx at "
                  "beta 0.3 (D <= 3)\n",
                  edited.n, e7.drafted, e7.accepted, 100.0 * e7.accepted / e7.drafted, e7.steps / e7.cost,
                  e3.steps / e3.cost);
    print_message("no copy (%d tokens): drafts %lld, accepted %lld: %.3fx at beta 0.1, %.3fx at beta 0.3\n", other.n,
                  n7.drafted, n7.accepted, n7.steps / n7.cost, n3.steps / n3.cost);
    assert_true(e7.accepted >= 0.8 * e7.drafted);
    assert_true(e7.steps / e7.cost >= 3.0);
    assert_true(e3.steps / e3.cost >= 1.7);
    assert_true(n7.steps / n7.cost >= 0.97);
    assert_true(n3.steps / n3.cost >= 0.97);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_latest_and_longest), cmocka_unit_test(test_extra_source_and_cursor),
        cmocka_unit_test(test_adaptive_length),    cmocka_unit_test(test_gate),
        cmocka_unit_test(test_gate_alone),         cmocka_unit_test(test_edit_task),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
