// test_constrain.c: the matcher's numbers are what the server's JSON parser (jansson) reads back:
// integers within long long, reals finite (constrain.c, NUM_*_DIGITS), in json_schema answers,
// json_object answers and forced tool calls alike.
//   1. Over-long integers, fractions and exponents walked through the matcher byte by byte are
//      refused at the first digit past the bound; the longest accepted ones parse.
//   2. Seeded random walks through number schemas: every complete number the matcher allows
//      parses with jansson, as an integer where the schema says integer, finite where real.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "constrain.h"
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct cschema *compile_text(const char *schema) {
    json_t *j = schema ? json_loads(schema, 0, NULL) : NULL;
    struct cschema *c;
    char err[256];
    if ((schema && !j) || constrain_compile(j, &c, err, sizeof err)) fail_msg("compile %s: %s", schema, err);
    json_decref(j);
    return c;
}

// How many bytes of doc the matcher takes before it refuses one (strlen(doc): all of them), and
// whether the whole is then a complete document.
static size_t accepted(const struct cschema *c, const char *doc, bool *done) {
    struct cstate *s = cstate_new(c);
    size_t i = 0;
    while (doc[i] && cstate_feed(s, doc + i, 1)) i++;
    *done = !doc[i] && cstate_done(s);
    cstate_free(s);
    return i;
}

static char *repeat(const char *pre, char ch, int n, const char *post) {
    char *s = malloc(strlen(pre) + (size_t)n + strlen(post) + 1);
    assert_non_null(s);
    strcpy(s, pre);
    memset(s + strlen(pre), ch, (size_t)n);
    strcpy(s + strlen(pre) + n, post);
    return s;
}

// pre + n copies of ch + post: accepted whole (and parsed by jansson to a value of type want) when
// n <= max, refused at the first copy past max when n > max.
static void expect_bound(const struct cschema *c, const char *pre, char ch, int max, const char *post, json_type want) {
    for (int n = max - 1; n <= max + 2; n++) {
        char *doc = repeat(pre, ch, n, post);
        bool done;
        size_t k = accepted(c, doc, &done);
        if (n <= max) {
            if (!done) fail_msg("%s refused at byte %zu (%d digits, bound %d)", doc, k, n, max);
            json_t *v = json_loads(doc, JSON_DECODE_ANY, NULL);
            if (!v) fail_msg("the matcher accepts %s, jansson does not", doc);
            const json_t *x = json_is_object(v) ? json_object_get(v, "v") : v;
            if (json_typeof(x) != want) fail_msg("%s read back as type %d, want %d", doc, json_typeof(x), want);
            if (json_is_real(x) && !isfinite(json_real_value(x))) fail_msg("%s is not finite", doc);
            json_decref(v);
        } else if (k != strlen(pre) + (size_t)max) {
            fail_msg("%s: taken up to byte %zu, want a refusal at digit %d (byte %zu)", doc, k, max + 1,
                     strlen(pre) + (size_t)max);
        }
        free(doc);
    }
}

static void test_integer_bounds(void **state) {
    struct cschema *c = compile_text("{\"type\": \"integer\"}");
    expect_bound(c, "", '9', 18, "", JSON_INTEGER);
    expect_bound(c, "-", '9', 18, "", JSON_INTEGER);
    expect_bound(c, "1", '0', 17, "", JSON_INTEGER);
    bool done;
    // The reproducer, and the long long extremes (19 digits: past the rule, refused at the 19th).
    static const char *const big[] = {"70000000000000000000", "9223372036854775807", "-9223372036854775808",
                                      "1000000000000000000"};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        size_t k = accepted(c, big[i], &done);
        if (done || k != (big[i][0] == '-' ? 19u : 18u)) fail_msg("%s: accepted %zu bytes, done %d", big[i], k, done);
    }
    assert_int_equal(accepted(c, "999999999999999999", &done), 18);
    assert_true(done);
    constrain_free(c);
    // Inside an object and an array, and behind anyOf and $ref: the same bound.
    c = compile_text("{\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}}, \"required\": [\"v\"], "
                     "\"additionalProperties\": false}");
    expect_bound(c, "{\"v\":", '7', 18, "}", JSON_INTEGER);
    expect_bound(c, "{\"v\":-", '7', 18, "}", JSON_INTEGER);
    constrain_free(c);
    c = compile_text("{\"type\": \"array\", \"items\": {\"anyOf\": [{\"$ref\": \"#/$defs/i\"}, {\"type\": \"null\"}]}, "
                     "\"$defs\": {\"i\": {\"type\": \"integer\"}}}");
    char *doc = repeat("[1,", '5', 19, "]");
    assert_int_equal(accepted(c, doc, &done), 3 + 18);
    free(doc);
    constrain_free(c);
}

