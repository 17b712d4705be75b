// server.c: `calla serve`, an OpenAI-compatible HTTP server over one engine, batch 1, greedy.
//
// Threads:
//   MHD, one thread per connection: reads and validates a request (JSON, limits, tokenization),
//        queues a job, then waits for it (non-streaming) or relays its server-sent events.
//   worker: the only thread that touches the engine, the working sequence and the session
//        cache; it runs jobs one at a time in arrival (queue) order.
//   main: waits for SIGTERM/SIGINT, then drains (finishes running and queued jobs, up to
//        --drain-seconds) or aborts, and frees everything.
//
// A job is shared by its connection and the worker (reference counted, one mutex each).  A
// client that goes away is noticed between prefill chunks and decode steps: the worker polls the
// client socket for a hang-up, and MHD's completion callback marks the job cancelled.
//
// Every bad request ends as a 4xx JSON error in the OpenAI shape
//   {"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": ...}};
// nothing a client sends can reach an abort().
#include "chat.h"
#include "commands.h"
#include "engine.h"
#include "options.h"
#include "session_cache.h"
#include "tokenizer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

// ---- limits and defaults -----------------------------------------------------------------------

enum {
    MAX_STOPS = 4,            // OpenAI's limit on `stop`
    MAX_STOP_BYTES = 256,     // per stop string
    SSE_BLOCK = 4096,         // MHD read block for streamed responses
    RETRY_AFTER_S = 1,        // Retry-After on 503 queue full
};

struct server_config {
    const char *model_dir, *host, *backend, *model_name;
    long long port;
    long long context;            // tokens per sequence: prompt + max_tokens + 1 must fit
    long long queue;              // waiting jobs beyond the running one; past it: 503
    long long max_body;           // request body bytes; past it: 413
    long long max_header;         // request header bytes (MHD's per-connection memory); past it: 4xx from MHD
    long long max_connections;
    long long cache_entries;      // LRU of end-of-request states (0: off)
    long long cache_boundaries;   // LRU of last-message-boundary snapshots (0: off)
    long long default_max_tokens; // when a request gives none (then capped by what the context has left)
    long long drain_seconds;      // on SIGTERM, how long running and queued requests may finish
    long long threads;
    long long timeout;            // idle connection timeout, seconds
    bool quiet;
};

// ---- a growable byte buffer --------------------------------------------------------------------

struct sbuf {
    char *p;
    size_t len, cap;
};

