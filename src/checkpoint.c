// checkpoint.c: config.json + index + shard validation and weight binding (docs/MODEL.md §1, §5).
#include "checkpoint.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        snprintf(err, errlen, __VA_ARGS__);                                                                            \
        goto fail;                                                                                                     \
    } while (0)

char *read_small_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 1 << 16;
            if (cap > (64u << 20)) {
                snprintf(err, errlen, "%s: larger than 64 MiB", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            char *nb = realloc(buf, cap + 1);
            if (!nb) break;
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        if (!r) break;
        n += r;
    }
    fclose(f);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

// ---- config.json -----------------------------------------------------------------------------

static int expect_int(json_t *obj, const char *where, const char *key, long long want, bool required, char *err,
                      size_t errlen) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (!required) return 0;
        FAIL("config.json: %s.%s is missing (expected %lld)", where, key, want);
    }
    if (!json_is_integer(v)) FAIL("config.json: %s.%s: expected the integer %lld", where, key, want);
    if (json_integer_value(v) != want)
        FAIL("config.json: %s.%s: expected %lld, got %lld", where, key, want, (long long)json_integer_value(v));
    return 0;
fail:
    return -1;
}

static int expect_num(json_t *v, const char *where, const char *key, double want, char *err, size_t errlen) {
    if (!json_is_number(v)) FAIL("config.json: %s.%s: expected the number %g", where, key, want);
    double got = json_number_value(v);
    if (got != want && !(want != 0 && got / want > 1 - 1e-9 && got / want < 1 + 1e-9))
        FAIL("config.json: %s.%s: expected %g, got %g", where, key, want, got);
    return 0;
fail:
    return -1;
}

static int expect_bool(json_t *obj, const char *where, const char *key, bool want, char *err, size_t errlen) {
    json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v) || json_boolean_value(v) != want)
        FAIL("config.json: %s.%s: expected %s", where, key, want ? "true" : "false");
    return 0;
fail:
    return -1;
}

static int expect_str(json_t *obj, const char *where, const char *key, const char *want, bool required, char *err,
                      size_t errlen) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (!required) return 0;
        FAIL("config.json: %s.%s is missing (expected \"%s\")", where, key, want);
    }
    if (!json_is_string(v)) FAIL("config.json: %s.%s: expected the string \"%s\"", where, key, want);
    if (strcmp(json_string_value(v), want))
        FAIL("config.json: %s.%s: expected \"%s\", got \"%s\"", where, key, want, json_string_value(v));
    return 0;
fail:
    return -1;
}

// Module paths that carry no text weights: the vision tower and the MTP head.
static bool ignored_key(const char *k) {
    static const char *const prefixes[] = {"vision_tower.",    "model.visual.",          "mtp.",
                                           CKPT_PREFIX "mtp.", CKPT_PREFIX "model.mtp.", "model.mtp."};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (!strncmp(k, prefixes[i], strlen(prefixes[i]))) return true;
    return false;
}

