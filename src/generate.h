// generate.h: the generation loop, the one that `calla serve` and `calla run` share.
//
// A request (struct gen_request: the prompt, max_tokens, stop strings, a constraint, tools,
// logprobs) runs on a sequence that already holds the prompt's first `from` tokens (what the
// session cache gave): prefill the rest, then decode a token a step (greedy, or drawn under
// --allow-sampling's parameters; greedy ones several a step when a draft of them is verified in one
// forward: gen_env.speculative, the same tokens), until a stop token, a stop string or max_tokens.
// What happens goes to a sink (struct gen_sink) as events that name
// no protocol: text tagged by channel (reasoning before </think>, then the answer), tool calls as
// a name and a JSON object of arguments, each token's logprobs, prefill progress; the end (a
// finish reason, or an error, with the usage) is sent by the caller, which knows the queue time and
// the cache.  Each protocol (openai.c) implements a sink; `calla run` has one that prints.
//
// The text rules, the same for every protocol: a channel holds back text that could still
// become a stop string, so what is streamed is exactly what a whole answer holds; the reasoning
// channel drops its leading and trailing newlines, the answer its leading ones after </think>;
// with tools, the answer goes through the tool-call parser (toolcall.h), so call markup never
// reaches the text; with a schema, each answer token is the constrained pick (tokmask.h).
//
// Not thread-safe: one generation runs on one thread (the server's worker).
#pragma once

#include "engine.h"
#include "toolcall.h"
#include "util.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cschema;
struct tokenizer;
struct token_trie;

enum { GEN_MAX_TOP = 20 }; // alternatives a token's logprobs can carry

// How each token is chosen.  off (the default): greedy, the most likely token.  on: drawn from the
// distribution at `temperature` (> 0), cut to the top_k most likely (0: no cut), to the smallest set
// whose probability reaches top_p (1: no cut) and to those at least min_p times the most likely
// one's (0: no cut), after presence_penalty is taken from the logit of every token already
// generated; `seed` makes the draws repeatable (has_seed false: the protocol picked a random one).
struct gen_sampling {
    bool on;
    float temperature, top_p, min_p, presence_penalty;
    int top_k;
    uint64_t seed;
    bool has_seed;
};

// What to generate.  Filled by a protocol from its request; gen_request_free frees what it owns.
struct gen_request {
    int32_t *prompt; // [n_prompt] (owned)
    int n_prompt;
    int boundary;   // prompt tokens up to the last message boundary (0: none): a snapshot point
    int32_t *draft; // [n_draft] tokens the output is expected to repeat, a source of drafts for
    int n_draft;    // speculative decoding besides the prompt (a prediction, tokenized; owned; NULL: none)
    int max_tokens; // >= 1; the stop token counts
    bool reasoning; // the output opens in the reasoning channel, which </think> ends
    char **stops;   // [n_stops] stop strings (owned): the text ends before the first one found
    size_t *stop_len;
    int n_stops;
    json_t *tools;                // the answer's tool calls are parsed against these (a reference; NULL: none)
    struct cschema *schema;       // the answer is constrained to this document (owned; NULL: free text)
    int logprobs;                 // -1: none; else each token's logprob and this many alternatives (<= GEN_MAX_TOP)
    bool ignore_stop;             // stop tokens do not end the output, only max_tokens and stop strings do
                                  // (calla run --ignore-eos; the API's ignore_eos)
    bool echo_stop;               // the stop token that ends the output is decoded into it too (calla run)
    int reasoning_budget;         // > 0: after this many reasoning tokens "\n</think>" is forced (the answer follows)
    int max_calls;                // > 0: the output ends once this many tool calls are complete
    struct gen_sampling sampling; // off: greedy
};

