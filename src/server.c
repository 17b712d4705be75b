// server.c: `calla serve`, an OpenAI-compatible HTTP server over one engine, batch 1, greedy:
// the HTTP transport (libmicrohttpd callbacks, routes, limits, relaying each job's bytes,
// metrics) and the command itself.  The protocol is in openai.c, the queue and the worker in
// scheduler.c, the job and its output channel in job.c, the connection table in conn.c.
//
// Threads:
//   MHD, a pool of --http-threads, each an epoll loop over its share of the connections: reads
//        and validates requests (JSON, limits, tokenization), queues jobs and relays their
//        answers.  No callback ever waits: a connection whose answer is not ready is suspended
//        and resumed by whoever makes it ready (the worker, or the tick).
//   worker (scheduler.c): the only thread that touches the engine.
//   tick (conn.c): the request deadline, and the watch over the clients of jobs in flight.
//   main: waits for SIGTERM/SIGINT, then drains (finishes running and queued jobs, up to
//        --drain-seconds) or aborts, and frees everything.
#include "server.h"

#include "auth.h"
#include "commands.h"
#include "job.h"
#include "openai.h"
#include "options.h"
#include "scheduler.h"
#include "tokenizer.h"
#include "tokmask.h"
#include "web.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *const endpoint_names[EP_COUNT] = {
    "chat_completions", "completions", "messages", "count_tokens", "responses", "responses_by_id",
    "models",           "health",      "metrics",  "page",         "other"};
static const int status_codes[] = {200, 400, 401, 403, 404, 405, 411, 413, 415, 500, 503};
_Static_assert(sizeof status_codes / sizeof status_codes[0] == N_STATUS, "N_STATUS counts status_codes");

// ---- HTTP: routes and responses ---------------------------------------------------------------

// Per-request state, MHD's *con_cls.
struct request {
    enum endpoint ep;
    const char *item;            // /v1/models/{id}, /v1/responses/{id}: the id (in MHD's url), else NULL
    const struct web_file *file; // EP_PAGE: the file of the chat page
    bool post;
    struct sbuf body;
    bool too_large;
    size_t received; // body bytes received so far (a chunked body has no declared length)
    bool preflight;  // OPTIONS: a browser's CORS preflight
    int refuse;      // decided from the headers alone: 400/411 (framing), 403 (Host), 401 (key); 0: none
    const char *why; // its message
    struct job *job; // once queued
    bool looked;     // not streaming: the handler has looked at the job once (answer_whole)
};

// The chat page's file at this URL path ("/" is index.html), or NULL.
static const struct web_file *web_find(const char *url) {
    if (!strcmp(url, "/")) url = "/index.html";
    for (const struct web_file *f = web_files; f->path; f++)
        if (!strcmp(f->path, url)) return f;
    return NULL;
}

// Anthropic's endpoints answer in Anthropic's error shape, every other in OpenAI's.
static bool is_anthropic(enum endpoint ep) {
    return ep == EP_MESSAGES || ep == EP_COUNT_TOKENS;
}

// Endpoints that take a POST with a JSON body (the rest take GET and HEAD; EP_RESPONSE_ITEM DELETE too).
static bool is_post(enum endpoint ep) {
    return ep == EP_CHAT || ep == EP_COMPLETIONS || ep == EP_MESSAGES || ep == EP_COUNT_TOKENS || ep == EP_RESPONSES;
}

static enum endpoint route(const char *url, const char **item, const struct web_file **file) {
    *item = NULL;
    if ((*file = web_find(url))) return EP_PAGE;
    if (!strcmp(url, "/v1/chat/completions")) return EP_CHAT;
    if (!strcmp(url, "/v1/completions")) return EP_COMPLETIONS;
    if (!strcmp(url, "/v1/messages")) return EP_MESSAGES;
    if (!strcmp(url, "/v1/messages/count_tokens")) return EP_COUNT_TOKENS;
    if (!strcmp(url, "/v1/responses")) return EP_RESPONSES;
    if (!strncmp(url, "/v1/responses/", 14) && url[14] && !strchr(url + 14, '/')) {
        *item = url + 14;
        return EP_RESPONSE_ITEM;
    }
    if (!strcmp(url, "/v1/models")) return EP_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *item = url + 11;
        return EP_MODELS;
    }
    if (!strcmp(url, "/health")) return EP_HEALTH;
    if (!strcmp(url, "/metrics")) return EP_METRICS;
    return EP_OTHER;
}

// ---- checks on the headers: request smuggling ---------------------------------------------------
//
// A request whose end two HTTP parsers could place differently (a proxy in front, then
// libmicrohttpd) lets a client hide a second request in the first one's body.  libmicrohttpd
// 0.9.75 is lenient (docs/HTTP.md lists what it accepts) and hands the access handler its
// parse, not the bytes; so when the headers are in, before any of the body is read, the handler
// refuses what it can still see (400, connection closed):
//   - a header name that is not a token: a space or tab before the colon (MHD keeps it in the
//     name, so "Content-Length : 5" is no length to MHD but is one to many proxies), or a folded
//     line, which MHD 0.9.75 glues onto the previous name;
//   - a value with a control character (a bare CR, say);
//   - a header block that is not laid out as CRLF-ended lines (layout_ok below): a bare LF,
//     a NUL inside a line, a folded line whose continuation is all token characters;
//   - framing: Content-Length and Transfer-Encoding together, Content-Length twice (even with
//     equal values), a Content-Length that is not digits, Transfer-Encoding twice or other than
//     "chunked", Transfer-Encoding in HTTP/1.0;
//   - the target host (RFC 9112 3.2): Host twice (MHD takes the first, a proxy may take the
//     last: the request reaches a host the front did not check), none in an HTTP/1.1 request
//     (HTTP/1.0 has no Host), or a value that is not host[:port].
// A chunked body is refused with 411 unless --allow-chunked: MHD reads the chunk lines itself,
// out of our sight, and accepts extensions and bare LFs in them.

struct header_scan {
    const char *next; // where the next name must start (the layout); NULL: not known
    const char *bad;  // the first problem found, or NULL
    int n_length, n_te, n_host;
    const char *length, *te, *host;
};

static bool is_tchar(unsigned char ch) { // RFC 9110 5.6.2
    return (ch >= '0' && ch <= '9') || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

// MHD 0.9.75 parses the header block in place: each line's CR LF becomes two NULs, the colon one,
// and the names and values it hands out point into that buffer, in the order received.  So in a
// well-formed block a name starts right after the previous line's two NULs and its value after
// the colon's NUL and optional spaces or tabs.  A line ending in a bare LF (one NUL), a NUL inside
// a line (MHD's value stops there) or a folded line (MHD copies the name elsewhere to append the
// continuation to it) breaks that layout, and nothing else shows them.  Nothing is read past
// the first mismatch; the bytes read are in MHD's read buffer, except that the check of the
// block's end (check_framing) may read two bytes past a block ended by bare LFs: still inside
// MHD's memory pool, one allocation, whose later part holds its list of these headers.
// libmicrohttpd 1.0 (Debian 13) refuses these itself at MHD_OPTION_CLIENT_DISCIPLINE_LVL 1
// (set in cmd_serve), and its buffer need not look like this: the check is for the 0.9 series.
#define CHECK_LAYOUT (MHD_VERSION < 0x00097701)
static bool layout_ok(struct header_scan *s, const char *key, size_t ks, const char *value, size_t vs) {
    if (!CHECK_LAYOUT) return true;
    if (s->next && key != s->next) return false;
    const char *p = key + ks + 1; // past the colon
    if (value < p) return false;  // the name was moved: a folded line
    while (p < value && (*p == ' ' || *p == '\t')) p++;
    if (p != value || value[vs] || value[vs + 1]) return false;
    s->next = value + vs + 2;
    return true;
}

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, size_t ks, const char *value,
                                   size_t vs) {
    struct header_scan *s = cls;
    if (!value) value = "", vs = 0;
    if (!layout_ok(s, key, ks, value, vs)) {
        s->bad = "malformed header block: every line must end in CRLF, with no NUL and no folded (obs-fold) line";
        return MHD_NO;
    }
    bool token = ks > 0;
    for (size_t i = 0; i < ks; i++) token = token && is_tchar((unsigned char)key[i]);
    if (!token) {
        s->bad = "malformed header name: no space before the colon, no folded (obs-fold) line";
        return MHD_NO;
    }
    for (size_t i = 0; i < vs; i++) {
        const unsigned char ch = (unsigned char)value[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
            s->bad = "a header value may not hold control characters";
            return MHD_NO;
        }
    }
    if (!strcasecmp(key, "Content-Length"))
        s->n_length++, s->length = value;
    else if (!strcasecmp(key, "Transfer-Encoding"))
        s->n_te++, s->te = value;
    else if (!strcasecmp(key, "Host"))
        s->n_host++, s->host = value;
    return MHD_YES;
}

