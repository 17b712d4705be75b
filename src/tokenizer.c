// tokenizer.c: byte-level BPE (Qwen3.5/3.6) from tokenizer.json; see tokenizer.h for the
// pipeline.  Data structures, in reading order:
//   tok_bytes/tok_off  id -> raw bytes (vocabulary strings mapped back through GPT-2's table)
//   vocab hash         raw bytes -> id (open addressing, FNV-1a)
//   merge hash         (left id, right id) -> (rank, merged id)
//   added tokens       cut out of the raw text before anything else
//   pre                the split regex, compiled by PCRE2 with UTF + UCP and JIT, its \p{L},
//                      \p{M}, \p{N} and \s spelled out as Unicode 16.0 ranges (unicode_tables.h)
//   normalizer         NFC by utf8proc, around the code points HF's Unicode 9.0 NFC does not
//                      know (nfc_tables.h) and U+11A7 (normalize_nfc)
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "nfc_tables.h"
#include "unicode_tables.h"
#include "util.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        if (err && errlen) snprintf(err, errlen, __VA_ARGS__);                                                         \
        goto fail;                                                                                                     \
    } while (0)

struct added_token {
    char *text;
    size_t len;
    int32_t id;
};

struct merge_slot {
    uint64_t key; // (left << 32) | right; 0 marks an empty slot (id pair (0,0) is stored +1)
    int32_t rank; // position in the merges list: lower merges first
    int32_t new_id;
};

struct tokenizer {
    int32_t n_vocab;      // largest id + 1
    char *tok_bytes;      // all token bytes, back to back
    uint64_t *tok_off;    // [n_vocab + 1]; token i is tok_bytes[tok_off[i] .. tok_off[i+1])
    uint8_t *tok_flags;   // [n_vocab]; TOK_USED, TOK_ADDED, TOK_SPECIAL
    int32_t *vocab_slots; // [vocab_cap] ids, -1 empty
    uint32_t vocab_cap;
    struct merge_slot *merges;
    uint32_t merge_cap;
    int32_t n_merges;
    int32_t byte_id[256]; // the single-byte tokens, -1 if missing
    struct added_token *added;
    size_t n_added;
    uint8_t added_first[256]; // 1 if some added token starts with this byte
    pcre2_code *re;
    int normalize_nfc;
    int32_t eos_id;
};

enum { TOK_USED = 1, TOK_ADDED = 2, TOK_SPECIAL = 4 };

// ---------------------------------------------------------------------------------------------
// UTF-8

enum { U8_OK, U8_BAD, U8_SHORT };

// Classifies the sequence at s[0..n): U8_OK with its length, U8_BAD with the length of the
// maximal invalid subpart (Unicode §3.9, what Python's "replace" and Rust's from_utf8_lossy
// replace by one U+FFFD), or U8_SHORT when the bytes are a valid prefix cut by the end.
static int utf8_classify(const unsigned char *s, size_t n, size_t *len) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80) {
        *len = 1;
        return U8_OK;
    }
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c == 0xE0) {
        need = 2;
        lo = 0xA0;
    } else if (c >= 0xE1 && c <= 0xEC)
        need = 2;
    else if (c == 0xED) {
        need = 2;
        hi = 0x9F;
    } else if (c >= 0xEE && c <= 0xEF)
        need = 2;
    else if (c == 0xF0) {
        need = 3;
        lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3)
        need = 3;
    else if (c == 0xF4) {
        need = 3;
        hi = 0x8F;
    } else {
        *len = 1;
        return U8_BAD;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) {
            *len = i;
            return U8_SHORT;
        }
        if (s[i] < lo || s[i] > hi) {
            *len = i;
            return U8_BAD;
        }
        lo = 0x80, hi = 0xBF;
    }
    *len = need + 1;
    return U8_OK;
}

// Appends s[0..n) with invalid sequences replaced by U+FFFD.  With hold, a valid but incomplete
// tail is not emitted; *used says how many bytes were consumed.
static int utf8_lossy(struct sbuf *b, const unsigned char *s, size_t n, int hold, size_t *used) {
    size_t i = 0;
    while (i < n) {
        size_t run = i; // copy ASCII and valid runs in one go
        for (;;) {
            if (run >= n) break;
            if (s[run] < 0x80) {
                run++;
                continue;
            }
            size_t l;
            if (utf8_classify(s + run, n - run, &l) != U8_OK) break;
            run += l;
        }
        if (run > i && sbuf_add(b, s + i, run - i)) return -1;
        i = run;
        if (i >= n) break;
        size_t l;
        int k = utf8_classify(s + i, n - i, &l);
        if (k == U8_SHORT && hold) break;
        if (sbuf_add(b, "\xEF\xBF\xBD", 3)) return -1;
        i += l;
    }
    if (used) *used = i;
    if (sbuf_reserve(b, 0)) return -1;
    b->p[b->len] = 0;
    return 0;
}

int utf8_sanitize(const char *src, size_t len, char **out, size_t *out_len) {
    struct sbuf b = {0};
    if (utf8_lossy(&b, (const unsigned char *)src, len, 0, NULL)) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    *out_len = b.len;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// GPT-2's byte <-> unicode map: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order.  Vocabulary strings are written in these code points.

void tokenizer_bytelevel_map(uint32_t b2u[256]) {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        b2u[b] = printable ? b : next++;
    }
}

