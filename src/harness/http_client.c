// http_client.c: see http_client.h. One request per connection; the reading side is three layers:
// the connection's buffer (every wait bounded by the timeout), the body's framing (Content-Length,
// chunked, or to the close), and what the caller wants of the body (kept whole, or split into
// Server-Sent Events).
#include "http_client.h"

#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

enum {
    HTTP_MAX_LINE = 64 << 10,     // a status line, a header line or a chunk-size line
    HTTP_MAX_HEADERS = 256 << 10, // the whole header block
    HTTP_MAX_EVENT = 64 << 20,    // one Server-Sent Event's data
    HTTP_DEFAULT_MAX_BODY = 16 << 20,
};

int http_url_parse(const char *url, struct http_url *u, char *err, size_t errlen) {
    memset(u, 0, sizeof *u);
    static const char scheme[] = "http://";
    if (strncasecmp(url, scheme, sizeof scheme - 1))
        return snprintf(err, errlen, "--url \"%s\": only plain http://HOST[:PORT] URLs are supported", url), -1;
    const char *p = url + sizeof scheme - 1, *host_end, *after;
    if (*p == '[') { // an IPv6 literal
        host_end = strchr(p, ']');
        if (!host_end) return snprintf(err, errlen, "--url \"%s\": unclosed [ in the host", url), -1;
        p++;
        after = host_end + 1;
    } else {
        host_end = p + strcspn(p, ":/");
        after = host_end;
    }
    size_t hl = (size_t)(host_end - p);
    if (!hl || hl >= sizeof u->host) return snprintf(err, errlen, "--url \"%s\": no host, or a host too long", url), -1;
    memcpy(u->host, p, hl);
    snprintf(u->port, sizeof u->port, "80");
    if (*after == ':') {
        char *end;
        long port = strtol(after + 1, &end, 10);
        if (end == after + 1 || port < 1 || port > 65535 || (*end && *end != '/'))
            return snprintf(err, errlen, "--url \"%s\": the port must be 1..65535", url), -1;
        snprintf(u->port, sizeof u->port, "%ld", port);
        after = end;
    }
    if (*after && *after != '/') return snprintf(err, errlen, "--url \"%s\": unexpected \"%s\"", url, after), -1;
    size_t pl = strlen(after);
    while (pl && after[pl - 1] == '/') pl--;
    if (pl >= sizeof u->prefix) return snprintf(err, errlen, "--url \"%s\": the path is too long", url), -1;
    memcpy(u->prefix, after, pl);
    return 0;
}

// ---- the connection --------------------------------------------------------------------------

struct conn {
    int fd;
    double timeout_s;
    char buf[16384];
    size_t pos, len;
    double t_read; // now_s() after the last recv that returned bytes
};

// Waits until fd is ready for ev, at most timeout_s. 0, or -1 naming what it was waiting for.
static int wait_fd(int fd, short ev, double timeout_s, const char *what, char *err, size_t errlen) {
    double deadline = now_s() + timeout_s;
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return snprintf(err, errlen, "timed out after %.0f s %s", timeout_s, what), -1;
        struct pollfd pf = {.fd = fd, .events = ev};
        int r = poll(&pf, 1, (int)ceil(left * 1e3));
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return snprintf(err, errlen, "poll %s: %s", what, strerror(errno)), -1;
    }
}

