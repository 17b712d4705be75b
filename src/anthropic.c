// anthropic.c: Anthropic's Messages API (anthropic.h), as functions without sockets.
//
//   requests:  a JSON body -> the chat template's input (chatreq.h): `system` (a string or text
//              blocks) becomes the system message; each message's blocks become messages: text
//              as content, thinking as the assistant's reasoning, tool_use as its tool calls,
//              tool_result as tool messages (is_error: the text prefixed "Error: "); `tools`
//              (input_schema) and `tool_choice` (auto, any, tool, none) as OpenAI's, `thinking`
//              as the template's switch with its budget -> a job; or a 4xx naming the field
//   answers:   the job's sink: the generation's parts (answer.h) -> content blocks, streamed as
//              message_start, content_block_start / _delta / _stop, message_delta, message_stop
//              (ping while a long prompt is read), or the whole message at the end
//
// Every top-level field is in `fields` (a field not there is a 400 naming it, as Anthropic's "Extra
// inputs are not permitted").  Sampling is greedy unless the server runs with --allow-sampling:
// then temperature (0 to 1, as Anthropic's), top_p and top_k fill the generation's sampling
// (chatreq_sampling); without it only their greedy values pass.  Nothing a client sends can reach
// an abort().
#include "anthropic.h"

#include "constrain.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- errors --------------------------------------------------------------------------------------

json_t *anthropic_error_body(int status, const char *msg) {
    const char *type = status == 401                    ? "authentication_error"
                       : status == 403                  ? "permission_error"
                       : status == 404                  ? "not_found_error"
                       : status == 413                  ? "request_too_large"
                       : status == 429                  ? "rate_limit_error"
                       : status == 503 || status == 529 ? "overloaded_error"
                       : status >= 400 && status < 500  ? "invalid_request_error"
                                                        : "api_error";
    char *clean = NULL; // messages quote client text, perhaps cut mid-character: make it valid UTF-8
    size_t len;
    if (utf8_sanitize(msg, strlen(msg), &clean, &len)) clean = NULL;
    json_t *o = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message",
                          clean ? clean : "invalid request");
    free(clean);
    return o;
}

// ---- the request -> the template's input ------------------------------------------------------------

static const char *str_of(const json_t *o, const char *k) {
    return json_string_value(json_object_get(o, k));
}

// A block's "type" (NULL when the block is not an object with a string type).
static const char *block_type(const json_t *b) {
    return json_is_object(b) ? str_of(b, "type") : NULL;
}

// Blocks that only text may be: a string, or an array of text blocks, appended to out.
// where: the field's path for the messages ("system", "messages[2].content[0].content").
static int text_blocks(const json_t *v, const char *where, struct sbuf *out, struct req_error *re, const char *param) {
    if (json_is_string(v))
        return sbuf_add(out, json_string_value(v), json_string_length(v)) ? req_fail(re, 500, NULL, "out of memory")
                                                                          : 0;
    if (!json_is_array(v)) return req_fail(re, 400, param, "%s must be a string or an array of text blocks", where);
    size_t i;
    const json_t *b;
    json_array_foreach(v, i, b) {
        const char *t = block_type(b);
        const json_t *text = json_object_get(b, "text");
        if (!t) return req_fail(re, 400, param, "%s[%zu] must be a block with a \"type\"", where, i);
        if (strcmp(t, "text"))
            return req_fail(re, 400, param, "%s[%zu]: a block of type \"%.*s\" is not supported here (text only)",
                            where, i, chatreq_clip(t, 64), t);
        if (!json_is_string(text)) return req_fail(re, 400, param, "%s[%zu].text must be a string", where, i);
        if (sbuf_add(out, json_string_value(text), json_string_length(text)))
            return req_fail(re, 500, NULL, "out of memory");
    }
    return 0;
}

static json_t *text_message(const char *role, const struct sbuf *t) {
    return json_pack("{s:s, s:s%}", "role", role, "content", t->p ? t->p : "", t->len);
}