// The inverse map: code point (< 324) -> byte, -1 for code points outside the map.
static void unicode_byte_table(int16_t u2b[324]) {
    uint32_t b2u[256];
    tokenizer_bytelevel_map(b2u);
    for (int i = 0; i < 324; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) u2b[b2u[b]] = (int16_t)b;
}

// Vocabulary string -> raw bytes into out (at most strlen(s) bytes).  -1 if not byte-level.
static long bytelevel_decode(const int16_t u2b[324], const char *s, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (l <= 0) return -1;
        if (cp < 0 || cp >= 324 || u2b[cp] < 0) return -1;
        int b = u2b[cp];
        out[o++] = (char)b;
        i += (size_t)l;
    }
    return (long)o;
}

// ---------------------------------------------------------------------------------------------
// Hash tables

static uint32_t cap_for(size_t n) {
    uint32_t cap = 16;
    while (cap < 2 * n + 16) cap *= 2;
    return cap;
}

int32_t tokenizer_token_id(const struct tokenizer *t, const char *s, size_t len) {
    uint32_t mask = t->vocab_cap - 1;
    for (uint32_t h = (uint32_t)fnv1a64(FNV1A64_INIT, s, len) & mask;; h = (h + 1) & mask) {
        int32_t id = t->vocab_slots[h];
        if (id < 0) return -1;
        if (t->tok_off[id + 1] - t->tok_off[id] == len && !memcmp(t->tok_bytes + t->tok_off[id], s, len)) return id;
    }
}

// Inserts id under its bytes; a later id with the same bytes replaces the earlier one.
static void vocab_insert(struct tokenizer *t, int32_t id) {
    const char *s = t->tok_bytes + t->tok_off[id];
    size_t len = t->tok_off[id + 1] - t->tok_off[id];
    uint32_t mask = t->vocab_cap - 1;
    for (uint32_t h = (uint32_t)fnv1a64(FNV1A64_INIT, s, len) & mask;; h = (h + 1) & mask) {
        int32_t o = t->vocab_slots[h];
        if (o < 0 || (t->tok_off[o + 1] - t->tok_off[o] == len && !memcmp(t->tok_bytes + t->tok_off[o], s, len))) {
            t->vocab_slots[h] = id;
            return;
        }
    }
}

static inline uint64_t merge_key(int32_t l, int32_t r) {
    return ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
}
static inline uint32_t merge_hash(uint64_t key, uint32_t mask) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static const struct merge_slot *merge_get(const struct tokenizer *t, int32_t l, int32_t r) {
    uint64_t key = merge_key(l, r);
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t h = merge_hash(key, mask);; h = (h + 1) & mask) {
        const struct merge_slot *m = &t->merges[h];
        if (m->key == key) return m;
        if (!m->key) return NULL;
    }
}

