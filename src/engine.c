// engine.c: backend selection, sequences, and chunked forward over the backend interface.
#include "backend.h"
#include "pick.h"
#include "util.h"

#include "gpu.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// The backends in order of preference when none is named (a GPU backend first, when built).
static const struct backend_ops *const backends[] = {
#ifdef CALLA_CUDA
    &backend_cuda,
#endif
    &backend_cpu,
};
enum { N_BACKENDS = sizeof backends / sizeof backends[0] };

static const struct backend_ops *pick_backend(const char *name, int device, char *err, size_t errlen) {
    char why[256] = "";
    for (int i = 0; i < N_BACKENDS; i++) {
        const struct backend_ops *b = backends[i];
        if (name && strcmp(name, b->name)) continue;
        if (b->available(device, why, sizeof why)) return b;
        if (name) {
            snprintf(err, errlen, "%s backend unavailable: %s (use --backend cpu)", b->name, why);
            return NULL;
        }
    }
    if (name && !strcmp(name, "cuda"))
        snprintf(err, errlen, "this build has no CUDA backend (nvcc was not found at build time); use --backend cpu");
    else if (name)
        snprintf(err, errlen, "unknown backend \"%s\" (cpu or cuda)", name);
    else
        snprintf(err, errlen, "no backend can run here: %s", why);
    return NULL;
}

// The developer and test settings the environment can turn on, applied by engine_open on top of the
// caller's options; an unset or empty variable changes nothing. Every variable Calla reads for them is
// in this table (README, "Developer settings").
enum env_kind {
    ENV_FLAG,  // a value other than "0" sets the bool
    ENV_FLAG0, // "0" sets the bool (a "no" field: CALLA_CPU_AVX=0 sets cpu_no_avx)
    ENV_BYTES, // a decimal byte count into the size_t
    ENV_PATH,  // the value itself into the const char *
};
static const struct env_setting {
    const char *name;
    enum env_kind kind;
    size_t field; // offsetof(struct engine_options, ...)
} env_settings[] = {
    {"CALLA_EXACT", ENV_FLAG, offsetof(struct engine_options, exact)}, // 1: the verification mode
    {"CALLA_CPU_REFERENCE", ENV_FLAG, offsetof(struct engine_options, cpu_reference)},
    {"CALLA_CPU_AVX", ENV_FLAG0, offsetof(struct engine_options, cpu_no_avx)},
    {"CALLA_CPU_ALLOC_LIMIT", ENV_BYTES, offsetof(struct engine_options, cpu_alloc_limit)},
    {"CALLA_ROUTER_TRACE", ENV_PATH, offsetof(struct engine_options, router_trace)},
};

static void apply_environment(struct engine_options *o) {
    for (size_t i = 0; i < sizeof env_settings / sizeof env_settings[0]; i++) {
        const struct env_setting *v = &env_settings[i];
        const char *val = getenv(v->name);
        if (!val || !*val) continue;
        char *f = (char *)o + v->field;
        switch (v->kind) {
        case ENV_FLAG:
            *(bool *)f = *(bool *)f || strcmp(val, "0");
            break;
        case ENV_FLAG0:
            *(bool *)f = *(bool *)f || !strcmp(val, "0");
            break;
        case ENV_BYTES:
            *(size_t *)f = (size_t)strtoull(val, NULL, 10);
            break;
        case ENV_PATH:
            *(const char **)f = val;
            break;
        }
    }
}

int engine_open(const char *model_dir, const struct engine_options *o, struct engine **out, char *err, size_t errlen) {
    struct engine_options def = {0};
    if (!o) o = &def;
    const struct backend_ops *ops = pick_backend(o->backend, o->device, err, errlen);
    if (!ops) return -1;
    struct engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    e->ops = ops;
    e->opts = *o;
    apply_environment(&e->opts);
    if (checkpoint_open(model_dir, &e->model, err, errlen)) {
        free(e);
        return -1;
    }
    // A GPU that is taken fails here, with which GPU and why, not in a cudaMalloc half-way.
    if (ops != &backend_cpu &&
        gpu_check_free(o->device, model_size_of(&e->model.g).bytes, o->gpu_exclusive, err, errlen)) {
        checkpoint_close(&e->model);
        free(e);
        return -1;
    }
    if (ops->load(e, err, errlen)) {
        checkpoint_close(&e->model);
        free(e);
        return -1;
    }
    *out = e;
    return 0;
}