static int sbuf_add(struct sbuf *b, const void *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static void sbuf_free(struct sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- metrics -----------------------------------------------------------------------------------

enum endpoint { EP_CHAT, EP_COMPLETIONS, EP_MODELS, EP_HEALTH, EP_METRICS, EP_OTHER, EP_COUNT };
static const char *const endpoint_names[EP_COUNT] = {"chat_completions", "completions", "models",
                                                     "health", "metrics", "other"};
static const int status_codes[] = {200, 400, 404, 405, 413, 500, 503};
enum { N_STATUS = sizeof status_codes / sizeof status_codes[0] };

struct metrics {
    unsigned long long requests[EP_COUNT][N_STATUS + 1];   // last column: any other status
    unsigned long long prompt_tokens, generated_tokens, cached_tokens, cache_hits, cache_misses, cancelled;
    double prefill_s, decode_s;
};

// ---- jobs --------------------------------------------------------------------------------------

enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                       // connection, response (streaming) and worker

    // The request, fixed once queued.
    bool chat;                      // chat.completion (else text_completion)
    bool stream, include_usage;
    bool return_ids;                // return_token_ids: the generated ids in the choice (as vLLM)
    bool reasoning;                 // chat with thinking on: output before </think> is reasoning_content
    int32_t *prompt;
    int n_prompt;
    int boundary;                   // tokens up to the last message boundary (0: none)
    int max_tokens;
    char *stops[MAX_STOPS];
    size_t stop_len[MAX_STOPS];
    int n_stops;
    char id[48];
    long long created;
    const char *model_name;
    double t_queued;
    atomic_bool *abort;             // the server's "cancel everything"

    // Shared state, under mu.
    int fd;                         // the client socket; -1 once MHD has closed it
    enum job_state state;
    bool cancel;                    // the client went away (or the server is aborting)
    struct sbuf sse;                // streamed bytes produced by the worker...
    size_t sse_off;                 // ...and consumed by MHD

    // Results, written by the worker before state = JOB_DONE.
    struct sbuf content, reasoning_text;
    const char *finish;             // "stop" or "length"; NULL on failure
    int status;                     // HTTP status of a failure (0: success)
    char errmsg[512];
    int32_t *gen;                   // [n_gen] generated ids, the stop token included
    int n_gen, n_cached;
    double queue_ms, prefill_ms, decode_ms;

    struct job *next;               // queue link
};

static struct job *job_new(void) {
    struct job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->fd = -1;
    return j;
}

static void job_ref(struct job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

static void job_unref(struct job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int r = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (r) return;
    free(j->prompt);
    free(j->gen);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    sbuf_free(&j->sse);
    sbuf_free(&j->content);
    sbuf_free(&j->reasoning_text);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

// ---- the server --------------------------------------------------------------------------------

struct server {
    struct server_config cfg;
    struct engine *e;
    struct tokenizer *tok;
    int vocab;                      // the model's vocabulary (embedding rows)

    // Worker-only state.
    struct seq *w;                  // the working sequence
    struct session_cache full;      // end-of-request states
    struct session_cache bound;     // last-message-boundary snapshots

    pthread_mutex_t mu;             // queue, flags, metrics
    pthread_cond_t cv;
    struct job *head, *tail;
    int depth;                      // queued, not running
    struct job *running;
    int open_jobs;                  // queued jobs whose request MHD has not completed (answer in flight)
    bool draining;                  // SIGTERM: refuse new work
    bool stop_worker;
    atomic_bool abort;              // cancel everything now
    unsigned long long next_id;
    struct metrics m;

    pthread_t worker;
    struct MHD_Daemon *d;
};

// ---- HTTP responses ----------------------------------------------------------------------------

static void count_request(struct server *sv, enum endpoint ep, int status) {
    int k = N_STATUS;
    for (int i = 0; i < N_STATUS; i++)
        if (status_codes[i] == status) k = i;
    pthread_mutex_lock(&sv->mu);
    sv->m.requests[ep][k]++;
    pthread_mutex_unlock(&sv->mu);
}

static enum MHD_Result send_buf(struct server *sv, struct MHD_Connection *c, enum endpoint ep, int status,
                                const char *type, const char *body, size_t len, int retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", v);
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_request(sv, ep, status);
    return ret;
}

static enum MHD_Result send_json(struct server *sv, struct MHD_Connection *c, enum endpoint ep, int status,
                                 json_t *body) {
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!s) return send_buf(sv, c, ep, 500, "text/plain", "out of memory\n", 14, 0);
    enum MHD_Result ret = send_buf(sv, c, ep, status, "application/json", s, strlen(s), 0);
    free(s);
    return ret;
}

static json_t *error_body(int status, const char *param, const char *msg) {
    const char *type = status == 400 || status == 404 || status == 405 || status == 413 ? "invalid_request_error"
                       : status == 503                                                ? "server_busy"
                                                                                      : "server_error";
    char *clean = NULL;   // messages quote client text, perhaps cut mid-character: make it valid UTF-8
    size_t len;
    if (utf8_sanitize(msg, strlen(msg), &clean, &len)) clean = NULL;
    json_t *o = json_pack("{s:{s:s, s:s, s:s?, s:i}}", "error", "message", clean ? clean : "invalid request", "type",
                          type, "param", param, "code", status);
    free(clean);
    return o;
}

static enum MHD_Result send_error(struct server *sv, struct MHD_Connection *c, enum endpoint ep, int status,
                                  const char *param, const char *msg, int retry_after) {
    json_t *b = error_body(status, param, msg);
    char *s = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    if (!s) return send_buf(sv, c, ep, status, "text/plain", msg, strlen(msg), retry_after);
    enum MHD_Result ret = send_buf(sv, c, ep, status, "application/json", s, strlen(s), retry_after);
    free(s);
    return ret;
}

// ---- request validation ------------------------------------------------------------------------

struct req_error {
    int status;
    const char *param;   // static string or NULL
    char msg[512];
};

// Bytes of s to quote in a message: at most max, never ending inside a UTF-8 sequence (the
// message goes into JSON, which must be valid UTF-8).
static int clip_utf8(const char *s, int max) {
    int n = (int)strnlen(s, (size_t)max + 1);
    if (n <= max) return n;
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80) n--;   // s[n] is the first byte left out
    return n;
}

static int bad(struct req_error *re, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(re->msg, sizeof re->msg, fmt, ap);
    va_end(ap);
    re->status = status;
    re->param = param;
    return -1;
}

// Sampling parameters: each has the value(s) that mean greedy; anything else is a 400 naming the
// parameter.  One table, checked in order (STYLE §14: reject, never clamp).
enum greedy_kind {
    GREEDY_NUM_EQ,      // a number in [lo, hi]; only `greedy` is accepted
    GREEDY_INT_LE,      // an integer >= lo; values <= `greedy` are accepted (top_k: -1, 0, 1)
    GREEDY_INT_EQ,      // an integer >= lo; only `greedy` is accepted (n, best_of)
    GREEDY_NULL,        // must be absent or null (seed)
    GREEDY_EMPTY_OBJ,   // absent, null or {} (logit_bias)
    GREEDY_OFF,         // absent, null, false or 0 (logprobs, top_logprobs)
};

static const struct greedy_rule {
    const char *name;
    enum greedy_kind kind;
    double greedy, lo, hi;
    const char *why;
} greedy_rules[] = {
    {"temperature", GREEDY_NUM_EQ, 0, 0, 2, "temperature must be 0 (greedy decoding only)"},
    {"top_p", GREEDY_NUM_EQ, 1, 0, 1, "top_p must be 1 (greedy decoding only)"},
    {"top_k", GREEDY_INT_LE, 1, -1, 0, "top_k must be 1, 0 or -1 (greedy decoding only)"},
    {"min_p", GREEDY_NUM_EQ, 0, 0, 1, "min_p must be 0 (greedy decoding only)"},
    {"typical_p", GREEDY_NUM_EQ, 1, 0, 1, "typical_p must be 1 (greedy decoding only)"},
    {"n", GREEDY_INT_EQ, 1, 1, 0, "n must be 1 (one choice per request)"},
    {"best_of", GREEDY_INT_EQ, 1, 1, 0, "best_of must be 1 (greedy decoding only)"},
    {"seed", GREEDY_NULL, 0, 0, 0, "seed is not supported: decoding is greedy and deterministic"},
    {"presence_penalty", GREEDY_NUM_EQ, 0, -2, 2, "presence_penalty must be 0 (greedy decoding only)"},
    {"frequency_penalty", GREEDY_NUM_EQ, 0, -2, 2, "frequency_penalty must be 0 (greedy decoding only)"},
    {"repetition_penalty", GREEDY_NUM_EQ, 1, 0, 10, "repetition_penalty must be 1 (greedy decoding only)"},
    {"logit_bias", GREEDY_EMPTY_OBJ, 0, 0, 0, "logit_bias is not supported (greedy decoding only)"},
    {"logprobs", GREEDY_OFF, 0, 0, 0, "logprobs are not supported"},
    {"top_logprobs", GREEDY_OFF, 0, 0, 0, "top_logprobs are not supported"},
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

static int check_greedy(const json_t *body, struct req_error *re) {
    for (size_t i = 0; i < sizeof greedy_rules / sizeof greedy_rules[0]; i++) {
        const struct greedy_rule *g = &greedy_rules[i];
        const json_t *v = json_object_get(body, g->name);
        if (!v || json_is_null(v)) continue;
        long long k;
        switch (g->kind) {
        case GREEDY_NUM_EQ: {
            if (!json_is_number(v)) return bad(re, 400, g->name, "%s must be a number", g->name);
            double d = json_number_value(v);
            if (!(d >= g->lo && d <= g->hi))
                return bad(re, 400, g->name, "%s must be between %g and %g, got %g", g->name, g->lo, g->hi, d);
            if (d != g->greedy) return bad(re, 400, g->name, "%s, got %g", g->why, d);
            break;
        }
        case GREEDY_INT_LE:
        case GREEDY_INT_EQ:
            if (!integral(v, &k)) return bad(re, 400, g->name, "%s must be an integer", g->name);
            if (k < (long long)g->lo) return bad(re, 400, g->name, "%s must be at least %g, got %lld", g->name, g->lo, k);
            if (g->kind == GREEDY_INT_LE ? k > (long long)g->greedy : k != (long long)g->greedy)
                return bad(re, 400, g->name, "%s, got %lld", g->why, k);
            break;
        case GREEDY_NULL:
            return bad(re, 400, g->name, "%s", g->why);
        case GREEDY_EMPTY_OBJ:
            if (!json_is_object(v)) return bad(re, 400, g->name, "%s must be an object", g->name);
            if (json_object_size(v)) return bad(re, 400, g->name, "%s", g->why);
            break;
        case GREEDY_OFF:
            if (json_is_false(v) || (integral(v, &k) && k == 0)) break;
            if (!json_is_boolean(v) && !json_is_integer(v))
                return bad(re, 400, g->name, "%s must be a boolean or an integer", g->name);
            return bad(re, 400, g->name, "%s", g->why);
        }
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
        return bad(re, 400, name, "%s must be %s", name, names[type]);
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

// Parameters common to both generation endpoints: greedy checks, max_tokens, stop, stream.
static int parse_common(struct server *sv, const json_t *body, struct job *j, long long *max_tokens,
                        struct req_error *re) {
    if (check_greedy(body, re)) return -1;
    const json_t *v;
    if (get_opt(body, "model", JSON_STRING, &v, re)) return -1;
    *max_tokens = 0;   // 0: not given
    static const char *const mt_names[] = {"max_tokens", "max_completion_tokens"};
    for (int i = 0; i < 2; i++) {
        const json_t *m = json_object_get(body, mt_names[i]);
        if (!m || json_is_null(m)) continue;
        long long k;
        if (!integral(m, &k)) return bad(re, 400, mt_names[i], "%s must be an integer", mt_names[i]);
        if (k < 1 || k > QWEN_MAX_CTX - 1)
            return bad(re, 400, mt_names[i], "%s must be between 1 and %d inclusive, got %lld", mt_names[i],
                       QWEN_MAX_CTX - 1, k);
        *max_tokens = k;   // max_completion_tokens (the newer name) wins when both are given
    }
    if (get_bool(body, "stream", false, &j->stream, re)) return -1;
    if (get_bool(body, "return_token_ids", false, &j->return_ids, re)) return -1;
    if (get_opt(body, "stream_options", JSON_OBJECT, &v, re)) return -1;
    if (v && get_bool(v, "include_usage", false, &j->include_usage, re)) return -1;
    const json_t *stop = json_object_get(body, "stop");
    if (stop && !json_is_null(stop)) {
        const json_t *one[1] = {stop};
        size_t n = 1;
        if (json_is_array(stop)) {
            n = json_array_size(stop);
            if (n > MAX_STOPS) return bad(re, 400, "stop", "stop may hold at most %d strings, got %zu", MAX_STOPS, n);
        } else if (!json_is_string(stop)) {
            return bad(re, 400, "stop", "stop must be a string or an array of strings");
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *s = json_is_array(stop) ? json_array_get(stop, i) : one[0];
            if (!json_is_string(s)) return bad(re, 400, "stop", "stop[%zu] must be a string", i);
            size_t len = json_string_length(s);
            if (len == 0) return bad(re, 400, "stop", "stop strings must not be empty");
            if (len > MAX_STOP_BYTES)
                return bad(re, 400, "stop", "stop strings are limited to %d bytes, got %zu", MAX_STOP_BYTES, len);
            if (!(j->stops[j->n_stops] = malloc(len + 1))) return bad(re, 500, NULL, "out of memory");
            memcpy(j->stops[j->n_stops], json_string_value(s), len + 1);
            j->stop_len[j->n_stops++] = len;
        }
    }
    if (get_bool(body, "echo", false, &(bool){0}, re)) return -1;
    if (json_is_true(json_object_get(body, "echo"))) return bad(re, 400, "echo", "echo is not supported");
    if (get_opt(body, "suffix", JSON_STRING, &v, re)) return -1;
    if (v && json_string_length(v)) return bad(re, 400, "suffix", "suffix (fill-in-the-middle) is not supported");
    if (get_opt(body, "tools", JSON_ARRAY, &v, re)) return -1;
    if (v && json_array_size(v)) return bad(re, 400, "tools", "tools are not supported by this server");
    if (get_opt(body, "response_format", JSON_OBJECT, &v, re)) return -1;
    if (v) {
        const json_t *t = json_object_get(v, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text"))
            return bad(re, 400, "response_format", "only response_format {\"type\": \"text\"} is supported");
    }
    (void)sv;
    return 0;
}

// Text of a message's content: a string, null, or an array of {"type": "text", "text": ...}.
static int message_text(const json_t *content, size_t idx, struct sbuf *out, struct req_error *re) {
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) {
        if (sbuf_add(out, json_string_value(content), json_string_length(content))) return bad(re, 500, NULL, "out of memory");
        return 0;
    }
    if (!json_is_array(content))
        return bad(re, 400, "messages", "messages[%zu].content must be a string or an array of text parts", idx);
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return bad(re, 400, "messages", "messages[%zu].content[%zu] must be an object with a \"type\"", idx, i);
        if (strcmp(json_string_value(type), "text"))
            return bad(re, 400, "messages", "messages[%zu].content[%zu]: type \"%.*s\" is not supported (text only)",
                       idx, i, clip_utf8(json_string_value(type), 64), json_string_value(type));
        if (!json_is_string(text))
            return bad(re, 400, "messages", "messages[%zu].content[%zu].text must be a string", idx, i);
        if (sbuf_add(out, json_string_value(text), json_string_length(text))) return bad(re, 500, NULL, "out of memory");
    }
    return 0;
}

static int encode(struct server *sv, const char *text, size_t len, int32_t **ids, int *n, struct req_error *re) {
    size_t nn = 0;
    char err[256];
    if (tokenizer_encode(sv->tok, text, len, ids, &nn, err, sizeof err)) return bad(re, 400, NULL, "cannot tokenize: %s", err);
    *n = (int)nn;
    return 0;
}

// /v1/chat/completions: messages -> the rendered prompt, its tokens and the last-message boundary.
static int parse_chat(struct server *sv, const json_t *body, struct job *j, struct req_error *re) {
    const json_t *msgs = json_object_get(body, "messages");
    if (!msgs || json_is_null(msgs)) return bad(re, 400, "messages", "messages is required");
    if (!json_is_array(msgs)) return bad(re, 400, "messages", "messages must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return bad(re, 400, "messages", "messages must not be empty");
    struct chat_options co = CHAT_OPTIONS_DEFAULT;
    const json_t *kw;
    if (get_opt(body, "chat_template_kwargs", JSON_OBJECT, &kw, re)) return -1;
    bool think = true, preserve = false;
    if (kw && (get_bool(kw, "enable_thinking", true, &think, re) || get_bool(kw, "preserve_thinking", false, &preserve, re)))
        return -1;
    co.enable_thinking = think;
    co.preserve_thinking = preserve;
    j->reasoning = think;

    struct chat_message *cm = calloc(n, sizeof *cm);
    struct sbuf *texts = calloc(2 * n, sizeof *texts);   // content, reasoning per message
    char *out = NULL, *hist = NULL;
    int rc = -1;
    if (!cm || !texts) {
        bad(re, 500, NULL, "out of memory");
        goto done;
    }
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m)) {
            bad(re, 400, "messages", "messages[%zu] must be an object", i);
            goto done;
        }
        const json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) {
            bad(re, 400, "messages", "messages[%zu].role must be a string", i);
            goto done;
        }
        const char *r = NULL;
        for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++)
            if (!strcmp(json_string_value(role), roles[k])) r = roles[k];
        if (!r) {
            const char *rs = json_string_value(role);
            bad(re, 400, "messages", "messages[%zu].role \"%.*s\" is unknown (system, user, assistant or tool)", i,
                clip_utf8(rs, 64), rs);
            goto done;
        }
        if (!strcmp(r, "developer")) r = "system";
        const json_t *content = json_object_get(m, "content");
        if ((!content || json_is_null(content)) && strcmp(r, "assistant")) {
            bad(re, 400, "messages", "messages[%zu].content is required for role \"%s\"", i, r);
            goto done;
        }
        if (message_text(content, i, &texts[2 * i], re)) goto done;
        const json_t *rc_ = json_object_get(m, "reasoning_content");
        if (rc_ && !json_is_null(rc_)) {
            if (!json_is_string(rc_)) {
                bad(re, 400, "messages", "messages[%zu].reasoning_content must be a string", i);
                goto done;
            }
            if (sbuf_add(&texts[2 * i + 1], json_string_value(rc_), json_string_length(rc_))) {
                bad(re, 500, NULL, "out of memory");
                goto done;
            }
        }
        cm[i].role = r;
        cm[i].content = texts[2 * i].p ? texts[2 * i].p : "";
        cm[i].reasoning = texts[2 * i + 1].p;
    }
    size_t len = 0, boundary = 0, hist_len = 0;
    char err[256];
    if (chat_render(cm, n, &co, &out, &len, &boundary, err, sizeof err)) {
        bad(re, 400, "messages", "%s", err);
        goto done;
    }
    // The snapshot point: the end of the last message (the history rendered without the
    // generation prompt), when that is a byte prefix of the prompt; else chat_render's boundary.
    struct chat_options ho = co;
    ho.add_generation_prompt = 0;
    if (!chat_render(cm, n, &ho, &hist, &hist_len, NULL, err, sizeof err) && hist_len < len &&
        !memcmp(hist, out, hist_len))
        boundary = hist_len;
    // The boundary in tokens.  When the text after it opens with an added token (ChatML's
    // <|im_start|>), the tokenizer cuts there anyway, so the two halves tokenize independently
    // and their concatenation is the whole.  Otherwise: tokenize the whole and the prefix, and
    // keep the boundary only if the prefix's tokens are a prefix of the whole's.
    j->boundary = 0;
    static const char im_start[] = "<|im_start|>";
    int32_t *pre = NULL, *post = NULL;
    int npre = 0, npost = 0;
    if (boundary > 0 && boundary < len && !strncmp(out + boundary, im_start, sizeof im_start - 1)) {
        if (encode(sv, out, boundary, &pre, &npre, re) || encode(sv, out + boundary, len - boundary, &post, &npost, re)) {
            free(pre);
            goto done;
        }
        if (!(j->prompt = malloc(sizeof *pre * ((size_t)npre + (size_t)npost)))) {
            free(pre), free(post);
            bad(re, 500, NULL, "out of memory");
            goto done;
        }
        memcpy(j->prompt, pre, sizeof *pre * (size_t)npre);
        memcpy(j->prompt + npre, post, sizeof *post * (size_t)npost);
        j->n_prompt = npre + npost;
        j->boundary = npre;
        free(pre), free(post);
    } else {
        if (encode(sv, out, len, &j->prompt, &j->n_prompt, re)) goto done;
        if (boundary > 0 && boundary < len && !encode(sv, out, boundary, &pre, &npre, re)) {
            if (npre > 0 && npre < j->n_prompt && !memcmp(pre, j->prompt, sizeof *pre * (size_t)npre)) j->boundary = npre;
            free(pre);
        }
    }
    rc = 0;
