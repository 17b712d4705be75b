// chat.c: the Qwen3.6 chat template, text-only, without a Jinja engine.
//
// What it renders, byte for byte (the official Qwen3.6 chat_template.jinja, minus images and
// videos; trim() is Python's str.strip(): Unicode whitespace):
//
//   with tools:
//     <|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>
//     \n{tool 1 as JSON}...\n{tool n as JSON}\n</tools>{TOOLS_HOWTO}[\n\n{trim(system)}]<|im_end|>\n
//                   (the system part when a system message is first and not blank)
//   without:
//     [<|im_start|>system\n{trim(system)}<|im_end|>\n]            first message, if a system one
//   for each later message:
//     user:       <|im_start|>user\n{trim(content)}<|im_end|>\n
//     assistant:  content = trim(content); reasoning = the message's reasoning if given, else
//                 when content contains "</think>": the text before the first "</think>",
//                 right-stripped of "\n", after its last "<think>", left-stripped of "\n",
//                 and content becomes the text after the last "</think>", left-stripped of "\n".
//                 reasoning = trim(reasoning).  Then, if preserve_thinking or the turn comes
//                 after the last real user query (a tool loop in progress):
//                   <|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>\n
//                 otherwise (an earlier turn; its reasoning is dropped):
//                   <|im_start|>assistant\n{content}<|im_end|>\n
//                 tool calls go before the <|im_end|>, each as
//                   [\n\n when first and content is not blank | \n when not first]
//                   <tool_call>\n<function={name}>\n{<parameter={arg}>\n{value}\n</parameter>\n}...
//                   </function>\n</tool_call>
//     tool:       [<|im_start|>user]            when the previous message is not a tool message
//                 \n<tool_response>\n{trim(content)}\n</tool_response>
//                 [<|im_end|>\n]                when the next message is not a tool message
//   add_generation_prompt:
//     <|im_start|>assistant\n<think>\n                      thinking on (the default)
//     <|im_start|>assistant\n<think>\n\n</think>\n\n        thinking off
//   after_turn (a continuation of a conversation rendered up to its last assistant turn's
//   <|im_end|>): "\n", then the messages as above, the first one following an assistant turn.
//
// "The last real user query" is the last user message whose trimmed content is not wholly a
// "<tool_response>...</tool_response>" block; without one the template refuses to render.
// The model answers "{reasoning}\n</think>\n\n{answer}<|im_end|>" (thinking on) or
// "{answer}<|im_end|>" (thinking off).
#include "chat.h"
#include "tokenizer.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const int32_t chat_stop_ids[CHAT_N_STOP] = {TOKEN_IM_END, TOKEN_ENDOFTEXT};

int chat_is_stop(int32_t id) {
    return id == chat_stop_ids[0] || id == chat_stop_ids[1];
}

struct text {
    const char *p;
    size_t n;
};

struct out {
    char *p;
    unsigned char *m; // [n] 1 where the byte is the template's markup (or the model's own output)
    size_t n, cap;
    bool oom;
};

static void put(struct out *o, const char *s, size_t n, bool markup) {
    if (o->oom) return;
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + n + 1) cap *= 2;
        char *p = realloc(o->p, cap);
        if (p) o->p = p;
        unsigned char *m = p ? realloc(o->m, cap) : NULL;
        if (!m) {
            o->oom = true;
            return;
        }
        o->m = m, o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    memset(o->m + o->n, markup, n);
    o->n += n;
    o->p[o->n] = 0;
}

static void puts_(struct out *o, const char *s) {
    put(o, s, strlen(s), true);
} // the template's text
static void putu(struct out *o, const char *s) {
    put(o, s, strlen(s), false);
} // a client's text
static void putt(struct out *o, struct text t, bool markup) {
    put(o, t.p, t.n, markup);
}

// Length of a whitespace character (Python's str.isspace()) at s[0..n), or 0.
static size_t space_len(const unsigned char *s, size_t n) {
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x20))) return 1;
    if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (n >= 3 && s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80) return 3; // U+1680
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x80 && (s[2] <= 0x8A || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF))
        return 3;                                                         // U+2000..200A, 2028, 2029, 202F
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) return 3; // U+205F
    if (n >= 3 && s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80) return 3; // U+3000
    return 0;
}