// Appends a message, or fails (out of memory).
static int push(json_t *msgs, json_t *m, struct req_error *re) {
    return json_array_append_new(msgs, m) ? req_fail(re, 500, NULL, "out of memory") : 0;
}

// A user message's blocks: text (and what follows it) -> a user message; each tool_result -> a
// tool message, in the order given.
static int user_blocks(const json_t *content, size_t i, json_t *msgs, struct req_error *re) {
    struct sbuf text = {0};
    bool have_text = false;
    size_t k;
    const json_t *b;
    char where[96];
    int rc = -1;
    json_array_foreach(content, k, b) {
        const char *t = block_type(b);
        if (!t) {
            req_fail(re, 400, "messages", "messages[%zu].content[%zu] must be a block with a \"type\"", i, k);
            goto done;
        }
        if (!strcmp(t, "text")) {
            const json_t *s = json_object_get(b, "text");
            if (!json_is_string(s)) {
                req_fail(re, 400, "messages", "messages[%zu].content[%zu].text must be a string", i, k);
                goto done;
            }
            if (sbuf_add(&text, json_string_value(s), json_string_length(s))) goto oom;
            have_text = true;
        } else if (!strcmp(t, "tool_result")) {
            if (have_text && push(msgs, text_message("user", &text), re)) goto done;
            text.len = 0, have_text = false;
            const json_t *id = json_object_get(b, "tool_use_id"), *err = json_object_get(b, "is_error");
            if (!json_is_string(id)) {
                req_fail(re, 400, "messages", "messages[%zu].content[%zu].tool_use_id must be a string", i, k);
                goto done;
            }
            if (err && !json_is_null(err) && !json_is_boolean(err)) {
                req_fail(re, 400, "messages", "messages[%zu].content[%zu].is_error must be a boolean", i, k);
                goto done;
            }
            struct sbuf out = {0};
            if (json_is_true(err)) sbuf_adds(&out, "Error: "); // the template has no error flag: say it in the text
            const json_t *c = json_object_get(b, "content");
            snprintf(where, sizeof where, "messages[%zu].content[%zu].content", i, k);
            if (c && !json_is_null(c) && text_blocks(c, where, &out, re, "messages")) {
                sbuf_free(&out);
                goto done;
            }
            json_t *m = json_pack("{s:s, s:s, s:s%}", "role", "tool", "tool_call_id", json_string_value(id), "content",
                                  out.p ? out.p : "", out.len);
            sbuf_free(&out);
            if (!m || push(msgs, m, re)) goto oom;
        } else if (!strcmp(t, "image") || !strcmp(t, "document") || !strcmp(t, "search_result")) {
            req_fail(re, 400, "messages",
                     "messages[%zu].content[%zu]: %s blocks are not supported (the model reads text only)", i, k, t);
            goto done;
        } else {
            req_fail(re, 400, "messages",
                     "messages[%zu].content[%zu]: a user message cannot hold a block of type \"%.*s\" "
                     "(text, tool_result)",
                     i, k, chatreq_clip(t, 64), t);
            goto done;
        }
    }
    if (have_text && push(msgs, text_message("user", &text), re)) goto done;
    rc = 0;
    goto done;
oom:
    req_fail(re, 500, NULL, "out of memory");
done:
    sbuf_free(&text);
    return rc;
}

