// golden.h: reader for the reference-output fixtures written by tools/gen/make_golden.py.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN_MAGIC "CALLAGLD"
#define GOLDEN_VERSION 1

struct golden_row {
    uint32_t pos;          // prompt position
    int32_t top1;          // reference argmax over the whole vocabulary
    float margin;          // reference top1 - top2
    float rms;             // rms of the whole reference row
    uint32_t n_ids;
    int32_t *ids;          // vocabulary ids kept
    float *logits;         // reference logits at ids
};

struct golden {
    char geometry[33];
    uint64_t seed;
    char ref[33];          // "hf-<version>-float32" or "-bf16"
    uint32_t n_prompt;
    int32_t *prompt;
    uint32_t n_rows;
    struct golden_row *rows;
    uint32_t n_gen;
    int32_t *gen;
    float *gen_margin;
};

struct golden_reader {
    const uint8_t *p, *end;
    int bad;
};

static void gr_take(struct golden_reader *r, void *dst, size_t n) {
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, r->p, n);
    r->p += n;
}

static void *gr_array(struct golden_reader *r, uint32_t count, size_t el) {
    if (count > (1u << 24)) r->bad = 1;
    if (r->bad) return NULL;
    void *a = malloc((size_t)count * el + 1);
    gr_take(r, a, (size_t)count * el);
    return a;
}

// Loads path; 0 on success, -1 with a hint printed.
static int golden_load(const char *path, struct golden *g) {
    memset(g, 0, sizeof *g);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    struct golden_reader r = {buf, buf + n, 0};
    char magic[8];
    uint32_t ver;
    gr_take(&r, magic, 8);
    gr_take(&r, &ver, 4);
    if (r.bad || memcmp(magic, GOLDEN_MAGIC, 8) || ver != GOLDEN_VERSION) {
        fprintf(stderr, "%s: not a version-%d golden file\n---> HINT: regenerate with tools/gen/make_golden.py\n", path,
                GOLDEN_VERSION);
        free(buf);
        return -1;
    }
    gr_take(&r, g->geometry, 32);
    gr_take(&r, &g->seed, 8);
    gr_take(&r, g->ref, 32);
    gr_take(&r, &g->n_prompt, 4);
    g->prompt = gr_array(&r, g->n_prompt, 4);
    gr_take(&r, &g->n_rows, 4);
    if (g->n_rows > 64) r.bad = 1;
    g->rows = r.bad ? NULL : calloc(g->n_rows + 1, sizeof *g->rows);
    for (uint32_t i = 0; !r.bad && i < g->n_rows; i++) {
        struct golden_row *w = &g->rows[i];
        gr_take(&r, &w->pos, 4);
        gr_take(&r, &w->top1, 4);
        gr_take(&r, &w->margin, 4);
        gr_take(&r, &w->rms, 4);
        gr_take(&r, &w->n_ids, 4);
        w->ids = gr_array(&r, w->n_ids, 4);
        w->logits = gr_array(&r, w->n_ids, 4);
    }
    gr_take(&r, &g->n_gen, 4);
    g->gen = gr_array(&r, g->n_gen, 4);
    g->gen_margin = gr_array(&r, g->n_gen, 4);
    free(buf);
    if (r.bad || r.p != r.end) {
        fprintf(stderr, "%s: truncated or malformed golden file\n---> HINT: regenerate with tools/gen/make_golden.py\n", path);
        return -1;
    }
    return 0;
}
