// agentbench.c: `calla agentbench`, see agentbench.h.
//
// Times, per request (turn 0 is the opening request, turns 1..N the appends):
//   ttft_ms       from the request's last byte written to the first streamed chunk with a delta
//                 (both servers send their first chunk, the assistant's role, with the first token)
//   decode_tok_s  (completion tokens - 1) / (the last chunk with a choice, the finish - the first)
//   turn_ms       from the request's last byte written to the end of the answer ([DONE] and the close)
//   wall_s        the whole conversation: identity requests excluded, client time between turns included
#include "agentbench.h"

#include "agentconvo.h"
#include "bench.h"
#include "commands.h"
#include "http_client.h"
#include "options.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef CALLA_GIT_COMMIT
#define CALLA_GIT_COMMIT "unknown"
#endif
#ifndef CALLA_GIT_DIRTY
#define CALLA_GIT_DIRTY 1
#endif

static const char *const flavor_names[] = {
    [AGENTBENCH_FLAVOR_CALLA] = "calla", [AGENTBENCH_FLAVOR_LLAMA_SERVER] = "llama-server"};

int agentbench_flavor_parse(const char *s, enum agentbench_flavor *out) {
    for (size_t i = 0; i < sizeof flavor_names / sizeof flavor_names[0]; i++)
        if (!strcmp(s, flavor_names[i])) return *out = (enum agentbench_flavor)i, 0;
    return -1;
}

static json_t *num_or_null(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

// ---- one streamed answer ---------------------------------------------------------------------

struct turn_stream {
    double t_first, t_last; // the first chunk with a delta; the last chunk with a choice
    int chunks, comments;
    bool done; // "[DONE]" arrived
    struct sbuf content, reasoning;
    json_t *calls;           // [{id, type, function: {name, arguments}}], assembled from the deltas
    json_t *usage, *timings; // the last of each seen
    char finish[32];
};

static void turn_stream_free(struct turn_stream *ts) {
    sbuf_free(&ts->content);
    sbuf_free(&ts->reasoning);
    json_decref(ts->calls);
    json_decref(ts->usage);
    json_decref(ts->timings);
    memset(ts, 0, sizeof *ts);
}

static void append_string(json_t *obj, const char *key, const json_t *piece) {
    if (!json_is_string(piece)) return;
    const char *old = json_string_value(json_object_get(obj, key));
    struct sbuf b = {0};
    sbuf_adds(&b, old ? old : "");
    sbuf_add(&b, json_string_value(piece), json_string_length(piece));
    json_object_set_new(obj, key, json_stringn(b.p ? b.p : "", b.len));
    sbuf_free(&b);
}

// A tool_calls delta: each entry extends the call at its index (OpenAI's streaming form: the id and
// name come first, the arguments in pieces; Calla sends each call whole in one piece).
static void add_call_deltas(struct turn_stream *ts, const json_t *tcs) {
    size_t i;
    const json_t *tc;
    if (!ts->calls) ts->calls = json_array();
    json_array_foreach(tcs, i, tc) {
        const json_t *ix = json_object_get(tc, "index");
        size_t at = json_is_integer(ix) && json_integer_value(ix) >= 0 ? (size_t)json_integer_value(ix) : i;
        if (at > 64) continue;
        while (json_array_size(ts->calls) <= at)
            json_array_append_new(ts->calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", "", "type", "function",
                                                       "function", "name", "", "arguments", ""));
        json_t *c = json_array_get(ts->calls, at), *f = json_object_get(c, "function");
        const json_t *df = json_object_get(tc, "function");
        if (json_is_string(json_object_get(tc, "id")) && json_string_length(json_object_get(tc, "id")))
            json_object_set(c, "id", json_object_get(tc, "id"));
        append_string(f, "name", json_object_get(df, "name"));
        append_string(f, "arguments", json_object_get(df, "arguments"));
    }
}

