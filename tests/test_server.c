// test_server.c: `calla serve`: unit tests of its internals, then the loopback suite.
//
//   1. The layers under the transport without sockets: generate.c's output channels (stop
//      strings, hold-back, newline trimming; streamed through openai.c's sink), logprobs, and
//      openai.c's greedy-parameter table; session_cache.c on a tiny synthetic engine (LRU,
//      prefix rule, state == tokens).
//   2. tests/test_server.py runs against BUILD/calla (BUILD = the directory above this binary)
//      on 127.0.0.1 with a tiny synthetic checkpoint made here: every endpoint, the bad-input
//      cases, 16 concurrent clients, disconnects, SIGTERM, a soak with an RSS bound.
//   3. tests/test_connections.py: 10,000 slow connections (--quick: 2,000) against the request
//      deadline and the limits while well-behaved clients are served, abandoned and half-closed
//      requests, and cancellation on a hang-up.
//   4. tests/test_smuggling.py: ambiguous framing, each case followed by a smuggled request that
//      must never run (docs/HTTP.md).
//   5. tests/test_agent_apis.py: Anthropic's Messages API and OpenAI's Responses API with the
//      official `anthropic` and `openai` clients, and hostile input to both.
//
// Environment: CALLA_SERVER_QUICK=1 shortens the loopback suite (sanitizer builds);
// CALLA_SERVER_SOAK=N sets the soak length (default 500).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "auth.h"
#include "generate.h"
#include "job.h"
#include "openai.h"
#include "session_cache.h"
#include "synth.h"

#include <limits.h>
#include <math.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char model_dir[] = "/tmp/calla_server_XXXXXX";
static char bin_dir[PATH_MAX];

// ---- output channels ---------------------------------------------------------------------------

// A sink that keeps each channel's text.
struct texts {
    struct sbuf answer, reasoning;
};

static void keep_text(void *ctx, enum gen_channel ch, const char *s, size_t n) {
    struct texts *t = ctx;
    sbuf_add(ch == GEN_REASONING ? &t->reasoning : &t->answer, s, n);
}

static void add_stops(struct gen_request *r, const char *const *stops, int n) {
    for (int i = 0; i < n; i++) assert_int_equal(gen_request_add_stop(r, stops[i], strlen(stops[i])), 0);
}

// A generation's text side whose sink keeps each channel's text (it must not move: t points into it).
struct text_side {
    struct gen_request r;
    struct texts out;
    struct gen_sink sink;
    struct gen_text t;
};

static void text_side_init(struct text_side *x, const char *const *stops, int n, bool reasoning) {
    *x = (struct text_side){.r = {.logprobs = -1, .reasoning = reasoning}};
    add_stops(&x->r, stops, n);
    x->sink = (struct gen_sink){.ctx = &x->out, .text = keep_text};
    gen_text_init(&x->t, &x->r, &x->sink);
}

static void text_side_free(struct text_side *x) {
    gen_text_free(&x->t);
    sbuf_free(&x->out.answer);
    sbuf_free(&x->out.reasoning);
    gen_request_free(&x->r);
}

// A streamed chat job with the OpenAI protocol's sink.
static struct job *stream_job(const char *const *stops, int n) {
    static const struct openai_ctx oc = {.model_name = "test"};
    struct job *j = openai_job_new(&oc, OPENAI_CHAT);
    assert_non_null(j);
    j->stream = true;
    add_stops(&j->req, stops, n);
    return j;
}

static void test_channel_stop_across_pieces(void **state) {
    const char *stops[] = {"END", "xyz"};
    struct text_side x;
    text_side_init(&x, stops, 2, false);
    assert_false(gen_text_push(&x.t, "hello E", 7, false));
    assert_string_equal(x.out.answer.p, "hello "); // "E" is held: it may start "END"
    assert_false(gen_text_push(&x.t, "Nx", 2, false));
    assert_string_equal(x.out.answer.p, "hello EN"); // "ENx" cannot be "END"; "x" may start "xyz"
    assert_true(gen_text_push(&x.t, "yz tail", 7, false));
    assert_string_equal(x.out.answer.p, "hello EN"); // cut before the stop string
    text_side_free(&x);
}