done:
    if (texts)
        for (size_t i = 0; i < 2 * n; i++) sbuf_free(&texts[i]);
    free(texts);
    free(cm);
    free(out);
    free(hist);
    return rc;
}

// /v1/completions: prompt as text (no template) or as token ids.
static int parse_completion(struct server *sv, const json_t *body, struct job *j, struct req_error *re) {
    const json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p)) return bad(re, 400, "prompt", "prompt is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return bad(re, 400, "prompt", "prompt must not be empty");
        return encode(sv, json_string_value(p), json_string_length(p), &j->prompt, &j->n_prompt, re);
    }
    if (!json_is_array(p)) return bad(re, 400, "prompt", "prompt must be a string or an array of token ids");
    size_t n = json_array_size(p);
    if (n == 0) return bad(re, 400, "prompt", "prompt must not be empty");
    if (n > (size_t)sv->cfg.context)
        return bad(re, 400, "prompt", "prompt (%zu tokens) exceeds the context of %lld tokens", n, sv->cfg.context);
    if (!(j->prompt = malloc(sizeof *j->prompt * n))) return bad(re, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(p, i);
        long long id;
        if (!json_is_integer(t)) {
            if (json_is_string(t) || json_is_array(t))
                return bad(re, 400, "prompt", "batched prompts are not supported (batch 1): give one string or one array of token ids");
            return bad(re, 400, "prompt", "prompt[%zu] must be an integer token id", i);
        }
        id = json_integer_value(t);
        if (id < 0 || id >= sv->vocab)
            return bad(re, 400, "prompt", "prompt[%zu] = %lld is outside the vocabulary (0 to %d)", i, id, sv->vocab - 1);
        j->prompt[i] = (int32_t)id;
    }
    j->n_prompt = (int)n;
    return 0;
}