void engine_close(struct engine *e) {
    if (!e) return;
    engine_logits_free(e, e->pick_row);
    free(e->pick_scratch);
    e->ops->unload(e);
    checkpoint_close(&e->model);
    free(e);
}

const struct geometry *engine_geometry(const struct engine *e) {
    return &e->model.g;
}
const struct model *engine_model(const struct engine *e) {
    return &e->model;
}
const char *engine_backend(const struct engine *e) {
    return e->ops->name;
}
int64_t engine_weight_bytes(const struct engine *e) {
    return e->weight_bytes;
}

int seq_new(struct engine *e, int max_ctx, struct seq **out, char *err, size_t errlen) {
    if (max_ctx < 1 || max_ctx > e->model.g.max_ctx) {
        snprintf(err, errlen, "context %d is out of range (1 to %d tokens)", max_ctx, e->model.g.max_ctx);
        return -1;
    }
    struct seq *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->e = e;
    s->cap = max_ctx;
    if (e->ops->seq_alloc(e, s, err, errlen)) {
        free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void seq_free(struct seq *s) {
    if (!s) return;
    s->e->ops->seq_release(s);
    free(s);
}

int seq_pos(const struct seq *s) {
    return s->pos;
}
int seq_capacity(const struct seq *s) {
    return s->cap;
}

void seq_reset(struct seq *s) {
    s->e->ops->seq_clear(s);
    s->pos = 0;
    s->verified = 0;
}

int seq_copy(struct seq *dst, const struct seq *src, char *err, size_t errlen) {
    if (dst->e != src->e || dst->cap < src->pos) {
        snprintf(err, errlen, "seq_copy: destination cannot hold the source (%d < %d tokens)", dst->cap, src->pos);
        return -1;
    }
    if (src->verified) {
        snprintf(err, errlen, "seq_copy: the source's verification is not settled (engine_verify_keep)");
        return -1;
    }
    if (dst == src) return 0;
    if (src->e->ops->seq_copy(dst, src, err, errlen)) return -1;
    dst->pos = src->pos;
    dst->verified = 0;
    return 0;
}

void progress_line(void *arg, int done, int total) {
    const struct progress_line *p = arg;
    if (total <= QWEN_PREFILL_CHUNK || !isatty(STDERR_FILENO)) return;
    fprintf(stderr, "\r%s: prefill %d / %d tokens (%d%%), %.1f s%s", p->who, done, total, (int)(100.0 * done / total),
            now_s() - p->t0, done == total ? "\n" : "");
    fflush(stderr);
}

// 0 when every id of tokens[0..n) is in the vocabulary; else -1 with the first bad one in err.
static int check_tokens(const struct engine *e, const int32_t *tokens, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->model.g.vocab) {
            snprintf(err, errlen, "token %d at index %d is outside the vocabulary (0..%d)", tokens[i], i,
                     e->model.g.vocab - 1);
            return -1;
        }
    return 0;
}

// One chunk and the choice after its last row: on the backend where it can, else from the row's
// logits on the host (pick.c).
static int forward_pick(struct engine *e, struct seq *s, const int32_t *tokens, int m, const struct engine_pick *p,
                        struct engine_choice *c, char *err, size_t errlen) {
    if (e->ops->forward_pick) return e->ops->forward_pick(e, s, tokens, m, p, c, err, errlen);
    const size_t V = (size_t)e->model.g.vocab;
    if ((!e->pick_row && !(e->pick_row = engine_logits_alloc(e, V))) ||
        (p->sampling && !e->pick_scratch && !(e->pick_scratch = malloc(sizeof(float) * V)))) {
        snprintf(err, errlen, "out of host memory for a row of logits");
        return -1;
    }
    const int last = m - 1;
    int32_t next;
    if (e->ops->forward_chunk(e, s, tokens, m, &last, 1, e->pick_row, &next, err, errlen)) return -1;
    const uint32_t *allow = p->allow ? p->allow(p->allow_arg) : NULL;
    return pick_row(e->pick_row, (int)V, p, allow, e->pick_scratch, c);
}

int engine_last_logits(struct engine *e, float *out, char *err, size_t errlen) {
    if (e->ops->last_logits) return e->ops->last_logits(e, out, err, errlen) ? ENGINE_ERROR : ENGINE_OK;
    if (!e->pick_row) {
        snprintf(err, errlen, "no forward has made a choice yet");
        return ENGINE_ERROR;
    }
    memcpy(out, e->pick_row, sizeof(float) * (size_t)e->model.g.vocab);
    return ENGINE_OK;
}

// n more tokens fit in s: 0, or -1 with the message.
static int check_room(const struct seq *s, int n, char *err, size_t errlen) {
    if (n <= s->cap - s->pos) return 0;
    snprintf(err, errlen, "sequence would hold %lld tokens, more than its capacity of %d", (long long)s->pos + n,
             s->cap);
    return -1;
}

// The chunk a forward of n tokens runs in: the caller's (0: QWEN_PREFILL_CHUNK); but where that is
// one chunk, the backend says n tokens run faster as its short forwards, and no row but the last is
// wanted (short forwards give only theirs), those.
static int chunk_for(const struct engine *e, const struct seq *s, const struct forward_opts *o, int n) {
    const int chunk = o->chunk > 0 ? o->chunk : QWEN_PREFILL_CHUNK;
    const bool last_only = !o->n_logit_rows || (o->n_logit_rows == 1 && o->logit_rows[0] == n - 1);
    if (n > chunk || !last_only || !e->ops->short_split) return chunk;
    const int piece = engine_verify_max(e); // (a decode step or a short forward is one piece: asks nothing more)
    return piece >= 2 && n > piece && n <= e->ops->short_split(e, s->pos) ? piece : chunk;
}

int engine_forward(struct engine *e, struct seq *s, const int32_t *tokens, int n, const struct forward_opts *o,
                   int32_t *next, char *err, size_t errlen) {
    static const struct forward_opts none = {0};
    if (!o) o = &none;
    if (n < 1) {
        snprintf(err, errlen, "no tokens to process");
        return ENGINE_ERROR;
    }
    if (s->verified) {
        snprintf(err, errlen, "the verification is not settled (engine_verify_keep)");
        return ENGINE_ERROR;
    }
    if (check_room(s, n, err, errlen)) return ENGINE_ERROR;
    if (check_tokens(e, tokens, n, err, errlen)) return ENGINE_ERROR;
    for (int i = 1; i < o->n_logit_rows; i++)
        if (o->logit_rows[i] <= o->logit_rows[i - 1]) {
            snprintf(err, errlen, "logit rows must be ascending");
            return ENGINE_ERROR;
        }
    if (o->n_logit_rows && (o->logit_rows[0] < 0 || o->logit_rows[o->n_logit_rows - 1] >= n)) {
        snprintf(err, errlen, "logit rows must lie within the %d tokens", n);
        return ENGINE_ERROR;
    }
    if (o->pick && (o->n_logit_rows || !o->choice || o->pick->n_top > ENGINE_MAX_TOP)) {
        snprintf(err, errlen, "a choice needs its output, no logit rows, and at most %d alternatives", ENGINE_MAX_TOP);
        return ENGINE_ERROR;
    }
    const int chunk = chunk_for(e, s, o, n);
    int r = 0; // next wanted row
    for (int off = 0; off < n; off += chunk) {
        if (off && o->cancelled && o->cancelled(o->cancel_arg)) return ENGINE_CANCELLED;
        int m = n - off < chunk ? n - off : chunk;
        int rows[m], nr = 0;
        float *lg = o->logits ? o->logits + (size_t)r * e->model.g.vocab : NULL;
        while (r + nr < o->n_logit_rows && o->logit_rows[r + nr] < off + m) {
            rows[nr] = o->logit_rows[r + nr] - off;
            nr++;
        }
        if (o->pick && off + m == n) {
            if (forward_pick(e, s, tokens + off, m, o->pick, o->choice, err, errlen)) return ENGINE_ERROR;
            *next = o->choice->greedy;
        } else if (e->ops->forward_chunk(e, s, tokens + off, m, rows, nr, lg, next, err, errlen)) {
            return ENGINE_ERROR;
        }
        r += nr;
        s->pos += m;
        if (o->progress) o->progress(o->progress_arg, off + m, n);
    }
    return ENGINE_OK;
}

int engine_verify_max(const struct engine *e) {
    return e->ops->verify_max ? e->ops->verify_max(e) : 0;
}

float engine_verify_gate(const struct engine *e) {
    return e->ops->verify_gate ? e->ops->verify_gate(e) : 0;
}

int engine_verify(struct engine *e, struct seq *s, const int32_t *tokens, int n, int32_t *all_next, char *err,
                  size_t errlen) {
    const int max = engine_verify_max(e);
    if (s->verified) {
        snprintf(err, errlen, "the previous verification is not settled (engine_verify_keep)");
        return ENGINE_ERROR;
    }
    if (n < 2 || n > max) {
        snprintf(err, errlen, "a verification takes 2 to %d tokens, not %d", max, n);
        return ENGINE_ERROR;
    }
    if (check_room(s, n, err, errlen)) return ENGINE_ERROR;
    if (check_tokens(e, tokens, n, err, errlen)) return ENGINE_ERROR;
    if (e->ops->verify(e, s, tokens, n, all_next, err, errlen)) return ENGINE_ERROR;
    s->pos += n;
    s->verified = n;
    return ENGINE_OK;
}

int engine_verify_keep(struct engine *e, struct seq *s, int keep, char *err, size_t errlen) {
    const int n = s->verified;
    if (!n) {
        snprintf(err, errlen, "no verification to settle");
        return ENGINE_ERROR;
    }
    if (keep < 1 || keep > n) {
        snprintf(err, errlen, "a verification of %d tokens keeps 1 to %d of them, not %d", n, n, keep);
        return ENGINE_ERROR;
    }
    if (keep < n && e->ops->verify_keep(e, s, n, keep, err, errlen)) return ENGINE_ERROR;
    s->pos -= n - keep;
    s->verified = 0;
    return ENGINE_OK;
}

int engine_embed(struct engine *e, const int32_t *tokens, int n, float *out, char *err, size_t errlen) {
    if (!e->ops->embed) {
        snprintf(err, errlen, "the %s backend has no embedding probe", e->ops->name);
        return ENGINE_ERROR;
    }
    if (n < 1) {
        snprintf(err, errlen, "no tokens to embed");
        return ENGINE_ERROR;
    }
    if (check_tokens(e, tokens, n, err, errlen)) return ENGINE_ERROR;
    return e->ops->embed(e, tokens, n, out, err, errlen) ? ENGINE_ERROR : ENGINE_OK;
}

int engine_layer_probe(struct engine *e, struct seq *s, int layer, const float *x_in, int n, float *x_out,
                       float *router_logits, char *err, size_t errlen) {
    if (!e->ops->layer_probe) {
        snprintf(err, errlen, "the %s backend has no layer probe", e->ops->name);
        return ENGINE_ERROR;
    }
    if (layer < 0 || layer >= e->model.g.n_layers) {
        snprintf(err, errlen, "layer %d does not exist (0..%d)", layer, e->model.g.n_layers - 1);
        return ENGINE_ERROR;
    }
    if (n < 1 || n > QWEN_PREFILL_CHUNK) {
        snprintf(err, errlen, "a layer probe takes 1 to %d rows, not %d", QWEN_PREFILL_CHUNK, n);
        return ENGINE_ERROR;
    }
    if (check_room(s, n, err, errlen)) return ENGINE_ERROR;
    return e->ops->layer_probe(e, s, layer, x_in, n, x_out, router_logits, err, errlen) ? ENGINE_ERROR : ENGINE_OK;
}

float *engine_logits_alloc(struct engine *e, size_t n) {
    return e->ops->host_alloc ? e->ops->host_alloc(sizeof(float) * n) : malloc(sizeof(float) * n);
}

void engine_logits_free(struct engine *e, float *p) {
    if (!p) return;
    if (e->ops->host_alloc)
        e->ops->host_free(p);
    else
        free(p);
}