// An assistant message's blocks: text -> content, thinking -> reasoning, tool_use -> tool calls.
static int assistant_blocks(const json_t *content, size_t i, json_t *msgs, struct req_error *re) {
    struct sbuf text = {0}, thinking = {0};
    json_t *calls = json_array();
    size_t k;
    const json_t *b;
    int rc = -1;
    if (!calls) goto oom;
    json_array_foreach(content, k, b) {
        const char *t = block_type(b);
        if (!t) {
            req_fail(re, 400, "messages", "messages[%zu].content[%zu] must be a block with a \"type\"", i, k);
            goto done;
        }
        if (!strcmp(t, "text") || !strcmp(t, "thinking")) {
            const bool th = t[1] == 'h';
            const json_t *s = json_object_get(b, th ? "thinking" : "text");
            if (!json_is_string(s)) {
                req_fail(re, 400, "messages", "messages[%zu].content[%zu].%s must be a string", i, k,
                         th ? "thinking" : "text");
                goto done;
            }
            if (sbuf_add(th ? &thinking : &text, json_string_value(s), json_string_length(s))) goto oom;
        } else if (!strcmp(t, "redacted_thinking")) {
            continue; // another model's encrypted thinking: nothing this one can read
        } else if (!strcmp(t, "tool_use")) {
            const json_t *id = json_object_get(b, "id"), *input = json_object_get(b, "input");
            const char *name = str_of(b, "name");
            if (!name || !chatreq_valid_name(name)) {
                req_fail(re, 400, "messages", "messages[%zu].content[%zu].name must be 1 to 64 letters, digits, _ or -",
                         i, k);
                goto done;
            }
            if (!json_is_object(input)) {
                req_fail(re, 400, "messages", "messages[%zu].content[%zu].input must be an object", i, k);
                goto done;
            }
            if (id && !json_is_string(id)) {
                req_fail(re, 400, "messages", "messages[%zu].content[%zu].id must be a string", i, k);
                goto done;
            }
            json_t *c = json_pack("{s:s, s:s, s:{s:s, s:O}}", "id", id ? json_string_value(id) : "", "type", "function",
                                  "function", "name", name, "arguments", input);
            if (!c || json_array_append_new(calls, c)) goto oom;
        } else {
            req_fail(re, 400, "messages",
                     "messages[%zu].content[%zu]: an assistant message cannot hold a block of type "
                     "\"%.*s\" (text, thinking, redacted_thinking, tool_use)",
                     i, k, chatreq_clip(t, 64), t);
            goto done;
        }
    }
    json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", text.p ? text.p : "", text.len);
    if (m && thinking.len) json_object_set_new(m, "reasoning_content", json_stringn(thinking.p, thinking.len));
    if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    if (!m || push(msgs, m, re)) goto oom;
    rc = 0;
    goto done;
oom:
    req_fail(re, 500, NULL, "out of memory");
done:
    json_decref(calls);
    sbuf_free(&text), sbuf_free(&thinking);
    return rc;
}

static int convert_messages(const json_t *body, json_t *msgs, struct req_error *re) {
    const json_t *sys = json_object_get(body, "system"), *list = json_object_get(body, "messages");
    if (sys && !json_is_null(sys)) {
        struct sbuf s = {0};
        if (text_blocks(sys, "system", &s, re, "system")) {
            sbuf_free(&s);
            return -1;
        }
        int rc = s.len ? push(msgs, text_message("system", &s), re) : 0; // an empty system prompt is none
        sbuf_free(&s);
        if (rc) return -1;
    }
    if (!list || json_is_null(list)) return req_fail(re, 400, "messages", "messages is required");
    if (!json_is_array(list)) return req_fail(re, 400, "messages", "messages must be an array");
    const size_t n = json_array_size(list);
    if (!n) return req_fail(re, 400, "messages", "messages must not be empty");
    size_t i;
    const json_t *m;
    json_array_foreach(list, i, m) {
        const char *role = json_is_object(m) ? str_of(m, "role") : NULL;
        const json_t *content = json_object_get(m, "content");
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
            return req_fail(re, 400, "messages", "messages[%zu].role must be \"user\" or \"assistant\"", i);
        const bool user = role[0] == 'u';
        if (!user && i + 1 == n)
            return req_fail(re, 400, "messages",
                            "messages[%zu]: a final assistant message (a prefill to continue) is not "
                            "supported: the last message must be the user's",
                            i);
        if (json_is_string(content)) {
            if (!json_string_length(content))
                return req_fail(re, 400, "messages", "messages[%zu].content must not be empty", i);
            if (push(msgs, json_pack("{s:s, s:O}", "role", role, "content", content), re)) return -1;
            continue;
        }
        if (!json_is_array(content) || !json_array_size(content))
            return req_fail(re, 400, "messages",
                            "messages[%zu].content must be a string or a non-empty array of blocks", i);
        if (user ? user_blocks(content, i, msgs, re) : assistant_blocks(content, i, msgs, re)) return -1;
    }
    return 0;
}

