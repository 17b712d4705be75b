// responses.h: OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}),
// the API Codex speaks, as functions without sockets (responses.c).
//
// A request body becomes a job (job.h) whose generation request holds the prompt the Qwen3.6
// template makes of it (its input items translated into the template's input, chatreq.h), or,
// continuing a stored response whose instructions and tools it keeps (previous_response_id),
// that response's tokens followed by the new input's; the sink renders the generation as output
// items (reasoning, message, function_call), streamed as the Responses events or whole at the
// end, and keeps the response in the store (response_store.h) when asked to.  Errors are OpenAI's
// {"error": {...}} (openai_error_body).
#pragma once

#include "answer.h"
#include "chatreq.h"
#include "job.h"
#include "response_store.h"

#include <jansson.h>
#include <stdbool.h>

// The answer being built: the sink's context (job->sink.ctx).
struct responses_resp {
    struct answer ans; // the output items, in order (first: answer_attach)
    struct job *j;
    struct rstore *store; // where to keep it (store: true), or NULL
    const char *model_name;
    long long created;
    bool started;    // streaming: response.created sent
    bool incomplete; // the end: max_output_tokens (the open item is incomplete)
    int seq;         // streaming: the next event's sequence_number
    // Echoed in the response object (references), and what a continuation needs.
    json_t *echo;       // {"instructions", "max_output_tokens", "previous_response_id", "reasoning",
                        //  "text", "tool_choice", "tools", "parallel_tool_calls", "store", "metadata",
                        //  "user", "prompt_cache_key"}
    json_t *conv;       // the conversation's messages (the template's, no system message), or NULL
    char *instructions; // NULL: none
    char *tools;        // the template's tools as JSON text ("" none)
};

// A request body -> a job ready to queue, or NULL and re (a 4xx, 404 for an unknown
// previous_response_id, or 500 when out of memory).  store: the stored responses (NULL: none).
struct job *responses_parse_request(const struct chatreq_ctx *c, struct rstore *store, const char *data, size_t len,
                                    struct req_error *re);
// A job with the sink and nothing parsed yet (its id made); NULL when out of memory.
struct job *responses_job_new(const struct chatreq_ctx *c);
