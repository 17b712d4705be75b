// chatreq.c: what the protocol modules share on the request side (chatreq.h): the checks every
// API makes, and the chat template's input (messages, tools, tool choice, thinking) rendered by
// chat.c and tokenized with a mask, so that text typed by a client never becomes a control token.
#include "chatreq.h"

#include "chat.h"
#include "constrain.h"
#include "tokenizer.h"
#include "toolcall.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- checks --------------------------------------------------------------------------------------

json_t *chatreq_load(const char *data, size_t len, struct req_error *re) {
    json_error_t je;
    json_t *body = json_loadb(data, len, 0, &je);
    if (!body) {
        req_fail(re, 400, NULL, "malformed JSON at line %d, column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (json_is_object(body)) return body;
    req_fail(re, 400, NULL, "the request body must be a JSON object");
    json_decref(body);
    return NULL;
}

// (The message goes into JSON, which must be valid UTF-8.)
int chatreq_clip(const char *s, int max) {
    int n = (int)strnlen(s, (size_t)max + 1);
    if (n <= max) return n;
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80) n--; // s[n] is the first byte left out
    return n;
}

// ---- request fields ----------------------------------------------------------------------------

// v equal to the JSON text lit (numbers by value: 1 and 1.0 are one value).
static bool json_is(const json_t *v, const char *lit, size_t n) {
    json_t *w = json_loadb(lit, n, JSON_DECODE_ANY, NULL);
    bool eq = w && (json_is_number(v) && json_is_number(w) ? json_number_value(v) == json_number_value(w)
                                                           : json_equal((json_t *)v, w));
    json_decref(w);
    return eq;
}

// FIELD_OFF: one of f->arg.
static bool field_off(const struct chatreq_field *f, const json_t *v) {
    for (const char *a = f->arg; a && *a;) {
        const char *bar = strchr(a, '|');
        const size_t n = bar ? (size_t)(bar - a) : strlen(a);
        if (json_is(v, a, n)) return true;
        a += n + (bar != NULL);
    }
    return false;
}

static bool field_inert_ok(const char *type, const json_t *v) {
    if (!strcmp(type, "any")) return true;
    if (!strcmp(type, "string")) return json_is_string(v);
    if (!strcmp(type, "boolean")) return json_is_boolean(v);
    if (!json_is_object(v)) return false; // metadata: string values
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x) if (!json_is_string(x)) return false;
    return true;
}

int chatreq_check_fields(const json_t *body, const struct chatreq_field *fields, size_t n, unsigned ep,
                         const char *unknown, const char *elsewhere, struct req_error *re) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        if (json_is_null(v)) continue; // null is absent, for any field
        const struct chatreq_field *f = NULL;
        for (size_t i = 0; !f && i < n; i++)
            if (!strcmp(fields[i].name, key)) f = &fields[i];
        if (!f) return req_fail(re, 400, NULL, unknown, chatreq_clip(key, 64), key);
        if (!(f->eps & ep)) return req_fail(re, 400, f->name, elsewhere ? elsewhere : "%s is not taken here", f->name);
        if (f->kind == FIELD_INERT && !field_inert_ok(f->arg, v))
            return req_fail(re, 400, f->name, "%s must be %s", f->name,
                            !strcmp(f->arg, "metadata") ? "an object of strings"
                            : !strcmp(f->arg, "string") ? "a string"
                                                        : "a boolean");
        if (f->kind == FIELD_OFF && !field_off(f, v)) return req_fail(re, 400, f->name, "%s", f->why);
    }
    return 0;
}

// ---- sampling ------------------------------------------------------------------------------------
//
// Decoding is greedy unless the server runs with --allow-sampling: then the API's share of
// temperature, top_p, top_k, min_p, presence_penalty and seed fill the request's gen_sampling.
// The other sampling parameters take only the value that means greedy, and so do all of them
// without the flag: anything else is a 400 naming the parameter (reject, never clamp: the rule of
// options.h).  One table, checked in order.
enum greedy_kind {
    GREEDY_NUM_EQ,    // a number in [lo, hi]; only `greedy` is accepted
    GREEDY_INT_LE,    // an integer >= lo; values <= `greedy` are accepted (top_k: -1, 0, 1)
    GREEDY_INT_EQ,    // an integer >= lo; only `greedy` is accepted (n, best_of)
    GREEDY_NULL,      // must be absent or null (seed)
    GREEDY_EMPTY_OBJ, // absent, null or {} (logit_bias)
};