// tools -> OpenAI's shape (what the template renders); server tools are refused.
static int convert_tools(const json_t *tools, json_t *out, struct req_error *re) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        if (!json_is_object(t)) return req_fail(re, 400, "tools", "tools[%zu] must be an object", i);
        const char *type = str_of(t, "type"), *name = str_of(t, "name");
        const json_t *schema = json_object_get(t, "input_schema"), *desc = json_object_get(t, "description");
        if (type && strcmp(type, "custom"))
            return req_fail(re, 400, "tools",
                            "tools[%zu]: type \"%.*s\" is a server tool, which this server does not run "
                            "(client tools only: name, description, input_schema)",
                            i, chatreq_clip(type, 64), type);
        if (!name || !chatreq_valid_name(name))
            return req_fail(re, 400, "tools", "tools[%zu].name must be 1 to 64 letters, digits, _ or -", i);
        if (!json_is_object(schema))
            return req_fail(re, 400, "tools", "tools[%zu].input_schema must be a JSON Schema object", i);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return req_fail(re, 400, "tools", "tools[%zu].description must be a string", i);
        json_t *f = json_pack("{s:s}", "name", name);
        if (f && json_is_string(desc)) json_object_set(f, "description", (json_t *)desc);
        if (f) json_object_set(f, "parameters", (json_t *)schema);
        if (!f || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", f)))
            return req_fail(re, 500, NULL, "out of memory");
    }
    return 0;
}

// tool_choice -> OpenAI's value in *out (NULL: none given); *one: at most one call.
static int convert_choice(const json_t *c, json_t **out, bool *one, struct req_error *re) {
    *out = NULL;
    *one = false;
    if (!c || json_is_null(c)) return 0;
    const char *type = json_is_object(c) ? str_of(c, "type") : NULL;
    const json_t *dp = json_object_get(c, "disable_parallel_tool_use");
    if (dp && !json_is_null(dp) && !json_is_boolean(dp))
        return req_fail(re, 400, "tool_choice", "tool_choice.disable_parallel_tool_use must be a boolean");
    *one = json_is_true(dp);
    if (type && !strcmp(type, "auto"))
        *out = json_string("auto");
    else if (type && !strcmp(type, "any"))
        *out = json_string("required");
    else if (type && !strcmp(type, "none"))
        *out = json_string("none");
    else if (type && !strcmp(type, "tool")) {
        const char *name = str_of(c, "name");
        if (!name) return req_fail(re, 400, "tool_choice", "tool_choice {\"type\": \"tool\"} needs a \"name\"");
        *out = json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name);
    } else
        return req_fail(re, 400, "tool_choice",
                        "tool_choice must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": "
                        "\"tool\", \"name\": ...} or {\"type\": \"none\"}");
    return *out ? 0 : req_fail(re, 500, NULL, "out of memory");
}

// thinking -> on or off, with a budget (0: none).
static int parse_thinking(const json_t *body, bool *on, long long *budget, bool *omit, struct req_error *re) {
    const json_t *t;
    *on = false, *budget = 0, *omit = false;
    if (chatreq_get_opt(body, "thinking", JSON_OBJECT, &t, re)) return -1;
    if (!t) return 0; // as Anthropic: no thinking unless asked for
    const char *type = str_of(t, "type");
    const json_t *b = json_object_get(t, "budget_tokens"), *d = json_object_get(t, "display");
    if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled") && strcmp(type, "adaptive")))
        return req_fail(re, 400, "thinking",
                        "thinking.type must be \"enabled\" (with budget_tokens), \"adaptive\" or \"disabled\"");
    if (d && !json_is_null(d)) {
        const char *ds = json_string_value(d);
        if (!ds || (strcmp(ds, "summarized") && strcmp(ds, "omitted")))
            return req_fail(re, 400, "thinking", "thinking.display must be \"summarized\" or \"omitted\"");
        *omit = !strcmp(ds, "omitted");
    }
    *on = strcmp(type, "disabled") != 0;
    if (!strcmp(type, "enabled")) {
        if (!b || !chatreq_integral(b, budget) || *budget < 1 || *budget > QWEN_MAX_CTX)
            return req_fail(re, 400, "thinking", "thinking.budget_tokens must be a positive integer");
    } else if (b && !json_is_null(b)) {
        return req_fail(re, 400, "thinking", "thinking.budget_tokens goes with \"type\": \"enabled\"");
    }
    return 0;
}

