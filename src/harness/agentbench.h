// agentbench.h: `calla agentbench`, a coding agent's conversation replayed through a running
// server's /v1/chat/completions (docs/BENCH.md "The conversation benchmark").
//
// The opening request sends the system prompt with the tool definitions and the task; each of the
// turns after it appends the assistant's previous reply as the server returned it (content, any
// reasoning and tool calls) and a tool result from agentconvo.c, then asks for a fixed number of
// tokens (max_tokens with ignore_eos). Every request streams; per turn the record keeps the prompt
// and cached tokens the server reports, the time to first token, the decode rate and the turn's
// time, and the conversation's total wall time. The JSON record (schema "calla.agentbench/1") is
// read by the matrix runner and the report writer.
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define AGENTBENCH_SCHEMA "calla.agentbench/1"

// What differs between the engines' HTTP APIs.
enum agentbench_flavor {
    AGENTBENCH_FLAVOR_CALLA,        // cached tokens from usage.prompt_tokens_details; identity from /v1/models, /health
    AGENTBENCH_FLAVOR_LLAMA_SERVER, // cached tokens from timings.cache_n; identity from /v1/models, /props
};

struct agentbench_options {
    const char *url;     // http://HOST:PORT
    const char *api_key; // NULL: none
    enum agentbench_flavor flavor;
    const char *label; // arm name in the record (NULL: the flavor's engine name)
    const char *model; // the request's "model" (NULL: the first id of /v1/models)
    uint64_t seed;
    int turns;                  // appends after the opening request
    int system_tokens;          // the opening system turn, tools included (estimated)
    int min_result, max_result; // tool results' sizes (estimated tokens)
    int gen;                    // tokens asked for each turn (max_tokens)
    int required_every;         // turns k % N == 0 have tool_choice "required" (0: none)
    bool ignore_eos;            // send "ignore_eos": true (stop tokens do not end a turn; max_tokens does)
    bool thinking;              // chat_template_kwargs.enable_thinking
    double timeout_s;           // each connect, write and read (default 300)
    double wait_s;              // wait this long for /health to answer 200 before starting (0: no wait)
    bool quiet;                 // no per-turn progress lines on stderr
};

// Runs the conversation; *out is the record (caller json_decref). 0, or -1 with a message naming
// the turn and what failed.
int agentbench_run(const struct agentbench_options *o, json_t **out, char *err, size_t errlen);

// Structural check of a record (the CI run; never the timings). 0, or -1 naming the field.
int agentbench_record_check(const json_t *r, char *err, size_t errlen);

// The readable table of a record (what `calla agentbench` prints).
void agentbench_print_table(FILE *f, const json_t *r);

// "calla" or "llama-server" -> the flavor. 0, or -1.
int agentbench_flavor_parse(const char *s, enum agentbench_flavor *out);
