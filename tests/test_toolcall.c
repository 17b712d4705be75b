// test_toolcall.c: how a tool parameter's value is written inside the call's markup, one decision
// (tool_value_form) shared by the forced-call grammar (constrain.c) and the output parser
// (toolcall.c), for every form of parameter schema:
//   1. the decision itself, form by form, and the strings it hands the grammar;
//   2. per form, markup values: what the grammar accepts, and what the parser makes of them (the
//      `arguments` a client gets, typed as the schema says);
//   3. per form, seeded random walks through the grammar to a complete call: every call it can
//      produce parses, and each value has a JSON type the schema allows.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "constrain.h"
#include "synth.h"
#include "toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// JSON types, for what a schema allows.
enum { T_STR = 1, T_NULL = 2, T_INT = 4, T_REAL = 8, T_BOOL = 16, T_ARR = 32, T_OBJ = 64, T_ANY = 127 };

static int type_bit(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_STRING:
        return T_STR;
    case JSON_NULL:
        return T_NULL;
    case JSON_INTEGER:
        return T_INT;
    case JSON_REAL:
        return T_REAL;
    case JSON_TRUE:
    case JSON_FALSE:
        return T_BOOL;
    case JSON_ARRAY:
        return T_ARR;
    case JSON_OBJECT:
        return T_OBJ;
    }
    return 0;
}

// $defs shared by every case's parameters.
static const char DEFS[] = "{\"unit\": {\"enum\": [\"c\", \"f\"]}, \"point\": {\"type\": \"object\", \"properties\": "
                           "{\"x\": {\"type\": \"integer\"}}, \"required\": [\"x\"], \"additionalProperties\": false}, "
                           "\"name\": {\"type\": \"string\"}, \"maybe\": {\"type\": [\"string\", \"null\"]}}";

struct form_case {
    const char *schema;
    enum tool_value form;
    const char *texts; // the strings the grammar is limited to, as a JSON array; NULL: any string
    int types;         // the JSON types a value may come back as
};

