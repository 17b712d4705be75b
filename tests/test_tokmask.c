// test_tokmask.c: the token trie's masks against the per-token walk, and the constrained decoder
// picking the same tokens whatever the mask mode (off, sync, overlap), alone and with an engine.
//
// The real vocabulary (build/tokenizer/tokenizer.json or $CALLA_TOKENIZER_JSON) when it is there
// (CI builds it); otherwise the synthetic small one, with a note.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness/maskbench.h"
#include "chat.h"
#include "tiny_engine.h"
#include "tokmask.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static struct tokenizer *tok;
static struct token_trie *trie;
static const int vocab = QWEN_VOCAB;

static int setup(void **state) {
    char err[512];
    const char *env = getenv("CALLA_TOKENIZER_JSON");
    const char *path = env && *env ? env : "build/tokenizer/tokenizer.json";
    struct stat st;
    if (!stat(path, &st)) {
        if (tokenizer_load_file(path, &tok, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    } else {
        const char *ci = getenv("CI");
        if (ci && !strcmp(ci, "true")) return fprintf(stderr, "%s is missing (CI)\n", path), -1;
        char dir[256];
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/calla-tokmask-%d", t && *t ? t : "/tmp", (int)getpid());
        mkdir(dir, 0755);
        if (synth_write_small_tokenizer(dir, err, sizeof err) || tokenizer_load(dir, &tok, err, sizeof err))
            return fprintf(stderr, "%s\n", err), -1;
        printf("NOTE: the real vocabulary is not built; the synthetic small one instead\n");
    }
    const double t0 = now_s();
    if (token_trie_build(tok, vocab, &trie, err, sizeof err)) return fprintf(stderr, "%s\n", err), -1;
    printf("token trie: %d tokens' bytes, %d nodes, %.1f MB, built in %.0f ms\n", tokenizer_vocab_size(tok),
           token_trie_nodes(trie), token_trie_bytes(trie) / 1e6, 1e3 * (now_s() - t0));
    return 0;
}

static int teardown(void **state) {
    token_trie_free(trie);
    tokenizer_free(tok);
    return 0;
}

static uint64_t rng = 88172645463325252ULL;
static uint64_t xorshift(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

// Logits that make documents of every kind: random, with the structural bytes of JSON and the
// tool-call markup lifted now and then (so strings end, escapes and numbers come, keys close).
static void random_logits(float *l) {
    for (int i = 0; i < vocab; i++) l[i] = (float)(xorshift() >> 40) / (float)(1 << 24);
    static const char *const lift[] = {"\"", "\\", ",",     "}",     "]",   ":", "0",  "1",  "-",    ".",   "e",
                                       "n",  "u",  "\\u00", "\",\"", "\"}", "<", "</", "\n", "true", "null"};
    for (size_t i = 0; i < sizeof lift / sizeof lift[0]; i++)
        if (xorshift() % 3 == 0) {
            int32_t id = tokenizer_token_id(tok, lift[i], strlen(lift[i]));
            if (id >= 0) l[id] = 2.0f + (float)(xorshift() % 100) / 100.0f;
        }
}

static const char *const schemas[] = {
    NULL, // json_object
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}, "
    "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"b\", 3]}}, \"ok\": {\"type\": [\"boolean\", "
    "\"null\"]}}, \"required\": [\"name\", \"age\"], \"additionalProperties\": false}",
    "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"const\": \"n\"}, \"next\": {\"anyOf\": "
    "[{\"$ref\": \"#/$defs/node\"}, {\"type\": \"null\"}]}}, \"required\": [\"v\", \"next\"], "
    "\"additionalProperties\": false}}, \"$ref\": \"#/$defs/node\"}",
    "{\"anyOf\": [{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\"}}, \"required\": [\"a\"]}, "
    "{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": [1, 12]}, \"b\": {\"type\": \"string\"}}, "
    "\"required\": [\"a\", \"b\"]}]}",
    "{\"type\": \"object\", \"properties\": {\"s1\": {\"type\": \"string\"}, \"s2\": {\"type\": \"string\"}, "
    "\"x\": {\"type\": \"number\"}}, \"required\": [\"s1\", \"s2\", \"x\"], \"additionalProperties\": false}",
    "{\"type\": \"object\", \"properties\": {\"list\": {\"type\": \"array\", \"items\": {\"type\": \"object\", "
    "\"properties\": {\"k\": {\"type\": \"boolean\"}, \"v\": {\"type\": \"integer\"}}, \"required\": [\"k\", "
    "\"v\"]}}}, "
    "\"required\": [\"list\"]}",
    "{\"type\": \"object\", \"properties\": {\"unicode_k\\u00e9y\": {\"type\": \"boolean\"}, \"quote\\\"key\": "
    "{\"type\": \"string\"}}, \"required\": [\"quote\\\"key\"]}",
    "TOOL", // a tool call with a string and an integer parameter (free text in the call)
};

static struct cschema *compile_schema(const char *text) {
    struct cschema *c = NULL;
    char err[256];
    if (text && !strcmp(text, "TOOL")) {
        json_t *tools =
            json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
                       "\"object\", \"properties\": {\"s\": {\"type\": \"string\"}, \"n\": {\"type\": "
                       "\"integer\"}}, \"required\": [\"s\", \"n\"]}}}]",
                       0, NULL);
        if (constrain_compile_tool_call(tools, "f", &c, err, sizeof err)) fail_msg("tool call: %s", err);
        json_decref(tools);
        return c;
    }
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    if (text && !j) fail_msg("bad test schema %s", text);
    if (constrain_compile(j, &c, err, sizeof err)) fail_msg("compile %s: %s", text, err);
    json_decref(j);
    return c;
}

