// tokmask.h: constrained decoding's token masks, from a byte trie of the vocabulary.
//
// The matcher (constrain.h) says whether bytes can continue a document.  Which of the 248,320
// tokens can come next is the mask of a step: rather than running every token's bytes through
// the matcher (what constrained_allows did token by token), the mask walks a trie of the
// vocabulary's byte strings from the matcher's state, so a shared prefix is matched once and a
// dead prefix cuts its whole subtree.  Inside a string (or a tool call's free text) the state
// stands still under most bytes: a token made only of such bytes is allowed whatever it is, so
// those come from a bitset made once, and the walk visits only the paths with a quote, a
// backslash or a control byte on them.
//
// The trie is built once per loaded tokenizer (the server builds it at start) and is read-only
// after, so any thread may walk it; a walk's scratch is a struct token_walker of its own.
//
// struct constrained is the decoder's side: the document so far, the mask of the next step, and
// the pick (forced text, the greedy token, the masked argmax, the budget).  The mask of step k+1
// depends on the token of step k only, so it can be computed on a helper thread while the
// backend runs the forward of step k+1 (MASK_OVERLAP); the pick then waits for it.
#pragma once

#include "engine.h"

#include "constrain.h"
#include "tokenizer.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct token_trie;
struct token_walker;

// Every token but the special ones (stop tokens included: the caller adds those when the
// document is done) and ids without bytes.  0, or -1 with a message.
int token_trie_build(const struct tokenizer *tok, int vocab, struct token_trie **out, char *err, size_t errlen);
void token_trie_free(struct token_trie *t);
size_t token_trie_bytes(const struct token_trie *t); // memory held
int token_trie_nodes(const struct token_trie *t);
int token_trie_vocab(const struct token_trie *t);
static inline size_t token_mask_words(int vocab) {
    return ((size_t)vocab + 63) / 64;
}

struct token_walker *token_walker_new(const struct token_trie *t, const struct cschema *c);
void token_walker_free(struct token_walker *w);
// mask [token_mask_words(vocab)]: bit id set when token id can come after s (a stop token when
// the document is done).  Returns the trie nodes visited (a cost measure).
long token_mask(struct token_walker *w, const struct cstate *s, uint64_t *mask);
// Only the tokens after which the document can still end within limit bytes (cstate_distance):
// the pick near the end of max_tokens.
long token_mask_within(struct token_walker *w, const struct cstate *s, int limit, uint64_t *mask);
// The same mask, every token's bytes through the matcher on its own (the reference; tests and
// `calla maskbench` compare the two).
void token_mask_naive(const struct token_trie *t, const struct tokenizer *tok, const struct cstate *s, uint64_t *mask);
// limit < 0: no limit.
void token_mask_naive_within(const struct token_trie *t, const struct tokenizer *tok, const struct cstate *s, int limit,
                             uint64_t *mask);

// Of the tokens in mask, the one with the largest logit (lowest id on ties); -1 when none.
int32_t token_mask_argmax(const uint64_t *mask, const float *logits, int vocab);

// ---- the constrained decoder ------------------------------------------------------------------

enum mask_mode {
    MASK_OFF,     // no trie: each candidate through the matcher, all logits sorted when the greedy token fails
    MASK_SYNC,    // the trie's mask, computed when the greedy token fails
    MASK_OVERLAP, // the trie's mask of the next step on a helper thread during the forward
};
// "off", "sync", "overlap"; -1 for anything else.
int mask_mode_parse(const char *s);
const char *mask_mode_name(enum mask_mode m);

struct constrained {
    const struct tokenizer *tok;
    struct cstate *s, *tmp; // the document so far; a scratch copy for trying a token
    struct cstate *s0;      // the empty document (constrained_restart)
    int32_t *order;         // [vocab] token ids by logit, most likely first
    int vocab;
    enum mask_mode mode;
    struct token_walker *w;
    uint64_t *mask; // the tokens allowed after s (when mask_ok)
    uint64_t *fit;  // scratch: those of them that leave room to close the document
    bool mask_ok;
    // MASK_OVERLAP: the helper thread computes the mask of ms into mask_next.
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool th_started, pending, done, quit;
    struct cstate *ms;
    uint64_t *mask_next;
    // Costs, for `calla maskbench`: seconds spent waiting in the pick for the mask (critical
    // path), computing masks (anywhere), masks computed, greedy tokens taken as they were.
    double wait_s, mask_s;
    long n_masks, n_greedy, n_picks;
};

// trie NULL, or mode MASK_OFF: no masks; a pick whose greedy token fails sorts all logits and
// tries each candidate through the matcher.  0, or -1 (out of memory).
int constrained_init(struct constrained *c, const struct cschema *schema, const struct tokenizer *tok,
                     const struct token_trie *trie, enum mask_mode mode);
void constrained_free(struct constrained *c);
// A new document from the start (the benchmark's next one); no mask may be pending.
void constrained_restart(struct constrained *c);
// Starts the mask of the next step (after the last pick) on the helper thread (MASK_OVERLAP);
// does nothing in the other modes.  Call it before the forward whose logits the next pick reads.
void constrained_prepare(struct constrained *c);
// The next token of the answer, given the step's logits and greedy token and the tokens left
// (budget, this one included).  Advances the document by it.
int32_t constrained_pick(struct constrained *c, const float *logits, int32_t greedy, int budget);
// The mask of the next pick (waiting for the helper thread's, or computing it now), as the
// backend's choice reads it (struct engine_pick.allow: bit i % 32 of 32-bit word i / 32, the same
// bits as the 64-bit words on a little-endian host); NULL in MASK_OFF.
const uint32_t *constrained_mask(struct constrained *c);
// The next token of the answer from a backend's choice made under constrained_mask's mask: the
// longest forced token, else the greedy id (not when sampled: then the draw), else the choice's
// allowed argmax or draw when it fits the budget, else what constrained_pick makes of the row's
// logits, which row(arg) reads (rare: near the budget's end; NULL from it: a stop token).
int32_t constrained_pick_choice(struct constrained *c, const struct engine_choice *ch, bool sampled, int budget,
                                const float *(*row)(void *), void *arg);