// A Host value is uri-host [":" port] (RFC 3986 3.2.2): reg-name characters (unreserved,
// pct-encoded, sub-delims), an IP literal's brackets and colons; empty is allowed (RFC 9112 3.2).
// No space, '/', '@', '?', '#', control or non-ASCII byte.
static bool host_value_ok(const char *v) {
    for (; *v; v++) {
        const unsigned char ch = (unsigned char)*v;
        const bool alnum = (ch >= '0' && ch <= '9') || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z');
        if (!alnum && !strchr("-._~%!$&'()*+,;=:[]", ch)) return false;
    }
    return true;
}

// 0 when the request's framing and target host are unambiguous; else 400 (or 411: a chunked body
// while chunked uploads are off) and *why.
static int check_framing(const struct server *sv, struct MHD_Connection *c, const char *version, const char **why) {
    struct header_scan s = {0};
    const size_t vl = version ? strlen(version) : 0;
    if (CHECK_LAYOUT && vl) { // the request line ends in CR LF too ("" when the request line had no version)
        if (version[vl] || version[vl + 1]) {
            *why = "malformed request line: it must end in CRLF";
            return 400;
        }
        s.next = version + vl + 2;
    }
    MHD_get_connection_values_n(c, MHD_HEADER_KIND, scan_header, &s);
    if (!s.bad && s.next && (s.next[0] || s.next[1])) // the empty line that ends the block: CR LF
        s.bad = "malformed header block: every line must end in CRLF, with no NUL and no folded (obs-fold) line";
    *why = s.bad;
    if (!*why && s.n_length && s.n_te) *why = "a request may not have both Content-Length and Transfer-Encoding";
    if (!*why && s.n_length > 1) *why = "a request may have only one Content-Length header";
    if (!*why && s.n_te > 1) *why = "a request may have only one Transfer-Encoding header";
    if (!*why && s.n_length && (!*s.length || strspn(s.length, "0123456789") != strlen(s.length)))
        *why = "Content-Length must be a decimal number";
    if (!*why && s.n_te && strcasecmp(s.te, "chunked")) *why = "the only transfer coding accepted is chunked";
    if (!*why && s.n_te && version && !strcmp(version, MHD_HTTP_VERSION_1_0))
        *why = "Transfer-Encoding is not allowed in an HTTP/1.0 request";
    if (!*why && s.n_host > 1) *why = "a request may have only one Host header";
    if (!*why && !s.n_host && version && !strcmp(version, MHD_HTTP_VERSION_1_1))
        *why = "an HTTP/1.1 request must have a Host header";
    if (!*why && s.n_host && !host_value_ok(s.host)) *why = "the Host header must be host[:port]";
    if (*why) return 400;
    if (s.n_te && !sv->cfg.allow_chunked) {
        *why = "a request body needs a Content-Length: chunked request bodies are off (calla serve --allow-chunked)";
        return 411;
    }
    return 0;
}

// The bytes of one kind of a request's values (headers, query arguments) as sent: "key: value\r\n".
static enum MHD_Result count_value(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

static size_t values_bytes(struct MHD_Connection *c, enum MHD_ValueKind kind) {
    size_t n = 0;
    MHD_get_connection_values(c, kind, count_value, &n);
    return n;
}

// --max-header: 414 when the URI alone is over it, 431 when the URI and headers are; 0 when within.
// (Past what fits in MHD's memory pool, --max-header + 20 KiB less its own buffers, MHD answers
// 414/431 itself, in HTML: README, hardening.)
static int header_limit(const struct server *sv, struct MHD_Connection *c, const char *url, char *msg, size_t cap) {
    const size_t uri = strlen(url) + values_bytes(c, MHD_GET_ARGUMENT_KIND),
                 all = uri + values_bytes(c, MHD_HEADER_KIND);
    const size_t max = (size_t)sv->cfg.max_header;
    if (uri > max)
        snprintf(msg, cap, "the request URI (%zu bytes) exceeds the limit of %zu bytes", uri, max);
    else if (all > max)
        snprintf(msg, cap, "the request's URI and headers (%zu bytes) exceed the limit of %zu bytes", all, max);
    return uri > max ? 414 : all > max ? 431 : 0;
}

// The Host header against --allowed-host, or (none given) against the loopback names when the
// server listens on a loopback address: a web page cannot reach a local server by a DNS name of
// its own (DNS rebinding).  Without a Host (HTTP/1.0) nothing is checked.
static bool host_allowed(const struct server *sv, const char *host) {
    if (!host) return true;
    const struct opt_strs *allow = &sv->cfg.allowed_hosts;
    if (!allow->n && !sv->loopback) return true;
    size_t n = strlen(host); // the name without ":port"
    const char *end = host[0] == '[' ? strchr(host, ']') : strchr(host, ':');
    if (end) n = (size_t)(end - host) + (host[0] == '[');
    static const char *const local[] = {"localhost", "127.0.0.1", "[::1]"};
    for (int i = 0; i < (allow->n ? allow->n : 3); i++) {
        const char *a = allow->n ? allow->v[i] : local[i];
        if (!strcmp(a, "*") || (strlen(a) == n && !strncasecmp(a, host, n))) return true;
    }
    return false;
}

// The request's Origin when it is one of --cors-origin (or that list holds "*"), else NULL.
static const char *cors_origin(const struct server *sv, struct MHD_Connection *c) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    for (int i = 0; origin && i < sv->cfg.cors_origins.n; i++)
        if (!strcmp(sv->cfg.cors_origins.v[i], "*") || !strcmp(sv->cfg.cors_origins.v[i], origin)) return origin;
    return NULL;
}

static void cors_headers(const struct server *sv, struct MHD_Connection *c, struct MHD_Response *r) {
    const char *origin = cors_origin(sv, c);
    if (!origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "X-Session-Id");
    MHD_add_response_header(r, "Vary", "Origin");
}

static bool is_json_type(const char *ct) {
    if (!ct || strncasecmp(ct, "application/json", 16)) return false;
    return ct[16] == 0 || ct[16] == ';' || ct[16] == ' ';
}

// ---- HTTP responses ----------------------------------------------------------------------------

static void count_request(struct server *sv, enum endpoint ep, int status) {
    int k = N_STATUS;
    for (int i = 0; i < N_STATUS; i++)
        if (status_codes[i] == status) k = i;
    pthread_mutex_lock(&sv->mu);
    sv->m.requests[ep][k]++;
    pthread_mutex_unlock(&sv->mu);
}