// Like HF, a pair listed twice keeps the later rank.
static void merge_put(struct tokenizer *t, int32_t l, int32_t r, int32_t rank, int32_t new_id) {
    uint64_t key = merge_key(l, r);
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t h = merge_hash(key, mask);; h = (h + 1) & mask) {
        struct merge_slot *m = &t->merges[h];
        if (!m->key || m->key == key) {
            *m = (struct merge_slot){key, rank, new_id};
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Loading

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

// The pre-tokenizer must be Split(regex, Isolated) [+ ByteLevel without its own regex], or a
// Sequence of those.  Returns the regex.
static const char *find_split_regex(json_t *pre, char *err, size_t errlen) {
    const char *type = jstr(pre, "type");
    if (!type) FAIL("tokenizer.json: pre_tokenizer has no type");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pre, "pretokenizers");
        const char *found = NULL;
        size_t i;
        json_t *p;
        if (!json_is_array(list)) FAIL("tokenizer.json: pre_tokenizer Sequence without a list");
        json_array_foreach(list, i, p) {
            const char *r = find_split_regex(p, err, errlen);
            if (!r) return NULL;
            if (*r) {
                if (found && *found) FAIL("tokenizer.json: more than one Split pre-tokenizer is not supported");
                found = r;
            }
        }
        if (!found || !*found) FAIL("tokenizer.json: no Split pre-tokenizer");
        return found;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (json_is_true(json_object_get(pre, "use_regex")) || json_is_true(json_object_get(pre, "add_prefix_space")))
            FAIL("tokenizer.json: ByteLevel pre-tokenizer with use_regex/add_prefix_space is not supported");
        return "";
    }
    if (!strcmp(type, "Split")) {
        const char *behavior = jstr(pre, "behavior");
        const char *rx = jstr(json_object_get(pre, "pattern"), "Regex");
        if (!rx) FAIL("tokenizer.json: Split pre-tokenizer without a Regex pattern");
        if (!behavior || strcmp(behavior, "Isolated") || json_is_true(json_object_get(pre, "invert")))
            FAIL("tokenizer.json: Split behavior must be Isolated (got %s)", behavior ? behavior : "none");
        return rx;
    }
    FAIL("tokenizer.json: unsupported pre_tokenizer type %s", type);
fail:
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// The split regex's Unicode classes
//
// HF `tokenizers` matches the split regex with Oniguruma 6.9.10 (Unicode 16.0); PCRE2 10.42 knows
// Unicode 14, so letters, marks and digits assigned since (U+0CF3, U+1D2C0 KAKTOVIK NUMERAL
// ZERO, ...) would split differently: " " U+1D2C0 became 78449,233,222 where HF gives
// 220,54362,233,222; and PCRE2's \s takes U+180E, Oniguruma's (White_Space) does not.  So
// \p{L}, \p{M}, \p{N} and \s are replaced by the ranges of unicode_tables.h before PCRE2 sees
// the pattern: inside a class by the merged ranges of every such item in it, elsewhere by a
// class of its own (\S by the negated class).  Other escapes (\r, \n, ...) are left to PCRE2.

enum { UCLASS_L = 1, UCLASS_M = 2, UCLASS_N = 4, UCLASS_S = 8 };

// \p{L}, \p{M}, \p{N} or \s at s: its UCLASS_ bit and its length in *len, else 0.
static int rx_uclass(const char *s, size_t *len) {
    if (s[0] != '\\') return 0;
    if (s[1] == 's') return *len = 2, UCLASS_S;
    if (s[1] != 'p' || s[2] != '{' || !s[3] || s[4] != '}') return 0;
    *len = 5;
    return s[3] == 'L' ? UCLASS_L : s[3] == 'M' ? UCLASS_M : s[3] == 'N' ? UCLASS_N : 0;
}

static int range_cmp(const void *a, const void *b) {
    const struct ucd_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

// Appends the union of the classes in mask as "\x{lo}-\x{hi}" items (no brackets).
static void rx_put_ranges(struct sbuf *o, int mask) {
    static const struct {
        int bit;
        const struct ucd_range *r;
        size_t n;
    } tabs[] = {
        {UCLASS_L, ucd_letter, sizeof ucd_letter / sizeof ucd_letter[0]},
        {UCLASS_M, ucd_mark, sizeof ucd_mark / sizeof ucd_mark[0]},
        {UCLASS_N, ucd_number, sizeof ucd_number / sizeof ucd_number[0]},
        {UCLASS_S, ucd_space, sizeof ucd_space / sizeof ucd_space[0]},
    };
    struct ucd_range all[sizeof ucd_letter / sizeof ucd_letter[0] + sizeof ucd_mark / sizeof ucd_mark[0] +
                         sizeof ucd_number / sizeof ucd_number[0] + sizeof ucd_space / sizeof ucd_space[0]];
    size_t n = 0;
    for (size_t k = 0; k < sizeof tabs / sizeof tabs[0]; k++)
        if (mask & tabs[k].bit) memcpy(all + n, tabs[k].r, tabs[k].n * sizeof *all), n += tabs[k].n;
    qsort(all, n, sizeof *all, range_cmp);
    for (size_t i = 0; i < n;) {
        uint32_t lo = all[i].lo, hi = all[i].hi;
        for (i++; i < n && all[i].lo <= hi + 1; i++)
            if (all[i].hi > hi) hi = all[i].hi;
        char item[40];
        int l = lo == hi ? snprintf(item, sizeof item, "\\x{%X}", lo)
                         : snprintf(item, sizeof item, "\\x{%X}-\\x{%X}", lo, hi);
        sbuf_add(o, item, (size_t)l);
    }
}

// The pattern with its Unicode classes spelled out; malloc'd, NULL when out of memory.
static char *expand_unicode_classes(const char *rx) {
    struct sbuf o = {0};
    sbuf_add(&o, "", 0);
    for (const char *s = rx; *s;) {
        size_t ul;
        int u = rx_uclass(s, &ul);
        if (u) { // outside a class
            sbuf_add(&o, "[", 1), rx_put_ranges(&o, u), sbuf_add(&o, "]", 1);
            s += ul;
        } else if (s[0] == '\\' && s[1] == 'S') { // not white space
            sbuf_add(&o, "[^", 2), rx_put_ranges(&o, UCLASS_S), sbuf_add(&o, "]", 1);
            s += 2;
        } else if (*s == '\\' && s[1]) {
            sbuf_add(&o, s, 2);
            s += 2;
        } else if (*s == '[') { // a class: copy it without its \p{L|M|N}, then their ranges before ']'
            const char *c = s + 1;
            int mask = 0;
            sbuf_add(&o, "[", 1);
            if (*c == '^') sbuf_add(&o, "^", 1), c++;
            if (*c == ']') sbuf_add(&o, "]", 1), c++; // a leading ']' is literal
            while (*c && *c != ']') {
                size_t cl;
                int cu = rx_uclass(c, &cl);
                if (cu) {
                    mask |= cu;
                    c += cl;
                } else if (*c == '[' && c[1] == ':') { // [:alpha:] and the like
                    const char *e = strstr(c + 2, ":]");
                    size_t l = e ? (size_t)(e + 2 - c) : 1;
                    sbuf_add(&o, c, l);
                    c += l;
                } else {
                    size_t l = *c == '\\' && c[1] ? 2 : 1;
                    sbuf_add(&o, c, l);
                    c += l;
                }
            }
            rx_put_ranges(&o, mask);
            if (*c) sbuf_add(&o, "]", 1), c++;
            s = c;
        } else {
            sbuf_add(&o, s, 1);
            s++;
        }
    }
    if (o.oom) {
        free(o.p);
        return NULL;
    }
    return o.p;
}

static int check_byte_level_decoder(json_t *dec, char *err, size_t errlen) {
    const char *type = jstr(dec, "type");
    if (type && !strcmp(type, "ByteLevel")) return 0;
    FAIL("tokenizer.json: decoder must be ByteLevel (got %s)", type ? type : "none");
fail:
    return -1;
}

// Splits merge i into its two sides: "a b" strings or ["a", "b"] pairs.
static int merge_sides(json_t *m, const char **a, size_t *alen, const char **b, size_t *blen) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) return -1;
        *a = s, *alen = (size_t)(sp - s), *b = sp + 1, *blen = strlen(sp + 1);
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0)), *alen = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1)), *blen = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return -1;
}

