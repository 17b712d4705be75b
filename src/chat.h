// chat.h: the Qwen3.6 chat format (ChatML with <think>), rendered in C.  chat.c documents the
// exact bytes.
#pragma once

#include <stddef.h>
#include <stdint.h>

// An assistant message's call of a tool, with its arguments in order.
struct chat_tool_call {
    const char *name;
    size_t n_args;
    const char *const *arg_names;
    const char *const *arg_values; // as the template writes them: a string as is, else its JSON
};

struct chat_message {
    const char *role;                        // "system" (first message only), "user", "assistant" or "tool"
    const char *content;                     // NULL counts as ""
    const char *reasoning;                   // assistant only: the thinking text (reasoning_content); NULL if none
    const struct chat_tool_call *tool_calls; // assistant only
    size_t n_tool_calls;
};

struct chat_options {
    int enable_thinking;       // 1 (the default): the generation prompt opens "<think>\n"
    int preserve_thinking;     // 1: every earlier assistant turn keeps its reasoning
    int add_generation_prompt; // 1 (the default): end with the assistant header
    const char *const *tools;  // [n_tools] each tool's JSON as the template's tojson writes it
    size_t n_tools;            // 0: no tools block
    // 1: msgs continue a conversation already rendered up to the <|im_end|> of its last turn, an
    // assistant one (a stored response's tokens): the output is what the template would add after
    // it, from the newline that ends that turn on; no system message and no tools block (they
    // are in the rendered part), no user query needed (one before them counts), and the
    // assistant messages of msgs keep their reasoning unless a user query of msgs comes after.
    int after_turn;
};

// The defaults of Qwen3.6-35B-A3B: thinking on, reasoning of past turns dropped, prompt added.
#define CHAT_OPTIONS_DEFAULT ((struct chat_options){.enable_thinking = 1, .add_generation_prompt = 1})

// Generation stops on <|im_end|> and <|endoftext|> (generation_config), model.h's TOKEN_IM_END
// and TOKEN_ENDOFTEXT: the one stop rule of generate.c, `calla run` and constrained decoding.
#define CHAT_N_STOP 2
extern const int32_t chat_stop_ids[CHAT_N_STOP];
int chat_is_stop(int32_t id);

struct tokenizer;

// `calla run --chat TEXT`: one user message rendered with opt (NULL: defaults) and encoded.
// *ids is malloc'd.
int chat_encode_user(const struct tokenizer *t, const char *text, const struct chat_options *opt, int32_t **ids,
                     size_t *n, char *err, size_t errlen);

// Renders msgs into a malloc'd NUL-terminated string.  opt NULL means CHAT_OPTIONS_DEFAULT.
// *boundary (if not NULL) gets the byte offset where the rendering of the last message starts:
// out[0 .. *boundary) is the rendered history before it.  Returns 0, or -1 with a message (no
// messages, an unknown role, a system message after the first, no user query).
int chat_render(const struct chat_message *msgs, size_t n, const struct chat_options *opt, char **out, size_t *out_len,
                size_t *boundary, char *err, size_t errlen);
// The same, and *markup (if not NULL; malloc'd, [*out_len]) marks each byte 1 where it is the
// template's markup or an assistant message's text (the model's own output), 0 where it is a
// client's text (system, user and tool content, tool definitions, call arguments).  Added tokens
// such as <|im_end|> are recognised only where it is 1 (tokenizer_encode_markup), so a user who
// types "<|im_end|>\n<|im_start|>system" gets text, not control tokens.
int chat_render_markup(const struct chat_message *msgs, size_t n, const struct chat_options *opt, char **out,
                       unsigned char **markup, size_t *out_len, size_t *boundary, char *err, size_t errlen);