static int conn_open(struct conn *c, const struct http_url *u, double timeout_s, char *err, size_t errlen) {
    c->fd = -1;
    c->timeout_s = timeout_s;
    c->pos = c->len = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(u->host, u->port, &hints, &res);
    if (g) return snprintf(err, errlen, "cannot resolve %s: %s", u->host, gai_strerror(g)), -1;
    char last[256] = "no address";
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            snprintf(last, sizeof last, "socket: %s", strerror(errno));
            continue;
        }
        int r = connect(fd, a->ai_addr, a->ai_addrlen);
        if (r && errno == EINPROGRESS) {
            char werr[128];
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (wait_fd(fd, POLLOUT, timeout_s, "connecting", werr, sizeof werr)) {
                snprintf(last, sizeof last, "%s", werr);
                close(fd);
                continue;
            }
            r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr ? -1 : 0;
            if (soerr) errno = soerr;
        }
        if (r) {
            snprintf(last, sizeof last, "%s", strerror(errno));
            close(fd);
            continue;
        }
        int one = 1; // requests are small and written whole: no Nagle delay on them
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->fd = fd;
        break;
    }
    freeaddrinfo(res);
    if (c->fd < 0) return snprintf(err, errlen, "cannot connect to %s:%s: %s", u->host, u->port, last), -1;
    return 0;
}

static int conn_send(struct conn *c, const char *p, size_t n, char *err, size_t errlen) {
    while (n) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w, n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(c->fd, POLLOUT, c->timeout_s, "writing the request", err, errlen)) return -1;
            continue;
        }
        return snprintf(err, errlen, "writing the request: %s", w < 0 ? strerror(errno) : "nothing written"), -1;
    }
    return 0;
}

// Makes bytes available in c->buf[pos..len). 1, 0 at the end of the connection, or -1.
static int conn_fill(struct conn *c, char *err, size_t errlen) {
    if (c->pos < c->len) return 1;
    c->pos = c->len = 0;
    for (;;) {
        ssize_t r = recv(c->fd, c->buf, sizeof c->buf, 0);
        if (r > 0) {
            c->len = (size_t)r;
            c->t_read = now_s();
            return 1;
        }
        if (r == 0) return 0;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return snprintf(err, errlen, "reading: %s", strerror(errno)), -1;
        if (wait_fd(c->fd, POLLIN, c->timeout_s, "waiting for the server", err, errlen)) return -1;
    }
}

// One line ending in LF (a CR before it is dropped) into *line. 1, 0 at the end of the connection
// before any byte, or -1 (a line longer than max, or the connection ending inside it).
static int conn_line(struct conn *c, struct sbuf *line, size_t max, const char *what, char *err, size_t errlen) {
    line->len = 0;
    if (line->p) line->p[0] = 0;
    for (;;) {
        int f = conn_fill(c, err, errlen);
        if (f < 0) return -1;
        if (!f) {
            if (!line->len) return 0;
            return snprintf(err, errlen, "the connection closed inside %s", what), -1;
        }
        char *nl = memchr(c->buf + c->pos, '\n', c->len - c->pos);
        size_t take = nl ? (size_t)(nl - (c->buf + c->pos)) : c->len - c->pos;
        if (line->len + take > max) return snprintf(err, errlen, "%s is longer than %zu bytes", what, max), -1;
        if (sbuf_add(line, c->buf + c->pos, take)) return snprintf(err, errlen, "out of memory"), -1;
        c->pos += take + (nl ? 1 : 0);
        if (nl) {
            if (line->len && line->p[line->len - 1] == '\r') line->p[--line->len] = 0;
            return 1;
        }
    }
}

// ---- the body's framing ----------------------------------------------------------------------

enum framing { FRAMING_NONE, FRAMING_LENGTH, FRAMING_CHUNKED, FRAMING_CLOSE };

struct body {
    struct conn *c;
    enum framing f;
    unsigned long long left; // bytes left of the body (LENGTH) or of the current chunk (CHUNKED)
    bool started, done;      // CHUNKED: a chunk was read; the last one and the trailers were
    struct sbuf line;
};