// The whole request -> a job ready to queue, or a 4xx.
static struct job *parse_request(struct server *sv, enum endpoint ep, const char *data, size_t len,
                                 struct req_error *re) {
    json_error_t je;
    json_t *body = json_loadb(data, len, 0, &je);
    if (!body) {
        bad(re, 400, NULL, "malformed JSON at line %d, column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    struct job *j = NULL;
    if (!json_is_object(body)) {
        bad(re, 400, NULL, "the request body must be a JSON object");
        goto fail;
    }
    if (!(j = job_new())) {
        bad(re, 500, NULL, "out of memory");
        goto fail;
    }
    j->chat = ep == EP_CHAT;
    long long max_tokens;
    if (parse_common(sv, body, j, &max_tokens, re)) goto fail;
    if (j->chat ? parse_chat(sv, body, j, re) : parse_completion(sv, body, j, re)) goto fail;
    if (j->n_prompt < 1) {
        bad(re, 400, j->chat ? "messages" : "prompt", "the prompt is empty");
        goto fail;
    }
    const long long ctx = sv->cfg.context;
    if (!max_tokens) {   // the server default, within what the context has left
        max_tokens = ctx - j->n_prompt - 1;
        if (max_tokens > sv->cfg.default_max_tokens) max_tokens = sv->cfg.default_max_tokens;
        if (max_tokens < 1) {
            bad(re, 400, j->chat ? "messages" : "prompt",
                "the prompt (%d tokens) + 1 generated token + 1 exceeds the context of %lld tokens", j->n_prompt, ctx);
            goto fail;
        }
    }
    if (j->n_prompt + max_tokens + 1 > ctx) {
        bad(re, 400, "max_tokens", "prompt (%d tokens) + max_tokens (%lld) + 1 = %lld exceeds the context of %lld tokens",
            j->n_prompt, max_tokens, j->n_prompt + max_tokens + 1, ctx);
        goto fail;
    }
    j->max_tokens = (int)max_tokens;
    json_decref(body);
    return j;
fail:
    job_unref(j);
    json_decref(body);
    return NULL;
}

// ---- output: channels, stop strings, server-sent events ----------------------------------------

// Generated text goes to one channel at a time: reasoning_content (before </think>) or content.
// A channel holds back text that could still become a stop string (and, for reasoning, trailing
// newlines), so what is streamed is exactly what the non-streaming answer holds.
struct channel {
    struct sbuf pend;       // decoded, not yet emitted
    struct sbuf *total;     // everything emitted
    const char *field;      // "content", "reasoning_content" or "text"
    bool strip_lead_nl;     // drop newlines before the first other character
    bool trim_trail_nl;     // drop newlines at the end of the channel
    bool started;
};

static void job_sse(struct job *j, const char *data, size_t len) {
    pthread_mutex_lock(&j->mu);
    if (sbuf_add(&j->sse, "data: ", 6) || sbuf_add(&j->sse, data, len) || sbuf_add(&j->sse, "\n\n", 2))
        j->cancel = true;   // out of memory: end this request
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void job_sse_json(struct job *j, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s) job_sse(j, s, strlen(s));
    free(s);
}

// One streamed chunk: delta text on a field, or (field NULL) the role / the finish.
static json_t *chunk_new(struct job *j) {
    return json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", j->id, "object",
                     j->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)j->created, "model",
                     j->model_name, "choices");
}

static void stream_delta(struct job *j, const char *field, const char *text, size_t len, const char *finish) {
    json_t *o = chunk_new(j);
    json_t *choice = json_pack("{s:i, s:o}", "index", 0, "finish_reason", finish ? json_string(finish) : json_null());
    if (j->chat) {
        json_t *delta = json_object();
        if (field) json_object_set_new(delta, field, json_stringn(text, len));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", json_stringn(field ? text : "", field ? len : 0));
        json_object_set_new(choice, "logprobs", json_null());
    }
    json_array_append_new(json_object_get(o, "choices"), choice);
    job_sse_json(j, o);
}

static void emit(struct job *j, struct channel *ch, const char *s, size_t n) {
    if (!n) return;
    sbuf_add(ch->total, s, n);
    if (j->stream) stream_delta(j, ch->field, s, n, NULL);
}

// Longest proper prefix of any stop string that ends the buffer.
static size_t stop_holdback(const struct job *j, const char *p, size_t n) {
    size_t hold = 0;
    for (int i = 0; i < j->n_stops; i++)
        for (size_t k = j->stop_len[i] - 1; k > hold; k--)
            if (k <= n && !memcmp(p + n - k, j->stops[i], k)) {
                hold = k;
                break;
            }
    return hold;
}

// Adds text to a channel; emits what can no longer change.  final: the channel ends here.
// Returns true when a stop string was found (the text is cut before it; generation ends).
static bool channel_push(struct job *j, struct channel *ch, const char *text, size_t len, bool final) {
    if (ch->strip_lead_nl && !ch->started)
        while (len && *text == '\n') text++, len--;
    if (len) ch->started = true;
    sbuf_add(&ch->pend, text, len);
    char *p = ch->pend.p;
    size_t n = ch->pend.len, cut = SIZE_MAX;
    for (int i = 0; i < j->n_stops && n; i++) {
        const char *m = memmem(p, n, j->stops[i], j->stop_len[i]);
        if (m && (size_t)(m - p) < cut) cut = (size_t)(m - p);
    }
    bool stopped = cut != SIZE_MAX;
    if (stopped) n = cut, final = true;
    size_t out = final ? n : n - stop_holdback(j, p, n);
    if (ch->trim_trail_nl)
        while (out && p[out - 1] == '\n') out--;
    emit(j, ch, p, out);
    if (final) ch->pend.len = 0;
    else {
        memmove(p, p + out, ch->pend.len - out);
        ch->pend.len -= out;
    }
    return stopped;
}

// ---- the worker --------------------------------------------------------------------------------

static json_t *usage_json(const struct job *j) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", j->n_prompt, "completion_tokens", j->n_gen,
                     "total_tokens", j->n_prompt + j->n_gen, "prompt_tokens_details", "cached_tokens", j->n_cached);
}