static int on_event(void *arg, const char *data, size_t len, bool comment, double t, char *err, size_t errlen) {
    struct turn_stream *ts = arg;
    if (comment) { // ": prefill DONE/TOTAL", ": keep-alive"
        ts->comments++;
        return 0;
    }
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        ts->done = true;
        return 0;
    }
    json_error_t je;
    json_t *j = json_loadb(data, len, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return snprintf(err, errlen, "a streamed event is not a JSON object (%s): %.160s", je.text, data), -1;
    }
    const json_t *e = json_object_get(j, "error");
    if (e) {
        const char *m = json_is_string(e) ? json_string_value(e) : json_str(e, "message");
        snprintf(err, errlen, "the server streamed an error: %.400s", m ? m : data);
        json_decref(j);
        return -1;
    }
    json_t *u = json_object_get(j, "usage"), *tm = json_object_get(j, "timings");
    if (json_is_object(u)) json_decref(ts->usage), ts->usage = json_incref(u);
    if (json_is_object(tm)) json_decref(ts->timings), ts->timings = json_incref(tm);
    const json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    if (json_is_object(ch)) {
        ts->chunks++;
        ts->t_last = t;
        const json_t *d = json_object_get(ch, "delta");
        if (json_is_object(d) && json_object_size(d) && ts->t_first == 0) ts->t_first = t;
        const json_t *c = json_object_get(d, "content"), *r = json_object_get(d, "reasoning_content");
        if (json_is_string(c)) sbuf_add(&ts->content, json_string_value(c), json_string_length(c));
        if (json_is_string(r)) sbuf_add(&ts->reasoning, json_string_value(r), json_string_length(r));
        const json_t *tcs = json_object_get(d, "tool_calls");
        if (json_is_array(tcs)) add_call_deltas(ts, tcs);
        const json_t *fr = json_object_get(ch, "finish_reason");
        if (json_is_string(fr)) snprintf(ts->finish, sizeof ts->finish, "%s", json_string_value(fr));
    }
    json_decref(j);
    return 0;
}

// ---- the server ------------------------------------------------------------------------------

// GET path; *out the answer's JSON (NULL when not JSON). The HTTP status, or -1.
static int get_json(const struct http_url *u, const struct agentbench_options *o, const char *path, json_t **out,
                    char *err, size_t errlen) {
    struct http_request rq = {.method = "GET", .path = path, .api_key = o->api_key, .timeout_s = o->timeout_s};
    struct http_response resp;
    *out = NULL;
    if (http_do(u, &rq, &resp, err, errlen)) return -1;
    if (resp.body) *out = json_loadb(resp.body, resp.body_len, 0, NULL);
    http_response_free(&resp);
    return resp.status;
}