// Appends a copy of s[0..n) to the stop strings; 0, or -1 when out of memory.
int gen_request_add_stop(struct gen_request *r, const char *s, size_t n);
void gen_request_free(struct gen_request *r);
// The logits of each step are needed (logprobs, a constraint, sampling): the last prompt token
// must then run, so a cached state may cover at most n_prompt - 1 tokens.
bool gen_wants_logits(const struct gen_request *r);

// ---- events ------------------------------------------------------------------------------------

enum gen_channel { GEN_ANSWER, GEN_REASONING };

enum gen_finish {
    GEN_FINISH_NONE,          // no finish: the generation failed (struct gen_end's status and message)
    GEN_FINISH_STOP,          // a stop token: the model ended its turn
    GEN_FINISH_STOP_SEQUENCE, // a stop string
    GEN_FINISH_LENGTH,        // max_tokens
    GEN_FINISH_TOOL_CALLS,    // the answer holds tool calls (whatever ended it)
};
// "stop", "stop_sequence", "length", "tool_calls" ("error" for none): for logs.
const char *gen_finish_name(enum gen_finish f);

// A generated token's log-probability and those of the most likely alternatives.
struct token_lp {
    int32_t id;
    float lp;
    int n_top;
    int32_t top_id[GEN_MAX_TOP]; // most likely first (lowest id on ties)
    float top_lp[GEN_MAX_TOP];
};
// Log-softmax of logits[0..vocab) for the chosen token and the k most likely ones.
void gen_logprobs(const float *logits, int vocab, int32_t chosen, int k, struct token_lp *out);

// The end of a generation, as its caller reports it.
struct gen_end {
    enum gen_finish finish; // GEN_FINISH_NONE: failed
    int status;             // a failure's HTTP-like status (500, 499 cancelled, 503 shutting down)
    const char *message;    // a failure's message
    const int32_t *ids;     // [n_gen] the generated ids, the closing stop token included
    int n_gen;
    const char *stop;       // GEN_FINISH_STOP_SEQUENCE: the stop string found (NULL: none)
    int n_prompt, n_cached; // prompt tokens, of them taken from the session cache
    double queue_ms, prefill_ms, decode_ms;
    int prediction_accepted, prediction_rejected; // drafted from the request's prediction: in the output, and not
};

// The events, in order: progress (a prefill of several chunks: before the first and after each),
// begin (the prompt is in: the first token follows), then for each token: token, logprobs (when
// asked; not for the closing stop token), text and tool calls; then end, from the caller.  Any may
// be NULL.  Strings are valid during the call only.
//
// A tool call: tool_call_begin once its markup is known to be a call of that function, then
// tool_call_delta with pieces of its arguments' JSON as they become certain, then tool_call with
// the whole arguments (the pieces joined) or, when its markup went wrong after all,
// tool_call_abort (its text then comes as answer text).  A sink that wants calls whole reads
// tool_call only.
struct gen_sink {
    void *ctx;
    void (*progress)(void *ctx, int done, int total);
    void (*begin)(void *ctx);
    void (*token)(void *ctx, int32_t id);
    int (*logprobs)(void *ctx, const struct token_lp *lp); // 0, or -1 (out of memory): the generation fails
    void (*text)(void *ctx, enum gen_channel ch, const char *s, size_t n);
    void (*tool_call)(void *ctx, const char *name, const char *arguments); // arguments: a JSON object
    void (*end)(void *ctx, const struct gen_end *e);
    void (*tool_call_begin)(void *ctx, const char *name);
    void (*tool_call_delta)(void *ctx, const char *json, size_t n);
    void (*tool_call_abort)(void *ctx);
};

// ---- the text side: channels, stop strings, tool calls -------------------------------------------

struct gen_chan {
    enum gen_channel ch;
    struct sbuf pend;   // decoded, not yet sent
    bool strip_lead_nl; // drop newlines before the first other character
    bool trim_trail_nl; // drop newlines at the end of the channel
    bool started;
};