static json_t *ids_json(const struct job *j) {
    json_t *a = json_array();
    for (int i = 0; i < j->n_gen; i++) json_array_append_new(a, json_integer(j->gen[i]));
    return a;
}

static json_t *timings_json(const struct job *j) {
    return json_pack("{s:f, s:f, s:f, s:i, s:i}", "queue_ms", j->queue_ms, "prefill_ms", j->prefill_ms, "decode_ms",
                     j->decode_ms, "prompt_tokens_processed", j->n_prompt - j->n_cached, "generated_tokens", j->n_gen);
}


static bool job_cancelled(void *arg) {
    struct job *j = arg;
    if (atomic_load(j->abort)) return true;
    pthread_mutex_lock(&j->mu);
    if (!j->cancel && j->fd >= 0) {
        struct pollfd pf = {.fd = j->fd, .events = POLLRDHUP};
        if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) j->cancel = true;
    }
    bool c = j->cancel;
    pthread_mutex_unlock(&j->mu);
    return c;
}

static void job_fail(struct job *j, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->errmsg, sizeof j->errmsg, fmt, ap);
    va_end(ap);
    j->status = status;
    j->finish = NULL;
}

// Forward tokens into the working sequence; ENGINE_OK, ENGINE_CANCELLED or ENGINE_ERROR (job failed).
static int forward(struct server *sv, struct job *j, const int32_t *t, int n, int32_t *next) {
    if (job_cancelled(j)) return ENGINE_CANCELLED;
    char err[256];
    struct forward_opts fo = {.cancelled = job_cancelled, .cancel_arg = j};
    int rc = engine_forward(sv->e, sv->w, t, n, &fo, next, err, sizeof err);
    if (rc == ENGINE_ERROR) job_fail(j, 500, "engine: %s", err);
    return rc;
}

// The end of a stream: the finish chunk with usage, or an error event; then [DONE].
static void stream_end(struct job *j) {
    if (j->finish) {
        json_t *o = chunk_new(j);
        json_t *choice = json_pack("{s:i, s:s}", "index", 0, "finish_reason", j->finish);
        if (j->chat) json_object_set_new(choice, "delta", json_object());
        else json_object_set_new(choice, "text", json_string("")), json_object_set_new(choice, "logprobs", json_null());
        if (j->return_ids) json_object_set_new(choice, "token_ids", ids_json(j));
        json_array_append_new(json_object_get(o, "choices"), choice);
        json_object_set_new(o, "usage", usage_json(j));
        json_object_set_new(o, "timings", timings_json(j));
        job_sse_json(j, o);
        if (j->include_usage) {
            o = chunk_new(j);
            json_object_set_new(o, "usage", usage_json(j));
            job_sse_json(j, o);
        }
    } else {
        json_t *e = error_body(j->status, NULL, j->errmsg);
        job_sse_json(j, e);
    }
    job_sse(j, "[DONE]", 6);
}

static void run_job(struct server *sv, struct job *j) {
    const double t0 = now_s();
    j->queue_ms = 1e3 * (t0 - j->t_queued);
    const int32_t *P = j->prompt;
    const int n = j->n_prompt;
    char err[256];
    int32_t tok = -1;
    int rc = ENGINE_OK;
    bool have_tok = false;

    // Session cache: the longest entry whose tokens are a prefix of the prompt.
    struct cache_entry *full = scache_lookup(&sv->full, P, n), *bnd = scache_lookup(&sv->bound, P, n);
    struct cache_entry *hit = full && (!bnd || full->n >= bnd->n) ? full : bnd;
    int pos = 0;
    if (hit && seq_copy(sv->w, hit->s, err, sizeof err)) hit = NULL;
    if (hit) {
        pos = hit->n;
        if (pos == n) tok = hit->next, have_tok = true;
    } else {
        seq_reset(sv->w);
    }
    j->n_cached = pos;
    pthread_mutex_lock(&sv->mu);
    if (sv->full.n + sv->bound.n > 0) {
        if (hit) sv->m.cache_hits++;
        else sv->m.cache_misses++;
    }
    sv->m.cached_tokens += (unsigned long long)pos;
    sv->m.prompt_tokens += (unsigned long long)n;
    pthread_mutex_unlock(&sv->mu);

    // Prefill to the last message boundary, snapshot there, then the rest of the prompt.
    if (j->boundary > pos && j->boundary < n && sv->bound.n > 0) {
        int32_t bnext;
        rc = forward(sv, j, P + pos, j->boundary - pos, &bnext);
        if (rc == ENGINE_OK) {
            pos = j->boundary;
            if (scache_store_copy(&sv->bound, sv->w, P, pos, bnext, err, sizeof err))
                fprintf(stderr, "calla serve: session cache: %s\n", err);
        }
    }
    if (rc == ENGINE_OK && !have_tok) rc = forward(sv, j, P + pos, n - pos, &tok);
    const double t1 = now_s();
    j->prefill_ms = 1e3 * (t1 - t0);

    // Decode.
    struct channel content = {.total = &j->content, .field = j->chat ? "content" : "text"};
    struct channel reasoning = {.total = &j->reasoning_text, .field = "reasoning_content", .strip_lead_nl = true,
                                .trim_trail_nl = true};
    struct channel *ch = j->reasoning ? &reasoning : &content;
    struct tokenizer_stream ts;
    tokenizer_stream_init(&ts, sv->tok, 1);
    int32_t *gen = j->gen = malloc(sizeof *gen * (size_t)(j->max_tokens + 1));
    if (!gen && rc == ENGINE_OK) job_fail(j, 500, "out of memory"), rc = ENGINE_ERROR;
    int ng = 0;
    bool eos = false, stop_str = false;
    if (rc == ENGINE_OK && j->stream) {   // the first chunk goes out with the first token (TTFT)
        if (j->chat) {
            json_t *o = chunk_new(j);
            json_array_append_new(json_object_get(o, "choices"),
                                  json_pack("{s:i, s:{s:s, s:s}, s:n}", "index", 0, "delta", "role", "assistant",
                                            "content", "", "finish_reason"));
            job_sse_json(j, o);
        } else {
            stream_delta(j, "text", "", 0, NULL);
        }
    }
    while (rc == ENGINE_OK) {
        gen[ng++] = tok;
        if (chat_is_stop(tok)) {
            eos = true;
            break;
        }
        const char *text = "";
        size_t len = 0;
        if (ch == &reasoning && tok == TOKEN_THINK_END) {   // reasoning ends; the answer follows
            tokenizer_stream_flush(&ts, &text, &len);
            stop_str = channel_push(j, ch, text, len, true);
            ch = &content;
            content.strip_lead_nl = true;
        } else if (tokenizer_token_bytes(sv->tok, tok, &len) &&   // ids the tokenizer lacks decode to nothing
                   !tokenizer_stream_push(&ts, tok, &text, &len, err, sizeof err)) {
            stop_str = channel_push(j, ch, text, len, false);
        }
        if (stop_str || ng == j->max_tokens) break;
        rc = forward(sv, j, &tok, 1, &tok);
    }
    if (rc == ENGINE_OK) {
        if (!stop_str) {   // flush what the decoder and the channel still hold
            const char *tail;
            size_t tl;
            tokenizer_stream_flush(&ts, &tail, &tl);
            stop_str = channel_push(j, ch, tail, tl, true);
        }
        j->finish = eos || stop_str ? "stop" : "length";
    }
    tokenizer_stream_free(&ts);
    sbuf_free(&content.pend);
    sbuf_free(&reasoning.pend);
    const double t2 = now_s();
    j->decode_ms = 1e3 * (t2 - t1);
    j->n_gen = ng;

    // Keep the end state: it has consumed the prompt and every generated token but the last.
    // A state under half the context is copied into a slot of its own size (memory follows use);
    // a larger one moves into the cache and the slot's old sequence becomes the working one.
    if (rc == ENGINE_OK && ng >= 1) {
        int m = n + ng - 1;
        int32_t *all = malloc(sizeof *all * (size_t)m);
        if (all) {
            memcpy(all, P, sizeof *P * (size_t)n);
            memcpy(all + n, gen, sizeof *gen * (size_t)(ng - 1));
            int r = 0;
            if (seq_pos(sv->w) == m)
                r = 2LL * m < sv->cfg.context ? scache_store_copy(&sv->full, sv->w, all, m, gen[ng - 1], err, sizeof err)
                                              : scache_store_swap(&sv->full, &sv->w, all, m, gen[ng - 1], err, sizeof err);
            if (r) fprintf(stderr, "calla serve: session cache: %s\n", err);
            free(all);
        }
    }
    if (rc == ENGINE_CANCELLED) job_fail(j, atomic_load(&sv->abort) ? 503 : 499, "cancelled");

    pthread_mutex_lock(&sv->mu);
    sv->m.generated_tokens += (unsigned long long)ng;
    sv->m.prefill_s += t1 - t0;
    sv->m.decode_s += t2 - t1;
    if (rc == ENGINE_CANCELLED) sv->m.cancelled++;
    pthread_mutex_unlock(&sv->mu);

    if (j->stream) stream_end(j);
    if (!sv->cfg.quiet)
        fprintf(stderr, "calla serve: %s %s: prompt %d (cached %d), generated %d, prefill %.1f ms, decode %.1f ms, %s\n",
                j->id, j->chat ? "chat" : "completion", n, j->n_cached, ng, j->prefill_ms, j->decode_ms,
                j->finish ? j->finish : j->errmsg);
}

