// responses.c: OpenAI's Responses API (responses.h), as functions without sockets.
//
//   requests:  a JSON body -> the chat template's input (chatreq.h): `instructions` and the
//              system / developer messages before the conversation make the system message (the
//              template has one, first; a later one is given as a user message); `input` (a
//              string, or items: message, function_call, function_call_output, reasoning) the
//              messages, consecutive assistant items one assistant turn; function `tools` and
//              `tool_choice` as OpenAI's chat; `text.format` json_schema a constraint;
//              `reasoning.effort` "none" or "minimal" turns thinking off -> a job; or a 4xx naming the field.
//              previous_response_id puts the stored conversation first; when the instructions
//              and tools are the same and the stored output ended its turn, the prompt is the
//              stored tokens and the new items' (chat.h after_turn), so the session cache's
//              end state of that response is its prefix and only what is new is prefilled.
//   answers:   the job's sink: the generation's parts (answer.h) -> output items (reasoning,
//              message, function_call), streamed as response.created, response.output_item.added,
//              response.content_part.added, response.output_text.delta / reasoning_text.delta /
//              function_call_arguments.delta and their .done, response.output_item.done,
//              response.completed (incomplete, failed), or the whole response at the end; kept in
//              the store when `store` (the default) is true.
//
// Every top-level field is in `fields` (a field not there is a 400 naming it, as OpenAI's
// "Unknown parameter").  Sampling is greedy unless the server runs with --allow-sampling: then
// temperature and top_p fill the generation's sampling (chatreq_sampling); without it only their
// greedy values pass.  Nothing a client sends can reach an abort().
#include "responses.h"

#include "constrain.h"
#include "openai.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *str_of(const json_t *o, const char *k) {
    return json_string_value(json_object_get(o, k));
}

static bool one_of(const char *s, const char *const *set) {
    for (; *set; set++)
        if (!strcmp(s, *set)) return true;
    return false;
}

// An optional string field whose value is one of set: 0, or a 400 naming it as where.
static int get_enum(const json_t *obj, const char *name, const char *param, const char *where, const char *const *set,
                    struct req_error *re) {
    const json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v) && one_of(json_string_value(v), set)) return 0;
    char list[160] = "";
    for (const char *const *s = set; *s; s++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", s == set ? "" : ", ", *s);
    return req_fail(re, 400, param, "%s must be %s%s", where, set[1] ? "one of " : "", list);
}

// ---- input items -> the conversation's messages ------------------------------------------------------

// A message's text: a string, or text parts (input_text, output_text, refusal), appended to out.
static int content_text(const json_t *c, size_t i, const char *field, struct sbuf *out, struct req_error *re) {
    if (json_is_string(c))
        return sbuf_add(out, json_string_value(c), json_string_length(c)) ? req_fail(re, 500, NULL, "out of memory")
                                                                          : 0;
    if (!json_is_array(c))
        return req_fail(re, 400, "input", "input[%zu].%s must be a string or an array of text parts", i, field);
    size_t k;
    const json_t *p;
    json_array_foreach(c, k, p) {
        const char *t = json_is_object(p) ? str_of(p, "type") : NULL;
        if (!t) return req_fail(re, 400, "input", "input[%zu].%s[%zu] must be an object with a \"type\"", i, field, k);
        const bool refusal = !strcmp(t, "refusal");
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && !refusal) {
            if (!strncmp(t, "input_", 6))
                return req_fail(re, 400, "input", "input[%zu].%s[%zu]: %s is not supported (the model reads text only)",
                                i, field, k, t);
            return req_fail(re, 400, "input",
                            "input[%zu].%s[%zu]: type \"%.*s\" is unknown (input_text, output_text, "
                            "refusal)",
                            i, field, k, chatreq_clip(t, 64), t);
        }
        const json_t *s = json_object_get(p, refusal ? "refusal" : "text");
        if (!json_is_string(s))
            return req_fail(re, 400, "input", "input[%zu].%s[%zu].%s must be a string", i, field, k,
                            refusal ? "refusal" : "text");
        if (sbuf_add(out, json_string_value(s), json_string_length(s))) return req_fail(re, 500, NULL, "out of memory");
    }
    return 0;
}

// The assistant turn being gathered from consecutive items (reasoning, messages, calls).
struct turn {
    struct sbuf content, reasoning;
    json_t *calls;
    bool any;
};

static int turn_flush(struct turn *t, json_t *conv, struct req_error *re) {
    if (!t->any) return 0;
    json_t *m =
        json_pack("{s:s, s:s%}", "role", "assistant", "content", t->content.p ? t->content.p : "", t->content.len);
    if (m && t->reasoning.len)
        json_object_set_new(m, "reasoning_content", json_stringn(t->reasoning.p, t->reasoning.len));
    if (m && json_array_size(t->calls)) { // the message takes the calls; the next turn gathers its own
        json_object_set_new(m, "tool_calls", t->calls);
        t->calls = json_array();
    }
    t->content.len = t->reasoning.len = 0;
    t->any = false;
    if (!t->calls) json_decref(m), m = NULL;
    return !m || json_array_append_new(conv, m) ? req_fail(re, 500, NULL, "out of memory") : 0;
}

