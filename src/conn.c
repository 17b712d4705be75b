// conn.c: the open connections of `calla serve` (conn.h): limits by closing the oldest idle
// connection, the request deadline, and the tick that watches the clients of jobs in flight.
#include "conn.h"

#include "util.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// The connections of one client address (IPv4, or IPv6; an IPv4-mapped IPv6 address is its IPv4).
struct conn_addr {
    struct conn_addr *next; // the bucket's chain
    unsigned char key[16];
    int len;            // 4 or 16
    int n;              // its connections not shut down
    struct conn *conns; // all of them listed
};

void conn_table_init(struct conn_table *t, int max_total, int max_per_ip, double request_timeout) {
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->max_total = max_total, t->max_per_ip = max_per_ip, t->request_timeout = request_timeout;
}

int conn_headroom(int max_total) {
    return max_total / 8 + 64;
}

static int addr_key(const struct sockaddr *sa, unsigned char key[16]) {
    if (sa && sa->sa_family == AF_INET) {
        memcpy(key, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 4;
    }
    if (sa && sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            memcpy(key, a->s6_addr + 12, 4);
            return 4;
        }
        memcpy(key, a->s6_addr, 16);
        return 16;
    }
    memset(key, 0, 4); // (no address: one shared entry)
    return 4;
}

// The address's entry, made when new; NULL when out of memory.  Under mu.
static struct conn_addr *addr_get(struct conn_table *t, const struct sockaddr *sa) {
    unsigned char key[16];
    const int len = addr_key(sa, key);
    struct conn_addr **b = &t->buckets[fnv1a64(FNV1A64_INIT, key, (size_t)len) % CONN_BUCKETS];
    for (struct conn_addr *a = *b; a; a = a->next)
        if (a->len == len && !memcmp(a->key, key, (size_t)len)) return a;
    struct conn_addr *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    memcpy(a->key, key, (size_t)len);
    a->len = len;
    a->next = *b;
    *b = a;
    return a;
}

static void addr_drop(struct conn_table *t, struct conn_addr *a) {
    if (a->conns) return;
    struct conn_addr **b = &t->buckets[fnv1a64(FNV1A64_INIT, a->key, (size_t)a->len) % CONN_BUCKETS];
    while (*b != a) b = &(*b)->next;
    *b = a->next;
    free(a);
}

// ---- the lists, under mu --------------------------------------------------------------------------

static void unlink_k(struct conn_table *t, struct conn *k) {
    if (k->fd < 0) return; // a shut-down connection is on no list
    struct conn **head = k->busy ? &t->busy : &t->idle_head;
    if (k->prev)
        k->prev->next = k->next;
    else
        *head = k->next;
    if (k->next)
        k->next->prev = k->prev;
    else if (!k->busy)
        t->idle_tail = k->prev;
    k->prev = k->next = NULL;
}

static void push_idle(struct conn_table *t, struct conn *k) {
    k->busy = false;
    k->since = now_s();
    k->prev = t->idle_tail, k->next = NULL;
    if (t->idle_tail)
        t->idle_tail->next = k;
    else
        t->idle_head = k;
    t->idle_tail = k;
}

static void push_busy(struct conn_table *t, struct conn *k) {
    k->busy = true;
    k->prev = NULL, k->next = t->busy;
    if (t->busy) t->busy->prev = k;
    t->busy = k;
}

// Shuts an idle connection down: libmicrohttpd's thread reads the end of the stream and closes it.
static void shut(struct conn_table *t, struct conn *k) {
    unlink_k(t, k);
    shutdown(k->fd, SHUT_RDWR);
    k->fd = -1;
    t->live--;
    k->addr->n--;
}

// ---- the connections -----------------------------------------------------------------------------