static void *worker_main(void *arg) {
    struct server *sv = arg;
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        while (!sv->head && !sv->stop_worker) pthread_cond_wait(&sv->cv, &sv->mu);
        struct job *j = sv->head;
        if (!j) {
            pthread_mutex_unlock(&sv->mu);
            break;
        }
        sv->head = j->next;
        if (!sv->head) sv->tail = NULL;
        sv->depth--;
        sv->running = j;
        pthread_mutex_unlock(&sv->mu);

        pthread_mutex_lock(&j->mu);
        j->state = JOB_RUNNING;
        pthread_mutex_unlock(&j->mu);
        if (atomic_load(&sv->abort)) {
            job_fail(j, 503, "the server is shutting down");
            if (j->stream) stream_end(j);
        } else {
            run_job(sv, j);
        }

        pthread_mutex_lock(&sv->mu);
        sv->running = NULL;
        pthread_cond_broadcast(&sv->cv);
        pthread_mutex_unlock(&sv->mu);
        pthread_mutex_lock(&j->mu);
        j->state = JOB_DONE;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        job_unref(j);
    }
    return NULL;
}

// ---- HTTP: routes ------------------------------------------------------------------------------

// Per-request state, MHD's *con_cls.
struct request {
    enum endpoint ep;
    bool post;
    struct sbuf body;
    bool too_large;
    struct job *job;    // once queued
};

static enum endpoint route(const char *url) {
    if (!strcmp(url, "/v1/chat/completions")) return EP_CHAT;
    if (!strcmp(url, "/v1/completions")) return EP_COMPLETIONS;
    if (!strcmp(url, "/v1/models")) return EP_MODELS;
    if (!strcmp(url, "/health")) return EP_HEALTH;
    if (!strcmp(url, "/metrics")) return EP_METRICS;
    return EP_OTHER;
}

static enum MHD_Result send_metrics(struct server *sv, struct MHD_Connection *c) {
    struct sbuf b = {0};
    char line[256];
#define OUT(...) (snprintf(line, sizeof line, __VA_ARGS__), sbuf_add(&b, line, strlen(line)))
    pthread_mutex_lock(&sv->mu);
    struct metrics m = sv->m;
    int depth = sv->depth, running = sv->running != NULL;
    pthread_mutex_unlock(&sv->mu);
    OUT("# HELP calla_requests_total HTTP requests by endpoint and status.\n# TYPE calla_requests_total counter\n");
    for (int e = 0; e < EP_COUNT; e++)
        for (int k = 0; k <= N_STATUS; k++)
            if (m.requests[e][k] || e == EP_CHAT || e == EP_COMPLETIONS) {
                if (k == N_STATUS && !m.requests[e][k]) continue;
                if (k == N_STATUS) OUT("calla_requests_total{endpoint=\"%s\",status=\"other\"} %llu\n", endpoint_names[e], m.requests[e][k]);
                else if (m.requests[e][k] || status_codes[k] == 200)
                    OUT("calla_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", endpoint_names[e], status_codes[k],
                        m.requests[e][k]);
            }
    OUT("# HELP calla_prompt_tokens_total Prompt tokens of generation requests (cached included).\n# TYPE calla_prompt_tokens_total counter\ncalla_prompt_tokens_total %llu\n", m.prompt_tokens);
    OUT("# HELP calla_generated_tokens_total Generated tokens.\n# TYPE calla_generated_tokens_total counter\ncalla_generated_tokens_total %llu\n", m.generated_tokens);
    OUT("# HELP calla_prefill_seconds_total Time in prefill (to the first token).\n# TYPE calla_prefill_seconds_total counter\ncalla_prefill_seconds_total %.6f\n", m.prefill_s);
    OUT("# HELP calla_decode_seconds_total Time in decode (after the first token).\n# TYPE calla_decode_seconds_total counter\ncalla_decode_seconds_total %.6f\n", m.decode_s);
    OUT("# HELP calla_cache_hits_total Requests that continued from a session-cache entry.\n# TYPE calla_cache_hits_total counter\ncalla_cache_hits_total %llu\n", m.cache_hits);
    OUT("# HELP calla_cache_misses_total Requests that found no session-cache entry.\n# TYPE calla_cache_misses_total counter\ncalla_cache_misses_total %llu\n", m.cache_misses);
    OUT("# HELP calla_cached_tokens_total Prompt tokens taken from the session cache.\n# TYPE calla_cached_tokens_total counter\ncalla_cached_tokens_total %llu\n", m.cached_tokens);
    OUT("# HELP calla_cancelled_total Generations stopped because the client went away (or on shutdown).\n# TYPE calla_cancelled_total counter\ncalla_cancelled_total %llu\n", m.cancelled);
    OUT("# HELP calla_queue_depth Requests waiting for the engine.\n# TYPE calla_queue_depth gauge\ncalla_queue_depth %d\n", depth);
    OUT("# HELP calla_requests_running Requests being generated (0 or 1).\n# TYPE calla_requests_running gauge\ncalla_requests_running %d\n", running);
#undef OUT
    enum MHD_Result r = b.p ? send_buf(sv, c, EP_METRICS, 200, "text/plain; version=0.0.4", b.p, b.len, 0)
                            : send_error(sv, c, EP_METRICS, 500, NULL, "out of memory", 0);
    sbuf_free(&b);
    return r;
}

// Content reader of a streamed response: blocks until the worker has produced more.
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct job *j = cls;
    pthread_mutex_lock(&j->mu);
    while (j->sse_off == j->sse.len && j->state != JOB_DONE) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    ssize_t n = MHD_CONTENT_READER_END_OF_STREAM;
    if (j->sse_off < j->sse.len) {
        size_t k = j->sse.len - j->sse_off < max ? j->sse.len - j->sse_off : max;
        memcpy(buf, j->sse.p + j->sse_off, k);
        j->sse_off += k;
        n = (ssize_t)k;
        if (j->sse_off == j->sse.len) j->sse_off = j->sse.len = 0;   // all sent: reuse the buffer
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

static void sse_free(void *cls) {
    struct job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (j->state != JOB_DONE) j->cancel = true;   // the response is gone before the job ended
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
}

static json_t *completion_json(const struct job *j) {
    json_t *choice;
    if (j->chat) {
        json_t *msg = json_pack("{s:s, s:s%}", "role", "assistant", "content", j->content.p ? j->content.p : "",
                                j->content.len);
        if (j->reasoning)
            json_object_set_new(msg, "reasoning_content",
                                json_stringn(j->reasoning_text.p ? j->reasoning_text.p : "", j->reasoning_text.len));
        choice = json_pack("{s:i, s:o, s:s, s:n}", "index", 0, "message", msg, "finish_reason", j->finish, "logprobs");
    } else {
        choice = json_pack("{s:i, s:s%, s:s, s:n}", "index", 0, "text", j->content.p ? j->content.p : "", j->content.len,
                           "finish_reason", j->finish, "logprobs");
    }
    if (j->return_ids) json_object_set_new(choice, "token_ids", ids_json(j));
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o, s:o}", "id", j->id, "object",
                     j->chat ? "chat.completion" : "text_completion", "created", (json_int_t)j->created, "model",
                     j->model_name, "choices", choice, "usage", usage_json(j), "timings", timings_json(j));
}

