// openai.c: the OpenAI protocol of `calla serve` (openai.h), as functions without sockets.
//
//   requests:  a JSON body -> a job whose generation request holds the rendered and tokenized
//              prompt, max_tokens, stop strings, a schema, tools; or a 4xx naming the parameter
//              (reject, never clamp: the rule of options.h)
//   answers:   the job's sink: the generation's events -> SSE chunks in the job's output channel
//              while streaming, else the chat.completion / text_completion object at the end
//
// Every bad request ends as a 4xx JSON error in the OpenAI shape
//   {"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": ...}};
// nothing a client sends can reach an abort().
#include "openai.h"

#include "chat.h"
#include "constrain.h"
#include "tokenizer.h"
#include "toolcall.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- errors ----------------------------------------------------------------------------------

json_t *openai_error_body(int status, const char *param, const char *msg) {
    // OpenAI's types; error.code is a string or null, as OpenAI's.
    const char *type = status >= 400 && status < 500 ? "invalid_request_error"
                       : status == 503               ? "server_busy"
                                                     : "server_error";
    const char *code = status == 401 ? "invalid_api_key" : status == 404 ? "not_found" : NULL;
    char *clean = NULL;   // messages quote client text, perhaps cut mid-character: make it valid UTF-8
    size_t len;
    if (utf8_sanitize(msg, strlen(msg), &clean, &len)) clean = NULL;
    json_t *o = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", clean ? clean : "invalid request", "type",
                          type, "param", param, "code", code);
    free(clean);
    return o;
}

// ---- request validation ------------------------------------------------------------------------

// Bytes of s to quote in a message: at most max, never ending inside a UTF-8 sequence (the
// message goes into JSON, which must be valid UTF-8).
static int clip_utf8(const char *s, int max) {
    int n = (int)strnlen(s, (size_t)max + 1);
    if (n <= max) return n;
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80) n--;   // s[n] is the first byte left out
    return n;
}

// ---- request fields ------------------------------------------------------------------------------
//
// Every top-level field of a generation request is in this table, with the endpoints that take it.
// Any other is refused with a 400 that names it, as OpenAI refuses it ("Unrecognized request
// argument supplied"): a field a client expects to change the answer is never dropped in silence.
// The fields of features Calla lacks are listed too, with the value that means "off", so that a
// client sending their defaults is served and any other value is a 400 that says why.

enum { FOR_CHAT = 1, FOR_COMPLETIONS = 2, FOR_BOTH = 3 };

enum field_kind {
    FIELD_READ,    // read by the parsers below
    FIELD_INERT,   // accepted, of the type in `arg`; changes nothing in the answer
    FIELD_OFF,     // a feature Calla lacks: only null and the JSON values in `arg` ("|" between them) pass
};

static const struct field {
    const char *name;
    unsigned eps;
    enum field_kind kind;
    const char *arg;   // FIELD_INERT: "string", "boolean" or "metadata" (an object of strings); FIELD_OFF: the values
    const char *why;   // FIELD_OFF: why any other value is refused
} fields[] = {
    {"messages", FOR_CHAT, FIELD_READ, NULL, NULL},
    {"prompt", FOR_COMPLETIONS, FIELD_READ, NULL, NULL},
    {"model", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"max_tokens", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"max_completion_tokens", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"n_predict", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"stream", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"stream_options", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"stop", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"ignore_eos", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"logprobs", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"top_logprobs", FOR_CHAT, FIELD_READ, NULL, NULL},
    {"return_token_ids", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"response_format", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"json_schema", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"guided_json", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"tools", FOR_CHAT, FIELD_READ, NULL, NULL},
    {"tool_choice", FOR_CHAT, FIELD_READ, NULL, NULL},
    {"parallel_tool_calls", FOR_CHAT, FIELD_READ, NULL, NULL},
    {"chat_template_kwargs", FOR_CHAT, FIELD_READ, NULL, NULL},
    {"enable_thinking", FOR_CHAT, FIELD_READ, NULL, NULL},
    {"reasoning_effort", FOR_CHAT, FIELD_READ, NULL, NULL},
    {"prediction", FOR_CHAT, FIELD_READ, NULL, NULL},
    {"user", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"prompt_cache_key", FOR_BOTH, FIELD_READ, NULL, NULL},
    // sampling (parse_sampling)
    {"temperature", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"top_p", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"top_k", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"min_p", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"typical_p", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"presence_penalty", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"frequency_penalty", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"repetition_penalty", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"logit_bias", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"seed", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"n", FOR_BOTH, FIELD_READ, NULL, NULL},
    {"best_of", FOR_BOTH, FIELD_READ, NULL, NULL},
    // accepted, no effect on the answer
    {"metadata", FOR_BOTH, FIELD_INERT, "metadata", NULL},
    {"safety_identifier", FOR_BOTH, FIELD_INERT, "string", NULL},
    {"cache_prompt", FOR_BOTH, FIELD_INERT, "boolean", NULL},   // the session cache always applies; same tokens either way
    {"spaces_between_special_tokens", FOR_BOTH, FIELD_INERT, "boolean", NULL},   // special tokens never reach the text
    // features Calla lacks: their "off" value only
    {"echo", FOR_BOTH, FIELD_OFF, "false", "echo is not supported (the answer never repeats the prompt)"},
    {"suffix", FOR_COMPLETIONS, FIELD_OFF, "\"\"", "suffix (fill-in-the-middle) is not supported"},
    {"store", FOR_BOTH, FIELD_OFF, "false", "store is not supported: Calla keeps no completions"},
    {"service_tier", FOR_BOTH, FIELD_OFF, "\"auto\"|\"default\"", "service_tier must be \"auto\" or \"default\" (one tier)"},
    {"audio", FOR_CHAT, FIELD_OFF, NULL, "audio output is not supported (text only)"},
    {"modalities", FOR_CHAT, FIELD_OFF, "[\"text\"]", "modalities must be [\"text\"] (text only)"},
    {"functions", FOR_CHAT, FIELD_OFF, NULL, "functions (deprecated) is not supported: use tools"},
    {"function_call", FOR_CHAT, FIELD_OFF, NULL, "function_call (deprecated) is not supported: use tool_choice"},
    {"web_search_options", FOR_CHAT, FIELD_OFF, NULL, "web search is not supported"},
    {"verbosity", FOR_CHAT, FIELD_OFF, "\"medium\"", "verbosity must be \"medium\" (the model has no verbosity setting)"},
    {"grammar", FOR_BOTH, FIELD_OFF, NULL, "grammar (GBNF) is not supported: use response_format with a JSON schema"},
    {"guided_regex", FOR_BOTH, FIELD_OFF, NULL, "guided_regex is not supported: use response_format with a JSON schema"},
    {"guided_choice", FOR_BOTH, FIELD_OFF, NULL, "guided_choice is not supported: use a JSON schema with an enum"},
    {"guided_grammar", FOR_BOTH, FIELD_OFF, NULL, "guided_grammar is not supported: use response_format with a JSON schema"},
    {"add_generation_prompt", FOR_CHAT, FIELD_OFF, "true", "add_generation_prompt must be true (the answer is a new assistant turn)"},
    {"continue_final_message", FOR_CHAT, FIELD_OFF, "false", "continue_final_message is not supported"},
    {"skip_special_tokens", FOR_BOTH, FIELD_OFF, "true", "skip_special_tokens must be true: special tokens never reach the text"},
    {"include_stop_str_in_output", FOR_BOTH, FIELD_OFF, "false", "include_stop_str_in_output is not supported (a stop string is never returned)"},
    {"min_tokens", FOR_BOTH, FIELD_OFF, "0", "min_tokens is not supported"},
    {"stop_token_ids", FOR_BOTH, FIELD_OFF, "[]", "stop_token_ids is not supported (<|im_end|> and <|endoftext|> stop; see ignore_eos)"},
    {"use_beam_search", FOR_BOTH, FIELD_OFF, "false", "beam search is not supported"},
};