static const struct greedy_rule {
    const char *name;
    enum greedy_kind kind;
    double greedy, lo, hi;
    const char *why;
    unsigned sample; // the SAMPLE_ bit of a parameter --allow-sampling takes (0: greedy-only always)
} greedy_rules[] = {
    {"temperature", GREEDY_NUM_EQ, 0, 0, 2, "temperature must be 0 (greedy decoding only)", SAMPLE_TEMPERATURE},
    {"top_p", GREEDY_NUM_EQ, 1, 0, 1, "top_p must be 1 (greedy decoding only)", SAMPLE_TOP_P},
    {"top_k", GREEDY_INT_LE, 1, -1, 0, "top_k must be 1, 0 or -1 (greedy decoding only)", SAMPLE_TOP_K},
    {"min_p", GREEDY_NUM_EQ, 0, 0, 1, "min_p must be 0 (greedy decoding only)", SAMPLE_MIN_P},
    {"typical_p", GREEDY_NUM_EQ, 1, 0, 1, "typical_p must be 1 (greedy decoding only)", 0},
    {"n", GREEDY_INT_EQ, 1, 1, 0, "n must be 1 (one choice per request)", 0},
    {"best_of", GREEDY_INT_EQ, 1, 1, 0, "best_of must be 1 (greedy decoding only)", 0},
    {"seed", GREEDY_NULL, 0, 0, 0, "seed is not supported: decoding is greedy and deterministic", SAMPLE_SEED},
    {"presence_penalty", GREEDY_NUM_EQ, 0, -2, 2, "presence_penalty must be 0 (greedy decoding only)",
     SAMPLE_PRESENCE_PENALTY},
    {"frequency_penalty", GREEDY_NUM_EQ, 0, -2, 2, "frequency_penalty must be 0 (greedy decoding only)", 0},
    {"repetition_penalty", GREEDY_NUM_EQ, 1, 0, 10, "repetition_penalty must be 1 (greedy decoding only)", 0},
    {"logit_bias", GREEDY_EMPTY_OBJ, 0, 0, 0, "logit_bias is not supported (greedy decoding only)", 0},
};
enum { N_GREEDY_RULES = sizeof greedy_rules / sizeof greedy_rules[0] };

