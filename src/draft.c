// draft.c: prompt-lookup drafts for speculative decoding (draft.h).
#include "draft.h"

#include "engine.h"

#include <stdlib.h>
#include <string.h>

// FNV-1a over the ids, then a finaliser: neighbouring n-grams spread over the buckets.
static uint32_t gram_hash(const int32_t *p, int len) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < len; i++) h = (h ^ (uint32_t)p[i]) * 16777619u;
    h ^= h >> 16;
    h *= 0x7feb352du;
    return h ^ (h >> 15);
}

static int *prev_of(const struct drafter *d, const struct draft_source *s, int e, int len) {
    return &s->prev[(size_t)e * d->n_max + (len - 1)];
}

// The n-grams ending at e, every length that fits, into the chains.
static void index_end(const struct drafter *d, struct draft_source *s, int e) {
    for (int len = 1; len <= d->n_max && len <= e + 1; len++) {
        int *head = &s->head[len - 1][gram_hash(s->ids + e - len + 1, len) & s->mask];
        *prev_of(d, s, e, len) = *head;
        *head = e;
    }
}

// Room for cap ids and a table of at least 2 cap buckets, every n-gram with a following token
// indexed. -1: out of memory (the source is as it was).
static int source_reserve(const struct drafter *d, struct draft_source *s, int cap) {
    if (cap <= s->cap) return 0;
    int32_t *ids = realloc(s->ids, sizeof *ids * (size_t)cap);
    if (!ids) return -1;
    s->ids = ids;
    int *prev = realloc(s->prev, sizeof *prev * (size_t)cap * d->n_max);
    if (!prev) return -1;
    s->prev = prev;
    uint32_t buckets = 1024;
    while (buckets < 2u * (uint32_t)cap) buckets *= 2;
    if (buckets - 1 != s->mask) { // a larger table: every chain again
        int *head[DRAFT_NGRAM_MAX] = {0};
        for (int i = 0; i < d->n_max; i++)
            if (!(head[i] = malloc(sizeof *head[i] * buckets))) {
                for (int j = 0; j < i; j++) free(head[j]);
                return -1;
            }
        for (int i = 0; i < d->n_max; i++) {
            free(s->head[i]);
            s->head[i] = head[i];
            memset(head[i], 0xff, sizeof *head[i] * buckets); // -1: empty
        }
        s->mask = buckets - 1;
        for (int e = 0; e < s->indexed; e++) index_end(d, s, e);
    }
    s->cap = cap;
    return 0;
}

static int source_append(const struct drafter *d, struct draft_source *s, const int32_t *ids, int n) {
    if (s->n + n > s->cap) {
        int cap = s->cap ? s->cap : 256;
        while (cap < s->n + n) cap = cap > (1 << 29) ? s->n + n : 2 * cap;
        if (source_reserve(d, s, cap)) return -1;
    }
    memcpy(s->ids + s->n, ids, sizeof *ids * (size_t)n);
    s->n += n;
    for (; s->indexed < s->n - 1; s->indexed++) index_end(d, s, s->indexed);
    return 0;
}

static void source_free(struct draft_source *s) {
    free(s->ids);
    free(s->prev);
    for (int i = 0; i < DRAFT_NGRAM_MAX; i++) free(s->head[i]);
    memset(s, 0, sizeof *s);
}

struct draft_policy draft_policy_for(const struct engine *e) {
    struct draft_policy p = DRAFT_POLICY_DEFAULT;
    const float gate = engine_verify_gate(e);
    if (gate > 0) p.gate = gate;
    return p;
}

int draft_init(struct drafter *d, const int32_t *prompt, int n, int len_max, const struct draft_policy *p) {
    const struct draft_policy pol = p ? *p : DRAFT_POLICY_DEFAULT;
    memset(d, 0, sizeof *d);
    if (pol.n_min < 1 || pol.n_min > pol.n_max || pol.n_max > DRAFT_NGRAM_MAX || len_max < 1 ||
        len_max > DRAFT_LEN_MAX || pol.len_init < 1 || !(pol.gate >= 0 && pol.gate <= 1) ||
        !(pol.rate_weight > 0 && pol.rate_weight <= 1))
        return -1;
    d->n_max = pol.n_max, d->n_min = pol.n_min, d->len_max = len_max;
    draft_gate_init(&d->gate, pol.gate, pol.rate_weight);
    d->len = pol.len_init < len_max ? pol.len_init : len_max;
    d->n_sources = 1;
    d->last_src = -1;
    d->src[0].cursor = -1;
    if (n > 0 && source_append(d, &d->src[0], prompt, n)) {
        draft_free(d);
        return -1;
    }
    return 0;
}

