// openai.h: the OpenAI protocol of `calla serve` (openai.c): /v1/chat/completions and
// /v1/completions, as functions without sockets.
//
// A request body becomes a job (job.h): a generation request (generate.h) and the protocol's
// sink, which turns the generation's events into the answer in the job's output channel: SSE
// chunks while streaming, else the whole chat.completion / text_completion object at the end.
// Errors are OpenAI's {"error": {...}} shape.  Another protocol is a module beside this one, with
// its own parser and sink over the same job and generation request.
#pragma once

#include "chatreq.h"
#include "generate.h"
#include "job.h"
#include "util.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    MAX_STOPS = 4,         // OpenAI's limit on `stop`
    MAX_TOP_LOGPROBS = 20, // OpenAI's limit on top_logprobs
};
_Static_assert((int)MAX_TOP_LOGPROBS <= (int)GEN_MAX_TOP, "a token's logprobs hold OpenAI's top_logprobs");

enum openai_endpoint { OPENAI_CHAT, OPENAI_COMPLETIONS };

// What parsing a request needs from the server.
struct openai_ctx {
    const struct tokenizer *tok;
    int vocab;                    // token ids must be below it
    long long context;            // prompt + max_tokens + 1 must fit
    long long default_max_tokens; // when the request gives none
    const char *model_name;
    bool allow_sampling; // calla serve --allow-sampling: temperature & co. fill gen_request.sampling
};

// The answer being built: the sink's context (job->sink.ctx).
struct openai_resp {
    struct job *j;               // whose output channel the answer goes to (and whose request it answers)
    bool chat;                   // chat.completion (else text_completion)
    bool include_usage;          // streaming: a usage chunk after the finish
    bool return_ids;             // return_token_ids: the generated ids in the choice (as vLLM)
    const struct tokenizer *tok; // token text for logprobs
    const char *model_name;
    long long created;
    struct sbuf content, reasoning_text;
    json_t *calls;        // the calls found (OpenAI tool_calls), or NULL
    struct token_lp *lps; // [n_lps] per generated token, the closing stop token excluded
    int n_lps, lps_cap;
    int lps_sent; // streaming: entries already sent
};

// A request body -> a job ready to queue, or NULL and re (a 4xx, or 500 when out of memory).
struct job *openai_parse_request(const struct openai_ctx *oc, enum openai_endpoint ep, const char *data, size_t len,
                                 struct req_error *re);
// A job with the protocol's sink and nothing parsed yet (its id made, logprobs off); NULL when out of memory.
struct job *openai_job_new(const struct openai_ctx *oc, enum openai_endpoint ep);
// {"error": {"message", "type", "param", "code"}} for a status.
json_t *openai_error_body(int status, const char *param, const char *msg);
// A chat request's messages and tools -> the prompt text (malloc'd) and the byte offset of the
// snapshot point; sets r->reasoning, r->tools (and r->schema for a forced call).  chatreq_render:
// the body is the chat template's input as it comes.  (check_greedy: chatreq.h.)
int openai_render_chat(const json_t *body, struct gen_request *r, char **out, unsigned char **markup, size_t *len,
                       size_t *boundary, struct req_error *re);
