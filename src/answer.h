// answer.h: a generation's answer as its parts in order (reasoning, text, tool calls), for the
// protocols whose answers are lists of parts: Anthropic's content blocks (anthropic.c) and the
// Responses API's output items (responses.c).
//
// The generation's events (generate.h: text by channel, tool-call begin / delta / end / abort)
// go in; a part opens when the kind of what comes changes, grows with each piece, and closes when
// the next one opens or the answer ends.  A streaming sink renders the three moments through the
// hooks; every sink reads the parts at the end for the whole answer.  A call that was aborted (its
// markup went wrong: its text follows as a text part) keeps its place in the order, marked.
#pragma once

#include "generate.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>

enum part_kind { PART_REASONING, PART_TEXT, PART_CALL };

struct part {
    enum part_kind kind;
    int index;        // its place among the parts opened, aborted calls included
    struct sbuf text; // the reasoning or the text; a call: its arguments' JSON so far
    char name[72];    // a call: the function's name
    char id[48];      // the part's id (the protocol's prefix for its kind + random hex; "" when none)
    char call_id[48]; // a call: the id a result refers to (call_prefix + random hex)
    bool aborted;     // a call whose markup went wrong: not part of the answer
};

struct answer {
    struct part *parts; // [n]
    int n, cap;
    bool open;                // parts[n - 1] is still growing
    bool oom;                 // a part could not be kept: the answer is incomplete
    const char *id_prefix[3]; // by enum part_kind: the ids' prefix (NULL: no id)
    const char *call_prefix;  // calls' call_id prefix ("toolu_", "call_")
    // A streaming sink's hooks (NULL: not wanted), with the part, after it changed.
    void (*on_open)(void *ctx, const struct part *p);
    void (*on_delta)(void *ctx, const struct part *p, const char *s, size_t n);
    void (*on_close)(void *ctx, const struct part *p);
    void *ctx;
};

// Sets the sink's text and tool-call events to feed the answer.  The sink's ctx must point to a
// struct whose first member is the struct answer (anthropic_resp, responses_resp).
void answer_attach(struct gen_sink *sink);

// The generation's events.
void answer_text(struct answer *a, enum gen_channel ch, const char *s, size_t n);
void answer_call_begin(struct answer *a, const char *name);
void answer_call_delta(struct answer *a, const char *s, size_t n);
void answer_call_end(struct answer *a, const char *name, const char *arguments);
void answer_call_abort(struct answer *a);
// The end: the open part closes.
void answer_finish(struct answer *a);
void answer_free(struct answer *a);