static const struct form_case FORMS[] = {
    {"{\"type\": \"string\"}", TOOL_VALUE_TEXT, NULL, T_STR},
    {"{\"type\": \"string\", \"description\": \"d\", \"title\": \"t\"}", TOOL_VALUE_TEXT, NULL, T_STR},
    {"{\"enum\": [\"c\", \"f\"]}", TOOL_VALUE_TEXT, "[\"c\", \"f\"]", T_STR},
    {"{\"type\": \"string\", \"enum\": [\"c\", \"f\"]}", TOOL_VALUE_TEXT, "[\"c\", \"f\"]", T_STR},
    {"{\"enum\": [\"\", \"a\", \"ab\"]}", TOOL_VALUE_TEXT, "[\"\", \"a\", \"ab\"]", T_STR},
    {"{\"const\": \"fixed\"}", TOOL_VALUE_TEXT, "[\"fixed\"]", T_STR},
    {"{\"type\": [\"string\"]}", TOOL_VALUE_TEXT, NULL, T_STR},
    {"{\"type\": [\"string\", \"null\"]}", TOOL_VALUE_TEXT_OR_NULL, NULL, T_STR | T_NULL},
    {"{\"type\": [\"null\", \"string\"]}", TOOL_VALUE_TEXT_OR_NULL, NULL, T_STR | T_NULL},
    {"{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}]}", TOOL_VALUE_TEXT_OR_NULL, NULL, T_STR | T_NULL},
    {"{\"anyOf\": [{\"enum\": [\"a\", \"b\"]}, {\"const\": \"c\"}]}", TOOL_VALUE_TEXT, "[\"a\", \"b\", \"c\"]", T_STR},
    {"{\"anyOf\": [{\"type\": \"string\"}, {\"enum\": [\"a\"]}]}", TOOL_VALUE_TEXT, NULL, T_STR},
    {"{\"anyOf\": [{\"const\": \"x\"}, {\"type\": \"null\"}]}", TOOL_VALUE_TEXT_OR_NULL, "[\"x\"]", T_STR | T_NULL},
    {"{\"enum\": [\"a\", null]}", TOOL_VALUE_TEXT_OR_NULL, "[\"a\"]", T_STR | T_NULL},
    {"{\"enum\": [\"null\", null]}", TOOL_VALUE_JSON, NULL, T_STR | T_NULL}, // ambiguous as text
    {"{\"enum\": [\"a\", 1]}", TOOL_VALUE_JSON, NULL, T_STR | T_INT},
    {"{\"type\": [\"string\", \"integer\"]}", TOOL_VALUE_JSON, NULL, T_STR | T_INT},
    {"{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"boolean\"}]}", TOOL_VALUE_JSON, NULL, T_STR | T_BOOL},
    {"{\"const\": 3}", TOOL_VALUE_JSON, NULL, T_INT},
    {"{\"const\": null}", TOOL_VALUE_JSON, NULL, T_NULL},
    {"{\"type\": \"null\"}", TOOL_VALUE_JSON, NULL, T_NULL},
    {"{\"type\": \"number\"}", TOOL_VALUE_JSON, NULL, T_INT | T_REAL},
    {"{\"type\": \"integer\"}", TOOL_VALUE_JSON, NULL, T_INT},
    {"{\"type\": \"boolean\"}", TOOL_VALUE_JSON, NULL, T_BOOL},
    {"{\"type\": \"array\", \"items\": {\"type\": \"string\"}}", TOOL_VALUE_JSON, NULL, T_ARR},
    {"{\"type\": \"object\"}", TOOL_VALUE_JSON, NULL, T_OBJ},
    {"{\"type\": [\"array\", \"null\"]}", TOOL_VALUE_JSON, NULL, T_ARR | T_NULL},
    {"{\"type\": \"object\", \"properties\": {\"k\": {\"type\": \"string\"}}, \"required\": [\"k\"], "
     "\"additionalProperties\": false}",
     TOOL_VALUE_JSON, NULL, T_OBJ},
    {"{}", TOOL_VALUE_JSON, NULL, T_ANY},
    {"{\"$ref\": \"#/$defs/unit\"}", TOOL_VALUE_TEXT, "[\"c\", \"f\"]", T_STR},
    {"{\"$ref\": \"#/$defs/name\"}", TOOL_VALUE_TEXT, NULL, T_STR},
    {"{\"$ref\": \"#/$defs/maybe\"}", TOOL_VALUE_TEXT_OR_NULL, NULL, T_STR | T_NULL},
    {"{\"$ref\": \"#/$defs/point\"}", TOOL_VALUE_JSON, NULL, T_OBJ},
    {"{\"anyOf\": [{\"$ref\": \"#/$defs/unit\"}, {\"type\": \"null\"}]}", TOOL_VALUE_TEXT_OR_NULL, "[\"c\", \"f\"]",
     T_STR | T_NULL},
};
enum { N_FORMS = sizeof FORMS / sizeof FORMS[0] };

// One tool "f" whose only parameter "p" has the schema, required.
static json_t *tools_for(const char *schema) {
    char buf[2048];
    snprintf(buf, sizeof buf,
             "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
             "\"properties\": {\"p\": %s}, \"required\": [\"p\"], \"$defs\": %s}}}]",
             schema, DEFS);
    json_t *t = json_loads(buf, 0, NULL);
    if (!t) fail_msg("bad test schema %s", schema);
    return t;
}

static const json_t *params_of(const json_t *tools) {
    return json_object_get(json_object_get(json_array_get(tools, 0), "function"), "parameters");
}