static int add_message(json_t *conv, const char *role, const struct sbuf *text, struct req_error *re) {
    json_t *m = json_pack("{s:s, s:s%}", "role", role, "content", text->p ? text->p : "", text->len);
    return !m || json_array_append_new(conv, m) ? req_fail(re, 500, NULL, "out of memory") : 0;
}

static int input_item(const json_t *it, size_t i, struct turn *t, json_t *conv, struct req_error *re) {
    if (!json_is_object(it)) return req_fail(re, 400, "input", "input[%zu] must be an object", i);
    const char *type = str_of(it, "type"), *role = str_of(it, "role");
    if (!type && json_object_get(it, "type")) return req_fail(re, 400, "input", "input[%zu].type must be a string", i);
    if (!type) type = "message"; // {"role", "content"}: a message
    struct sbuf text = {0};
    int rc = -1;
    if (!strcmp(type, "message")) {
        static const char *const roles[] = {"user", "assistant", "system", "developer", NULL};
        if (!role || !one_of(role, roles))
            return req_fail(re, 400, "input",
                            "input[%zu].role must be \"user\", \"assistant\", \"system\" or \"developer\"", i);
        const json_t *c = json_object_get(it, "content");
        if (!c || json_is_null(c)) return req_fail(re, 400, "input", "input[%zu].content is required", i);
        if (!strcmp(role, "assistant")) {
            t->any = true;
            return content_text(c, i, "content", &t->content, re);
        }
        if (turn_flush(t, conv, re) || content_text(c, i, "content", &text, re)) goto done;
        rc = add_message(conv, role[0] == 'u' ? "user" : "system", &text, re);
    } else if (!strcmp(type, "reasoning")) {
        const json_t *c = json_object_get(it, "content"), *s = json_object_get(it, "summary");
        const json_t *parts = json_is_array(c) && json_array_size(c) ? c : s; // the text itself, else its summary
        if ((c && !json_is_null(c) && !json_is_array(c)) || (s && !json_is_null(s) && !json_is_array(s)))
            return req_fail(re, 400, "input", "input[%zu]: a reasoning item's content and summary must be arrays", i);
        size_t k;
        const json_t *p;
        json_array_foreach(parts, k, p) {
            const json_t *x = json_object_get(p, "text");
            if (!json_is_string(x))
                return req_fail(re, 400, "input", "input[%zu]: reasoning parts must be {\"type\": ..., \"text\": ...}",
                                i);
            if (t->reasoning.len && sbuf_add(&t->reasoning, "\n\n", 2)) goto oom;
            if (sbuf_add(&t->reasoning, json_string_value(x), json_string_length(x))) goto oom;
        }
        t->any = true;
        rc = 0;
    } else if (!strcmp(type, "function_call")) {
        const char *name = str_of(it, "name"), *call_id = str_of(it, "call_id"), *args = str_of(it, "arguments");
        if (!name || !chatreq_valid_name(name))
            return req_fail(re, 400, "input", "input[%zu].name must be 1 to 64 letters, digits, _ or -", i);
        if (!call_id) return req_fail(re, 400, "input", "input[%zu].call_id must be a string", i);
        json_t *a = args ? json_loads(args, 0, NULL) : NULL;
        const bool obj = json_is_object(a);
        json_decref(a);
        if (!obj) return req_fail(re, 400, "input", "input[%zu].arguments must be a JSON object (as text)", i);
        json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", call_id, "type", "function", "function", "name",
                                 name, "arguments", args);
        if (!call || json_array_append_new(t->calls, call)) goto oom;
        t->any = true;
        rc = 0;
    } else if (!strcmp(type, "function_call_output")) {
        const char *call_id = str_of(it, "call_id");
        const json_t *out = json_object_get(it, "output");
        if (!call_id) return req_fail(re, 400, "input", "input[%zu].call_id must be a string", i);
        if (!out || json_is_null(out)) return req_fail(re, 400, "input", "input[%zu].output is required", i);
        if (turn_flush(t, conv, re) || content_text(out, i, "output", &text, re)) goto done;
        json_t *m = json_pack("{s:s, s:s, s:s%}", "role", "tool", "tool_call_id", call_id, "content",
                              text.p ? text.p : "", text.len);
        rc = !m || json_array_append_new(conv, m) ? req_fail(re, 500, NULL, "out of memory") : 0;
    } else {
        return req_fail(re, 400, "input",
                        "input[%zu]: items of type \"%.*s\" are not supported (message, function_call, "
                        "function_call_output, reasoning)",
                        i, chatreq_clip(type, 64), type);
    }
    goto done;
oom:
    rc = req_fail(re, 500, NULL, "out of memory");
done:
    sbuf_free(&text);
    return rc;
}

