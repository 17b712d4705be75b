// tokmask.c: the vocabulary's byte trie, token masks walked over it, and the constrained
// decoder's pick (see tokmask.h).
#include "tokmask.h"

#include "chat.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- the trie ------------------------------------------------------------------------------------

// A node is the set of tokens that begin with the bytes on the path to it.  Children are
// contiguous in nodes[] and in byte order; the tokens of a subtree are contiguous in ids[]
// (sorted by bytes), those that end at the node first.
struct tnode {
    uint32_t child; // first child
    uint32_t tok;   // first token (in ids[]) that ends here
    uint16_t n_child;
    uint16_t n_tok; // tokens whose bytes end here (1, or more for duplicates, or 0)
    uint8_t byte;   // the edge into this node
    uint8_t cls;    // CONSTRAIN_CLASS_* bits holding every byte from this edge down
};

struct token_trie {
    struct tnode *nodes; // [n_nodes], nodes[0] the root (the empty prefix)
    int n_nodes, cap;
    int32_t *ids; // [n_ids] token ids by bytes
    int n_ids, vocab, max_len;
    uint8_t byte_cls[256]; // the classes byte b belongs to
    // Per class: the tokens made only of that class's bytes (allowed as a whole when a state
    // stands still under the class).
    uint64_t *plain[CONSTRAIN_N_CLASSES + 1];
};

struct entry {
    const unsigned char *b;
    uint32_t n;
    int32_t id;
};

