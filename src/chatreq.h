// chatreq.h: what the protocol modules (openai.c, anthropic.c, responses.c) share on the request
// side: the checks every API makes (greedy-only sampling, typed fields, stop strings, the
// context), and a chat request in the template's terms -> the prompt's tokens.
//
// The template's input is a JSON object in the shape Hugging Face chat templates take (and the
// OpenAI chat API mirrors), so OpenAI's body is it as it comes and the other APIs translate into it:
//   {"messages": [{"role": "system" | "developer" | "user" | "assistant" | "tool",
//                  "content": a string, null, or [{"type": "text", "text": ...}],
//                  "reasoning_content": a string (assistant),
//                  "tool_calls": [{"function": {"name", "arguments": an object or its JSON text}}]}],
//    "tools": [{"type": "function", "function": {"name", "description", "parameters"}}],
//    "tool_choice": "auto" | "none" | "required" | {"type": "function", "function": {"name"}},
//    "parallel_tool_calls": a boolean,
//    "chat_template_kwargs": {"enable_thinking", "preserve_thinking"},
//    "enable_thinking": a boolean, "reasoning_effort": an effort (chatreq_effort_thinks): the OpenAI
//    chat API's other ways of saying enable_thinking}
// Errors name "messages", "tools" or "tool_choice" as the parameter (a translating API renames).
#pragma once

#include "generate.h"
#include "job.h"
#include "util.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;

enum {
    MAX_STOP_BYTES = 256, // per stop string
    MAX_TOOLS = 128,      // OpenAI's limit on tools
};

// What parsing a request needs from the server (anthropic.c, responses.c; openai.h has its own).
struct chatreq_ctx {
    const struct tokenizer *tok;
    int vocab;                    // token ids must be below it
    long long context;            // prompt + max_tokens + 1 must fit
    long long default_max_tokens; // when the request gives none
    const char *model_name;
    bool allow_sampling; // calla serve --allow-sampling: the API's sampling parameters fill gen_request.sampling
};

// ---- checks --------------------------------------------------------------------------------------

// A request body -> its JSON object, or NULL with a 400 (malformed JSON, or not an object).
json_t *chatreq_load(const char *data, size_t len, struct req_error *re);
// Every top-level field of a request, in a table per API: a field not in it is a 400 naming it
// (a field a client expects to change the answer is never dropped in silence).  The fields of
// features Calla lacks are listed too, with the value that means "off", so that a client sending
// their defaults is served and any other value is a 400 that says why.
enum chatreq_field_kind {
    FIELD_READ,  // read by the API's parser
    FIELD_INERT, // accepted, of the type in `arg`; changes nothing in the answer
    FIELD_OFF,   // a feature Calla lacks: only null and the JSON values in `arg` ("|" between them) pass
};

struct chatreq_field {
    const char *name;
    unsigned eps; // the API's endpoints that take it, a bit each (an API of one endpoint: 1)
    enum chatreq_field_kind kind;
    const char *arg; // FIELD_INERT: "string", "boolean", "metadata" (an object of strings) or "any";
                     // FIELD_OFF: the values that pass
    const char *why; // FIELD_OFF: why any other value is refused
};

// Every field of body (null ones are absent) is in fields[0..n) with the bit ep, and the inert and
// "off" ones hold what they may: 0, or -1 with a 400.  unknown: the refusal of a field not listed,
// in the API's words, a format with "%.*s" for its name (no param: the name is the client's text);
// elsewhere: that of a field of the API's other endpoints, a format with "%s" for it (NULL: none).
int chatreq_check_fields(const json_t *body, const struct chatreq_field *fields, size_t n, unsigned ep,
                         const char *unknown, const char *elsewhere, struct req_error *re);

