// libFuzzer target: the tool-call output parser (src/toolcall.c).  The input is model output; it is
// fed whole, then again cut at boundaries chosen by its first bytes, and both runs must hand over
// the same content and calls (the parser's promise: token boundaries never matter), and every
// call's arguments must be the pieces streamed since it began.
// Built and run by tools/dev/fuzz.sh (make fuzz).
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toolcall.h"

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, \"metric\": {\"type\": "
    "\"boolean\"}, \"opts\": {\"type\": \"object\"}, \"code\": {\"type\": \"string\"}, \"unit\": {\"enum\": [\"c\", \"f\"]}, "
    "\"tags\": {\"type\": [\"array\", \"null\"]}}}}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"s\": {\"type\": \"string\"}, \"n\": {\"type\": \"number\"}}, \"required\": [\"s\"]}}}]";

static json_t *tools;

// What a run handed over: content and calls (name NUL arguments NUL ...), all concatenated.
struct out {
    struct sbuf content, calls;
    int n_calls;
    struct sbuf piece;   // the arguments streamed since the call began
    int open;            // a call has begun
};

static void on_content(void *arg, const char *s, size_t n) { sbuf_add(&((struct out *)arg)->content, s, n); }

static void on_begin(void *arg, const char *name) {
    struct out *o = arg;
    if (o->open) __builtin_trap();
    o->open = 1;
    o->piece.len = 0;
}

static void on_delta(void *arg, const char *s, size_t n) {
    struct out *o = arg;
    if (!o->open) __builtin_trap();
    sbuf_add(&o->piece, s, n);
}

static void on_abort(void *arg) {
    struct out *o = arg;
    if (!o->open) __builtin_trap();
    o->open = 0;
}

static void on_call(void *arg, const char *name, const char *arguments) {
    struct out *o = arg;
    if (!o->open || o->piece.len != strlen(arguments) || memcmp(o->piece.p, arguments, o->piece.len))
        __builtin_trap();   // the streamed pieces are not the arguments
    o->open = 0;
    sbuf_add(&o->calls, name, strlen(name) + 1);
    sbuf_add(&o->calls, arguments, strlen(arguments) + 1);
    o->n_calls++;
}

static void run(const char *s, size_t n, const uint8_t *cuts, size_t ncuts, struct out *o) {
    memset(o, 0, sizeof *o);
    struct tool_parser p;
    tool_parser_init(&p, tools, (struct tool_sink){on_content, on_call, o});
    p.stream = (struct tool_stream_sink){on_begin, on_delta, on_abort};
    size_t at = 0;
    for (size_t k = 0; k < ncuts && at < n; k++) {
        size_t step = cuts[k] % 16;   // 0: an empty piece
        if (step > n - at) step = n - at;
        tool_parser_feed(&p, s + at, step);
        at += step;
    }
    tool_parser_feed(&p, s + at, n - at);
    tool_parser_finish(&p);
    if (p.mismatches || o->open) __builtin_trap();
    tool_parser_free(&p);
    sbuf_free(&o->piece);
}

static int same(const struct sbuf *a, const struct sbuf *b) {
    return a->len == b->len && (!a->len || !memcmp(a->p, b->p, a->len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tools && !(tools = json_loads(TOOLS, 0, NULL))) abort();
    // [ncuts][cuts...][text]
    size_t ncuts = size ? data[0] % 64 : 0;
    if (size < 1 + ncuts) return 0;
    const uint8_t *cuts = data + 1;
    const char *s = (const char *)data + 1 + ncuts;
    size_t n = size - 1 - ncuts;
    struct out whole, split;
    run(s, n, NULL, 0, &whole);
    run(s, n, cuts, ncuts, &split);
    if (!same(&whole.content, &split.content) || !same(&whole.calls, &split.calls) || whole.n_calls != split.n_calls)
        __builtin_trap();   // a result that depends on where the text was cut
    // Every call's arguments are a JSON object.
    for (size_t at = 0; at < whole.calls.len;) {
        at += strlen(whole.calls.p + at) + 1;
        json_t *a = json_loads(whole.calls.p + at, JSON_ALLOW_NUL, NULL);
        if (!json_is_object(a)) __builtin_trap();
        json_decref(a);
        at += strlen(whole.calls.p + at) + 1;
    }
    sbuf_free(&whole.content), sbuf_free(&whole.calls), sbuf_free(&split.content), sbuf_free(&split.calls);
    return 0;
}