static void test_forms(void **state) {
    for (int i = 0; i < N_FORMS; i++) {
        json_t *tools = tools_for(FORMS[i].schema), *texts = (json_t *)1;
        const json_t *params = params_of(tools);
        const json_t *schema = json_object_get(json_object_get(params, "properties"), "p");
        enum tool_value form = tool_value_form(schema, params, &texts);
        if (form != FORMS[i].form) fail_msg("%s: form %d, want %d", FORMS[i].schema, form, FORMS[i].form);
        json_t *want = FORMS[i].texts ? json_loads(FORMS[i].texts, 0, NULL) : NULL;
        if (!(want ? texts && json_equal(texts, want) : !texts)) {
            char *got = texts ? json_dumps(texts, 0) : NULL;
            fail_msg("%s: texts %s, want %s", FORMS[i].schema, got ? got : "NULL",
                     FORMS[i].texts ? FORMS[i].texts : "NULL");
        }
        assert_int_equal(tool_value_form(schema, params, NULL), form); // texts is optional
        json_decref(want);
        json_decref(texts);
        json_decref(tools);
    }
    // No schema, or one that is not an object: JSON (the parser keeps text it cannot read as JSON).
    assert_int_equal(tool_value_form(NULL, NULL, NULL), TOOL_VALUE_JSON);
    json_t *t = json_true();
    assert_int_equal(tool_value_form(t, NULL, NULL), TOOL_VALUE_JSON);
    json_decref(t);
    // A $ref that names nothing, and a cycle of $refs, decide JSON (the grammar refuses the first).
    json_t *p = json_loads("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/a\"}}}", 0, NULL);
    json_t *r1 = json_pack("{s:s}", "$ref", "#/$defs/missing"), *r2 = json_pack("{s:s}", "$ref", "#/$defs/a");
    assert_int_equal(tool_value_form(r1, p, NULL), TOOL_VALUE_JSON);
    assert_int_equal(tool_value_form(r2, p, NULL), TOOL_VALUE_JSON);
    json_decref(r1), json_decref(r2), json_decref(p);
}

// ---- markup values: the grammar and the parser --------------------------------------------------

static char *call_text(const char *value) {
    static const char head[] = "<tool_call>\n<function=f>\n<parameter=p>\n",
                      tail[] = "\n</parameter>\n</function>\n</tool_call>";
    char *s = malloc(strlen(head) + strlen(value) + strlen(tail) + 1);
    assert_non_null(s);
    strcpy(s, head);
    strcat(s, value);
    strcat(s, tail);
    return s;
}

static bool grammar_accepts(const struct cschema *c, const char *text) {
    struct cstate *s = cstate_new(c);
    bool ok = cstate_feed(s, text, strlen(text)) && cstate_done(s);
    cstate_free(s);
    return ok;
}

// The `arguments` the parser makes of a call (the text between <tool_call> and </tool_call>).
static json_t *parse_args(const json_t *tools, const char *text) {
    const char *b = text + strlen("<tool_call>"), *e = strstr(text, "</tool_call>");
    char *name, *args;
    if (!e || tool_call_parse(tools, b, (size_t)(e - b), &name, &args)) return NULL;
    json_t *a = json_loads(args, JSON_ALLOW_NUL, NULL); // a JSON value may hold \u0000
    free(name), free(args);
    return a;
}

struct value_case {
    const char *schema;
    const char *markup; // VALUE as written between the tags
    bool forced_ok;     // the grammar of a forced call allows it
    const char *want;   // "p"'s value in arguments, as JSON
};

