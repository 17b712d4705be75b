// constrain.h: structured output by constrained greedy decoding.
//
// response_format json_object / json_schema is compiled once per request into a tree of schema
// nodes; a matcher walks the answer's bytes through it (a set of stacks, one per live anyOf
// alternative) and tells, before each step, which tokens can continue a valid document.  The
// chosen token is the most likely one that can.  The document is compact JSON (no whitespace
// between tokens); keys come in any order, each at most once, the required ones all present.
// Numbers are what the server's JSON parser reads back: integers of at most 18 digits, at most
// 18 digits after the point and 2 in the exponent (constrain.c says why).
//
// The JSON Schema subset (what OpenAI's strict mode accepts): type (string, number, integer,
// boolean, null, object, array, or a list of them), properties, required, additionalProperties
// (false or absent), items, enum, const, anyOf, $defs / definitions with $ref "#/$defs/NAME" (or
// "#" for the root), nesting; description, title, default, $schema, $id, strict are ignored.
// Any other keyword is refused with a message naming it.
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cschema; // a compiled schema
struct cstate;  // where the matcher is in the document

enum { CONSTRAIN_MAX_DEPTH = 48, CONSTRAIN_MAX_THREADS = 16, CONSTRAIN_MAX_PROPS = 64, CONSTRAIN_MAX_ENUM = 1024 };

// schema NULL: any JSON object (json_object).  0, or -1 with a message naming the keyword.
int constrain_compile(const json_t *schema, struct cschema **out, char *err, size_t errlen);
// tool_choice "required" (name NULL: any of the tools) or a named function: the answer is one call
// in the template's format, of the required parameters, each value written as tool_value_form
// (toolcall.h) says; toolcall.h parses it back by the same decision.
int constrain_compile_tool_call(const json_t *tools, const char *name, struct cschema **out, char *err, size_t errlen);
void constrain_free(struct cschema *c);

struct cstate *cstate_new(const struct cschema *c); // c NULL: an empty state to copy into
void cstate_free(struct cstate *s);
void cstate_copy(struct cstate *dst, const struct cstate *src);
// Feeds bytes; false when they cannot continue a valid document (the state is then undefined).
bool cstate_feed(struct cstate *s, const char *bytes, size_t n);
// The document is complete (the end of the answer may come now).
bool cstate_done(const struct cstate *s);
// About how many bytes the shortest way to a complete document still takes (a large number when
// there is none): near the end of max_tokens the decoder prefers tokens that bring it down.
int cstate_distance(const struct cstate *s);
// The bytes that must come next whatever is chosen (the rest of a literal, such as the markup of
// a tool call), copied into out (at most cap); 0 when the next byte is a real choice.
size_t cstate_forced(const struct cstate *s, char *out, size_t cap);

// Byte classes under which a state may stand still (the token trie's shortcut, tokmask.h): a
// state is fixed under a class when every byte of the class leaves it as it is, so a token made
// only of such bytes is allowed without running it through the matcher.
enum {
    CONSTRAIN_CLASS_STR = 1, // inside a JSON string: 0x20..0xff but '"' and '\\'
    CONSTRAIN_CLASS_RAW = 2, // free text of a tool call: any byte but '<' and '\n'
    CONSTRAIN_N_CLASSES = 2
};
bool constrain_class_byte(int cls, unsigned char b);
// The class s is fixed under, or 0.
int cstate_fixed_class(const struct cstate *s);
