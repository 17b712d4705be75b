// tokenizer.h: the Qwen3.5/3.6 byte-level BPE tokenizer, read from a checkpoint's tokenizer.json.
//
// Encoding follows Hugging Face `tokenizers` on a Python str, step by step:
//   1. invalid UTF-8 in the input is replaced by U+FFFD, one per maximal invalid subpart (what
//      Python's bytes.decode("utf-8", errors="replace") does before a str can reach HF);
//   2. added tokens (<|im_start|>, <think>, ...) are cut out of the raw text, leftmost first and
//      longest at a position; they are never split or normalised;
//   3. each remaining segment is NFC-normalised (utf8proc);
//   4. split by the pre-tokenizer regex from tokenizer.json (PCRE2, UTF + UCP, JIT; its \p{L},
//      \p{M}, \p{N} and \s as the Unicode 16.0 ranges HF's Oniguruma uses, unicode_tables.h);
//   5. each piece's bytes become byte tokens (GPT-2 byte<->unicode map) and are merged by BPE,
//      lowest merge rank first, leftmost among equal ranks.
// Decoding concatenates token bytes; invalid UTF-8 in the result decodes to U+FFFD like Rust's
// String::from_utf8_lossy (HF's ByteLevel decoder).  The streaming decoder emits only complete
// code points, so its pieces concatenate to exactly the one-shot decode.
//
// Functions return 0, or -1 with a message in err (never abort on bad input).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "model.h" // TOKEN_ENDOFTEXT, TOKEN_IM_START, TOKEN_IM_END

struct tokenizer;

// Qwen3.5/3.6 ids (docs/MODEL.md §6).
enum {
    TOKEN_THINK = 248068,     // <think>
    TOKEN_THINK_END = 248069, // </think>
    TOKEN_ADDED_FIRST = 248044,
    TOKEN_ADDED_COUNT = 33, // 248044..248076
};

// Loads dir/tokenizer.json (and reads dir/tokenizer_config.json when present).
int tokenizer_load(const char *dir, struct tokenizer **out, char *err, size_t errlen);
// Same, from a tokenizer.json path.
int tokenizer_load_file(const char *path, struct tokenizer **out, char *err, size_t errlen);
void tokenizer_free(struct tokenizer *t);

// Encodes len bytes of text (any bytes; added tokens in the text are recognised).  *ids is
// malloc'd (free it); *n is its length.
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, char *err,
                     size_t errlen);

// The same, with added tokens recognised only where markup[i] is nonzero for every byte of them
// (the chat template's own markup); elsewhere (message text) they are plain text.  markup NULL:
// everywhere.  text must be valid UTF-8 when markup is given.
int tokenizer_encode_markup(const struct tokenizer *t, const char *text, size_t len, const unsigned char *markup,
                            int32_t **ids, size_t *n, char *err, size_t errlen);

// One-shot decode into a malloc'd, NUL-terminated UTF-8 string (*len excludes the NUL).
// skip_special drops added tokens marked special.  Ids outside the vocabulary are an error.
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out, size_t *len,
                     char *err, size_t errlen);

// Number of id slots (largest id + 1); some slots below it may be unused.
int32_t tokenizer_vocab_size(const struct tokenizer *t);
// The bytes of token id (not NUL-terminated; may be partial UTF-8), or NULL if id is unused.
const char *tokenizer_token_bytes(const struct tokenizer *t, int32_t id, size_t *len);
// Id of the token whose bytes are exactly s[0..len), or -1.
int32_t tokenizer_token_id(const struct tokenizer *t, const char *s, size_t len);
// 1 if id is an added token marked special (<|im_end|>, ...), else 0.
int tokenizer_is_special(const struct tokenizer *t, int32_t id);
// eos_token of tokenizer_config.json (<|im_end|> for Qwen3.6), or -1 when not given.
int32_t tokenizer_eos_id(const struct tokenizer *t);

// Streaming decode, one id at a time.  Each push returns the text that became complete: never a
// broken code point (a token that ends inside a UTF-8 sequence holds its bytes back), and
// invalid sequences come out as U+FFFD as soon as they are known to be invalid.
struct tokenizer_stream {
    const struct tokenizer *t;
    int skip_special;
    unsigned char pend[4]; // an incomplete UTF-8 sequence carried to the next push
    size_t n_pend;
    char *buf; // output of the last push/flush, owned by the stream
    size_t cap;
};
void tokenizer_stream_init(struct tokenizer_stream *s, const struct tokenizer *t, int skip_special);
// *text stays valid until the next call on s; it is NUL-terminated.
int tokenizer_stream_push(struct tokenizer_stream *s, int32_t id, const char **text, size_t *len, char *err,
                          size_t errlen);
// Ends the stream: a held incomplete sequence comes out as U+FFFD.  The stream can be reused.
int tokenizer_stream_flush(struct tokenizer_stream *s, const char **text, size_t *len);
void tokenizer_stream_free(struct tokenizer_stream *s);

// The pre-tokenizer alone (step 4, no added tokens, no NFC) on valid UTF-8: the end offset of
// each piece into ends[0..cap), *n their count (which may exceed cap).  For tests.
int tokenizer_pretokenize(const struct tokenizer *t, const char *text, size_t len, size_t *ends, size_t cap, size_t *n,
                          char *err, size_t errlen);

// Replaces invalid UTF-8 in src with U+FFFD (maximal subparts, as Python and Rust do) into a
// malloc'd NUL-terminated string.  Exposed for tests.
int utf8_sanitize(const char *src, size_t len, char **out, size_t *out_len);

// GPT-2's byte -> code point map, in which byte-level vocabulary strings are written.
void tokenizer_bytelevel_map(uint32_t b2u[256]);
