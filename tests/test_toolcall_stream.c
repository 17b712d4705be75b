// test_toolcall_stream.c: a tool call's arguments streamed while the call is read (toolcall.h).
//
// For every call handed over, the pieces sent since its call_begin, joined, must be exactly its
// arguments, whatever the cuts of the text (every two-piece split, one-byte pieces, seeded random
// cuts); a call that went wrong after it began is aborted, never handed over, and its block comes
// out as content, as when nothing is streamed (tests/test_openai.c checks content and calls).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, \"metric\": {\"type\": "
    "\"boolean\"}, \"opts\": {\"type\": \"object\"}, \"code\": {\"type\": \"string\"}, \"unit\": {\"enum\": [\"c\", "
    "\"f\"]}, "
    "\"tags\": {\"type\": [\"array\", \"null\"]}}}}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}]";

// What the sink saw: content, and per call its name, streamed pieces and final arguments.
struct seen {
    struct sbuf content, events; // events: "B:name" "D:piece" "A" "C:name:args", NUL-separated
    struct sbuf piece;           // pieces since the last begin
    bool open;                   // a call has begun and not ended
    int calls, aborts, bad;      // bad: a call whose pieces were not its arguments, or events out of order
};

static void on_content(void *arg, const char *s, size_t n) {
    struct seen *x = arg;
    sbuf_add(&x->content, s, n);
}

static void on_begin(void *arg, const char *name) {
    struct seen *x = arg;
    if (x->open) x->bad++;
    x->open = true;
    x->piece.len = 0;
    sbuf_add(&x->piece, "", 0);
}

static void on_delta(void *arg, const char *s, size_t n) {
    struct seen *x = arg;
    if (!x->open) x->bad++;
    sbuf_add(&x->piece, s, n);
}

static void on_abort(void *arg) {
    struct seen *x = arg;
    if (!x->open) x->bad++;
    x->open = false;
    x->aborts++;
}

static void on_call(void *arg, const char *name, const char *arguments) {
    struct seen *x = arg;
    if (!x->open || strcmp(x->piece.p ? x->piece.p : "", arguments)) {
        x->bad++;
        fprintf(stderr, "call %s: streamed \"%s\", arguments \"%s\"\n", name, x->piece.p ? x->piece.p : "", arguments);
    }
    x->open = false;
    x->calls++;
    sbuf_adds(&x->events, name);
    sbuf_add(&x->events, "\0", 1);
    sbuf_adds(&x->events, arguments);
    sbuf_add(&x->events, "\0", 1);
}

static void seen_free(struct seen *x) {
    sbuf_free(&x->content), sbuf_free(&x->events), sbuf_free(&x->piece);
}

static void run(const json_t *tools, const char *text, size_t n, const size_t *cuts, int ncut, struct seen *x) {
    memset(x, 0, sizeof *x);
    struct tool_parser p;
    tool_parser_init(&p, tools, (struct tool_sink){.content = on_content, .call = on_call, .arg = x});
    p.stream = (struct tool_stream_sink){.begin = on_begin, .delta = on_delta, .abort = on_abort};
    size_t at = 0;
    for (int k = 0; k <= ncut; k++) {
        size_t to = k < ncut && cuts[k] < n ? cuts[k] : n;
        if (to < at) to = at;
        tool_parser_feed(&p, text + at, to - at);
        at = to;
    }
    tool_parser_finish(&p);
    assert_int_equal(p.mismatches, 0);
    assert_false(x->open);
    tool_parser_free(&p);
}

static bool same(const struct sbuf *a, const struct sbuf *b) {
    return a->len == b->len && (!a->len || !memcmp(a->p, b->p, a->len));
}

// text cut every which way: the same content, calls and aborts, every call's pieces its arguments.
static void expect_streamed(const json_t *tools, const char *text, int calls, int aborts) {
    const size_t n = strlen(text);
    struct seen whole, split;
    run(tools, text, n, NULL, 0, &whole);
    assert_int_equal(whole.bad, 0);
    if (whole.calls != calls || whole.aborts != aborts)
        fail_msg("\"%s\": %d calls, %d aborts; want %d, %d", text, whole.calls, whole.aborts, calls, aborts);
    for (size_t cut = 0; cut <= n; cut++) {
        run(tools, text, n, &cut, 1, &split);
        assert_int_equal(split.bad, 0);
        assert_true(same(&split.content, &whole.content) && same(&split.events, &whole.events));
        assert_int_equal(split.aborts, whole.aborts);
        seen_free(&split);
    }
    size_t *cuts = malloc(sizeof *cuts * (n + 1));
    for (size_t i = 0; i < n; i++) cuts[i] = i + 1;
    run(tools, text, n, cuts, (int)n, &split);
    assert_int_equal(split.bad, 0);
    assert_true(same(&split.content, &whole.content) && same(&split.events, &whole.events));
    seen_free(&split);
    free(cuts);
    seen_free(&whole);
}

