// libFuzzer target: the JSON-schema compiler and the constrained-decoding matcher (src/constrain.c).
// The input is a schema (JSON, up to the first NUL byte) and the bytes after it: the schema is
// compiled (as response_format's schema, and as a tools array for tool_choice when it is one), then
// the bytes are walked through the matcher one at a time; a byte it refuses is skipped (the state is
// restored from a copy), so the walk goes on as a decoder's would.  A walk of a tool call that
// ends complete must parse back (toolcall.h) with each value of its text form a string (or null),
// for tools the request parser lets through (openai.c: each a function with a valid name) and
// text that is UTF-8 (the server's output channel makes it so before the parser sees it).
// Built and run by tools/dev/fuzz.sh (make fuzz).
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "constrain.h"
#include "toolcall.h"

#include <ctype.h>
#include <stdlib.h>

// As openai.c checks a request's tools: each {"function": {"name": 1 to 64 of [A-Za-z0-9_-]}}.
static bool tools_valid(const json_t *tools) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function"), *params = json_object_get(fn, "parameters");
        const char *name = json_string_value(json_object_get(fn, "name"));
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > 64 || (params && !json_is_object(params))) return false;
        for (size_t k = 0; k < n; k++)
            if (!isalnum((unsigned char)name[k]) && name[k] != '_' && name[k] != '-') return false;
    }
    return true;
}

// A complete call (text[0..n)) read back by the parser: it must be a call, its values typed by form.
static void check_call(const json_t *tools, const char *text, size_t n) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const size_t no = sizeof open - 1, nc = sizeof close - 1;
    char *name, *args;
    if (n < no + nc || memcmp(text, open, no) || memcmp(text + n - nc, close, nc)) __builtin_trap();
    if (tool_call_parse(tools, text + no, n - no - nc, &name, &args)) __builtin_trap();
    json_t *a = json_loads(args, JSON_ALLOW_NUL, NULL);
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function"), *params = json_object_get(fn, "parameters");
        if (strcmp(json_string_value(json_object_get(fn, "name")), name)) continue;
        const char *k;
        const json_t *v;
        json_object_foreach(a, k, v) {
            const json_t *schema = json_object_get(json_object_get(params, "properties"), k);
            enum tool_value form = tool_value_form(schema, params, NULL);
            if (form == TOOL_VALUE_TEXT && !json_is_string(v)) __builtin_trap();
            if (form == TOOL_VALUE_TEXT_OR_NULL && !json_is_string(v) && !json_is_null(v)) __builtin_trap();
        }
        break;
    }
    json_decref(a);
    free(name), free(args);
}

// tools: the tools array when c is a tool call's grammar, else NULL.
static void walk(const struct cschema *c, const uint8_t *b, size_t n, const json_t *tools) {
    struct cstate *s = cstate_new(c), *save = cstate_new(c);
    char *text = malloc(n + 1);
    size_t len = 0;
    if (!s || !save || !text) goto out;
    char forced[64];
    for (size_t i = 0; i < n; i++) {
        cstate_copy(save, s);
        if (!cstate_feed(s, (const char *)b + i, 1)) {
            cstate_copy(s, save);
            continue;
        }
        text[len++] = (char)b[i];
        cstate_done(s);
        cstate_distance(s);
        size_t k = cstate_forced(s, forced, sizeof forced);
        if (k > sizeof forced) __builtin_trap();
        // The forced bytes must be accepted.
        if (k && (cstate_copy(save, s), !cstate_feed(save, forced, k))) __builtin_trap();
    }
    json_t *utf8 = tools && len && cstate_done(s) ? json_stringn(text, len) : NULL;   // NULL: not UTF-8
    if (utf8 && tools_valid(tools)) check_call(tools, text, len);
    json_decref(utf8);
out:
    free(text);
    cstate_free(s);
    cstate_free(save);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    const uint8_t *rest = nul ? nul + 1 : data + size;
    size_t nrest = nul ? size - slen - 1 : 0;
    json_t *schema = json_loadb((const char *)data, slen, JSON_DECODE_ANY, NULL);
    struct cschema *c = NULL;
    char err[512];
    if (!constrain_compile(schema, &c, err, sizeof err)) walk(c, rest, nrest, NULL);
    constrain_free(c);
    c = NULL;
    if (json_is_array(schema)) {
        // tool_choice "required", then the first tool by name.
        if (!constrain_compile_tool_call(schema, NULL, &c, err, sizeof err)) walk(c, rest, nrest, schema);
        constrain_free(c);
        c = NULL;
        const char *name = json_string_value(json_object_get(json_object_get(json_array_get(schema, 0), "function"), "name"));
        if (name && !constrain_compile_tool_call(schema, name, &c, err, sizeof err)) walk(c, rest, nrest, schema);
        constrain_free(c);
    }
    json_decref(schema);
    return 0;
}