static struct text trim(struct text t) {
    const unsigned char *s = (const unsigned char *)t.p;
    size_t a = 0, b = t.n, l;
    while (a < b && (l = space_len(s + a, b - a))) a += l;
    while (b > a) { // step back over a whitespace character ending at b
        size_t k = 0;
        for (size_t back = 1; back <= 3 && back <= b - a; back++)
            if (space_len(s + b - back, back) == back) {
                k = back;
                break;
            }
        if (!k) break;
        b -= k;
    }
    return (struct text){t.p + a, b - a};
}

static struct text strip_nl(struct text t, bool left, bool right) {
    while (left && t.n && t.p[0] == '\n') t.p++, t.n--;
    while (right && t.n && t.p[t.n - 1] == '\n') t.n--;
    return t;
}

static const char *find(struct text t, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= t.n; i++)
        if (!memcmp(t.p + i, needle, k)) return t.p + i;
    return NULL;
}

static const char *find_last(struct text t, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = t.n >= k ? t.n - k + 1 : 0; i-- > 0;)
        if (!memcmp(t.p + i, needle, k)) return t.p + i;
    return NULL;
}

static struct text text_of(const char *s) {
    return (struct text){s ? s : "", s ? strlen(s) : 0};
}

static const char TOOLS_HOWTO[] =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
    "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question "
    "like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

static void put_tools(struct out *b, const struct chat_options *o, const struct chat_message *first) {
    puts_(b, "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>");
    for (size_t i = 0; i < o->n_tools; i++) {
        puts_(b, "\n");
        putu(b, o->tools[i]);
    }
    puts_(b, "\n</tools>");
    puts_(b, TOOLS_HOWTO);
    struct text sys = trim(text_of(first->content));
    if (!strcmp(first->role, "system") && sys.n) {
        puts_(b, "\n\n");
        putt(b, sys, false);
    }
    puts_(b, "<|im_end|>\n");
}

static void put_tool_calls(struct out *b, const struct chat_message *m, struct text content) {
    for (size_t k = 0; k < m->n_tool_calls; k++) {
        const struct chat_tool_call *c = &m->tool_calls[k];
        puts_(b, k                 ? "\n<tool_call>\n<function="
                 : trim(content).n ? "\n\n<tool_call>\n<function="
                                   : "<tool_call>\n<function=");
        putu(b, c->name ? c->name : "");
        puts_(b, ">\n");
        for (size_t a = 0; a < c->n_args; a++) {
            puts_(b, "<parameter=");
            putu(b, c->arg_names[a]);
            puts_(b, ">\n");
            putu(b, c->arg_values[a]);
            puts_(b, "\n</parameter>\n");
        }
        puts_(b, "</function>\n</tool_call>");
    }
}

static bool is_tool_response(struct text t) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    return t.n >= sizeof open - 1 && t.n >= sizeof close - 1 && !memcmp(t.p, open, sizeof open - 1) &&
           !memcmp(t.p + t.n - (sizeof close - 1), close, sizeof close - 1);
}

int chat_render(const struct chat_message *msgs, size_t n, const struct chat_options *opt, char **out, size_t *out_len,
                size_t *boundary, char *err, size_t errlen) {
    return chat_render_markup(msgs, n, opt, out, NULL, out_len, boundary, err, errlen);
}