static int check_text_config(json_t *tc, const struct geometry *g, char *err, size_t errlen) {
    const char *w = "text_config";
    if (expect_str(tc, w, "model_type", "qwen3_5_moe_text", false, err, errlen)) return -1;
    struct geometry_config_int ints[GEOMETRY_CONFIG_INTS];
    geometry_config_ints(g, ints);
    for (int i = 0; i < GEOMETRY_CONFIG_INTS; i++)
        if (expect_int(tc, w, ints[i].key, ints[i].v, true, err, errlen)) return -1;
    if (expect_int(tc, w, "full_attention_interval", g->attn_interval, false, err, errlen)) return -1;
    if (expect_int(tc, w, "decoder_sparse_step", 1, false, err, errlen)) return -1;
    json_t *eps = json_object_get(tc, "rms_norm_eps");
    if (!eps) FAIL("config.json: text_config.rms_norm_eps is missing (expected %g)", g->rms_eps);
    if (expect_num(eps, w, "rms_norm_eps", g->rms_eps, err, errlen)) return -1;
    if (expect_str(tc, w, "hidden_act", "silu", false, err, errlen)) return -1;
    if (expect_bool(tc, w, "attn_output_gate", true, err, errlen)) return -1;
    if (expect_bool(tc, w, "attention_bias", false, err, errlen)) return -1;
    if (expect_bool(tc, w, "tie_word_embeddings", false, err, errlen)) return -1;
    if (expect_bool(tc, w, "norm_topk_prob", true, err, errlen)) return -1;

    // RoPE: theta 1e7 and a quarter of head_dim rotated; newer configs nest it in rope_parameters.
    json_t *rp = json_object_get(tc, "rope_parameters");
    if (rp && !json_is_object(rp)) FAIL("config.json: text_config.rope_parameters is not an object");
    json_t *theta = rp ? json_object_get(rp, "rope_theta") : NULL;
    if (!theta) theta = json_object_get(tc, "rope_theta");
    if (!theta) FAIL("config.json: text_config.rope_parameters.rope_theta is missing (expected %g)", g->rope_theta);
    if (expect_num(theta, "text_config.rope_parameters", "rope_theta", g->rope_theta, err, errlen)) return -1;
    json_t *prf = rp ? json_object_get(rp, "partial_rotary_factor") : NULL;
    if (!prf) prf = json_object_get(tc, "partial_rotary_factor");
    if (!prf) FAIL("config.json: text_config.partial_rotary_factor is missing (expected 0.25)");
    if (expect_num(prf, "text_config", "partial_rotary_factor", (double)g->rope_dim / g->head_dim, err, errlen))
        return -1;
    if (rp && expect_str(rp, "text_config.rope_parameters", "rope_type", "default", false, err, errlen)) return -1;

    json_t *lt = json_object_get(tc, "layer_types");
    if (lt) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)g->n_layers)
            FAIL("config.json: text_config.layer_types: expected an array of %d entries", g->n_layers);
        for (int i = 0; i < g->n_layers; i++) {
            const char *want = geom_is_attn(g, i) ? "full_attention" : "linear_attention";
            json_t *x = json_array_get(lt, (size_t)i);
            if (!json_is_string(x) || strcmp(json_string_value(x), want))
                FAIL("config.json: text_config.layer_types[%d]: expected \"%s\", got %s%s%s", i, want,
                     json_is_string(x) ? "\"" : "", json_is_string(x) ? json_string_value(x) : "a non-string",
                     json_is_string(x) ? "\"" : "");
        }
    }
    json_t *mlp_only = json_object_get(tc, "mlp_only_layers");
    if (mlp_only && (!json_is_array(mlp_only) || json_array_size(mlp_only)))
        FAIL("config.json: text_config.mlp_only_layers: expected [] (every layer is MoE)");
    return 0;
fail:
    return -1;
}

// The geometry the config asks for: the real one, or a test geometry it names explicitly.
static int config_geometry(json_t *root, const struct geometry **g, char *err, size_t errlen) {
    if (expect_str(root, "(top level)", "model_type", "qwen3_5_moe", true, err, errlen)) return -1;
    json_t *tc = json_object_get(root, "text_config");
    if (!json_is_object(tc)) FAIL("config.json: text_config is missing or not an object");
    json_t *mark = json_object_get(tc, "calla_test_geometry");
    if (!mark) {
        *g = geometry_real();
        return 0;
    }
    if (!json_is_string(mark)) FAIL("config.json: text_config.calla_test_geometry must be a string");
    *g = geometry_find(json_string_value(mark));
    if (!*g || !(*g)->is_test) {
        FAIL("config.json: text_config.calla_test_geometry: \"%s\" is not a test geometry (known: tiny, small)",
             json_string_value(mark));
    }
    return 0;
fail:
    return -1;
}

static int quant_bits_for(json_t *quant, const char *module, int def_bits, int *bits, char *err, size_t errlen) {
    json_t *o = json_object_get(quant, module);
    *bits = def_bits;
    if (!o) return 0;
    if (!json_is_object(o)) FAIL("config.json: quantization.%s: expected {\"group_size\": 64, \"bits\": N}", module);
    if (expect_int(o, "quantization", "group_size", QWEN_GROUP, true, err, errlen)) return -1;
    json_t *b = json_object_get(o, "bits");
    if (!json_is_integer(b)) FAIL("config.json: quantization.%s.bits is missing or not an integer", module);
    *bits = (int)json_integer_value(b);
    if (expect_str(o, "quantization", "mode", "affine", false, err, errlen)) return -1;
    return 0;
fail:
    return -1;
}