// v equal to the JSON text lit (numbers by value: 1 and 1.0 are one value).
static bool json_is(const json_t *v, const char *lit, size_t n) {
    json_t *w = json_loadb(lit, n, JSON_DECODE_ANY, NULL);
    bool eq = w && (json_is_number(v) && json_is_number(w) ? json_number_value(v) == json_number_value(w)
                                                            : json_equal((json_t *)v, w));
    json_decref(w);
    return eq;
}

// FIELD_OFF: one of f->arg.
static bool field_off(const struct field *f, const json_t *v) {
    for (const char *a = f->arg; a && *a;) {
        const char *bar = strchr(a, '|');
        const size_t n = bar ? (size_t)(bar - a) : strlen(a);
        if (json_is(v, a, n)) return true;
        a += n + (bar != NULL);
    }
    return false;
}

static bool field_inert_ok(const char *type, const json_t *v) {
    if (!strcmp(type, "string")) return json_is_string(v);
    if (!strcmp(type, "boolean")) return json_is_boolean(v);
    if (!json_is_object(v)) return false;   // metadata: string values
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x) if (!json_is_string(x)) return false;
    return true;
}

// Every field of the body is one the endpoint takes, and the inert and "off" ones hold what they may.
static int check_fields(const json_t *body, bool chat, struct req_error *re) {
    const unsigned ep = chat ? FOR_CHAT : FOR_COMPLETIONS;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        if (json_is_null(v)) continue;   // null is absent, for any field
        const struct field *f = NULL;
        for (size_t i = 0; !f && i < sizeof fields / sizeof fields[0]; i++)
            if (!strcmp(fields[i].name, key)) f = &fields[i];
        if (!f)   // (no param: the name is the client's text, and OpenAI sends none either)
            return req_fail(re, 400, NULL, "Unrecognized request argument supplied: %.*s", clip_utf8(key, 64), key);
        if (!(f->eps & ep))
            return req_fail(re, 400, f->name, chat ? "%s is a completions parameter (/v1/completions)"
                                                   : "%s is a chat parameter (/v1/chat/completions)", f->name);
        if (f->kind == FIELD_INERT && !field_inert_ok(f->arg, v))
            return req_fail(re, 400, f->name, "%s must be %s", f->name,
                            !strcmp(f->arg, "metadata") ? "an object of strings" : !strcmp(f->arg, "string") ? "a string"
                                                                                                           : "a boolean");
        if (f->kind == FIELD_OFF && !field_off(f, v)) return req_fail(re, 400, f->name, "%s", f->why);
    }
    return 0;
}

// ---- sampling ------------------------------------------------------------------------------------
//
// Decoding is greedy unless the server runs with --allow-sampling: then temperature, top_p,
// top_k, min_p, presence_penalty and seed fill the request's gen_sampling.  The other sampling
// parameters take only the value that means greedy, and so do all of them without the flag:
// anything else is a 400 naming the parameter (reject, never clamp: the rule of options.h).
enum greedy_kind {
    GREEDY_NUM_EQ,      // a number in [lo, hi]; only `greedy` is accepted
    GREEDY_INT_LE,      // an integer >= lo; values <= `greedy` are accepted (top_k: -1, 0, 1)
    GREEDY_INT_EQ,      // an integer >= lo; only `greedy` is accepted (n, best_of)
    GREEDY_NULL,        // must be absent or null (seed)
    GREEDY_EMPTY_OBJ,   // absent, null or {} (logit_bias)
};

static const struct greedy_rule {
    const char *name;
    enum greedy_kind kind;
    double greedy, lo, hi;
    const char *why;
    bool sampling;      // one of the parameters --allow-sampling takes (parse_sampling)
} greedy_rules[] = {
    {"temperature", GREEDY_NUM_EQ, 0, 0, 2, "temperature must be 0 (greedy decoding only)", true},
    {"top_p", GREEDY_NUM_EQ, 1, 0, 1, "top_p must be 1 (greedy decoding only)", true},
    {"top_k", GREEDY_INT_LE, 1, -1, 0, "top_k must be 1, 0 or -1 (greedy decoding only)", true},
    {"min_p", GREEDY_NUM_EQ, 0, 0, 1, "min_p must be 0 (greedy decoding only)", true},
    {"typical_p", GREEDY_NUM_EQ, 1, 0, 1, "typical_p must be 1 (greedy decoding only)", false},
    {"n", GREEDY_INT_EQ, 1, 1, 0, "n must be 1 (one choice per request)", false},
    {"best_of", GREEDY_INT_EQ, 1, 1, 0, "best_of must be 1 (greedy decoding only)", false},
    {"seed", GREEDY_NULL, 0, 0, 0, "seed is not supported: decoding is greedy and deterministic", true},
    {"presence_penalty", GREEDY_NUM_EQ, 0, -2, 2, "presence_penalty must be 0 (greedy decoding only)", true},
    {"frequency_penalty", GREEDY_NUM_EQ, 0, -2, 2, "frequency_penalty must be 0 (greedy decoding only)", false},
    {"repetition_penalty", GREEDY_NUM_EQ, 1, 0, 10, "repetition_penalty must be 1 (greedy decoding only)", false},
    {"logit_bias", GREEDY_EMPTY_OBJ, 0, 0, 0, "logit_bias is not supported (greedy decoding only)", false},
};

static bool integral(const json_t *v, long long *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9e15) {
            *out = (long long)d;
            return true;
        }
    }
    return false;
}

// One rule on the body: 0 when the field is absent, null or greedy.  sampling: the server samples,
// so a refusal of one of the parameters it does not take says that instead.
static int check_rule(const struct greedy_rule *g, const json_t *body, bool sampling, struct req_error *re) {
    const json_t *v = json_object_get(body, g->name);
    if (!v || json_is_null(v)) return 0;
    char why[160];
    if (sampling)
        snprintf(why, sizeof why, "%s is not supported (sampling takes temperature, top_p, top_k, min_p, "
                                  "presence_penalty and seed)", g->name);
    else
        snprintf(why, sizeof why, "%s%s", g->why, g->sampling ? "; calla serve --allow-sampling enables sampling" : "");
    long long k;
    switch (g->kind) {
    case GREEDY_NUM_EQ: {
        if (!json_is_number(v)) return req_fail(re, 400, g->name, "%s must be a number", g->name);
        double d = json_number_value(v);
        if (!(d >= g->lo && d <= g->hi))
            return req_fail(re, 400, g->name, "%s must be between %g and %g, got %g", g->name, g->lo, g->hi, d);
        if (d != g->greedy) return req_fail(re, 400, g->name, "%s, got %g", why, d);
        break;
    }
    case GREEDY_INT_LE:
    case GREEDY_INT_EQ:
        if (!integral(v, &k)) return req_fail(re, 400, g->name, "%s must be an integer", g->name);
        if (k < (long long)g->lo) return req_fail(re, 400, g->name, "%s must be at least %g, got %lld", g->name, g->lo, k);
        if (g->kind == GREEDY_INT_LE ? k > (long long)g->greedy : k != (long long)g->greedy)
            return req_fail(re, 400, g->name, "%s, got %lld", why, k);
        break;
    case GREEDY_NULL:
        return req_fail(re, 400, g->name, "%s", why);
    case GREEDY_EMPTY_OBJ:
        if (!json_is_object(v)) return req_fail(re, 400, g->name, "%s must be an object", g->name);
        if (json_object_size(v)) return req_fail(re, 400, g->name, "%s", why);
        break;
    }
    return 0;
}

int check_greedy(const json_t *body, struct req_error *re) {
    for (size_t i = 0; i < sizeof greedy_rules / sizeof greedy_rules[0]; i++)
        if (check_rule(&greedy_rules[i], body, false, re)) return -1;
    return 0;
}

// A number field in [lo, hi] (open at lo when lo_open); absent or null: def.
static int get_num(const json_t *body, const char *name, double lo, double hi, bool lo_open, double def, double *out,
                   struct req_error *re) {
    const json_t *v = json_object_get(body, name);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return req_fail(re, 400, name, "%s must be a number", name);
    const double d = json_number_value(v);
    if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
        return req_fail(re, 400, name, "%s must be %s %g and %g, got %g", name, lo_open ? "above" : "between", lo, hi, d);
    *out = d;
    return 0;
}