// output_config: effort (accepted; greedy decoding has one effort) and format (a JSON schema).
static int parse_output_config(const json_t *body, struct gen_request *r, struct req_error *re) {
    const json_t *oc, *f;
    if (chatreq_get_opt(body, "output_config", JSON_OBJECT, &oc, re)) return -1;
    if (!oc) return 0;
    const json_t *e = json_object_get(oc, "effort");
    if (e && !json_is_null(e) && !json_is_string(e))
        return req_fail(re, 400, "output_config", "output_config.effort must be a string");
    if (chatreq_get_opt(oc, "format", JSON_OBJECT, &f, re)) return -1;
    if (!f) return 0;
    const char *type = str_of(f, "type");
    const json_t *schema = json_object_get(f, "schema");
    if (!type || strcmp(type, "json_schema") || !json_is_object(schema))
        return req_fail(re, 400, "output_config",
                        "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}");
    char err[300];
    if (constrain_compile(schema, &r->schema, err, sizeof err))
        return req_fail(re, 400, "output_config", "output_config.format.schema: %s", err);
    return 0;
}

// Every top-level field of a request (count_tokens takes the same body: what only generating
// reads is ignored there).
static const struct chatreq_field request_fields[] = {
    {"model", 1, FIELD_READ, NULL, NULL},
    {"messages", 1, FIELD_READ, NULL, NULL},
    {"system", 1, FIELD_READ, NULL, NULL},
    {"max_tokens", 1, FIELD_READ, NULL, NULL},
    {"stream", 1, FIELD_READ, NULL, NULL},
    {"stop_sequences", 1, FIELD_READ, NULL, NULL},
    {"metadata", 1, FIELD_READ, NULL, NULL},
    {"tools", 1, FIELD_READ, NULL, NULL},
    {"tool_choice", 1, FIELD_READ, NULL, NULL},
    {"thinking", 1, FIELD_READ, NULL, NULL},
    {"output_config", 1, FIELD_READ, NULL, NULL},
    {"mcp_servers", 1, FIELD_READ, NULL, NULL},
    {"temperature", 1, FIELD_READ, NULL, NULL},
    {"top_p", 1, FIELD_READ, NULL, NULL},
    {"top_k", 1, FIELD_READ, NULL, NULL},
    // accepted, no effect on the answer (Calla caches prompts by prefix, on its own; one tier, one region)
    {"service_tier", 1, FIELD_INERT, "string", NULL},
    {"inference_geo", 1, FIELD_INERT, "string", NULL},
    {"container", 1, FIELD_INERT, "any", NULL},
    {"context_management", 1, FIELD_INERT, "any", NULL},
    {"cache_control", 1, FIELD_INERT, "any", NULL},
    {"speed", 1, FIELD_INERT, "any", NULL},
    {"diagnostics", 1, FIELD_INERT, "any", NULL},
};