// Checks the quantization block: default 4-bit affine group 64; overrides only for modules that
// exist, and the bits each module is expected to have (8 for the router and shared-expert gate).
static int check_quantization(json_t *root, const struct tensor_spec *specs, int n, char *err, size_t errlen) {
    json_t *q = json_object_get(root, "quantization");
    if (!q) q = json_object_get(root, "quantization_config");
    if (!json_is_object(q)) FAIL("config.json: quantization is missing or not an object (expected MLX 4-bit affine)");
    if (expect_int(q, "quantization", "group_size", QWEN_GROUP, true, err, errlen)) return -1;
    if (expect_int(q, "quantization", "bits", 4, true, err, errlen)) return -1;
    if (expect_str(q, "quantization", "mode", "affine", false, err, errlen)) return -1;
    char module[160];
    for (int i = 0; i < n; i++) {
        if (specs[i].role != ROLE_QUANT) continue;
        snprintf(module, sizeof module, CKPT_PREFIX "%s", specs[i].name);
        int bits;
        if (quant_bits_for(q, module, 4, &bits, err, errlen)) return -1;
        if (bits != specs[i].bits)
            FAIL("config.json: quantization for %s: expected %d bits, got %d", module, specs[i].bits, bits);
    }
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v) {
        if (!strcmp(key, "group_size") || !strcmp(key, "bits") || !strcmp(key, "mode") || ignored_key(key)) continue;
        bool known = false;
        if (!strncmp(key, CKPT_PREFIX, strlen(CKPT_PREFIX)))
            for (int i = 0; i < n && !known; i++)
                known = specs[i].role == ROLE_QUANT && !strcmp(key + strlen(CKPT_PREFIX), specs[i].name);
        if (!known) FAIL("config.json: quantization.%s: override for a module the model does not have", key);
    }
    return 0;
fail:
    return -1;
}

int checkpoint_parse_config(const char *text, size_t len, struct geometry *out, char *err, size_t errlen) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    struct tensor_spec *specs = NULL;
    if (!root) FAIL("config.json: invalid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    if (!json_is_object(root)) FAIL("config.json: top level is not an object");
    const struct geometry *g;
    if (config_geometry(root, &g, err, errlen)) goto fail;
    if (check_text_config(json_object_get(root, "text_config"), g, err, errlen)) goto fail;
    int n = model_tensor_spec_count(g);
    specs = malloc(sizeof *specs * (size_t)n);
    if (!specs) FAIL("out of memory");
    model_tensor_specs(g, NULL, specs, n);
    if (check_quantization(root, specs, n, err, errlen)) goto fail;
    *out = *g;
    free(specs);
    json_decref(root);
    return 0;
fail:
    free(specs);
    json_decref(root);
    return -1;
}

// ---- tensors -----------------------------------------------------------------------------------

// Open-addressing map from stored tensor name to (shard, tensor).
struct name_map {
    size_t cap;
    const struct st_tensor **slot;
    int *shard;
};

static uint64_t str_hash(const char *s) {
    return fnv1a64(FNV1A64_INIT, s, strlen(s));
}

static const struct st_tensor *map_get(const struct name_map *m, const char *name, int *shard) {
    for (size_t i = str_hash(name) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->slot[i]) return NULL;
        if (!strcmp(m->slot[i]->name, name)) {
            if (shard) *shard = m->shard[i];
            return m->slot[i];
        }
    }
}

static bool map_put(struct name_map *m, const struct st_tensor *t, int shard) {
    for (size_t i = str_hash(t->name) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->slot[i]) {
            m->slot[i] = t;
            m->shard[i] = shard;
            return true;
        }
        if (!strcmp(m->slot[i]->name, t->name)) return false;
    }
}

