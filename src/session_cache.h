// session_cache.h: a small LRU of decode states (the session cache of `calla serve`).
//
// An entry is a sequence snapshot plus the exact token list it has consumed and the greedy next
// token after it.  GDN state cannot be rewound, so an entry is usable only when its tokens are a
// prefix of the new prompt: copy it into the working sequence and forward the rest.  The state
// of an entry always corresponds exactly to its tokens (it is written only from a sequence that
// consumed those tokens and nothing else).
//
// Not thread-safe: the server's single worker thread owns it.
#pragma once

#include "engine.h"

#include <stdbool.h>
#include <stdint.h>

struct cache_entry {
    struct seq *s;   // state after consuming tokens[0..n); NULL until first use
    int32_t *tokens; // [n]
    int n, tokens_cap;
    int32_t next;  // argmax after tokens[0..n): the first token to generate when n == prompt
    uint64_t used; // LRU clock; 0 = empty slot
};

struct session_cache {
    struct engine *e;
    int ctx;                 // capacity of working sequences (swap-in entries need it)
    int n;                   // slots (0: cache off)
    struct cache_entry *ent; // [n]
    uint64_t clock;
};

int scache_init(struct session_cache *c, struct engine *e, int ctx, int n_entries, char *err, size_t errlen);
void scache_free(struct session_cache *c);
// Longest entry whose tokens are a prefix of p[0..n) (entry length <= n), or NULL.
// Marks it most recently used.
struct cache_entry *scache_lookup(struct session_cache *c, const int32_t *p, int n);
// Finds an entry with exactly these tokens (for de-duplication), or NULL.
struct cache_entry *scache_find(struct session_cache *c, const int32_t *p, int n);
// Stores a copy of src (which has consumed exactly p[0..n), with greedy next token `next`) in
// the least recently used slot.  An entry with the same tokens is refreshed instead.
int scache_store_copy(struct session_cache *c, const struct seq *src, const int32_t *p, int n, int32_t next, char *err,
                      size_t errlen);
// Same, without copying state: *w (capacity ctx) moves into the cache and *w is replaced by the
// evicted slot's sequence (reallocated to capacity ctx when smaller).  On failure *w is unchanged
// or a fresh sequence; nothing is cached.
int scache_store_swap(struct session_cache *c, struct seq **w, const int32_t *p, int n, int32_t next, char *err,
                      size_t errlen);
