// job.h: one generation request on its way through `calla serve`.
//
// A job is shared by the connection that made it (the transport, server.c), the worker that runs
// it (scheduler.c) and the protocol that renders its events (openai.c): reference counted, one
// mutex.  It carries the generation request and the protocol's sink, and it owns the output
// channel, the bytes of the answer: the protocol writes them from the worker thread through the
// functions below, the transport reads them from the connection's thread: while the job runs, a
// stream of server-sent events; or, not streaming, one body and its status once the job is done.
#pragma once

#include "generate.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

enum { MAX_SESSION_ID = 128 }; // session key bytes mirrored into X-Session-Id (a balancer's affinity)

enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

// The transport's reader of the answer, which never blocks a thread: with nothing to send it
// parks (job_park calls suspend), and whatever gives it something to do (output, the end, a
// cancellation, a poke) calls resume, once.  Both are called under the job's mutex, so no
// wake-up falls between a look and a park: suspend from the reader's own thread, resume from any.
struct job_reader {
    void (*suspend)(void *arg);
    void (*resume)(void *arg);
    void *arg;
};

// What the reader sees when it looks (job_look).
struct job_view {
    bool done;      // out and status are final
    bool cancelled; // the client is gone (or the job failed for want of memory): no one to answer
    bool peer_eof;  // the client's end of stream was seen: a half-close, or a close, which only a write tells apart
};

struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; // connection, response (streaming) and worker

    // The request, fixed once queued (the protocol fills it).
    struct gen_request req;           // what to generate
    struct gen_sink sink;             // the protocol's renderer; its end event completes out
    void (*sink_free)(void *ctx);     // frees sink.ctx with the job (NULL: nothing to free)
    bool stream;                      // out is an event stream, read while the job runs
    char id[48];                      // the answer's id, for the log too
    const char *kind;                 // what was asked, for the log ("chat", "completion")
    char session[MAX_SESSION_ID + 1]; // a session key from the body, when it can be a header value ("": none)

    // Set when queued (scheduler.c).
    double t_queued;
    atomic_bool *abort; // the server's "cancel everything"
    int n_cached;       // set by the worker before the generation starts: prompt tokens the session cache gave

    // Shared state, under mu.
    int fd; // the client socket, polled for a hang-up; -1 once the transport has closed it
    enum job_state state;
    bool cancel;              // the client went away (or the server is aborting)
    bool peer_eof;            // the client's end of stream was seen (POLLRDHUP)
    bool probed;              // streaming: the client's end of stream was seen and a comment sent
    struct job_reader reader; // .resume NULL: no reader
    bool parked;              // the reader waits for a resume
    bool poked;               // something changed since the reader last looked
    struct sbuf out;          // the answer's bytes...
    size_t out_off;           // ...and how far the transport has read them (streaming)
    int status;               // not streaming: the HTTP status of the body in out

    struct job *next; // queue link (scheduler.c)
};

struct job *job_new(void);
void job_ref(struct job *j);
void job_unref(struct job *j);
void job_set_state(struct job *j, enum job_state s);

// Can s be a session key (X-Session-Id, or a body's user id mirrored into it)?  1 to
// MAX_SESSION_ID visible ASCII characters: a header value as it is, and a key a balancer hashes
// the same everywhere.
bool session_id_valid(const char *s, size_t len);

// ---- the output channel, written by the protocol -------------------------------------------------
// Out of memory cancels the job.

// Streaming: one event ("data: ...\n\n").
void job_sse(struct job *j, const char *data, size_t len);
// Streaming: one named event ("event: NAME\ndata: ...\n\n"), as Anthropic and the Responses API send them.
void job_sse_event(struct job *j, const char *name, const char *data, size_t len);
// Streaming: a comment (": text\n\n"), which clients ignore: prefill progress, probes.
void job_sse_comment(struct job *j, const char *text);
// Not streaming: the whole answer, with its HTTP status.
void job_answer(struct job *j, int status, const char *body, size_t len);

// ---- read by the transport -----------------------------------------------------------------------

// Copies up to max unread bytes of out into buf, waiting up to wait_s seconds for some (0: not at
// all): the count; 0 when none came in time; -1 when the job is done and everything has been read.
// Streaming, while the job runs; not streaming, the whole answer once it is done.
long job_read(struct job *j, char *buf, size_t max, double wait_s);
// Not streaming: waits until the job is done; out and status are then final.
void job_wait(struct job *j);
// The reader of the answer, before it first parks (NULL: none any more, before the transport lets go
// of what reader->arg points to).
void job_set_reader(struct job *j, const struct job_reader *r);
// A look at the job; the pokes so far are taken.
struct job_view job_look(struct job *j);
// Parks the reader (reader.suspend) unless something is new since it last looked: unread output
// while streaming, the end, a cancellation, a poke.  True when parked: a resume follows once
// something is; false: look again now.
bool job_park(struct job *j);
// The reader looks again (a parked one is resumed): the transport's timers (keep-alives, probes).
void job_poke(struct job *j);
// The transport's watch over a job whose answer it relays, queued or running, a few times a
// second: the client socket polled as job_cancelled does; the reader poked when the client is
// gone or has closed its end (then only a write tells whether it still reads).
void job_watch(struct job *j);
// The reader of the answer is gone: a job not done yet is cancelled.
void job_abandon(struct job *j);
// The transport is done with the client's socket (it may close or reuse it): no more polling;
// cancel: the request ended before its answer, so a job not done yet is cancelled.
void job_release_fd(struct job *j, bool cancel);

// ---- cancellation, checked by the worker -------------------------------------------------------

// The client went away (a reset, or a write that failed), or the server aborts.  A bool (*)(void *).
bool job_cancelled(void *job);