static int entry_cmp(const void *x, const void *y) {
    const struct entry *a = x, *b = y;
    uint32_t m = a->n < b->n ? a->n : b->n;
    int c = memcmp(a->b, b->b, m);
    if (c) return c;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static int node_alloc(struct token_trie *t, int n) {
    if (t->n_nodes + n > t->cap) {
        int cap = t->cap ? t->cap : 1 << 16;
        while (cap < t->n_nodes + n) cap *= 2;
        struct tnode *p = realloc(t->nodes, sizeof *p * (size_t)cap);
        if (!p) return -1;
        t->nodes = p, t->cap = cap;
    }
    int first = t->n_nodes;
    memset(t->nodes + first, 0, sizeof *t->nodes * (size_t)n);
    t->n_nodes += n;
    return first;
}

// Fills node's tokens and children from e[lo, hi), the entries that share its depth bytes.
static int build(struct token_trie *t, const struct entry *e, int node, int lo, int hi, int depth) {
    int i = lo;
    while (i < hi && (int)e[i].n == depth) i++; // shorter entries sort first
    t->nodes[node].tok = (uint32_t)lo;
    t->nodes[node].n_tok = (uint16_t)(i - lo);
    t->nodes[node].cls = 0xff; // nothing below a leaf
    int nc = 0;
    for (int j = i; j < hi; nc++) {
        const unsigned char b = e[j].b[depth];
        while (j < hi && e[j].b[depth] == b) j++;
    }
    if (!nc) return 0;
    int first = node_alloc(t, nc); // may move nodes[]: index, never a pointer, across calls
    if (first < 0) return -1;
    t->nodes[node].child = (uint32_t)first;
    t->nodes[node].n_child = (uint16_t)nc;
    uint8_t below = 0xff;
    for (int j = i, c = first; j < hi; c++) {
        const unsigned char b = e[j].b[depth];
        int k = j;
        while (k < hi && e[k].b[depth] == b) k++;
        t->nodes[c].byte = b;
        if (build(t, e, c, j, k, depth + 1)) return -1;
        t->nodes[c].cls &= t->byte_cls[b];
        below &= t->nodes[c].cls;
        j = k;
    }
    t->nodes[node].cls = below;
    return 0;
}

int token_trie_build(const struct tokenizer *tok, int vocab, struct token_trie **out, char *err, size_t errlen) {
    struct token_trie *t = calloc(1, sizeof *t);
    struct entry *e = malloc(sizeof *e * (size_t)vocab);
    if (!t || !e) goto oom;
    t->vocab = vocab;
    for (int b = 0; b < 256; b++)
        for (int cls = 1; cls <= CONSTRAIN_N_CLASSES; cls++)
            if (constrain_class_byte(cls, (unsigned char)b)) t->byte_cls[b] |= (uint8_t)cls;
    // The tokens constrained_allows could ever take as text (as it decides: stop tokens by the
    // document, special tokens never, ids without bytes never).
    for (int32_t id = 0; id < vocab; id++) {
        size_t n;
        const char *b = tokenizer_token_bytes(tok, id, &n);
        if (!b || !n || chat_is_stop(id) || tokenizer_is_special(tok, id)) continue;
        if (n > 65535) continue;
        e[t->n_ids++] = (struct entry){(const unsigned char *)b, (uint32_t)n, id};
        if ((int)n > t->max_len) t->max_len = (int)n;
    }
    qsort(e, (size_t)t->n_ids, sizeof *e, entry_cmp);
    if (!(t->ids = malloc(sizeof *t->ids * (size_t)(t->n_ids + 1)))) goto oom;
    for (int i = 0; i < t->n_ids; i++) t->ids[i] = e[i].id;
    const size_t words = token_mask_words(vocab);
    for (int cls = 1; cls <= CONSTRAIN_N_CLASSES; cls++) {
        if (!(t->plain[cls] = calloc(words, sizeof(uint64_t)))) goto oom;
        for (int i = 0; i < t->n_ids; i++) {
            bool all = true;
            for (uint32_t k = 0; k < e[i].n && all; k++) all = t->byte_cls[e[i].b[k]] & cls;
            if (all) t->plain[cls][e[i].id >> 6] |= 1ULL << (e[i].id & 63);
        }
    }
    if (node_alloc(t, 1) < 0 || build(t, e, 0, 0, t->n_ids, 0)) goto oom;
    struct tnode *fit = realloc(t->nodes, sizeof *fit * (size_t)t->n_nodes); // the doubling's slack back
    if (fit) t->nodes = fit, t->cap = t->n_nodes;
    free(e);
    *out = t;
    return 0;
oom:
    free(e);
    token_trie_free(t);
    snprintf(err, errlen, "out of memory building the token trie");
    return -1;
}

void token_trie_free(struct token_trie *t) {
    if (!t) return;
    free(t->nodes);
    free(t->ids);
    for (int cls = 0; cls <= CONSTRAIN_N_CLASSES; cls++) free(t->plain[cls]);
    free(t);
}

size_t token_trie_bytes(const struct token_trie *t) {
    return sizeof *t + sizeof *t->nodes * (size_t)t->cap + sizeof *t->ids * (size_t)(t->n_ids + 1) +
           CONSTRAIN_N_CLASSES * token_mask_words(t->vocab) * sizeof(uint64_t);
}
int token_trie_nodes(const struct token_trie *t) {
    return t->n_nodes;
}
int token_trie_vocab(const struct token_trie *t) {
    return t->vocab;
}

// ---- masks ---------------------------------------------------------------------------------------

struct token_walker {
    const struct token_trie *t;
    const struct cschema *c;
    struct cstate **st; // [max_len + 1] the state after depth bytes (made when first needed)
    uint64_t *mask;
    int limit; // mark only tokens after which the document can end within this many bytes
    long visited;
    bool oom;
};

enum { NO_LIMIT = 1 << 30 };

struct token_walker *token_walker_new(const struct token_trie *t, const struct cschema *c) {
    struct token_walker *w = calloc(1, sizeof *w);
    if (!w || !(w->st = calloc((size_t)t->max_len + 2, sizeof *w->st))) {
        free(w);
        return NULL;
    }
    w->t = t, w->c = c;
    return w;
}

void token_walker_free(struct token_walker *w) {
    if (!w) return;
    for (int i = 0; i <= w->t->max_len + 1; i++) cstate_free(w->st[i]);
    free(w->st);
    free(w);
}

static void mark(uint64_t *mask, const struct token_trie *t, const struct tnode *nd) {
    for (uint32_t i = nd->tok; i < nd->tok + nd->n_tok; i++) mask[t->ids[i] >> 6] |= 1ULL << (t->ids[i] & 63);
}

// The children of nd, whose path bytes took the document to s.  cls: the class s stands still
// under (0: none); path_plain: every byte so far was of that class, with s standing still
// throughout (so the class's plain tokens are in the mask already, when they fit); s_fits: s is
// within the walk's distance limit (a token that ends in s is marked).
static void walk(struct token_walker *w, const struct tnode *nd, int depth, const struct cstate *s, int cls,
                 bool path_plain, bool s_fits) {
    const struct token_trie *t = w->t;
    const struct tnode *end = t->nodes + nd->child + nd->n_child;
    for (const struct tnode *ch = t->nodes + nd->child; ch < end; ch++) {
        w->visited++;
        if (cls && (t->byte_cls[ch->byte] & cls)) {      // s stands still: no copy, no feed
            if (path_plain && (ch->cls & cls)) continue; // the whole subtree is plain: decided at the root
            if (s_fits) mark(w->mask, t, ch);
            if (ch->n_child) walk(w, ch, depth + 1, s, cls, path_plain, s_fits);
            continue;
        }
        struct cstate *ns = w->st[depth + 1];
        if (!ns && !(ns = w->st[depth + 1] = cstate_new(w->c))) {
            w->oom = true;
            return;
        }
        cstate_copy(ns, s);
        const char b = (char)ch->byte;
        if (!cstate_feed(ns, &b, 1)) continue;
        const bool fits = w->limit == NO_LIMIT || cstate_distance(ns) <= w->limit;
        if (fits) mark(w->mask, t, ch);
        if (ch->n_child) walk(w, ch, depth + 1, ns, cstate_fixed_class(ns), false, fits);
    }
}

static void mark_stops(uint64_t *mask, const struct cstate *s, int vocab) {
    if (!cstate_done(s)) return;
    for (int i = 0; i < CHAT_N_STOP; i++)
        if (chat_stop_ids[i] < vocab) mask[chat_stop_ids[i] >> 6] |= 1ULL << (chat_stop_ids[i] & 63);
}

long token_mask_within(struct token_walker *w, const struct cstate *s, int limit, uint64_t *mask) {
    const struct token_trie *t = w->t;
    const size_t words = token_mask_words(t->vocab);
    const int cls = cstate_fixed_class(s);
    const bool s_fits = limit == NO_LIMIT || cstate_distance(s) <= limit;
    if (cls && s_fits)
        memcpy(mask, t->plain[cls], words * sizeof *mask);
    else
        memset(mask, 0, words * sizeof *mask);
    w->mask = mask;
    w->limit = limit;
    w->visited = 0;
    walk(w, &t->nodes[0], 0, s, cls, cls != 0, s_fits);
    mark_stops(mask, s, t->vocab);
    return w->visited;
}

long token_mask(struct token_walker *w, const struct cstate *s, uint64_t *mask) {
    return token_mask_within(w, s, NO_LIMIT, mask);
}

void token_mask_naive_within(const struct token_trie *t, const struct tokenizer *tok, const struct cstate *s, int limit,
                             uint64_t *mask) {
    memset(mask, 0, token_mask_words(t->vocab) * sizeof *mask);
    struct cstate *tmp = cstate_new(NULL);
    if (!tmp) return;
    for (int32_t id = 0; id < t->vocab; id++) { // as constrained_allows and constrained_fits decided, token by token
        size_t n;
        const char *b = tokenizer_token_bytes(tok, id, &n);
        if (chat_is_stop(id) || tokenizer_is_special(tok, id) || !b || !n) continue;
        cstate_copy(tmp, s);
        if (cstate_feed(tmp, b, n) && (limit < 0 || cstate_distance(tmp) <= limit)) mask[id >> 6] |= 1ULL << (id & 63);
    }
    cstate_free(tmp);
    mark_stops(mask, s, t->vocab);
}

void token_mask_naive(const struct token_trie *t, const struct tokenizer *tok, const struct cstate *s, uint64_t *mask) {
    token_mask_naive_within(t, tok, s, -1, mask);
}

// The largest of l[0..n) (n >= 1): written so that the compiler vectorises it (maxps); logits
// are finite (the backends refuse a step without a finite argmax).
__attribute__((optimize("O3", "finite-math-only", "no-signed-zeros"))) static float run_max(const float *l, size_t n) {
    float mx = l[0];
    for (size_t i = 1; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    return mx;
}

int32_t token_mask_argmax(const uint64_t *mask, const float *logits, int vocab) {
    int32_t best = -1;
    float bv = -INFINITY;
    const size_t words = token_mask_words(vocab), full = (size_t)vocab / 64;
    for (size_t wi = 0; wi < words;) {
        uint64_t m = mask[wi];
        if (m == ~0ULL && wi < full) { // a run of whole words (inside a string: most of the vocabulary)
            size_t we = wi + 1;
            while (we < full && mask[we] == ~0ULL) we++;
            const float *l = logits + wi * 64;
            const size_t n = (we - wi) * 64;
            const float mx = run_max(l, n);
            if (best < 0 || mx > bv) {
                size_t i = 0;
                while (i < n - 1 && !(l[i] == mx)) i++; // its first (lowest id)
                best = (int32_t)(wi * 64 + i), bv = l[i];
            }
            wi = we;
            continue;
        }
        for (const float *l = logits + wi * 64; m; m &= m - 1) {
            const int i = __builtin_ctzll(m);
            if (best < 0 || l[i] > bv) best = (int32_t)(wi * 64 + (size_t)i), bv = l[i];
        }
        wi++;
    }
    return best;
}

// ---- the constrained decoder ---------------------------------------------------------------------

int mask_mode_parse(const char *s) {
    if (!strcmp(s, "off")) return MASK_OFF;
    if (!strcmp(s, "sync")) return MASK_SYNC;
    if (!strcmp(s, "overlap")) return MASK_OVERLAP;
    return -1;
}

const char *mask_mode_name(enum mask_mode m) {
    return m == MASK_OFF ? "off" : m == MASK_SYNC ? "sync" : "overlap";
}

static void *mask_thread(void *arg) {
    struct constrained *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->pending && !c->quit) pthread_cond_wait(&c->cv, &c->mu);
        if (c->quit) break;
        pthread_mutex_unlock(&c->mu); // ms and mask_next are this thread's until done
        const double t0 = now_s();
        token_mask(c->w, c->ms, c->mask_next);
        const double dt = now_s() - t0;
        pthread_mutex_lock(&c->mu);
        c->mask_s += dt;
        c->n_masks++;
        c->pending = false;
        c->done = true;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int constrained_init(struct constrained *c, const struct cschema *schema, const struct tokenizer *tok,
                     const struct token_trie *trie, enum mask_mode mode) {
    memset(c, 0, sizeof *c);
    c->tok = tok;
    c->vocab = trie ? token_trie_vocab(trie) : tokenizer_vocab_size(tok);
    c->mode = trie ? mode : MASK_OFF;
    c->s = cstate_new(schema);
    c->tmp = cstate_new(schema);
    c->s0 = cstate_new(schema);
    c->order = malloc(sizeof *c->order * (size_t)c->vocab);
    if (!c->s || !c->tmp || !c->s0 || !c->order) return -1;
    if (c->mode == MASK_OFF) return 0;
    const size_t bytes = token_mask_words(c->vocab) * sizeof(uint64_t);
    if (!(c->w = token_walker_new(trie, schema)) || !(c->mask = malloc(bytes)) || !(c->fit = malloc(bytes))) return -1;
    if (c->mode != MASK_OVERLAP) return 0;
    if (!(c->ms = cstate_new(schema)) || !(c->mask_next = malloc(bytes))) return -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->th, NULL, mask_thread, c)) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        return -1;
    }
    c->th_started = true;
    return 0;
}