int openai_parse_sampling(const json_t *body, bool allow, struct gen_sampling *s, struct req_error *re) {
    *s = (struct gen_sampling){.top_p = 1};
    if (!allow) return check_greedy(body, re);
    for (size_t i = 0; i < sizeof greedy_rules / sizeof greedy_rules[0]; i++)
        if (!greedy_rules[i].sampling && check_rule(&greedy_rules[i], body, true, re)) return -1;
    double t, p, mp, pp;
    if (get_num(body, "temperature", 0, 2, false, 0, &t, re) || get_num(body, "top_p", 0, 1, true, 1, &p, re) ||
        get_num(body, "min_p", 0, 1, false, 0, &mp, re) || get_num(body, "presence_penalty", -2, 2, false, 0, &pp, re))
        return -1;
    long long k = 0, seed = 0;
    const json_t *v = json_object_get(body, "top_k");
    if (v && !json_is_null(v) && (!integral(v, &k) || k < -1 || k > INT32_MAX))
        return req_fail(re, 400, "top_k", "top_k must be an integer, at least 0 (0 or -1: no cut)");
    if (k < 0) k = 0;   // -1: vLLM's "no cut", the same as 0
    v = json_object_get(body, "seed");
    const bool has_seed = v && !json_is_null(v);
    if (has_seed && !json_is_integer(v)) return req_fail(re, 400, "seed", "seed must be an integer");
    if (has_seed) seed = json_integer_value(v);
    if (t == 0) {   // greedy: the other parameters must not ask for what only a draw can do
        const char *which = p != 1 ? "top_p" : k > 1 ? "top_k" : mp != 0 ? "min_p" : pp != 0 ? "presence_penalty" : NULL;
        if (which)
            return req_fail(re, 400, which, "%s needs a temperature above 0 (with temperature 0 or none, decoding is greedy)",
                            which);
        return 0;   // a seed with greedy decoding changes nothing: accepted
    }
    *s = (struct gen_sampling){.on = true, .temperature = (float)t, .top_p = (float)p, .min_p = (float)mp,
                               .presence_penalty = (float)pp, .top_k = (int)k, .seed = (uint64_t)seed,
                               .has_seed = has_seed};
    if (!has_seed) {   // a random one per request, reported nowhere
        char hex[17];
        random_hex(hex, 8);
        s->seed = strtoull(hex, NULL, 16);
    }
    return 0;
}

// Optional field of a given JSON type: 0 (absent or null: *out NULL), or -1 with a 400.
static int get_opt(const json_t *obj, const char *name, json_type type, const json_t **out, struct req_error *re) {
    const json_t *v = json_object_get(obj, name);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    bool ok = type == JSON_TRUE ? json_is_boolean(v) : type == JSON_INTEGER ? json_is_number(v) : json_typeof(v) == type;
    if (!ok) {
        static const char *const names[] = {"an object", "an array", "a string", "an integer", "a number", "a boolean",
                                            "a boolean", "null"};
        return req_fail(re, 400, name, "%s must be %s", name, names[type]);
    }
    *out = v;
    return 0;
}

static int get_bool(const json_t *obj, const char *name, bool def, bool *out, struct req_error *re) {
    const json_t *v;
    if (get_opt(obj, name, JSON_TRUE, &v, re)) return -1;
    *out = v ? json_is_true(v) : def;
    return 0;
}

// logprobs: chat takes "logprobs": true with "top_logprobs": 0..20; completions take
// "logprobs": 0..20 (the number of alternatives).  r->logprobs: -1 (off) or that number.
static int parse_logprobs(const json_t *body, bool chat, struct gen_request *r, struct req_error *re) {
    const json_t *lp = json_object_get(body, "logprobs"), *top = json_object_get(body, "top_logprobs");
    long long k = 0;
    r->logprobs = -1;
    if (chat) {
        bool on;
        if (get_bool(body, "logprobs", false, &on, re)) return -1;
        if (top && !json_is_null(top)) {
            if (!integral(top, &k) || k < 0 || k > MAX_TOP_LOGPROBS)
                return req_fail(re, 400, "top_logprobs", "top_logprobs must be an integer between 0 and %d",
                           MAX_TOP_LOGPROBS);
            if (!on) return req_fail(re, 400, "top_logprobs", "top_logprobs requires \"logprobs\": true");
        }
        if (on) r->logprobs = (int)k;
        return 0;
    }
    if (!lp || json_is_null(lp) || json_is_false(lp)) return 0;
    if (!integral(lp, &k) || k < 0 || k > MAX_TOP_LOGPROBS)
        return req_fail(re, 400, "logprobs", "logprobs must be an integer between 0 and %d", MAX_TOP_LOGPROBS);
    r->logprobs = (int)k;
    return 0;
}

// The schema the answer must follow, from whichever field gives one: response_format (text,
// json_object: any object, json_object with a "schema" (llama-server's form, and instructor's
// JSON_SCHEMA mode), json_schema {"name", "schema", "strict"}), a top-level json_schema
// (llama-server) or guided_json (vLLM: a schema, or a string holding one).  At most one of them;
// the schema is compiled here, once (constrain.c), and refused with the keyword named when it is
// outside the subset.
static int parse_schema(const json_t *body, struct gen_request *r, struct req_error *re) {
    const json_t *rf, *top = json_object_get(body, "json_schema"), *guided = json_object_get(body, "guided_json");
    if (get_opt(body, "response_format", JSON_OBJECT, &rf, re)) return -1;
    const char *from = NULL;   // the field the schema comes from
    const json_t *schema = NULL;
    bool any_object = false;   // json_object without a schema
    json_t *parsed = NULL;     // guided_json given as a string
    if (rf) {
        const json_t *t = json_object_get(rf, "type");
        const char *type = json_is_string(t) ? json_string_value(t) : "";
        if (!strcmp(type, "json_schema")) {
            const json_t *js = json_object_get(rf, "json_schema");
            schema = json_object_get(js, "schema");
            if (!json_is_object(js) || !json_is_object(schema))
                return req_fail(re, 400, "response_format",
                                "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
            from = "response_format";
        } else if (!strcmp(type, "json_object")) {
            schema = json_object_get(rf, "schema");
            if (schema && !json_is_null(schema) && !json_is_object(schema))
                return req_fail(re, 400, "response_format", "response_format json_object's schema must be a JSON Schema object");
            if (!json_is_object(schema)) schema = NULL, any_object = true;
            from = "response_format";
        } else if (strcmp(type, "text")) {
            return req_fail(re, 400, "response_format",
                            "response_format type must be \"text\", \"json_object\" or \"json_schema\"");
        }
    }
    static const char *const names[] = {"json_schema", "guided_json"};
    const json_t *alt[] = {top, guided};
    for (int i = 0; i < 2; i++) {
        if (!alt[i] || json_is_null(alt[i])) continue;
        if (from)
            return req_fail(re, 400, names[i], "%s and %s both give a schema: give one", from, names[i]);
        from = names[i];
        if (i == 1 && json_is_string(alt[i])) {
            if (!(parsed = json_loadb(json_string_value(alt[i]), json_string_length(alt[i]), 0, NULL)))
                return req_fail(re, 400, names[i], "guided_json must be a JSON Schema object, or a string holding one");
            alt[i] = parsed;
        }
        if (!json_is_object(alt[i])) {
            json_decref(parsed);
            return req_fail(re, 400, names[i], "%s must be a JSON Schema object", names[i]);
        }
        schema = alt[i];
    }
    if (!schema && !any_object) return 0;
    char err[300];
    const int rc = constrain_compile(schema, &r->schema, err, sizeof err);
    json_decref(parsed);
    if (rc) {
        if (!strcmp(from, "response_format"))
            return req_fail(re, 400, "response_format", "response_format.json_schema.schema: %s", err);
        return req_fail(re, 400, !strcmp(from, "guided_json") ? "guided_json" : "json_schema", "%s: %s", from, err);
    }
    return 0;
}

// stream_options: include_usage, and include_obfuscation off (no padding field is ever added).
static int parse_stream_options(const json_t *body, struct openai_resp *o, struct req_error *re) {
    const json_t *v;
    if (get_opt(body, "stream_options", JSON_OBJECT, &v, re)) return -1;
    if (!v) return 0;
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        if (!strcmp(key, "include_usage")) {
            if (get_bool(v, "include_usage", false, &o->include_usage, re)) return -1;
        } else if (!strcmp(key, "include_obfuscation")) {
            if (!json_is_null(x) && !json_is_false(x))
                return req_fail(re, 400, "stream_options", "stream_options.include_obfuscation must be false (not supported)");
        } else {
            return req_fail(re, 400, "stream_options", "stream_options.%.*s is not a stream option (include_usage)",
                            clip_utf8(key, 64), key);
        }
    }
    return 0;
}

