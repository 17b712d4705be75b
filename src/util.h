// util.h: the small helpers every part of Calla shares: a clock, a growable byte buffer, FNV-1a,
// random ids, and the error a request gets.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// CLOCK_MONOTONIC seconds.
double now_s(void);

// The whole file at path, NUL-terminated, its length in *len (when not NULL); NULL when it cannot
// be opened or read (errno says why) or memory runs out.
char *read_file(const char *path, size_t *len);

// A growable byte buffer, always NUL-terminated once it holds anything.  A failed allocation
// is sticky: oom is set, the buffer keeps what it had, and every later add fails too, so a
// writer can check once at the end.
struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};
// Room for extra more bytes (and the NUL). 0, or -1 when out of memory.
int sbuf_reserve(struct sbuf *b, size_t extra);
// Appends s[0..n). 0, or -1 when out of memory (now or before).
int sbuf_add(struct sbuf *b, const void *s, size_t n);
int sbuf_adds(struct sbuf *b, const char *s);
void sbuf_free(struct sbuf *b);

// FNV-1a 64: fnv1a64(FNV1A64_INIT, p, n), or chained over several pieces.
#define FNV1A64_INIT 0xcbf29ce484222325ull
uint64_t fnv1a64(uint64_t h, const void *p, size_t n);

// nbytes (at most 32) random bytes as 2 * nbytes hex digits and a NUL into out: ids unique
// across restarts, unlike a counter.
void random_hex(char *out, int nbytes);

// An error for a client: an HTTP status, the offending parameter (a static string or NULL), a message.
struct req_error {
    int status;
    const char *param;
    char msg[512];
};
// Fills re and returns -1.
int req_fail(struct req_error *re, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