// Queues a parsed job; 0, or -1 with a 503 (queue full, shutting down).
static int enqueue(struct server *sv, struct job *j, struct MHD_Connection *c, struct req_error *re) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->abort = &sv->abort;
    j->model_name = sv->cfg.model_name;
    j->created = (long long)time(NULL);
    j->t_queued = now_s();
    pthread_mutex_lock(&sv->mu);
    if (sv->draining) {
        pthread_mutex_unlock(&sv->mu);
        return bad(re, 503, NULL, "the server is shutting down");
    }
    if (sv->depth >= sv->cfg.queue) {
        int d = sv->depth;
        pthread_mutex_unlock(&sv->mu);
        return bad(re, 503, NULL, "the server is busy: %d requests are waiting (queue limit %lld); retry later", d,
                   sv->cfg.queue);
    }
    snprintf(j->id, sizeof j->id, "%s-%llu", j->chat ? "chatcmpl" : "cmpl", ++sv->next_id);
    job_ref(j);   // the worker's reference
    j->next = NULL;
    if (sv->tail) sv->tail->next = j;
    else sv->head = j;
    sv->tail = j;
    sv->depth++;
    pthread_cond_broadcast(&sv->cv);
    pthread_mutex_unlock(&sv->mu);
    return 0;
}

static enum MHD_Result handle_generate(struct server *sv, struct MHD_Connection *c, struct request *rq) {
    struct req_error re = {0};
    struct job *j = parse_request(sv, rq->ep, rq->body.p ? rq->body.p : "", rq->body.len, &re);
    sbuf_free(&rq->body);
    if (!j || enqueue(sv, j, c, &re)) {
        job_unref(j);
        return send_error(sv, c, rq->ep, re.status, re.param, re.msg, re.status == 503 ? RETRY_AFTER_S : 0);
    }
    rq->job = j;   // the request's reference; dropped when MHD completes the request
    pthread_mutex_lock(&sv->mu);
    sv->open_jobs++;
    pthread_mutex_unlock(&sv->mu);
    if (j->stream) {
        job_ref(j);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_read, j, sse_free);
        if (!r) {
            job_unref(j);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        count_request(sv, rq->ep, 200);
        return ret;
    }
    pthread_mutex_lock(&j->mu);
    while (j->state != JOB_DONE) pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    if (!j->finish) return send_error(sv, c, rq->ep, j->status, NULL, j->errmsg, j->status == 503 ? RETRY_AFTER_S : 0);
    json_t *o = completion_json(j);
    if (!o) return send_error(sv, c, rq->ep, 500, NULL, "out of memory", 0);
    return send_json(sv, c, rq->ep, 200, o);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    struct server *sv = cls;
    struct request *rq = *con_cls;
    if (!rq) {   // headers are in: route, check the method and the declared size
        if (!(rq = calloc(1, sizeof *rq))) return MHD_NO;
        *con_cls = rq;
        rq->ep = route(url);
        rq->post = !strcmp(method, MHD_HTTP_METHOD_POST);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > (unsigned long long)sv->cfg.max_body) rq->too_large = true;
        return MHD_YES;
    }
    if (*upload_data_size) {   // a piece of the body
        if (!rq->too_large && rq->body.len + *upload_data_size > (size_t)sv->cfg.max_body) {
            rq->too_large = true;
            sbuf_free(&rq->body);
        }
        if (!rq->too_large && sbuf_add(&rq->body, upload_data, *upload_data_size)) rq->too_large = true;
        *upload_data_size = 0;
        return MHD_YES;
    }
    const bool gen = rq->ep == EP_CHAT || rq->ep == EP_COMPLETIONS;
    if (rq->ep == EP_OTHER) return send_error(sv, c, rq->ep, 404, NULL, "no such endpoint", 0);
    if (gen != rq->post || (!gen && strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))) {
        char msg[96];
        snprintf(msg, sizeof msg, "method %.16s is not allowed here (use %s)", method, gen ? "POST" : "GET");
        return send_error(sv, c, rq->ep, 405, NULL, msg, 0);
    }
    if (rq->too_large) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body exceeds the limit of %lld bytes", sv->cfg.max_body);
        return send_error(sv, c, rq->ep, 413, NULL, msg, 0);
    }
    switch (rq->ep) {
    case EP_HEALTH: {
        pthread_mutex_lock(&sv->mu);
        bool draining = sv->draining;
        int depth = sv->depth, running = sv->running != NULL;
        pthread_mutex_unlock(&sv->mu);
        return send_json(sv, c, EP_HEALTH, draining ? 503 : 200,
                         json_pack("{s:s, s:i, s:i}", "status", draining ? "draining" : "ok", "queue_depth", depth,
                                   "running", running));
    }
    case EP_MODELS:
        return send_json(sv, c, EP_MODELS, 200,
                         json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I}]}", "object", "list", "data", "id",
                                   sv->cfg.model_name, "object", "model", "created", (json_int_t)0, "owned_by", "calla",
                                   "max_model_len", (json_int_t)sv->cfg.context));
    case EP_METRICS:
        return send_metrics(sv, c);
    default:
        return handle_generate(sv, c, rq);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct server *sv = cls;
    struct request *rq = *con_cls;
    if (!rq) return;
    if (rq->job) {
        pthread_mutex_lock(&sv->mu);
        sv->open_jobs--;
        pthread_mutex_unlock(&sv->mu);
        pthread_mutex_lock(&rq->job->mu);
        rq->job->fd = -1;   // MHD closes or reuses the socket after this
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && rq->job->state != JOB_DONE) rq->job->cancel = true;
        pthread_mutex_unlock(&rq->job->mu);
        job_unref(rq->job);
    }
    sbuf_free(&rq->body);
    free(rq);
    *con_cls = NULL;
}

// ---- `calla serve` -----------------------------------------------------------------------------