static void test_channel_earliest_stop_wins(void **state) {
    const char *stops[] = {"bb", "a"};
    struct text_side x;
    text_side_init(&x, stops, 2, false);
    assert_true(gen_text_push(&x.t, "xxbbya", 6, false));
    assert_string_equal(x.out.answer.p, "xx");
    text_side_free(&x);
}

static void test_channel_flush_and_newlines(void **state) {
    struct text_side x;
    text_side_init(&x, NULL, 0, true); // the output opens in the reasoning channel
    gen_text_push(&x.t, "\n\nthink", 7, false);
    gen_text_push(&x.t, "ing\n", 4, false);
    assert_string_equal(x.out.reasoning.p, "thinking"); // the newline is held...
    gen_text_push(&x.t, "\nmore\n", 6, true);
    assert_string_equal(x.out.reasoning.p, "thinking\n\nmore"); // ...and dropped at the end
    assert_null(x.out.answer.p);
    text_side_free(&x);
}

static void test_channel_stream_equals_total(void **state) {
    const char *stops[] = {"<<stop>>"};
    struct job *j = stream_job(stops, 1);
    const struct openai_resp *o = j->sink.ctx;
    struct gen_text t;
    gen_text_init(&t, &j->req, &j->sink);
    const char *pieces[] = {"a<", "<s", "b<<st", "o", "p>", "> never"};
    bool stopped = false;
    for (size_t i = 0; i < 6 && !stopped; i++) stopped = gen_text_push(&t, pieces[i], strlen(pieces[i]), false);
    assert_true(stopped);
    assert_string_equal(o->content.p, "a<<sb");
    // Concatenated SSE deltas == the total.
    struct sbuf cat = {0};
    const char *p = j->out.p;
    while (p && (p = strstr(p, "data: "))) {
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        assert_non_null(c);
        const char *s = json_string_value(
            json_object_get(json_object_get(json_array_get(json_object_get(c, "choices"), 0), "delta"), "content"));
        if (s) sbuf_add(&cat, s, strlen(s));
        json_decref(c);
        p += 6;
    }
    assert_string_equal(cat.p, "a<<sb");
    sbuf_free(&cat);
    gen_text_free(&t);
    job_unref(j);
}

static void test_channel_utf8_holdback(void **state) {
    const char *stops[] = {"\xc3\xa9t\xc3\xa9"}; // "été"
    struct job *j = stream_job(stops, 1);
    const struct openai_resp *o = j->sink.ctx;
    struct gen_text t;
    gen_text_init(&t, &j->req, &j->sink);
    assert_false(gen_text_push(&t, "caf\xc3\xa9", 5, false)); // "café": "é" may start the stop
    assert_string_equal(o->content.p, "caf");
    assert_false(gen_text_push(&t, "!", 1, true));
    assert_string_equal(o->content.p, "caf\xc3\xa9!");
    gen_text_free(&t);
    job_unref(j);
}

// ---- greedy parameters ---------------------------------------------------------------------------

static int greedy(const char *json, const char **param) {
    json_t *o = json_loads(json, 0, NULL);
    assert_non_null(o);
    struct req_error re = {0};
    int rc = check_greedy(o, &re);
    *param = re.param;
    json_decref(o);
    return rc;
}