// At every step of random documents: the trie's mask == the per-token walk's.
static void test_trie_equals_naive(void **state) {
    const size_t words = token_mask_words(vocab);
    uint64_t *a = malloc(words * 8), *b = malloc(words * 8);
    float *logits = malloc(sizeof *logits * (size_t)vocab);
    struct token_walker *w = NULL;
    int states = 0;
    const double t00 = now_s();
    double t_trie = 0, t_naive = 0;
    for (size_t si = 0; si < sizeof schemas / sizeof schemas[0]; si++) {
        struct cschema *c = compile_schema(schemas[si]);
        struct constrained con;
        assert_int_equal(constrained_init(&con, c, tok, trie, MASK_SYNC), 0);
        w = token_walker_new(trie, c);
        assert_non_null(w);
        const int budget = 28;
        for (int step = 0, docs = 0; step < 40 && docs < 3; step++) {
            double t0 = now_s();
            token_mask(w, con.s, a);
            double t1 = now_s();
            token_mask_naive(trie, tok, con.s, b);
            t_naive += now_s() - t1, t_trie += t1 - t0;
            states++;
            // Every third state, the tokens that leave room to close within a small limit too.
            const int limit = step % 3 == 2 ? 6 + step % 7 : -1;
            if (limit >= 0) {
                token_mask_within(w, con.s, limit, a);
                token_mask_naive_within(trie, tok, con.s, limit, b);
            }
            for (size_t i = 0; i < words; i++)
                if (a[i] != b[i]) {
                    int id = (int)(i * 64 + (size_t)__builtin_ctzll(a[i] ^ b[i]));
                    size_t n = 0;
                    const char *bytes = tokenizer_token_bytes(tok, id, &n);
                    fail_msg("schema %zu step %d limit %d: token %d (\"%.*s\") trie %d, per-token walk %d", si, step,
                             limit, id, (int)n, bytes ? bytes : "", (int)(a[i] >> (id & 63) & 1),
                             (int)(b[i] >> (id & 63) & 1));
                }
            random_logits(logits);
            int32_t greedy = 0;
            for (int i = 1; i < vocab; i++) greedy = logits[i] > logits[greedy] ? i : greedy;
            int32_t t = constrained_pick(&con, logits, greedy, budget - step % budget);
            if (chat_is_stop(t)) { // a new document
                constrained_free(&con);
                assert_int_equal(constrained_init(&con, c, tok, trie, MASK_SYNC), 0);
                docs++;
            }
        }
        token_walker_free(w);
        constrained_free(&con);
        constrain_free(c);
    }
    printf("trie == per-token walk on %d states: %.3f ms vs %.1f ms per mask\n", states, 1e3 * t_trie / states,
           1e3 * t_naive / states);
    free(a), free(b), free(logits);
    printf("trie test: %.1f s\n", now_s() - t00);
}