static void *own(struct model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int nc = m->cap_owned ? m->cap_owned * 2 : 256;
        void **no = realloc(m->owned, sizeof *no * (size_t)nc);
        if (!no) return NULL;
        m->owned = no;
        m->cap_owned = nc;
    }
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) return NULL;
    m->owned[m->n_owned++] = p;
    m->owned_bytes += (int64_t)bytes;
    return p;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *d) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int check_shape(const struct st_tensor *t, int ndim, const int64_t *want, const char *extra, char *err,
                       size_t errlen) {
    bool ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == want[d];
    if (ok) return 0;
    char a[96], b[96];
    shape_str(a, sizeof a, ndim, want);
    shape_str(b, sizeof b, t->ndim, t->shape);
    snprintf(err, errlen, "tensor %s: expected shape %s%s, got %s", t->name, a, extra, b);
    return -1;
}

static int bind_quant(struct model *m, const struct name_map *map, const struct tensor_spec *s, char *err,
                      size_t errlen) {
    char name[3][160];
    const struct st_tensor *t[3];
    static const char *const suffix[3] = {"weight", "scales", "biases"};
    for (int k = 0; k < 3; k++) {
        snprintf(name[k], sizeof name[k], CKPT_PREFIX "%s.%s", s->name, suffix[k]);
        t[k] = map_get(map, name[k], NULL);
        if (!t[k]) FAIL("tensor %s is missing", name[k]);
    }
    if (t[0]->dtype != ST_U32)
        FAIL("tensor %s: expected dtype U32 (packed), got %s", name[0], st_dtype_name(t[0]->dtype));
    for (int k = 1; k < 3; k++)
        if (t[k]->dtype != ST_BF16) FAIL("tensor %s: expected dtype BF16, got %s", name[k], st_dtype_name(t[k]->dtype));
    // Bits from the shapes (docs/MODEL.md §5.2): K = scales[-1] * 64, bits = weight[-1] * 32 / K.
    int nd = s->ndim;
    int64_t rows = s->dims[nd - 2], cols = s->dims[nd - 1];
    if (t[1]->ndim == nd && t[0]->ndim == nd && t[1]->shape[nd - 1] > 0) {
        int64_t k_in = t[1]->shape[nd - 1] * QWEN_GROUP;
        int64_t got_bits = t[0]->shape[nd - 1] * 32 / k_in;
        if (k_in == cols && got_bits != s->bits && t[0]->shape[nd - 1] * 32 % k_in == 0)
            FAIL("tensor %s: shape [.., %lld] packs %lld bits per weight for %lld inputs; expected %d bits", name[0],
                 (long long)t[0]->shape[nd - 1], (long long)got_bits, (long long)k_in, s->bits);
    }
    int64_t wd[3], sd[3];
    for (int d = 0; d < nd; d++) wd[d] = sd[d] = s->dims[d];
    wd[nd - 1] = cols * s->bits / 32;
    sd[nd - 1] = cols / QWEN_GROUP;
    char extra[48];
    snprintf(extra, sizeof extra, " (%d-bit, group %d)", s->bits, QWEN_GROUP);
    if (check_shape(t[0], nd, wd, extra, err, errlen)) return -1;
    if (check_shape(t[1], nd, sd, "", err, errlen)) return -1;
    if (check_shape(t[2], nd, sd, "", err, errlen)) return -1;

    struct qtensor *q = s->qdst;
    q->n_mat = nd == 3 ? (int)s->dims[0] : 1;
    q->rows = (int)rows;
    q->cols = (int)cols;
    q->bits = s->bits;
    // Bound in place whatever the alignment (MLX does not pad its header): the backends read
    // through qt_load_* (CPU) or copy to the device from here (CUDA); nothing is copied on the host.
    for (int k = 0; k < 3; k++) {
        m->n_unaligned += (uintptr_t)t[k]->data % (k == 0 ? 4 : 2) != 0;
        m->file_bytes += (int64_t)(t[k]->end - t[k]->begin);
    }
    q->w = t[0]->data;
    q->scales = t[1]->data;
    q->biases = t[2]->data;
    m->n_text_tensors += 3;
    return 0;
fail:
    return -1;
}

