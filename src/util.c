// util.c: see util.h.
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *p = NULL;
    long n = -1;
    if (!fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) && (p = malloc((size_t)n + 1)) &&
        fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) {
        p[n] = 0;
        if (len) *len = (size_t)n;
    }
    return p;
}

int sbuf_reserve(struct sbuf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return -1;
    }
    if (!b->p) p[0] = 0;
    b->p = p, b->cap = cap;
    return 0;
}

int sbuf_add(struct sbuf *b, const void *s, size_t n) {
    if (sbuf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int sbuf_adds(struct sbuf *b, const char *s) {
    return sbuf_add(b, s, strlen(s));
}

void sbuf_free(struct sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

uint64_t fnv1a64(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

void random_hex(char *out, int nbytes) {
    unsigned char b[32];
    if (nbytes > 32) nbytes = 32;
    if (getrandom(b, (size_t)nbytes, 0) != nbytes) { // no entropy source: time and address
        unsigned long long x = (unsigned long long)time(NULL) ^ (unsigned long long)(uintptr_t)out;
        for (int i = 0; i < nbytes; i++)
            x = x * 6364136223846793005ULL + 1442695040888963407ULL, b[i] = (unsigned char)(x >> 56);
    }
    for (int i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

int req_fail(struct req_error *re, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(re->msg, sizeof re->msg, fmt, ap);
    va_end(ap);
    re->status = status;
    re->param = param;
    return -1;
}