// OpenAI's prediction, {"type": "content", "content": a string or text parts}: kept in the
// request as a draft for speculative decoding (a hint: the answer is the same without it).
static int parse_prediction(const json_t *body, struct gen_request *r, struct req_error *re) {
    const json_t *v;
    if (get_opt(body, "prediction", JSON_OBJECT, &v, re)) return -1;
    if (!v) return 0;
    const json_t *type = json_object_get(v, "type"), *content = json_object_get(v, "content");
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x) if (strcmp(key, "type") && strcmp(key, "content"))
        return req_fail(re, 400, "prediction", "prediction takes only \"type\" and \"content\"");
    if (!json_is_string(type) || strcmp(json_string_value(type), "content"))
        return req_fail(re, 400, "prediction", "prediction must be {\"type\": \"content\", \"content\": ...}");
    struct sbuf b = {0};
    if (json_is_string(content)) {
        if (sbuf_add(&b, json_string_value(content), json_string_length(content))) goto oom;
    } else if (json_is_array(content)) {
        size_t i;
        const json_t *part;
        json_array_foreach(content, i, part) {
            const json_t *pt = json_object_get(part, "type"), *text = json_object_get(part, "text");
            if (!json_is_string(pt) || strcmp(json_string_value(pt), "text") || !json_is_string(text)) {
                sbuf_free(&b);
                return req_fail(re, 400, "prediction", "prediction.content[%zu] must be {\"type\": \"text\", \"text\": ...}", i);
            }
            if (sbuf_add(&b, json_string_value(text), json_string_length(text))) goto oom;
        }
    } else {
        return req_fail(re, 400, "prediction", "prediction.content must be a string or an array of text parts");
    }
    if (!b.len) {
        sbuf_free(&b);
        return 0;
    }
    r->prediction = b.p, r->prediction_len = b.len;
    return 0;
oom:
    sbuf_free(&b);
    return req_fail(re, 500, NULL, "out of memory");
}

// max_tokens, and the other names of it: max_completion_tokens (OpenAI's newer name) wins over
// max_tokens, which wins over n_predict (llama-server's; -1 there: as much as the context has
// left).  *out: 0 when none is given (the server's default), -1 for the context's rest.
static int parse_max_tokens(const json_t *body, long long *out, struct req_error *re) {
    static const char *const names[] = {"n_predict", "max_tokens", "max_completion_tokens"};
    *out = 0;
    for (int i = 0; i < 3; i++) {
        const json_t *m = json_object_get(body, names[i]);
        if (!m || json_is_null(m)) continue;
        long long k;
        if (!integral(m, &k)) return req_fail(re, 400, names[i], "%s must be an integer", names[i]);
        if (i == 0 && k == -1) {
            *out = -1;
            continue;
        }
        if (k < 1 || k > QWEN_MAX_CTX - 1)
            return req_fail(re, 400, names[i], "%s must be between 1 and %d inclusive%s, got %lld", names[i],
                            QWEN_MAX_CTX - 1, i == 0 ? " (or -1)" : "", k);
        *out = k;
    }
    return 0;
}

// A session key for X-Session-Id (a balancer's affinity): prompt_cache_key (OpenAI's key for
// requests that share a prefix), else user (a stable end-user id).  One that cannot be a header
// value is accepted, not mirrored.
static int parse_session(const json_t *body, struct job *j, struct req_error *re) {
    static const char *const names[] = {"user", "prompt_cache_key"};
    for (int i = 0; i < 2; i++) {
        const json_t *v;
        if (get_opt(body, names[i], JSON_STRING, &v, re)) return -1;
        if (v && session_id_valid(json_string_value(v), json_string_length(v)))
            memcpy(j->session, json_string_value(v), json_string_length(v) + 1);
    }
    return 0;
}

// Parameters common to both generation endpoints: the fields themselves, sampling, logprobs,
// max_tokens, stop, stream, the schema.
static int parse_common(const struct openai_ctx *oc, const json_t *body, struct job *j, long long *max_tokens,
                        struct req_error *re) {
    struct openai_resp *o = j->sink.ctx;
    struct gen_request *r = &j->req;
    if (check_fields(body, o->chat, re) || openai_parse_sampling(body, oc->allow_sampling, &r->sampling, re) ||
        parse_logprobs(body, o->chat, r, re))
        return -1;
    const json_t *v;
    if (get_opt(body, "model", JSON_STRING, &v, re) || parse_session(body, j, re) || parse_max_tokens(body, max_tokens, re))
        return -1;
    if (get_bool(body, "stream", false, &j->stream, re)) return -1;
    if (get_bool(body, "return_token_ids", false, &o->return_ids, re)) return -1;
    if (get_bool(body, "ignore_eos", false, &r->ignore_stop, re)) return -1;
    bool parallel = true;
    if (o->chat && get_bool(body, "parallel_tool_calls", true, &parallel, re)) return -1;
    o->one_call = !parallel;
    if (parse_stream_options(body, o, re)) return -1;
    const json_t *stop = json_object_get(body, "stop");
    if (stop && !json_is_null(stop)) {
        const json_t *one[1] = {stop};
        size_t n = 1;
        if (json_is_array(stop)) {
            n = json_array_size(stop);
            if (n > MAX_STOPS) return req_fail(re, 400, "stop", "stop may hold at most %d strings, got %zu", MAX_STOPS, n);
        } else if (!json_is_string(stop)) {
            return req_fail(re, 400, "stop", "stop must be a string or an array of strings");
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *s = json_is_array(stop) ? json_array_get(stop, i) : one[0];
            if (!json_is_string(s)) return req_fail(re, 400, "stop", "stop[%zu] must be a string", i);
            size_t len = json_string_length(s);
            if (len == 0) return req_fail(re, 400, "stop", "stop strings must not be empty");
            if (len > MAX_STOP_BYTES)
                return req_fail(re, 400, "stop", "stop strings are limited to %d bytes, got %zu", MAX_STOP_BYTES, len);
            if (gen_request_add_stop(r, json_string_value(s), len)) return req_fail(re, 500, NULL, "out of memory");
        }
    }
    return parse_prediction(body, r, re) || parse_schema(body, r, re) ? -1 : 0;
}

// Text of a message's content: a string, null, or an array of {"type": "text", "text": ...}.
static int message_text(const json_t *content, size_t idx, struct sbuf *out, struct req_error *re) {
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) {
        if (sbuf_add(out, json_string_value(content), json_string_length(content))) return req_fail(re, 500, NULL, "out of memory");
        return 0;
    }
    if (!json_is_array(content))
        return req_fail(re, 400, "messages", "messages[%zu].content must be a string or an array of text parts", idx);
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return req_fail(re, 400, "messages", "messages[%zu].content[%zu] must be an object with a \"type\"", idx, i);
        if (strcmp(json_string_value(type), "text"))
            return req_fail(re, 400, "messages", "messages[%zu].content[%zu]: type \"%.*s\" is not supported (text only)",
                       idx, i, clip_utf8(json_string_value(type), 64), json_string_value(type));
        if (!json_is_string(text))
            return req_fail(re, 400, "messages", "messages[%zu].content[%zu].text must be a string", idx, i);
        if (sbuf_add(out, json_string_value(text), json_string_length(text))) return req_fail(re, 500, NULL, "out of memory");
    }
    return 0;
}