// The same random logits through off, sync and overlap: the same tokens.
static void test_modes_pick_the_same(void **state) {
    const double t0 = now_s();
    float *logits = malloc(sizeof *logits * (size_t)vocab);
    for (size_t si = 0; si < sizeof schemas / sizeof schemas[0]; si++) {
        struct cschema *c = compile_schema(schemas[si]);
        int32_t toks[3][40];
        int n[3] = {0};
        for (int m = 0; m < 3; m++) {
            rng = 1234567 + si;
            struct constrained con;
            assert_int_equal(constrained_init(&con, c, tok, trie, (enum mask_mode)m), 0);
            for (int step = 0; step < 40; step++) {
                random_logits(logits);
                int32_t greedy = 0;
                for (int i = 1; i < vocab; i++) greedy = logits[i] > logits[greedy] ? i : greedy;
                int32_t t = constrained_pick(&con, logits, greedy, 32 - step);
                toks[m][n[m]++] = t;
                if (chat_is_stop(t)) break;
                constrained_prepare(&con);
            }
            constrained_free(&con);
        }
        for (int m = 1; m < 3; m++) {
            assert_int_equal(n[m], n[0]);
            for (int i = 0; i < n[0]; i++)
                if (toks[m][i] != toks[0][i])
                    fail_msg("schema %zu: %s picked %d at step %d, off %d", si, mask_mode_name((enum mask_mode)m),
                             toks[m][i], i, toks[0][i]);
        }
        constrain_free(c);
    }
    free(logits);
    printf("modes: %.1f s\n", now_s() - t0);
}

// Decoding with the tiny engine on the CPU: the tokens of off, sync and overlap are the same.
static void test_engine_overlap_identical(void **state) {
    char dir[256];
    struct engine *e;
    const double t0 = now_s();
    assert_int_equal(tiny_engine_open("tokmask", 7, dir, sizeof dir, &e), 0);
    char err[256];
    struct tokenizer *et;
    assert_int_equal(tokenizer_load(dir, &et, err, sizeof err), 0);
    struct token_trie *tt;
    assert_int_equal(token_trie_build(et, engine_geometry(e)->vocab, &tt, err, sizeof err), 0);
    struct seq *s;
    assert_int_equal(seq_new(e, 256, &s, err, sizeof err), 0);
    for (size_t si = 1; si < 2; si++) { // (a forward of the tiny model with the whole vocabulary is slow on the CPU)
        struct cschema *c = compile_schema(schemas[si]);
        int32_t toks[3][24];
        int n[3];
        for (int m = 0; m < 3; m++) {
            seq_reset(s);
            const int32_t prompt[4] = {9, 99, 999, 9999};
            int32_t next;
            assert_int_equal(engine_forward(e, s, prompt, 3, NULL, &next, err, sizeof err), 0);
            struct maskbench_run r = {0};
            n[m] =
                maskbench_decode(e, s, c, et, tt, (enum mask_mode)m, prompt[3], 24, 12, toks[m], &r, err, sizeof err);
            if (m == 0) assert_true(r.docs >= 1); // a document closed and the next began
            if (n[m] < 0) fail_msg("%s", err);
        }
        for (int m = 1; m < 3; m++) {
            assert_int_equal(n[m], n[0]);
            assert_memory_equal(toks[m], toks[0], sizeof(int32_t) * (size_t)n[0]);
        }
        constrain_free(c);
    }
    seq_free(s);
    token_trie_free(tt);
    tokenizer_free(et);
    assert_int_equal(tiny_engine_close(dir, e), 0);
    printf("engine: %.1f s\n", now_s() - t0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trie_equals_naive),
        cmocka_unit_test(test_modes_pick_the_same),
        cmocka_unit_test(test_engine_overlap_identical),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
