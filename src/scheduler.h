// scheduler.h: the queue and the one worker thread of `calla serve`.
//
// Jobs (job.h) are queued by the transport and run one at a time, in arrival order, by the worker,
// the only thread that touches the engine, the working sequence and the session cache
// (session_cache.h): it finds the longest cached prefix of the prompt, runs the job through
// generate (generate.h) with the job's own sink, keeps the end state, and sends the sink the end
// event with the usage.  It never names a protocol: what the events become is the sink's business.
#pragma once

#include "engine.h"
#include "job.h"
#include "session_cache.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

struct tokenizer;
struct token_trie;

struct sched_config {
    struct engine *e;
    const struct tokenizer *tok;
    const struct token_trie *trie; // constrained decoding's masks (tokmask.h)
    float *logits;                 // [vocab] the worker's row of logits (engine_logits_alloc)
    int vocab;
    int mask_mode;              // enum mask_mode
    long long context;          // tokens per sequence
    long long queue;            // waiting jobs beyond the running one; past it: 503
    long long prefill_chunk;    // prompt tokens per forward call (progress and cancellation between)
    long long cache_entries;    // LRU of end-of-request states (0: off)
    long long cache_boundaries; // LRU of last-message-boundary snapshots (0: off)
    bool quiet;                 // no per-job log line
    bool speculative;           // speculative decoding where a request allows it (gen_env.speculative)
};

// Counters for /metrics, under the scheduler's mutex.
struct sched_metrics {
    unsigned long long prompt_tokens, generated_tokens, cached_tokens, cache_hits, cache_misses, cancelled;
    unsigned long long draft_tokens, draft_accepted; // speculative decoding: drafted, and of them accepted
    double prefill_s, decode_s;
};

// A snapshot for /health and /metrics.
struct sched_status {
    int depth; // queued, not running
    bool running, draining;
    int prefill_done, prefill_total; // the running job's prefill (0, 0 when none)
    struct sched_metrics m;
};

struct sched {
    struct sched_config cfg;

    // Worker-only state.
    struct seq *w;              // the working sequence
    struct session_cache full;  // end-of-request states
    struct session_cache bound; // last-message-boundary snapshots

    pthread_mutex_t mu; // everything below
    pthread_cond_t cv;
    struct job *head, *tail;
    int depth;
    struct job *running;
    bool draining; // refuse new work
    bool stop_worker;
    struct sched_metrics m;
    int prefill_done, prefill_total;
    atomic_bool abort; // cancel everything now (read without the mutex)
    pthread_t worker;
    bool have_worker;
};

// The working sequence and the caches; 0, or -1 with a message.
int sched_init(struct sched *s, const struct sched_config *cfg, char *err, size_t errlen);
// Starts the worker thread; 0, or -1.
int sched_start(struct sched *s);
// Queues a job whose request the protocol has filled (fd: the client socket, polled for a
// hang-up); 0, or -1 with a 503 (draining, or the queue is full).
int sched_enqueue(struct sched *s, struct job *j, int fd, struct req_error *re);
// From now on new jobs are refused.
void sched_drain(struct sched *s);
// Nothing queued and nothing running.
bool sched_idle(struct sched *s);
// Cancels the running job and fails the queued ones (503).
void sched_abort(struct sched *s);
// Aborts, lets the worker finish the queue and joins it.
void sched_stop(struct sched *s);
void sched_status(struct sched *s, struct sched_status *out);
void sched_free(struct sched *s);