static void read_config(struct tokenizer *t, const char *cfg_path) {
    json_t *cfg = json_load_file(cfg_path, 0, NULL);
    if (!cfg) return;
    json_t *eos = json_object_get(cfg, "eos_token");
    const char *s = json_is_string(eos) ? json_string_value(eos) : jstr(eos, "content");
    if (s) t->eos_id = tokenizer_token_id(t, s, strlen(s));
    json_decref(cfg);
}

int tokenizer_load_file(const char *path, struct tokenizer **out, char *err, size_t errlen) {
    json_error_t jerr;
    int16_t u2b[324];
    struct tokenizer *t = calloc(1, sizeof *t);
    unicode_byte_table(u2b);
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &jerr);
    char *scratch = NULL;
    *out = NULL;
    if (!t) FAIL("%s: out of memory", path);
    t->eos_id = -1;
    if (!root) FAIL("%s: line %d: %s", path, jerr.line, jerr.text);

    json_t *model = json_object_get(root, "model");
    const char *mtype = jstr(model, "type");
    if (!mtype || strcmp(mtype, "BPE")) FAIL("%s: model.type must be BPE", path);
    if (json_is_true(json_object_get(model, "byte_fallback")) || json_is_true(json_object_get(model, "ignore_merges")))
        FAIL("%s: BPE byte_fallback / ignore_merges are not supported", path);
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0) FAIL("%s: BPE dropout is not supported", path);
    const char *cs = jstr(model, "continuing_subword_prefix"), *ew = jstr(model, "end_of_word_suffix");
    if ((cs && *cs) || (ew && *ew)) FAIL("%s: subword prefixes/suffixes are not supported", path);

    json_t *norm = json_object_get(root, "normalizer");
    if (json_is_null(norm) || !norm)
        t->normalize_nfc = 0;
    else if (jstr(norm, "type") && !strcmp(jstr(norm, "type"), "NFC"))
        t->normalize_nfc = 1;
    else
        FAIL("%s: normalizer must be NFC or null", path);

    const char *rx = find_split_regex(json_object_get(root, "pre_tokenizer"), err, errlen);
    if (!rx) goto fail;
    if (check_byte_level_decoder(json_object_get(root, "decoder"), err, errlen)) goto fail;

    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab) || !json_is_array(merges)) FAIL("%s: model.vocab / model.merges missing", path);
    if (added && !json_is_array(added)) FAIL("%s: added_tokens is not a list", path);

    // Sizes: ids and total bytes.
    int64_t max_id = -1;
    size_t total = 0, n_entries = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= (1 << 30))
            FAIL("%s: vocab entry \"%s\" has a bad id", path, key);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
        total += strlen(key);
        n_entries++;
    }
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_t *id = json_object_get(a, "id");
        const char *content = jstr(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 30) || !content ||
            !*content)
            FAIL("%s: added_tokens[%zu] needs an id and a content", path, i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
        total += json_string_length(json_object_get(a, "content"));
        n_entries++;
    }
    if (max_id < 0) FAIL("%s: empty vocabulary", path);
    t->n_vocab = (int32_t)(max_id + 1);
    t->tok_bytes = malloc(total + 1);
    t->tok_off = calloc((size_t)t->n_vocab + 1, sizeof *t->tok_off);
    t->tok_flags = calloc((size_t)t->n_vocab, 1);
    t->vocab_cap = cap_for(n_entries);
    t->vocab_slots = malloc(t->vocab_cap * sizeof *t->vocab_slots);
    t->added = calloc(json_array_size(added) + 1, sizeof *t->added);
    if (!t->tok_bytes || !t->tok_off || !t->tok_flags || !t->vocab_slots || !t->added) FAIL("%s: out of memory", path);
    memset(t->vocab_slots, 0xff, t->vocab_cap * sizeof *t->vocab_slots);

    // Bytes per id, laid out in id order: first lengths, then prefix sums, then the bytes.
    const char **src = calloc((size_t)t->n_vocab, sizeof *src);
    uint32_t *srclen = calloc((size_t)t->n_vocab, sizeof *srclen);
    if (!src || !srclen) {
        free(src), free(srclen);
        FAIL("%s: out of memory", path);
    }
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (t->tok_flags[id]) {
            free(src), free(srclen);
            FAIL("%s: id %d appears twice in the vocabulary", path, id);
        }
        t->tok_flags[id] = TOK_USED;
        src[id] = key, srclen[id] = (uint32_t)strlen(key);
    }
    json_array_foreach(added, i, a) {
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        t->tok_flags[id] = TOK_USED | TOK_ADDED | (json_is_true(json_object_get(a, "special")) ? TOK_SPECIAL : 0);
        src[id] = jstr(a, "content"), srclen[id] = (uint32_t)json_string_length(json_object_get(a, "content"));
    }
    uint64_t off = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->tok_off[id] = off;
        if (!src[id]) continue;
        if (t->tok_flags[id] & TOK_ADDED) {
            memcpy(t->tok_bytes + off, src[id], srclen[id]);
            off += srclen[id];
        } else {
            long n = bytelevel_decode(u2b, src[id], srclen[id], t->tok_bytes + off);
            if (n < 0) {
                free(src), free(srclen);
                FAIL("%s: vocab entry %d is not byte-level text", path, id);
            }
            off += (uint64_t)n;
        }
    }
    t->tok_off[t->n_vocab] = off;
    free(src), free(srclen);
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->tok_flags[id] & (TOK_USED | TOK_ADDED)) == TOK_USED) vocab_insert(t, id);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = tokenizer_token_id(t, &c, 1);
    }

    // Merges: rank = position in the list.
    size_t n_merges = json_array_size(merges);
    if (n_merges >= (1u << 30)) FAIL("%s: too many merges", path);
    t->merge_cap = cap_for(n_merges);
    t->merges = calloc(t->merge_cap, sizeof *t->merges);
    scratch = malloc(4096);
    if (!t->merges || !scratch) FAIL("%s: out of memory", path);
    size_t scratch_cap = 4096;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *sa, *sb;
        size_t la, lb;
        if (merge_sides(m, &sa, &la, &sb, &lb)) FAIL("%s: merges[%zu] is malformed", path, i);
        if (la + lb > scratch_cap) {
            free(scratch);
            scratch_cap = 2 * (la + lb);
            if (!(scratch = malloc(scratch_cap))) FAIL("%s: out of memory", path);
        }
        long na = bytelevel_decode(u2b, sa, la, scratch),
             nb = na < 0 ? -1 : bytelevel_decode(u2b, sb, lb, scratch + na);
        if (nb < 0) FAIL("%s: merges[%zu] is not byte-level text", path, i);
        int32_t l = tokenizer_token_id(t, scratch, (size_t)na), r = tokenizer_token_id(t, scratch + na, (size_t)nb);
        int32_t lr = tokenizer_token_id(t, scratch, (size_t)(na + nb));
        if (l < 0 || r < 0 || lr < 0) FAIL("%s: merges[%zu] uses a token missing from the vocabulary", path, i);
        merge_put(t, l, r, (int32_t)i, lr);
    }
    t->n_merges = (int32_t)n_merges;

    // Added tokens: matched on raw bytes, and found by tokenizer_token_id.
    json_array_foreach(added, i, a) {
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        struct added_token *at = &t->added[t->n_added++];
        at->len = t->tok_off[id + 1] - t->tok_off[id];
        at->text = t->tok_bytes + t->tok_off[id];
        at->id = id;
        t->added_first[(unsigned char)at->text[0]] = 1;
        vocab_insert(t, id);
    }

    int rc;
    PCRE2_SIZE eoff;
    char *urx = expand_unicode_classes(rx);
    if (!urx) FAIL("%s: out of memory", path);
    t->re = pcre2_compile((PCRE2_SPTR)urx, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &rc, &eoff, NULL);
    free(urx);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        FAIL("%s: pre-tokenizer regex (its Unicode classes spelled out) at offset %zu: %s", path, (size_t)eoff,
             (char *)msg);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); // without JIT, pcre2_match interprets

    {
        // tokenizer_config.json beside tokenizer.json (optional): eos_token.
        size_t pl = strlen(path);
        char *cfg = malloc(pl + 32);
        if (cfg) {
            memcpy(cfg, path, pl + 1);
            char *slash = strrchr(cfg, '/');
            strcpy(slash ? slash + 1 : cfg, "tokenizer_config.json");
            read_config(t, cfg);
            free(cfg);
        }
    }
    free(scratch);
    json_decref(root);
    *out = t;
    return 0;