static const struct value_case VALUES[] = {
    {"{\"type\": \"string\"}", "a \"q\" \\ b", true, "\"a \\\"q\\\" \\\\ b\""},
    {"{\"type\": \"string\"}", "42", true, "\"42\""},
    {"{\"type\": \"string\"}", "two\nlines", true, "\"two\\nlines\""},
    {"{\"type\": \"string\"}", "", true, "\"\""},
    {"{\"type\": \"string\"}", "null", true, "\"null\""},
    {"{\"enum\": [\"c\", \"f\"]}", "c", true, "\"c\""},
    {"{\"enum\": [\"c\", \"f\"]}", "\"c\"", false, "\"\\\"c\\\"\""}, // unforced: the text as it came
    {"{\"enum\": [\"c\", \"f\"]}", "k", false, "\"k\""},
    {"{\"type\": \"string\", \"enum\": [\"c\", \"f\"]}", "f", true, "\"f\""},
    {"{\"enum\": [\"\", \"a\", \"ab\"]}", "", true, "\"\""},
    {"{\"enum\": [\"\", \"a\", \"ab\"]}", "a", true, "\"a\""},
    {"{\"enum\": [\"\", \"a\", \"ab\"]}", "ab", true, "\"ab\""},
    {"{\"enum\": [\"\", \"a\", \"ab\"]}", "abc", false, "\"abc\""},
    {"{\"const\": \"fixed\"}", "fixed", true, "\"fixed\""},
    {"{\"const\": \"fixed\"}", "\"fixed\"", false, "\"\\\"fixed\\\"\""},
    {"{\"type\": [\"string\", \"null\"]}", "null", true, "null"},
    {"{\"type\": [\"string\", \"null\"]}", "Bern", true, "\"Bern\""},
    {"{\"type\": [\"string\", \"null\"]}", "\"null\"", true, "\"\\\"null\\\"\""},
    {"{\"type\": [\"string\", \"null\"]}", "nullx", true, "\"nullx\""},
    {"{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}]}", "null", true, "null"},
    {"{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}]}", "x", true, "\"x\""},
    {"{\"anyOf\": [{\"enum\": [\"a\", \"b\"]}, {\"const\": \"c\"}]}", "c", true, "\"c\""},
    {"{\"anyOf\": [{\"enum\": [\"a\", \"b\"]}, {\"const\": \"c\"}]}", "d", false, "\"d\""},
    {"{\"anyOf\": [{\"const\": \"x\"}, {\"type\": \"null\"}]}", "null", true, "null"},
    {"{\"anyOf\": [{\"const\": \"x\"}, {\"type\": \"null\"}]}", "x", true, "\"x\""},
    {"{\"enum\": [\"a\", null]}", "null", true, "null"},
    {"{\"enum\": [\"a\", null]}", "a", true, "\"a\""},
    {"{\"enum\": [\"a\", null]}", "b", false, "\"b\""},
    {"{\"enum\": [\"null\", null]}", "\"null\"", true, "\"null\""},
    {"{\"enum\": [\"null\", null]}", "null", true, "null"},
    {"{\"enum\": [\"a\", 1]}", "\"a\"", true, "\"a\""},
    {"{\"enum\": [\"a\", 1]}", "1", true, "1"},
    {"{\"enum\": [\"a\", 1]}", "a", false, "\"a\""}, // unforced and not JSON: text
    {"{\"type\": [\"string\", \"integer\"]}", "\"42\"", true, "\"42\""},
    {"{\"type\": [\"string\", \"integer\"]}", "42", true, "42"},
    {"{\"const\": 3}", "3", true, "3"},
    {"{\"type\": \"null\"}", "null", true, "null"},
    {"{\"type\": \"number\"}", "-1.5e3", true, "-1500.0"},
    {"{\"type\": \"number\"}", "7", true, "7"},
    {"{\"type\": \"integer\"}", "-3", true, "-3"},
    {"{\"type\": \"integer\"}", "3.5", false, "3.5"},
    {"{\"type\": \"integer\"}", "999999999999999999", true, "999999999999999999"},
    {"{\"type\": \"integer\"}", "70000000000000000000", false, "\"70000000000000000000\""}, // past long long: text
    {"{\"type\": \"boolean\"}", "true", true, "true"},
    {"{\"type\": \"boolean\"}", "yes", false, "\"yes\""},
    {"{\"type\": \"array\", \"items\": {\"type\": \"string\"}}", "[\"a\",\"b\"]", true, "[\"a\", \"b\"]"},
    {"{\"type\": \"object\"}", "{\"k\":[1,{}]}", true, "{\"k\": [1, {}]}"},
    {"{\"type\": [\"array\", \"null\"]}", "null", true, "null"},
    {"{\"type\": \"object\", \"properties\": {\"k\": {\"type\": \"string\"}}, \"required\": [\"k\"], "
     "\"additionalProperties\": false}",
     "{\"k\":\"v\"}", true, "{\"k\": \"v\"}"},
    {"{\"$ref\": \"#/$defs/unit\"}", "c", true, "\"c\""},
    {"{\"$ref\": \"#/$defs/unit\"}", "\"c\"", false, "\"\\\"c\\\"\""},
    {"{\"$ref\": \"#/$defs/maybe\"}", "null", true, "null"},
    {"{\"$ref\": \"#/$defs/point\"}", "{\"x\":2}", true, "{\"x\": 2}"},
    {"{\"anyOf\": [{\"$ref\": \"#/$defs/unit\"}, {\"type\": \"null\"}]}", "f", true, "\"f\""},
    {"{}", "[1]", true, "[1]"},
};