// Waits for GET /health to answer 200 (llama-server answers 503 while it loads the model).
static int wait_ready(const struct http_url *u, const struct agentbench_options *o, char *err, size_t errlen) {
    double deadline = now_s() + o->wait_s;
    struct agentbench_options quick = *o;
    quick.timeout_s = 5;
    for (;;) {
        json_t *j;
        int st = get_json(u, &quick, "/health", &j, err, errlen);
        json_decref(j);
        if (st == 200) return 0;
        if (now_s() > deadline) {
            if (st > 0) snprintf(err, errlen, "GET /health answered %d after %.0f s of waiting", st, o->wait_s);
            return -1;
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

// The engine's identity: /v1/models' first model, and /health (Calla) or /props (llama-server).
static json_t *engine_identity(const struct http_url *u, const struct agentbench_options *o, const char **model_id,
                               char *err, size_t errlen) {
    json_t *models, *extra = NULL;
    int st = get_json(u, o, "/v1/models", &models, err, errlen);
    if (st != 200 || !models) {
        if (st > 0) snprintf(err, errlen, "GET /v1/models answered %d%s", st, models ? "" : " (not JSON)");
        json_decref(models);
        return NULL;
    }
    json_t *first = json_array_get(json_object_get(models, "data"), 0);
    const char *id = json_str(first, "id");
    json_t *e = json_pack("{s:s, s:s}", "name", o->flavor == AGENTBENCH_FLAVOR_CALLA ? "calla" : "llama-server",
                          "flavor", flavor_names[o->flavor]);
    json_object_set_new(e, "model", json_string(o->model ? o->model : id ? id : "default"));
    json_object_set(e, "models", first ? first : json_null());
    if (o->flavor == AGENTBENCH_FLAVOR_LLAMA_SERVER) {
        char e2[256];
        if (get_json(u, o, "/props", &extra, e2, sizeof e2) == 200 && json_is_object(extra)) {
            // what identifies the build and the model; the chat template itself is left out (long)
            json_t *p = json_object();
            static const char *const keep[] = {"build_info", "model_path", "model_alias", "total_slots", "model_ftype"};
            for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
                if (json_object_get(extra, keep[i])) json_object_set(p, keep[i], json_object_get(extra, keep[i]));
            json_object_set_new(p, "n_ctx", num_or_null(json_num(extra, "default_generation_settings.n_ctx")));
            const char *tmpl = json_str(extra, "chat_template");
            char h[17];
            if (tmpl) snprintf(h, sizeof h, "%016llx", (unsigned long long)fnv1a64(FNV1A64_INIT, tmpl, strlen(tmpl)));
            json_object_set_new(p, "chat_template_hash", tmpl ? json_string(h) : json_null());
            json_object_set_new(e, "props", p);
        }
    } else {
        char e2[256];
        if (get_json(u, o, "/health", &extra, e2, sizeof e2) == 200 && json_is_object(extra))
            json_object_set(e, "health", extra);
    }
    json_decref(extra);
    *model_id = json_str(e, "model");
    json_decref(models);
    return e;
}

// ---- the conversation ------------------------------------------------------------------------

// The request of one turn: the whole conversation so far, streamed, a fixed length asked for.
static json_t *request_body(const struct agentbench_options *o, const char *model, const struct convo *c,
                            json_t *messages, bool required) {
    json_t *b = json_pack("{s:s, s:O, s:O}", "model", model, "messages", messages, "tools", c->tools);
    if (required) json_object_set_new(b, "tool_choice", json_string("required"));
    json_object_set_new(b, "stream", json_true());
    json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    json_object_set_new(b, "max_tokens", json_integer(o->gen));
    json_object_set_new(b, "temperature", json_integer(0));
    if (o->ignore_eos) json_object_set_new(b, "ignore_eos", json_true());
    json_object_set_new(b, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", o->thinking));
    if (o->flavor == AGENTBENCH_FLAVOR_LLAMA_SERVER) json_object_set_new(b, "cache_prompt", json_true());
    return b;
}

// The assistant's reply as the next request sends it back. Calls whose arguments are not a JSON
// object (one cut off by max_tokens) are left out, since a server would refuse to render them;
// *dropped counts them.
static json_t *reply_message(const struct turn_stream *ts, int *dropped, int *kept) {
    json_t *m = json_pack("{s:s}", "role", "assistant");
    json_t *calls = json_array();
    size_t i;
    json_t *c;
    *dropped = 0;
    json_array_foreach(ts->calls, i, c) {
        const char *args = json_str(c, "function.arguments"), *name = json_str(c, "function.name");
        json_t *parsed = args ? json_loads(args, 0, NULL) : NULL;
        if (!json_is_object(parsed) || !name || !*name)
            (*dropped)++;
        else
            json_array_append(calls, c);
        json_decref(parsed);
    }
    *kept = (int)json_array_size(calls);
    json_object_set_new(m, "content",
                        ts->content.len || !*kept ? json_stringn(ts->content.p ? ts->content.p : "", ts->content.len)
                                                  : json_null());
    if (ts->reasoning.len)
        json_object_set_new(m, "reasoning_content", json_stringn(ts->reasoning.p, ts->reasoning.len));
    if (*kept)
        json_object_set_new(m, "tool_calls", calls);
    else
        json_decref(calls);
    return m;
}

static uint64_t reply_hash(const struct turn_stream *ts) {
    uint64_t h = fnv1a64(FNV1A64_INIT, ts->content.p ? ts->content.p : "", ts->content.len + 1);
    h = fnv1a64(h, ts->reasoning.p ? ts->reasoning.p : "", ts->reasoning.len + 1);
    size_t i;
    json_t *c;
    json_array_foreach(ts->calls, i, c) {
        const char *n = json_str(c, "function.name"), *a = json_str(c, "function.arguments");
        h = fnv1a64(h, n ? n : "", (n ? strlen(n) : 0) + 1);
        h = fnv1a64(h, a ? a : "", (a ? strlen(a) : 0) + 1);
    }
    return h;
}

static void hex64(uint64_t h, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) v[k++] = v[i];
    if (!k) return NAN;
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

static double token_count(const json_t *usage, const char *path) {
    double v = json_num(usage, path);
    return isfinite(v) && v >= 0 ? v : NAN;
}

int agentbench_run(const struct agentbench_options *o, json_t **out, char *err, size_t errlen) {
    *out = NULL;
    if (o->gen < 1) return snprintf(err, errlen, "--gen must be at least 1"), -1;
    struct http_url u;
    if (http_url_parse(o->url, &u, err, errlen)) return -1;
    struct convo_params cp = {.seed = o->seed,
                              .turns = o->turns,
                              .system_tokens = o->system_tokens,
                              .min_result = o->min_result,
                              .max_result = o->max_result,
                              .required_every = o->required_every};
    struct convo c;
    if (convo_build(&cp, &c, err, errlen)) return -1;
    char e2[768];
    if (o->wait_s > 0 && wait_ready(&u, o, e2, sizeof e2)) {
        snprintf(err, errlen, "the server at %s is not ready: %s", o->url, e2);
        convo_free(&c);
        return -1;
    }
    const char *model = NULL;
    json_t *engine = engine_identity(&u, o, &model, e2, sizeof e2);
    if (!engine) {
        snprintf(err, errlen, "%s: %s", o->url, e2);
        convo_free(&c);
        return -1;
    }
    char date[32];
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);

    json_t *messages =
        json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content", c.system, "role", "user", "content", c.task);
    json_t *turns = json_array();
    struct turn_stream prev = {0};
    int rc = -1, n_req = c.n_turns + 1;
    double *ttft = calloc((size_t)n_req, sizeof *ttft), *dec = calloc((size_t)n_req, sizeof *dec);
    double ttft_sum = 0, turn_sum = 0, prev_prompt = NAN, prev_gen = NAN;
    long long cached_sum = 0, prefilled_sum = 0, gen_sum = 0, last_prompt = 0;
    uint64_t replies = FNV1A64_INIT;
    if (!ttft || !dec) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    double wall0 = now_s();
    for (int k = 0; k < n_req; k++) {
        const struct convo_turn *ct = k ? &c.turns[k - 1] : NULL;
        int dropped = 0, kept = 0;
        if (k) { // the previous reply as returned, then this turn's tool result
            json_t *reply = reply_message(&prev, &dropped, &kept);
            const char *call_id = kept ? json_str(json_array_get(json_object_get(reply, "tool_calls"), 0), "id") : NULL;
            char synthetic[32];
            snprintf(synthetic, sizeof synthetic, "call_agentbench_%d", k);
            json_t *tool = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                                     call_id && *call_id ? call_id : synthetic, "content", ct->result);
            json_array_append_new(messages, reply);
            json_array_append_new(messages, tool);
        }
        bool required = ct && ct->required;
        json_t *body = request_body(o, model, &c, messages, required);
        char *text = json_dumps(body, JSON_PRESERVE_ORDER | JSON_COMPACT);
        json_decref(body);
        if (!text) {
            snprintf(err, errlen, "turn %d: out of memory", k);
            goto done;
        }
        turn_stream_free(&prev);
        struct http_request rq = {.method = "POST",
                                  .path = "/v1/chat/completions",
                                  .api_key = o->api_key,
                                  .body = text,
                                  .body_len = strlen(text),
                                  .timeout_s = o->timeout_s,
                                  .on_event = on_event,
                                  .arg = &prev};
        struct http_response resp;
        int hr = http_do(&u, &rq, &resp, e2, sizeof e2);
        free(text);
        if (hr) {
            snprintf(err, errlen, "turn %d: %s", k, e2);
            goto done;
        }
        if (resp.status != 200) {
            json_t *eb = resp.body ? json_loadb(resp.body, resp.body_len, 0, NULL) : NULL;
            const char *m = json_str(eb, "error.message");
            snprintf(err, errlen, "turn %d: HTTP %d: %.600s", k, resp.status, m ? m : resp.body ? resp.body : "");
            json_decref(eb);
            http_response_free(&resp);
            goto done;
        }
        http_response_free(&resp);
        if (!prev.done || !prev.usage || prev.t_first == 0) {
            snprintf(err, errlen, "turn %d: the stream ended without %s", k,
                     !prev.t_first ? "a token"
                     : !prev.usage ? "usage (stream_options.include_usage)"
                                   : "[DONE]");
            goto done;
        }
        double prompt = token_count(prev.usage, "prompt_tokens"), gen = token_count(prev.usage, "completion_tokens");
        double cached = token_count(prev.usage, "prompt_tokens_details.cached_tokens");
        const char *cached_from = "usage.prompt_tokens_details.cached_tokens";
        if (o->flavor == AGENTBENCH_FLAVOR_LLAMA_SERVER && isfinite(json_num(prev.timings, "cache_n"))) {
            cached = json_num(prev.timings, "cache_n");
            cached_from = "timings.cache_n";
        }
        if (!isfinite(prompt) || !isfinite(gen)) {
            snprintf(err, errlen, "turn %d: usage without prompt_tokens or completion_tokens", k);
            goto done;
        }
        ttft[k] = 1e3 * (prev.t_first - resp.t_sent);
        dec[k] = gen > 1 && prev.t_last > prev.t_first ? (gen - 1) / (prev.t_last - prev.t_first) : NAN;
        double turn_ms = 1e3 * (resp.t_done - resp.t_sent);
        ttft_sum += ttft[k], turn_sum += turn_ms;
        if (isfinite(cached))
            cached_sum += (long long)cached, prefilled_sum += (long long)(prompt - cached);
        else
            prefilled_sum += (long long)prompt;
        gen_sum += (long long)gen, last_prompt = (long long)prompt;
        uint64_t rh = reply_hash(&prev);
        replies = fnv1a64(replies, &rh, sizeof rh);
        char hs[17];
        hex64(rh, hs);
        json_t *t = json_pack("{s:i, s:s, s:s}", "turn", k, "tool", ct ? ct->tool : "", "tool_choice",
                              required ? "required" : "auto");
        json_object_set_new(t, "appended_target_tokens", json_integer(ct ? ct->target_tokens : 0));
        json_object_set_new(t, "appended_est_tokens",
                            json_integer(ct ? ct->est_tokens : c.system_est + c.tools_est + c.task_est));
        json_object_set_new(t, "prompt_tokens", json_integer((json_int_t)prompt));
        json_object_set_new(t, "cached_tokens", isfinite(cached) ? json_integer((json_int_t)cached) : json_null());
        json_object_set_new(t, "cached_from", json_string(cached_from));
        // what this turn added to the conversation: the prompt beyond the previous prompt and reply
        json_object_set_new(t, "new_tokens", json_integer((json_int_t)(k ? prompt - prev_prompt - prev_gen : prompt)));
        json_object_set_new(t, "prefilled_tokens",
                            json_integer((json_int_t)(isfinite(cached) ? prompt - cached : prompt)));
        json_object_set_new(t, "completion_tokens", json_integer((json_int_t)gen));
        json_object_set_new(t, "finish_reason", json_string(prev.finish[0] ? prev.finish : "unknown"));
        json_object_set_new(t, "ttft_ms", json_real(ttft[k]));
        json_object_set_new(t, "decode_tok_s", num_or_null(dec[k]));
        json_object_set_new(t, "turn_ms", json_real(turn_ms));
        json_object_set_new(t, "chunks", json_integer(prev.chunks));
        json_object_set_new(t, "sse_comments", json_integer(prev.comments));
        json_object_set_new(t, "tool_calls", json_integer((json_int_t)json_array_size(prev.calls)));
        json_object_set_new(t, "calls_dropped", json_integer(dropped));
        json_object_set_new(t, "reply_hash", json_string(hs));
        json_object_set(t, "server_timings", prev.timings ? prev.timings : json_null());
        json_array_append_new(turns, t);
        prev_prompt = prompt, prev_gen = gen;
        if (!o->quiet)
            fprintf(stderr,
                    "calla agentbench: turn %d/%d: prompt %.0f (cached %.0f), ttft %.1f ms, %.0f tokens, %.1f ms\n", k,
                    n_req - 1, prompt, isfinite(cached) ? cached : -1, ttft[k], gen, turn_ms);
    }
    double wall = now_s() - wall0;
    // the calls dropped from the last reply are never sent: recount them for its record
    int dropped_last = 0, kept_last = 0;
    json_decref(reply_message(&prev, &dropped_last, &kept_last));
    json_object_set_new(json_array_get(turns, (size_t)n_req - 1), "calls_dropped", json_integer(dropped_last));

    json_t *r = json_object();
    json_object_set_new(r, "schema", json_string(AGENTBENCH_SCHEMA));
    json_object_set_new(r, "date", json_string(date));
    json_object_set_new(r, "label", json_string(o->label ? o->label : json_str(engine, "name")));
    json_object_set_new(r, "url", json_string(o->url));
    json_object_set_new(r, "engine", engine);
    engine = NULL;
    json_object_set_new(
        r, "client",
        json_pack("{s:s, s:s, s:b}", "name", "calla agentbench", "commit", CALLA_GIT_COMMIT, "dirty", CALLA_GIT_DIRTY));
    char ch[17], rhs[17];
    hex64(c.hash, ch);
    hex64(replies, rhs);
    json_t *conv = json_pack("{s:I, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:s}", "seed", (json_int_t)o->seed,
                             "turns", c.n_turns, "requests", n_req, "system_tokens", o->system_tokens, "min_result",
                             o->min_result, "max_result", o->max_result, "gen", o->gen, "required_every",
                             o->required_every, "ignore_eos", o->ignore_eos, "thinking", o->thinking, "hash", ch);
    json_object_set_new(conv, "system_est_tokens", json_integer(c.system_est));
    json_object_set_new(conv, "tools_est_tokens", json_integer(c.tools_est));
    json_object_set_new(conv, "task_est_tokens", json_integer(c.task_est));
    json_object_set_new(conv, "tools", json_integer((json_int_t)json_array_size(c.tools)));
    json_object_set_new(r, "conversation", conv);
    json_object_set_new(r, "turns", turns);
    turns = NULL;
    double ttft_appends = n_req > 1 ? median(ttft + 1, n_req - 1) : NAN;
    json_t *s = json_object();
    json_object_set_new(s, "wall_s", json_real(wall));
    json_object_set_new(s, "ttft_ms_sum", json_real(ttft_sum));
    json_object_set_new(s, "ttft_ms_first", json_real(ttft[0]));
    json_object_set_new(s, "ttft_ms_median_appends", num_or_null(ttft_appends));
    json_object_set_new(s, "turn_ms_sum", json_real(turn_sum));
    json_object_set_new(s, "decode_tok_s_median", num_or_null(median(dec, n_req)));
    json_object_set_new(s, "prompt_tokens_last", json_integer(last_prompt));
    json_object_set_new(s, "cached_tokens_sum", json_integer(cached_sum));
    json_object_set_new(s, "prefilled_tokens_sum", json_integer(prefilled_sum));
    json_object_set_new(s, "completion_tokens_sum", json_integer(gen_sum));
    json_object_set_new(s, "replies_hash", json_string(rhs));
    json_object_set_new(r, "summary", s);
    json_object_set_new(r, "wall_s", json_real(wall));
    *out = r;
    rc = 0;
done:
    turn_stream_free(&prev);
    json_decref(messages);
    json_decref(turns);
    json_decref(engine);
    free(ttft);
    free(dec);
    convo_free(&c);
    return rc;
}

// ---- structure check (CI) --------------------------------------------------------------------

int agentbench_record_check(const json_t *r, char *err, size_t errlen) {
    static const char *const strings[] = {"schema",
                                          "date",
                                          "label",
                                          "url",
                                          "engine.name",
                                          "engine.flavor",
                                          "engine.model",
                                          "client.commit",
                                          "conversation.hash",
                                          "summary.replies_hash"};
    static const char *const numbers[] = {"conversation.seed",          "conversation.turns",
                                          "conversation.requests",      "conversation.gen",
                                          "conversation.system_tokens", "summary.wall_s",
                                          "summary.ttft_ms_sum",        "summary.turn_ms_sum",
                                          "summary.prompt_tokens_last", "wall_s"};
    static const char *const turn_numbers[] = {
        "turn",    "prompt_tokens", "new_tokens",         "prefilled_tokens", "completion_tokens",
        "ttft_ms", "turn_ms",       "appended_est_tokens"};
    static const char *const turn_strings[] = {"tool", "tool_choice", "finish_reason", "reply_hash", "cached_from"};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!json_str(r, strings[i])) return snprintf(err, errlen, "missing string \"%s\"", strings[i]), -1;
    if (strcmp(json_str(r, "schema"), AGENTBENCH_SCHEMA))
        return snprintf(err, errlen, "schema \"%s\", expected \"%s\"", json_str(r, "schema"), AGENTBENCH_SCHEMA), -1;
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++)
        if (isnan(json_num(r, numbers[i]))) return snprintf(err, errlen, "missing number \"%s\"", numbers[i]), -1;
    const json_t *turns = json_object_get(r, "turns");
    int n = (int)json_num(r, "conversation.requests");
    if (!json_is_array(turns) || (int)json_array_size(turns) != n)
        return snprintf(err, errlen, "turns must hold conversation.requests (%d) entries", n), -1;
    for (int k = 0; k < n; k++) {
        const json_t *t = json_array_get(turns, (size_t)k);
        for (size_t i = 0; i < sizeof turn_numbers / sizeof turn_numbers[0]; i++)
            if (isnan(json_num(t, turn_numbers[i])))
                return snprintf(err, errlen, "turns[%d]: missing number \"%s\"", k, turn_numbers[i]), -1;
        for (size_t i = 0; i < sizeof turn_strings / sizeof turn_strings[0]; i++)
            if (!json_str(t, turn_strings[i]))
                return snprintf(err, errlen, "turns[%d]: missing string \"%s\"", k, turn_strings[i]), -1;
        if ((int)json_num(t, "turn") != k)
            return snprintf(err, errlen, "turns[%d].turn is %g", k, json_num(t, "turn")), -1;
        static const char *const present[] = {"cached_tokens", "decode_tok_s", "server_timings"};
        for (size_t i = 0; i < sizeof present / sizeof present[0]; i++)
            if (!json_object_get(t, present[i]))
                return snprintf(err, errlen, "turns[%d]: missing field \"%s\"", k, present[i]), -1;
    }
    return 0;
}

