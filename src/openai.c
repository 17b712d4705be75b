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

#include "chatreq.h"
#include "constrain.h"
#include "tokenizer.h"

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
    char *clean = NULL; // messages quote client text, perhaps cut mid-character: make it valid UTF-8
    size_t len;
    if (utf8_sanitize(msg, strlen(msg), &clean, &len)) clean = NULL;
    json_t *o = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", clean ? clean : "invalid request", "type",
                          type, "param", param, "code", code);
    free(clean);
    return o;
}

// ---- request fields ------------------------------------------------------------------------------
//
// Every top-level field of a generation request is in this table, with the endpoints that take it
// (chatreq.h, struct chatreq_field); any other is refused with a 400 that names it, as OpenAI
// refuses it ("Unrecognized request argument supplied").

enum { FOR_CHAT = 1, FOR_COMPLETIONS = 2, FOR_BOTH = 3 };

static const struct chatreq_field request_fields[] = {
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
    // sampling (chatreq_sampling)
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
    {"cache_prompt", FOR_BOTH, FIELD_INERT, "boolean",
     NULL}, // the session cache always applies; same tokens either way
    {"spaces_between_special_tokens", FOR_BOTH, FIELD_INERT, "boolean", NULL}, // special tokens never reach the text
    // features Calla lacks: their "off" value only
    {"echo", FOR_BOTH, FIELD_OFF, "false", "echo is not supported (the answer never repeats the prompt)"},
    {"suffix", FOR_COMPLETIONS, FIELD_OFF, "\"\"", "suffix (fill-in-the-middle) is not supported"},
    {"store", FOR_BOTH, FIELD_OFF, "false", "store is not supported: Calla keeps no completions"},
    {"service_tier", FOR_BOTH, FIELD_OFF, "\"auto\"|\"default\"",
     "service_tier must be \"auto\" or \"default\" (one tier)"},
    {"audio", FOR_CHAT, FIELD_OFF, NULL, "audio output is not supported (text only)"},
    {"modalities", FOR_CHAT, FIELD_OFF, "[\"text\"]", "modalities must be [\"text\"] (text only)"},
    {"functions", FOR_CHAT, FIELD_OFF, NULL, "functions (deprecated) is not supported: use tools"},
    {"function_call", FOR_CHAT, FIELD_OFF, NULL, "function_call (deprecated) is not supported: use tool_choice"},
    {"web_search_options", FOR_CHAT, FIELD_OFF, NULL, "web search is not supported"},
    {"verbosity", FOR_CHAT, FIELD_OFF, "\"medium\"",
     "verbosity must be \"medium\" (the model has no verbosity setting)"},
    {"grammar", FOR_BOTH, FIELD_OFF, NULL, "grammar (GBNF) is not supported: use response_format with a JSON schema"},
    {"guided_regex", FOR_BOTH, FIELD_OFF, NULL,
     "guided_regex is not supported: use response_format with a JSON schema"},
    {"guided_choice", FOR_BOTH, FIELD_OFF, NULL, "guided_choice is not supported: use a JSON schema with an enum"},
    {"guided_grammar", FOR_BOTH, FIELD_OFF, NULL,
     "guided_grammar is not supported: use response_format with a JSON schema"},
    {"add_generation_prompt", FOR_CHAT, FIELD_OFF, "true",
     "add_generation_prompt must be true (the answer is a new assistant turn)"},
    {"continue_final_message", FOR_CHAT, FIELD_OFF, "false", "continue_final_message is not supported"},
    {"skip_special_tokens", FOR_BOTH, FIELD_OFF, "true",
     "skip_special_tokens must be true: special tokens never reach the text"},
    {"include_stop_str_in_output", FOR_BOTH, FIELD_OFF, "false",
     "include_stop_str_in_output is not supported (a stop string is never returned)"},
    {"min_tokens", FOR_BOTH, FIELD_OFF, "0", "min_tokens is not supported"},
    {"stop_token_ids", FOR_BOTH, FIELD_OFF, "[]",
     "stop_token_ids is not supported (<|im_end|> and <|endoftext|> stop; see ignore_eos)"},
    {"use_beam_search", FOR_BOTH, FIELD_OFF, "false", "beam search is not supported"},
};