// markup NULL: added tokens are recognised anywhere (a completion prompt is the client's own text).
static int encode(const struct openai_ctx *oc, const char *text, const unsigned char *markup, size_t len, int32_t **ids,
                  int *n, struct req_error *re) {
    size_t nn = 0;
    char err[256];
    if (tokenizer_encode_markup(oc->tok, text, len, markup, ids, &nn, err, sizeof err))
        return req_fail(re, 400, NULL, "cannot tokenize: %s", err);
    *n = (int)nn;
    return 0;
}

// ---- tools --------------------------------------------------------------------------------------

// Strings a request's rendering allocates, freed together.
struct owned {
    char **v;
    size_t n, cap;
    bool oom;
};

static char *own(struct owned *o, char *s) {
    if (!s) o->oom = true;
    if (o->oom) {
        free(s);
        return NULL;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 16;
        char **v = realloc(o->v, sizeof *v * cap);
        if (!v) {
            free(s);
            o->oom = true;
            return NULL;
        }
        o->v = v, o->cap = cap;
    }
    return o->v[o->n++] = s;
}

static void *own_alloc(struct owned *o, size_t bytes) { return own(o, calloc(1, bytes ? bytes : 1)); }

static void owned_free(struct owned *o) {
    for (size_t i = 0; i < o->n; i++) free(o->v[i]);
    free(o->v);
}

// A function name as OpenAI allows it: 1..64 of [A-Za-z0-9_-] (also what keeps it from breaking
// the <function=NAME> markup).
static bool valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-') return false;
    return true;
}

// "tools" and "tool_choice": checks them, renders each tool for the template (co->tools).
// r->tools keeps the array for typing the calls in the output (NULL: no tool parsing).
static int parse_tools(const json_t *body, struct gen_request *r, struct chat_options *co, struct owned *own_,
                       struct req_error *re) {
    const json_t *tools, *choice = json_object_get(body, "tool_choice");
    if (get_opt(body, "tools", JSON_ARRAY, &tools, re)) return -1;
    size_t n = tools ? json_array_size(tools) : 0;
    if (n > MAX_TOOLS) return req_fail(re, 400, "tools", "at most %d tools, got %zu", MAX_TOOLS, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(tools, i), *f = json_object_get(t, "function");
        const json_t *type = json_object_get(t, "type"), *name = json_object_get(f, "name");
        if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function"))
            return req_fail(re, 400, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
        if (!json_is_object(f) || !json_is_string(name) || !valid_name(json_string_value(name)))
            return req_fail(re, 400, "tools", "tools[%zu].function.name must be 1 to 64 letters, digits, _ or -", i);
        const json_t *params = json_object_get(f, "parameters"), *desc = json_object_get(f, "description");
        if (params && !json_is_object(params))
            return req_fail(re, 400, "tools", "tools[%zu].function.parameters must be a JSON Schema object", i);
        if (desc && !json_is_string(desc))
            return req_fail(re, 400, "tools", "tools[%zu].function.description must be a string", i);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(json_string_value(name),
                        json_string_value(json_object_get(json_object_get(json_array_get(tools, k), "function"), "name"))))
                return req_fail(re, 400, "tools", "tools[%zu]: the function name \"%s\" is used twice", i,
                           json_string_value(name));
    }
    bool none = false, forced = false;
    const char *fname = NULL;   // tool_choice names a function
    if (choice && !json_is_null(choice)) {
        const char *c = json_is_string(choice) ? json_string_value(choice) : NULL;
        const json_t *named = json_object_get(json_object_get(choice, "function"), "name");
        if (c && !strcmp(c, "none")) none = true;
        else if (c && !strcmp(c, "auto")) none = false;
        else if (c && !strcmp(c, "required")) forced = true;
        else if (json_is_object(choice) && json_is_string(named)) forced = true, fname = json_string_value(named);
        else
            return req_fail(re, 400, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or "
                                               "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (!n) return req_fail(re, 400, "tool_choice", "tool_choice needs tools");
    }
    const json_t *par = json_object_get(body, "parallel_tool_calls");
    if (par && !json_is_null(par) && !json_is_boolean(par))
        return req_fail(re, 400, "parallel_tool_calls", "parallel_tool_calls must be a boolean");
    if (!n || none) return 0;   // "none": the tools are left out of the prompt, output is content
    const char **rendered = own_alloc(own_, sizeof *rendered * n);
    for (size_t i = 0; rendered && i < n; i++) rendered[i] = own(own_, tool_tojson(json_array_get(tools, i)));
    if (own_->oom) return req_fail(re, 500, NULL, "out of memory");
    co->tools = rendered;
    co->n_tools = n;
    r->tools = json_incref((json_t *)tools);
    if (!forced) return 0;
    // "required" or a named function: the answer is constrained to one well-formed call.
    if (r->schema) return req_fail(re, 400, "tool_choice", "tool_choice \"required\" or a function cannot be combined with a "
                                                      "JSON response_format");
    char err[300];
    if (constrain_compile_tool_call(tools, fname, &r->schema, err, sizeof err))
        return req_fail(re, 400, "tool_choice", "tool_choice: %s", err);
    return 0;
}

// An assistant message's "tool_calls" -> the template's view of them.
static int parse_tool_calls(const json_t *calls, size_t idx, struct chat_message *cm, struct owned *o,
                            struct req_error *re) {
    if (!calls || json_is_null(calls)) return 0;
    if (!json_is_array(calls)) return req_fail(re, 400, "messages", "messages[%zu].tool_calls must be an array", idx);
    size_t n = json_array_size(calls);
    struct chat_tool_call *tc = own_alloc(o, sizeof *tc * n);
    if (!tc) return req_fail(re, 500, NULL, "out of memory");
    for (size_t k = 0; k < n; k++) {
        const json_t *c = json_array_get(calls, k), *f = json_object_get(c, "function");
        const json_t *name = json_object_get(f, "name"), *a = json_object_get(f, "arguments");
        if (!json_is_object(c) || !json_is_object(f) || !json_is_string(name) || !valid_name(json_string_value(name)))
            return req_fail(re, 400, "messages", "messages[%zu].tool_calls[%zu] must have a function with a valid name", idx, k);
        json_t *args = NULL;
        if (json_is_string(a)) args = json_loadb(json_string_value(a), json_string_length(a), JSON_DECODE_ANY, NULL);
        else if (json_is_object(a)) args = json_incref((json_t *)a);
        else if (!a || json_is_null(a)) args = json_object();
        if (!json_is_object(args)) {
            json_decref(args);
            return req_fail(re, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments must be a JSON object "
                                            "(as a string)", idx, k);
        }
        size_t na = json_object_size(args), i = 0;
        const char **names = own_alloc(o, sizeof *names * na), **values = own_alloc(o, sizeof *values * na);
        const char *key;
        json_t *v;
        json_object_foreach(args, key, v) {
            if (!names || !values) break;
            names[i] = own(o, strdup(key));
            values[i++] = own(o, json_is_string(v) ? strndup(json_string_value(v), json_string_length(v)) : tool_tojson(v));
        }
        json_decref(args);
        if (o->oom) return req_fail(re, 500, NULL, "out of memory");
        tc[k] = (struct chat_tool_call){.name = json_string_value(name), .n_args = na, .arg_names = names,
                                        .arg_values = values};
    }
    cm->tool_calls = tc;
    cm->n_tool_calls = n;
    return 0;
}

// Thinking on or off, from whichever of three fields says it: chat_template_kwargs.enable_thinking
// (the template's own variable), a top-level enable_thinking (the same, as some clients send it),
// or reasoning_effort ("none" and "minimal" turn thinking off; "low", "medium", "high" and
// "xhigh" leave it on: the model has one depth of thinking).  Two that disagree are a 400.
static int parse_thinking(const json_t *body, const json_t *kw, bool *think, struct req_error *re) {
    const char *said = NULL;   // the first field that set it
    bool on = true;
    static const char *const names[] = {"chat_template_kwargs.enable_thinking", "enable_thinking", "reasoning_effort"};
    for (int i = 0; i < 3; i++) {
        const json_t *v = json_object_get(i ? body : kw, i == 2 ? "reasoning_effort" : "enable_thinking");
        if (!v || json_is_null(v)) continue;
        bool b;
        if (i < 2) {
            if (!json_is_boolean(v)) return req_fail(re, 400, "enable_thinking", "%s must be a boolean", names[i]);
            b = json_is_true(v);
        } else {
            static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
            const char *e = json_is_string(v) ? json_string_value(v) : "";
            int k = -1;
            for (int x = 0; x < 6; x++)
                if (!strcmp(e, efforts[x])) k = x;
            if (k < 0)
                return req_fail(re, 400, "reasoning_effort",
                                "reasoning_effort must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\"");
            b = k >= 2;
        }
        if (said && b != on)
            return req_fail(re, 400, i == 2 ? "reasoning_effort" : "enable_thinking", "%s and %s disagree about thinking",
                            said, names[i]);
        said = names[i], on = b;
    }
    *think = on;
    return 0;
}

// /v1/chat/completions: messages (and tools) -> the rendered prompt and the byte offset where the
// last message starts (the snapshot point).  Sets req->reasoning and req->tools.
int openai_render_chat(const json_t *body, struct gen_request *req, char **out_, unsigned char **markup, size_t *out_len,
                       size_t *boundary_, struct req_error *re) {
    *out_ = NULL;
    if (markup) *markup = NULL;
    const json_t *msgs = json_object_get(body, "messages");
    if (!msgs || json_is_null(msgs)) return req_fail(re, 400, "messages", "messages is required");
    if (!json_is_array(msgs)) return req_fail(re, 400, "messages", "messages must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return req_fail(re, 400, "messages", "messages must not be empty");
    struct chat_options co = CHAT_OPTIONS_DEFAULT;
    const json_t *kw;
    if (get_opt(body, "chat_template_kwargs", JSON_OBJECT, &kw, re)) return -1;
    bool think = true, preserve = false;
    if (parse_thinking(body, kw, &think, re) || (kw && get_bool(kw, "preserve_thinking", false, &preserve, re)))
        return -1;
    co.enable_thinking = think;
    co.preserve_thinking = preserve;
    req->reasoning = think;

    struct owned own_ = {0};
    struct chat_message *cm = calloc(n, sizeof *cm);
    struct sbuf *texts = calloc(2 * n, sizeof *texts);   // content, reasoning per message
    char *out = NULL, *hist = NULL;
    int rc = -1;
    if (!cm || !texts) {
        req_fail(re, 500, NULL, "out of memory");
        goto done;
    }
    if (parse_tools(body, req, &co, &own_, re)) goto done;
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m)) {
            req_fail(re, 400, "messages", "messages[%zu] must be an object", i);
            goto done;
        }
        const json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) {
            req_fail(re, 400, "messages", "messages[%zu].role must be a string", i);
            goto done;
        }
        const char *r = NULL;
        for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++)
            if (!strcmp(json_string_value(role), roles[k])) r = roles[k];
        if (!r) {
            const char *rs = json_string_value(role);
            req_fail(re, 400, "messages", "messages[%zu].role \"%.*s\" is unknown (system, user, assistant or tool)", i,
                clip_utf8(rs, 64), rs);
            goto done;
        }
        if (!strcmp(r, "developer")) r = "system";
        const json_t *content = json_object_get(m, "content");
        if ((!content || json_is_null(content)) && strcmp(r, "assistant")) {
            req_fail(re, 400, "messages", "messages[%zu].content is required for role \"%s\"", i, r);
            goto done;
        }
        if (message_text(content, i, &texts[2 * i], re)) goto done;
        const json_t *rc_ = json_object_get(m, "reasoning_content");
        if (rc_ && !json_is_null(rc_)) {
            if (!json_is_string(rc_)) {
                req_fail(re, 400, "messages", "messages[%zu].reasoning_content must be a string", i);
                goto done;
            }
            if (sbuf_add(&texts[2 * i + 1], json_string_value(rc_), json_string_length(rc_))) {
                req_fail(re, 500, NULL, "out of memory");
                goto done;
            }
        }
        const json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls) && strcmp(r, "assistant")) {
            req_fail(re, 400, "messages", "messages[%zu]: only assistant messages have tool_calls", i);
            goto done;
        }
        if (parse_tool_calls(calls, i, &cm[i], &own_, re)) goto done;
        cm[i].role = r;
        cm[i].content = texts[2 * i].p ? texts[2 * i].p : "";
        cm[i].reasoning = texts[2 * i + 1].p;
    }
    size_t len = 0, boundary = 0, hist_len = 0;
    char err[256];
    if (chat_render_markup(cm, n, &co, &out, markup, &len, &boundary, err, sizeof err)) {
        req_fail(re, 400, "messages", "%s", err);
        goto done;
    }
    // The snapshot point: the end of the last message (the history rendered without the
    // generation prompt), when that is a byte prefix of the prompt; else chat_render's boundary.
    struct chat_options ho = co;
    ho.add_generation_prompt = 0;
    if (!chat_render(cm, n, &ho, &hist, &hist_len, NULL, err, sizeof err) && hist_len < len &&
        !memcmp(hist, out, hist_len))
        boundary = hist_len;
    *out_ = out, *out_len = len, *boundary_ = boundary;
    out = NULL;
    rc = 0;