// The whole body -> j (count: for count_tokens, which has no max_tokens and generates nothing).
static int parse_body(const struct chatreq_ctx *c, const json_t *body, struct job *j, bool count,
                      struct req_error *re) {
    struct anthropic_resp *o = j->sink.ctx;
    struct gen_request *r = &j->req;
    const json_t *v;
    if (chatreq_check_fields(body, request_fields, sizeof request_fields / sizeof request_fields[0], 1,
                             "%.*s: Extra inputs are not permitted", NULL, re) ||
        chatreq_sampling(body, c->allow_sampling, SAMPLE_TEMPERATURE | SAMPLE_TOP_P | SAMPLE_TOP_K, 1, &r->sampling,
                         re) ||
        chatreq_get_opt(body, "model", JSON_STRING, &v, re))
        return -1;
    long long max_tokens = 0;
    const json_t *mt = json_object_get(body, "max_tokens");
    if (!count) {
        if (!mt || json_is_null(mt)) return req_fail(re, 400, "max_tokens", "max_tokens is required");
        if (!chatreq_integral(mt, &max_tokens) || max_tokens < 1 || max_tokens > QWEN_MAX_CTX - 1)
            return req_fail(re, 400, "max_tokens", "max_tokens must be an integer between 1 and %d", QWEN_MAX_CTX - 1);
        if (chatreq_get_bool(body, "stream", false, &j->stream, re)) return -1;
    }
    // metadata.user_id: an end user's id, the session key (mirrored as X-Session-Id for a
    // balancer's affinity when it can be a header value).
    if (chatreq_get_opt(body, "metadata", JSON_OBJECT, &v, re)) return -1;
    if (v) {
        const json_t *u = json_object_get(v, "user_id");
        if (u && !json_is_null(u) && !json_is_string(u))
            return req_fail(re, 400, "metadata", "metadata.user_id must be a string");
        if (json_is_string(u) && session_id_valid(json_string_value(u), json_string_length(u)))
            memcpy(j->session, json_string_value(u), json_string_length(u) + 1);
    }
    const json_t *stops = json_object_get(body, "stop_sequences");
    if (stops && !json_is_null(stops) && !json_is_array(stops))
        return req_fail(re, 400, "stop_sequences", "stop_sequences must be an array of strings");
    if (chatreq_stops(r, stops, "stop_sequences", ANTHROPIC_MAX_STOPS, re)) return -1;
    if (chatreq_get_opt(body, "mcp_servers", JSON_ARRAY, &v, re)) return -1;
    if (v && json_array_size(v))
        return req_fail(re, 400, "mcp_servers", "mcp_servers are not supported (client tools only)");
    bool think, omit;
    long long budget;
    if (parse_thinking(body, &think, &budget, &omit, re) || parse_output_config(body, r, re)) return -1;
    if (!count && budget >= max_tokens)
        return req_fail(re, 400, "thinking", "thinking.budget_tokens (%lld) must be less than max_tokens (%lld)",
                        budget, max_tokens);
    o->omit_thinking = omit;

    // The template's input.
    const json_t *tools;
    if (chatreq_get_opt(body, "tools", JSON_ARRAY, &tools, re)) return -1;
    json_t *chat = json_pack("{s:[], s:{s:b}}", "messages", "chat_template_kwargs", "enable_thinking", think);
    json_t *choice = NULL;
    bool one;
    int rc = -1;
    if (!chat) return req_fail(re, 500, NULL, "out of memory");
    if (convert_messages(body, json_object_get(chat, "messages"), re) ||
        convert_choice(json_object_get(body, "tool_choice"), &choice, &one, re))
        goto done;
    if (tools && json_array_size(tools)) {
        json_t *t = json_array();
        if (!t || json_object_set_new(chat, "tools", t)) {
            req_fail(re, 500, NULL, "out of memory");
            goto done;
        }
        if (convert_tools(tools, t, re)) goto done;
    }
    if (choice) {
        const bool forced = !json_is_string(choice) || !strcmp(json_string_value(choice), "required");
        if (forced && r->schema) {
            req_fail(re, 400, "output_config",
                     "output_config.format cannot be combined with tool_choice \"any\" or \"tool\"");
            goto done;
        }
        if (!forced && !json_object_get(chat, "tools")) json_decref(choice), choice = NULL; // auto or none, no tools
        if (choice && json_object_set_new(chat, "tool_choice", choice)) {
            choice = NULL;
            req_fail(re, 500, NULL, "out of memory");
            goto done;
        }
        choice = NULL;
    }
    if (chatreq_encode(c->tok, chat, NULL, 0, r, re)) goto done;
    if (r->n_prompt < 1) {
        req_fail(re, 400, "messages", "the prompt is empty");
        goto done;
    }
    r->reasoning_budget = think ? (int)budget : 0;
    r->max_calls = one ? 1 : 0;
    rc = count ? 0 : chatreq_fit(r, c->context, c->default_max_tokens, max_tokens, "messages", "max_tokens", re);
done:
    json_decref(choice);
    json_decref(chat);
    return rc;
}