static void test_values(void **state) {
    for (size_t i = 0; i < sizeof VALUES / sizeof VALUES[0]; i++) {
        const struct value_case *v = &VALUES[i];
        json_t *tools = tools_for(v->schema);
        struct cschema *c;
        char err[256];
        if (constrain_compile_tool_call(tools, "f", &c, err, sizeof err)) fail_msg("%s: %s", v->schema, err);
        char *text = call_text(v->markup);
        if (grammar_accepts(c, text) != v->forced_ok)
            fail_msg("%s: the forced grammar %s \"%s\"", v->schema, v->forced_ok ? "refuses" : "accepts", v->markup);
        json_t *args = parse_args(tools, text), *want = json_loads(v->want, JSON_DECODE_ANY, NULL);
        assert_non_null(want);
        if (!args || !json_equal(json_object_get(args, "p"), want)) {
            char *got = args ? json_dumps(args, 0) : NULL;
            fail_msg("%s: \"%s\" parsed as %s, want {\"p\": %s}", v->schema, v->markup, got ? got : "(no call)",
                     v->want);
        }
        json_decref(args), json_decref(want);
        free(text);
        constrain_free(c);
        json_decref(tools);
    }
}

// A string that would end the call early where the parser reads it back is refused as a value of
// the forced grammar; other markup-like text in an enum is fine.
static void test_texts_refused(void **state) {
    static const char *const bad[] = {"{\"enum\": [\"a</parameter>b\"]}", "{\"const\": \"</tool_call>\"}"};
    for (size_t i = 0; i < 2; i++) {
        json_t *tools = tools_for(bad[i]);
        struct cschema *c = (struct cschema *)1;
        char err[256];
        assert_int_equal(constrain_compile_tool_call(tools, "f", &c, err, sizeof err), -1);
        assert_null(c);
        assert_non_null(strstr(err, "cannot be written"));
        json_decref(tools);
    }
    json_t *tools = tools_for("{\"enum\": [\"<b>\", \"a</b>\"]}");
    struct cschema *c;
    char err[256];
    assert_int_equal(constrain_compile_tool_call(tools, "f", &c, err, sizeof err), 0);
    char *text = call_text("a</b>");
    assert_true(grammar_accepts(c, text));
    json_t *args = parse_args(tools, text);
    assert_string_equal(json_string_value(json_object_get(args, "p")), "a</b>");
    json_decref(args);
    free(text);
    constrain_free(c);
    json_decref(tools);
    // A parameter name the parser would read differently ('>' ends it, a line holds it) is refused.
    static const char *const names[] = {"a>b", "a\\nb"};
    for (size_t i = 0; i < 2; i++) {
        char buf[256];
        snprintf(buf, sizeof buf,
                 "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                 "{\"type\": \"object\", \"properties\": {\"%s\": {\"type\": \"string\"}}, \"required\": [\"%s\"]}}}]",
                 names[i], names[i]);
        tools = json_loads(buf, 0, NULL);
        assert_non_null(tools);
        assert_int_equal(constrain_compile_tool_call(tools, "f", &c, err, sizeof err), -1);
        assert_non_null(strstr(err, "parameter name"));
        json_decref(tools);
    }
    // A text parameter's schema is checked as any other's: an unsupported keyword is refused.
    tools = tools_for("{\"type\": \"string\", \"pattern\": \"^a\"}");
    assert_int_equal(constrain_compile_tool_call(tools, "f", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "pattern"));
    json_decref(tools);
}

// ---- random walks: every call the grammar allows reads back typed ---------------------------------

// The next of a seeded stream (*x counts; synth.h's counter-based generator).
static uint64_t rng_next(uint64_t *x) {
    return synth_rand(29, (*x)++);
}

// Walks the grammar byte by byte to a complete call: a random byte it accepts (from printable
// ASCII and the newline), the forced bytes whole when there are some, and after `budget` bytes
// the byte that brings the end nearest.
static char *walk_call(const struct cschema *c, uint64_t *seed, int budget) {
    struct cstate *s = cstate_new(c), *t = cstate_new(c);
    size_t cap = 4096, n = 0;
    char *out = malloc(cap), forced[256];
    assert_non_null(out);
    while (!cstate_done(s) || (cstate_forced(s, forced, sizeof forced) > 0)) {
        assert_true(n + sizeof forced + 2 < cap);
        size_t k = cstate_forced(s, forced, sizeof forced);
        if (k) {
            assert_true(cstate_feed(s, forced, k));
            memcpy(out + n, forced, k), n += k;
            continue;
        }
        char ok[96];
        int nok = 0, best = -1, best_d = 1 << 30;
        for (int b = 0x1f; b < 0x7f; b++) {
            char ch = b == 0x1f ? '\n' : (char)b;
            cstate_copy(t, s);
            if (!cstate_feed(t, &ch, 1)) continue;
            ok[nok++] = ch;
            int d = cstate_distance(t);
            if (d < best_d) best_d = d, best = nok - 1;
        }
        if (!nok) fail_msg("the walk is stuck after \"%.*s\"", (int)n, out);
        char ch = (int)n >= budget ? ok[best] : ok[rng_next(seed) % (uint64_t)nok];
        assert_true(cstate_feed(s, &ch, 1));
        out[n++] = ch;
    }
    out[n] = 0;
    cstate_free(s), cstate_free(t);
    return out;
}

static void test_walks(void **state) {
    uint64_t seed = 29;
    for (int i = 0; i < N_FORMS; i++) {
        json_t *tools = tools_for(FORMS[i].schema);
        struct cschema *c;
        char err[256];
        if (constrain_compile_tool_call(tools, "f", &c, err, sizeof err)) fail_msg("%s: %s", FORMS[i].schema, err);
        int seen = 0;
        for (int w = 0; w < 200; w++) {
            char *text = walk_call(c, &seed, 60 + w % 40);
            json_t *args = parse_args(tools, text);
            if (!args) fail_msg("%s: the grammar produced a call the parser refuses: %s", FORMS[i].schema, text);
            const json_t *p = json_object_get(args, "p");
            const int bit = p ? type_bit(p) : 0;
            if (!(bit & FORMS[i].types)) fail_msg("%s: \"%s\" came back as type %d", FORMS[i].schema, text, bit);
            if (FORMS[i].texts && json_is_string(p)) { // one of the strings, exactly
                json_t *want = json_loads(FORMS[i].texts, 0, NULL);
                bool found = false;
                size_t k;
                json_t *x;
                json_array_foreach(want, k, x) found |= json_equal(x, p);
                if (!found) fail_msg("%s: \"%s\" is none of %s", FORMS[i].schema, json_string_value(p), FORMS[i].texts);
                json_decref(want);
            }
            seen |= bit;
            json_decref(args);
            free(text);
        }
        // Where strings and null are a few literals, the walks reach both (free text is never
        // exactly "null" by chance; test_values has it).
        const bool few = FORMS[i].texts || FORMS[i].form == TOOL_VALUE_JSON;
        if (few && (FORMS[i].types & (T_STR | T_NULL)) == (T_STR | T_NULL) &&
            (seen & (T_STR | T_NULL)) != (T_STR | T_NULL))
            fail_msg("%s: 200 walks never gave both a string and null (%d)", FORMS[i].schema, seen);
        constrain_free(c);
        json_decref(tools);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_texts_refused),
        cmocka_unit_test(test_walks),
    };
    return cmocka_run_group_tests_name("toolcall", tests, NULL, NULL);
}