// input (a string, or items) -> messages appended to conv.
static int convert_input(const json_t *input, json_t *conv, struct req_error *re) {
    if (!input || json_is_null(input)) return req_fail(re, 400, "input", "input is required");
    if (json_is_string(input)) {
        json_t *m = json_pack("{s:s, s:O}", "role", "user", "content", input);
        return !m || json_array_append_new(conv, m) ? req_fail(re, 500, NULL, "out of memory") : 0;
    }
    if (!json_is_array(input)) return req_fail(re, 400, "input", "input must be a string or an array of items");
    if (!json_array_size(input)) return req_fail(re, 400, "input", "input must not be empty");
    struct turn t = {.calls = json_array()};
    int rc = t.calls ? 0 : req_fail(re, 500, NULL, "out of memory");
    size_t i;
    const json_t *it;
    json_array_foreach(input, i, it) if (!rc) rc = input_item(it, i, &t, conv, re);
    if (!rc) rc = turn_flush(&t, conv, re);
    json_decref(t.calls);
    sbuf_free(&t.content), sbuf_free(&t.reasoning);
    return rc;
}

// The template's messages from the conversation.  Full: the instructions and the system messages
// before the first other one make the system message, and a later system message is given as a
// user message (the template has one system message, first).  A continuation (from: the first
// new message): only conv[from..], system messages as user messages.
static json_t *template_messages(const char *instructions, const json_t *conv, size_t from) {
    json_t *out = json_array();
    struct sbuf sys = {0};
    if (!out) return NULL;
    size_t i = from;
    if (!from) {
        if (instructions && *instructions) sbuf_adds(&sys, instructions);
        for (; i < json_array_size(conv); i++) {
            const json_t *m = json_array_get(conv, i);
            if (strcmp(str_of(m, "role"), "system")) break;
            if (sys.len) sbuf_add(&sys, "\n\n", 2);
            sbuf_adds(&sys, str_of(m, "content"));
        }
        if (sys.len &&
            json_array_append_new(out, json_pack("{s:s, s:s%}", "role", "system", "content", sys.p, sys.len)))
            sys.oom = true;
    }
    for (; i < json_array_size(conv); i++) {
        json_t *m = json_copy(json_array_get(conv, i));
        if (m && !strcmp(str_of(m, "role"), "system")) json_object_set_new(m, "role", json_string("user"));
        if (!m || json_array_append_new(out, m)) sys.oom = true;
    }
    const bool oom = sys.oom;
    sbuf_free(&sys);
    if (oom) json_decref(out), out = NULL;
    return out;
}

// ---- tools, formats, reasoning ------------------------------------------------------------------------