// The headers a status calls for: Retry-After on 503, WWW-Authenticate on 401, Allow on 405.
static void status_headers(struct MHD_Response *r, enum endpoint ep, int status) {
    if (status == 503) {
        char v[16];
        snprintf(v, sizeof v, "%d", RETRY_AFTER_S);
        MHD_add_response_header(r, "Retry-After", v);
    }
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 405)
        MHD_add_response_header(r, "Allow",
                                is_post(ep)              ? "POST"
                                : ep == EP_RESPONSE_ITEM ? "GET, HEAD, DELETE"
                                                         : "GET, HEAD");
    // After a refusal the rest of what the client sent is not trusted to be the next request.
    if (status == 400 || status == 403 || status == 411 || status == 413 || status == 414 || status == 431 ||
        status == 505)
        MHD_add_response_header(r, "Connection", "close");
}

// session: the X-Session-Id to mirror (a generation's session key), or NULL.
static enum MHD_Result send_buf_session(struct server *sv, struct MHD_Connection *c, enum endpoint ep, int status,
                                        const char *type, const char *body, size_t len, const char *session) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (session) MHD_add_response_header(r, "X-Session-Id", session);
    status_headers(r, ep, status);
    cors_headers(sv, c, r);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_request(sv, ep, status);
    return ret;
}

static enum MHD_Result send_buf(struct server *sv, struct MHD_Connection *c, enum endpoint ep, int status,
                                const char *type, const char *body, size_t len) {
    return send_buf_session(sv, c, ep, status, type, body, len, NULL);
}