done:
    if (texts)
        for (size_t i = 0; i < 2 * n; i++) sbuf_free(&texts[i]);
    free(texts);
    free(cm);
    free(out);
    free(hist);
    owned_free(&own_);
    return rc;
}

// /v1/chat/completions: the rendered prompt -> its tokens and the last-message boundary in tokens.
static int parse_chat(const struct openai_ctx *oc, const json_t *body, struct gen_request *r, struct req_error *re) {
    char *out;
    unsigned char *mk;
    size_t len, boundary;
    if (openai_render_chat(body, r, &out, &mk, &len, &boundary, re)) return -1;
    int rc = -1;
    // The boundary in tokens.  When the text after it opens with an added token (ChatML's
    // <|im_start|>), the tokenizer cuts there anyway, so the two halves tokenize independently
    // and their concatenation is the whole.  Otherwise: tokenize the whole and the prefix, and
    // keep the boundary only if the prefix's tokens are a prefix of the whole's.
    r->boundary = 0;
    static const char im_start[] = "<|im_start|>";
    int32_t *pre = NULL, *post = NULL;
    int npre = 0, npost = 0;
    if (boundary > 0 && boundary < len && !strncmp(out + boundary, im_start, sizeof im_start - 1)) {
        if (encode(oc, out, mk, boundary, &pre, &npre, re) ||
            encode(oc, out + boundary, mk + boundary, len - boundary, &post, &npost, re)) {
            free(pre);
            goto done;
        }
        if (!(r->prompt = malloc(sizeof *pre * ((size_t)npre + (size_t)npost)))) {
            free(pre), free(post);
            req_fail(re, 500, NULL, "out of memory");
            goto done;
        }
        memcpy(r->prompt, pre, sizeof *pre * (size_t)npre);
        memcpy(r->prompt + npre, post, sizeof *post * (size_t)npost);
        r->n_prompt = npre + npost;
        r->boundary = npre;
        free(pre), free(post);
    } else {
        if (encode(oc, out, mk, len, &r->prompt, &r->n_prompt, re)) goto done;
        if (boundary > 0 && boundary < len && !encode(oc, out, mk, boundary, &pre, &npre, re)) {
            if (npre > 0 && npre < r->n_prompt && !memcmp(pre, r->prompt, sizeof *pre * (size_t)npre)) r->boundary = npre;
            free(pre);
        }
    }
    rc = 0;
done:
    free(out);
    free(mk);
    return rc;
}

