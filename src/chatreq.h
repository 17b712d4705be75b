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
//    "chat_template_kwargs": {"enable_thinking", "preserve_thinking"}}
// Errors name "messages", "tools" or "tool_choice" as the parameter (a translating API renames).
#pragma once

#include "generate.h"
#include "util.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;

enum {
    MAX_STOP_BYTES = 256,     // per stop string
    MAX_TOOLS = 128,          // OpenAI's limit on tools
};

// What parsing a request needs from the server (anthropic.c, responses.c; openai.h has its own).
struct chatreq_ctx {
    const struct tokenizer *tok;
    int vocab;                       // token ids must be below it
    long long context;               // prompt + max_tokens + 1 must fit
    long long default_max_tokens;    // when the request gives none
    const char *model_name;
};

// ---- checks --------------------------------------------------------------------------------------

// A request body -> its JSON object, or NULL with a 400 (malformed JSON, or not an object).
json_t *chatreq_load(const char *data, size_t len, struct req_error *re);
// Sampling parameters (temperature, top_p, top_k, min_p, ..., seed, logit_bias): only the values
// that mean greedy pass; anything else is a 400 naming the parameter.  The one place every API
// checks them.
int check_greedy(const json_t *body, struct req_error *re);
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
// The prompt and max_tokens against the context (max_tokens 0: the default, within what is left)
// -> r->max_tokens; prompt_param and max_param name the request's fields in the errors.
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
int chatreq_tokens(const struct tokenizer *tok, const char *text, const unsigned char *markup, size_t len, int32_t **ids,
                   int *n, struct req_error *re);
// chat -> r->prompt: the n_before tokens of before (a continued conversation's; NULL, 0: none),
// then the rendered messages' tokens; r->boundary at the snapshot point.
int chatreq_encode(const struct tokenizer *tok, const json_t *chat, const int32_t *before, int n_before,
                   struct gen_request *r, struct req_error *re);
