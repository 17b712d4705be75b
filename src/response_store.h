// response_store.h: the Responses API's stored responses (store: true), a bounded LRU in memory.
//
// An entry is what a later request needs to go on from a response (previous_response_id) and
// what GET /v1/responses/{id} returns: the response object as sent, the conversation up to and
// with it (the chat template's messages, chatreq.h, without the system message, which
// `instructions` gives anew each time), the instructions and tools it ran with, and its tokens
// (prompt and output): a continuation that keeps the instructions and tools is those tokens and
// the new input's, so the session cache's end state of this response is its prefix.  Bounded by
// entries and bytes; the least recently used goes first.  Thread-safe (one mutex): parsers on the
// connections' threads read it, the worker's sink writes it.
#pragma once

#include "job.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct rstore_entry {
    char id[48];
    char *response;     // the response object, JSON text (malloc'd)
    json_t *conv;       // the conversation's messages, this response's output last
    char *instructions; // NULL: none
    char *tools;        // the template's tools as JSON text ("" none)
    int32_t *tokens;    // [n_tokens] the prompt, then the output
    int n_tokens;
    bool continuable;                 // the output ended its turn (<|im_end|>): tokens can be continued
    char session[MAX_SESSION_ID + 1]; // the session key it was made with ("": none)
    size_t bytes;                     // what it holds, about
    uint64_t used;                    // LRU clock
};

struct rstore {
    pthread_mutex_t mu;
    struct rstore_entry **v; // [n]
    int n, max_entries;      // max_entries 0: nothing is kept
    size_t bytes, max_bytes;
    uint64_t clock;
};

int rstore_init(struct rstore *s, int max_entries, size_t max_bytes);
void rstore_free(struct rstore *s);
// Takes e (its bytes computed here), evicting the least recently used until it fits; one larger
// than the whole store, or a store of no entries, frees it.  0 when kept, -1 when not.
int rstore_put(struct rstore *s, struct rstore_entry *e);
// A copy of the entry with this id (marked used; free it with rstore_entry_free), or NULL.
struct rstore_entry *rstore_get(struct rstore *s, const char *id);
// The stored response object's JSON text (malloc'd), or NULL.
char *rstore_get_response(struct rstore *s, const char *id);
// Removes the entry: true when there was one.
bool rstore_delete(struct rstore *s, const char *id);
void rstore_entry_free(struct rstore_entry *e);
