// server.h: the parts of `calla serve` and the contracts between them.
//
//   server.c     HTTP transport: libmicrohttpd callbacks, routes, limits, auth, SSE relay,
//                metrics, `calla serve` itself
//   openai.c     the OpenAI protocol as pure functions: request JSON -> a job (prompt tokens,
//                limits, stop strings), results -> response JSON and SSE chunks; no sockets
//   scheduler.c  the queue and the one worker thread that drives the engine, with the session
//                cache and constrained decoding (picking each token of a constrained answer)
//   toolcall.c   tools: Python-exact tojson for the template, the incremental tool-call parser
//   tokmask.c    the masks of constrained decoding: the vocabulary's byte trie walked from the matcher's state
//   constrain.c  structured output: JSON Schema subset (and the tool-call grammar) -> a matcher
//   auth.c       API keys
//   web/         the chat page served at / (HTML, CSS, JavaScript; compiled in, see web.h)
//
// A job is shared by its connection and the worker (reference counted, one mutex each).
#pragma once

#include "auth.h"
#include "engine.h"
#include "options.h"
#include "session_cache.h"
#include "tokenizer.h"
#include "constrain.h"
#include "tokmask.h"
#include "toolcall.h"
#include "util.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ---- limits and defaults -----------------------------------------------------------------------

enum {
    MAX_STOPS = 4,            // OpenAI's limit on `stop`
    MAX_STOP_BYTES = 256,     // per stop string
    SSE_BLOCK = 4096,         // MHD read block for streamed responses
    RETRY_AFTER_S = 1,        // Retry-After on 503 queue full
    MAX_TOP_LOGPROBS = 20,    // OpenAI's limit on top_logprobs
    MAX_TOOLS = 128,          // OpenAI's limit on tools
    MAX_SESSION_ID = 128,     // X-Session-Id / `user` bytes mirrored into the response (balancer affinity)
};

// The log-probability of a generated token and of the most likely alternatives.
struct token_lp {
    int32_t id;
    float lp;
    int n_top;
    int32_t top_id[MAX_TOP_LOGPROBS];   // most likely first (lowest id on ties)
    float top_lp[MAX_TOP_LOGPROBS];
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
    long long request_timeout;    // seconds a client has to send a whole request (headers and body)
    bool quiet;
    bool allow_chunked;           // accept chunked request bodies (off: 411; docs/HTTP.md)
    struct opt_strs api_keys;     // --api-key, repeatable
    const char *api_key_file;
    struct opt_strs allowed_hosts; // --allowed-host, repeatable
    struct opt_strs cors_origins;  // --cors-origin, repeatable
    long long max_per_ip;         // connections from one address
    long long prefill_chunk;      // prompt tokens per forward call (progress and cancellation between)
    long long device;             // --device: the GPU (CUDA's numbering, within CUDA_VISIBLE_DEVICES); -1: not given
};

// ---- metrics -----------------------------------------------------------------------------------

enum endpoint { EP_CHAT, EP_COMPLETIONS, EP_MODELS, EP_HEALTH, EP_METRICS, EP_PAGE, EP_OTHER, EP_COUNT };
enum { N_STATUS = 11 };   // the statuses counted one by one (server.c: status_codes)

struct metrics {
    unsigned long long requests[EP_COUNT][N_STATUS + 1];   // last column: any other status
    unsigned long long prompt_tokens, generated_tokens, cached_tokens, cache_hits, cache_misses, cancelled;
    double prefill_s, decode_s;
};

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
    bool tools;             // the text goes through the job's tool-call parser
};

// ---- jobs --------------------------------------------------------------------------------------

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
    int logprobs;                   // -1: off; else top_logprobs per token (0..MAX_TOP_LOGPROBS)
    const struct tokenizer *tok;    // token text for logprobs
    json_t *tools;                  // the request's tools when calls are parsed from the output (else NULL)
    struct tool_parser tp;          // with tools: the answer's text -> content and calls
    struct channel *tool_ch;        // the channel the parser's content goes to
    json_t *calls;                  // the calls found (OpenAI tool_calls), or NULL
    struct cschema *schema;         // response_format json_object / json_schema: the answer is constrained
    int32_t *prompt;
    int n_prompt;
    int boundary;                   // tokens up to the last message boundary (0: none)
    int max_tokens;
    char *stops[MAX_STOPS];
    size_t stop_len[MAX_STOPS];
    int n_stops;
    char id[48];
    char session[MAX_SESSION_ID + 1];   // the request's `user`, when it can be a header value ("": none)
    long long created;
    const char *model_name;
    double t_queued;
    atomic_bool *abort;             // the server's "cancel everything"

    // Shared state, under mu.
    int fd;                         // the client socket; -1 once MHD has closed it
    enum job_state state;
    bool cancel;                    // the client went away (or the server is aborting)
    bool probed;                    // streaming: the client's end of stream was seen and a comment sent
    struct sbuf sse;                // streamed bytes produced by the worker...
    size_t sse_off;                 // ...and consumed by MHD

    // Results, written by the worker before state = JOB_DONE.
    struct sbuf content, reasoning_text;
    const char *finish;             // "stop" or "length"; NULL on failure
    int status;                     // HTTP status of a failure (0: success)
    char errmsg[512];
    int32_t *gen;                   // [n_gen] generated ids, the stop token included
    int n_gen, n_cached;
    struct token_lp *lps;           // [n_lps] per generated token, the closing stop token excluded
    int n_lps, lps_cap;
    int lps_sent;                   // streaming: entries already sent
    double queue_ms, prefill_ms, decode_ms;

    struct job *next;               // queue link
};