// /v1/completions: prompt as text (no template) or as token ids.
static int parse_completion(const struct openai_ctx *oc, const json_t *body, struct gen_request *r,
                            struct req_error *re) {
    const json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p)) return req_fail(re, 400, "prompt", "prompt is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return req_fail(re, 400, "prompt", "prompt must not be empty");
        return encode(oc, json_string_value(p), NULL, json_string_length(p), &r->prompt, &r->n_prompt, re);
    }
    if (!json_is_array(p)) return req_fail(re, 400, "prompt", "prompt must be a string or an array of token ids");
    size_t n = json_array_size(p);
    if (n == 0) return req_fail(re, 400, "prompt", "prompt must not be empty");
    if (n > (size_t)oc->context)
        return req_fail(re, 400, "prompt", "prompt (%zu tokens) exceeds the context of %lld tokens", n, oc->context);
    if (!(r->prompt = malloc(sizeof *r->prompt * n))) return req_fail(re, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(p, i);
        long long id;
        if (!json_is_integer(t)) {
            if (json_is_string(t) || json_is_array(t))
                return req_fail(re, 400, "prompt", "batched prompts are not supported (batch 1): give one string or one array of token ids");
            return req_fail(re, 400, "prompt", "prompt[%zu] must be an integer token id", i);
        }
        id = json_integer_value(t);
        if (id < 0 || id >= oc->vocab)
            return req_fail(re, 400, "prompt", "prompt[%zu] = %lld is outside the vocabulary (0 to %d)", i, id, oc->vocab - 1);
        r->prompt[i] = (int32_t)id;
    }
    r->n_prompt = (int)n;
    return 0;
}

// The whole request -> a job ready to queue, or a 4xx.
struct job *openai_parse_request(const struct openai_ctx *oc, enum openai_endpoint ep, const char *data, size_t len,
                                 struct req_error *re) {
    json_error_t je;
    json_t *body = json_loadb(data, len, 0, &je);
    if (!body) {
        req_fail(re, 400, NULL, "malformed JSON at line %d, column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    struct job *j = NULL;
    if (!json_is_object(body)) {
        req_fail(re, 400, NULL, "the request body must be a JSON object");
        goto fail;
    }
    if (!(j = openai_job_new(oc, ep))) {
        req_fail(re, 500, NULL, "out of memory");
        goto fail;
    }
    const bool chat = ep == OPENAI_CHAT;
    struct gen_request *r = &j->req;
    long long max_tokens;
    if (parse_common(oc, body, j, &max_tokens, re)) goto fail;
    if (chat ? parse_chat(oc, body, r, re) : parse_completion(oc, body, r, re)) goto fail;
    if (r->n_prompt < 1) {
        req_fail(re, 400, chat ? "messages" : "prompt", "the prompt is empty");
        goto fail;
    }
    const long long ctx = oc->context;
    if (r->n_prompt + 2 > ctx) {   // the prompt's fault whatever max_tokens says
        req_fail(re, 400, chat ? "messages" : "prompt",
                 "the prompt (%d tokens) + 1 generated token + 1 exceeds the context of %lld tokens", r->n_prompt, ctx);
        goto fail;
    }
    if (max_tokens <= 0) {   // none given: the server default, within what the context has left; -1: all of that
        const long long left = ctx - r->n_prompt - 1;
        max_tokens = max_tokens < 0 || left < oc->default_max_tokens ? left : oc->default_max_tokens;
    }
    if (r->n_prompt + max_tokens + 1 > ctx) {
        req_fail(re, 400, "max_tokens",
                 "prompt (%d tokens) + max_tokens (%lld) + 1 = %lld exceeds the context of %lld tokens", r->n_prompt,
                 max_tokens, r->n_prompt + max_tokens + 1, ctx);
        goto fail;
    }
    r->max_tokens = (int)max_tokens;
    json_decref(body);
    return j;
fail:
    job_unref(j);
    json_decref(body);
    return NULL;
}

// ---- the answer: logprobs ----------------------------------------------------------------------

static int on_logprobs(void *ctx, const struct token_lp *lp) {
    struct openai_resp *o = ctx;
    if (o->n_lps == o->lps_cap) {
        int cap = o->lps_cap ? 2 * o->lps_cap : 16;
        struct token_lp *p = realloc(o->lps, sizeof *p * (size_t)cap);
        if (!p) return -1;
        o->lps = p, o->lps_cap = cap;
    }
    o->lps[o->n_lps++] = *lp;
    return 0;
}

// A token's text (invalid UTF-8 as U+FFFD) and, for chat, its raw bytes.
static json_t *token_text(const struct openai_resp *o, int32_t id, json_t **bytes) {
    size_t n = 0, cn;
    const char *b = tokenizer_token_bytes(o->tok, id, &n);
    if (!b) b = "", n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)b[i]));
    }
    char *clean = NULL;
    if (utf8_sanitize(b, n, &clean, &cn)) return json_string("");
    json_t *s = json_stringn(clean, cn);
    free(clean);
    return s;
}

static json_t *chat_lp_item(const struct openai_resp *o, int32_t id, float lp) {
    json_t *bytes, *tok = token_text(o, id, &bytes);
    return json_pack("{s:o, s:f, s:o}", "token", tok, "logprob", (double)lp, "bytes", bytes);
}

// choice.logprobs for entries [from, to): chat {"content": [...]}, completions the legacy
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
static json_t *logprobs_json(const struct openai_resp *o, int from, int to) {
    if (o->chat) {
        json_t *content = json_array();
        for (int i = from; i < to; i++) {
            const struct token_lp *t = &o->lps[i];
            json_t *item = chat_lp_item(o, t->id, t->lp), *top = json_array();
            for (int k = 0; k < t->n_top; k++) json_array_append_new(top, chat_lp_item(o, t->top_id[k], t->top_lp[k]));
            json_object_set_new(item, "top_logprobs", top);
            json_array_append_new(content, item);
        }
        return json_pack("{s:o, s:n}", "content", content, "refusal");
    }
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t off = 0, n;
    for (int i = 0; i < to; i++) {
        const struct token_lp *t = &o->lps[i];
        if (i >= from) {
            json_array_append_new(tokens, token_text(o, t->id, NULL));
            json_array_append_new(lps, json_real(t->lp));
            json_array_append_new(offs, json_integer((json_int_t)off));
            json_t *top = json_object();
            for (int k = 0; k < t->n_top; k++) {
                json_t *s = token_text(o, t->top_id[k], NULL);
                json_object_set_new(top, json_string_value(s), json_real(t->top_lp[k]));
                json_decref(s);
            }
            json_array_append_new(tops, top);
        }
        if (tokenizer_token_bytes(o->tok, t->id, &n)) off += n;
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

// Streaming: the logprobs not sent yet (null when off or none are new).
static json_t *logprobs_pending(struct openai_resp *o) {
    if (o->j->req.logprobs < 0 || o->lps_sent == o->n_lps) return json_null();
    json_t *l = logprobs_json(o, o->lps_sent, o->n_lps);
    o->lps_sent = o->n_lps;
    return l;
}

// ---- the answer: usage, timings, finish ----------------------------------------------------------

static const char *finish_reason(enum gen_finish f) {
    return f == GEN_FINISH_LENGTH ? "length" : f == GEN_FINISH_TOOL_CALLS ? "tool_calls" : "stop";
}

static json_t *usage_json(const struct gen_end *e) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", e->n_prompt, "completion_tokens", e->n_gen,
                     "total_tokens", e->n_prompt + e->n_gen, "prompt_tokens_details", "cached_tokens", e->n_cached);
}

static json_t *ids_json(const struct gen_end *e) {
    json_t *a = json_array();
    for (int i = 0; i < e->n_gen; i++) json_array_append_new(a, json_integer(e->ids[i]));
    return a;
}

static json_t *timings_json(const struct gen_end *e) {
    return json_pack("{s:f, s:f, s:f, s:i, s:i}", "queue_ms", e->queue_ms, "prefill_ms", e->prefill_ms, "decode_ms",
                     e->decode_ms, "prompt_tokens_processed", e->n_prompt - e->n_cached, "generated_tokens", e->n_gen);
}