// Function tools -> OpenAI chat's shape (what the template renders).
static json_t *convert_tools(const json_t *tools, struct req_error *re) {
    json_t *out = json_array();
    size_t i;
    const json_t *t;
    if (!out) return req_fail(re, 500, NULL, "out of memory"), NULL;
    json_array_foreach(tools, i, t) {
        const char *type = json_is_object(t) ? str_of(t, "type") : NULL, *name = str_of(t, "name");
        const json_t *params = json_object_get(t, "parameters"), *desc = json_object_get(t, "description");
        if (!type || strcmp(type, "function")) {
            req_fail(re, 400, "tools",
                     "tools[%zu]: only function tools are supported ({\"type\": \"function\", \"name\": "
                     "..., \"parameters\": {...}}), not \"%.*s\"",
                     i, type ? chatreq_clip(type, 64) : 0, type ? type : "");
            goto fail;
        }
        if (!name || !chatreq_valid_name(name)) {
            req_fail(re, 400, "tools", "tools[%zu].name must be 1 to 64 letters, digits, _ or -", i);
            goto fail;
        }
        if (params && !json_is_null(params) && !json_is_object(params)) {
            req_fail(re, 400, "tools", "tools[%zu].parameters must be a JSON Schema object", i);
            goto fail;
        }
        if (desc && !json_is_null(desc) && !json_is_string(desc)) {
            req_fail(re, 400, "tools", "tools[%zu].description must be a string", i);
            goto fail;
        }
        json_t *f = json_pack("{s:s}", "name", name);
        if (f && json_is_string(desc)) json_object_set(f, "description", (json_t *)desc);
        if (f && json_is_object(params)) json_object_set(f, "parameters", (json_t *)params);
        if (!f || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f))) {
            req_fail(re, 500, NULL, "out of memory");
            goto fail;
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

// tool_choice -> OpenAI chat's (NULL: absent); *forced: one call is required.
static int convert_choice(const json_t *c, json_t **out, bool *forced, struct req_error *re) {
    *out = NULL, *forced = false;
    if (!c || json_is_null(c)) return 0;
    const char *s = json_string_value(c), *type = json_is_object(c) ? str_of(c, "type") : NULL;
    static const char *const modes[] = {"none", "auto", "required", NULL};
    if (s && one_of(s, modes))
        *out = json_incref((json_t *)c), *forced = !strcmp(s, "required");
    else if (type && !strcmp(type, "function") && str_of(c, "name"))
        *out = json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", str_of(c, "name")), *forced = true;
    else
        return req_fail(re, 400, "tool_choice",
                        "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": "
                        "\"function\", \"name\": ...}");
    return *out ? 0 : req_fail(re, 500, NULL, "out of memory");
}

// text.format: text, json_object, or json_schema {"name", "schema", "strict"}: compiled here.
static int parse_text(const json_t *text, struct gen_request *r, struct req_error *re) {
    static const char *const verbosity[] = {"low", "medium", "high", NULL};
    const json_t *f;
    if (get_enum(text, "verbosity", "text", "text.verbosity", verbosity, re) ||
        chatreq_get_opt(text, "format", JSON_OBJECT, &f, re))
        return -1;
    if (!f) return 0;
    const char *type = str_of(f, "type");
    const json_t *schema = json_object_get(f, "schema");
    if (type && !strcmp(type, "text")) return 0;
    if (!type || (strcmp(type, "json_object") && strcmp(type, "json_schema")))
        return req_fail(re, 400, "text", "text.format.type must be \"text\", \"json_object\" or \"json_schema\"");
    if (!strcmp(type, "json_schema") && !json_is_object(schema))
        return req_fail(re, 400, "text", "text.format json_schema needs {\"name\": ..., \"schema\": {...}}");
    char err[300];
    if (constrain_compile(!strcmp(type, "json_schema") ? schema : NULL, &r->schema, err, sizeof err))
        return req_fail(re, 400, "text", "text.format.schema: %s", err);
    return 0;
}

// ---- the request ----------------------------------------------------------------------------------------

// Every top-level field of a request.
static const struct chatreq_field request_fields[] = {
    {"model", 1, FIELD_READ, NULL, NULL},
    {"input", 1, FIELD_READ, NULL, NULL},
    {"instructions", 1, FIELD_READ, NULL, NULL},
    {"tools", 1, FIELD_READ, NULL, NULL},
    {"tool_choice", 1, FIELD_READ, NULL, NULL},
    {"parallel_tool_calls", 1, FIELD_READ, NULL, NULL},
    {"max_tool_calls", 1, FIELD_READ, NULL, NULL},
    {"text", 1, FIELD_READ, NULL, NULL},
    {"reasoning", 1, FIELD_READ, NULL, NULL},
    {"max_output_tokens", 1, FIELD_READ, NULL, NULL},
    {"store", 1, FIELD_READ, NULL, NULL},
    {"previous_response_id", 1, FIELD_READ, NULL, NULL},
    {"stream", 1, FIELD_READ, NULL, NULL},
    {"stream_options", 1, FIELD_READ, NULL, NULL},
    {"include", 1, FIELD_READ, NULL, NULL},
    {"metadata", 1, FIELD_READ, NULL, NULL},
    {"user", 1, FIELD_READ, NULL, NULL},
    {"prompt_cache_key", 1, FIELD_READ, NULL, NULL},
    {"truncation", 1, FIELD_READ, NULL, NULL},
    {"top_logprobs", 1, FIELD_READ, NULL, NULL},
    {"temperature", 1, FIELD_READ, NULL, NULL},
    {"top_p", 1, FIELD_READ, NULL, NULL},
    // accepted, no effect on the answer
    {"service_tier", 1, FIELD_INERT, "string", NULL},
    {"safety_identifier", 1, FIELD_INERT, "string", NULL},
    // features Calla lacks: their "off" value only
    {"background", 1, FIELD_OFF, "false", "background responses are not supported"},
    {"conversation", 1, FIELD_OFF, NULL,
     "conversation is not supported (the Conversations API: use previous_response_id)"},
    {"prompt", 1, FIELD_OFF, NULL, "prompt is not supported (stored prompt templates)"},
};

static int parse_body(const struct chatreq_ctx *c, struct rstore *store, const json_t *body, struct job *j,
                      struct req_error *re) {
    struct responses_resp *o = j->sink.ctx;
    struct gen_request *r = &j->req;
    const json_t *v, *reasoning, *text, *tools_in, *meta, *prev_id, *instr;
    bool store_it, parallel;
    if (chatreq_check_fields(body, request_fields, sizeof request_fields / sizeof request_fields[0], 1,
                             "Unknown parameter: '%.*s'.", NULL, re) ||
        chatreq_sampling(body, c->allow_sampling, SAMPLE_TEMPERATURE | SAMPLE_TOP_P, 2, &r->sampling, re) ||
        chatreq_get_opt(body, "model", JSON_STRING, &v, re) ||
        chatreq_get_bool(body, "stream", false, &j->stream, re) ||
        chatreq_get_bool(body, "store", true, &store_it, re) ||
        chatreq_get_bool(body, "parallel_tool_calls", true, &parallel, re) ||
        chatreq_get_opt(body, "stream_options", JSON_OBJECT, &v, re) ||
        chatreq_get_opt(body, "include", JSON_ARRAY, &v, re) ||
        chatreq_get_opt(body, "metadata", JSON_OBJECT, &meta, re) ||
        chatreq_get_opt(body, "instructions", JSON_STRING, &instr, re) ||
        chatreq_get_opt(body, "previous_response_id", JSON_STRING, &prev_id, re) ||
        chatreq_get_opt(body, "reasoning", JSON_OBJECT, &reasoning, re) ||
        chatreq_get_opt(body, "text", JSON_OBJECT, &text, re) ||
        chatreq_get_opt(body, "tools", JSON_ARRAY, &tools_in, re))
        return -1;
    static const char *const truncation[] = {"disabled", NULL};
    if (get_enum(body, "truncation", "truncation",
                 "truncation (a prompt longer than the context is refused, never cut)", truncation, re))
        return -1;
    long long k = 0;
    v = json_object_get(body, "top_logprobs");
    if (v && !json_is_null(v) && (!chatreq_integral(v, &k) || k != 0))
        return req_fail(re, 400, "top_logprobs",
                        "top_logprobs is not supported in the Responses API (use /v1/chat/completions)");
    long long max_tokens = 0, max_calls = 0;
    v = json_object_get(body, "max_output_tokens");
    if (v && !json_is_null(v) && (!chatreq_integral(v, &max_tokens) || max_tokens < 1 || max_tokens > QWEN_MAX_CTX - 1))
        return req_fail(re, 400, "max_output_tokens", "max_output_tokens must be an integer between 1 and %d",
                        QWEN_MAX_CTX - 1);
    v = json_object_get(body, "max_tool_calls");
    if (v && !json_is_null(v) && (!chatreq_integral(v, &max_calls) || max_calls < 1 || max_calls > 1 << 20))
        return req_fail(re, 400, "max_tool_calls", "max_tool_calls must be a positive integer");
    static const char *const efforts[] = {"none", "minimal", "low", "medium",
                                          "high", "xhigh",   NULL}; // chatreq_effort_thinks
    static const char *const summaries[] = {"auto", "concise", "detailed", NULL};
    if (reasoning &&
        (get_enum(reasoning, "effort", "reasoning", "reasoning.effort", efforts, re) ||
         get_enum(reasoning, "summary", "reasoning", "reasoning.summary", summaries, re) ||
         get_enum(reasoning, "generate_summary", "reasoning", "reasoning.generate_summary", summaries, re)))
        return -1;
    const char *effort = reasoning ? str_of(reasoning, "effort") : NULL;
    const bool think = !effort || chatreq_effort_thinks(effort) > 0;
    if (text && parse_text(text, r, re)) return -1;

    // The session key: prompt_cache_key (Codex sends its conversation's id), user, else the
    // response this one continues; mirrored as X-Session-Id when it can be a header value.
    static const char *const keys[] = {"prompt_cache_key", "user", "previous_response_id", NULL};
    if (chatreq_session(body, keys, j, re)) return -1;

    // The conversation: the stored one first, then the input's.
    struct rstore_entry *prev = NULL;
    if (prev_id && !(store && (prev = rstore_get(store, json_string_value(prev_id)))))
        return req_fail(re, 404, "previous_response_id",
                        "no stored response \"%.*s\" (it was not stored, was deleted, or "
                        "was evicted from the store)",
                        chatreq_clip(json_string_value(prev_id), 64), json_string_value(prev_id));
    json_t *conv = prev ? json_incref(prev->conv) : json_array(), *tools = NULL, *choice = NULL, *chat = NULL;
    int rc = -1;
    const size_t from = prev ? json_array_size(conv) : 0;
    bool forced;
    if (!conv) goto oom;
    if (convert_input(json_object_get(body, "input"), conv, re) ||
        convert_choice(json_object_get(body, "tool_choice"), &choice, &forced, re))
        goto done;
    if (tools_in && json_array_size(tools_in) && !(tools = convert_tools(tools_in, re))) goto done;
    if (forced && json_object_get(body, "parallel_tool_calls") && parallel) {
        req_fail(
            re, 400, "parallel_tool_calls",
            "parallel_tool_calls true cannot be honoured with tool_choice \"required\" or "
            "a named function: the forced call's grammar makes exactly one call (leave it out, or set it to false)");
        goto done;
    }
    if (forced && r->schema) {
        req_fail(re, 400, "tool_choice", "a forced tool_choice cannot be combined with a JSON text.format");
        goto done;
    }
    char *tools_text = tools ? json_dumps(tools, JSON_COMPACT) : strdup("");
    const char *instructions = instr ? json_string_value(instr) : NULL;
    if (!tools_text) goto oom;
    o->tools = tools_text;
    if (instructions && !(o->instructions = strdup(instructions))) goto oom;
    // Continued by tokens when the stored turn ended and what precedes the conversation is the same.
    const bool cont = prev && prev->continuable && !strcmp(prev->tools, tools_text) &&
                      !strcmp(prev->instructions ? prev->instructions : "", instructions ? instructions : "") &&
                      from < json_array_size(conv);
    json_t *msgs = template_messages(instructions, conv, cont ? from : 0);
    if (!msgs ||
        !(chat = json_pack("{s:o, s:{s:b}}", "messages", msgs, "chat_template_kwargs", "enable_thinking", think)))
        goto oom;
    if ((tools && json_object_set(chat, "tools", tools)) || (choice && json_object_set(chat, "tool_choice", choice)))
        goto oom;
    if (choice && !tools && !forced) json_object_del(chat, "tool_choice"); // auto or none, no tools
    if (chatreq_encode(c->tok, chat, cont ? prev->tokens : NULL, cont ? prev->n_tokens : 0, r, re)) {
        if (re->param && !strcmp(re->param, "messages")) re->param = "input";
        goto done;
    }
    r->max_calls = !parallel ? 1 : (int)max_calls; // parallel_tool_calls false: at most one call
    if (chatreq_fit(r, c->context, c->default_max_tokens, max_tokens, "input", "max_output_tokens", re)) goto done;

    // What the response echoes, and what storing it takes.
    o->store = store_it ? store : NULL;
    o->conv = json_incref(conv);
    o->echo = json_pack(
        "{s:O?, s:O?, s:O?, s:{s:s?, s:O?}, s:o, s:O?, s:o, s:b, s:b, s:O?, s:O?, s:O?, s:s}", "instructions", instr,
        "max_output_tokens", json_object_get(body, "max_output_tokens"), "previous_response_id", prev_id, "reasoning",
        "effort", effort, "summary", reasoning ? json_object_get(reasoning, "summary") : NULL, "text",
        text && json_object_get(text, "format") ? json_pack("{s:O}", "format", json_object_get(text, "format"))
                                                : json_pack("{s:{s:s}}", "format", "type", "text"),
        "tool_choice", json_object_get(body, "tool_choice"), "tools",
        tools_in ? json_incref((json_t *)tools_in) : json_array(), "parallel_tool_calls", parallel, "store", store_it,
        "metadata", meta, "user", json_object_get(body, "user"), "prompt_cache_key",
        json_object_get(body, "prompt_cache_key"), "truncation", "disabled");
    if (!o->echo) goto oom;
    if (json_is_null(json_object_get(o->echo, "tool_choice")))
        json_object_set_new(o->echo, "tool_choice", json_string("auto"));
    if (json_is_null(json_object_get(o->echo, "metadata"))) json_object_set_new(o->echo, "metadata", json_object());
    rc = 0;
    goto done;
oom:
    req_fail(re, 500, NULL, "out of memory");
done:
    json_decref(chat);
    json_decref(choice);
    json_decref(tools);
    json_decref(conv);
    rstore_entry_free(prev);
    return rc;
}

struct job *responses_parse_request(const struct chatreq_ctx *c, struct rstore *store, const char *data, size_t len,
                                    struct req_error *re) {
    json_t *body = chatreq_load(data, len, re);
    if (!body) return NULL;
    struct job *j = responses_job_new(c);
    if (!j)
        req_fail(re, 500, NULL, "out of memory");
    else if (parse_body(c, store, body, j, re))
        job_unref(j), j = NULL;
    json_decref(body);
    return j;
}

// ---- the answer: items and the response object --------------------------------------------------------

// An item's status: a call whose markup went wrong, or the last item when max_output_tokens
// ended the output, is incomplete.
static const char *item_status(const struct responses_resp *o, const struct part *p) {
    return p->aborted || (o->incomplete && p->index == o->ans.n - 1) ? "incomplete" : "completed";
}

static json_t *text_part(const char *type, const struct part *p, bool whole) {
    json_t *x =
        json_pack("{s:s, s:s%}", "type", type, "text", whole && p->text.p ? p->text.p : "", whole ? p->text.len : 0);
    if (x && !strcmp(type, "output_text"))
        json_object_set_new(x, "annotations", json_array()), json_object_set_new(x, "logprobs", json_array());
    return x;
}

// An output item as it is added (empty, in progress) or done (whole).
static json_t *item_json(const struct responses_resp *o, const struct part *p, bool whole) {
    const char *status = whole ? item_status(o, p) : "in_progress";
    if (p->kind == PART_REASONING)
        return json_pack("{s:s, s:s, s:[], s:o, s:s}", "type", "reasoning", "id", p->id, "summary", "content",
                         whole ? json_pack("[o]", text_part("reasoning_text", p, true)) : json_array(), "status",
                         status);
    if (p->kind == PART_TEXT)
        return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", p->id, "role", "assistant", "status",
                         status, "content", whole ? json_pack("[o]", text_part("output_text", p, true)) : json_array());
    return json_pack("{s:s, s:s, s:s, s:s, s:s%, s:s}", "type", "function_call", "id", p->id, "call_id", p->call_id,
                     "name", p->name, "arguments", whole && p->text.p ? p->text.p : "", whole ? p->text.len : 0,
                     "status", status);
}