static void test_streamed_calls(void **state) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    assert_non_null(tools);
    expect_streamed(tools,
                    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
                    1, 0);
    expect_streamed(tools,
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\na\nb\n</parameter>\n<parameter=metric>\n"
                    "true\n</parameter>\n<parameter=opts>\n{\"x\": [1, 2]}\n</parameter>\n<parameter=code>\n42\n"
                    "</parameter>\n<parameter=unit>\nc\n</parameter>\n<parameter=tags>\nnull\n</parameter>\n"
                    "</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>",
                    2, 0);
    // Values that look like the end of a value, escapes, control bytes, a non-JSON integer, no newlines.
    expect_streamed(tools,
                    "<tool_call><function=get_weather><parameter=city>a</param \"q\" \\ \t\x01 </parameter"
                    "\n\n</parameter><parameter=days>three</parameter><parameter=extra>\n\n</parameter>"
                    "</function></tool_call>",
                    1, 0);
    expect_streamed(tools,
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\n\xf0\x9f\x8c\xa6 \xe2\x82\xac\n\n"
                    "</parameter>\n<parameter=opts>\n{\"a\": \"</parameter\"}\n</parameter>\n</function>\n"
                    "</tool_call>",
                    1, 0);
    expect_streamed(tools,
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\n\n</parameter>\n</function>\n</tool_call>",
                    1, 0);
    json_decref(tools);
}

static void test_aborted_calls(void **state) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    assert_non_null(tools);
    // Begun (the function is known), then malformed: aborted, the block is content.
    expect_streamed(tools, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</function>\n</tool_call>", 0, 1);
    expect_streamed(tools, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n", 0, 1); // cut off
    expect_streamed(tools, "<tool_call>\n<function=now>\n</function>\nafter\n</tool_call>", 0, 1);
    expect_streamed(tools,
                    "<tool_call>\n<function=get_weather>\n<parameter=ci\nty>\nx\n</parameter>\n</function>\n"
                    "</tool_call>",
                    0, 1);
    // A parameter given twice: which one is meant?  Malformed, never last-wins.
    expect_streamed(tools,
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\na\n</parameter>\n<parameter=city>\nb\n"
                    "</parameter>\n</function>\n</tool_call>",
                    0, 1);
    // Text that is not UTF-8 inside a string value.
    expect_streamed(tools,
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\n\xff\n</parameter>\n</function>\n"
                    "</tool_call>",
                    0, 1);
    // Never a call: nothing begins.
    expect_streamed(tools, "<tool_call>\n<function=unknown_fn>\n</function>\n</tool_call>", 0, 0);
    expect_streamed(tools, "<tool_call>garbage</tool_call> and <tool_c", 0, 0);
    json_decref(tools);
}

// Seeded random calls and cuts: parameter values drawn from pieces that tempt every rule.
static void test_random_calls(void **state) {
    static const char *const bits[] = {"a",           "\n", "<",    "</",       "</parameter", "</parameter>",
                                       "</tool_call", "\"", "\\",   "\xc3\xa9", "\xe2\x82",    "\xac",
                                       "{\"k\": 1}",  "12", "true", " ",        "\t",          ">",
                                       "null"};
    static const char *const params[] = {"city", "days", "metric", "opts", "code", "unit", "tags", "other", "city"};
    json_t *tools = json_loads(TOOLS, 0, NULL);
    unsigned long long rng = 42;
#define RAND() (rng = rng * 6364136223846793005ULL + 1442695040888963407ULL, (unsigned)(rng >> 33))
    int calls = 0, aborts = 0;
    for (int iter = 0; iter < 400; iter++) {
        struct sbuf t = {0};
        sbuf_adds(&t, RAND() % 3 ? "ok " : "");
        sbuf_adds(&t, "<tool_call>\n<function=");
        sbuf_adds(&t, RAND() % 8 ? "get_weather" : "now");
        sbuf_adds(&t, ">\n");
        const int np = (int)(RAND() % 4);
        for (int k = 0; k < np; k++) {
            sbuf_adds(&t, "<parameter=");
            sbuf_adds(&t, params[RAND() % (sizeof params / sizeof params[0])]);
            sbuf_adds(&t, ">\n");
            const int nb = (int)(RAND() % 5);
            for (int b = 0; b < nb; b++) sbuf_adds(&t, bits[RAND() % (sizeof bits / sizeof bits[0])]);
            sbuf_adds(&t, RAND() % 10 ? "\n</parameter>\n" : "\n</param>\n");
        }
        sbuf_adds(&t, RAND() % 12 ? "</function>\n</tool_call>" : "</function>");
        size_t cuts[8];
        for (int c = 0; c < 8; c++) cuts[c] = RAND() % (t.len + 1);
        for (int a = 0; a < 8; a++) // in order
            for (int b = a + 1; b < 8; b++)
                if (cuts[b] < cuts[a]) {
                    size_t x = cuts[a];
                    cuts[a] = cuts[b], cuts[b] = x;
                }
        struct seen whole, split;
        run(tools, t.p, t.len, NULL, 0, &whole);
        run(tools, t.p, t.len, cuts, 8, &split);
        assert_int_equal(whole.bad, 0);
        assert_int_equal(split.bad, 0);
        assert_true(same(&split.content, &whole.content) && same(&split.events, &whole.events));
        assert_int_equal(split.aborts, whole.aborts);
        calls += whole.calls, aborts += whole.aborts;
        seen_free(&whole), seen_free(&split);
        sbuf_free(&t);
    }
#undef RAND
    fprintf(stderr, "random calls: %d handed over, %d aborted\n", calls, aborts);
    assert_true(calls > 50 && aborts > 50); // both paths exercised
    json_decref(tools);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_streamed_calls),
        cmocka_unit_test(test_aborted_calls),
        cmocka_unit_test(test_random_calls),
    };
    return cmocka_run_group_tests_name("toolcall_stream", tests, NULL, NULL);
}