// The whole non-streamed answer.
static json_t *completion_json(const struct openai_resp *o, const struct gen_end *e) {
    const char *finish = finish_reason(e->finish);
    json_t *choice;
    if (o->chat) {
        json_t *msg = json_pack("{s:s, s:s%}", "role", "assistant", "content", o->content.p ? o->content.p : "",
                                o->content.len);
        if (o->j->req.reasoning)
            json_object_set_new(msg, "reasoning_content",
                                json_stringn(o->reasoning_text.p ? o->reasoning_text.p : "", o->reasoning_text.len));
        if (o->calls) {   // as OpenAI: content null when the answer is only calls
            json_object_set(msg, "tool_calls", o->calls);
            if (!o->content.len) json_object_set_new(msg, "content", json_null());
        }
        choice = json_pack("{s:i, s:o, s:s}", "index", 0, "message", msg, "finish_reason", finish);
    } else {
        choice = json_pack("{s:i, s:s%, s:s}", "index", 0, "text", o->content.p ? o->content.p : "", o->content.len,
                           "finish_reason", finish);
    }
    json_object_set_new(choice, "logprobs", o->j->req.logprobs >= 0 ? logprobs_json(o, 0, o->n_lps) : json_null());
    if (o->return_ids) json_object_set_new(choice, "token_ids", ids_json(e));
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o, s:o}", "id", o->j->id, "object",
                     o->chat ? "chat.completion" : "text_completion", "created", (json_int_t)o->created, "model",
                     o->model_name, "choices", choice, "usage", usage_json(e), "timings", timings_json(e));
}

// ---- the answer: server-sent events --------------------------------------------------------------

static void sse_json(struct job *j, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s) job_sse(j, s, strlen(s));
    free(s);
}

// One streamed chunk: delta text on a field, or (field NULL) the role / the finish.
static json_t *chunk_new(const struct openai_resp *o) {
    return json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", o->j->id, "object",
                     o->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)o->created, "model",
                     o->model_name, "choices");
}

static void stream_delta(struct openai_resp *o, const char *field, const char *text, size_t len, const char *finish) {
    json_t *c = chunk_new(o);
    json_t *choice = json_pack("{s:i, s:o}", "index", 0, "finish_reason", finish ? json_string(finish) : json_null());
    if (o->chat) {
        json_t *delta = json_object();
        if (field) json_object_set_new(delta, field, json_stringn(text, len));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", json_stringn(field ? text : "", field ? len : 0));
    }
    json_object_set_new(choice, "logprobs", logprobs_pending(o));
    json_array_append_new(json_object_get(c, "choices"), choice);
    sse_json(o->j, c);
}

// The first chunk goes out with the first token (time to first token): the role for chat.
static void stream_begin(struct openai_resp *o) {
    if (!o->chat) {
        stream_delta(o, "text", "", 0, NULL);
        return;
    }
    json_t *c = chunk_new(o);
    json_array_append_new(json_object_get(c, "choices"), json_pack("{s:i, s:{s:s, s:s}, s:n}", "index", 0, "delta",
                                                                   "role", "assistant", "content", "", "finish_reason"));
    sse_json(o->j, c);
}

// The end of a stream: the finish chunk with usage, or an error event; then [DONE].
static void stream_end(struct openai_resp *o, const struct gen_end *e) {
    if (e->finish) {
        json_t *c = chunk_new(o);
        json_t *choice = json_pack("{s:i, s:s}", "index", 0, "finish_reason", finish_reason(e->finish));
        if (o->chat) json_object_set_new(choice, "delta", json_object());
        else json_object_set_new(choice, "text", json_string(""));
        json_object_set_new(choice, "logprobs", logprobs_pending(o));
        if (o->return_ids) json_object_set_new(choice, "token_ids", ids_json(e));
        json_array_append_new(json_object_get(c, "choices"), choice);
        json_object_set_new(c, "timings", timings_json(e));
        sse_json(o->j, c);
        if (o->include_usage) {   // usage once, in a chunk of its own after the finish, as OpenAI
            c = chunk_new(o);
            json_object_set_new(c, "usage", usage_json(e));
            sse_json(o->j, c);
        }
    } else {
        sse_json(o->j, openai_error_body(e->status, NULL, e->message));
    }
    job_sse(o->j, "[DONE]", 6);
}

// ---- the sink ------------------------------------------------------------------------------------

// A prefill of several chunks, while streaming: SSE comments (": prefill DONE/TOTAL").
static void on_progress(void *ctx, int done, int total) {
    struct openai_resp *o = ctx;
    if (!o->j->stream) return;
    char text[64];
    snprintf(text, sizeof text, "prefill %d/%d", done, total);
    job_sse_comment(o->j, text);
}

static void on_begin(void *ctx) {
    struct openai_resp *o = ctx;
    if (o->j->stream) stream_begin(o);
}

static void on_text(void *ctx, enum gen_channel ch, const char *s, size_t n) {
    struct openai_resp *o = ctx;
    sbuf_add(ch == GEN_REASONING ? &o->reasoning_text : &o->content, s, n);
    if (o->j->stream)
        stream_delta(o, !o->chat ? "text" : ch == GEN_REASONING ? "reasoning_content" : "content", s, n, NULL);
}

static void on_tool_call(void *ctx, const char *name, const char *arguments) {
    struct openai_resp *o = ctx;
    char id[40] = "call_";
    random_hex(id + 5, 12);
    json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", name,
                          "arguments", arguments);
    if (!c || (o->one_call && o->calls) || (!o->calls && !(o->calls = json_array()))) {   // parallel_tool_calls false: the first only
        json_decref(c);
        return;
    }
    if (o->j->stream) {   // one delta per call, whole: no markup, arguments complete
        json_t *k = chunk_new(o), *d = json_deep_copy(c);
        json_object_set_new(d, "index", json_integer((json_int_t)json_array_size(o->calls)));
        json_array_append_new(json_object_get(k, "choices"),
                              json_pack("{s:i, s:{s:[o]}, s:n, s:o}", "index", 0, "delta", "tool_calls", d,
                                        "finish_reason", "logprobs", logprobs_pending(o)));
        sse_json(o->j, k);
    }
    json_array_append_new(o->calls, c);
}

// The end: the stream's last events, or the whole answer (an error in OpenAI's shape on failure).
static void on_end(void *ctx, const struct gen_end *e) {
    struct openai_resp *o = ctx;
    if (o->j->stream) return stream_end(o, e);
    json_t *body = e->finish ? completion_json(o, e) : openai_error_body(e->status, NULL, e->message);
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (s) job_answer(o->j, e->finish ? 200 : e->status, s, strlen(s));
    else job_answer(o->j, 500, "", 0);   // out of memory: an empty body (the transport answers for it)
    free(s);
}

static void resp_free(void *ctx) {
    struct openai_resp *o = ctx;
    sbuf_free(&o->content);
    sbuf_free(&o->reasoning_text);
    json_decref(o->calls);
    free(o->lps);
    free(o);
}

struct job *openai_job_new(const struct openai_ctx *oc, enum openai_endpoint ep) {
    struct job *j = job_new();
    struct openai_resp *o = j ? malloc(sizeof *o) : NULL;
    if (!o) {
        job_unref(j);
        return NULL;
    }
    *o = (struct openai_resp){.j = j, .chat = ep == OPENAI_CHAT, .tok = oc->tok, .model_name = oc->model_name,
                              .created = (long long)time(NULL)};
    j->sink = (struct gen_sink){.ctx = o, .progress = on_progress, .begin = on_begin, .logprobs = on_logprobs,
                                .text = on_text, .tool_call = on_tool_call, .end = on_end};
    j->sink_free = resp_free;
    j->kind = o->chat ? "chat" : "completion";
    char hex[25];
    random_hex(hex, 12);   // unique across restarts, unlike a counter
    snprintf(j->id, sizeof j->id, "%s-%s", o->chat ? "chatcmpl" : "cmpl", hex);
    return j;
}