fail:
    free(scratch);
    json_decref(root);
    tokenizer_free(t);
    return -1;
}

int tokenizer_load(const char *dir, struct tokenizer **out, char *err, size_t errlen) {
    size_t n = strlen(dir);
    char *path = malloc(n + 32);
    if (!path) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(path, n + 32, "%s/tokenizer.json", dir);
    int rc = tokenizer_load_file(path, out, err, errlen);
    free(path);
    return rc;
}

void tokenizer_free(struct tokenizer *t) {
    if (!t) return;
    free(t->tok_bytes);
    free(t->tok_off);
    free(t->tok_flags);
    free(t->vocab_slots);
    free(t->merges);
    free(t->added);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

int32_t tokenizer_vocab_size(const struct tokenizer *t) {
    return t->n_vocab;
}
int32_t tokenizer_eos_id(const struct tokenizer *t) {
    return t->eos_id;
}

const char *tokenizer_token_bytes(const struct tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || !(t->tok_flags[id] & TOK_USED)) return NULL;
    *len = t->tok_off[id + 1] - t->tok_off[id];
    return t->tok_bytes + t->tok_off[id];
}

int tokenizer_is_special(const struct tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->tok_flags[id] & TOK_SPECIAL);
}

// ---------------------------------------------------------------------------------------------
// Encoding

struct sym {
    int32_t id;
    int32_t prev, next; // -1 at the ends
    int32_t len;        // 0 once merged into its left neighbour
};

struct cand {
    int32_t rank, pos, new_id;
};