static int bind_plain(struct model *m, const struct name_map *map, const struct tensor_spec *s, char *err,
                      size_t errlen) {
    char name[160];
    snprintf(name, sizeof name, CKPT_PREFIX "%s", s->name);
    const struct st_tensor *t = map_get(map, name, NULL);
    if (!t) FAIL("tensor %s is missing", name);
    if (t->dtype != ST_BF16 && t->dtype != ST_F32)
        FAIL("tensor %s: expected dtype BF16 or F32, got %s", name, st_dtype_name(t->dtype));
    if (check_shape(t, s->ndim, s->dims, "", err, errlen)) return -1;
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->dims[d];
    float *f = own(m, (size_t)n * sizeof(float));
    if (!f) FAIL("out of memory loading %s", name);
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == ST_F32) {
            memcpy(&f[i], t->data + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            f[i] = bf16_to_f32(h);
        }
    }
    *s->fdst = f;
    m->file_bytes += (int64_t)(t->end - t->begin);
    m->n_text_tensors++;
    return 0;
fail:
    return -1;
}

// Shard file names from the index (or the single model.safetensors).
static int open_shards(struct model *m, json_t **index_out, char *err, size_t errlen) {
    char path[4096];
    json_t *index = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", m->dir);
    size_t len;
    char ierr[512];
    char *text = read_small_file(path, &len, ierr, sizeof ierr);
    if (!text) {
        snprintf(path, sizeof path, "%s/model.safetensors", m->dir);
        m->shards = calloc(1, sizeof *m->shards);
        if (!m->shards) FAIL("out of memory");
        if (st_open(path, &m->shards[0], err, errlen)) {
            char e2[600];
            snprintf(e2, sizeof e2, "%s (and no model.safetensors.index.json: %s)", err, ierr);
            snprintf(err, errlen, "%s", e2);
            goto fail;
        }
        m->n_shards = 1;
        *index_out = NULL;
        return 0;
    }
    m->identity = fnv1a64(m->identity, text, len);
    json_error_t je;
    index = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!index) FAIL("model.safetensors.index.json: invalid JSON: %s (line %d)", je.text, je.line);
    json_t *wm = json_object_get(index, "weight_map");
    if (!json_is_object(wm)) FAIL("model.safetensors.index.json: weight_map is missing or not an object");
    // Distinct shard names, in first-seen order.
    const char *key;
    json_t *v;
    const char **names = calloc(json_object_size(wm) + 1, sizeof *names);
    if (!names) FAIL("out of memory");
    int nn = 0;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v)) {
            free(names);
            FAIL("model.safetensors.index.json: weight_map.%s is not a file name", key);
        }
        const char *f = json_string_value(v);
        if (strchr(f, '/') || !strcmp(f, "..") || !*f) {
            free(names);
            FAIL("model.safetensors.index.json: weight_map.%s: \"%s\" is not a plain file name", key, f);
        }
        bool seen = false;
        for (int i = 0; i < nn && !seen; i++) seen = !strcmp(names[i], f);
        if (!seen) names[nn++] = f;
    }
    m->shards = calloc((size_t)(nn ? nn : 1), sizeof *m->shards);
    if (!m->shards) {
        free(names);
        FAIL("out of memory");
    }
    for (int i = 0; i < nn; i++) {
        snprintf(path, sizeof path, "%s/%s", m->dir, names[i]);
        if (st_open(path, &m->shards[i], err, errlen)) {
            free(names);
            goto fail;
        }
        m->n_shards++;
    }
    free(names);
    *index_out = index;
    return 0;
fail:
    json_decref(index);
    return -1;
}

