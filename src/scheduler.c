// scheduler.c: the queue and the worker of `calla serve`.
//
// The worker is the only thread that touches the engine, the working sequence and the session
// cache; it runs jobs one at a time in arrival (queue) order.  A client that goes away is
// noticed between prefill chunks and decode steps: the worker polls the client socket for a
// reset (a half-close after the request is not leaving: the client may still read), and the
// transport marks the job cancelled when a write fails or the connection ends early.
#include "server.h"

#include "chat.h"

#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- jobs --------------------------------------------------------------------------------------

struct job *job_new(void) {
    struct job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->fd = -1;
    return j;
}

void job_ref(struct job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void job_unref(struct job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int r = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (r) return;
    free(j->prompt);
    free(j->gen);
    free(j->lps);
    json_decref(j->tools);
    json_decref(j->calls);
    tool_parser_free(&j->tp);
    constrain_free(j->schema);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    sbuf_free(&j->sse);
    sbuf_free(&j->content);
    sbuf_free(&j->reasoning_text);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}


// ---- the worker --------------------------------------------------------------------------------

static bool job_cancelled(void *arg) {
    struct job *j = arg;
    if (atomic_load(j->abort)) return true;
    pthread_mutex_lock(&j->mu);
    bool probe = false;
    if (!j->cancel && j->fd >= 0) {
        // A reset (or a socket gone) means the client left; a half-close (shutdown(SHUT_WR) after
        // the request, POLLRDHUP) does not by itself: the client may still be reading.  A client
        // that closed its socket is told apart by a write: its system answers it with a reset.  A
        // stream may write nothing for many steps (text held back, e.g. an unfinished UTF-8
        // sequence), so once the client's end of stream is seen it gets one SSE comment, which
        // clients ignore: a closed client's reset is then seen at the next step.
        struct pollfd pf = {.fd = j->fd, .events = POLLRDHUP};
        if (poll(&pf, 1, 0) > 0) {
            if (pf.revents & (POLLHUP | POLLERR | POLLNVAL)) j->cancel = true;
            else if ((pf.revents & POLLRDHUP) && j->stream && !j->probed) probe = j->probed = true;
        }
    }
    bool c = j->cancel;
    pthread_mutex_unlock(&j->mu);
    if (probe) job_sse_comment(j, "are you there");
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

// A prefill of several chunks reports its progress in /metrics and, when streaming, as SSE
// comments (": prefill DONE/TOTAL"), the first before any work: a client sees bytes at once and
// after every chunk, however long the prompt.
struct progress_ctx {
    struct server *sv;
    struct job *j;
};
static void prefill_progress(void *arg, int done, int total) {
    const struct progress_ctx *p = arg;
    pthread_mutex_lock(&p->sv->mu);
    p->sv->prefill_done = done;
    p->sv->prefill_total = total;
    pthread_mutex_unlock(&p->sv->mu);
    if (p->j->stream) {
        char text[64];
        snprintf(text, sizeof text, "prefill %d/%d", done, total);
        job_sse_comment(p->j, text);
    }
}

// Forward tokens into the working sequence; ENGINE_OK, ENGINE_CANCELLED or ENGINE_ERROR (job failed).
// logits (NULL: not wanted) gets the last row's logits.
static int forward(struct server *sv, struct job *j, const int32_t *t, int n, int32_t *next, float *logits) {
    if (job_cancelled(j)) return ENGINE_CANCELLED;
    char err[256];
    const int last = n - 1, chunk = (int)sv->cfg.prefill_chunk;
    struct progress_ctx pc = {sv, j};
    const bool multi = n > chunk;   // single steps and one-chunk prompts report nothing
    struct forward_opts fo = {.cancelled = job_cancelled, .cancel_arg = j, .logit_rows = logits ? &last : NULL,
                              .n_logit_rows = logits ? 1 : 0, .logits = logits, .chunk = chunk,
                              .progress = multi ? prefill_progress : NULL, .progress_arg = &pc};
    if (multi) prefill_progress(&pc, 0, n);
    int rc = engine_forward(sv->e, sv->w, t, n, &fo, next, err, sizeof err);
    if (multi) {
        pthread_mutex_lock(&sv->mu);
        sv->prefill_done = sv->prefill_total = 0;
        pthread_mutex_unlock(&sv->mu);
    }
    if (rc == ENGINE_ERROR) job_fail(j, 500, "engine: %s", err);
    return rc;
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
    // The last row's logits, when logprobs are wanted or the answer is constrained.
    const bool want_logits = j->logprobs >= 0 || j->schema;
    float *logits = want_logits ? sv->logits : NULL;
    struct constrained con = {0};
    if ((want_logits && !logits) ||
        (j->schema && constrained_init(&con, j->schema, sv->tok, sv->trie, (enum mask_mode)sv->mask_mode)))
        job_fail(j, 500, "out of memory"), rc = ENGINE_ERROR;

    // Session cache: the longest entry whose tokens are a prefix of the prompt.
    // With logprobs the last prompt token must run (its logits give the first token's), so an
    // entry may cover at most n - 1 tokens.
    const int usable = want_logits ? n - 1 : n;
    struct cache_entry *full = scache_lookup(&sv->full, P, usable), *bnd = scache_lookup(&sv->bound, P, usable);
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
        rc = forward(sv, j, P + pos, j->boundary - pos, &bnext, NULL);
        if (rc == ENGINE_OK) {
            pos = j->boundary;
            if (scache_store_copy(&sv->bound, sv->w, P, pos, bnext, err, sizeof err))
                fprintf(stderr, "calla serve: session cache: %s\n", err);
        }
    }
    if (j->schema && !j->reasoning && rc == ENGINE_OK) constrained_prepare(&con);   // the first mask, during the prefill
    if (rc == ENGINE_OK && !have_tok) rc = forward(sv, j, P + pos, n - pos, &tok, logits);
    const double t1 = now_s();
    j->prefill_ms = 1e3 * (t1 - t0);

    // Decode.
    struct channel content = {.total = &j->content, .field = j->chat ? "content" : "text", .tools = j->tools != NULL};
    struct channel reasoning = {.total = &j->reasoning_text, .field = "reasoning_content", .strip_lead_nl = true,
                                .trim_trail_nl = true};
    struct channel *ch = j->reasoning ? &reasoning : &content;
    struct tokenizer_stream ts;
    tokenizer_stream_init(&ts, sv->tok, 1);
    int32_t *gen = j->gen = malloc(sizeof *gen * (size_t)(j->max_tokens + 1));
    if (!gen && rc == ENGINE_OK) job_fail(j, 500, "out of memory"), rc = ENGINE_ERROR;
    int ng = 0;
    bool eos = false, stop_str = false;
    if (rc == ENGINE_OK && j->stream) stream_begin(j);   // with the first token (TTFT)
    while (rc == ENGINE_OK) {
        if (j->schema && ch == &content) tok = constrained_pick(&con, logits, tok, j->max_tokens - ng);   // the answer only
        gen[ng++] = tok;
        if (chat_is_stop(tok)) {
            eos = true;
            break;
        }
        if (logits && job_add_logprobs(j, logits, sv->vocab, tok)) {
            job_fail(j, 500, "out of memory"), rc = ENGINE_ERROR;
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
        // The next step's mask depends on tok only: on the helper thread while the step runs.
        if (j->schema && ch == &content) constrained_prepare(&con);
        rc = forward(sv, j, &tok, 1, &tok, logits);
    }
    if (rc == ENGINE_OK) {
        if (!stop_str) {   // flush what the decoder and the channel still hold
            const char *tail;
            size_t tl;
            tokenizer_stream_flush(&ts, &tail, &tl);
            stop_str = channel_push(j, ch, tail, tl, true);
        }
        j->finish = j->calls ? "tool_calls" : eos || stop_str ? "stop" : "length";
    }
    tokenizer_stream_free(&ts);
    constrained_free(&con);
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

void *sched_worker_main(void *arg) {
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

int sched_enqueue(struct server *sv, struct job *j, int fd, struct req_error *re) {
    j->fd = fd;
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
    char hex[25];
    random_hex(hex, 12);   // unique across restarts, unlike a counter
    snprintf(j->id, sizeof j->id, "%s-%s", j->chat ? "chatcmpl" : "cmpl", hex);
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
