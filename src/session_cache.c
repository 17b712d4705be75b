// session_cache.c: the LRU of decode states behind `calla serve` (see session_cache.h).
#include "session_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int scache_init(struct session_cache *c, struct engine *e, int ctx, int n_entries, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->e = e;
    c->ctx = ctx;
    c->n = n_entries;
    if (n_entries > 0 && !(c->ent = calloc((size_t)n_entries, sizeof *c->ent))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

void scache_free(struct session_cache *c) {
    for (int i = 0; i < c->n; i++) {
        seq_free(c->ent[i].s);
        free(c->ent[i].tokens);
    }
    free(c->ent);
    memset(c, 0, sizeof *c);
}

static bool is_prefix(const struct cache_entry *en, const int32_t *p, int n) {
    return en->used && en->n <= n && !memcmp(en->tokens, p, sizeof *p * (size_t)en->n);
}

struct cache_entry *scache_lookup(struct session_cache *c, const int32_t *p, int n) {
    struct cache_entry *best = NULL;
    for (int i = 0; i < c->n; i++)
        if (c->ent[i].n > 0 && is_prefix(&c->ent[i], p, n) && (!best || c->ent[i].n > best->n)) best = &c->ent[i];
    if (best) best->used = ++c->clock;
    return best;
}

struct cache_entry *scache_find(struct session_cache *c, const int32_t *p, int n) {
    for (int i = 0; i < c->n; i++)
        if (c->ent[i].used && c->ent[i].n == n && !memcmp(c->ent[i].tokens, p, sizeof *p * (size_t)n))
            return &c->ent[i];
    return NULL;
}

static struct cache_entry *victim(struct session_cache *c) {
    struct cache_entry *v = &c->ent[0];
    for (int i = 1; i < c->n; i++)
        if (c->ent[i].used < v->used) v = &c->ent[i];
    return v;
}

static int set_tokens(struct cache_entry *en, const int32_t *p, int n, char *err, size_t errlen) {
    if (en->tokens_cap < n) {
        int32_t *t = realloc(en->tokens, sizeof *t * (size_t)n);
        if (!t) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        en->tokens = t;
        en->tokens_cap = n;
    }
    memcpy(en->tokens, p, sizeof *p * (size_t)n);
    en->n = n;
    return 0;
}

int scache_store_copy(struct session_cache *c, const struct seq *src, const int32_t *p, int n, int32_t next, char *err,
                      size_t errlen) {
    if (c->n == 0 || n < 1) return 0;
    struct cache_entry *en = scache_find(c, p, n);
    if (en) {
        en->used = ++c->clock;
        return 0;
    }
    en = victim(c);
    en->used = 0; // empty until the copy succeeds: its state must match its tokens
    if (en->s && seq_capacity(en->s) < n) {
        seq_free(en->s);
        en->s = NULL;
    }
    if (!en->s) {
        // Room for a little growth so a slot is not reallocated for every turn.
        int cap = n + 1024 < c->ctx ? n + 1024 : c->ctx;
        if (cap < n) cap = n;
        if (seq_new(c->e, cap, &en->s, err, errlen)) return -1;
    }
    if (seq_copy(en->s, src, err, errlen) || set_tokens(en, p, n, err, errlen)) return -1;
    en->next = next;
    en->used = ++c->clock;
    return 0;
}

int scache_store_swap(struct session_cache *c, struct seq **w, const int32_t *p, int n, int32_t next, char *err,
                      size_t errlen) {
    if (c->n == 0 || n < 1) return 0;
    struct cache_entry *en = scache_find(c, p, n);
    if (en) {
        en->used = ++c->clock;
        return 0;
    }
    en = victim(c);
    en->used = 0;
    struct seq *old = en->s;
    if (!old || seq_capacity(old) < c->ctx) {
        seq_free(old);
        old = NULL;
        en->s = NULL;
        if (seq_new(c->e, c->ctx, &old, err, errlen)) return -1;
    }
    if (set_tokens(en, p, n, err, errlen)) {
        en->s = old;
        return -1;
    }
    en->s = *w;
    *w = old;
    seq_reset(*w);
    en->next = next;
    en->used = ++c->clock;
    return 0;
}
