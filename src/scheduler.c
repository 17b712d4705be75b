// scheduler.c: the queue and the worker of `calla serve` (scheduler.h).
//
// The worker is the only thread that touches the engine, the working sequence and the session
// cache; it runs jobs one at a time in arrival (queue) order.  A client that goes away is
// noticed between prefill chunks and decode steps (job_cancelled: the worker polls the client
// socket for a reset), and the transport marks the job cancelled when a write fails or the
// connection ends early, or when its watch over a queued job finds the client gone; a job whose
// client left while it was queued is ended without running.
#include "scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sched_init(struct sched *s, const struct sched_config *cfg, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    atomic_init(&s->abort, false);
    const int ctx = (int)cfg->context;
    if (seq_new(cfg->e, ctx, &s->w, err, errlen) ||
        scache_init(&s->full, cfg->e, ctx, (int)cfg->cache_entries, err, errlen) ||
        scache_init(&s->bound, cfg->e, ctx, (int)cfg->cache_boundaries, err, errlen)) {
        sched_free(s);
        return -1;
    }
    return 0;
}

void sched_free(struct sched *s) {
    scache_free(&s->full);
    scache_free(&s->bound);
    seq_free(s->w);
    s->w = NULL;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

// ---- running a job -------------------------------------------------------------------------------

// What the generation's hooks need.
struct run {
    struct sched *s;
    struct job *j;
};

static bool run_cancelled(void *arg) {
    return job_cancelled(((struct run *)arg)->j);
}

// The running prefill's progress for /metrics (the job's sink gets it from generate).
static void run_progress(void *arg, int done, int total) {
    struct sched *s = ((struct run *)arg)->s;
    pthread_mutex_lock(&s->mu);
    s->prefill_done = done < total ? done : 0; // the last chunk: none running
    s->prefill_total = done < total ? total : 0;
    pthread_mutex_unlock(&s->mu);
}

// The prompt is in up to its last message boundary: a snapshot there.
static void run_snapshot(void *arg, int pos, int32_t next) {
    const struct run *r = arg;
    char err[256];
    if (scache_store_copy(&r->s->bound, r->s->w, r->j->req.prompt, pos, next, err, sizeof err))
        fprintf(stderr, "calla serve: session cache: %s\n", err);
}

static void end_job(struct job *j, const struct gen_end *e) {
    if (j->sink.end) j->sink.end(j->sink.ctx, e);
}

static void run_job(struct sched *s, struct job *j) {
    const double t0 = now_s();
    const struct gen_request *q = &j->req;
    const int32_t *P = q->prompt;
    const int n = q->n_prompt;
    char err[256];

    // Session cache: the longest entry whose tokens are a prefix of the prompt.
    // With logits the last prompt token must run (its logits give the first token's), so an
    // entry may cover at most n - 1 tokens.
    const int usable = gen_wants_logits(q) ? n - 1 : n;
    struct cache_entry *full = scache_lookup(&s->full, P, usable), *bnd = scache_lookup(&s->bound, P, usable);
    struct cache_entry *hit = full && (!bnd || full->n >= bnd->n) ? full : bnd;
    int pos = 0;
    const int32_t *next = NULL;
    if (hit && seq_copy(s->w, hit->s, err, sizeof err)) hit = NULL;
    if (hit) {
        pos = hit->n;
        if (pos == n) next = &hit->next;
    } else {
        seq_reset(s->w);
    }
    const int cached = pos; // (hit may be another entry once the end state is stored)
    j->n_cached = cached;
    pthread_mutex_lock(&s->mu);
    if (s->full.n + s->bound.n > 0) {
        if (hit)
            s->m.cache_hits++;
        else
            s->m.cache_misses++;
    }
    s->m.cached_tokens += (unsigned long long)pos;
    s->m.prompt_tokens += (unsigned long long)n;
    pthread_mutex_unlock(&s->mu);

    struct run r = {s, j};
    const struct gen_env env = {.e = s->cfg.e,
                                .s = s->w,
                                .tok = s->cfg.tok,
                                .trie = s->cfg.trie,
                                .mask_mode = s->cfg.mask_mode,
                                .logits = s->cfg.logits,
                                .vocab = s->cfg.vocab,
                                .chunk = (int)s->cfg.prefill_chunk,
                                .cancelled = run_cancelled,
                                .progress = run_progress,
                                .snapshot = s->bound.n > 0 ? run_snapshot : NULL,
                                .arg = &r,
                                .speculative = s->cfg.speculative};
    struct gen_result res;
    const int rc = generate(&env, q, pos, next, &j->sink, &res);
    pthread_mutex_lock(&s->mu);
    s->prefill_done = s->prefill_total = 0;
    pthread_mutex_unlock(&s->mu);
    const int ng = res.n;

    // Keep the end state: it has consumed the prompt and every generated token but the last, and
    // its next token is that state's argmax (greedy_next: the last token itself may have been drawn,
    // constrained or forced, and a greedy request continuing from the state must not take it).
    // A state under half the context is copied into a slot of its own size (memory follows use);
    // a larger one moves into the cache and the slot's old sequence becomes the working one.
    if (rc == ENGINE_OK && ng >= 1) {
        int m = n + ng - 1;
        int32_t *all = malloc(sizeof *all * (size_t)m);
        if (all) {
            memcpy(all, P, sizeof *P * (size_t)n);
            memcpy(all + n, res.ids, sizeof *res.ids * (size_t)(ng - 1));
            int e = 0;
            if (seq_pos(s->w) == m)
                e = 2LL * m < s->cfg.context
                        ? scache_store_copy(&s->full, s->w, all, m, res.greedy_next, err, sizeof err)
                        : scache_store_swap(&s->full, &s->w, all, m, res.greedy_next, err, sizeof err);
            if (e) fprintf(stderr, "calla serve: session cache: %s\n", err);
            free(all);
        }
    }

    struct gen_end end = {.finish = rc == ENGINE_OK ? res.finish : GEN_FINISH_NONE,
                          .ids = res.ids,
                          .n_gen = ng,
                          .n_prompt = n,
                          .stop = rc == ENGINE_OK && res.stop >= 0 ? q->stops[res.stop] : NULL,
                          .n_cached = cached,
                          .queue_ms = 1e3 * (t0 - j->t_queued),
                          .prefill_ms = 1e3 * (res.t_prefilled - t0),
                          .decode_ms = 1e3 * (res.t_end - res.t_prefilled),
                          .prediction_accepted = res.extra_accepted,
                          .prediction_rejected = res.extra_drafted - res.extra_accepted};
    char msg[300];
    if (rc == ENGINE_CANCELLED) {
        end.status = atomic_load(&s->abort) ? 503 : 499, end.message = "cancelled";
    } else if (rc != ENGINE_OK) {
        snprintf(msg, sizeof msg, rc == GEN_NOMEM ? "%s" : "engine: %s", res.err);
        end.status = 500, end.message = msg;
    }

    pthread_mutex_lock(&s->mu);
    s->m.generated_tokens += (unsigned long long)ng;
    s->m.draft_tokens += (unsigned long long)res.drafted;
    s->m.draft_accepted += (unsigned long long)res.accepted;
    s->m.prefill_s += res.t_prefilled - t0;
    s->m.decode_s += res.t_end - res.t_prefilled;
    if (rc == ENGINE_CANCELLED) s->m.cancelled++;
    pthread_mutex_unlock(&s->mu);

    end_job(j, &end);
    if (!s->cfg.quiet)
        fprintf(stderr,
                "calla serve: %s %s: prompt %d (cached %d), generated %d, prefill %.1f ms, decode %.1f ms, %s\n", j->id,
                j->kind, n, end.n_cached, ng, end.prefill_ms, end.decode_ms,
                end.finish ? gen_finish_name(end.finish) : end.message);
    free(res.ids);
}

static void *worker_main(void *arg) {
    struct sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->stop_worker) pthread_cond_wait(&s->cv, &s->mu);
        struct job *j = s->head;
        if (!j) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->depth--;
        s->running = j;
        pthread_mutex_unlock(&s->mu);

        job_set_state(j, JOB_RUNNING);
        if (atomic_load(&s->abort)) {
            end_job(j, &(struct gen_end){
                           .status = 503, .message = "the server is shutting down", .n_prompt = j->req.n_prompt});
        } else if (job_cancelled(j)) { // its client left while it waited: not even the cache is looked at
            pthread_mutex_lock(&s->mu);
            s->m.cancelled++;
            pthread_mutex_unlock(&s->mu);
            end_job(j, &(struct gen_end){.status = 499, .message = "cancelled", .n_prompt = j->req.n_prompt});
            if (!s->cfg.quiet) fprintf(stderr, "calla serve: %s %s: cancelled while queued\n", j->id, j->kind);
        } else {
            run_job(s, j);
        }

        pthread_mutex_lock(&s->mu);
        s->running = NULL;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        job_set_state(j, JOB_DONE);
        job_unref(j);
    }
    return NULL;
}

