// response_store.c: the Responses API's stored responses (response_store.h).
#include "response_store.h"

#include <stdlib.h>
#include <string.h>

int rstore_init(struct rstore *s, int max_entries, size_t max_bytes) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->max_entries = max_entries > 0 ? max_entries : 0;
    s->max_bytes = max_bytes;
    if (s->max_entries && !(s->v = calloc((size_t)s->max_entries, sizeof *s->v))) return -1;
    return 0;
}

void rstore_entry_free(struct rstore_entry *e) {
    if (!e) return;
    free(e->response);
    json_decref(e->conv);
    free(e->instructions);
    free(e->tools);
    free(e->tokens);
    free(e);
}

void rstore_free(struct rstore *s) {
    for (int i = 0; i < s->n; i++) rstore_entry_free(s->v[i]);
    free(s->v);
    s->v = NULL;
    s->n = 0;
    pthread_mutex_destroy(&s->mu);
}

// The entry's bytes, about: its texts, its tokens, and the conversation as JSON text.
static size_t entry_bytes(const struct rstore_entry *e) {
    size_t conv = e->conv ? json_dumpb(e->conv, NULL, 0, JSON_COMPACT) : 0;
    return sizeof *e + (e->response ? strlen(e->response) : 0) + (e->instructions ? strlen(e->instructions) : 0) +
           (e->tools ? strlen(e->tools) : 0) + sizeof *e->tokens * (size_t)e->n_tokens + conv;
}

// Index of the entry with this id, or -1 (under mu).
static int find(const struct rstore *s, const char *id) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i]->id, id)) return i;
    return -1;
}

static void drop(struct rstore *s, int i) {
    s->bytes -= s->v[i]->bytes;
    rstore_entry_free(s->v[i]);
    s->v[i] = s->v[--s->n];
}

int rstore_put(struct rstore *s, struct rstore_entry *e) {
    e->bytes = entry_bytes(e);
    pthread_mutex_lock(&s->mu);
    if (!s->max_entries || e->bytes > s->max_bytes) {
        pthread_mutex_unlock(&s->mu);
        rstore_entry_free(e);
        return -1;
    }
    int k = find(s, e->id);
    if (k >= 0) drop(s, k);
    while (s->n && (s->n == s->max_entries || s->bytes + e->bytes > s->max_bytes)) {
        int lru = 0;
        for (int i = 1; i < s->n; i++)
            if (s->v[i]->used < s->v[lru]->used) lru = i;
        drop(s, lru);
    }
    e->used = ++s->clock;
    s->v[s->n++] = e;
    s->bytes += e->bytes;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static char *dup_or_null(const char *p, bool *oom) {
    char *d = p ? strdup(p) : NULL;
    if (p && !d) *oom = true;
    return d;
}

struct rstore_entry *rstore_get(struct rstore *s, const char *id) {
    struct rstore_entry *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_lock(&s->mu);
    int k = find(s, id);
    bool oom = false;
    if (k >= 0) {
        const struct rstore_entry *e = s->v[k];
        s->v[k]->used = ++s->clock;
        *c = *e;
        c->response = dup_or_null(e->response, &oom);
        c->instructions = dup_or_null(e->instructions, &oom);
        c->tools = dup_or_null(e->tools, &oom);
        c->conv = json_deep_copy(e->conv);
        c->tokens = malloc(sizeof *c->tokens * ((size_t)e->n_tokens + 1));
        if (c->tokens) memcpy(c->tokens, e->tokens, sizeof *c->tokens * (size_t)e->n_tokens);
        oom |= !c->conv || !c->tokens;
    }
    pthread_mutex_unlock(&s->mu);
    if (k < 0 || oom) {
        if (k < 0) memset(c, 0, sizeof *c);
        rstore_entry_free(c);
        return NULL;
    }
    return c;
}

char *rstore_get_response(struct rstore *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    int k = find(s, id);
    char *r = k >= 0 ? strdup(s->v[k]->response) : NULL;
    if (k >= 0) s->v[k]->used = ++s->clock;
    pthread_mutex_unlock(&s->mu);
    return r;
}

bool rstore_delete(struct rstore *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    int k = find(s, id);
    if (k >= 0) drop(s, k);
    pthread_mutex_unlock(&s->mu);
    return k >= 0;
}