void constrained_free(struct constrained *c) {
    if (c->th_started) {
        pthread_mutex_lock(&c->mu);
        c->quit = true;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->th, NULL);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
    }
    cstate_free(c->s), cstate_free(c->tmp), cstate_free(c->s0), cstate_free(c->ms);
    token_walker_free(c->w);
    free(c->order), free(c->mask), free(c->mask_next), free(c->fit);
    // Everything freed is forgotten (a second free does nothing); the counters stay to be read.
    c->s = c->tmp = c->s0 = c->ms = NULL;
    c->w = NULL;
    c->order = NULL;
    c->mask = c->mask_next = c->fit = NULL;
    c->th_started = c->mask_ok = c->pending = c->done = false;
}

void constrained_restart(struct constrained *c) {
    cstate_copy(c->s, c->s0);
    c->mask_ok = false;
}

void constrained_prepare(struct constrained *c) {
    if (c->mode != MASK_OVERLAP || c->mask_ok) return;
    pthread_mutex_lock(&c->mu);
    while (c->pending) pthread_cond_wait(&c->cv, &c->mu); // (a prepare twice: the last one counts)
    cstate_copy(c->ms, c->s);
    c->pending = true;
    c->done = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

// Takes the helper thread's mask of s, when one was started.
static void mask_collect(struct constrained *c) {
    if (c->mode != MASK_OVERLAP || c->mask_ok) return;
    const double t0 = now_s();
    pthread_mutex_lock(&c->mu);
    while (c->pending) pthread_cond_wait(&c->cv, &c->mu);
    if (c->done) {
        uint64_t *m = c->mask;
        c->mask = c->mask_next, c->mask_next = m;
        c->done = false;
        c->mask_ok = true;
    }
    pthread_mutex_unlock(&c->mu);
    c->wait_s += now_s() - t0;
}

// The mask of s, now (MASK_SYNC, or an overlap that was not prepared: the first step of an answer
// after the reasoning).
static void mask_now(struct constrained *c) {
    if (c->mode == MASK_OFF || c->mask_ok) return;
    const double t0 = now_s();
    token_mask(c->w, c->s, c->mask);
    const double dt = now_s() - t0;
    c->mask_s += dt, c->wait_s += dt;
    c->n_masks++;
    c->mask_ok = true;
}

// Can token id continue the document (the end of the answer when it is a stop token)?  With a
// mask the answer is read from it when it is no; a yes still runs the token into tmp, whose
// distance to the end the budget check reads.
static bool constrained_allows(struct constrained *c, int32_t id) {
    if (id < 0 || id >= c->vocab) return false;
    if (c->mask_ok && !(c->mask[id >> 6] >> (id & 63) & 1)) return false;
    if (chat_is_stop(id)) return cstate_done(c->s);
    if (tokenizer_is_special(c->tok, id)) return false; // <tool_call> and the like are text here
    size_t n;
    const char *b = tokenizer_token_bytes(c->tok, id, &n);
    if (!b || !n) return false;
    cstate_copy(c->tmp, c->s);
    return cstate_feed(c->tmp, b, n);
}

static const float *sort_logits; // qsort's comparator reads it; one thread sorts at a time (the worker)

static int by_logit(const void *a, const void *b) {
    float x = sort_logits[*(const int32_t *)a], y = sort_logits[*(const int32_t *)b];
    return x > y   ? -1
           : x < y ? 1
                   : (*(const int32_t *)a > *(const int32_t *)b) - (*(const int32_t *)a < *(const int32_t *)b);
}

// a ranks after b in the sorted order (lower logit; the larger id on ties).
static bool after(const float *l, int32_t a, int32_t b) {
    return l[a] < l[b] || (l[a] == l[b] && a > b);
}

// order[0..k) = the first k ids of the sorted order (by_logit), by a heap of the best k so far
// rather than a sort of all: what the closing step reads, when no token fits (constrained_closest).
static void top_k(const float *l, int vocab, int k, int32_t *order) {
    int n = 0; // order[0..n) is a heap whose root ranks last
    for (int32_t id = 0; id < vocab; id++) {
        if (n == k && !after(l, order[0], id)) continue;
        int i;
        if (n < k) { // sift up from the end
            for (i = n++; i > 0 && after(l, id, order[(i - 1) / 2]); i = (i - 1) / 2) order[i] = order[(i - 1) / 2];
        } else { // replace the root, sift down
            for (i = 0;;) {
                int c = 2 * i + 1;
                if (c >= n) break;
                if (c + 1 < n && after(l, order[c + 1], order[c])) c++;
                if (!after(l, order[c], id)) break;
                order[i] = order[c], i = c;
            }
        }
        order[i] = id;
    }
    sort_logits = l;
    qsort(order, (size_t)n, sizeof *order, by_logit);
}

// Closing in time: of the tokens that keep the document valid, the one after which the
// shortest way to its end is shortest; -1 when none.  Tried: the stop token, the most likely
// CLOSE_TRIES tokens, and every single-byte token (bytes alone can finish any document).
enum { CLOSE_TRIES = 256 };

static int32_t constrained_closest(struct constrained *c) {
    int32_t pick = -1;
    int best = 1 << 30;
    for (int i = 0; i < CLOSE_TRIES + 257; i++) {
        int32_t id;
        if (i < CLOSE_TRIES)
            id = i < c->vocab ? c->order[i] : -1;
        else if (i == CLOSE_TRIES)
            id = chat_stop_ids[0];
        else
            id = tokenizer_token_id(c->tok, &(char){(char)(i - CLOSE_TRIES - 1)}, 1);
        if (!constrained_allows(c, id)) continue;
        int d = chat_is_stop(id) ? -1 : cstate_distance(c->tmp);
        if (d < best) best = d, pick = id;
    }
    return pick;
}

// Can id continue the document and still leave room to finish it, and the stop token after it,
// within the tokens left (budget, this one included)?  A token is at least a byte.
static bool constrained_fits(struct constrained *c, int32_t id, int budget) {
    return constrained_allows(c, id) && (chat_is_stop(id) || cstate_distance(c->tmp) <= budget - 2);
}

// The longest token of the bytes the document must continue with, where the mask allows it
// (such a token must come anyway); -1: none.
static int32_t forced_pick(struct constrained *c) {
    char forced[128];
    for (size_t len = cstate_forced(c->s, forced, sizeof forced); len > 0; len--) {
        const int32_t id = tokenizer_token_id(c->tok, forced, len);
        if (constrained_allows(c, id)) return id;
    }
    return -1;
}

// The pick fed to the matcher (the mask is then stale); no pick or a stop token: the stop token.
static int32_t commit_pick(struct constrained *c, int32_t pick) {
    c->mask_ok = false; // s moves on
    if (pick < 0 || chat_is_stop(pick)) return chat_stop_ids[0];
    size_t n;
    const char *b = tokenizer_token_bytes(c->tok, pick, &n);
    cstate_feed(c->s, b, n);
    return pick;
}

// The longest token of text that must come anyway, else the greedy token, else the most likely
// one that fits the document and the budget (the masked argmax; when that one does not fit the
// budget, the ids sorted by logit), else (no room left) the one that brings the document's end
// nearest.  The masked argmax is the sorted walk's first hit whenever it fits, so every mode
// picks the same token.  No token possible (a schema that cannot be finished at the nesting
// limit): a stop token, and the answer ends.
int32_t constrained_pick(struct constrained *c, const float *logits, int32_t greedy, int budget) {
    c->n_picks++;
    mask_collect(c);
    int32_t pick = forced_pick(c);
    if (pick < 0 && constrained_fits(c, greedy, budget)) pick = greedy, c->n_greedy++;
    bool none_fits = false;
    if (pick < 0 && c->mode != MASK_OFF) {
        mask_now(c);
        int32_t best = token_mask_argmax(c->mask, logits, c->vocab);
        if (best >= 0 && constrained_fits(c, best, budget))
            pick = best;
        else if (best >= 0) { // near the budget's end: the tokens that leave room to close, walked the same way
            const double t0 = now_s();
            token_mask_within(c->w, c->s, budget - 2, c->fit);
            c->mask_s += now_s() - t0, c->wait_s += now_s() - t0;
            best = token_mask_argmax(c->fit, logits, c->vocab);
            if (best >= 0 && constrained_fits(c, best, budget)) pick = best;
            none_fits = best < 0;
        }
    }
    if (pick < 0 && none_fits) { // the mask says no token fits: the closing step, from the top ids only
        top_k(logits, c->vocab, CLOSE_TRIES < c->vocab ? CLOSE_TRIES : c->vocab, c->order);
        pick = constrained_closest(c);
        if (pick < 0) pick = -2; // (none at all: the stop token below)
    }
    if (pick == -1) {
        for (int i = 0; i < c->vocab; i++) c->order[i] = i;
        sort_logits = logits;
        qsort(c->order, (size_t)c->vocab, sizeof *c->order, by_logit);
        for (int i = 0; i < c->vocab && pick < 0; i++)
            if (constrained_fits(c, c->order[i], budget)) pick = c->order[i];
        if (pick < 0) pick = constrained_closest(c);
    }
    return commit_pick(c, pick);
}

const uint32_t *constrained_mask(struct constrained *c) {
    if (c->mode == MASK_OFF) return NULL;
    mask_collect(c);
    mask_now(c);
    return (const uint32_t *)c->mask;
}

int32_t constrained_pick_choice(struct constrained *c, const struct engine_choice *ch, bool sampled, int budget,
                                const float *(*row)(void *), void *arg) {
    mask_collect(c);
    int32_t pick = forced_pick(c);
    if (pick < 0 && !sampled && constrained_fits(c, ch->greedy, budget)) pick = ch->greedy, c->n_greedy++;
    if (pick < 0 && c->mode != MASK_OFF && ch->chosen >= 0) {
        mask_now(c); // (the choice was made under it; constrained_allows reads it)
        if (constrained_fits(c, ch->chosen, budget)) pick = ch->chosen;
    }
    if (pick < 0) { // the rest as from the logits, the ids that fit the budget first
        const float *l = row(arg);
        if (!l) {
            c->mask_ok = false;
            return chat_stop_ids[0];
        }
        return constrained_pick(c, l, ch->greedy, budget);
    }
    c->n_picks++;
    return commit_pick(c, pick);
}