static json_t *usage_json(const struct gen_end *e, int reasoning) {
    return json_pack("{s:i, s:{s:i, s:i}, s:i, s:{s:i}, s:i}", "input_tokens", e->n_prompt, "input_tokens_details",
                     "cached_tokens", e->n_cached, "cache_write_tokens", 0, "output_tokens", e->n_gen,
                     "output_tokens_details", "reasoning_tokens", reasoning, "total_tokens", e->n_prompt + e->n_gen);
}

// The response object; output: the finished items (else none yet).
static json_t *response_json(const struct responses_resp *o, const char *status, bool output) {
    json_t *items = json_array();
    for (int i = 0; output && items && i < o->ans.n; i++)
        if (!o->ans.parts[i].aborted) json_array_append_new(items, item_json(o, &o->ans.parts[i], true));
    json_t *r = items ? json_pack("{s:s, s:s, s:I, s:s, s:n, s:n, s:s, s:o}", "id", o->j->id, "object", "response",
                                  "created_at", (json_int_t)o->created, "status", status, "error", "incomplete_details",
                                  "model", o->model_name, "output", items)
                      : NULL;
    if (r && o->echo) json_object_update(r, o->echo);
    return r;
}

// ---- the answer: events ---------------------------------------------------------------------------------

// One event: obj gets its type and sequence_number.
static void event(struct responses_resp *o, const char *type, json_t *obj) {
    if (obj) {
        json_t *e = json_pack("{s:s, s:i}", "type", type, "sequence_number", o->seq++);
        if (e) json_object_update(e, obj);
        json_decref(obj);
        obj = e;
    }
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (s) job_sse_event(o->j, type, s, strlen(s));
    free(s);
}