bool chatreq_integral(const json_t *v, long long *out) {
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

// One rule on the body: 0 when the field is absent, null or greedy.  why: the refusal's reason.
static int check_rule(const struct greedy_rule *g, const json_t *body, const char *why, struct req_error *re) {
    const json_t *v = json_object_get(body, g->name);
    if (!v || json_is_null(v)) return 0;
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
        if (!chatreq_integral(v, &k)) return req_fail(re, 400, g->name, "%s must be an integer", g->name);
        if (k < (long long)g->lo)
            return req_fail(re, 400, g->name, "%s must be at least %g, got %lld", g->name, g->lo, k);
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

// A number field in [lo, hi] (open at lo when lo_open); absent or null: def.
static int get_num(const json_t *body, const char *name, double lo, double hi, bool lo_open, double def, double *out,
                   struct req_error *re) {
    const json_t *v = json_object_get(body, name);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return req_fail(re, 400, name, "%s must be a number", name);
    const double d = json_number_value(v);
    if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
        return req_fail(re, 400, name, "%s must be %s %g and %g, got %g", name, lo_open ? "above" : "between", lo, hi,
                        d);
    *out = d;
    return 0;
}

int chatreq_sampling(const json_t *body, bool allow, unsigned takes, double max_temperature, struct gen_sampling *s,
                     struct req_error *re) {
    *s = (struct gen_sampling){.top_p = 1};
    char why[200], list[120] = "";
    for (size_t i = 0; i < N_GREEDY_RULES; i++)
        if (greedy_rules[i].sample & takes)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? ", " : "", greedy_rules[i].name);
    for (size_t i = 0; i < N_GREEDY_RULES; i++) {
        const struct greedy_rule *g = &greedy_rules[i];
        const bool takes_it = (g->sample & takes) != 0;
        if (allow && takes_it) continue; // parsed below
        if (allow)
            snprintf(why, sizeof why, "%s is not supported (sampling takes %s)", g->name, list);
        else
            snprintf(why, sizeof why, "%s%s", g->why,
                     takes_it ? "; calla serve --allow-sampling enables sampling" : "");
        if (check_rule(g, body, why, re)) return -1;
    }
    if (!allow) return 0;
    double t, p, mp, pp;
    if (get_num(body, "temperature", 0, max_temperature, false, 0, &t, re) ||
        get_num(body, "top_p", 0, 1, true, 1, &p, re) || get_num(body, "min_p", 0, 1, false, 0, &mp, re) ||
        get_num(body, "presence_penalty", -2, 2, false, 0, &pp, re))
        return -1;
    long long k = 0, seed = 0;
    const json_t *v = json_object_get(body, "top_k");
    if (v && !json_is_null(v) && (!chatreq_integral(v, &k) || k < -1 || k > INT32_MAX))
        return req_fail(re, 400, "top_k", "top_k must be an integer, at least 0 (0 or -1: no cut)");
    if (k < 0) k = 0; // -1: vLLM's "no cut", the same as 0
    v = json_object_get(body, "seed");
    const bool has_seed = v && !json_is_null(v);
    if (has_seed && !json_is_integer(v)) return req_fail(re, 400, "seed", "seed must be an integer");
    if (has_seed) seed = json_integer_value(v);
    if (t == 0) { // greedy: the other parameters must not ask for what only a draw can do
        const char *which = p != 1    ? "top_p"
                            : k > 1   ? "top_k"
                            : mp != 0 ? "min_p"
                            : pp != 0 ? "presence_penalty"
                                      : NULL;
        if (which)
            return req_fail(re, 400, which,
                            "%s needs a temperature above 0 (with temperature 0 or none, decoding is greedy)", which);
        return 0; // a seed with greedy decoding changes nothing: accepted
    }
    *s = (struct gen_sampling){.on = true,
                               .temperature = (float)t,
                               .top_p = (float)p,
                               .min_p = (float)mp,
                               .presence_penalty = (float)pp,
                               .top_k = (int)k,
                               .seed = (uint64_t)seed,
                               .has_seed = has_seed};
    if (!has_seed) { // a random one per request, reported nowhere
        char hex[17];
        random_hex(hex, 8);
        s->seed = strtoull(hex, NULL, 16);
    }
    return 0;
}

int check_greedy(const json_t *body, struct req_error *re) {
    struct gen_sampling s;
    return chatreq_sampling(body, false, SAMPLE_ALL, 2, &s, re);
}

int chatreq_effort_thinks(const char *effort) {
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(effort, efforts[i])) return i >= 2;
    return -1;
}

int chatreq_session(const json_t *body, const char *const *names, struct job *j, struct req_error *re) {
    for (; *names; names++) {
        const json_t *v;
        if (chatreq_get_opt(body, *names, JSON_STRING, &v, re)) return -1;
        if (v && !j->session[0] && session_id_valid(json_string_value(v), json_string_length(v)))
            memcpy(j->session, json_string_value(v), json_string_length(v) + 1);
    }
    return 0;
}

int chatreq_get_opt(const json_t *obj, const char *name, json_type type, const json_t **out, struct req_error *re) {
    const json_t *v = json_object_get(obj, name);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    bool ok = type == JSON_TRUE      ? json_is_boolean(v)
              : type == JSON_INTEGER ? json_is_number(v)
                                     : json_typeof(v) == type;
    if (!ok) {
        static const char *const names[] = {"an object", "an array",  "a string",  "an integer",
                                            "a number",  "a boolean", "a boolean", "null"};
        return req_fail(re, 400, name, "%s must be %s", name, names[type]);
    }
    *out = v;
    return 0;
}

int chatreq_get_bool(const json_t *obj, const char *name, bool def, bool *out, struct req_error *re) {
    const json_t *v;
    if (chatreq_get_opt(obj, name, JSON_TRUE, &v, re)) return -1;
    *out = v ? json_is_true(v) : def;
    return 0;
}

// Text of a message's content: a string, null, or an array of {"type": "text", "text": ...}.
static int message_text(const json_t *content, size_t idx, struct sbuf *out, struct req_error *re) {
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) {
        if (sbuf_add(out, json_string_value(content), json_string_length(content)))
            return req_fail(re, 500, NULL, "out of memory");
        return 0;
    }
    if (!json_is_array(content))
        return req_fail(re, 400, "messages", "messages[%zu].content must be a string or an array of text parts", idx);
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return req_fail(re, 400, "messages", "messages[%zu].content[%zu] must be an object with a \"type\"", idx,
                            i);
        if (strcmp(json_string_value(type), "text"))
            return req_fail(re, 400, "messages",
                            "messages[%zu].content[%zu]: type \"%.*s\" is not supported (text only)", idx, i,
                            chatreq_clip(json_string_value(type), 64), json_string_value(type));
        if (!json_is_string(text))
            return req_fail(re, 400, "messages", "messages[%zu].content[%zu].text must be a string", idx, i);
        if (sbuf_add(out, json_string_value(text), json_string_length(text)))
            return req_fail(re, 500, NULL, "out of memory");
    }
    return 0;
}

