// toolcall.h: tools in Qwen3.6's format.
//
//   tool_tojson       a JSON value as the chat template's `tojson` writes it (Python's json.dumps:
//                     ", " and ": " separators, keys in order, non-ASCII as is, floats as repr)
//   tool_parser_*     the model's output -> content and OpenAI tool calls, incrementally: text
//                     that could be the start of a call is held back, a call is handed over
//                     only once its </tool_call> has arrived, so markup never reaches content
//                     whatever the token boundaries; a malformed call degrades to content.
//                     Meanwhile a call whose function is known streams its arguments as JSON
//                     text in pieces (tool_stream_sink: begin, delta), whose concatenation is exactly
//                     the arguments it is handed over with; one that goes wrong after it began
//                     is aborted (abort) and comes out as content like any malformed call.
//
// The call format (the template's system prompt asks for it):
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// VALUE is written as its parameter's schema says (tool_value_form): text for a string, JSON
// for anything else; it comes back into `arguments` typed the same way.
#pragma once

#include "util.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

// malloc'd NUL-terminated text, or NULL when out of memory.
char *tool_tojson(const json_t *v);

// How a parameter's VALUE is written inside the call's markup, by its schema.  One decision,
// asked by the forced-call grammar (constrain.c: what may be generated there) and by the parser
// below (how it is read back), so that what one writes the other reads as the same type.
// The template writes a string argument as its raw text and any other value as its JSON, so:
//   TOOL_VALUE_TEXT          every value the schema allows is a string ("type": "string", an
//                            enum or const of strings, an anyOf of those, a $ref to one): the raw
//                            text, no quotes, no escapes; read back as that string.
//   TOOL_VALUE_TEXT_OR_NULL  strings and null ("type": ["string", "null"], an anyOf of strings and
//                            {"type": "null"}, an enum of strings and null): raw text, and null
//                            written as the bare word `null` (what the template's tojson writes
//                            for a null argument in the history); so read back, `null` is null
//                            and the string "null" cannot be passed there.  An enum that holds
//                            both the string "null" and null would be ambiguous: TOOL_VALUE_JSON.
//   TOOL_VALUE_JSON          anything else (number, integer, boolean, null alone, array, object,
//                            no type, a mix of strings and other types such as "42" and 42):
//                            compact JSON of the schema; read back as that JSON.
enum tool_value { TOOL_VALUE_JSON, TOOL_VALUE_TEXT, TOOL_VALUE_TEXT_OR_NULL };
// schema: one parameter's schema (NULL or not an object: JSON); root: the function's
// "parameters", where "$ref": "#/$defs/NAME" (or "#/definitions/NAME", or "#") resolves.
// texts (may be NULL): for the text forms, a new array of the strings allowed, or NULL when any
// string is (set to NULL for TOOL_VALUE_JSON; the caller decrefs it).
enum tool_value tool_value_form(const json_t *schema, const json_t *root, json_t **texts);

struct tool_sink {
    void (*content)(void *arg, const char *s, size_t n);
    // name and arguments (a JSON object as text) are valid during the call only.
    void (*call)(void *arg, const char *name, const char *arguments);
    void *arg;
};

// Optional, set after tool_parser_init (tool_parser.stream; NULL members: not wanted), called with
// the tool_sink's arg: begin once a call's markup is known to be a call of this function (its
// "<function=NAME>" is in); pieces of its arguments follow, then the tool_sink's call (complete)
// or abort (the markup went wrong: the block follows as content).  Strings are valid during the
// call only.
struct tool_stream_sink {
    void (*begin)(void *arg, const char *name);
    void (*delta)(void *arg, const char *s, size_t n);
    void (*abort)(void *arg);
};

// Where the streaming of the call being read stands (toolcall.c: the scanner).
struct tool_stream {
    int state;        // enum in toolcall.c
    bool begun;       // begin sent
    size_t at;        // where the scan resumes in the call's text (a value: where it starts)
    size_t sent;      // a string value: its bytes sent so far end here
    size_t look;      // a value: "</parameter>" is not before here
    bool text;        // the value is a string: streamed as it comes
    bool lead;        // the value's first byte has been seen (a leading newline dropped)
    const json_t *fn; // the function called (its "function" object)
    json_t *names;    // the parameters so far (a repeated one makes the call malformed)
    char pname[256];  // the parameter being read
    struct sbuf out;  // the arguments sent so far
};

struct tool_parser {
    const json_t *tools; // the request's "tools" array (borrowed)
    struct tool_sink sink;
    struct tool_stream_sink stream;
    struct sbuf buf;       // held-back text, or the call being read
    bool in_call;          // buf holds text after "<tool_call>"
    bool after_call;       // a call just ended: leading whitespace is dropped
    int n_calls;           // calls handed over so far
    struct tool_stream st; // the call being read, streamed
    int mismatches;        // calls whose streamed arguments were not the final ones (a bug: tests check 0)
};

void tool_parser_init(struct tool_parser *p, const json_t *tools, struct tool_sink sink);
void tool_parser_feed(struct tool_parser *p, const char *s, size_t n);
// The output ended: an unfinished call and held-back text come out as content.
void tool_parser_finish(struct tool_parser *p);
void tool_parser_free(struct tool_parser *p);

// One call's block (the text between <tool_call> and </tool_call>) -> name and arguments as a
// JSON object text (malloc'd).  0, or -1 when it is not a well-formed call of a known tool (a
// parameter given twice included).
int tool_call_parse(const json_t *tools, const char *s, size_t n, char **name, char **arguments);