// ---- the table -------------------------------------------------------------------------------

void agentbench_print_table(FILE *f, const json_t *r) {
    fprintf(f, "%s (%s at %s, model %s): %d requests, seed %.0f, %.0f tokens a turn%s%s\n", json_str(r, "label"),
            json_str(r, "engine.flavor"), json_str(r, "url"), json_str(r, "engine.model"),
            (int)json_num(r, "conversation.requests"), json_num(r, "conversation.seed"),
            json_num(r, "conversation.gen"),
            json_is_true(json_object_get(json_object_get(r, "conversation"), "ignore_eos")) ? " (ignore_eos)" : "",
            json_is_true(json_object_get(json_object_get(r, "conversation"), "thinking")) ? ", thinking on" : "");
    fprintf(f, "%4s  %-10s %-8s %8s %8s %8s %8s %5s %9s %9s %9s\n", "turn", "tool", "choice", "appended", "prompt",
            "cached", "prefill", "gen", "ttft ms", "tok/s", "turn ms");
    size_t i;
    const json_t *t;
    json_array_foreach(json_object_get(r, "turns"), i, t) {
        const char *tool = json_str(t, "tool");
        double cached = json_num(t, "cached_tokens"), d = json_num(t, "decode_tok_s");
        char cs[16] = "-", ds[16] = "-";
        if (isfinite(cached)) snprintf(cs, sizeof cs, "%.0f", cached);
        if (isfinite(d)) snprintf(ds, sizeof ds, "%.1f", d);
        fprintf(f, "%4zu  %-10s %-8s %8.0f %8.0f %8s %8.0f %5.0f %9.1f %9s %9.1f\n", i, tool && *tool ? tool : "(open)",
                json_str(t, "tool_choice"), json_num(t, "new_tokens"), json_num(t, "prompt_tokens"), cs,
                json_num(t, "prefilled_tokens"), json_num(t, "completion_tokens"), json_num(t, "ttft_ms"), ds,
                json_num(t, "turn_ms"));
    }
    fprintf(f,
            "total wall %.3f s; TTFT %.1f ms opening, median %.1f ms over the appends, %.1f ms in all; decode median "
            "%.1f tok/s; final prompt %.0f tokens\n",
            json_num(r, "summary.wall_s"), json_num(r, "summary.ttft_ms_first"),
            json_num(r, "summary.ttft_ms_median_appends"), json_num(r, "summary.ttft_ms_sum"),
            json_num(r, "summary.decode_tok_s_median"), json_num(r, "summary.prompt_tokens_last"));
}