// A small cache of piece -> ids for short pieces: most of a long prompt repeats.
enum { CACHE_SLOTS = 1 << 14, CACHE_MAX_BYTES = 24, CACHE_MAX_IDS = 8 };
struct cache_entry {
    uint8_t len, n_ids;
    char bytes[CACHE_MAX_BYTES];
    int32_t ids[CACHE_MAX_IDS];
};

struct encoder {
    const struct tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    struct sym *syms;
    size_t sym_cap;
    struct cand *heap;
    size_t heap_n, heap_cap;
    struct cache_entry *cache;
};

static int ids_push(struct encoder *e, int32_t id) {
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 256;
        int32_t *p = realloc(e->ids, cap * sizeof *p);
        if (!p) return -1;
        e->ids = p, e->cap = cap;
    }
    e->ids[e->n++] = id;
    return 0;
}

static inline bool cand_less(const struct cand *a, const struct cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(struct encoder *e, struct cand c) {
    if (e->heap_n == e->heap_cap) {
        size_t cap = e->heap_cap ? 2 * e->heap_cap : 64;
        struct cand *p = realloc(e->heap, cap * sizeof *p);
        if (!p) return -1;
        e->heap = p, e->heap_cap = cap;
    }
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!cand_less(&c, &e->heap[up])) break;
        e->heap[i] = e->heap[up];
        i = up;
    }
    e->heap[i] = c;
    return 0;
}

static struct cand heap_pop(struct encoder *e) {
    struct cand top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!cand_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

static int push_pair(struct encoder *e, int32_t pos) {
    const struct sym *s = e->syms;
    if (pos < 0 || s[pos].next < 0) return 0;
    const struct merge_slot *m = merge_get(e->t, s[pos].id, s[s[pos].next].id);
    return m ? heap_push(e, (struct cand){m->rank, pos, m->new_id}) : 0;
}

// BPE on one piece, exactly as HF's Word::merge_all without dropout: pop the lowest (rank,
// position) candidate, skip it if stale (its pair no longer makes the same token), merge, and
// queue the two new neighbour pairs.
static int bpe_piece(struct encoder *e, const unsigned char *s, size_t n) {
    const struct tokenizer *t = e->t;
    if (n == 1) return t->byte_id[s[0]] >= 0 ? ids_push(e, t->byte_id[s[0]]) : 0;
    struct cache_entry *ce = NULL;
    if (n <= CACHE_MAX_BYTES && e->cache) {
        ce = &e->cache[fnv1a64(FNV1A64_INIT, s, n) & (CACHE_SLOTS - 1)];
        if (ce->len == n && !memcmp(ce->bytes, s, n)) {
            for (int i = 0; i < ce->n_ids; i++)
                if (ids_push(e, ce->ids[i])) return -1;
            return 0;
        }
    }
    if (n > e->sym_cap) {
        struct sym *p = realloc(e->syms, n * sizeof *p);
        if (!p) return -1;
        e->syms = p, e->sym_cap = n;
    }
    struct sym *sy = e->syms;
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) continue; // HF drops characters missing from the vocabulary (no unk token)
        sy[m] = (struct sym){id, m - 1, m + 1, 1};
        m++;
    }
    if (!m) return 0;
    sy[m - 1].next = -1;
    e->heap_n = 0;
    for (int32_t i = 0; i + 1 < m; i++)
        if (push_pair(e, i)) return -1;
    while (e->heap_n) {
        struct cand c = heap_pop(e);
        struct sym *cur = &sy[c.pos];
        if (!cur->len || cur->next < 0) continue;
        int32_t nx = cur->next;
        const struct merge_slot *mg = merge_get(t, cur->id, sy[nx].id);
        if (!mg || mg->new_id != c.new_id) continue;
        cur->id = c.new_id;
        cur->len += sy[nx].len;
        cur->next = sy[nx].next;
        sy[nx].len = 0;
        if (cur->next >= 0) sy[cur->next].prev = c.pos;
        if (push_pair(e, cur->prev) || push_pair(e, c.pos)) return -1;
    }
    size_t first = e->n;
    for (int32_t i = 0; i >= 0; i = sy[i].next)
        if (ids_push(e, sy[i].id)) return -1;
    if (ce && e->n - first <= CACHE_MAX_IDS) {
        ce->len = (uint8_t)n, ce->n_ids = (uint8_t)(e->n - first);
        memcpy(ce->bytes, s, n);
        memcpy(ce->ids, e->ids + first, (e->n - first) * sizeof *e->ids);
    }
    return 0;
}

// Splits s[0..len) with the pre-tokenizer regex and calls piece() on each piece, in order (the
// text between matches is a piece too, as HF's Isolated split makes it).
static int split_pieces(const struct tokenizer *t, pcre2_match_data *md, pcre2_match_context *mc,
                        const unsigned char *s, size_t len, int (*piece)(void *arg, const unsigned char *p, size_t n),
                        void *arg, char *err, size_t errlen) {
    size_t at = 0;
    while (at < len) {
        int rc = pcre2_match(t->re, s, len, at, PCRE2_NO_UTF_CHECK, md, mc);
        size_t ms = len, me = len;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            ms = ov[0], me = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            FAIL("pre-tokenizer regex failed at byte %zu: %s", at, (char *)msg);
        }
        if (ms > at && piece(arg, s + at, ms - at)) FAIL("out of memory"); // text between matches
        if (me > ms && piece(arg, s + ms, me - ms)) FAIL("out of memory");
        if (me == ms && ms < len) { // an empty match: step over one character
            size_t l;
            utf8_classify(s + ms, len - ms, &l);
            if (piece(arg, s + ms, l)) FAIL("out of memory");
            me = ms + l;
        }
        at = me;
    }
    return 0;