static enum MHD_Result send_json(struct server *sv, struct MHD_Connection *c, enum endpoint ep, int status,
                                 json_t *body) {
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!s) return send_buf(sv, c, ep, 500, "text/plain", "out of memory\n", 14);
    enum MHD_Result ret = send_buf(sv, c, ep, status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

static enum MHD_Result send_error(struct server *sv, struct MHD_Connection *c, enum endpoint ep, int status,
                                  const char *param, const char *msg) {
    json_t *b = is_anthropic(ep) ? anthropic_error_body(status, msg) : openai_error_body(status, param, msg);
    char *s = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    if (!s) return send_buf(sv, c, ep, status, "text/plain", msg, strlen(msg));
    enum MHD_Result ret = send_buf(sv, c, ep, status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

// All of buf to a non-blocking socket, waiting at most timeout_ms in all for room; false when it
// could not (a peer that does not read, or one that is gone).
static bool write_all(int fd, const char *buf, size_t n, int timeout_ms) {
    const double until = now_s() + timeout_ms / 1000.0;
    while (n) {
        ssize_t k = send(fd, buf, n, MSG_NOSIGNAL);
        if (k > 0) {
            buf += k, n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
        const int left = (int)((until - now_s()) * 1000);
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (left <= 0 || poll(&p, 1, left) < 0) return false;
    }
    return true;
}

// A body that passes --max-body while it arrives (a chunked one: no length was declared): 413 (or
// the refusal its headers already earned, as for a declared length) now, and the connection
// closed with the rest unread, however much the client still sends.  libmicrohttpd 0.9.75 queues
// a response only when the headers are in or the whole request is (MHD_queue_response refuses in
// between), so the answer is written to the socket here: nothing else writes to it while MHD
// reads a body.  MHD_NO then makes MHD close the connection (it logs "Application reported
// internal error"); the client gets the answer, then a reset if it is still sending.
static enum MHD_Result refuse_body(struct server *sv, struct MHD_Connection *c, struct request *rq) {
    char msg[96], head[256];
    snprintf(msg, sizeof msg, "the request body exceeds the limit of %lld bytes", sv->cfg.max_body);
    const int status = rq->refuse ? rq->refuse : 413;
    json_t *b = openai_error_body(status, NULL, rq->refuse ? rq->why : msg);
    char *body = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (body && ci) {
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                         "%sConnection: close\r\n\r\n",
                         status, MHD_get_reason_phrase_for((unsigned)status), strlen(body),
                         status == 401 ? "WWW-Authenticate: Bearer\r\n" : "");
        if (write_all(ci->connect_fd, head, (size_t)n, 1000)) write_all(ci->connect_fd, body, strlen(body), 1000);
    }
    free(body);
    sbuf_free(&rq->body);
    count_request(sv, rq->ep, status);
    return MHD_NO;
}

static enum MHD_Result send_metrics(struct server *sv, struct MHD_Connection *c) {
    struct sbuf b = {0};
    char line[256];
#define OUT(...) (snprintf(line, sizeof line, __VA_ARGS__), sbuf_add(&b, line, strlen(line)))
    pthread_mutex_lock(&sv->mu);
    struct metrics m = sv->m;
    pthread_mutex_unlock(&sv->mu);
    struct sched_status st;
    sched_status(&sv->sched, &st);
    const struct sched_metrics *g = &st.m;
    int depth = st.depth, running = st.running, pf_done = st.prefill_done, pf_total = st.prefill_total;
    const struct conn_stats cs = conn_table_stats(&sv->conns);
    OUT("# HELP calla_requests_total HTTP requests by endpoint and status.\n# TYPE calla_requests_total counter\n");
    for (int e = 0; e < EP_COUNT; e++)
        for (int k = 0; k <= N_STATUS; k++)
            if (m.requests[e][k] || e == EP_CHAT || e == EP_COMPLETIONS || e == EP_MESSAGES || e == EP_RESPONSES) {
                if (k == N_STATUS && !m.requests[e][k]) continue;
                if (k == N_STATUS)
                    OUT("calla_requests_total{endpoint=\"%s\",status=\"other\"} %llu\n", endpoint_names[e],
                        m.requests[e][k]);
                else if (m.requests[e][k] || status_codes[k] == 200)
                    OUT("calla_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", endpoint_names[e],
                        status_codes[k], m.requests[e][k]);
            }
    OUT("# HELP calla_prompt_tokens_total Prompt tokens of generation requests (cached included).\n# TYPE "
        "calla_prompt_tokens_total counter\ncalla_prompt_tokens_total %llu\n",
        g->prompt_tokens);
    OUT("# HELP calla_generated_tokens_total Generated tokens.\n# TYPE calla_generated_tokens_total "
        "counter\ncalla_generated_tokens_total %llu\n",
        g->generated_tokens);
    OUT("# HELP calla_prefill_seconds_total Time in prefill (to the first token).\n# TYPE calla_prefill_seconds_total "
        "counter\ncalla_prefill_seconds_total %.6f\n",
        g->prefill_s);
    OUT("# HELP calla_decode_seconds_total Time in decode (after the first token).\n# TYPE calla_decode_seconds_total "
        "counter\ncalla_decode_seconds_total %.6f\n",
        g->decode_s);
    OUT("# HELP calla_cache_hits_total Requests that continued from a session-cache entry.\n# TYPE "
        "calla_cache_hits_total counter\ncalla_cache_hits_total %llu\n",
        g->cache_hits);
    OUT("# HELP calla_cache_misses_total Requests that found no session-cache entry.\n# TYPE calla_cache_misses_total "
        "counter\ncalla_cache_misses_total %llu\n",
        g->cache_misses);
    OUT("# HELP calla_cached_tokens_total Prompt tokens taken from the session cache.\n# TYPE "
        "calla_cached_tokens_total counter\ncalla_cached_tokens_total %llu\n",
        g->cached_tokens);
    OUT("# HELP calla_draft_tokens_total Draft tokens verified by speculative decoding.\n# TYPE "
        "calla_draft_tokens_total counter\ncalla_draft_tokens_total %llu\n",
        g->draft_tokens);
    OUT("# HELP calla_draft_accepted_total Draft tokens that were the model's own and went into the output.\n# TYPE "
        "calla_draft_accepted_total counter\ncalla_draft_accepted_total %llu\n",
        g->draft_accepted);
    OUT("# HELP calla_cancelled_total Generations stopped because the client went away (or on shutdown).\n# TYPE "
        "calla_cancelled_total counter\ncalla_cancelled_total %llu\n",
        g->cancelled);
    OUT("# HELP calla_queue_depth Requests waiting for the engine.\n# TYPE calla_queue_depth gauge\ncalla_queue_depth "
        "%d\n",
        depth);
    OUT("# HELP calla_requests_running Requests being generated (0 or 1).\n# TYPE calla_requests_running "
        "gauge\ncalla_requests_running %d\n",
        running);
    OUT("# HELP calla_prefill_tokens_done Prompt tokens of the running request's prefill done so far (0: none "
        "running).\n# TYPE calla_prefill_tokens_done gauge\ncalla_prefill_tokens_done %d\n",
        pf_done);
    OUT("# HELP calla_prefill_tokens_total Prompt tokens of the running request's prefill (0: none running).\n# TYPE "
        "calla_prefill_tokens_total gauge\ncalla_prefill_tokens_total %d\n",
        pf_total);
    OUT("# HELP calla_connections_open Open HTTP connections.\n# TYPE calla_connections_open "
        "gauge\ncalla_connections_open %d\n",
        cs.open);
    OUT("# HELP calla_connections_timed_out_total Connections closed for not sending a whole request within "
        "--request-timeout.\n# TYPE calla_connections_timed_out_total counter\ncalla_connections_timed_out_total "
        "%llu\n",
        cs.timed_out);
    OUT("# HELP calla_connections_evicted_total Idle connections closed to make room (--max-connections, "
        "--max-connections-per-ip).\n# TYPE calla_connections_evicted_total counter\ncalla_connections_evicted_total "
        "%llu\n",
        cs.evicted);
#undef OUT
    enum MHD_Result r = b.p ? send_buf(sv, c, EP_METRICS, 200, "text/plain; version=0.0.4", b.p, b.len)
                            : send_error(sv, c, EP_METRICS, 500, NULL, "out of memory");
    sbuf_free(&b);
    return r;
}

// ---- relaying a job's answer ------------------------------------------------------------------
//
// No callback of MHD's may wait (a pool thread serves thousands of connections), so an answer
// that is not ready parks its reader: the connection is suspended (job_park) and resumed by
// whatever changes what the reader sees (job.h: output, the end, a cancellation, the tick's pokes).
//   - A stream: MHD's content reader returns what is there, else a keep-alive comment after
//     SSE_KEEPALIVE_S seconds of silence (clients and proxies must not time the stream out), else
//     parks and returns 0.
//   - A whole answer: the access handler parks until the job is done, then queues the body with
//     its status and a Content-Length.  A client that closed its socket (FIN, not a reset) looks
//     just like one that only half-closed after its request (shutdown(SHUT_WR)) and still reads:
//     only a write tells them apart, the closed one's system answers it with a reset.  So once the
//     client's end of stream is seen and the job has waited PROBE_AFTER_S, the answer starts
//     early: 200, chunked (close-delimited for HTTP/1.0), a space every PROBE_EVERY_S
//     (whitespace before a JSON document is part of JSON), then the document.  A closed client's
//     reset cancels the job within a few seconds, queued or running; a half-closed one gets its
//     answer.  An answer that fails after that start cannot change its status any more: its
//     error object is sent, and the chunked body is left without its last chunk, so no HTTP/1.1
//     client takes it for a whole message.
enum { SSE_KEEPALIVE_S = 10 };
static const double PROBE_AFTER_S = 1.0, PROBE_EVERY_S = 1.0;
static const char sse_keepalive[] = ": keep-alive\n\n", sse_probe[] = ": are you there\n\n";

// An answer on its way out through a content reader.
struct relay {
    struct job *j; // a reference
    double last;   // when bytes last went out (0: never)
};

static void mhd_suspend(void *c) {
    MHD_suspend_connection(c);
}
static void mhd_resume(void *c) {
    MHD_resume_connection(c);
}

static ssize_t put_text(struct relay *rl, char *buf, size_t max, const char *text, size_t n) {
    if (max < n) return 0; // (MHD's block is SSE_BLOCK: never)
    memcpy(buf, text, n);
    rl->last = now_s();
    return (ssize_t)n;
}

// The content reader of a streamed answer (server-sent events).
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct relay *rl = cls;
    for (;;) {
        const struct job_view v = job_look(rl->j);
        const long n = job_read(rl->j, buf, max, 0);
        if (n > 0) {
            rl->last = now_s();
            return (ssize_t)n;
        }
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (v.cancelled) return MHD_CONTENT_READER_END_WITH_ERROR; // the client is gone
        const double idle = now_s() - rl->last;
        if (idle >= SSE_KEEPALIVE_S) return put_text(rl, buf, max, sse_keepalive, sizeof sse_keepalive - 1);
        if (v.peer_eof && idle >= PROBE_EVERY_S) return put_text(rl, buf, max, sse_probe, sizeof sse_probe - 1);
        if (job_park(rl->j)) return 0;
    }
}

// The content reader of a whole answer started early (a client that closed its end): spaces,
// then the document.
static ssize_t body_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct relay *rl = cls;
    for (;;) {
        const struct job_view v = job_look(rl->j);
        if (v.done) {
            const long n = job_read(rl->j, buf, max, 0);
            if (n > 0) return (ssize_t)n;
            return rl->j->status == 200 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (v.cancelled) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (now_s() - rl->last >= PROBE_EVERY_S) return put_text(rl, buf, max, " ", 1);
        if (job_park(rl->j)) return 0;
    }
}

static void relay_free(void *cls) {
    struct relay *rl = cls;
    job_abandon(rl->j); // the response is gone: a job not done yet is cancelled
    job_unref(rl->j);
    free(rl);
}

// A response read by a relay of j: 200, its headers, queued.
static enum MHD_Result queue_relay(struct server *sv, struct MHD_Connection *c, enum endpoint ep, struct job *j,
                                   MHD_ContentReaderCallback read, const char *type, const char *session) {
    struct relay *rl = malloc(sizeof *rl);
    struct MHD_Response *r =
        rl ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, read, rl, relay_free) : NULL;
    if (!r) {
        free(rl);
        return MHD_NO;
    }
    job_ref(j);
    *rl = (struct relay){.j = j, .last = read == sse_read ? now_s() : 0}; // a probe goes out at once
    MHD_add_response_header(r, "Content-Type", type);
    if (read == sse_read) MHD_add_response_header(r, "Cache-Control", "no-cache");
    if (session) MHD_add_response_header(r, "X-Session-Id", session);
    cors_headers(sv, c, r);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    count_request(sv, ep, 200);
    return ret;
}

// The X-Session-Id to mirror for a queued job: the header's, else the body's session key.
static const char *job_session(struct MHD_Connection *c, const struct job *j) {
    const char *sid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Session-Id");
    return sid ? sid : j->session[0] ? j->session : NULL;
}

// A whole answer, from the access handler (first when the job is queued, then at each resume):
// queued once it is done; started early for a client that closed its end; else parked.
static enum MHD_Result answer_whole(struct server *sv, struct MHD_Connection *c, struct request *rq) {
    struct job *j = rq->job;
    for (;;) {
        const struct job_view v = job_look(j);
        if (v.cancelled) return MHD_NO; // the client is gone: close
        if (v.done) {                   // out and status are final
            if (!j->out.len) return send_error(sv, c, rq->ep, 500, NULL, "out of memory");
            return send_buf_session(sv, c, rq->ep, j->status, "application/json", j->out.p, j->out.len,
                                    j->status == 200 ? job_session(c, j) : NULL);
        }
        if (v.peer_eof && now_s() - j->t_queued >= PROBE_AFTER_S)
            return queue_relay(sv, c, rq->ep, j, body_read, "application/json", job_session(c, j));
        // MHD 0.9.75 keeps a connection's event-loop state while it is suspended, and one suspended
        // in the call that completed its request is still marked as reading: resumed, MHD reads,
        // and a client that has half-closed reads as the end of the stream, on which MHD closes the
        // connection.  Returning once with no answer lets MHD mark it as waiting (it calls the
        // handler again at once); only then is it parked.
        if (!rq->looked) {
            rq->looked = true;
            return MHD_YES;
        }
        if (job_park(j)) return MHD_YES; // resumed when there is news: MHD calls the handler again
    }
}

// A generation's session key, for a balancer's affinity: the X-Session-Id header, else the body's
// prompt_cache_key or `user`.  Calla itself needs none (its cache matches prompts by prefix); it
// mirrors the key into the answer's X-Session-Id so that a balancer or a client can learn it.
static enum MHD_Result handle_generate(struct server *sv, struct MHD_Connection *c, struct request *rq) {
    struct req_error re = {0};
    const char *sid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Session-Id");
    if (sid && !session_id_valid(sid, strlen(sid))) {
        sbuf_free(&rq->body);
        return send_error(sv, c, rq->ep, 400, NULL,
                          "X-Session-Id must be 1 to 128 visible ASCII characters (no spaces or control characters)");
    }
    const char *body = rq->body.p ? rq->body.p : "";
    struct job *j = rq->ep == EP_MESSAGES ? anthropic_parse_request(&sv->cc, body, rq->body.len, &re)
                    : rq->ep == EP_RESPONSES
                        ? responses_parse_request(&sv->cc, &sv->store, body, rq->body.len, &re)
                        : openai_parse_request(&sv->oc, rq->ep == EP_CHAT ? OPENAI_CHAT : OPENAI_COMPLETIONS, body,
                                               rq->body.len, &re);
    sbuf_free(&rq->body);
    if (j) job_set_reader(j, &(struct job_reader){.suspend = mhd_suspend, .resume = mhd_resume, .arg = c});
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!j || sched_enqueue(&sv->sched, j, ci ? ci->connect_fd : -1, &re)) {
        job_unref(j);
        return send_error(sv, c, rq->ep, re.status, re.param, re.msg);
    }
    rq->job = j; // the request's reference; dropped when MHD completes the request
    const union MHD_ConnectionInfo *si = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (si && si->socket_context) conn_watch(&sv->conns, si->socket_context, j);
    pthread_mutex_lock(&sv->mu);
    sv->open_jobs++;
    pthread_mutex_unlock(&sv->mu);
    if (j->stream) return queue_relay(sv, c, rq->ep, j, sse_read, "text/event-stream", job_session(c, j));
    return answer_whole(sv, c, rq);
}