void draft_free(struct drafter *d) {
    for (int i = 0; i < d->n_sources; i++) source_free(&d->src[i]);
    d->n_sources = 0;
}

int draft_add_source(struct drafter *d, const int32_t *ids, int n) {
    if (d->n_sources == DRAFT_SOURCES) return -1;
    struct draft_source *s = &d->src[d->n_sources];
    *s = (struct draft_source){.cursor = -1};
    if (n > 0 && source_append(d, s, ids, n)) {
        source_free(s);
        return -1;
    }
    d->n_sources++;
    return 0;
}

void draft_gate_init(struct draft_gate *g, float gate, float weight) {
    *g = (struct draft_gate){.gate = gate, .weight = weight, .rate = 1, .shadow = -1};
}

static void rate_add(struct draft_gate *g, bool hit) {
    g->rate += g->weight * ((hit ? 1.0f : 0.0f) - g->rate);
}

bool draft_gate_pass(struct draft_gate *g, int32_t first) {
    if (g->rate >= g->gate) return true;
    g->shadow = first;
    return false;
}

void draft_gate_next(struct draft_gate *g, int32_t tok) {
    if (g->shadow >= 0) rate_add(g, tok == g->shadow);
    g->shadow = -1;
}

void draft_gate_result(struct draft_gate *g, bool first_right) {
    rate_add(g, first_right);
}

int draft_push(struct drafter *d, int32_t tok) {
    draft_gate_next(&d->gate, tok);
    return source_append(d, &d->src[0], &tok, 1);
}

// The end of the occurrence of key[0..len) in s to draft from (draft.h: the cursor rule), or -1.
static int find(const struct drafter *d, const struct draft_source *s, const int32_t *key, int len) {
    if (!s->mask) return -1;
    int best = -1; // the earliest match at or after the cursor so far
    int e = s->head[len - 1][gram_hash(key, len) & s->mask];
    for (int step = 0; e >= 0 && step < DRAFT_WALK; step++, e = *prev_of(d, s, e, len)) {
        if (memcmp(s->ids + e - len + 1, key, sizeof *key * (size_t)len)) continue; // another n-gram, same bucket
        if (s->cursor >= 0 && e >= s->cursor) {
            best = e; // the chain goes to earlier ends: keep looking for an earlier one
            continue;
        }
        return best >= 0 ? best : e;
    }
    return best;
}

int draft_propose(struct drafter *d, int limit, int32_t *out) {
    const struct draft_source *h = &d->src[0];
    const int k = d->len < limit ? d->len : limit;
    if (k < 1) return 0;
    for (int len = d->n_max; len >= d->n_min; len--) {
        if (h->n < len) continue;
        const int32_t *key = h->ids + h->n - len;
        for (int i = 1; i <= d->n_sources; i++) {
            const int si = i % d->n_sources; // the extra sources in order, then the history
            const struct draft_source *s = &d->src[si];
            const int e = find(d, s, key, len);
            if (e < 0) continue;
            // What followed; in the history a copy that reaches its end goes on as a repetition of
            // period n - (e + 1) (the draft repeats itself).
            const int at = e + 1;
            int m = 0;
            for (; m < k; m++) {
                if (at + m < s->n)
                    out[m] = s->ids[at + m];
                else if (si == 0)
                    out[m] = out[m - (s->n - at)];
                else
                    break;
            }
            if (!draft_gate_pass(&d->gate, out[0])) { // looked at only: checked against the next token pushed
                d->last_src = -1;
                return 0;
            }
            d->last_src = si, d->last_at = at;
            return m;
        }
    }
    d->last_src = -1;
    return 0;
}

void draft_result(struct drafter *d, int k, int m) {
    d->drafted += k;
    d->accepted += m;
    draft_gate_result(&d->gate, m > 0);
    if (d->last_src >= 0) d->src[d->last_src].cursor = d->last_at + m;
    if (m == k && d->len < d->len_max)
        d->len++;
    else if (m < k && d->len > 1)
        d->len--;
}

int draft_accepted(const int32_t *draft, int k, const int32_t *next) {
    int m = 0;
    while (m < k && draft[m] == next[m]) m++;
    return m;
}