// Reads a chunk-size line ("1a3f[;extension]"). 0, or -1.
static int chunk_size(struct body *b, char *err, size_t errlen) {
    if (b->started) { // the CRLF after the previous chunk's data
        int r = conn_line(b->c, &b->line, 2, "a chunk's end", err, errlen);
        if (r <= 0 || b->line.len)
            return r < 0 ? -1 : snprintf(err, errlen, "malformed chunked body: no CRLF after a chunk"), -1;
    }
    b->started = true;
    int r = conn_line(b->c, &b->line, HTTP_MAX_LINE, "a chunk-size line", err, errlen);
    if (r <= 0) return r < 0 ? -1 : snprintf(err, errlen, "the connection closed before the chunked body's end"), -1;
    const char *s = b->line.p;
    unsigned long long v = 0;
    int digits = 0;
    for (; isxdigit((unsigned char)*s); s++, digits++) {
        if (v > (ULLONG_MAX >> 4)) return snprintf(err, errlen, "malformed chunked body: a chunk size overflows"), -1;
        v = v * 16 +
            (unsigned long long)(isdigit((unsigned char)*s) ? *s - '0' : (tolower((unsigned char)*s) - 'a' + 10));
    }
    while (*s == ' ' || *s == '\t') s++;
    if (!digits || (*s && *s != ';'))
        return snprintf(err, errlen, "malformed chunked body: chunk-size line \"%.40s\"", b->line.p), -1;
    b->left = v;
    if (v == 0) { // the last chunk: trailer lines until an empty one
        for (;;) {
            r = conn_line(b->c, &b->line, HTTP_MAX_LINE, "a trailer line", err, errlen);
            if (r < 0) return -1;
            if (r == 0 || b->line.len == 0) break;
        }
        b->done = true;
    }
    return 0;
}

// The next piece of the decoded body: *p, *n into the connection's buffer. 1, 0 at its end, or -1.
static int body_next(struct body *b, const char **p, size_t *n, char *err, size_t errlen) {
    if (b->f == FRAMING_NONE || b->done) return 0;
    if (b->f == FRAMING_CHUNKED && b->left == 0) {
        if (chunk_size(b, err, errlen)) return -1;
        if (b->done) return 0;
    }
    if (b->f == FRAMING_LENGTH && b->left == 0) {
        b->done = true;
        return 0;
    }
    int f = conn_fill(b->c, err, errlen);
    if (f < 0) return -1;
    if (!f) {
        if (b->f == FRAMING_CLOSE) {
            b->done = true;
            return 0;
        }
        return snprintf(err, errlen, "the connection closed before the body's end (%llu bytes missing%s)", b->left,
                        b->f == FRAMING_CHUNKED ? " of a chunk" : ""),
               -1;
    }
    size_t have = b->c->len - b->c->pos;
    if (b->f != FRAMING_CLOSE && have > b->left) have = (size_t)b->left;
    *p = b->c->buf + b->c->pos;
    *n = have;
    b->c->pos += have;
    if (b->f != FRAMING_CLOSE) b->left -= have;
    return 1;
}

// ---- Server-Sent Events ----------------------------------------------------------------------

struct sse {
    struct sbuf line, data;
    bool has_data;
    http_sse_fn fn;
    void *arg;
    size_t events;
};

// One complete line of the stream (without its line end). 0, or -1 (the callback stopped it).
static int sse_line(struct sse *s, const char *l, size_t n, double t, char *err, size_t errlen) {
    if (!n) { // a blank line ends the event
        if (!s->has_data) return 0;
        if (s->data.len && s->data.p[s->data.len - 1] == '\n') s->data.p[--s->data.len] = 0;
        s->events++;
        int r = s->fn(s->arg, s->data.p ? s->data.p : "", s->data.len, false, t, err, errlen);
        s->data.len = 0;
        if (s->data.p) s->data.p[0] = 0;
        s->has_data = false;
        return r ? -1 : 0;
    }
    if (l[0] == ':') {
        size_t k = n > 1 && l[1] == ' ' ? 2 : 1;
        char tmp[256];
        size_t m = n - k < sizeof tmp - 1 ? n - k : sizeof tmp - 1;
        memcpy(tmp, l + k, m);
        tmp[m] = 0;
        s->events++;
        return s->fn(s->arg, tmp, m, true, t, err, errlen) ? -1 : 0;
    }
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    if (fl != 4 || memcmp(l, "data", 4)) return 0; // event, id, retry: not used by these servers' answers
    const char *v = colon ? colon + 1 : l + n;
    if (v < l + n && *v == ' ') v++;
    size_t vl = (size_t)(l + n - v);
    if (s->data.len + vl + 1 > HTTP_MAX_EVENT)
        return snprintf(err, errlen, "a Server-Sent Event is longer than %d bytes", HTTP_MAX_EVENT), -1;
    if (sbuf_add(&s->data, v, vl) || sbuf_add(&s->data, "\n", 1)) return snprintf(err, errlen, "out of memory"), -1;
    s->has_data = true;
    return 0;
}

