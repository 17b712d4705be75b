// http_client.h: a small blocking HTTP/1.1 client for the harness's benchmarks against a running
// server (`calla agentbench`): plain HTTP over TCP, one connection per request (Connection: close).
//
// A request carries its body with Content-Length; a response is read by Content-Length, chunked
// transfer coding, or to the end of the connection. Every connect, write and read waits at most
// the request's timeout, so a server that stops answering is an error with the step named, never a
// hang. A streamed answer (text/event-stream) is split into Server-Sent Events as the bytes arrive,
// each handed to a callback with the time its last byte was read.
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct http_url {
    char host[256]; // a name or an IPv4/IPv6 literal (brackets removed)
    char port[8];
    char prefix[512]; // a path the URL gave ("" or "/base", no trailing slash), put before every request path
};

// "http://HOST[:PORT][/PREFIX]" (port 80 when none). 0, or -1 with a message (https and other
// schemes are refused: this client speaks plain HTTP only).
int http_url_parse(const char *url, struct http_url *u, char *err, size_t errlen);

// One Server-Sent Event: data is its data lines joined by "\n" (NUL-terminated), t the monotonic
// time (now_s) at which the blank line that ended it was read. Comment lines (": ...") come with
// comment set and the text after the colon. Return 0 to go on, non-zero to stop reading (the
// request then fails with the callback's message, if it left one in err).
typedef int (*http_sse_fn)(void *arg, const char *data, size_t len, bool comment, double t, char *err, size_t errlen);

struct http_request {
    const char *method;  // "GET", "POST"
    const char *path;    // "/v1/chat/completions" (after the URL's prefix)
    const char *api_key; // Authorization: Bearer KEY (NULL: none)
    const char *body;    // NULL: none
    size_t body_len;
    double timeout_s;     // each connect, write and read (<= 0: 60 s)
    size_t max_body;      // largest non-streamed body kept (0: 16 MiB); past it the request fails
    http_sse_fn on_event; // a 2xx text/event-stream answer goes here event by event (NULL: kept as body)
    void *arg;
};

struct http_response {
    int status;             // e.g. 200
    char content_type[128]; // the Content-Type header ("" when none)
    char *body;             // the body read whole (NUL-terminated; NULL when streamed): an error's JSON too
    size_t body_len;
    double t_sent;    // now_s() when the last byte of the request was written
    double t_headers; // now_s() when the response's header block had been read
    double t_done;    // now_s() when the response was read to its end
    size_t events;    // Server-Sent Events delivered (comments included)
};

// Sends the request and reads the answer. 0 whatever the status (look at resp->status), or -1 with
// a message naming the step that failed (resolve, connect, write, read, a timeout, a malformed
// answer). resp->body is malloc'd: http_response_free.
int http_do(const struct http_url *u, const struct http_request *rq, struct http_response *resp, char *err,
            size_t errlen);
void http_response_free(struct http_response *r);