// POST /v1/messages/count_tokens: the prompt's tokens, as a generation of the same body counts them.
static enum MHD_Result handle_count_tokens(struct server *sv, struct MHD_Connection *c, struct request *rq) {
    struct req_error re = {0};
    int n;
    int rc = anthropic_count_tokens(&sv->cc, rq->body.p ? rq->body.p : "", rq->body.len, &n, &re);
    sbuf_free(&rq->body);
    if (rc) return send_error(sv, c, EP_COUNT_TOKENS, re.status, re.param, re.msg);
    return send_json(sv, c, EP_COUNT_TOKENS, 200, json_pack("{s:i}", "input_tokens", n));
}

// GET and DELETE /v1/responses/{id}: a stored response.
static enum MHD_Result handle_response_item(struct server *sv, struct MHD_Connection *c, struct request *rq,
                                            const char *method) {
    if (!strcmp(method, MHD_HTTP_METHOD_DELETE)) {
        if (!rstore_delete(&sv->store, rq->item))
            return send_error(sv, c, EP_RESPONSE_ITEM, 404, NULL, "no such stored response");
        return send_json(sv, c, EP_RESPONSE_ITEM, 200,
                         json_pack("{s:s, s:s, s:b}", "id", rq->item, "object", "response.deleted", "deleted", 1));
    }
    char *r = rstore_get_response(&sv->store, rq->item);
    if (!r) return send_error(sv, c, EP_RESPONSE_ITEM, 404, NULL, "no such stored response");
    enum MHD_Result ret = send_buf(sv, c, EP_RESPONSE_ITEM, 200, "application/json", r, strlen(r));
    free(r);
    return ret;
}

// The chat page: same-origin only (its scripts, styles and requests come from this server; no
// inline script, no eval, no frames), never sniffed, never cached stale across an upgrade.
static const char page_csp[] = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'";

static const char *web_type(const char *path) {
    static const char *const types[][2] = {{".html", "text/html; charset=utf-8"},
                                           {".js", "text/javascript; charset=utf-8"},
                                           {".css", "text/css; charset=utf-8"},
                                           {".svg", "image/svg+xml"}};
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(dot, types[i][0])) return types[i][1];
    return "application/octet-stream";
}

static enum MHD_Result send_page(struct server *sv, struct MHD_Connection *c, const struct web_file *f) {
    struct MHD_Response *r = MHD_create_response_from_buffer(f->len, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", web_type(f->path));
    MHD_add_response_header(r, "Content-Security-Policy", page_csp);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    count_request(sv, EP_PAGE, 200);
    return ret;
}

// A CORS preflight: 204 with the allowances for an origin in --cors-origin, else 403.
static enum MHD_Result send_preflight(struct server *sv, struct MHD_Connection *c, enum endpoint ep) {
    if (!cors_origin(sv, c))
        return send_error(sv, c, ep, 403, NULL, "cross-origin requests are allowed only from --cors-origin origins");
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    cors_headers(sv, c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type, X-Session-Id, x-api-key, anthropic-version, anthropic-beta");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    count_request(sv, ep, 204);
    return ret;
}

// ---- connections --------------------------------------------------------------------------------
// The table (conn.c) lists every connection for the limits, the request deadline and the watch
// over clients; libmicrohttpd's notifications keep it.

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    struct server *sv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        // NULL (out of memory): this connection only lacks the deadline and the limits
        *socket_context = ci ? conn_open(&sv->conns, ci->connect_fd, ai ? ai->client_addr : NULL) : NULL;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        conn_close(&sv->conns, *socket_context);
        *socket_context = NULL;
    }
}

