// agentconvo.h: the fixed, seeded content of `calla agentbench`'s conversation: a coding agent's
// system prompt and tool definitions, its task, and the tool results appended turn by turn.
//
// Everything here is a function of the parameters alone (never of a server's answers), so every
// engine is sent the same text: the same seed gives the same bytes, and convo.hash says so. The
// text is synthetic but shaped like the real thing (prose from a fixed word list, C-like source
// lines, build and test logs, JSON search results), sized by a token estimate that follows the
// Qwen3.5 pre-tokenizer's pieces; the servers' reported prompt tokens are the measurement.
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct convo_params {
    uint64_t seed;
    int turns;          // appends after the opening request (each: the reply, then a tool result)
    int system_tokens;  // the opening system turn, tool definitions included (estimated tokens)
    int min_result;     // tool results' sizes are drawn log-uniformly from [min_result, max_result]
    int max_result;     //   (estimated tokens)
    int required_every; // turn k (1..turns) with k % required_every == 0 forces a tool call (0: never)
};

struct convo_turn {
    const char *tool;  // the tool whose result this is ("read_file", "run_shell", ...)
    int target_tokens; // the size drawn for it
    int est_tokens;    // the estimate of the text made (at least the target, one line over at most)
    char *result;      // the tool message's content
    bool required;     // this turn's request has tool_choice "required"
};

struct convo {
    char *system;  // the system message
    char *task;    // the first user message
    json_t *tools; // the request's "tools" array
    int system_est, tools_est, task_est;
    struct convo_turn *turns; // [n_turns]: the append of turn k (1-based) is turns[k - 1]
    int n_turns;
    uint64_t hash; // FNV-1a 64 over system, task, the tools' JSON and every result
};

// 0, or -1 with a message (a parameter out of range).
int convo_build(const struct convo_params *p, struct convo *c, char *err, size_t errlen);
void convo_free(struct convo *c);

// Estimated tokens of s[0..n): the pre-tokenizer's pieces (a word with the character before it,
// each digit, a run of punctuation, a run of whitespace), long ones counted as more than one.
int convo_estimate_tokens(const char *s, size_t n);