static int sse_feed(struct sse *s, const char *p, size_t n, double t, char *err, size_t errlen) {
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        if (s->line.len + take > HTTP_MAX_EVENT)
            return snprintf(err, errlen, "a Server-Sent Event line is longer than %d bytes", HTTP_MAX_EVENT), -1;
        if (sbuf_add(&s->line, p, take)) return snprintf(err, errlen, "out of memory"), -1;
        p += take + (nl ? 1 : 0);
        n -= take + (nl ? 1 : 0);
        if (!nl) break;
        size_t ll = s->line.len;
        if (ll && s->line.p[ll - 1] == '\r') ll--;
        if (sse_line(s, s->line.p ? s->line.p : "", ll, t, err, errlen)) return -1;
        s->line.len = 0;
    }
    return 0;
}

// ---- the request -----------------------------------------------------------------------------

// Status line and headers. 0, or -1.
static int read_head(struct conn *c, struct http_response *resp, struct body *b, const char *method, char *err,
                     size_t errlen) {
    struct sbuf *line = &b->line;
    for (;;) { // 1xx answers (100 Continue) come before the real one
        int r = conn_line(c, line, HTTP_MAX_LINE, "the status line", err, errlen);
        if (r <= 0) return r < 0 ? -1 : snprintf(err, errlen, "the server closed the connection without an answer"), -1;
        int major, minor, status;
        if (sscanf(line->p, "HTTP/%d.%d %3d", &major, &minor, &status) != 3 || major != 1 || status < 100 ||
            status > 999)
            return snprintf(err, errlen, "not an HTTP/1.x status line: \"%.80s\"", line->p), -1;
        resp->status = status;
        bool chunked = false, have_len = false;
        unsigned long long len = 0;
        size_t total = 0;
        for (;;) {
            r = conn_line(c, line, HTTP_MAX_LINE, "a header line", err, errlen);
            if (r <= 0) return r < 0 ? -1 : snprintf(err, errlen, "the connection closed inside the headers"), -1;
            if (!line->len) break;
            if ((total += line->len) > HTTP_MAX_HEADERS)
                return snprintf(err, errlen, "the answer's headers exceed %d bytes", HTTP_MAX_HEADERS), -1;
            char *colon = strchr(line->p, ':');
            if (!colon) return snprintf(err, errlen, "malformed header line \"%.80s\"", line->p), -1;
            *colon = 0;
            char *v = colon + 1;
            while (*v == ' ' || *v == '\t') v++;
            size_t vl = strlen(v);
            while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) v[--vl] = 0;
            if (!strcasecmp(line->p, "Content-Length")) {
                char *end;
                errno = 0;
                unsigned long long x = strtoull(v, &end, 10);
                if (end == v || *end || errno || (have_len && x != len))
                    return snprintf(err, errlen, "malformed or conflicting Content-Length \"%.40s\"", v), -1;
                have_len = true, len = x;
            } else if (!strcasecmp(line->p, "Transfer-Encoding")) {
                if (strcasecmp(v, "chunked"))
                    return snprintf(err, errlen, "unsupported Transfer-Encoding \"%.40s\"", v), -1;
                chunked = true;
            } else if (!strcasecmp(line->p, "Content-Type")) {
                snprintf(resp->content_type, sizeof resp->content_type, "%s", v);
            }
        }
        if (status >= 100 && status < 200) continue;
        b->c = c;
        b->f = chunked ? FRAMING_CHUNKED : have_len ? FRAMING_LENGTH : FRAMING_CLOSE;
        b->left = chunked ? 0 : len;
        if (status == 204 || status == 304 || !strcmp(method, "HEAD")) b->f = FRAMING_NONE;
        return 0;
    }
}

