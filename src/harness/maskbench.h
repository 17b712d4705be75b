// maskbench.h: `calla maskbench`, the cost of constrained decoding (tokmask.h): the token trie's
// build, schema compile times, the mask per step on the CPU, and decode ms/token at a context
// with a schema (off, sync, overlap) against the same decode unconstrained.
#pragma once

#include "engine.h"
#include "tokmask.h"

struct maskbench_run {
    double ms_per_token; // wall per step: the forward and the pick
    double pick_ms;      // per step: the pick (on the critical path: after the forward, before the next)
    double wait_ms;      // per step: of it, waiting for (or computing) its mask
    double mask_ms;      // per mask computed, wherever it ran
    long n_masks, n_greedy, n_picks;
    int docs; // documents finished (each restarts the schema)
};

// A decode of n tokens as the server runs it: s has consumed the prompt but its last token,
// last.  schema NULL: unconstrained (greedy, no logits read back).  Otherwise each document gets
// doc_budget tokens (the budget closes it in time) and the next starts after its stop token.
// out [n] gets the tokens.  Returns n, or -1 with a message.
int maskbench_decode(struct engine *e, struct seq *s, const struct cschema *schema, const struct tokenizer *tok,
                     const struct token_trie *trie, enum mask_mode mode, int32_t last, int n, int doc_budget,
                     int32_t *out, struct maskbench_run *r, char *err, size_t errlen);

// The schemas of the tests (tests/test_openai.c, tests/test_server.py), by name, for compile times.
struct maskbench_schema {
    const char *name, *json;
};
extern const struct maskbench_schema maskbench_schemas[];
extern const int maskbench_n_schemas;