// ---- the command -----------------------------------------------------------------------------

// --dry-run: the conversation every engine is sent (the replies aside), as JSON on stdout.
static int print_conversation(const struct convo_params *cp) {
    struct convo c;
    char err[256];
    if (convo_build(cp, &c, err, sizeof err)) {
        fprintf(stderr, "calla agentbench: %s\n", err);
        return 2;
    }
    char h[17];
    hex64(c.hash, h);
    json_t *turns = json_array();
    for (int k = 0; k < c.n_turns; k++)
        json_array_append_new(turns,
                              json_pack("{s:i, s:s, s:b, s:i, s:i, s:s}", "turn", k + 1, "tool", c.turns[k].tool,
                                        "required", c.turns[k].required, "target_tokens", c.turns[k].target_tokens,
                                        "est_tokens", c.turns[k].est_tokens, "result", c.turns[k].result));
    json_t *j = json_pack("{s:s, s:s, s:i, s:s, s:i, s:O, s:i, s:o}", "hash", h, "system", c.system,
                          "system_est_tokens", c.system_est, "task", c.task, "task_est_tokens", c.task_est, "tools",
                          c.tools, "tools_est_tokens", c.tools_est, "turns", turns);
    json_dumpf(j, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    fputc('\n', stdout);
    json_decref(j);
    convo_free(&c);
    return 0;
}

int cmd_agentbench(int argc, char **argv) {
    const char *url = NULL, *api_key = NULL, *flavor = "calla", *json_out = NULL, *label = NULL, *model = NULL;
    long long turns = 20, seed = 1, system_tokens = 8000, gen = 16, required_every = 4, min_result = 20,
              max_result = 4000, timeout = 300, wait = 0;
    bool no_ignore_eos = false, thinking = false, dry_run = false, quiet = false;
    const struct opt opts[] = {
        {"url", OPT_STR, &url, 0, 0, "the server, http://HOST:PORT (plain HTTP)"},
        {"api-key", OPT_STR, &api_key, 0, 0, "sent as Authorization: Bearer KEY"},
        {"flavor", OPT_STR, &flavor, 0, 0, "the server's API: calla or llama-server (default calla)"},
        {"turns", OPT_INT, &turns, 0, 1000, "appends after the opening request (default 20)"},
        {"seed", OPT_INT, &seed, 0, 0x7fffffffffffffffLL, "the conversation's seed (default 1)"},
        {"system-tokens", OPT_INT, &system_tokens, 0, 200000,
         "the opening system turn with the tool definitions, estimated tokens (default 8000)"},
        {"min-result", OPT_INT, &min_result, 1, 100000, "smallest tool result, estimated tokens (default 20)"},
        {"max-result", OPT_INT, &max_result, 1, 100000, "largest tool result, estimated tokens (default 4000)"},
        {"gen", OPT_INT, &gen, 1, 65536, "tokens generated a turn: max_tokens, with ignore_eos (default 16)"},
        {"required-every", OPT_INT, &required_every, 0, 1000,
         "turns k with k % N == 0 send tool_choice \"required\" (default 4; 0: none)"},
        {"no-ignore-eos", OPT_FLAG, &no_ignore_eos, 0, 0, "do not send \"ignore_eos\": true (a turn may end early)"},
        {"thinking", OPT_FLAG, &thinking, 0, 0,
         "enable_thinking on (default off: answers, and forced calls, from "
         "the first token)"},
        {"model", OPT_STR, &model, 0, 0, "the request's model (default: the first id of /v1/models)"},
        {"label", OPT_STR, &label, 0, 0, "arm name recorded in the JSON (default: the engine's name)"},
        {"timeout", OPT_INT, &timeout, 1, 86400, "seconds any connect, write or read may wait (default 300)"},
        {"wait", OPT_INT, &wait, 0, 86400, "wait up to this many seconds for GET /health to answer 200 (default 0)"},
        {"json", OPT_STR, &json_out, 0, 0, "where to write the JSON record"},
        {"quiet", OPT_FLAG, &quiet, 0, 0, "no progress line per turn on stderr"},
        {"dry-run", OPT_FLAG, &dry_run, 0, 0, "print the conversation (what every engine is sent) as JSON; no server"},
    };
    const int n = sizeof opts / sizeof opts[0];
    const char *summary = "replay a fixed multi-turn coding-agent conversation through a running server's "
                          "/v1/chat/completions; per-turn TTFT, cached tokens, decode tok/s and the total wall time";
    int b = opts_begin(argc, argv, "agentbench", summary, opts, n);
    if (b) return b > 0 ? 0 : 2;
    if (min_result > max_result) {
        fprintf(stderr, "calla agentbench: --min-result %lld is above --max-result %lld\n", min_result, max_result);
        return 2;
    }
    struct agentbench_options ao = {
        .url = url,
        .api_key = api_key,
        .label = label,
        .model = model,
        .seed = (uint64_t)seed,
        .turns = (int)turns,
        .system_tokens = (int)system_tokens,
        .min_result = (int)min_result,
        .max_result = (int)max_result,
        .gen = (int)gen,
        .required_every = (int)required_every,
        .ignore_eos = !no_ignore_eos,
        .thinking = thinking,
        .timeout_s = (double)timeout,
        .wait_s = (double)wait,
        .quiet = quiet,
    };
    if (agentbench_flavor_parse(flavor, &ao.flavor)) {
        fprintf(stderr, "calla agentbench: --flavor must be calla or llama-server, got \"%s\"\n", flavor);
        return 2;
    }
    if (dry_run) {
        struct convo_params cp = {.seed = ao.seed,
                                  .turns = ao.turns,
                                  .system_tokens = ao.system_tokens,
                                  .min_result = ao.min_result,
                                  .max_result = ao.max_result,
                                  .required_every = ao.required_every};
        return print_conversation(&cp);
    }
    if (!url) {
        fprintf(stderr, "calla agentbench: --url is required\n");
        opts_usage(stderr, "agentbench", summary, opts, n);
        return 2;
    }
    char err[1024];
    json_t *r;
    if (agentbench_run(&ao, &r, err, sizeof err)) {
        fprintf(stderr, "calla agentbench: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (json_out && json_write_file(r, json_out, err, sizeof err)) {
        fprintf(stderr, "calla agentbench: %s\n", err);
        rc = 1;
    }
    agentbench_print_table(stdout, r);
    json_decref(r);
    return rc;
}