fail:
    return -1;
}

static int bpe_piece_cb(void *e, const unsigned char *s, size_t n) {
    return bpe_piece(e, s, n);
}

// Code points that utf8proc must not normalise with their neighbours, so that the result is HF's
// NFC (tools/gen/make_nfc_sweep.py, tests/data/tokenizer/nfc.txt):
//  - nfc_tables.h: marks and compositions assigned after Unicode 9.0.  HF's normalizer has
//    Unicode 9.0 tables, so it neither reorders nor composes them; utf8proc 2.8 (Unicode 15.0)
//    does.  To HF they are starters that compose with nothing: a wall on both sides.
//  - U+11A7: utf8proc 2.8 composes a Hangul LV syllable + U+11A7 (TBase, not a trailing
//    consonant) into the LV syllable and so deletes the U+11A7; in true NFC it stays.
static bool nfc_wall(uint32_t cp) {
    if (cp < nfc_unicode9_unknown[0][0]) return false; // Latin through Thaana: no walls
    if (cp == 0x11A7) return true;
    size_t lo = 0, hi = sizeof nfc_unicode9_unknown / sizeof nfc_unicode9_unknown[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_unicode9_unknown[mid][0])
            hi = mid;
        else if (cp > nfc_unicode9_unknown[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

// NFC of valid UTF-8 s[0..len) into a malloc'd *out: utf8proc's NFC of each run between walls,
// each wall copied as it is.  Returns the output length, or a utf8proc error (< 0).
static utf8proc_ssize_t normalize_nfc(const unsigned char *s, size_t len, utf8proc_uint8_t **out) {
    const utf8proc_option_t nfc = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0, run = 0, i = 0;
    *out = NULL;
    while (i <= len) {
        utf8proc_int32_t cp = -1;
        utf8proc_ssize_t l = 0;
        if (i < len) {
            l = utf8proc_iterate(s + i, (utf8proc_ssize_t)(len - i), &cp);
            if (l <= 0) return l < 0 ? l : UTF8PROC_ERROR_INVALIDUTF8;
            if (!nfc_wall((uint32_t)cp)) {
                i += (size_t)l;
                continue;
            }
        }
        if (i == len && run == 0) return utf8proc_map(s, (utf8proc_ssize_t)len, out, nfc); // no wall: the common case
        utf8proc_uint8_t *part = NULL;
        utf8proc_ssize_t r = 0;
        if (i > run && (r = utf8proc_map(s + run, (utf8proc_ssize_t)(i - run), &part, nfc)) < 0) {
            free(buf);
            return r;
        }
        if (n + (size_t)r + (size_t)l + 1 > cap) {
            cap = 2 * (n + (size_t)r + (size_t)l + 1) + len;
            unsigned char *nb = realloc(buf, cap);
            if (!nb) {
                free(part), free(buf);
                return UTF8PROC_ERROR_NOMEM;
            }
            buf = nb;
        }
        if (r) memcpy(buf + n, part, (size_t)r), n += (size_t)r;
        free(part);
        if (i == len) break;
        memcpy(buf + n, s + i, (size_t)l), n += (size_t)l; // the wall itself
        i += (size_t)l, run = i;
    }
    buf[n] = 0;
    *out = buf;
    return (utf8proc_ssize_t)n;
}

// Normalises one segment (between added tokens), splits it with the regex, BPEs each piece.
static int encode_segment(struct encoder *e, pcre2_match_data *md, pcre2_match_context *mc, const char *seg, size_t len,
                          char *err, size_t errlen) {
    const struct tokenizer *t = e->t;
    utf8proc_uint8_t *norm = NULL;
    const unsigned char *s = (const unsigned char *)seg;
    if (t->normalize_nfc) {
        bool ascii = true;
        for (size_t i = 0; i < len && ascii; i++) ascii = s[i] < 0x80;
        if (!ascii) {
            utf8proc_ssize_t r = normalize_nfc(s, len, &norm);
            if (r < 0) FAIL("NFC normalisation failed: %s", utf8proc_errmsg(r));
            s = norm, len = (size_t)r;
        }
    }
    if (split_pieces(t, md, mc, s, len, bpe_piece_cb, e, err, errlen)) goto fail;
    free(norm);
    return 0;
fail:
    free(norm);
    return -1;
}

struct piece_ends {
    size_t *ends, cap, n;
    const unsigned char *base;
};

static int piece_end_cb(void *arg, const unsigned char *p, size_t n) {
    struct piece_ends *pe = arg;
    if (pe->n < pe->cap) pe->ends[pe->n] = (size_t)(p + n - pe->base);
    pe->n++;
    return 0;
}

int tokenizer_pretokenize(const struct tokenizer *t, const char *text, size_t len, size_t *ends, size_t cap, size_t *n,
                          char *err, size_t errlen) {
    struct piece_ends pe = {.ends = ends, .cap = cap, .base = (const unsigned char *)text};
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    int rc = -1;
    *n = 0;
    if (!md) FAIL("out of memory");
    rc = split_pieces(t, md, NULL, (const unsigned char *)text, len, piece_end_cb, &pe, err, errlen);
    *n = pe.n;
fail:
    pcre2_match_data_free(md);
    return rc;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, char *err,
                     size_t errlen) {
    return tokenizer_encode_markup(t, text, len, NULL, ids, n, err, errlen);
}

int tokenizer_encode_markup(const struct tokenizer *t, const char *text, size_t len, const unsigned char *markup,
                            int32_t **ids, size_t *n, char *err, size_t errlen) {
    struct encoder e = {.t = t};
    char *clean = NULL;
    size_t clen;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    pcre2_jit_stack *js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    *ids = NULL, *n = 0;
    if (!md || !mc || !js) FAIL("out of memory");
    pcre2_jit_stack_assign(mc, NULL, js);
    pcre2_set_match_limit(mc, UINT32_MAX);
    pcre2_set_depth_limit(mc, UINT32_MAX);
    if (len > 64 && !(e.cache = calloc(CACHE_SLOTS, sizeof *e.cache))) FAIL("out of memory");
    if (utf8_sanitize(text, len, &clean, &clen)) FAIL("out of memory");
    if (markup && clen != len) FAIL("the text is not valid UTF-8"); // the mask's offsets would not hold

    // Added tokens first: at each position the longest added token wins.
    size_t seg = 0, i = 0;
    while (i < clen) {
        const struct added_token *best = NULL;
        if (t->added_first[(unsigned char)clean[i]])
            for (size_t k = 0; k < t->n_added; k++) {
                const struct added_token *a = &t->added[k];
                if (a->len <= clen - i && (!best || a->len > best->len) && !memcmp(clean + i, a->text, a->len) &&
                    (!markup || !memchr(markup + i, 0, a->len)))
                    best = a;
            }
        if (!best) {
            i++;
            continue;
        }
        if (i > seg && encode_segment(&e, md, mc, clean + seg, i - seg, err, errlen)) goto fail;
        if (ids_push(&e, best->id)) FAIL("out of memory");
        i += best->len;
        seg = i;
    }
    if (clen > seg && encode_segment(&e, md, mc, clean + seg, clen - seg, err, errlen)) goto fail;
    *ids = e.ids;
    *n = e.n;
    e.ids = NULL;
    free(clean);
    free(e.syms), free(e.heap), free(e.cache);
    pcre2_match_data_free(md), pcre2_match_context_free(mc), pcre2_jit_stack_free(js);
    if (!*ids) *ids = malloc(sizeof **ids); // an empty result is still a valid pointer
    return 0;
fail:
    free(clean);
    free(e.ids), free(e.syms), free(e.heap), free(e.cache);
    pcre2_match_data_free(md), pcre2_match_context_free(mc), pcre2_jit_stack_free(js);
    return -1;
}

// ---------------------------------------------------------------------------------------------
// Decoding

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out, size_t *len,
                     char *err, size_t errlen) {
    struct sbuf raw = {0}, b = {0};
    *out = NULL, *len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *s = tokenizer_token_bytes(t, ids[i], &l);
        if (!s) FAIL("token id %d is not in the vocabulary", ids[i]);
        if (skip_special && tokenizer_is_special(t, ids[i])) continue;
        if (sbuf_add(&raw, s, l)) FAIL("out of memory");
    }
    if (utf8_lossy(&b, (const unsigned char *)raw.p, raw.len, 0, NULL)) FAIL("out of memory");
    free(raw.p);
    *out = b.p ? b.p : calloc(1, 1);
    *len = b.len;
    return *out ? 0 : -1;
fail:
    free(raw.p), free(b.p);
    return -1;
}

void tokenizer_stream_init(struct tokenizer_stream *s, const struct tokenizer *t, int skip_special) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
}