int checkpoint_open(const char *dir, struct model *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    struct tensor_spec *specs = NULL;
    struct name_map map = {0};
    json_t *index = NULL;
    char path[4096];
    m->dir = strdup(dir);
    m->identity = FNV1A64_INIT;
    if (!m->dir) FAIL("out of memory");

    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *cfg = read_small_file(path, &len, err, errlen);
    if (!cfg) goto fail;
    m->identity = fnv1a64(m->identity, cfg, len);
    int rc = checkpoint_parse_config(cfg, len, &m->g, err, errlen);
    free(cfg);
    if (rc) goto fail;
    m->state = model_state_sizes(&m->g);

    if (open_shards(m, &index, err, errlen)) goto fail;

    // Every stored tensor by name; duplicates across shards are refused.
    size_t total = 0;
    for (int i = 0; i < m->n_shards; i++) total += (size_t)m->shards[i].n;
    map.cap = 16;
    while (map.cap < 2 * total + 16) map.cap *= 2;
    map.slot = calloc(map.cap, sizeof *map.slot);
    map.shard = calloc(map.cap, sizeof *map.shard);
    if (!map.slot || !map.shard) FAIL("out of memory");
    for (int i = 0; i < m->n_shards; i++)
        for (int j = 0; j < m->shards[i].n; j++)
            if (!map_put(&map, &m->shards[i].t[j], i))
                FAIL("tensor %s is stored twice (second copy in %s)", m->shards[i].t[j].name, m->shards[i].path);

    // The index and the shards must agree.
    if (index) {
        json_t *wm = json_object_get(index, "weight_map");
        const char *key;
        json_t *v;
        json_object_foreach(wm, key, v) {
            int sh;
            const struct st_tensor *t = map_get(&map, key, &sh);
            if (!t)
                FAIL("model.safetensors.index.json: tensor %s is listed in %s but not stored there", key,
                     json_string_value(v));
            const char *base = strrchr(m->shards[sh].path, '/');
            if (strcmp(base ? base + 1 : m->shards[sh].path, json_string_value(v)))
                FAIL("model.safetensors.index.json: tensor %s is listed in %s but stored in %s", key,
                     json_string_value(v), m->shards[sh].path);
        }
        for (size_t i = 0; i < map.cap; i++)
            if (map.slot[i] && !json_object_get(wm, map.slot[i]->name))
                FAIL("tensor %s is stored in %s but missing from model.safetensors.index.json", map.slot[i]->name,
                     m->shards[map.shard[i]].path);
    }

    int n = model_tensor_spec_count(&m->g);
    specs = malloc(sizeof *specs * (size_t)n);
    if (!specs) FAIL("out of memory");
    model_tensor_specs(&m->g, &m->w, specs, n);
    for (int i = 0; i < n; i++) {
        int r = specs[i].role == ROLE_QUANT ? bind_quant(m, &map, &specs[i], err, errlen)
                                            : bind_plain(m, &map, &specs[i], err, errlen);
        if (r) goto fail;
    }
    // Anything stored that is neither expected nor ignorable is refused by name.
    for (size_t i = 0; i < map.cap; i++) {
        const struct st_tensor *t = map.slot[i];
        if (!t) continue;
        if (ignored_key(t->name)) {
            m->n_ignored++;
            continue;
        }
        bool expected = false;
        const char *nm = t->name;
        if (!strncmp(nm, CKPT_PREFIX, strlen(CKPT_PREFIX))) {
            nm += strlen(CKPT_PREFIX);
            for (int k = 0; k < n && !expected; k++) {
                size_t l = strlen(specs[k].name);
                if (specs[k].role == ROLE_QUANT)
                    expected = !strncmp(nm, specs[k].name, l) &&
                               (!strcmp(nm + l, ".weight") || !strcmp(nm + l, ".scales") || !strcmp(nm + l, ".biases"));
                else
                    expected = !strcmp(nm, specs[k].name);
            }
        }
        if (!expected)
            FAIL("tensor %s (in %s) is not part of the %s text model", t->name, m->shards[map.shard[i]].path,
                 m->g.name);
    }
    free(specs);
    free(map.slot);
    free(map.shard);
    json_decref(index);
    return 0;
fail:
    free(specs);
    free(map.slot);
    free(map.shard);
    json_decref(index);
    checkpoint_close(m);
    return -1;
}

void checkpoint_close(struct model *m) {
    for (int i = 0; i < m->n_shards; i++) st_close(&m->shards[i]);
    free(m->shards);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->dir);
    memset(m, 0, sizeof *m);
}

void checkpoint_release(const struct model *m, const void *p, size_t bytes) {
    const uint8_t *a = p;
    for (int i = 0; i < m->n_shards; i++) {
        const uint8_t *lo = m->shards[i].map, *hi = lo + m->shards[i].size;
        if (!lo || a < lo || a + bytes > hi) continue;
        const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t b = ((uintptr_t)a + page - 1) & ~(page - 1), e = ((uintptr_t)a + bytes) & ~(page - 1);
        if (e > b) madvise((void *)b, e - b, MADV_DONTNEED); // advisory: a failure changes nothing
        return;
    }
}