// Decoded text on its way to the sink.  Must not move once initialised (the tool parser points to it).
struct gen_text {
    const struct gen_request *req;
    const struct gen_sink *sink;
    struct gen_chan reasoning, answer, *cur;
    bool tools; // the answer goes through tp
    struct tool_parser tp;
    int stop; // the stop string found (its index in req->stops), -1: none
};

void gen_text_init(struct gen_text *t, const struct gen_request *r, const struct gen_sink *sink);
// Adds text to the current channel and sends what can no longer change; final: the channel ends
// here.  Returns true when a stop string was found (the text is cut before it; the output ends).
bool gen_text_push(struct gen_text *t, const char *s, size_t n, bool final);
// The reasoning channel has ended (its final push done): the answer follows.
void gen_text_answer(struct gen_text *t);
// Tool calls handed to the sink so far.
int gen_text_calls(const struct gen_text *t);
void gen_text_free(struct gen_text *t);

// ---- the loop ----------------------------------------------------------------------------------

// What a generation runs on, and the caller's hooks (arg is theirs).
struct gen_env {
    struct engine *e;
    struct seq *s;                 // holds the prompt's first `from` tokens
    const struct tokenizer *tok;   // NULL: ids only (no text, no tools, no schema)
    const struct token_trie *trie; // constrained decoding's masks (tokmask.h); NULL: without
    int mask_mode;                 // enum mask_mode
    float *logits;                 // [vocab] a row of logits (engine_logits_alloc); NULL when never wanted
    int vocab;
    int chunk;                                        // prompt tokens per forward call (0: the engine's)
    bool (*cancelled)(void *arg);                     // before each forward and between chunks
    void (*progress)(void *arg, int done, int total); // a prefill of several chunks, beside the sink's
    // Called when the prompt is in up to req->boundary (when that is past `from` and before its
    // end): the sequence then holds exactly prompt[0..pos), next is the greedy token after them.
    void (*snapshot)(void *arg, int pos, int32_t next);
    void *arg;
    // Speculative decoding (draft.h, engine_verify): drafts from the prompt and the output, verified
    // several tokens a forward. Never changes the output; used only for greedy requests without
    // logprobs or a constraint (a schema, a forced tool call), on a backend that verifies.
    bool speculative;
};

enum { GEN_NOMEM = -3 }; // besides ENGINE_OK, ENGINE_ERROR and ENGINE_CANCELLED

struct gen_result {
    int rc; // ENGINE_OK, ENGINE_ERROR (err), ENGINE_CANCELLED or GEN_NOMEM (err)
    char err[256];
    enum gen_finish finish; // when rc == ENGINE_OK
    int stop;               // GEN_FINISH_STOP_SEQUENCE: the index of the stop string in req->stops (else -1)
    int32_t *ids;           // [n] the generated ids, the stop token included (malloc'd: free it)
    int n;
    int drafted, accepted;             // speculative decoding: draft tokens verified, and of them in the output
    int extra_drafted, extra_accepted; // of those, drafted from the request's own draft (a prediction)
    double t_prefilled, t_end;         // now_s() when the prompt was in, and at the end
    int32_t greedy_next;               // the argmax after the prompt and ids[0..n-1): the sequence's greedy next
                                       // token at the end (ids[n-1] when that was greedy; not when sampled,
                                       // constrained or forced), what the session cache keeps with the state
};

// Runs req on env->s from prompt position `from` (next: the greedy token after the whole prompt
// when the state holds all of it and it is known, else NULL; always NULL when gen_wants_logits),
// sending events to sink (not end).  With req->sampling on, token i is the engine's draw of step i
// of the request's seed (engine.h, struct engine_sampling), the presence penalty on the ids
// generated so far: the same request and seed give the same tokens.
// Returns res->rc.  On success the sequence holds the prompt and every generated token but the
// last; free res->ids in any case.
int generate(const struct gen_env *env, const struct gen_request *req, int from, const int32_t *next,
             const struct gen_sink *sink, struct gen_result *res);