int chatreq_tokens(const struct tokenizer *tok, const char *text, const unsigned char *markup, size_t len,
                   int32_t **ids, int *n, struct req_error *re) {
    size_t nn = 0;
    char err[256];
    if (tokenizer_encode_markup(tok, text, len, markup, ids, &nn, err, sizeof err))
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

static void *own_alloc(struct owned *o, size_t bytes) {
    return own(o, calloc(1, bytes ? bytes : 1));
}

static void owned_free(struct owned *o) {
    for (size_t i = 0; i < o->n; i++) free(o->v[i]);
    free(o->v);
}

// A function name as OpenAI allows it: 1..64 of [A-Za-z0-9_-] (also what keeps it from breaking
// the <function=NAME> markup).
bool chatreq_valid_name(const char *s) {
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
    if (chatreq_get_opt(body, "tools", JSON_ARRAY, &tools, re)) return -1;
    size_t n = tools ? json_array_size(tools) : 0;
    if (n > MAX_TOOLS) return req_fail(re, 400, "tools", "at most %d tools, got %zu", MAX_TOOLS, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(tools, i), *f = json_object_get(t, "function");
        const json_t *type = json_object_get(t, "type"), *name = json_object_get(f, "name");
        if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function"))
            return req_fail(re, 400, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
        if (!json_is_object(f) || !json_is_string(name) || !chatreq_valid_name(json_string_value(name)))
            return req_fail(re, 400, "tools", "tools[%zu].function.name must be 1 to 64 letters, digits, _ or -", i);
        const json_t *params = json_object_get(f, "parameters"), *desc = json_object_get(f, "description");
        if (params && !json_is_object(params))
            return req_fail(re, 400, "tools", "tools[%zu].function.parameters must be a JSON Schema object", i);
        if (desc && !json_is_string(desc))
            return req_fail(re, 400, "tools", "tools[%zu].function.description must be a string", i);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(json_string_value(name), json_string_value(json_object_get(
                                                     json_object_get(json_array_get(tools, k), "function"), "name"))))
                return req_fail(re, 400, "tools", "tools[%zu]: the function name \"%s\" is used twice", i,
                                json_string_value(name));
    }
    bool none = false, forced = false;
    const char *fname = NULL; // tool_choice names a function
    if (choice && !json_is_null(choice)) {
        const char *c = json_is_string(choice) ? json_string_value(choice) : NULL;
        const json_t *named = json_object_get(json_object_get(choice, "function"), "name");
        if (c && !strcmp(c, "none"))
            none = true;
        else if (c && !strcmp(c, "auto"))
            none = false;
        else if (c && !strcmp(c, "required"))
            forced = true;
        else if (json_is_object(choice) && json_is_string(named))
            forced = true, fname = json_string_value(named);
        else
            return req_fail(re, 400, "tool_choice",
                            "tool_choice must be \"auto\", \"none\", \"required\" or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (!n) return req_fail(re, 400, "tool_choice", "tool_choice needs tools");
    }
    const json_t *par = json_object_get(body, "parallel_tool_calls");
    if (par && !json_is_null(par) && !json_is_boolean(par))
        return req_fail(re, 400, "parallel_tool_calls", "parallel_tool_calls must be a boolean");
    if (!n || none) return 0; // "none": the tools are left out of the prompt, output is content
    const char **rendered = own_alloc(own_, sizeof *rendered * n);
    for (size_t i = 0; rendered && i < n; i++) rendered[i] = own(own_, tool_tojson(json_array_get(tools, i)));
    if (own_->oom) return req_fail(re, 500, NULL, "out of memory");
    co->tools = rendered;
    co->n_tools = n;
    r->tools = json_incref((json_t *)tools);
    if (!forced) return 0;
    // "required" or a named function: the answer is constrained to one well-formed call.
    if (r->schema)
        return req_fail(re, 400, "tool_choice",
                        "tool_choice \"required\" or a function cannot be combined with a "
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
        if (!json_is_object(c) || !json_is_object(f) || !json_is_string(name) ||
            !chatreq_valid_name(json_string_value(name)))
            return req_fail(re, 400, "messages", "messages[%zu].tool_calls[%zu] must have a function with a valid name",
                            idx, k);
        json_t *args = NULL;
        if (json_is_string(a))
            args = json_loadb(json_string_value(a), json_string_length(a), JSON_DECODE_ANY, NULL);
        else if (json_is_object(a))
            args = json_incref((json_t *)a);
        else if (!a || json_is_null(a))
            args = json_object();
        if (!json_is_object(args)) {
            json_decref(args);
            return req_fail(re, 400, "messages",
                            "messages[%zu].tool_calls[%zu].function.arguments must be a JSON object "
                            "(as a string)",
                            idx, k);
        }
        size_t na = json_object_size(args), i = 0;
        const char **names = own_alloc(o, sizeof *names * na), **values = own_alloc(o, sizeof *values * na);
        const char *key;
        json_t *v;
        json_object_foreach(args, key, v) {
            if (!names || !values) break;
            names[i] = own(o, strdup(key));
            values[i++] =
                own(o, json_is_string(v) ? strndup(json_string_value(v), json_string_length(v)) : tool_tojson(v));
        }
        json_decref(args);
        if (o->oom) return req_fail(re, 500, NULL, "out of memory");
        tc[k] = (struct chat_tool_call){
            .name = json_string_value(name), .n_args = na, .arg_names = names, .arg_values = values};
    }
    cm->tool_calls = tc;
    cm->n_tool_calls = n;
    return 0;
}

// Thinking on or off, from whichever of three fields says it: chat_template_kwargs.enable_thinking
// (the template's own variable), a top-level enable_thinking (the same, as some clients send it),
// or reasoning_effort (chatreq_effort_thinks).  Two that disagree are a 400.
static int parse_thinking(const json_t *body, const json_t *kw, bool *think, struct req_error *re) {
    const char *said = NULL; // the first field that set it
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
            const int k = json_is_string(v) ? chatreq_effort_thinks(json_string_value(v)) : -1;
            if (k < 0)
                return req_fail(
                    re, 400, "reasoning_effort",
                    "reasoning_effort must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\"");
            b = k;
        }
        if (said && b != on)
            return req_fail(re, 400, i == 2 ? "reasoning_effort" : "enable_thinking",
                            "%s and %s disagree about thinking", said, names[i]);
        said = names[i], on = b;
    }
    *think = on;
    return 0;
}

