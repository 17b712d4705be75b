// libFuzzer target: the JSON-schema compiler and the constrained-decoding matcher (src/constrain.c).
// The input is a schema (JSON, up to the first NUL byte) and the bytes after it: the schema is
// compiled (as response_format's schema, and as a tools array for tool_choice when it is one), then
// the bytes are walked through the matcher one at a time; a byte it refuses is skipped (the state is
// restored from a copy), so the walk goes on as a decoder's would.
// Built and run by tools/dev/fuzz.sh (make fuzz).
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "constrain.h"

static void walk(const struct cschema *c, const uint8_t *b, size_t n) {
    struct cstate *s = cstate_new(c), *save = cstate_new(c);
    if (!s || !save) goto out;
    char forced[64];
    for (size_t i = 0; i < n; i++) {
        cstate_copy(save, s);
        if (!cstate_feed(s, (const char *)b + i, 1)) {
            cstate_copy(s, save);
            continue;
        }
        cstate_done(s);
        cstate_distance(s);
        size_t k = cstate_forced(s, forced, sizeof forced);
        if (k > sizeof forced) __builtin_trap();
        // The forced bytes must be accepted.
        if (k && (cstate_copy(save, s), !cstate_feed(save, forced, k))) __builtin_trap();
    }
out:
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
    if (!constrain_compile(schema, &c, err, sizeof err)) walk(c, rest, nrest);
    constrain_free(c);
    c = NULL;
    if (json_is_array(schema)) {
        // tool_choice "required", then the first tool by name.
        if (!constrain_compile_tool_call(schema, NULL, &c, err, sizeof err)) walk(c, rest, nrest);
        constrain_free(c);
        c = NULL;
        const char *name = json_string_value(json_object_get(json_object_get(json_array_get(schema, 0), "function"), "name"));
        if (name && !constrain_compile_tool_call(schema, name, &c, err, sizeof err)) walk(c, rest, nrest);
        constrain_free(c);
    }
    json_decref(schema);
    return 0;
}
