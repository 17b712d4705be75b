// anthropic.h: Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens), the
// API Claude Code speaks, as functions without sockets (anthropic.c).
//
// A request body becomes a job (job.h) whose generation request holds the prompt the Qwen3.6
// template makes of it (translated into the template's input, chatreq.h) and whose sink renders
// the generation as a message: content blocks (thinking, text, tool_use) and usage, streamed as
// Anthropic's named events or whole at the end.  Errors are Anthropic's
// {"type": "error", "error": {"type": ..., "message": ...}}.
#pragma once

#include "answer.h"
#include "chatreq.h"
#include "job.h"
#include "util.h"

#include <jansson.h>
#include <stdbool.h>

enum { ANTHROPIC_MAX_STOPS = 16 }; // stop_sequences per request

// The answer being built: the sink's context (job->sink.ctx).
struct anthropic_resp {
    struct answer ans; // the content blocks, in order (first: answer_attach)
    struct job *j;
    const char *model_name;
    bool omit_thinking; // thinking.display "omitted": thinking blocks without their text
    bool started;       // streaming: message_start sent
};

// A request body -> a job ready to queue, or NULL and re (a 4xx, or 500 when out of memory).
struct job *anthropic_parse_request(const struct chatreq_ctx *c, const char *data, size_t len, struct req_error *re);
// count_tokens: the body's prompt tokens, as a generation of it would count them (usage's
// input_tokens + cache_read_input_tokens); 0, or -1 and re.
int anthropic_count_tokens(const struct chatreq_ctx *c, const char *data, size_t len, int *n, struct req_error *re);
// A job with the sink and nothing parsed yet (its id made); NULL when out of memory.
struct job *anthropic_job_new(const struct chatreq_ctx *c);
// {"type": "error", "error": {"type", "message"}} for a status.
json_t *anthropic_error_body(int status, const char *msg);
