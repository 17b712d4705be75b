// conn.h: the open connections of `calla serve`'s HTTP transport (conn.c): its limits, the
// request deadline, and the watch over the clients whose answers are on their way.
//
// Every connection is listed from libmicrohttpd's "started" notification to its "closed" one.
// It is idle while no request of it is being answered: from its start, or from the end of its
// last answer, while it sends its next request (or sends nothing).  The idle ones are kept oldest
// first; those answering a request apart.
//   - Limits: past the total (--max-connections) or the address's share
//     (--max-connections-per-ip), the oldest idle connection (of that address) is closed to make
//     room.  A connection that is answering a request is never closed for room; the new one is
//     the newest idle one, so it is the one closed when all the others are busy.  A client that
//     shares an address with a flood of slow connections therefore gets in at once.
//   - The request deadline: an idle connection has --request-timeout seconds to send a whole
//     request.  libmicrohttpd's own --timeout restarts with every byte, so a client that drips a
//     header line a second would otherwise hold its connection for ever.
//   - The tick, four times a second, on a thread of its own: the deadline, then a look at the
//     client of every job in flight (job_watch), and once a second a poke to each job's reader
//     (keep-alive comments, probes of a client that has closed its end).
// A connection is closed by shutting its socket down (shutdown(2)): its libmicrohttpd thread then
// reads the end of the stream and closes it.  The fd is valid while the connection is listed:
// libmicrohttpd notifies "closed" before it closes the socket, and both hold the table's mutex.
#pragma once

#include "job.h"

#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>

enum { CONN_BUCKETS = 4096 }; // hash buckets of the addresses

struct conn_addr;

struct conn {
    struct conn *prev, *next;   // the idle list (oldest first) or the busy list
    struct conn *aprev, *anext; // the connections of its address
    struct conn_addr *addr;
    int fd;          // -1 once shut down (listed until libmicrohttpd closes it)
    bool busy;       // a request of it is being answered
    double since;    // idle: when it became idle
    struct job *job; // busy with a generation: its job (the request holds the reference)
};

struct conn_table {
    pthread_mutex_t mu; // everything below
    pthread_cond_t cv;
    struct conn *idle_head, *idle_tail, *busy;
    struct conn_addr *buckets[CONN_BUCKETS];
    int live; // listed and not shut down
    int max_total, max_per_ip;
    double request_timeout;       // seconds
    unsigned long long timed_out; // closed by the deadline
    unsigned long long evicted;   // closed to make room
    bool stop;
    pthread_t ticker;
    bool have_ticker;
};

void conn_table_init(struct conn_table *t, int max_total, int max_per_ip, double request_timeout);
// Connections past max_total that may be open at once: those closed to make room that
// libmicrohttpd has not closed yet (its own limit, where it stops accepting, is max_total plus this).
int conn_headroom(int max_total);
// Starts the tick's thread; 0, or -1.
int conn_table_start(struct conn_table *t);
// Stops the tick and frees what is left (nothing is listed once libmicrohttpd has stopped).
void conn_table_free(struct conn_table *t);

// A new connection (its socket and the client's address); NULL when out of memory (it then has
// no deadline and counts against no limit).  Makes room as the limits say, which may close this one.
struct conn *conn_open(struct conn_table *t, int fd, const struct sockaddr *sa);
// libmicrohttpd closes it: unlisted and freed.
void conn_close(struct conn_table *t, struct conn *k);
// A request of it is complete: no deadline while it is answered.
void conn_busy(struct conn_table *t, struct conn *k);
// The busy connection's request is a generation, queued as j: the tick watches its client.
void conn_watch(struct conn_table *t, struct conn *k, struct job *j);
// Its answer is done (a kept-alive connection): the next request's deadline starts now.
void conn_idle(struct conn_table *t, struct conn *k);

struct conn_stats {
    int open;
    unsigned long long timed_out, evicted;
};
struct conn_stats conn_table_stats(struct conn_table *t);