static struct job *parse(const struct chatreq_ctx *c, const char *data, size_t len, bool count, struct req_error *re) {
    json_t *body = chatreq_load(data, len, re);
    if (!body) return NULL;
    struct job *j = anthropic_job_new(c);
    if (!j)
        req_fail(re, 500, NULL, "out of memory");
    else if (parse_body(c, body, j, count, re))
        job_unref(j), j = NULL;
    json_decref(body);
    return j;
}

struct job *anthropic_parse_request(const struct chatreq_ctx *c, const char *data, size_t len, struct req_error *re) {
    return parse(c, data, len, false, re);
}

int anthropic_count_tokens(const struct chatreq_ctx *c, const char *data, size_t len, int *n, struct req_error *re) {
    struct job *j = parse(c, data, len, true, re);
    if (!j) return -1;
    *n = j->req.n_prompt;
    job_unref(j);
    return 0;
}

// ---- the answer ------------------------------------------------------------------------------------

static void event(struct job *j, const char *name, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s) job_sse_event(j, name, s, strlen(s));
    free(s);
}

static const char *stop_reason(enum gen_finish f) {
    return f == GEN_FINISH_LENGTH          ? "max_tokens"
           : f == GEN_FINISH_TOOL_CALLS    ? "tool_use"
           : f == GEN_FINISH_STOP_SEQUENCE ? "stop_sequence"
                                           : "end_turn";
}

// usage: Anthropic counts the prompt as input_tokens (read anew) + cache_read_input_tokens.
static json_t *usage_json(int n_prompt, int n_cached, int n_gen) {
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", n_prompt - n_cached, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", n_cached, "output_tokens", n_gen);
}

// A content block as it starts (streaming: empty) or ends (whole).
static json_t *block_json(const struct anthropic_resp *o, const struct part *p, bool whole) {
    const char *text = whole && p->text.p ? p->text.p : "";
    const size_t n = whole ? p->text.len : 0;
    if (p->kind == PART_REASONING)
        return json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", o->omit_thinking ? "" : text,
                         o->omit_thinking ? 0 : n, "signature", "");
    if (p->kind == PART_TEXT) return json_pack("{s:s, s:s%}", "type", "text", "text", text, n);
    json_t *input = whole ? json_loadb(text, n, 0, NULL) : NULL;
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", p->call_id, "name", p->name, "input",
                     input ? input : json_object());
}

// The parts as they change, while streaming.
static void on_open(void *ctx, const struct part *p) {
    struct anthropic_resp *o = ctx;
    if (!o->j->stream) return;
    event(o->j, "content_block_start",
          json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", p->index, "content_block",
                    block_json(o, p, false)));
}

static void on_delta(void *ctx, const struct part *p, const char *s, size_t n) {
    struct anthropic_resp *o = ctx;
    if (!o->j->stream || (p->kind == PART_REASONING && o->omit_thinking)) return;
    static const char *const types[] = {"thinking_delta", "text_delta", "input_json_delta"};
    static const char *const fields[] = {"thinking", "text", "partial_json"};
    event(o->j, "content_block_delta",
          json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta", "index", p->index, "delta", "type",
                    types[p->kind], fields[p->kind], s, n));
}