static struct conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    struct server *sv = cls;
    struct request *rq = *con_cls;
    if (!rq) { // headers are in: route, check the method and the declared size
        if (!(rq = calloc(1, sizeof *rq))) return MHD_NO;
        *con_cls = rq;
        rq->ep = route(url, &rq->item, &rq->file);
        rq->post = !strcmp(method, MHD_HTTP_METHOD_POST);
        rq->preflight = !strcmp(method, MHD_HTTP_METHOD_OPTIONS);
        char msg[160];
        // HTTP/1.2 .. 1.9 MHD takes as 1.1 (2.0 and up it answers 505 itself): only 1.0 and 1.1 are spoken here.
        if (!version || (strcmp(version, MHD_HTTP_VERSION_1_0) && strcmp(version, MHD_HTTP_VERSION_1_1))) {
            snprintf(msg, sizeof msg, "HTTP version %.16s is not supported (HTTP/1.1 and HTTP/1.0 are)",
                     version ? version : "(none)");
            return send_error(sv, c, rq->ep, 505, NULL, msg);
        }
        int st = header_limit(sv, c, url, msg, sizeof msg);
        if (st) return send_error(sv, c, rq->ep, st, NULL, msg); // answered now and closed, like framing
        if ((rq->refuse = check_framing(sv, c, version, &rq->why))) {
            // Refused with the request's body unread: MHD closes the connection after the answer
            // (Connection: close), so what follows is never parsed as another request.
        } else if (!host_allowed(sv, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host")))
            rq->refuse = 403, rq->why = "the Host header names no address this server answers to (see --allowed-host)";
        else if (rq->ep != EP_HEALTH && rq->ep != EP_PAGE && !rq->preflight && // the page asks for the key itself;
                                                                               // a preflight carries no credentials
                 !auth_check(&sv->auth, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")) &&
                 !(is_anthropic(rq->ep) && // Anthropic's clients send x-api-key
                   auth_check_key(&sv->auth, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"))))
            rq->refuse = 401,
            rq->why = is_anthropic(rq->ep)
                          ? "missing or incorrect API key: send the header \"x-api-key: KEY\" or "
                            "\"Authorization: Bearer KEY\""
                          : "missing or incorrect API key: send the header \"Authorization: Bearer KEY\"";
        if (rq->refuse == 400 || rq->refuse == 411) // framing: answer now and close; the body is never read
            return send_error(sv, c, rq->ep, rq->refuse, NULL, rq->why);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > (unsigned long long)sv->cfg.max_body) {
            // Declared too large: answered before the body is sent (a refusal from the headers
            // first), and MHD closes the connection with the body unread.
            snprintf(msg, sizeof msg, "the request body exceeds the limit of %lld bytes", sv->cfg.max_body);
            return send_error(sv, c, rq->ep, rq->refuse ? rq->refuse : 413, NULL, rq->refuse ? rq->why : msg);
        }
        return MHD_YES;
    }
    if (*upload_data_size) { // a piece of the body
        rq->received += *upload_data_size;
        if (rq->received > (size_t)sv->cfg.max_body) return refuse_body(sv, c, rq); // chunked: not a byte more
        // A refused request's body is read and dropped (its answer comes after it); out of memory: 413 after it.
        if (!rq->refuse && !rq->too_large && sbuf_add(&rq->body, upload_data, *upload_data_size)) {
            rq->too_large = true;
            sbuf_free(&rq->body);
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (rq->job) return answer_whole(sv, c, rq); // resumed: the job has news
    struct conn *k = conn_of(c);
    if (k) conn_busy(&sv->conns, k); // the whole request is in: no deadline while it is answered
    if (rq->refuse) return send_error(sv, c, rq->ep, rq->refuse, NULL, rq->why);
    if (rq->preflight) return send_preflight(sv, c, rq->ep);
    const bool gen = is_post(rq->ep), del = !strcmp(method, MHD_HTTP_METHOD_DELETE);
    if (rq->ep == EP_OTHER) return send_error(sv, c, rq->ep, 404, NULL, "no such endpoint");
    if (gen != rq->post || (!gen && strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD) &&
                            !(del && rq->ep == EP_RESPONSE_ITEM))) {
        char msg[96];
        snprintf(msg, sizeof msg, "method %.16s is not allowed here (use %s)", method,
                 gen                          ? "POST"
                 : rq->ep == EP_RESPONSE_ITEM ? "GET or DELETE"
                                              : "GET");
        return send_error(sv, c, rq->ep, 405, NULL, msg);
    }
    if (rq->too_large) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body exceeds the limit of %lld bytes", sv->cfg.max_body);
        return send_error(sv, c, rq->ep, 413, NULL, msg);
    }
    if (gen && !is_json_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type")))
        return send_error(sv, c, rq->ep, 415, NULL,
                          "the request body must be JSON with Content-Type: application/json");
    switch (rq->ep) {
    case EP_HEALTH: {
        struct sched_status st;
        sched_status(&sv->sched, &st);
        return send_json(sv, c, EP_HEALTH, st.draining ? 503 : 200,
                         json_pack("{s:s, s:i, s:i, s:b}", "status", st.draining ? "draining" : "ok", "queue_depth",
                                   st.depth, "running", (int)st.running, "api_key_required", sv->auth.n > 0));
    }
    case EP_MODELS: {
        json_t *m =
            json_pack("{s:s, s:s, s:I, s:s, s:I}", "id", sv->cfg.model_name, "object", "model", "created",
                      (json_int_t)sv->started, "owned_by", "calla", "max_model_len", (json_int_t)sv->cfg.context);
        if (!rq->item) return send_json(sv, c, EP_MODELS, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
        if (!strcmp(rq->item, sv->cfg.model_name)) return send_json(sv, c, EP_MODELS, 200, m);
        json_decref(m);
        return send_error(sv, c, EP_MODELS, 404, "model", "no such model: this server has one (GET /v1/models)");
    }
    case EP_METRICS:
        return send_metrics(sv, c);
    case EP_COUNT_TOKENS:
        return handle_count_tokens(sv, c, rq);
    case EP_RESPONSE_ITEM:
        return handle_response_item(sv, c, rq, method);
    case EP_PAGE:
        return send_page(sv, c, rq->file);
    default:
        return handle_generate(sv, c, rq);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct server *sv = cls;
    struct request *rq = *con_cls;
    struct conn *k = conn_of(c);
    if (k) conn_idle(&sv->conns, k); // a kept-alive connection: the next request's deadline starts now
    if (!rq) return;
    if (rq->job) {
        pthread_mutex_lock(&sv->mu);
        sv->open_jobs--;
        pthread_mutex_unlock(&sv->mu);
        job_set_reader(rq->job, NULL); // the connection may go now
        job_release_fd(rq->job,
                       toe != MHD_REQUEST_TERMINATED_COMPLETED_OK); // MHD closes or reuses the socket after this
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

static bool is_loopback(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET) return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

static int load_keys(struct auth *a, const struct server_config *cfg, char *err, size_t errlen) {
    char msg[256];
    for (int i = 0; i < cfg->api_keys.n; i++)
        if (auth_add_key(a, cfg->api_keys.v[i], msg, sizeof msg)) {
            snprintf(err, errlen, "--api-key: %s", msg);
            return -1;
        }
    return cfg->api_key_file ? auth_load_file(a, cfg->api_key_file, err, errlen) : 0;
}

int cmd_serve(int argc, char **argv) {
    struct server_config cfg = {
        .host = "127.0.0.1",
        .port = 8080,
        .context = QWEN_MAX_CTX,
        .queue = 16,
        .max_body = 8 << 20,
        .max_header = 32 << 10,
        .max_connections = 16384,
        .http_threads = 4,
        .cache_entries = 2,
        .cache_boundaries = 2,
        .default_max_tokens = 4096,
        .drain_seconds = 30,
        .timeout = 120,
        .request_timeout = 30,
        .max_per_ip = 32,
        .prefill_chunk = QWEN_PREFILL_CHUNK,
        .device = -1,
        .store_entries = 256,
        .store_bytes = 64 << 20,
        .speculative = true,
    };
    const struct opt opts[] = {
        {"model", OPT_STR, &cfg.model_dir, 0, 0, "checkpoint directory (with tokenizer.json)"},
        {"host", OPT_STR, &cfg.host, 0, 0, "address to listen on (default 127.0.0.1)"},
        {"port", OPT_INT, &cfg.port, 0, 65535, "TCP port (default 8080; 0: any free port, printed at start)"},
        {"backend", OPT_STR, &cfg.backend, 0, 0, "cpu or cuda (default: cuda when an sm_90 GPU is present)"},
        {"threads", OPT_INT, &cfg.threads, 0, 1024, "CPU backend threads (0: all cores)"},
        {"device", OPT_INT, &cfg.device, 0, 255,
         "the GPU (CUDA backend; numbered within CUDA_VISIBLE_DEVICES; default 0); "
         "refused when missing or busy: one replica per GPU"},
        {"model-name", OPT_STR, &cfg.model_name, 0, 0, "model id in responses (default: the directory name)"},
        {"context", OPT_INT, &cfg.context, 16, QWEN_MAX_CTX,
         "tokens per sequence: prompt + max_tokens + 1 must fit (default 262144)"},
        {"queue", OPT_INT, &cfg.queue, 0, 4096,
         "requests that may wait behind the running one; past it 503 (default 16)"},
        {"max-body", OPT_INT, &cfg.max_body, 1024, 1 << 30, "request body limit in bytes; past it 413 (default 8 MiB)"},
        {"max-header", OPT_INT, &cfg.max_header, 4096, 1 << 20, "request header limit in bytes (default 32 KiB)"},
        {"max-connections", OPT_INT, &cfg.max_connections, 2, 65536,
         "open connections at once; past it the oldest idle one is "
         "closed (default 16384; capped by the open-file limit)"},
        {"http-threads", OPT_INT, &cfg.http_threads, 1, 64,
         "HTTP threads, each an event loop over its share of the "
         "connections (default 4)"},
        {"cache-entries", OPT_INT, &cfg.cache_entries, 0, 64,
         "session cache: end-of-request states kept, LRU (default 2; 0: off)"},
        {"cache-boundaries", OPT_INT, &cfg.cache_boundaries, 0, 64,
         "session cache: last-message snapshots kept, LRU (default 2; 0: off)"},
        {"default-max-tokens", OPT_INT, &cfg.default_max_tokens, 1, QWEN_MAX_CTX,
         "max_tokens when a request gives none (default 4096)"},
        {"drain-seconds", OPT_INT, &cfg.drain_seconds, 0, 3600,
         "on SIGTERM, time for queued requests to finish before aborting (default 30)"},
        {"timeout", OPT_INT, &cfg.timeout, 1, 3600, "idle connection timeout in seconds (default 120)"},
        {"request-timeout", OPT_INT, &cfg.request_timeout, 1, 3600,
         "seconds a client has to send a whole request, headers "
         "and body, from connecting or from its previous answer; "
         "then the connection is closed (default 30)"},
        {"quiet", OPT_FLAG, &cfg.quiet, 0, 0, "no per-request log lines"},
        {"allow-chunked", OPT_FLAG, &cfg.allow_chunked, 0, 0,
         "accept chunked request bodies (default: 411; libmicrohttpd "
         "parses their chunk lines leniently: docs/HTTP.md)"},
        {"api-key", OPT_STRS, &cfg.api_keys, 0, 0,
         "accept this key as \"Authorization: Bearer KEY\" (repeatable; none: no auth)"},
        {"api-key-file", OPT_STR, &cfg.api_key_file, 0, 0, "accept the keys in this file, one a line (# comments)"},
        {"allowed-host", OPT_STRS, &cfg.allowed_hosts, 0, 0,
         "accept this Host header name (repeatable; * any; default: "
         "loopback names when listening on loopback, else any)"},
        {"cors-origin", OPT_STRS, &cfg.cors_origins, 0, 0,
         "allow browser pages of this origin (repeatable; * any; "
         "default none: preflights get 403)"},
        {"max-connections-per-ip", OPT_INT, &cfg.max_per_ip, 1, 65536,
         "open connections from one address; past it its oldest "
         "idle one is closed (default 32)"},
        {"store-entries", OPT_INT, &cfg.store_entries, 0, 65536,
         "Responses API: stored responses kept for "
         "previous_response_id and GET, LRU (default 256; 0: none)"},
        {"store-bytes", OPT_INT, &cfg.store_bytes, 1 << 16, 1LL << 40,
         "Responses API: the bytes stored responses may hold "
         "(default 64 MiB)"},
        {"allow-sampling", OPT_FLAG, &cfg.allow_sampling, 0, 0,
         "accept temperature > 0, top_p, top_k, min_p, presence_penalty "
         "and seed (default: greedy only, others a 400)"},
        {"prefill-chunk", OPT_INT, &cfg.prefill_chunk, 16, QWEN_PREFILL_CHUNK,
         "prompt tokens per prefill step: progress (/metrics, SSE comments) and cancellation between steps (default "
         "4096)"},
        {"speculative", OPT_ONOFF, &cfg.speculative, 0, 0,
         "speculative decoding: drafts from the conversation, verified "
         "several tokens a forward; the same output (default on)"},
    };
    const int nopts = sizeof opts / sizeof opts[0];
    const char *summary = "OpenAI- and Anthropic-compatible HTTP server: /v1/chat/completions, /v1/completions, "
                          "/v1/responses, /v1/messages, /v1/models, /health, /metrics, and a chat page at /";
    int ob = opts_begin(argc, argv, "serve", summary, opts, nopts);
    if (ob) return ob > 0 ? 0 : 2;
    char err[1024];
    if (!cfg.model_dir) {
        fprintf(stderr, "calla serve: --model is required\n");
        opts_usage(stderr, "serve", summary, opts, nopts);
        return 2;
    }
    if (cfg.device >= 0 && cfg.backend && strcmp(cfg.backend, "cuda")) {
        fprintf(stderr, "calla serve: --device is for the CUDA backend (--backend %s has no devices)\n", cfg.backend);
        return 2;
    }
    if (cfg.device >= 0 && !cfg.backend) cfg.backend = "cuda"; // a GPU was asked for: no quiet fall-back to the CPU
    char name[256];
    if (!cfg.model_name) {
        size_t l = strlen(cfg.model_dir);
        while (l > 1 && cfg.model_dir[l - 1] == '/') l--;
        size_t b = l;
        while (b > 0 && cfg.model_dir[b - 1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(l - b), cfg.model_dir + b);
        cfg.model_name = name;
    }
    char *model_name = NULL; // it goes into every JSON answer, which must be valid UTF-8
    size_t mlen;
    if (utf8_sanitize(cfg.model_name, strlen(cfg.model_name), &model_name, &mlen)) {
        fprintf(stderr, "calla serve: out of memory\n");
        return 1;
    }
    cfg.model_name = model_name;
    // Every connection is a socket: raise the open-file limit to what the system allows, and keep
    // --max-connections under it, with room for the connections closed to make room that MHD has
    // not closed yet (conn_headroom), the checkpoint's files, the listener and logs.
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl)) {
        if (rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            if (setrlimit(RLIMIT_NOFILE, &rl)) getrlimit(RLIMIT_NOFILE, &rl);
        }
        const long long room = 64 + 2 * cfg.http_threads;
        if (rl.rlim_cur != RLIM_INFINITY &&
            (unsigned long long)(cfg.max_connections + conn_headroom(cfg.max_connections) + room) > rl.rlim_cur) {
            long long m = 2;
            while (m < cfg.max_connections && (unsigned long long)(m + 1 + conn_headroom(m + 1) + room) <= rl.rlim_cur)
                m++;
            fprintf(stderr,
                    "calla serve: --max-connections %lld is more than the open-file limit (%llu) allows; using %lld "
                    "(raise it with ulimit -n or LimitNOFILE=)\n",
                    cfg.max_connections, (unsigned long long)rl.rlim_cur, m);
            cfg.max_connections = m;
        }
    }
    struct sockaddr_storage addr;
    if (resolve(cfg.host, (int)cfg.port, &addr, err, sizeof err)) {
        fprintf(stderr, "calla serve: %s\n", err);
        free(model_name);
        return 2;
    }

    static struct server S; // MHD and the worker hold pointers into it until the end
    struct server *sv = &S;
    memset(sv, 0, sizeof *sv);
    sv->cfg = cfg;
    pthread_mutex_init(&sv->mu, NULL);
    conn_table_init(&sv->conns, (int)cfg.max_connections, (int)cfg.max_per_ip, (double)cfg.request_timeout);
    json_object_seed(0); // before any thread makes a JSON object
    int rc = 1;
    if (rstore_init(&sv->store, (int)cfg.store_entries, (size_t)cfg.store_bytes)) {
        fprintf(stderr, "calla serve: out of memory (the response store)\n");
        goto out_engine;
    }
    if (load_keys(&sv->auth, &cfg, err, sizeof err)) {
        fprintf(stderr, "calla serve: %s\n", err);
        rc = 2;
        goto out_engine;
    }
    sv->loopback = is_loopback(&addr);
    sv->started = (long long)time(NULL);
    if (!sv->auth.n && !sv->loopback)
        fprintf(stderr,
                "calla serve: WARNING: listening on %s, which is not a loopback address, without an API key: "
                "anyone who can reach it can use the model (set --api-key or --api-key-file)\n",
                cfg.host);
    struct engine_options eo = {.backend = cfg.backend,
                                .threads = (int)cfg.threads,
                                .device = cfg.device >= 0 ? (int)cfg.device : 0,
                                .gpu_exclusive = true};
    if (engine_open(cfg.model_dir, &eo, &sv->e, err, sizeof err)) {
        fprintf(stderr, "calla serve: %s\n", err);
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        if (cvd && (!cfg.backend || !strcmp(cfg.backend, "cuda")))
            fprintf(stderr,
                    "HINT: CUDA_VISIBLE_DEVICES=\"%s\": CUDA sees only the GPUs it lists, numbered from 0, "
                    "and --device counts among them\n",
                    cvd);
        goto out_engine;
    }
    sv->vocab = engine_geometry(sv->e)->vocab;
    if (tokenizer_load(cfg.model_dir, &sv->tok, err, sizeof err)) {
        fprintf(stderr,
                "calla serve: %s\nHINT: the checkpoint directory needs a tokenizer.json (calla synth writes one)\n",
                err);
        goto out_engine;
    }
    // The token trie of constrained decoding, once per tokenizer (about 0.1 s and 10.5 MB for the real vocabulary).
    const double tt0 = now_s();
    if (token_trie_build(sv->tok, sv->vocab, &sv->trie, err, sizeof err)) {
        fprintf(stderr, "calla serve: %s\n", err);
        goto out_tok;
    }
    if (!(sv->logits = engine_logits_alloc(sv->e, (size_t)sv->vocab))) {
        fprintf(stderr, "calla serve: out of memory (a row of logits)\n");
        goto out_tok;
    }
    const char *mm = getenv("CALLA_MASK");
    // Overlap on every backend: on the CPU the helper's ~0.01 ms per step is lost in the forward,
    // and the tests then drive the server's overlap path (test_tokmask.c checks sync and off).
    sv->mask_mode = mm && *mm ? mask_mode_parse(mm) : MASK_OVERLAP;
    if (sv->mask_mode < 0) {
        fprintf(stderr, "calla serve: CALLA_MASK=%s: off, sync or overlap\n", mm);
        goto out_tok;
    }
    if (!cfg.quiet)
        fprintf(stderr, "calla serve: token trie: %d nodes, %.1f MB, built in %.0f ms; masks: %s\n",
                token_trie_nodes(sv->trie), token_trie_bytes(sv->trie) / 1e6, 1e3 * (now_s() - tt0),
                mask_mode_name(sv->mask_mode));
    sv->oc = (struct openai_ctx){.tok = sv->tok,
                                 .vocab = sv->vocab,
                                 .context = cfg.context,
                                 .default_max_tokens = cfg.default_max_tokens,
                                 .model_name = cfg.model_name,
                                 .allow_sampling = cfg.allow_sampling};
    sv->cc = (struct chatreq_ctx){.tok = sv->tok,
                                  .vocab = sv->vocab,
                                  .context = cfg.context,
                                  .default_max_tokens = cfg.default_max_tokens,
                                  .model_name = cfg.model_name,
                                  .allow_sampling = cfg.allow_sampling};
    const struct sched_config sc = {.e = sv->e,
                                    .tok = sv->tok,
                                    .trie = sv->trie,
                                    .logits = sv->logits,
                                    .vocab = sv->vocab,
                                    .mask_mode = sv->mask_mode,
                                    .context = cfg.context,
                                    .queue = cfg.queue,
                                    .prefill_chunk = cfg.prefill_chunk,
                                    .cache_entries = cfg.cache_entries,
                                    .cache_boundaries = cfg.cache_boundaries,
                                    .quiet = cfg.quiet,
                                    .speculative = cfg.speculative};
    if (sched_init(&sv->sched, &sc, err, sizeof err)) {
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
    if (sched_start(&sv->sched)) {
        fprintf(stderr, "calla serve: cannot start the worker thread\n");
        goto out_cache;
    }
    if (conn_table_start(&sv->conns)) {
        fprintf(stderr, "calla serve: cannot start the connection tick thread\n");
        goto out_worker;
    }
    // A pool of epoll loops: no callback waits (an answer not ready suspends its connection:
    // "relaying a job's answer" above), so a few threads serve tens of thousands of connections.
    // The limits are conn.c's, which closes the oldest idle connection to make room: MHD's own
    // limit (it stops accepting there) is set above it by the headroom such closes need, and its
    // per-address limit, which refuses a new connection rather than closing an idle one, is off.
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    sv->d = MHD_start_daemon(
        flags, (uint16_t)cfg.port, NULL, NULL, on_request, sv, MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)cfg.http_threads, MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)cfg.max_header + SSE_BLOCK + 16384, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(cfg.max_connections + conn_headroom((int)cfg.max_connections)), MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)cfg.timeout, MHD_OPTION_NOTIFY_CONNECTION, on_connection, sv,
#if MHD_VERSION >= 0x00097701 // 1.0: bare LF, obs-fold, NUL, Content-Length with chunked refused by MHD
        MHD_OPTION_CLIENT_DISCIPLINE_LVL, 1,
#endif
        MHD_OPTION_END);
    if (!sv->d) {
        fprintf(stderr, "calla serve: cannot listen on %s:%lld: %s\n", cfg.host, cfg.port, strerror(errno));
        goto out_worker;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(sv->d, MHD_DAEMON_INFO_BIND_PORT);
    char gpu_name[32] = "";
    if (strcmp(engine_backend(sv->e), "cpu")) snprintf(gpu_name, sizeof gpu_name, " on GPU %d", eo.device);
    fprintf(stderr,
            "calla serve: listening on http://%s%s%s:%u (model %s, backend %s%s, context %lld, queue %lld, cache "
            "%lld+%lld)\n",
            addr.ss_family == AF_INET6 ? "[" : "", cfg.host, addr.ss_family == AF_INET6 ? "]" : "",
            di ? di->port : (unsigned)cfg.port, cfg.model_name, engine_backend(sv->e), gpu_name, cfg.context, cfg.queue,
            cfg.cache_entries, cfg.cache_boundaries);
    fprintf(stderr, "calla serve: chat page: http://%s%s%s:%u/ (API: /v1, metrics: /metrics)\n",
            addr.ss_family == AF_INET6 ? "[" : "", cfg.host, addr.ss_family == AF_INET6 ? "]" : "",
            di ? di->port : (unsigned)cfg.port);
    fflush(stderr);

    // Wait for a signal, then drain: no new work; queued and running requests may finish for
    // --drain-seconds; then abort what is left (a second signal aborts at once).
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "calla serve: %s: draining (up to %lld s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            cfg.drain_seconds);
    sched_drain(&sv->sched);
    const double deadline = now_s() + (double)cfg.drain_seconds;
    for (;;) {
        if (sched_idle(&sv->sched)) break;
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
    sched_abort(&sv->sched);
    rc = 0;
out_worker:
    sched_stop(&sv->sched);
    // Every job is done now; let their answers (error events of aborted streams too) reach the
    // clients before MHD closes the sockets, for at most a few seconds.
    for (int k = 0; sv->d && k < 100; k++) {
        pthread_mutex_lock(&sv->mu);
        int open = sv->open_jobs;
        pthread_mutex_unlock(&sv->mu);
        if (!open) break;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    if (sv->d) MHD_stop_daemon(sv->d); // closes every connection; their jobs are all done, none is suspended
    if (!rc) fprintf(stderr, "calla serve: stopped\n");
out_cache:
    sched_free(&sv->sched);
out_tok:
    engine_logits_free(sv->e, sv->logits);
    token_trie_free(sv->trie);
    tokenizer_free(sv->tok);
out_engine:
    engine_close(sv->e);
    rstore_free(&sv->store);
    auth_free(&sv->auth);
    conn_table_free(&sv->conns); // after MHD: no connection is listed any more
    pthread_mutex_destroy(&sv->mu);
    free(model_name);
    return rc;
}