static bool is_event_stream(const char *ct) {
    return !strncasecmp(ct, "text/event-stream", 17);
}

int http_do(const struct http_url *u, const struct http_request *rq, struct http_response *resp, char *err,
            size_t errlen) {
    memset(resp, 0, sizeof *resp);
    double timeout = rq->timeout_s > 0 ? rq->timeout_s : 60;
    size_t max_body = rq->max_body ? rq->max_body : HTTP_DEFAULT_MAX_BODY;
    struct conn c;
    struct body b = {0};
    struct sse s = {.fn = rq->on_event, .arg = rq->arg};
    struct sbuf head = {0}, whole = {0};
    int rc = -1;
    if (conn_open(&c, u, timeout, err, errlen)) return -1;
    bool v6 = strchr(u->host, ':') != NULL;
    sbuf_adds(&head, rq->method);
    sbuf_adds(&head, " ");
    sbuf_adds(&head, u->prefix);
    sbuf_adds(&head, rq->path);
    sbuf_adds(&head, " HTTP/1.1\r\nHost: ");
    sbuf_adds(&head, v6 ? "[" : "");
    sbuf_adds(&head, u->host);
    sbuf_adds(&head, v6 ? "]:" : ":");
    sbuf_adds(&head, u->port);
    sbuf_adds(&head, "\r\nUser-Agent: calla-agentbench\r\nAccept: */*\r\nConnection: close\r\n");
    if (rq->api_key) {
        sbuf_adds(&head, "Authorization: Bearer ");
        sbuf_adds(&head, rq->api_key);
        sbuf_adds(&head, "\r\n");
    }
    if (rq->body) {
        char cl[64];
        snprintf(cl, sizeof cl, "Content-Type: application/json\r\nContent-Length: %zu\r\n", rq->body_len);
        sbuf_adds(&head, cl);
    }
    if (sbuf_adds(&head, "\r\n")) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (conn_send(&c, head.p, head.len, err, errlen) ||
        (rq->body && conn_send(&c, rq->body, rq->body_len, err, errlen)))
        goto out;
    resp->t_sent = now_s();
    if (read_head(&c, resp, &b, rq->method, err, errlen)) goto out;
    resp->t_headers = now_s();
    bool stream = rq->on_event && resp->status >= 200 && resp->status < 300 && is_event_stream(resp->content_type);
    for (;;) {
        const char *p;
        size_t n;
        int r = body_next(&b, &p, &n, err, errlen);
        if (r < 0) goto out;
        if (!r) break;
        if (stream) {
            if (sse_feed(&s, p, n, c.t_read, err, errlen)) goto out;
        } else {
            if (whole.len + n > max_body) {
                snprintf(err, errlen, "the answer's body exceeds %zu bytes", max_body);
                goto out;
            }
            if (sbuf_add(&whole, p, n)) {
                snprintf(err, errlen, "out of memory");
                goto out;
            }
        }
    }
    if (stream && s.line.len && sse_line(&s, s.line.p, s.line.len, c.t_read, err, errlen)) goto out;
    resp->t_done = now_s();
    resp->events = s.events;
    if (!stream) {
        if (sbuf_reserve(&whole, 0)) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
        resp->body = whole.p;
        resp->body_len = whole.len;
        whole.p = NULL;
    }
    rc = 0;
out:
    close(c.fd);
    sbuf_free(&head);
    sbuf_free(&whole);
    sbuf_free(&b.line);
    sbuf_free(&s.line);
    sbuf_free(&s.data);
    return rc;
}

void http_response_free(struct http_response *r) {
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
}