static void on_close(void *ctx, const struct part *p) {
    struct anthropic_resp *o = ctx;
    if (!o->j->stream) return;
    event(o->j, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", p->index));
}

static json_t *message_json(const struct anthropic_resp *o, const char *stop, const char *stop_seq, json_t *content,
                            json_t *usage) {
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s?, s:s?, s:o}", "id", o->j->id, "type", "message", "role",
                     "assistant", "model", o->model_name, "content", content, "stop_reason", stop, "stop_sequence",
                     stop_seq, "usage", usage);
}

// A long prompt's prefill: ping events (clients skip them) while nothing else can be said.
static void on_progress(void *ctx, int done, int total) {
    struct anthropic_resp *o = ctx;
    if (o->j->stream) job_sse_event(o->j, "ping", "{\"type\":\"ping\"}", 15);
}

static void on_begin(void *ctx) {
    struct anthropic_resp *o = ctx;
    if (!o->j->stream) return;
    o->started = true;
    const struct job *j = o->j;
    event(o->j, "message_start",
          json_pack("{s:s, s:o}", "type", "message_start", "message",
                    message_json(o, NULL, NULL, json_array(), usage_json(j->req.n_prompt, j->n_cached, 0))));
}

static void on_end(void *ctx, const struct gen_end *e) {
    struct anthropic_resp *o = ctx;
    struct job *j = o->j;
    answer_finish(&o->ans);
    if (!e->finish) { // failed: Anthropic's error, as the status or as a stream's error event
        json_t *err = anthropic_error_body(e->status, e->message ? e->message : "generation failed");
        if (j->stream) return event(j, "error", err);
        char *s = err ? json_dumps(err, JSON_COMPACT) : NULL;
        json_decref(err);
        job_answer(j, s ? e->status : 500, s ? s : "", s ? strlen(s) : 0);
        free(s);
        return;
    }
    const char *stop = stop_reason(e->finish), *seq = e->finish == GEN_FINISH_STOP_SEQUENCE ? e->stop : NULL;
    if (j->stream) {
        event(j, "message_delta",
              json_pack("{s:s, s:{s:s, s:s?}, s:o}", "type", "message_delta", "delta", "stop_reason", stop,
                        "stop_sequence", seq, "usage", usage_json(e->n_prompt, e->n_cached, e->n_gen)));
        event(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        return;
    }
    json_t *content = json_array();
    for (int i = 0; content && i < o->ans.n; i++)
        if (!o->ans.parts[i].aborted) json_array_append_new(content, block_json(o, &o->ans.parts[i], true));
    json_t *m = content ? message_json(o, stop, seq, content, usage_json(e->n_prompt, e->n_cached, e->n_gen)) : NULL;
    char *s = m && !o->ans.oom ? json_dumps(m, JSON_COMPACT) : NULL;
    json_decref(m);
    if (s)
        job_answer(j, 200, s, strlen(s));
    else
        job_answer(j, 500, "", 0); // out of memory: an empty body (the transport answers for it)
    free(s);
}

static void resp_free(void *ctx) {
    struct anthropic_resp *o = ctx;
    answer_free(&o->ans);
    free(o);
}

struct job *anthropic_job_new(const struct chatreq_ctx *c) {
    struct job *j = job_new();
    struct anthropic_resp *o = j ? calloc(1, sizeof *o) : NULL;
    if (!o) {
        job_unref(j);
        return NULL;
    }
    *o = (struct anthropic_resp){
        .j = j,
        .model_name = c->model_name,
        .ans = {.call_prefix = "toolu_", .on_open = on_open, .on_delta = on_delta, .on_close = on_close, .ctx = o}};
    j->sink = (struct gen_sink){.ctx = o, .progress = on_progress, .begin = on_begin, .end = on_end};
    answer_attach(&j->sink); // (the answer is o's first member)
    j->sink_free = resp_free;
    j->kind = "messages";
    char hex[25];
    random_hex(hex, 12);
    snprintf(j->id, sizeof j->id, "msg_%s", hex);
    return j;
}