struct conn *conn_open(struct conn_table *t, int fd, const struct sockaddr *sa) {
    struct conn *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->fd = fd;
    pthread_mutex_lock(&t->mu);
    if (!(k->addr = addr_get(t, sa))) {
        pthread_mutex_unlock(&t->mu);
        free(k);
        return NULL;
    }
    struct conn_addr *a = k->addr;
    k->anext = a->conns;
    if (a->conns) a->conns->aprev = k;
    a->conns = k;
    a->n++;
    t->live++;
    push_idle(t, k);
    if (a->n > t->max_per_ip) { // the address's oldest idle connection (this one, when all the others are busy)
        struct conn *old = NULL;
        for (struct conn *x = a->conns; x; x = x->anext) // (newest first: on a tie the older one wins)
            if (x->fd >= 0 && !x->busy && (!old || x->since <= old->since)) old = x;
        shut(t, old);
        t->evicted++;
    }
    if (t->live > t->max_total && t->idle_head) { // the oldest idle connection of all
        shut(t, t->idle_head);
        t->evicted++;
    }
    pthread_mutex_unlock(&t->mu);
    return k;
}

void conn_close(struct conn_table *t, struct conn *k) {
    pthread_mutex_lock(&t->mu);
    if (k->fd >= 0) {
        unlink_k(t, k);
        t->live--;
        k->addr->n--;
    }
    struct conn_addr *a = k->addr;
    if (k->aprev)
        k->aprev->anext = k->anext;
    else
        a->conns = k->anext;
    if (k->anext) k->anext->aprev = k->aprev;
    addr_drop(t, a);
    pthread_mutex_unlock(&t->mu);
    free(k);
}

void conn_busy(struct conn_table *t, struct conn *k) {
    pthread_mutex_lock(&t->mu);
    if (k->fd >= 0 && !k->busy) {
        unlink_k(t, k);
        push_busy(t, k);
    }
    pthread_mutex_unlock(&t->mu);
}

void conn_watch(struct conn_table *t, struct conn *k, struct job *j) {
    pthread_mutex_lock(&t->mu);
    k->job = j;
    pthread_mutex_unlock(&t->mu);
}

void conn_idle(struct conn_table *t, struct conn *k) {
    pthread_mutex_lock(&t->mu);
    k->job = NULL;
    if (k->fd >= 0) {
        unlink_k(t, k);
        push_idle(t, k);
    }
    pthread_mutex_unlock(&t->mu);
}

struct conn_stats conn_table_stats(struct conn_table *t) {
    pthread_mutex_lock(&t->mu);
    const struct conn_stats s = {.open = t->live, .timed_out = t->timed_out, .evicted = t->evicted};
    pthread_mutex_unlock(&t->mu);
    return s;
}

// ---- the tick --------------------------------------------------------------------------------------

enum { TICKS_PER_S = 4 };

static void *ticker_main(void *arg) {
    struct conn_table *t = arg;
    pthread_mutex_lock(&t->mu);
    for (unsigned long tick = 0; !t->stop; tick++) {
        // The deadline: the idle list is oldest first.
        const double now = now_s();
        while (t->idle_head && now - t->idle_head->since > t->request_timeout) {
            shut(t, t->idle_head);
            t->timed_out++;
        }
        // The clients of the jobs in flight (a poll each; a job's reader is poked when there is
        // news), and once a second every job's reader, for its timers.
        for (struct conn *k = t->busy; k; k = k->next)
            if (k->job) {
                job_watch(k->job);
                if (tick % TICKS_PER_S == 0) job_poke(k->job);
            }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 1000000000 / TICKS_PER_S;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int conn_table_start(struct conn_table *t) {
    if (pthread_create(&t->ticker, NULL, ticker_main, t)) return -1;
    t->have_ticker = true;
    return 0;
}

void conn_table_free(struct conn_table *t) {
    if (t->have_ticker) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->ticker, NULL);
        t->have_ticker = false;
    }
    for (int i = 0; i < CONN_BUCKETS; i++)
        while (t->buckets[i]) {
            struct conn_addr *a = t->buckets[i];
            t->buckets[i] = a->next;
            free(a);
        }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}
