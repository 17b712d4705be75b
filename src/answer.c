// answer.c: a generation's answer as its parts (answer.h).
#include "answer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void close_open(struct answer *a) {
    if (!a->open) return;
    a->open = false;
    if (a->on_close) a->on_close(a->ctx, &a->parts[a->n - 1]);
}

static void make_id(char *out, size_t cap, const char *prefix) {
    char hex[25];
    random_hex(hex, 12); // unique across restarts, unlike a counter
    snprintf(out, cap, "%s%s", prefix, hex);
}

// A new part of kind k, open; NULL when out of memory.
static struct part *open_part(struct answer *a, enum part_kind k, const char *name) {
    close_open(a);
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 4;
        struct part *p = realloc(a->parts, sizeof *p * (size_t)cap);
        if (!p) {
            a->oom = true;
            return NULL;
        }
        a->parts = p, a->cap = cap;
    }
    struct part *p = &a->parts[a->n];
    *p = (struct part){.kind = k, .index = a->n};
    if (a->id_prefix[k]) make_id(p->id, sizeof p->id, a->id_prefix[k]);
    if (k == PART_CALL) {
        snprintf(p->name, sizeof p->name, "%s", name);
        make_id(p->call_id, sizeof p->call_id, a->call_prefix ? a->call_prefix : "call_");
    }
    a->n++;
    a->open = true;
    if (a->on_open) a->on_open(a->ctx, p);
    return p;
}

static void grow(struct answer *a, struct part *p, const char *s, size_t n) {
    if (sbuf_add(&p->text, s, n)) a->oom = true;
    if (a->on_delta) a->on_delta(a->ctx, p, s, n);
}

void answer_text(struct answer *a, enum gen_channel ch, const char *s, size_t n) {
    const enum part_kind k = ch == GEN_REASONING ? PART_REASONING : PART_TEXT;
    if (!n) return;
    struct part *p = a->open && a->parts[a->n - 1].kind == k ? &a->parts[a->n - 1] : open_part(a, k, NULL);
    if (p) grow(a, p, s, n);
}

void answer_call_begin(struct answer *a, const char *name) {
    open_part(a, PART_CALL, name);
}

static struct part *open_call(struct answer *a) {
    return a->open && a->parts[a->n - 1].kind == PART_CALL ? &a->parts[a->n - 1] : NULL;
}

void answer_call_delta(struct answer *a, const char *s, size_t n) {
    struct part *p = open_call(a);
    if (p && n) grow(a, p, s, n);
}

void answer_call_end(struct answer *a, const char *name, const char *arguments) {
    struct part *p = open_call(a);
    if (!p) p = open_part(a, PART_CALL, name); // (a sink of whole calls: no begin came)
    if (!p) return;
    const size_t n = strlen(arguments);
    if (p->text.len != n || (n && memcmp(p->text.p, arguments, n))) { // what is left of the pieces
        const size_t have =
            p->text.len <= n && !memcmp(p->text.p ? p->text.p : "", arguments, p->text.len) ? p->text.len : 0;
        p->text.len = have;
        grow(a, p, arguments + have, n - have);
    }
    close_open(a);
}

void answer_call_abort(struct answer *a) {
    struct part *p = open_call(a);
    if (!p) return;
    p->aborted = true;
    close_open(a);
}

void answer_finish(struct answer *a) {
    close_open(a);
}

// The sink's events, on the answer that begins the sink's context.
static void on_text(void *ctx, enum gen_channel ch, const char *s, size_t n) {
    answer_text(ctx, ch, s, n);
}
static void on_call_begin(void *ctx, const char *name) {
    answer_call_begin(ctx, name);
}
static void on_call_delta(void *ctx, const char *s, size_t n) {
    answer_call_delta(ctx, s, n);
}
static void on_call(void *ctx, const char *name, const char *arguments) {
    answer_call_end(ctx, name, arguments);
}
static void on_call_abort(void *ctx) {
    answer_call_abort(ctx);
}

void answer_attach(struct gen_sink *sink) {
    sink->text = on_text;
    sink->tool_call = on_call;
    sink->tool_call_begin = on_call_begin;
    sink->tool_call_delta = on_call_delta;
    sink->tool_call_abort = on_call_abort;
}

void answer_free(struct answer *a) {
    for (int i = 0; i < a->n; i++) sbuf_free(&a->parts[i].text);
    free(a->parts);
    a->parts = NULL;
    a->n = a->cap = 0;
    a->open = false;
}