// logprobs: chat takes "logprobs": true with "top_logprobs": 0..20; completions take
// "logprobs": 0..20 (the number of alternatives).  r->logprobs: -1 (off) or that number.
static int parse_logprobs(const json_t *body, bool chat, struct gen_request *r, struct req_error *re) {
    const json_t *lp = json_object_get(body, "logprobs"), *top = json_object_get(body, "top_logprobs");
    long long k = 0;
    r->logprobs = -1;
    if (chat) {
        bool on;
        if (chatreq_get_bool(body, "logprobs", false, &on, re)) return -1;
        if (top && !json_is_null(top)) {
            if (!chatreq_integral(top, &k) || k < 0 || k > MAX_TOP_LOGPROBS)
                return req_fail(re, 400, "top_logprobs", "top_logprobs must be an integer between 0 and %d",
                                MAX_TOP_LOGPROBS);
            if (!on) return req_fail(re, 400, "top_logprobs", "top_logprobs requires \"logprobs\": true");
        }
        if (on) r->logprobs = (int)k;
        return 0;
    }
    if (!lp || json_is_null(lp) || json_is_false(lp)) return 0;
    if (!chatreq_integral(lp, &k) || k < 0 || k > MAX_TOP_LOGPROBS)
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
    if (chatreq_get_opt(body, "response_format", JSON_OBJECT, &rf, re)) return -1;
    const char *from = NULL; // the field the schema comes from
    const json_t *schema = NULL;
    bool any_object = false; // json_object without a schema
    json_t *parsed = NULL;   // guided_json given as a string
    if (rf) {
        const json_t *t = json_object_get(rf, "type");
        const char *type = json_is_string(t) ? json_string_value(t) : "";
        if (!strcmp(type, "json_schema")) {
            const json_t *js = json_object_get(rf, "json_schema");
            schema = json_object_get(js, "schema");
            if (!json_is_object(js) || !json_is_object(schema))
                return req_fail(
                    re, 400, "response_format",
                    "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
            from = "response_format";
        } else if (!strcmp(type, "json_object")) {
            schema = json_object_get(rf, "schema");
            if (schema && !json_is_null(schema) && !json_is_object(schema))
                return req_fail(re, 400, "response_format",
                                "response_format json_object's schema must be a JSON Schema object");
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
        if (from) return req_fail(re, 400, names[i], "%s and %s both give a schema: give one", from, names[i]);
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
    if (chatreq_get_opt(body, "stream_options", JSON_OBJECT, &v, re)) return -1;
    if (!v) return 0;
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        if (!strcmp(key, "include_usage")) {
            if (chatreq_get_bool(v, "include_usage", false, &o->include_usage, re)) return -1;
        } else if (!strcmp(key, "include_obfuscation")) {
            if (!json_is_null(x) && !json_is_false(x))
                return req_fail(re, 400, "stream_options",
                                "stream_options.include_obfuscation must be false (not supported)");
        } else {
            return req_fail(re, 400, "stream_options", "stream_options.%.*s is not a stream option (include_usage)",
                            chatreq_clip(key, 64), key);
        }
    }
    return 0;
}

// OpenAI's prediction, {"type": "content", "content": a string or text parts}: its tokens are a
// source of drafts for speculative decoding (r->draft; a hint: the answer is the same without it).
static int parse_prediction(const struct openai_ctx *oc, const json_t *body, struct gen_request *r,
                            struct req_error *re) {
    const json_t *v;
    if (chatreq_get_opt(body, "prediction", JSON_OBJECT, &v, re)) return -1;
    if (!v) return 0;
    const json_t *type = json_object_get(v, "type"), *content = json_object_get(v, "content");
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x) if (strcmp(key, "type") && strcmp(key, "content")) return req_fail(
        re, 400, "prediction", "prediction takes only \"type\" and \"content\"");
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
                return req_fail(re, 400, "prediction",
                                "prediction.content[%zu] must be {\"type\": \"text\", \"text\": ...}", i);
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
    int32_t *ids = NULL;
    size_t n = 0;
    char err[128];
    const int rc = oc->tok ? tokenizer_encode(oc->tok, b.p, b.len, &ids, &n, err, sizeof err) : 0;
    sbuf_free(&b);
    if (rc) return req_fail(re, 400, "prediction", "prediction: %s", err);
    r->draft = ids, r->n_draft = (int)n;
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
        if (!chatreq_integral(m, &k)) return req_fail(re, 400, names[i], "%s must be an integer", names[i]);
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

// Parameters common to both generation endpoints: the fields themselves, sampling, logprobs,
// max_tokens, stop, stream, the schema.  The session key (X-Session-Id, a balancer's affinity):
// prompt_cache_key (OpenAI's key for requests that share a prefix), else user (a stable end-user id).
static int parse_common(const struct openai_ctx *oc, const json_t *body, struct job *j, long long *max_tokens,
                        struct req_error *re) {
    struct openai_resp *o = j->sink.ctx;
    struct gen_request *r = &j->req;
    static const char *const session[] = {"prompt_cache_key", "user", NULL};
    const json_t *v;
    bool parallel = true;
    if (chatreq_check_fields(body, request_fields, sizeof request_fields / sizeof request_fields[0],
                             o->chat ? FOR_CHAT : FOR_COMPLETIONS, "Unrecognized request argument supplied: %.*s",
                             o->chat ? "%s is a completions parameter (/v1/completions)"
                                     : "%s is a chat parameter (/v1/chat/completions)",
                             re) ||
        chatreq_sampling(body, oc->allow_sampling, SAMPLE_ALL, 2, &r->sampling, re) ||
        parse_logprobs(body, o->chat, r, re) || chatreq_get_opt(body, "model", JSON_STRING, &v, re) ||
        chatreq_session(body, session, j, re) || parse_max_tokens(body, max_tokens, re) ||
        chatreq_get_bool(body, "stream", false, &j->stream, re) ||
        chatreq_get_bool(body, "return_token_ids", false, &o->return_ids, re) ||
        chatreq_get_bool(body, "ignore_eos", false, &r->ignore_stop, re) ||
        (o->chat && chatreq_get_bool(body, "parallel_tool_calls", true, &parallel, re)) ||
        parse_stream_options(body, o, re) || chatreq_stops(r, json_object_get(body, "stop"), "stop", MAX_STOPS, re) ||
        parse_prediction(oc, body, r, re) || parse_schema(body, r, re))
        return -1;
    r->max_calls = parallel ? 0 : 1; // parallel_tool_calls false: the answer ends after its first call
    return 0;
}

int openai_render_chat(const json_t *body, struct gen_request *r, char **out, unsigned char **markup, size_t *len,
                       size_t *boundary, struct req_error *re) {
    return chatreq_render(body, false, r, out, markup, len, boundary, re);
}

// /v1/completions: prompt as text (no template) or as token ids.
static int parse_completion(const struct openai_ctx *oc, const json_t *body, struct gen_request *r,
                            struct req_error *re) {
    const json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p)) return req_fail(re, 400, "prompt", "prompt is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return req_fail(re, 400, "prompt", "prompt must not be empty");
        return chatreq_tokens(oc->tok, json_string_value(p), NULL, json_string_length(p), &r->prompt, &r->n_prompt, re);
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
                return req_fail(
                    re, 400, "prompt",
                    "batched prompts are not supported (batch 1): give one string or one array of token ids");
            return req_fail(re, 400, "prompt", "prompt[%zu] must be an integer token id", i);
        }
        id = json_integer_value(t);
        if (id < 0 || id >= oc->vocab)
            return req_fail(re, 400, "prompt", "prompt[%zu] = %lld is outside the vocabulary (0 to %d)", i, id,
                            oc->vocab - 1);
        r->prompt[i] = (int32_t)id;
    }
    r->n_prompt = (int)n;
    return 0;
}