int chatreq_render(const json_t *body, bool after_turn, struct gen_request *req, char **out_, unsigned char **markup,
                   size_t *out_len, size_t *boundary_, struct req_error *re) {
    *out_ = NULL;
    if (markup) *markup = NULL;
    const json_t *msgs = json_object_get(body, "messages");
    if (!msgs || json_is_null(msgs)) return req_fail(re, 400, "messages", "messages is required");
    if (!json_is_array(msgs)) return req_fail(re, 400, "messages", "messages must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return req_fail(re, 400, "messages", "messages must not be empty");
    struct chat_options co = CHAT_OPTIONS_DEFAULT;
    const json_t *kw;
    if (chatreq_get_opt(body, "chat_template_kwargs", JSON_OBJECT, &kw, re)) return -1;
    bool think = true, preserve = false;
    if (parse_thinking(body, kw, &think, re) || (kw && chatreq_get_bool(kw, "preserve_thinking", false, &preserve, re)))
        return -1;
    co.enable_thinking = think;
    co.preserve_thinking = preserve;
    co.after_turn = after_turn;
    req->reasoning = think;

    struct owned own_ = {0};
    struct chat_message *cm = calloc(n, sizeof *cm);
    struct sbuf *texts = calloc(2 * n, sizeof *texts); // content, reasoning per message
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
                     chatreq_clip(rs, 64), rs);
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

// The rendered prompt -> its tokens after before[0..n_before), and the snapshot point in tokens.
static int tokenize(const struct tokenizer *tok, const char *out, const unsigned char *mk, size_t len, size_t boundary,
                    const int32_t *before, int n_before, struct gen_request *r, struct req_error *re) {
    // The boundary in tokens.  When the text after it opens with an added token (ChatML's
    // <|im_start|>), the tokenizer cuts there anyway, so the two halves tokenize independently
    // and their concatenation is the whole.  Otherwise: tokenize the whole and the prefix, and
    // keep the boundary only if the prefix's tokens are a prefix of the whole's.
    r->boundary = 0;
    static const char im_start[] = "<|im_start|>";
    int32_t *pre = NULL, *post = NULL;
    int npre = 0, npost = 0, rc = -1;
    const bool cut = boundary > 0 && boundary < len && !strncmp(out + boundary, im_start, sizeof im_start - 1);
    if (cut ? chatreq_tokens(tok, out, mk, boundary, &pre, &npre, re) ||
                  chatreq_tokens(tok, out + boundary, mk + boundary, len - boundary, &post, &npost, re)
            : chatreq_tokens(tok, out, mk, len, &post, &npost, re))
        goto done;
    if (!cut && boundary > 0 && boundary < len && !chatreq_tokens(tok, out, mk, boundary, &pre, &npre, re)) {
        if (!(npre > 0 && npre < npost && !memcmp(pre, post, sizeof *pre * (size_t)npre))) npre = -1; // no boundary
    } else if (!cut) {
        npre = -1;
    }
    const int head = cut ? npre : 0; // tokens of pre that are part of the prompt
    if (!(r->prompt = malloc(sizeof *r->prompt * ((size_t)n_before + (size_t)head + (size_t)npost + 1)))) {
        req_fail(re, 500, NULL, "out of memory");
        goto done;
    }
    if (n_before) memcpy(r->prompt, before, sizeof *before * (size_t)n_before);
    if (head) memcpy(r->prompt + n_before, pre, sizeof *pre * (size_t)head);
    if (npost) memcpy(r->prompt + n_before + head, post, sizeof *post * (size_t)npost);
    r->n_prompt = n_before + head + npost;
    if (npre > 0) r->boundary = n_before + npre;
    rc = 0;
done:
    free(pre), free(post);
    return rc;
}

int chatreq_encode(const struct tokenizer *tok, const json_t *chat, const int32_t *before, int n_before,
                   struct gen_request *r, struct req_error *re) {
    char *out;
    unsigned char *mk;
    size_t len, boundary;
    if (chatreq_render(chat, n_before > 0, r, &out, &mk, &len, &boundary, re)) return -1;
    int rc = tokenize(tok, out, mk, len, boundary, before, n_before, r, re);
    free(out);
    free(mk);
    return rc;
}

// ---- fitting the context, stop strings -------------------------------------------------------------

int chatreq_fit(struct gen_request *r, long long context, long long default_max, long long max_tokens,
                const char *prompt_param, const char *max_param, struct req_error *re) {
    const long long ctx = context;
    if (r->n_prompt + 2 > ctx) // the prompt's fault whatever max_tokens says
        return req_fail(re, 400, prompt_param,
                        "the prompt (%d tokens) + 1 generated token + 1 exceeds the context of %lld tokens",
                        r->n_prompt, ctx);
    if (max_tokens <= 0) { // none given: the server default, within what the context has left; -1: all of that
        const long long left = ctx - r->n_prompt - 1;
        max_tokens = max_tokens < 0 || left < default_max ? left : default_max;
    }
    if (r->n_prompt + max_tokens + 1 > ctx)
        return req_fail(re, 400, max_param,
                        "prompt (%d tokens) + %s (%lld) + 1 = %lld exceeds the context of %lld tokens", r->n_prompt,
                        max_param, max_tokens, r->n_prompt + max_tokens + 1, ctx);
    r->max_tokens = (int)max_tokens;
    return 0;
}

int chatreq_stops(struct gen_request *r, const json_t *stop, const char *param, int max, struct req_error *re) {
    if (!stop || json_is_null(stop)) return 0;
    size_t n = 1;
    if (json_is_array(stop)) {
        n = json_array_size(stop);
        if (n > (size_t)max) return req_fail(re, 400, param, "%s may hold at most %d strings, got %zu", param, max, n);
    } else if (!json_is_string(stop)) {
        return req_fail(re, 400, param, "%s must be a string or an array of strings", param);
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_array(stop) ? json_array_get(stop, i) : stop;
        if (!json_is_string(s)) return req_fail(re, 400, param, "%s[%zu] must be a string", param, i);
        size_t len = json_string_length(s);
        if (len == 0) return req_fail(re, 400, param, "%s strings must not be empty", param);
        if (len > MAX_STOP_BYTES)
            return req_fail(re, 400, param, "%s strings are limited to %d bytes, got %zu", param, MAX_STOP_BYTES, len);
        if (gen_request_add_stop(r, json_string_value(s), len)) return req_fail(re, 500, NULL, "out of memory");
    }
    return 0;
}