static void stream_start(struct responses_resp *o) {
    if (o->started) return;
    o->started = true;
    event(o, "response.created", json_pack("{s:o}", "response", response_json(o, "in_progress", false)));
    event(o, "response.in_progress", json_pack("{s:o}", "response", response_json(o, "in_progress", false)));
}

static const char *part_type(const struct part *p) {
    return p->kind == PART_REASONING ? "reasoning_text" : "output_text";
}

static void on_open(void *ctx, const struct part *p) {
    struct responses_resp *o = ctx;
    if (!o->j->stream) return;
    event(o, "response.output_item.added",
          json_pack("{s:i, s:o}", "output_index", p->index, "item", item_json(o, p, false)));
    if (p->kind != PART_CALL)
        event(o, "response.content_part.added",
              json_pack("{s:s, s:i, s:i, s:o}", "item_id", p->id, "output_index", p->index, "content_index", 0, "part",
                        text_part(part_type(p), p, false)));
}

static void on_delta(void *ctx, const struct part *p, const char *s, size_t n) {
    struct responses_resp *o = ctx;
    if (!o->j->stream) return;
    if (p->kind == PART_CALL)
        return event(o, "response.function_call_arguments.delta",
                     json_pack("{s:s, s:i, s:s%}", "item_id", p->id, "output_index", p->index, "delta", s, n));
    json_t *e = json_pack("{s:s, s:i, s:i, s:s%}", "item_id", p->id, "output_index", p->index, "content_index", 0,
                          "delta", s, n);
    if (e && p->kind == PART_TEXT) json_object_set_new(e, "logprobs", json_array());
    event(o, p->kind == PART_TEXT ? "response.output_text.delta" : "response.reasoning_text.delta", e);
}