static void test_greedy_table(void **state) {
    const char *p;
    assert_int_equal(greedy("{\"temperature\": 0, \"top_p\": 1, \"n\": 1, \"top_k\": -1, \"seed\": null, "
                            "\"logit_bias\": {}, \"logprobs\": false, \"presence_penalty\": 0.0}",
                            &p),
                     0);
    static const char *const bad[][2] = {
        {"{\"temperature\": 0.1}", "temperature"},
        {"{\"top_p\": 0.5}", "top_p"},
        {"{\"top_k\": 2}", "top_k"},
        {"{\"n\": 3}", "n"},
        {"{\"seed\": 0}", "seed"},
        {"{\"min_p\": 0.1}", "min_p"},
        {"{\"logit_bias\": {\"5\": 1}}", "logit_bias"},
        {"{\"frequency_penalty\": -1}", "frequency_penalty"},
        {"{\"temperature\": \"0\"}", "temperature"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(greedy(bad[i][0], &p), -1);
        assert_string_equal(p, bad[i][1]);
    }
}

// ---- logprobs ------------------------------------------------------------------------------------

static void test_logprobs_of(void **state) {
    const float logits[] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
    double lse = 0;
    for (int i = 0; i < 5; i++) lse += exp(logits[i]);
    lse = log(lse);
    struct token_lp t;
    gen_logprobs(logits, 5, 1, 3, &t);
    assert_int_equal(t.id, 1);
    assert_true(fabs(t.lp - (3.0 - lse)) < 1e-5);
    assert_int_equal(t.n_top, 3);
    assert_int_equal(t.top_id[0], 1); // ties: the lower id first
    assert_int_equal(t.top_id[1], 3);
    assert_int_equal(t.top_id[2], 2);
    assert_true(fabs(t.top_lp[2] - (2.0 - lse)) < 1e-5);
    gen_logprobs(logits, 5, 4, 0, &t);
    assert_int_equal(t.n_top, 0);
    assert_true(fabs(t.lp - (-1.0 - lse)) < 1e-5);
    gen_logprobs(logits, 5, 0, 20, &t); // k above the vocabulary
    assert_int_equal(t.n_top, 5);
    assert_int_equal(t.top_id[4], 4);
}

// ---- API keys ------------------------------------------------------------------------------------

static void test_auth_keys(void **state) {
    struct auth a = {0};
    char err[256];
    assert_true(auth_check(&a, NULL)); // no keys: open
    assert_int_equal(auth_add_key(&a, "sk-abc", err, sizeof err), 0);
    assert_int_equal(auth_add_key(&a, "second", err, sizeof err), 0);
    assert_int_equal(auth_add_key(&a, "", err, sizeof err), -1);
    assert_int_equal(auth_add_key(&a, "a b", err, sizeof err), -1);
    assert_int_equal(auth_add_key(&a, "caf\xc3\xa9", err, sizeof err), -1);
    assert_true(auth_check(&a, "Bearer sk-abc"));
    assert_true(auth_check(&a, "bearer second "));
    assert_false(auth_check(&a, NULL));
    assert_false(auth_check(&a, ""));
    assert_false(auth_check(&a, "Bearer"));
    assert_false(auth_check(&a, "Bearer "));
    assert_false(auth_check(&a, "Bearer sk-ab"));
    assert_false(auth_check(&a, "Bearer sk-abcd"));
    assert_false(auth_check(&a, "Bearer SK-ABC"));
    assert_false(auth_check(&a, "Basic sk-abc"));
    assert_false(auth_check(&a, "sk-abc"));
    auth_free(&a);

    char path[] = "/tmp/calla_keys_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char text[] = "# comment\n\n  key-one\r\nkey-two\n";
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    assert_int_equal(auth_load_file(&a, path, err, sizeof err), 0);
    assert_int_equal(a.n, 2);
    assert_true(auth_check(&a, "Bearer key-one"));
    assert_true(auth_check(&a, "Bearer key-two"));
    auth_free(&a);
    FILE *f = fopen(path, "w");
    fputs("# only comments\n", f);
    fclose(f);
    assert_int_equal(auth_load_file(&a, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "no keys"));
    f = fopen(path, "w");
    fputs("good\nbad key\n", f);
    fclose(f);
    assert_int_equal(auth_load_file(&a, path, err, sizeof err), -1);
    assert_non_null(strstr(err, ":2:"));
    auth_free(&a);
    unlink(path);
}

// ---- the session cache on a tiny engine ----------------------------------------------------------

static struct engine *eng;

static void test_session_cache(void **state) {
    enum { CTX = 64 };
    char err[256];
    struct session_cache c;
    assert_int_equal(scache_init(&c, eng, CTX, 2, err, sizeof err), 0);
    struct seq *w, *ref;
    assert_int_equal(seq_new(eng, CTX, &w, err, sizeof err), 0);
    assert_int_equal(seq_new(eng, CTX, &ref, err, sizeof err), 0);
    const int32_t a[] = {1, 2, 3, 4, 5, 6}, b[] = {9, 8, 7};
    int32_t next, next_ref;
    // Entry A: state after a[0..4).
    assert_int_equal(engine_forward(eng, w, a, 4, NULL, &next, err, sizeof err), ENGINE_OK);
    assert_int_equal(scache_store_copy(&c, w, a, 4, next, err, sizeof err), 0);
    // Lookup: the longest prefix; none for an unrelated prompt.
    assert_null(scache_lookup(&c, b, 3));
    assert_null(scache_lookup(&c, a, 3));
    struct cache_entry *e = scache_lookup(&c, a, 6);
    assert_non_null(e);
    assert_int_equal(e->n, 4);
    assert_int_equal(e->next, next);
    // Continuing from the entry == computing from scratch.
    seq_reset(w);
    assert_int_equal(seq_copy(w, e->s, err, sizeof err), 0);
    assert_int_equal(engine_forward(eng, w, a + 4, 2, NULL, &next, err, sizeof err), ENGINE_OK);
    assert_int_equal(engine_forward(eng, ref, a, 6, NULL, &next_ref, err, sizeof err), ENGINE_OK);
    assert_int_equal(next, next_ref);
    // Swap in the end state (a[0..6)); LRU: a third entry evicts the least recently used.
    assert_int_equal(scache_store_swap(&c, &w, a, 6, next, err, sizeof err), 0);
    assert_int_equal(seq_pos(w), 0);
    assert_int_equal(seq_capacity(w), CTX);
    assert_int_equal(scache_lookup(&c, a, 6)->n, 6);
    assert_int_equal(engine_forward(eng, w, b, 3, NULL, &next, err, sizeof err), ENGINE_OK);
    assert_int_equal(scache_lookup(&c, a, 4)->n, 4); // touch A4: A6 is now the oldest
    assert_int_equal(scache_store_copy(&c, w, b, 3, next, err, sizeof err), 0);
    assert_int_equal(scache_lookup(&c, a, 6)->n, 4); // A6 was evicted
    assert_non_null(scache_lookup(&c, b, 3));
    // A duplicate refreshes, it does not take a slot.
    assert_int_equal(scache_store_copy(&c, w, b, 3, next, err, sizeof err), 0);
    assert_non_null(scache_find(&c, a, 4));
    seq_free(w);
    seq_free(ref);
    scache_free(&c);
}

static void test_cache_off(void **state) {
    char err[64];
    struct session_cache c;
    assert_int_equal(scache_init(&c, eng, 16, 0, err, sizeof err), 0);
    const int32_t a[] = {1, 2};
    assert_int_equal(scache_store_copy(&c, NULL, a, 2, 0, err, sizeof err), 0);
    assert_null(scache_lookup(&c, a, 2));
    scache_free(&c);
}

// ---- the loopback suite ------------------------------------------------------------------------

static void test_loopback(void **state) {
    char cmd[2 * PATH_MAX + 256];
    const char *quick = getenv("CALLA_SERVER_QUICK"), *soak = getenv("CALLA_SERVER_SOAK");
    snprintf(cmd, sizeof cmd, "python3 tests/test_server.py --bin %s/calla --model %s%s --soak %s", bin_dir, model_dir,
             quick && *quick && strcmp(quick, "0") ? " --quick" : "", soak && *soak ? soak : "500");
    fprintf(stderr, "%s\n", cmd);
    int rc = system(cmd);
    assert_int_equal(rc, 0);
}

// Connection exhaustion (10,000 slow connections; --quick: 2,000), abandoned requests, cancellation on hang-up.
static void test_connections(void **state) {
    char cmd[2 * PATH_MAX + 256];
    const char *quick = getenv("CALLA_SERVER_QUICK");
    snprintf(cmd, sizeof cmd, "python3 tests/test_connections.py --bin %s/calla --model %s%s", bin_dir, model_dir,
             quick && *quick && strcmp(quick, "0") ? " --quick" : "");
    fprintf(stderr, "%s\n", cmd);
    int rc = system(cmd);
    assert_int_equal(rc, 0);
}

// Request smuggling: every ambiguous framing case is refused and closed, its smuggled request never run.
static void test_smuggling(void **state) {
    char cmd[2 * PATH_MAX + 256];
    snprintf(cmd, sizeof cmd, "python3 tests/test_smuggling.py --bin %s/calla --model %s", bin_dir, model_dir);
    fprintf(stderr, "%s\n", cmd);
    int rc = system(cmd);
    assert_int_equal(rc, 0);
}

// The APIs coding agents speak (Anthropic's Messages, OpenAI's Responses) with the official clients.
static void test_agent_apis(void **state) {
    char cmd[2 * PATH_MAX + 256];
    const char *quick = getenv("CALLA_SERVER_QUICK");
    snprintf(cmd, sizeof cmd, "python3 tests/test_agent_apis.py --bin %s/calla --model %s%s", bin_dir, model_dir,
             quick && *quick && strcmp(quick, "0") ? " --quick" : "");
    fprintf(stderr, "%s\n", cmd);
    int rc = system(cmd);
    assert_int_equal(rc, 0);
}

static int setup(void **state) {
    char err[512];
    if (!mkdtemp(model_dir)) return -1;
    struct synth_options so = {.g = geometry_find("tiny"), .seed = 1, .out_dir = model_dir, .max_shard_bytes = 1 << 30};
    if (synth_write(&so, err, sizeof err)) {
        fprintf(stderr, "synth: %s\n", err);
        return -1;
    }
    struct stat st;
    char tj[PATH_MAX];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", model_dir);
    if (stat(tj, &st) && synth_write_small_tokenizer(model_dir, err, sizeof err)) {
        fprintf(stderr, "tokenizer: %s\n", err);
        return -1;
    }
    struct engine_options eo = {.backend = "cpu", .threads = 2};
    if (engine_open(model_dir, &eo, &eng, err, sizeof err)) {
        fprintf(stderr, "engine: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    engine_close(eng);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", model_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    // BUILD/tests/test_server -> BUILD
    snprintf(bin_dir, sizeof bin_dir, "%s", argv[0]);
    for (int k = 0; k < 2; k++) {
        char *slash = strrchr(bin_dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(bin_dir, sizeof bin_dir, "%s", k ? "." : "..");
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_channel_stop_across_pieces),
        cmocka_unit_test(test_channel_earliest_stop_wins),
        cmocka_unit_test(test_channel_flush_and_newlines),
        cmocka_unit_test(test_channel_stream_equals_total),
        cmocka_unit_test(test_channel_utf8_holdback),
        cmocka_unit_test(test_greedy_table),
        cmocka_unit_test(test_auth_keys),
        cmocka_unit_test(test_logprobs_of),
        cmocka_unit_test(test_session_cache),
        cmocka_unit_test(test_cache_off),
        cmocka_unit_test(test_loopback),
        cmocka_unit_test(test_connections),
        cmocka_unit_test(test_smuggling),
        cmocka_unit_test(test_agent_apis),
    };
    return cmocka_run_group_tests_name("server", tests, setup, teardown);
}