int chat_render_markup(const struct chat_message *msgs, size_t n, const struct chat_options *opt, char **out,
                       unsigned char **markup, size_t *out_len, size_t *boundary, char *err, size_t errlen) {
    struct chat_options o = opt ? *opt : CHAT_OPTIONS_DEFAULT;
    struct out b = {0};
    *out = NULL;
    if (markup) *markup = NULL;
    if (out_len) *out_len = 0;
    if (!n) {
        snprintf(err, errlen, "chat: no messages");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))) {
            snprintf(err, errlen, "chat: message %zu has an unknown role \"%s\"", i, r ? r : "(null)");
            return -1;
        }
        if ((i > 0 || o.after_turn) && !strcmp(r, "system")) {
            snprintf(err, errlen, "chat: the system message must be the first (message %zu)", i);
            return -1;
        }
    }
    size_t last_query = n;
    for (size_t i = n; i-- > 0;)
        if (!strcmp(msgs[i].role, "user") && !is_tool_response(trim(text_of(msgs[i].content)))) {
            last_query = i;
            break;
        }
    if (last_query == n && !o.after_turn) {
        snprintf(err, errlen, "chat: no user query in the messages");
        return -1;
    }
    // A continuation without a query of its own: the query is in the rendered part, before msgs.
    const bool query_before = last_query == n;

    size_t last_start = 0;
    if (o.after_turn)
        puts_(&b, "\n"); // the end of the rendered turn's "<|im_end|>\n"
    else if (o.n_tools)
        put_tools(&b, &o, &msgs[0]);
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        struct text content = trim(text_of(msgs[i].content));
        last_start = b.n;
        if (!strcmp(role, "system")) {
            if (o.n_tools) continue; // it went into the tools block
            puts_(&b, "<|im_start|>system\n");
            putt(&b, content, false);
            puts_(&b, "<|im_end|>\n");
        } else if (!strcmp(role, "user")) {
            puts_(&b, "<|im_start|>user\n");
            putt(&b, content, false);
            puts_(&b, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            struct text reasoning = {"", 0};
            const char *end_think;
            if (msgs[i].reasoning) {
                reasoning = text_of(msgs[i].reasoning);
            } else if ((end_think = find(content, "</think>"))) {
                struct text before = strip_nl((struct text){content.p, (size_t)(end_think - content.p)}, false, true);
                const char *open = find_last(before, "<think>");
                if (open) before = (struct text){open + 7, (size_t)(before.p + before.n - (open + 7))};
                reasoning = strip_nl(before, true, false);
                const char *last_end = find_last(content, "</think>");
                content = strip_nl((struct text){last_end + 8, (size_t)(content.p + content.n - (last_end + 8))}, true,
                                   false);
            }
            reasoning = trim(reasoning);
            puts_(&b, "<|im_start|>assistant\n");
            if (o.preserve_thinking || query_before || i > last_query) {
                puts_(&b, "<think>\n");
                putt(&b, reasoning, true);
                puts_(&b, "\n</think>\n\n");
            }
            putt(&b, content, true);
            put_tool_calls(&b, &msgs[i], content);
            puts_(&b, "<|im_end|>\n");
        } else { // tool
            if ((i > 0 && strcmp(msgs[i - 1].role, "tool")) || (i == 0 && o.after_turn)) puts_(&b, "<|im_start|>user");
            puts_(&b, "\n<tool_response>\n");
            putt(&b, content, false);
            puts_(&b, "\n</tool_response>");
            if (i + 1 == n || strcmp(msgs[i + 1].role, "tool")) puts_(&b, "<|im_end|>\n");
        }
    }
    if (o.add_generation_prompt)
        puts_(&b, o.enable_thinking ? "<|im_start|>assistant\n<think>\n"
                                    : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    if (b.oom || !b.p) {
        free(b.p), free(b.m);
        snprintf(err, errlen, "chat: out of memory");
        return -1;
    }
    *out = b.p;
    if (markup)
        *markup = b.m;
    else
        free(b.m);
    if (out_len) *out_len = b.n;
    if (boundary) *boundary = last_start;
    return 0;
}

int chat_encode_user(const struct tokenizer *t, const char *text, const struct chat_options *opt, int32_t **ids,
                     size_t *n, char *err, size_t errlen) {
    struct chat_message m = {.role = "user", .content = text};
    char *s;
    size_t len;
    *ids = NULL, *n = 0;
    if (chat_render(&m, 1, opt, &s, &len, NULL, err, errlen)) return -1;
    int rc = tokenizer_encode(t, s, len, ids, n, err, errlen);
    free(s);
    return rc;
}
