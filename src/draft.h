// draft.h: drafts for speculative decoding, taken from the tokens themselves (prompt lookup).
//
// A drafter guesses what greedy decoding will produce next by finding the latest tokens earlier
// on: when the last n tokens (n from n_max down to n_min) occur before, the tokens that followed
// them are the draft. It looks in the history (the prompt and every token generated so far, in
// order) and in extra sources: fixed token arrays the caller adds, such as the text a client
// predicts the answer to be (OpenAI's Predicted Outputs). A draft costs nothing to be wrong about
// except the verification (engine_verify), so the drafter adapts its length to how often drafts
// are right: longer after a draft accepted whole, shorter after one that was not.
//
// Which occurrence: each source keeps a cursor, the position after the last draft it gave that was
// (partly) accepted; a match at or after the cursor is taken first (the earliest such: a copy
// that goes on where it was, past a repeated line), else the latest match before it. With no
// cursor yet, the latest match. Sources are tried in the order added, the history last, at each n.
//
// Indexing: every n-gram of a source is hashed into a chained table when its following token is
// known, so a lookup costs a few probes however long the history (DRAFT_WALK at most), and a
// token pushed costs n_max inserts.
#pragma once

#include <stdbool.h>
#include <stdint.h>

enum {
    DRAFT_NGRAM_MAX = 8, // the longest n-gram a drafter can index (n_max <= this)
    DRAFT_LEN_MAX = 16,  // the longest draft (engine_verify_max - 1 is the usual limit)
    DRAFT_SOURCES = 4,   // the history and up to three extra sources
    DRAFT_WALK = 64,     // chain links a lookup follows (older matches are not seen)
};

// One token array and its n-gram index.
struct draft_source {
    int32_t *ids; // [n] (owned copy)
    int n, cap;
    int indexed;                // n-grams ending before this position are in the index
    int cursor;                 // where a copy from this source goes on (-1: none yet)
    uint32_t mask;              // buckets - 1 (a power of two minus one; 0: no table yet)
    int *head[DRAFT_NGRAM_MAX]; // [mask + 1] per n-gram length: the last n-gram's end in each bucket (-1: none)
    int *prev;                  // [cap * n_max] the previous end in the same bucket, per length
};

// How a drafter drafts (draft_init; NULL: DRAFT_POLICY_DEFAULT's).
struct draft_policy {
    int n_max, n_min;  // the n-gram lengths matched, longest first (1 <= n_min <= n_max <= DRAFT_NGRAM_MAX)
    int len_init;      // the first draft's length (at most the drafter's len_max)
    float gate;        // drafts are given while the hit rate is at least this (0: always)
    float rate_weight; // the weight of each new hit or miss in the hit rate (0 < w <= 1)
};
// The default, measured on edit tasks over real text with the Qwen3.6 vocabulary (bench/lab/draft_lab.c,
// 24 tasks): n-grams of 6 down to 1 (at most 3 loses 3-4% of the speed-up, at most 2 a fifth:
// longer ones find the right copy among repeated lines; 1 still finds a draft at all); the gate
// keeps text that copies nothing (prose, new code) at no loss where a verification costs what
// MoE routing makes it (without it 0.93x there, with it >= 1.01x); the length policy (+1 / -1)
// is within 1% of the others tried (+2 / -1, doubling, the accepted length + 1). A weight of 0.2
// (not 0.5) lets a backend's higher gate (engine_verify_gate) hold against short runs of hits: at
// the H200's costs and gate 0.9, text that copies nothing goes from 0.95-0.99x to 0.99-1.01x, the
// other figures within 1% (32 tasks).
#define DRAFT_POLICY_DEFAULT                                                                                           \
    ((struct draft_policy){.n_max = 6, .n_min = 1, .len_init = 4, .gate = 0.5f, .rate_weight = 0.2f})

// The hit-rate gate: how often a draft's first token is right, a moving average over drafts
// verified and drafts only looked at. While it is under the gate a draft is only looked at: its
// first token is checked against the next token instead of being verified. Any source of drafts
// can sit behind one (the drafter below has its own; calla bench's oracle drafts use one too).
struct draft_gate {
    float gate, weight; // the policy's gate and rate_weight
    float rate;         // starts at 1: the first drafts are verified
    int32_t shadow;     // a looked-at draft's first token (-1: none pending)
};
void draft_gate_init(struct draft_gate *g, float gate, float weight);
// A draft whose first token is first: true when it is to be verified (then draft_gate_result);
// false when it is only looked at (checked by the next draft_gate_next).
bool draft_gate_pass(struct draft_gate *g, int32_t first);
// The token that came next (each token, in order).
void draft_gate_next(struct draft_gate *g, int32_t tok);
// A verified draft: its first token was right or not.
void draft_gate_result(struct draft_gate *g, bool first_right);

struct engine;
// The policy a request's drafter runs on e: the default, with the backend's gate where it has one
// (engine_verify_gate).
struct draft_policy draft_policy_for(const struct engine *e);

struct drafter {
    int n_max, n_min; // the policy's
    int len_max;      // the longest draft (<= DRAFT_LEN_MAX)
    int len;          // the next draft's length: grows by 1 after a draft accepted whole, else shrinks by 1 (>= 1)
    // draft_propose gives nothing while the gate is shut, and looks at the draft it would have given.
    struct draft_gate gate;
    // The sources: [0] the history, [1..n_sources) the extra ones.
    struct draft_source src[DRAFT_SOURCES];
    int n_sources;
    // The last draft: its source and where in it the draft began (draft_result moves the cursor).
    int last_src, last_at;
    // Counts over every draft_result: tokens drafted and tokens accepted.
    long long drafted, accepted;
};

// A drafter whose history is prompt[0..n) and whose drafts are at most len_max tokens (1 to
// DRAFT_LEN_MAX; the caller's engine_verify_max - 1), with policy p (NULL: the default). 0, or -1
// when out of memory or the policy is out of range (nothing to free).
int draft_init(struct drafter *d, const int32_t *prompt, int n, int len_max, const struct draft_policy *p);
void draft_free(struct drafter *d);
// An extra source: a copy of ids[0..n) (n >= 2 to be of use). 0, or -1 when out of memory or
// DRAFT_SOURCES are taken.
int draft_add_source(struct drafter *d, const int32_t *ids, int n);
// Appends a token to the history (each generated token, in order). 0, or -1 when out of memory
// (the drafter still works, on the history it has).
int draft_push(struct drafter *d, int32_t tok);
// The draft that follows the history, into out [limit]: its length, 0 when there is none (no
// match, or limit < 1). At most min(d->len, limit) tokens.
int draft_propose(struct drafter *d, int limit, int32_t *out);
// The verification of the last draft: k tokens drafted, the first m of them right (0 <= m <= k).
// Adapts the length and moves the source's cursor.
void draft_result(struct drafter *d, int k, int m);

// The tokens a verification accepts: the longest prefix of draft[0..k) with draft[i] == next[i],
// where next[i] is the greedy token after verified row i (engine_verify's all_next).
int draft_accepted(const int32_t *draft, int k, const int32_t *next);