// The whole request -> a job ready to queue, or a 4xx.
struct job *openai_parse_request(const struct openai_ctx *oc, enum openai_endpoint ep, const char *data, size_t len,
                                 struct req_error *re) {
    json_t *body = chatreq_load(data, len, re);
    if (!body) return NULL;
    struct job *j = NULL;
    if (!(j = openai_job_new(oc, ep))) {
        req_fail(re, 500, NULL, "out of memory");
        goto fail;
    }
    const bool chat = ep == OPENAI_CHAT;
    struct gen_request *r = &j->req;
    long long max_tokens;
    if (parse_common(oc, body, j, &max_tokens, re)) goto fail;
    if (chat ? chatreq_encode(oc->tok, body, NULL, 0, r, re) : parse_completion(oc, body, r, re)) goto fail;
    if (r->n_prompt < 1) {
        req_fail(re, 400, chat ? "messages" : "prompt", "the prompt is empty");
        goto fail;
    }
    if (chatreq_fit(r, oc->context, oc->default_max_tokens, max_tokens, chat ? "messages" : "prompt", "max_tokens", re))
        goto fail;
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
    return json_pack("{s:i, s:i, s:i, s:{s:i}, s:{s:i, s:i}}", "prompt_tokens", e->n_prompt, "completion_tokens",
                     e->n_gen, "total_tokens", e->n_prompt + e->n_gen, "prompt_tokens_details", "cached_tokens",
                     e->n_cached, "completion_tokens_details", "accepted_prediction_tokens", e->prediction_accepted,
                     "rejected_prediction_tokens", e->prediction_rejected);
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
        json_t *msg =
            json_pack("{s:s, s:s%}", "role", "assistant", "content", o->content.p ? o->content.p : "", o->content.len);
        if (o->j->req.reasoning)
            json_object_set_new(msg, "reasoning_content",
                                json_stringn(o->reasoning_text.p ? o->reasoning_text.p : "", o->reasoning_text.len));
        if (o->calls) { // as OpenAI: content null when the answer is only calls
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
    json_array_append_new(json_object_get(c, "choices"),
                          json_pack("{s:i, s:{s:s, s:s}, s:n}", "index", 0, "delta", "role", "assistant", "content", "",
                                    "finish_reason"));
    sse_json(o->j, c);
}

// The end of a stream: the finish chunk with usage, or an error event; then [DONE].
static void stream_end(struct openai_resp *o, const struct gen_end *e) {
    if (e->finish) {
        json_t *c = chunk_new(o);
        json_t *choice = json_pack("{s:i, s:s}", "index", 0, "finish_reason", finish_reason(e->finish));
        if (o->chat)
            json_object_set_new(choice, "delta", json_object());
        else
            json_object_set_new(choice, "text", json_string(""));
        json_object_set_new(choice, "logprobs", logprobs_pending(o));
        if (o->return_ids) json_object_set_new(choice, "token_ids", ids_json(e));
        json_array_append_new(json_object_get(c, "choices"), choice);
        json_object_set_new(c, "timings", timings_json(e));
        sse_json(o->j, c);
        if (o->include_usage) { // usage once, in a chunk of its own after the finish, as OpenAI
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
    if (!c || (!o->calls && !(o->calls = json_array()))) {
        json_decref(c);
        return;
    }
    if (o->j->stream) { // one delta per call, whole: no markup, arguments complete
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
    if (s)
        job_answer(o->j, e->finish ? 200 : e->status, s, strlen(s));
    else
        job_answer(o->j, 500, "", 0); // out of memory: an empty body (the transport answers for it)
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
    *o = (struct openai_resp){.j = j,
                              .chat = ep == OPENAI_CHAT,
                              .tok = oc->tok,
                              .model_name = oc->model_name,
                              .created = (long long)time(NULL)};
    j->sink = (struct gen_sink){.ctx = o,
                                .progress = on_progress,
                                .begin = on_begin,
                                .logprobs = on_logprobs,
                                .text = on_text,
                                .tool_call = on_tool_call,
                                .end = on_end};
    j->sink_free = resp_free;
    j->kind = o->chat ? "chat" : "completion";
    char hex[25];
    random_hex(hex, 12); // unique across restarts, unlike a counter
    snprintf(j->id, sizeof j->id, "%s-%s", o->chat ? "chatcmpl" : "cmpl", hex);
    return j;
}
