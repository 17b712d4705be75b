// job.c: the job of `calla serve` (job.h): its lifetime, its output channel, its cancellation.
#include "job.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct job *job_new(void) {
    struct job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->fd = -1;
    j->req.logprobs = -1;
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
    if (j->sink_free) j->sink_free(j->sink.ctx);
    gen_request_free(&j->req);
    sbuf_free(&j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

// The reader has something to look at (under mu): a parked one is resumed, once.
static void wake(struct job *j) {
    j->poked = true;
    if (j->parked && j->reader.resume) {
        j->parked = false;
        j->reader.resume(j->reader.arg);
    }
}

void job_set_state(struct job *j, enum job_state s) {
    pthread_mutex_lock(&j->mu);
    j->state = s;
    pthread_cond_broadcast(&j->cv);
    if (s == JOB_DONE) wake(j);
    pthread_mutex_unlock(&j->mu);
}

bool session_id_valid(const char *s, size_t len) {
    if (len < 1 || len > MAX_SESSION_ID) return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] < 0x21 || s[i] > 0x7e) return false;
    return true;
}

// ---- the output channel --------------------------------------------------------------------------

// Appends the n pieces s[i][0..len[i]) to out (under mu) and wakes the reader.
static void out_add(struct job *j, int n, const char *const *s, const size_t *len) {
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < n; i++)
        if (sbuf_add(&j->out, s[i], len[i])) j->cancel = true; // out of memory: end this request
    pthread_cond_broadcast(&j->cv);
    if (j->stream) wake(j); // (a whole answer is read once the job is done)
    pthread_mutex_unlock(&j->mu);
}

static void out_add3(struct job *j, const char *a, size_t na, const char *b, size_t nb, const char *c, size_t nc) {
    out_add(j, 3, (const char *const[]){a, b, c}, (const size_t[]){na, nb, nc});
}

void job_sse(struct job *j, const char *data, size_t len) {
    out_add3(j, "data: ", 6, data, len, "\n\n", 2);
}

void job_sse_event(struct job *j, const char *name, const char *data, size_t len) {
    out_add(j, 5, (const char *const[]){"event: ", name, "\ndata: ", data, "\n\n"},
            (const size_t[]){7, strlen(name), 7, len, 2});
}

void job_sse_comment(struct job *j, const char *text) {
    out_add3(j, ": ", 2, text, strlen(text), "\n\n", 2);
}

void job_answer(struct job *j, int status, const char *body, size_t len) {
    pthread_mutex_lock(&j->mu);
    j->status = status;
    pthread_mutex_unlock(&j->mu);
    out_add3(j, body, len, "", 0, "", 0);
}

long job_read(struct job *j, char *buf, size_t max, double wait_s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    const long long ns = until.tv_nsec + (long long)(wait_s * 1e9);
    until.tv_sec += (time_t)(ns / 1000000000), until.tv_nsec = (long)(ns % 1000000000);
    pthread_mutex_lock(&j->mu);
    bool timed_out = wait_s <= 0;
    while (j->out_off == j->out.len && j->state != JOB_DONE && !timed_out)
        timed_out = pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT;
    long n = j->state == JOB_DONE ? -1 : 0;
    if (j->out_off < j->out.len) {
        size_t k = j->out.len - j->out_off < max ? j->out.len - j->out_off : max;
        memcpy(buf, j->out.p + j->out_off, k);
        j->out_off += k;
        n = (long)k;
        if (j->out_off == j->out.len) j->out_off = j->out.len = 0; // all sent: reuse the buffer
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

void job_wait(struct job *j) {
    pthread_mutex_lock(&j->mu);
    while (j->state != JOB_DONE) pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
}

void job_set_reader(struct job *j, const struct job_reader *r) {
    pthread_mutex_lock(&j->mu);
    j->reader = r ? *r : (struct job_reader){0};
    j->parked = false;
    pthread_mutex_unlock(&j->mu);
}

struct job_view job_look(struct job *j) {
    pthread_mutex_lock(&j->mu);
    const struct job_view v = {.done = j->state == JOB_DONE, .cancelled = j->cancel, .peer_eof = j->peer_eof};
    j->poked = false;
    pthread_mutex_unlock(&j->mu);
    return v;
}

bool job_park(struct job *j) {
    pthread_mutex_lock(&j->mu);
    const bool news = j->poked || j->cancel || j->state == JOB_DONE || (j->stream && j->out_off < j->out.len);
    j->poked = false;
    const bool park = !news && j->reader.suspend;
    if (park) {
        j->parked = true;
        j->reader.suspend(j->reader.arg);
    }
    pthread_mutex_unlock(&j->mu);
    return park;
}

void job_poke(struct job *j) {
    pthread_mutex_lock(&j->mu);
    wake(j);
    pthread_mutex_unlock(&j->mu);
}

void job_abandon(struct job *j) {
    pthread_mutex_lock(&j->mu);
    if (j->state != JOB_DONE) j->cancel = true; // the response is gone before the job ended
    pthread_mutex_unlock(&j->mu);
}

void job_release_fd(struct job *j, bool cancel) {
    pthread_mutex_lock(&j->mu);
    j->fd = -1;
    if (cancel && j->state != JOB_DONE) j->cancel = true;
    pthread_mutex_unlock(&j->mu);
}

// ---- cancellation --------------------------------------------------------------------------------

// The client socket, polled (under mu): a reset (or a socket gone) means the client left; its end
// of stream does not by itself: after a complete request a client may half-close
// (shutdown(SHUT_WR)) and still read.  A client that closed its socket is told apart by a write,
// which its system answers with a reset: the transport writes one once the end of stream is
// seen (an SSE comment, or the start of a whole answer sent chunked).  True when something changed.
static bool check_peer(struct job *j) {
    if (j->cancel || j->fd < 0) return false;
    struct pollfd pf = {.fd = j->fd, .events = POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0) return false;
    if (pf.revents & (POLLHUP | POLLERR | POLLNVAL)) return j->cancel = true;
    if (!(pf.revents & POLLRDHUP) || j->peer_eof) return false;
    return j->peer_eof = true;
}

bool job_cancelled(void *arg) {
    struct job *j = arg;
    if (atomic_load(j->abort)) return true;
    pthread_mutex_lock(&j->mu);
    if (check_peer(j)) wake(j);
    // A stream may write nothing for many steps (text held back, e.g. an unfinished UTF-8
    // sequence), so once the client's end of stream is seen it gets one SSE comment at once,
    // which clients ignore: a closed client's reset is then seen at the next step.
    const bool probe = j->stream && j->peer_eof && !j->cancel && !j->probed;
    if (probe) j->probed = true;
    bool c = j->cancel;
    pthread_mutex_unlock(&j->mu);
    if (probe) job_sse_comment(j, "are you there");
    return c;
}

void job_watch(struct job *j) {
    pthread_mutex_lock(&j->mu);
    check_peer(j);
    if (j->cancel || j->peer_eof) wake(j); // the reader closes, or probes the client with a write
    pthread_mutex_unlock(&j->mu);
}