struct job *job_new(void);
void job_ref(struct job *j);
void job_unref(struct job *j);

// ---- the OpenAI protocol (openai.c) ------------------------------------------------------------

// A 4xx/5xx for the client: status, the offending parameter (a static string or NULL), message.
struct req_error {
    int status;
    const char *param;
    char msg[512];
};

// Fills re and returns -1.
int bad(struct req_error *re, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// What parsing a request needs from the server.
struct openai_ctx {
    const struct tokenizer *tok;
    int vocab;                       // token ids must be below it
    long long context;               // prompt + max_tokens + 1 must fit
    long long default_max_tokens;    // when the request gives none
    const char *model_name;
};

// nbytes random bytes as 2 * nbytes hex digits into out (ids: unique across restarts).
void random_hex(char *out, int nbytes);
// {"error": {"message", "type", "param", "code"}} for a status.
json_t *error_body(int status, const char *param, const char *msg);
// Sampling parameters: only the values that mean greedy pass.
int check_greedy(const json_t *body, struct req_error *re);
// A chat request's messages and tools -> the prompt text (malloc'd) and the byte offset where the
// last message starts; sets j->reasoning and j->tools.
// *markup (if not NULL): which bytes may hold added tokens (chat_render_markup).
int openai_render_chat(const json_t *body, struct job *j, char **out, unsigned char **markup, size_t *len,
                       size_t *boundary, struct req_error *re);
// Starts the job's tool-call parser (j->tools set): the answer channel's text goes through it.
void openai_job_tools(struct job *j);
// Can s be a session key (X-Session-Id, or `user` mirrored into it)?  1 to MAX_SESSION_ID visible
// ASCII characters: a header value as it is, and a key a balancer hashes the same everywhere.
bool session_id_valid(const char *s, size_t len);
// A request body -> a job ready to queue (prompt tokens, limits, stops), or NULL and re.
struct job *openai_parse_request(const struct openai_ctx *oc, enum endpoint ep, const char *data, size_t len,
                                 struct req_error *re);

// Adds text to a channel; emits what can no longer change (as SSE deltas when streaming).
// final: the channel ends here.  Returns true when a stop string was found (the text is cut
// before it; generation ends).
bool channel_push(struct job *j, struct channel *ch, const char *text, size_t len, bool final);
// Streaming: appends one event ("data: ...\n\n") to the job's SSE buffer.
void job_sse(struct job *j, const char *data, size_t len);
// Streaming: appends an SSE comment (": text\n\n"), which clients ignore: prefill progress.
void job_sse_comment(struct job *j, const char *text);
void job_sse_json(struct job *j, json_t *o);
// Streaming: the first chunk (the role), and the end (finish chunk, usage, or an error; [DONE]).
void stream_begin(struct job *j);
void stream_end(struct job *j);
// Log-softmax of logits[0..vocab) for the chosen token and the k most likely ones.
void logprobs_of(const float *logits, int vocab, int32_t chosen, int k, struct token_lp *out);
// Appends one token's logprobs to the job; 0, or -1 when out of memory.
int job_add_logprobs(struct job *j, const float *logits, int vocab, int32_t chosen);
// The whole non-streamed answer.
json_t *completion_json(const struct job *j);

// ---- the scheduler (scheduler.c) ---------------------------------------------------------------

// ---- the server --------------------------------------------------------------------------------

struct server {
    struct server_config cfg;
    struct engine *e;
    struct tokenizer *tok;
    int vocab;                      // the model's vocabulary (embedding rows)
    struct token_trie *trie;        // the vocabulary's bytes, for constrained decoding's masks (tokmask.h)
    float *logits;                  // [vocab] the worker's row of logits (engine_logits_alloc: pinned on a GPU)
    int mask_mode;                  // enum mask_mode: CALLA_MASK=off|sync|overlap (default overlap)
    struct openai_ctx oc;           // what the protocol layer needs to parse a request
    struct auth auth;               // API keys (none: open)

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
    bool loopback;                  // listening on a loopback address (Host names are checked)
    long long started;              // Unix time, the models' "created"
    struct metrics m;
    int prefill_done, prefill_total;   // the running request's prefill (0, 0 when none)

    pthread_t worker;
    void *d;                        // the HTTP daemon (struct MHD_Daemon)

    // Open connections, for the request deadline (server.c: struct conn, reaper).
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv;
    struct conn *conns;             // doubly linked, under conn_mu
    bool stop_reaper;               // under conn_mu
    bool have_reaper;
    pthread_t reaper;
};


// Queues a parsed job (fd: the client socket, polled for a hang-up); 0, or -1 with a 503.
int sched_enqueue(struct server *sv, struct job *j, int fd, struct req_error *re);
void *sched_worker_main(void *sv);
