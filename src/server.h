// server.h: `calla serve`'s HTTP server (server.c): its configuration, its state, its counters.
//
// The layers of `calla serve`, top to bottom (docs/ARCHITECTURE.md):
//   server.c     the HTTP transport: libmicrohttpd callbacks, routes, limits, auth, relaying each
//                job's bytes (SSE or one body), /metrics, `calla serve` itself
//   openai.c     the OpenAI protocol: request JSON -> a job; generation events -> JSON / SSE
//   anthropic.c  Anthropic's Messages API, responses.c OpenAI's Responses API (their stored
//                responses in response_store.c), over chatreq.c and answer.c, the same way
//   scheduler.c  the queue and the one worker thread, with the session cache
//   job.c        a job: the request, the protocol's sink, the output channel, reference counts
//   generate.c   the generation loop: prefill, decode, stop rules, constraints, tool calls, logprobs
#pragma once

#include "anthropic.h"
#include "auth.h"
#include "chatreq.h"
#include "conn.h"
#include "engine.h"
#include "openai.h"
#include "response_store.h"
#include "responses.h"
#include "options.h"
#include "scheduler.h"

#include <pthread.h>
#include <stdbool.h>

enum {
    SSE_BLOCK = 4096,  // MHD read block for streamed responses
    RETRY_AFTER_S = 1, // Retry-After on 503 queue full
};

struct server_config {
    const char *model_dir, *host, *backend, *model_name;
    long long port;
    long long context;            // tokens per sequence: prompt + max_tokens + 1 must fit
    long long queue;              // waiting jobs beyond the running one; past it: 503
    long long max_body;           // request body bytes; past it: 413
    long long max_header;         // request header bytes (MHD's per-connection memory); past it: 4xx from MHD
    long long max_connections;    // open at once; past it the oldest idle one is closed (conn.h)
    long long http_threads;       // libmicrohttpd's threads (epoll each); none ever blocks
    long long cache_entries;      // LRU of end-of-request states (0: off)
    long long cache_boundaries;   // LRU of last-message-boundary snapshots (0: off)
    long long default_max_tokens; // when a request gives none (then capped by what the context has left)
    long long drain_seconds;      // on SIGTERM, how long running and queued requests may finish
    long long threads;
    long long timeout;         // idle connection timeout, seconds
    long long request_timeout; // seconds a client has to send a whole request (headers and body)
    bool quiet;
    bool allow_chunked;       // accept chunked request bodies (off: 411; docs/HTTP.md)
    bool allow_sampling;      // sampling parameters accepted (off: greedy only; docs/API.md)
    struct opt_strs api_keys; // --api-key, repeatable
    const char *api_key_file;
    struct opt_strs allowed_hosts; // --allowed-host, repeatable
    struct opt_strs cors_origins;  // --cors-origin, repeatable
    long long max_per_ip;          // connections from one address; past it its oldest idle one is closed
    long long prefill_chunk;       // prompt tokens per forward call (progress and cancellation between)
    long long device;              // --device: the GPU (CUDA's numbering, within CUDA_VISIBLE_DEVICES); -1: not given
    long long store_entries;       // the Responses API's stored responses kept, LRU (0: none)
    long long store_bytes;         // and the bytes they may hold
    bool speculative;              // speculative decoding where a request allows it (--speculative, default on)
};

// ---- metrics -----------------------------------------------------------------------------------

enum endpoint {
    EP_CHAT,
    EP_COMPLETIONS,
    EP_MESSAGES,
    EP_COUNT_TOKENS,
    EP_RESPONSES,
    EP_RESPONSE_ITEM,
    EP_MODELS,
    EP_HEALTH,
    EP_METRICS,
    EP_PAGE,
    EP_OTHER,
    EP_COUNT
};
enum { N_STATUS = 11 }; // the statuses counted one by one (server.c: status_codes)

// HTTP requests by endpoint and status (the generation counters are the scheduler's).
struct metrics {
    unsigned long long requests[EP_COUNT][N_STATUS + 1]; // last column: any other status
};

// ---- the server --------------------------------------------------------------------------------

struct server {
    struct server_config cfg;
    struct engine *e;
    struct tokenizer *tok;
    int vocab;               // the model's vocabulary (embedding rows)
    struct token_trie *trie; // the vocabulary's bytes, for constrained decoding's masks (tokmask.h)
    float *logits;           // [vocab] the worker's row of logits (engine_logits_alloc: pinned on a GPU)
    int mask_mode;           // enum mask_mode: CALLA_MASK=off|sync|overlap (default overlap)
    struct openai_ctx oc;    // what the protocol layer needs to parse a request
    struct chatreq_ctx cc;   // the same, for anthropic.c and responses.c
    struct rstore store;     // the Responses API's stored responses
    struct auth auth;        // API keys (none: open)
    struct sched sched;      // the queue and the worker

    pthread_mutex_t mu; // open_jobs, m
    int open_jobs;      // queued jobs whose request MHD has not completed (answer in flight)
    struct metrics m;
    bool loopback;     // listening on a loopback address (Host names are checked)
    long long started; // Unix time, the models' "created"
    void *d;           // the HTTP daemon (struct MHD_Daemon)

    struct conn_table conns; // open connections: limits, the request deadline, the watch over clients (conn.h)
};