static void test_number_bounds(void **state) {
    struct cschema *c = compile_text("{\"type\": \"number\"}");
    expect_bound(c, "", '8', 18, "", JSON_INTEGER); // no point: jansson's integer
    expect_bound(c, "-", '8', 18, ".5", JSON_REAL);
    expect_bound(c, "0.", '3', 18, "", JSON_REAL);
    expect_bound(c, "-0.1", '0', 17, "", JSON_REAL);
    expect_bound(c, "1e", '9', 2, "", JSON_REAL);
    expect_bound(c, "1E+", '9', 2, "", JSON_REAL);
    expect_bound(c, "1.5e-", '9', 2, "", JSON_REAL);
    // The largest and smallest the bounds allow are finite, non-zero doubles.
    static const char *const edge[] = {"999999999999999999.999999999999999999e99", "-999999999999999999e+99",
                                       "0.000000000000000001e-99", "1e-99", "0e00"};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        bool done;
        accepted(c, edge[i], &done);
        json_t *v = json_loads(edge[i], JSON_DECODE_ANY, NULL);
        if (!done || !v || !isfinite(json_real_value(v)) || (i < 4 && json_real_value(v) == 0))
            fail_msg("%s: done %d, jansson %p", edge[i], done, (void *)v);
        json_decref(v);
    }
    bool done;
    assert_int_equal(accepted(c, "1e400", &done), 4); // the 1e400 that jansson refuses
    constrain_free(c);
    // json_object (any JSON below the object): numbers there too.
    c = compile_text(NULL);
    expect_bound(c, "{\"v\":[0,", '6', 18, "]}", JSON_ARRAY);
    expect_bound(c, "{\"v\":", '6', 18, "}", JSON_INTEGER);
    expect_bound(c, "{\"v\":2.", '6', 18, "}", JSON_REAL);
    expect_bound(c, "{\"v\":2e", '6', 2, "}", JSON_REAL);
    constrain_free(c);
}

// A forced tool call's integer and number parameters have the same bounds.
static void test_tool_call_bounds(void **state) {
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
                               "\"object\", \"properties\": {\"size\": {\"type\": \"integer\"}, \"x\": {\"type\": "
                               "\"number\"}}, \"required\": [\"size\", \"x\"]}}}]",
                               0, NULL);
    struct cschema *c;
    char err[256];
    assert_int_equal(constrain_compile_tool_call(tools, "f", &c, err, sizeof err), 0);
    static const char head[] = "<tool_call>\n<function=f>\n<parameter=size>\n";
    char *doc = repeat(head, '7', 20, "\n</parameter>\n");
    bool done;
    assert_int_equal(accepted(c, doc, &done), strlen(head) + 18);
    free(doc);
    doc = repeat(head, '7', 18, "\n</parameter>\n<parameter=x>\n1e123\n</parameter>\n</function>\n</tool_call>");
    assert_int_equal(accepted(c, doc, &done), strlen(doc) - strlen("3\n</parameter>\n</function>\n</tool_call>"));
    free(doc);
    doc = repeat(head, '7', 18, "\n</parameter>\n<parameter=x>\n1e12\n</parameter>\n</function>\n</tool_call>");
    accepted(c, doc, &done);
    assert_true(done);
    free(doc);
    constrain_free(c);
    json_decref(tools);
}

// The next of a seeded stream (*x counts; synth.h's counter-based generator).
static uint64_t rng_next(uint64_t *x) {
    return synth_rand(29, (*x)++);
}

// Random walks over the bytes of numbers (digits mostly: long numbers are the point), each
// stopped at a random complete point: jansson must read every one, typed and finite.
static void test_random_numbers(void **state) {
    static const char *const schemas[] = {"{\"type\": \"integer\"}", "{\"type\": \"number\"}"};
    static const char alphabet[] = "0123456789012345678901234567890123456789-+.eE";
    uint64_t seed = 2;
    for (int si = 0; si < 2; si++) {
        struct cschema *c = compile_text(schemas[si]);
        struct cstate *s0 = cstate_new(c), *s = cstate_new(c), *t = cstate_new(c);
        int longest = 0;
        for (int w = 0; w < 3000; w++) {
            char doc[128];
            int n = 0;
            cstate_copy(s, s0);
            const int stop = 1 + (int)(rng_next(&seed) % 60);
            for (int tries = 0; tries < 400 && n < (int)sizeof doc - 1; tries++) {
                if (n >= stop && cstate_done(s)) break;
                char ch = alphabet[rng_next(&seed) % (sizeof alphabet - 1)];
                cstate_copy(t, s);
                if (!cstate_feed(t, &ch, 1)) continue;
                cstate_copy(s, t);
                doc[n++] = ch;
            }
            doc[n] = 0;
            if (!cstate_done(s)) continue; // ran out of tries mid-number: nothing to read back
            json_t *v = json_loads(doc, JSON_DECODE_ANY, NULL);
            if (!v) fail_msg("%s: the matcher completes %s, jansson refuses it", schemas[si], doc);
            if (si == 0 && !json_is_integer(v)) fail_msg("%s read back as type %d", doc, json_typeof(v));
            if (json_is_real(v) && !isfinite(json_real_value(v))) fail_msg("%s is not finite", doc);
            longest = n > longest ? n : longest;
            json_decref(v);
        }
        // The walks did reach the bounds: an 18-digit integer (19 with a sign), and longer reals.
        if (longest < (si == 0 ? 18 : 24)) fail_msg("%s: the longest walk was %d bytes", schemas[si], longest);
        cstate_free(s0), cstate_free(s), cstate_free(t);
        constrain_free(c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integer_bounds),
        cmocka_unit_test(test_number_bounds),
        cmocka_unit_test(test_tool_call_bounds),
        cmocka_unit_test(test_random_numbers),
    };
    return cmocka_run_group_tests_name("constrain", tests, NULL, NULL);
}