static int stream_emit(struct tokenizer_stream *s, const char *add, size_t add_len, int final, const char **text,
                       size_t *len) {
    struct sbuf in = {0}, out = {.p = s->buf, .len = 0, .cap = s->cap};
    size_t used;
    int rc = -1;
    if (sbuf_add(&in, s->pend, s->n_pend) || sbuf_add(&in, add, add_len)) goto done;
    if (utf8_lossy(&out, (const unsigned char *)in.p, in.len, !final, &used)) goto done;
    s->n_pend = in.len - used; // at most 3 bytes: an incomplete sequence
    memcpy(s->pend, in.p + used, s->n_pend);
    rc = 0;
done:
    s->buf = out.p, s->cap = out.cap;
    free(in.p);
    *text = s->buf ? s->buf : "";
    *len = rc ? 0 : out.len;
    return rc;
}

int tokenizer_stream_push(struct tokenizer_stream *s, int32_t id, const char **text, size_t *len, char *err,
                          size_t errlen) {
    size_t l;
    const char *b = tokenizer_token_bytes(s->t, id, &l);
    *text = "", *len = 0;
    if (!b) {
        snprintf(err, errlen, "token id %d is not in the vocabulary", id);
        return -1;
    }
    if (s->skip_special && tokenizer_is_special(s->t, id)) l = 0;
    if (stream_emit(s, b, l, 0, text, len)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

int tokenizer_stream_flush(struct tokenizer_stream *s, const char **text, size_t *len) {
    return stream_emit(s, "", 0, 1, text, len);
}

void tokenizer_stream_free(struct tokenizer_stream *s) {
    free(s->buf);
    s->buf = NULL, s->cap = 0, s->n_pend = 0;
}