static void on_close(void *ctx, const struct part *p) {
    struct responses_resp *o = ctx;
    if (!o->j->stream) return;
    const char *text = p->text.p ? p->text.p : "";
    if (p->kind == PART_CALL) {
        if (!p->aborted)
            event(o, "response.function_call_arguments.done",
                  json_pack("{s:s, s:i, s:s, s:s%}", "item_id", p->id, "output_index", p->index, "name", p->name,
                            "arguments", text, p->text.len));
    } else {
        json_t *e = json_pack("{s:s, s:i, s:i, s:s%}", "item_id", p->id, "output_index", p->index, "content_index", 0,
                              "text", text, p->text.len);
        if (e && p->kind == PART_TEXT) json_object_set_new(e, "logprobs", json_array());
        event(o, p->kind == PART_TEXT ? "response.output_text.done" : "response.reasoning_text.done", e);
        event(o, "response.content_part.done",
              json_pack("{s:s, s:i, s:i, s:o}", "item_id", p->id, "output_index", p->index, "content_index", 0, "part",
                        text_part(part_type(p), p, true)));
    }
    event(o, "response.output_item.done",
          json_pack("{s:i, s:o}", "output_index", p->index, "item", item_json(o, p, true)));
}

// ---- the sink -------------------------------------------------------------------------------------------

static void on_progress(void *ctx, int done, int total) {
    struct responses_resp *o = ctx;
    if (!o->j->stream) return;
    char text[64];
    snprintf(text, sizeof text, "prefill %d/%d", done, total);
    job_sse_comment(o->j, text); // (clients skip comments; response.created comes with the first token)
}

static void on_begin(void *ctx) {
    struct responses_resp *o = ctx;
    if (o->j->stream) stream_start(o);
}

// The output as the assistant message a continuation renders.
static json_t *output_message(const struct responses_resp *o) {
    struct sbuf content = {0}, reasoning = {0};
    json_t *calls = json_array();
    for (int i = 0; calls && i < o->ans.n; i++) {
        const struct part *p = &o->ans.parts[i];
        const char *t = p->text.p ? p->text.p : "";
        if (p->aborted) continue;
        if (p->kind == PART_CALL)
            json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", p->call_id, "type", "function",
                                                   "function", "name", p->name, "arguments", t));
        else
            sbuf_add(p->kind == PART_TEXT ? &content : &reasoning, t, p->text.len);
    }
    json_t *m = calls && !content.oom && !reasoning.oom
                    ? json_pack("{s:s, s:s%}", "role", "assistant", "content", content.p ? content.p : "", content.len)
                    : NULL;
    if (m && reasoning.len) json_object_set_new(m, "reasoning_content", json_stringn(reasoning.p, reasoning.len));
    if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    json_decref(calls);
    sbuf_free(&content), sbuf_free(&reasoning);
    return m;
}