static int resolve(const char *host, int port, struct sockaddr_storage *ss, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc) {
        snprintf(err, errlen, "--host %s: %s", host, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    return 0;
}

int cmd_serve(int argc, char **argv) {
    struct server_config cfg = {
        .host = "127.0.0.1", .port = 8080, .context = QWEN_MAX_CTX, .queue = 16, .max_body = 8 << 20,
        .max_header = 32 << 10, .max_connections = 64, .cache_entries = 2, .cache_boundaries = 2,
        .default_max_tokens = 4096, .drain_seconds = 30, .timeout = 120,
    };
    const struct opt opts[] = {
        {"model", OPT_STR, &cfg.model_dir, 0, 0, "checkpoint directory (with tokenizer.json)"},
        {"host", OPT_STR, &cfg.host, 0, 0, "address to listen on (default 127.0.0.1)"},
        {"port", OPT_INT, &cfg.port, 0, 65535, "TCP port (default 8080; 0: any free port, printed at start)"},
        {"backend", OPT_STR, &cfg.backend, 0, 0, "cpu or cuda (default: cuda when an sm_90 GPU is present)"},
        {"threads", OPT_INT, &cfg.threads, 0, 1024, "CPU backend threads (0: all cores)"},
        {"model-name", OPT_STR, &cfg.model_name, 0, 0, "model id in responses (default: the directory name)"},
        {"context", OPT_INT, &cfg.context, 16, QWEN_MAX_CTX, "tokens per sequence: prompt + max_tokens + 1 must fit (default 262144)"},
        {"queue", OPT_INT, &cfg.queue, 0, 4096, "requests that may wait behind the running one; past it 503 (default 16)"},
        {"max-body", OPT_INT, &cfg.max_body, 1024, 1 << 30, "request body limit in bytes; past it 413 (default 8 MiB)"},
        {"max-header", OPT_INT, &cfg.max_header, 4096, 1 << 20, "request header limit in bytes (default 32 KiB)"},
        {"max-connections", OPT_INT, &cfg.max_connections, 2, 4096, "open connections at once (default 64)"},
        {"cache-entries", OPT_INT, &cfg.cache_entries, 0, 64, "session cache: end-of-request states kept, LRU (default 2; 0: off)"},
        {"cache-boundaries", OPT_INT, &cfg.cache_boundaries, 0, 64, "session cache: last-message snapshots kept, LRU (default 2; 0: off)"},
        {"default-max-tokens", OPT_INT, &cfg.default_max_tokens, 1, QWEN_MAX_CTX, "max_tokens when a request gives none (default 4096)"},
        {"drain-seconds", OPT_INT, &cfg.drain_seconds, 0, 3600, "on SIGTERM, time for queued requests to finish before aborting (default 30)"},
        {"timeout", OPT_INT, &cfg.timeout, 1, 3600, "idle connection timeout in seconds (default 120)"},
        {"quiet", OPT_FLAG, &cfg.quiet, 0, 0, "no per-request log lines"},
    };
    const int nopts = sizeof opts / sizeof opts[0];
    const char *summary = "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics";
    if (opts_wants_help(argc, argv)) {
        opts_usage(stdout, "serve", summary, opts, nopts);
        return 0;
    }
    char err[1024];
    if (opts_parse(argc, argv, opts, nopts, err, sizeof err)) {
        fprintf(stderr, "calla serve: %s\n", err);
        return 2;
    }
    if (!cfg.model_dir) {
        fprintf(stderr, "calla serve: --model is required\n");
        opts_usage(stderr, "serve", summary, opts, nopts);
        return 2;
    }
    char name[256];
    if (!cfg.model_name) {
        size_t l = strlen(cfg.model_dir);
        while (l > 1 && cfg.model_dir[l - 1] == '/') l--;
        size_t b = l;
        while (b > 0 && cfg.model_dir[b - 1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(l - b), cfg.model_dir + b);
        cfg.model_name = name;
    }
    char *model_name = NULL;   // it goes into every JSON answer, which must be valid UTF-8
    size_t mlen;
    if (utf8_sanitize(cfg.model_name, strlen(cfg.model_name), &model_name, &mlen)) {
        fprintf(stderr, "calla serve: out of memory\n");
        return 1;
    }
    cfg.model_name = model_name;
    struct sockaddr_storage addr;
    if (resolve(cfg.host, (int)cfg.port, &addr, err, sizeof err)) {
        fprintf(stderr, "calla serve: %s\n", err);
        free(model_name);
        return 2;
    }

    static struct server S;   // MHD and the worker hold pointers into it until the end
    struct server *sv = &S;
    memset(sv, 0, sizeof *sv);
    sv->cfg = cfg;
    pthread_mutex_init(&sv->mu, NULL);
    pthread_cond_init(&sv->cv, NULL);
    atomic_init(&sv->abort, false);
    json_object_seed(0);   // before any thread makes a JSON object
    int rc = 1;
    struct engine_options eo = {.backend = cfg.backend, .threads = (int)cfg.threads};
    if (engine_open(cfg.model_dir, &eo, &sv->e, err, sizeof err)) {
        fprintf(stderr, "calla serve: %s\n", err);
        goto out_engine;
    }
    sv->vocab = engine_geometry(sv->e)->vocab;
    if (tokenizer_load(cfg.model_dir, &sv->tok, err, sizeof err)) {
        fprintf(stderr, "calla serve: %s\nHINT: the checkpoint directory needs a tokenizer.json (calla synth writes one)\n", err);
        goto out_engine;
    }
    if (seq_new(sv->e, (int)cfg.context, &sv->w, err, sizeof err) ||
        scache_init(&sv->full, sv->e, (int)cfg.context, (int)cfg.cache_entries, err, sizeof err) ||
        scache_init(&sv->bound, sv->e, (int)cfg.context, (int)cfg.cache_boundaries, err, sizeof err)) {
        fprintf(stderr, "calla serve: %s\n", err);
        goto out_tok;
    }

    // Signals: the main thread takes SIGTERM/SIGINT with sigwait; every other thread blocks them.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (pthread_create(&sv->worker, NULL, worker_main, sv)) {
        fprintf(stderr, "calla serve: cannot start the worker thread\n");
        goto out_cache;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    sv->d = MHD_start_daemon(flags, (uint16_t)cfg.port, NULL, NULL, on_request, sv, MHD_OPTION_SOCK_ADDR, &addr,
                             MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                             (size_t)cfg.max_header + SSE_BLOCK + 16384, MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg.max_connections,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg.timeout, MHD_OPTION_END);
    if (!sv->d) {
        fprintf(stderr, "calla serve: cannot listen on %s:%lld: %s\n", cfg.host, cfg.port, strerror(errno));
        goto out_worker;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(sv->d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr,
            "calla serve: listening on http://%s%s%s:%u (model %s, backend %s, context %lld, queue %lld, cache %lld+%lld)\n",
            addr.ss_family == AF_INET6 ? "[" : "", cfg.host, addr.ss_family == AF_INET6 ? "]" : "",
            di ? di->port : (unsigned)cfg.port, cfg.model_name, engine_backend(sv->e), cfg.context, cfg.queue,
            cfg.cache_entries, cfg.cache_boundaries);
    fflush(stderr);

    // Wait for a signal, then drain: no new work; queued and running requests may finish for
    // --drain-seconds; then abort what is left (a second signal aborts at once).
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "calla serve: %s: draining (up to %lld s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", cfg.drain_seconds);
    pthread_mutex_lock(&sv->mu);
    sv->draining = true;
    pthread_mutex_unlock(&sv->mu);
    const double deadline = now_s() + (double)cfg.drain_seconds;
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        bool idle = !sv->head && !sv->running;
        pthread_mutex_unlock(&sv->mu);
        if (idle) break;
        double left = deadline - now_s();
        if (left <= 0) {
            fprintf(stderr, "calla serve: drain time is up; aborting the remaining requests\n");
            break;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        if (sigtimedwait(&sigs, NULL, &ts) > 0) {
            fprintf(stderr, "calla serve: second signal; aborting the remaining requests\n");
            break;
        }
    }
    atomic_store(&sv->abort, true);
    rc = 0;
out_worker:
    pthread_mutex_lock(&sv->mu);
    sv->stop_worker = true;
    pthread_cond_broadcast(&sv->cv);
    pthread_mutex_unlock(&sv->mu);
    atomic_store(&sv->abort, true);
    pthread_join(sv->worker, NULL);
    // Every job is done now; let their answers (error events of aborted streams too) reach the
    // clients before MHD closes the sockets, for at most a few seconds.
    for (int k = 0; sv->d && k < 100; k++) {
        pthread_mutex_lock(&sv->mu);
        int open = sv->open_jobs;
        pthread_mutex_unlock(&sv->mu);
        if (!open) break;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    if (sv->d) MHD_stop_daemon(sv->d);   // joins the connection threads; their jobs are all done
    if (!rc) fprintf(stderr, "calla serve: stopped\n");
out_cache:
    scache_free(&sv->full);
    scache_free(&sv->bound);
    seq_free(sv->w);
out_tok:
    tokenizer_free(sv->tok);
out_engine:
    engine_close(sv->e);
    pthread_mutex_destroy(&sv->mu);
    pthread_cond_destroy(&sv->cv);
    free(model_name);
    return rc;
}
