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
    char *clean = NULL;   // messages quote client text, perhaps cut mid-character: make it valid UTF-8
    size_t len;
    if (utf8_sanitize(msg, strlen(msg), &clean, &len)) clean = NULL;
    json_t *o = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", clean ? clean : "invalid request", "type",
                          type, "param", param, "code", code);
    free(clean);
    return o;
}

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
    if (top && !json_is_null(top))
        return req_fail(re, 400, "top_logprobs", "top_logprobs is a chat parameter; completions take \"logprobs\": N");
    if (!lp || json_is_null(lp) || json_is_false(lp)) return 0;
    if (!chatreq_integral(lp, &k) || k < 0 || k > MAX_TOP_LOGPROBS)
        return req_fail(re, 400, "logprobs", "logprobs must be an integer between 0 and %d", MAX_TOP_LOGPROBS);
    r->logprobs = (int)k;
    return 0;
}

// response_format: text, json_object, or json_schema {"name", "schema", "strict"}: the schema is
// compiled here, once (constrain.c), and refused with the keyword named when outside the subset.
static int parse_response_format(const json_t *v, struct gen_request *r, struct req_error *re) {
    const json_t *t = json_object_get(v, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    const json_t *schema = NULL;
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_schema")) {
        const json_t *js = json_object_get(v, "json_schema");
        schema = json_object_get(js, "schema");
        if (!json_is_object(js) || !json_is_object(schema))
            return req_fail(re, 400, "response_format",
                       "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
    } else if (strcmp(type, "json_object")) {
        return req_fail(re, 400, "response_format", "response_format type must be \"text\", \"json_object\" or \"json_schema\"");
    }
    char err[300];
    if (constrain_compile(schema, &r->schema, err, sizeof err))
        return req_fail(re, 400, "response_format", "response_format.json_schema.schema: %s", err);
    return 0;
}

// Parameters common to both generation endpoints: greedy checks, max_tokens, stop, stream.
static int parse_common(const struct openai_ctx *oc, const json_t *body, struct job *j, long long *max_tokens,
                        struct req_error *re) {
    struct openai_resp *o = j->sink.ctx;
    struct gen_request *r = &j->req;
    if (check_greedy(body, re) || parse_logprobs(body, o->chat, r, re)) return -1;
    const json_t *v;
    if (chatreq_get_opt(body, "model", JSON_STRING, &v, re)) return -1;
    // OpenAI's `user`: a stable end-user id.  Mirrored as X-Session-Id so a balancer can keep the
    // conversation on this replica; an id that cannot be a header value is accepted, not mirrored.
    if (chatreq_get_opt(body, "user", JSON_STRING, &v, re)) return -1;
    if (v && session_id_valid(json_string_value(v), json_string_length(v)))
        memcpy(j->session, json_string_value(v), json_string_length(v) + 1);
    *max_tokens = 0;   // 0: not given
    static const char *const mt_names[] = {"max_tokens", "max_completion_tokens"};
    for (int i = 0; i < 2; i++) {
        const json_t *m = json_object_get(body, mt_names[i]);
        if (!m || json_is_null(m)) continue;
        long long k;
        if (!chatreq_integral(m, &k)) return req_fail(re, 400, mt_names[i], "%s must be an integer", mt_names[i]);
        if (k < 1 || k > QWEN_MAX_CTX - 1)
            return req_fail(re, 400, mt_names[i], "%s must be between 1 and %d inclusive, got %lld", mt_names[i],
                       QWEN_MAX_CTX - 1, k);
        *max_tokens = k;   // max_completion_tokens (the newer name) wins when both are given
    }
    if (chatreq_get_bool(body, "stream", false, &j->stream, re)) return -1;
    if (chatreq_get_bool(body, "return_token_ids", false, &o->return_ids, re)) return -1;
    if (chatreq_get_opt(body, "stream_options", JSON_OBJECT, &v, re)) return -1;
    if (v && chatreq_get_bool(v, "include_usage", false, &o->include_usage, re)) return -1;
    if (chatreq_stops(r, json_object_get(body, "stop"), "stop", MAX_STOPS, re)) return -1;
    if (chatreq_get_bool(body, "echo", false, &(bool){0}, re)) return -1;
    if (json_is_true(json_object_get(body, "echo"))) return req_fail(re, 400, "echo", "echo is not supported");
    if (chatreq_get_opt(body, "suffix", JSON_STRING, &v, re)) return -1;
    if (v && json_string_length(v)) return req_fail(re, 400, "suffix", "suffix (fill-in-the-middle) is not supported");
    if (!o->chat && json_object_get(body, "tools") && !json_is_null(json_object_get(body, "tools")))
        return req_fail(re, 400, "tools", "tools are a chat parameter (/v1/chat/completions)");
    if (chatreq_get_opt(body, "response_format", JSON_OBJECT, &v, re)) return -1;
    if (v && parse_response_format(v, r, re)) return -1;
    (void)oc;
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
    if (!c || (!o->calls && !(o->calls = json_array()))) {
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