int sched_start(struct sched *s) {
    if (pthread_create(&s->worker, NULL, worker_main, s)) return -1;
    s->have_worker = true;
    return 0;
}

// ---- the queue -----------------------------------------------------------------------------------

int sched_enqueue(struct sched *s, struct job *j, int fd, struct req_error *re) {
    j->fd = fd;
    j->abort = &s->abort;
    j->t_queued = now_s();
    pthread_mutex_lock(&s->mu);
    if (s->draining) {
        pthread_mutex_unlock(&s->mu);
        return req_fail(re, 503, NULL, "the server is shutting down");
    }
    if (s->depth >= s->cfg.queue) {
        int d = s->depth;
        pthread_mutex_unlock(&s->mu);
        return req_fail(re, 503, NULL, "the server is busy: %d requests are waiting (queue limit %lld); retry later", d,
                        s->cfg.queue);
    }
    job_ref(j); // the worker's reference
    j->next = NULL;
    if (s->tail)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->depth++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void sched_drain(struct sched *s) {
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
}

bool sched_idle(struct sched *s) {
    pthread_mutex_lock(&s->mu);
    bool idle = !s->head && !s->running;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void sched_abort(struct sched *s) {
    atomic_store(&s->abort, true);
}

void sched_stop(struct sched *s) {
    pthread_mutex_lock(&s->mu);
    s->stop_worker = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    atomic_store(&s->abort, true);
    if (s->have_worker) pthread_join(s->worker, NULL);
    s->have_worker = false;
}

void sched_status(struct sched *s, struct sched_status *out) {
    pthread_mutex_lock(&s->mu);
    *out = (struct sched_status){.depth = s->depth,
                                 .running = s->running != NULL,
                                 .draining = s->draining,
                                 .prefill_done = s->prefill_done,
                                 .prefill_total = s->prefill_total,
                                 .m = s->m};
    pthread_mutex_unlock(&s->mu);
}
