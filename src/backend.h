// backend.h: the seam between the engine and its backends. engine.c and backend_*.c include it;
// everything above the engine sees only engine.h, where struct engine and struct seq are opaque.
//
// A backend fills a struct backend_ops (one slot a function, the optional ones marked) and keeps
// its own state behind engine.impl and seq.impl. engine.c validates every argument (token ids,
// capacity, logit rows, layer numbers) before it calls a slot, chunks a long forward, and moves
// seq.pos; a backend never moves it.
#pragma once

#include "engine.h"

struct backend_ops {
    const char *name;
    // 1 when this backend can run here on the given device; 0 with the reason in msg.
    int (*available)(int device, char *msg, size_t msglen);
    int (*load)(struct engine *e, char *err, size_t errlen);
    void (*unload)(struct engine *e);
    int (*seq_alloc)(struct engine *e, struct seq *s, char *err, size_t errlen); // sets s->impl
    void (*seq_release)(struct seq *s);
    void (*seq_clear)(struct seq *s); // zero state
    int (*seq_copy)(struct seq *dst, const struct seq *src, char *err, size_t errlen);
    // One chunk: tokens at positions s->pos..; writes logits of the wanted rows (row indices
    // within this chunk), and the argmax of the chunk's last row. Does not advance s->pos.
    int (*forward_chunk)(struct engine *e, struct seq *s, const int32_t *tokens, int n, const int *rows, int n_rows,
                         float *logits, int32_t *next, char *err, size_t errlen);
    // (optional) A chunk whose last row's next token the backend chooses itself (engine_pick), the
    // logits staying where they are; without it engine.c reads the row and picks on the host.
    int (*forward_pick)(struct engine *e, struct seq *s, const int32_t *tokens, int n, const struct engine_pick *pick,
                        struct engine_choice *choice, char *err, size_t errlen);
    // (optional, with forward_pick) The last row of the latest forward_pick into out [vocab].
    int (*last_logits)(struct engine *e, float *out, char *err, size_t errlen);
    // (optional, all three) Speculative verification (engine_verify): the most tokens verify takes;
    // a forward of n (2 <= n <= verify_max) tokens that writes every row's argmax and keeps what
    // verify_keep needs to return the sequence to the state after its first keep tokens (n: the
    // verified count). Neither moves s->pos.
    int (*verify_max)(const struct engine *e);
    float (*verify_gate)(const struct engine *e); // (optional) engine_verify_gate; NULL: 0
    // (optional, with verify_max) The longest forward at position pos that runs faster as
    // consecutive forwards of verify_max tokens each (a backend whose short forwards cost far less
    // than its long ones' fixed work); NULL or 0: a forward runs as one chunk.
    int (*short_split)(const struct engine *e, int pos);
    int (*verify)(struct engine *e, struct seq *s, const int32_t *tokens, int n, int32_t *all_next, char *err,
                  size_t errlen);
    int (*verify_keep)(struct engine *e, struct seq *s, int n, int keep, char *err, size_t errlen);
    // (optional) The embedding rows of n valid tokens: out [n, hidden] (engine_embed).
    int (*embed)(struct engine *e, const int32_t *tokens, int n, float *out, char *err, size_t errlen);
    // (optional) One layer over n rows at positions s->pos.. through the same per-layer function
    // forward_chunk runs (engine_layer_probe); does not advance s->pos.
    int (*layer_probe)(struct engine *e, struct seq *s, int layer, const float *x_in, int n, float *x_out,
                       float *router_logits, char *err, size_t errlen);
    // (optional) Host memory the backend copies logits into fastest (engine_logits_alloc).
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
};

struct engine {
    struct model model;
    const struct backend_ops *ops;
    struct engine_options opts; // as opened, with the environment's developer settings applied (engine.c)
    void *impl;                 // backend state
    int64_t weight_bytes;
    float *pick_row;     // [vocab] the last row of a choice made on the host (NULL until one is)
    float *pick_scratch; // [vocab] the host sampler's scratch (NULL until it is needed)
};

struct seq {
    struct engine *e;
    int pos, cap; // tokens consumed, capacity
    int verified; // tokens of an engine_verify not yet settled by engine_verify_keep (0: none)
    void *impl;   // backend state
};

extern const struct backend_ops backend_cpu;
#ifdef CALLA_CUDA
extern const struct backend_ops backend_cuda;
#endif