// Keeps the response for previous_response_id and GET: its object, the conversation with its
// output, and its tokens.
static void store(struct responses_resp *o, const struct gen_end *e, const char *response) {
    const struct gen_request *r = &o->j->req;
    struct rstore_entry *s = calloc(1, sizeof *s);
    json_t *m = output_message(o);
    if (!s || !m || !o->conv || json_array_append_new(o->conv, m)) {
        free(s);
        return;
    }
    snprintf(s->id, sizeof s->id, "%s", o->j->id);
    memcpy(s->session, o->j->session, sizeof s->session);
    s->response = strdup(response);
    s->conv = json_deep_copy(o->conv); // its own: the store is read from other threads
    s->instructions = o->instructions ? strdup(o->instructions) : NULL;
    s->tools = strdup(o->tools ? o->tools : "");
    s->n_tokens = r->n_prompt + e->n_gen;
    s->tokens = malloc(sizeof *s->tokens * ((size_t)s->n_tokens + 1));
    if (s->tokens) {
        memcpy(s->tokens, r->prompt, sizeof *s->tokens * (size_t)r->n_prompt);
        memcpy(s->tokens + r->n_prompt, e->ids, sizeof *s->tokens * (size_t)e->n_gen);
    }
    s->continuable = e->n_gen > 0 && e->ids[e->n_gen - 1] == TOKEN_IM_END;
    if (!s->response || !s->conv || !s->tools || !s->tokens || (o->instructions && !s->instructions)) {
        rstore_entry_free(s);
        return;
    }
    rstore_put(o->store, s);
}

static void on_end(void *ctx, const struct gen_end *e) {
    struct responses_resp *o = ctx;
    struct job *j = o->j;
    o->incomplete = e->finish == GEN_FINISH_LENGTH;
    answer_finish(&o->ans);
    if (!e->finish) { // failed: OpenAI's error, as the status or as the stream's response.failed
        const char *msg = e->message ? e->message : "generation failed";
        if (!j->stream) {
            json_t *err = openai_error_body(e->status, NULL, msg);
            char *s = err ? json_dumps(err, JSON_COMPACT) : NULL;
            json_decref(err);
            job_answer(j, s ? e->status : 500, s ? s : "", s ? strlen(s) : 0);
            free(s);
            return;
        }
        stream_start(o);
        json_t *r = response_json(o, "failed", true);
        if (r) json_object_set_new(r, "error", json_pack("{s:s, s:s}", "code", "server_error", "message", msg));
        return event(o, "response.failed", json_pack("{s:o}", "response", r));
    }
    json_t *r = response_json(o, o->incomplete ? "incomplete" : "completed", true);
    int reasoning = 0; // the tokens before the answer: up to </think>, or all when it never came
    for (int i = 0; i < e->n_gen; i++)
        if (e->ids[i] == TOKEN_THINK_END) reasoning = i + 1;
    if (j->req.reasoning && !reasoning) reasoning = e->n_gen;
    if (r) json_object_set_new(r, "usage", usage_json(e, reasoning));
    if (r && o->incomplete)
        json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    if (r && o->ans.oom) json_decref(r), r = NULL;
    char *s = r ? json_dumps(r, JSON_COMPACT) : NULL;
    if (s && o->store) store(o, e, s);
    if (j->stream) {
        stream_start(o);
        event(o, o->incomplete ? "response.incomplete" : "response.completed", json_pack("{s:O}", "response", r));
    } else if (s) {
        job_answer(j, 200, s, strlen(s));
    } else {
        job_answer(j, 500, "", 0); // out of memory: an empty body (the transport answers for it)
    }
    json_decref(r);
    free(s);
}

static void resp_free(void *ctx) {
    struct responses_resp *o = ctx;
    answer_free(&o->ans);
    json_decref(o->echo);
    json_decref(o->conv);
    free(o->instructions);
    free(o->tools);
    free(o);
}

struct job *responses_job_new(const struct chatreq_ctx *c) {
    struct job *j = job_new();
    struct responses_resp *o = j ? calloc(1, sizeof *o) : NULL;
    if (!o) {
        job_unref(j);
        return NULL;
    }
    *o = (struct responses_resp){.j = j,
                                 .model_name = c->model_name,
                                 .created = (long long)time(NULL),
                                 .ans = {.id_prefix = {"rs_", "msg_", "fc_"},
                                         .call_prefix = "call_",
                                         .on_open = on_open,
                                         .on_delta = on_delta,
                                         .on_close = on_close}};
    o->ans.ctx = o;
    j->sink = (struct gen_sink){.ctx = o, .progress = on_progress, .begin = on_begin, .end = on_end};
    answer_attach(&j->sink); // (the answer is o's first member)
    j->sink_free = resp_free;
    j->kind = "responses";
    char hex[25];
    random_hex(hex, 12);
    snprintf(j->id, sizeof j->id, "resp_%s", hex);
    return j;
}