// The sampling parameters an API takes (a bit each) when the server samples (--allow-sampling).
enum {
    SAMPLE_TEMPERATURE = 1,
    SAMPLE_TOP_P = 2,
    SAMPLE_TOP_K = 4,
    SAMPLE_MIN_P = 8,
    SAMPLE_PRESENCE_PENALTY = 16,
    SAMPLE_SEED = 32,
    SAMPLE_ALL = 63,
};
// Sampling parameters into *s.  Without allow, every one (temperature, top_p, top_k, min_p, ...,
// seed, logit_bias) takes only the value that means greedy; with it, those of `takes` fill *s
// (s->on when temperature > 0, at most max_temperature; no seed: a random one) and the others stay
// greedy-only.  Anything else is a 400 naming the parameter.  The one place every API reads them.
int chatreq_sampling(const json_t *body, bool allow, unsigned takes, double max_temperature, struct gen_sampling *s,
                     struct req_error *re);
// chatreq_sampling without --allow-sampling: only the values that mean greedy pass.
int check_greedy(const json_t *body, struct req_error *re);
// A reasoning effort ("none", "minimal", "low", "medium", "high", "xhigh") -> thinking on (1) or
// off (0: "none" and "minimal"; the model has one depth of thinking); -1 for any other string.
int chatreq_effort_thinks(const char *effort);
// The session key (j->session, for X-Session-Id) from the first of the string fields names (NULL
// ends them) that can be a header value; one that cannot is accepted, not mirrored.  0, or -1 with
// a 400 when one is not a string.
int chatreq_session(const json_t *body, const char *const *names, struct job *j, struct req_error *re);
// Optional field of a given JSON type (JSON_TRUE: a boolean; JSON_INTEGER: any number): 0 (absent
// or null: *out NULL), or -1 with a 400 naming it.
int chatreq_get_opt(const json_t *obj, const char *name, json_type type, const json_t **out, struct req_error *re);
int chatreq_get_bool(const json_t *obj, const char *name, bool def, bool *out, struct req_error *re);
// An integer, or a real with an integral value.
bool chatreq_integral(const json_t *v, long long *out);
// Bytes of s to quote in a message: at most max, never ending inside a UTF-8 sequence.
int chatreq_clip(const char *s, int max);
// A function name as OpenAI allows it: 1..64 of [A-Za-z0-9_-] (what keeps <function=NAME> whole).
bool chatreq_valid_name(const char *s);
// Stop strings (param: the field's name; a string or an array of at most max strings) -> r->stops.
int chatreq_stops(struct gen_request *r, const json_t *stop, const char *param, int max, struct req_error *re);
// The prompt and max_tokens against the context (max_tokens 0: the default, within what is left;
// -1: all that is left) -> r->max_tokens; prompt_param and max_param name the request's fields in the errors.
int chatreq_fit(struct gen_request *r, long long context, long long default_max, long long max_tokens,
                const char *prompt_param, const char *max_param, struct req_error *re);

// ---- the chat template's input -> the prompt ------------------------------------------------------

// chat -> the prompt text (malloc'd) and the byte offset of the snapshot point (the end of the
// last message); sets r->reasoning, r->tools (and r->schema for a forced call).  *markup (if
// not NULL): which bytes may hold added tokens (chat_render_markup).  after_turn: the messages
// continue a conversation rendered up to its last assistant turn (chat.h, after_turn).
int chatreq_render(const json_t *chat, bool after_turn, struct gen_request *r, char **out, unsigned char **markup,
                   size_t *len, size_t *boundary, struct req_error *re);
// text -> *ids (malloc'd), added tokens recognised only where markup is 1 (markup NULL:
// anywhere, for a completion prompt, the client's own text); a 400 when it cannot be tokenized.
int chatreq_tokens(const struct tokenizer *tok, const char *text, const unsigned char *markup, size_t len,
                   int32_t **ids, int *n, struct req_error *re);
// chat -> r->prompt: the n_before tokens of before (a continued conversation's; NULL, 0: none),
// then the rendered messages' tokens; r->boundary at the snapshot point.
int chatreq_encode(const struct tokenizer *tok, const json_t *chat, const int32_t *before, int n_before,
                   struct gen_request *r, struct req_error *re);
