// synth.c: `calla synth` writes a random-weight checkpoint in the exact MLX layout.
//
// Layout written (as mlx-lm writes it): config.json with the quantization block (4-bit affine,
// group 64, 8-bit overrides for every mlp.gate and mlp.shared_expert_gate) duplicated as
// quantization_config; model-0000k-of-0000N.safetensors shards cut before they pass the shard
// limit (5 GiB), metadata {"format": "mlx"}; model.safetensors.index.json; generation_config.json;
// tokenizer.json + tokenizer_config.json (synth_write_tokenizer says which vocabulary);
// calla_synth.json {geometry, seed, profile}: which generator wrote it (the loader never reads it,
// so validation is the same for synthetic and real checkpoints).
// Inside a shard U32 tensors come first, then F32, then BF16. The header is not padded, as MLX's
// writer leaves it, so tensor data starts at arbitrary byte offsets; where the data section would
// by chance start on an even offset, one space is added to the JSON so that it starts on an odd
// one, and every U32 and BF16 tensor is misaligned (the loader's unaligned path is what every test
// and benchmark exercises, as with real MLX files). synth_options.aligned (`calla synth --aligned`)
// pads the header to 8 bytes instead: every tensor naturally aligned.
//
// Values: every byte comes from synth_rand(key, i) (synth.h), keyed by the seed and the tensor
// name, so output is byte-identical for a seed on any machine and with any thread count.
//   packed codes    uniform random words (every 4/8-bit code equally likely)
//   scales          base * (0.5 + u), base chosen so the weights have std ~ gain / sqrt(cols)
//   biases          -scale * (2^bits - 1) / 2 + scale * (u - 0.5): centred, with a small offset
//   norms           1 + 0.8 (u - 0.5) (the +1 is stored folded in, as in MLX files)
//   conv1d          1.2 (u - 0.5);  A_log  log(A), A log-uniform in [0.02, 1.5] (F32);
//   dt_bias         2u - 1.5
// Profiles (synth.h) change only gains of quantized matrices: the router's, the embedding's and
// those of the projections that write into the residual stream.
#include "synth.h"

#include "checkpoint.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

struct stored {
    char name[160];
    enum st_dtype dtype;
    int ndim;
    int64_t shape[3];
    int64_t nbytes;
    const struct tensor_spec *spec;
    int part; // 0 weight, 1 scales, 2 biases; -1 plain
    int shard;
    uint64_t offset; // within the shard's data section
    uint64_t key;
    float gain; // ROLE_QUANT: the spec's gain, or the profile's (synth_gain)
};

struct shard {
    char file[64];
    int fd;
    uint64_t data_start, data_len;
};

struct job {
    struct stored *t;
    int n_t;
    struct shard *sh;
    int next; // next tensor chunk to take (under lock)
    int64_t next_off;
    pthread_mutex_t lock;
    int failed;
    char err[256];
};

enum { CHUNK = 8 << 20 };

static uint64_t name_key(uint64_t seed, const char *name) {
    return synth_mix64(synth_mix64(seed) ^ fnv1a64(FNV1A64_INIT, name, strlen(name)));
}

// One quantized matrix's scale for (row, group) index i; biases recompute it.
static float quant_scale(const struct stored *t, uint64_t i) {
    const struct tensor_spec *s = t->spec;
    double levels = (double)((1 << s->bits) - 1);
    double std_q = sqrt((levels + 1) * (levels + 1) - 1) / sqrt(12.0) * 1.0408;
    double base = t->gain / (sqrt((double)s->dims[s->ndim - 1]) * std_q);
    return bf16_to_f32(f32_to_bf16((float)(base * (0.5 + synth_unit(synth_rand(t->key ^ 1, i))))));
}

const char *synth_profile_name(enum synth_profile p) {
    return p == SYNTH_PROFILE_UNIFORM ? "uniform" : "trained";
}

int synth_profile_parse(const char *name, enum synth_profile *p) {
    if (!strcmp(name, "trained"))
        *p = SYNTH_PROFILE_TRAINED;
    else if (!strcmp(name, "uniform"))
        *p = SYNTH_PROFILE_UNIFORM;
    else
        return -1;
    return 0;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

int synth_profile_of(const char *dir, enum synth_profile *p, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/calla_synth.json", dir);
    *p = SYNTH_PROFILE_UNIFORM;
    if (access(path, F_OK)) return 0;
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    json_t *name = json_object_get(j, "profile");
    int rc = json_is_string(name) ? synth_profile_parse(json_string_value(name), p) : -1;
    if (rc) snprintf(err, errlen, "%s: no known \"profile\"", path);
    json_decref(j);
    return rc;
}

// The weight scale of a quantized module under a profile (synth.h says why).
static float synth_gain(enum synth_profile p, const struct geometry *g, const struct tensor_spec *s) {
    if (p == SYNTH_PROFILE_UNIFORM) return s->gain;
    if (ends_with(s->name, ".mlp.gate")) return SYNTH_ROUTER_GAIN_TRAINED;
    if (!strcmp(s->name, "model.embed_tokens")) return s->gain * sqrtf((float)g->hidden); // rows of rms ~1
    if (ends_with(s->name, ".self_attn.o_proj") || ends_with(s->name, ".linear_attn.out_proj") ||
        ends_with(s->name, ".mlp.switch_mlp.down_proj") || ends_with(s->name, ".mlp.shared_expert.down_proj"))
        return s->gain / sqrtf(2.0f * (float)g->n_layers); // 2 residual writes per layer
    return s->gain;
}

static float plain_value(const struct stored *t, uint64_t i) {
    float u = synth_unit(synth_rand(t->key, i));
    switch (t->spec->role) {
    case ROLE_NORM:
    case ROLE_GATED_NORM:
        return 1.0f + 0.8f * (u - 0.5f);
    case ROLE_CONV:
        return 1.2f * (u - 0.5f);
    case ROLE_A_LOG:
        return logf(0.02f) + u * (logf(1.5f) - logf(0.02f));
    case ROLE_DT_BIAS:
        return 2.0f * u - 1.5f;
    case ROLE_QUANT:
        break;
    }
    return 0;
}

// Fills buf with bytes [off, off+n) of tensor t (off and n are multiples of the element size).
static void fill(const struct stored *t, int64_t off, int64_t n, uint8_t *buf) {
    size_t es = st_dtype_size(t->dtype);
    uint64_t i0 = (uint64_t)off / es, cnt = (uint64_t)n / es;
    for (uint64_t k = 0; k < cnt; k++) {
        uint64_t i = i0 + k;
        if (t->part == 0) {
            uint32_t w = (uint32_t)(synth_rand(t->key, i) >> 32);
            memcpy(buf + 4 * k, &w, 4);
        } else if (t->part > 0) {
            float s = quant_scale(t, i);
            float v = s;
            if (t->part == 2) {
                float levels = (float)((1 << t->spec->bits) - 1);
                v = -s * levels * 0.5f + s * (synth_unit(synth_rand(t->key ^ 2, i)) - 0.5f);
            }
            uint16_t h = f32_to_bf16(v);
            memcpy(buf + 2 * k, &h, 2);
        } else if (t->dtype == ST_F32) {
            float v = plain_value(t, i);
            memcpy(buf + 4 * k, &v, 4);
        } else {
            uint16_t h = f32_to_bf16(plain_value(t, i));
            memcpy(buf + 2 * k, &h, 2);
        }
    }
}

static void *worker(void *arg) {
    struct job *j = arg;
    uint8_t *buf = malloc(CHUNK);
    if (!buf) {
        pthread_mutex_lock(&j->lock);
        j->failed = 1;
        snprintf(j->err, sizeof j->err, "out of memory");
        pthread_mutex_unlock(&j->lock);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&j->lock);
        if (j->failed || j->next >= j->n_t) {
            pthread_mutex_unlock(&j->lock);
            break;
        }
        struct stored *t = &j->t[j->next];
        int64_t off = j->next_off, n = t->nbytes - off < CHUNK ? t->nbytes - off : CHUNK;
        j->next_off += n;
        if (j->next_off >= t->nbytes) j->next++, j->next_off = 0;
        pthread_mutex_unlock(&j->lock);
        if (n <= 0) continue;
        fill(t, off, n, buf);
        const struct shard *sh = &j->sh[t->shard];
        int64_t done = 0;
        while (done < n) {
            ssize_t w =
                pwrite(sh->fd, buf + done, (size_t)(n - done), (off_t)(sh->data_start + t->offset + off + done));
            if (w <= 0) {
                pthread_mutex_lock(&j->lock);
                j->failed = 1;
                snprintf(j->err, sizeof j->err, "%s: write failed: %s", sh->file, strerror(errno));
                pthread_mutex_unlock(&j->lock);
                break;
            }
            done += w;
        }
    }
    free(buf);
    return NULL;
}

static int dtype_rank(enum st_dtype d) {
    return d == ST_U32 ? 0 : d == ST_F32 ? 1 : 2;
}

static json_t *make_config(const struct geometry *g, const struct tensor_spec *specs, int n) {
    json_t *tc = json_object();
    json_object_set_new(tc, "model_type", json_string("qwen3_5_moe_text"));
    if (g->is_test) json_object_set_new(tc, "calla_test_geometry", json_string(g->name));
    struct geometry_config_int ints[GEOMETRY_CONFIG_INTS];
    geometry_config_ints(g, ints);
    for (int i = 0; i < GEOMETRY_CONFIG_INTS; i++) json_object_set_new(tc, ints[i].key, json_integer(ints[i].v));
    const struct geometry_config_int more[] = {
        {"full_attention_interval", g->attn_interval},
        {"mtp_num_hidden_layers", 1},
        {"eos_token_id", TOKEN_ENDOFTEXT},
        {"bos_token_id", TOKEN_ENDOFTEXT},
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        json_object_set_new(tc, more[i].key, json_integer(more[i].v));
    json_object_set_new(tc, "rms_norm_eps", json_real(g->rms_eps));
    json_object_set_new(tc, "hidden_act", json_string("silu"));
    json_object_set_new(tc, "attn_output_gate", json_true());
    json_object_set_new(tc, "attention_bias", json_false());
    json_object_set_new(tc, "tie_word_embeddings", json_false());
    json_object_set_new(tc, "mamba_ssm_dtype", json_string("float32"));
    json_object_set_new(tc, "dtype", json_string("bfloat16"));
    json_object_set_new(tc, "router_aux_loss_coef", json_real(0.001));
    json_object_set_new(tc, "pad_token_id", json_null());
    json_t *lt = json_array();
    for (int i = 0; i < g->n_layers; i++)
        json_array_append_new(lt, json_string(geom_is_attn(g, i) ? "full_attention" : "linear_attention"));
    json_object_set_new(tc, "layer_types", lt);
    json_t *rp = json_object();
    json_object_set_new(rp, "rope_type", json_string("default"));
    json_object_set_new(rp, "rope_theta", json_real(g->rope_theta));
    json_object_set_new(rp, "partial_rotary_factor", json_real((double)g->rope_dim / g->head_dim));
    json_object_set_new(rp, "mrope_interleaved", json_true());
    json_object_set_new(rp, "mrope_section", json_pack("[iii]", 11, 11, 10));
    json_object_set_new(tc, "rope_parameters", rp);

    json_t *q = json_pack("{s:i, s:i, s:s}", "group_size", QWEN_GROUP, "bits", 4, "mode", "affine");
    char module[160];
    for (int i = 0; i < n; i++)
        if (specs[i].role == ROLE_QUANT && specs[i].bits != 4) {
            snprintf(module, sizeof module, CKPT_PREFIX "%s", specs[i].name);
            json_object_set_new(q, module, json_pack("{s:i, s:i}", "group_size", QWEN_GROUP, "bits", specs[i].bits));
        }
    json_t *root = json_object();
    json_object_set_new(root, "architectures", json_pack("[s]", "Qwen3_5MoeForConditionalGeneration"));
    json_object_set_new(root, "model_type", json_string("qwen3_5_moe"));
    json_object_set_new(root, "text_config", tc);
    json_object_set_new(root, "tie_word_embeddings", json_false());
    json_object_set_new(root, "image_token_id", json_integer(248056));
    json_object_set_new(root, "video_token_id", json_integer(248057));
    json_object_set_new(root, "quantization_config", json_deep_copy(q));
    json_object_set_new(root, "quantization", q);
    return root;
}

static int write_json(const char *dir, const char *name, json_t *j, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS)) {
        snprintf(err, errlen, "%s: cannot write", path);
        return -1;
    }
    return 0;
}

int synth_write(const struct synth_options *o, char *err, size_t errlen) {
    const struct geometry *g = o->g;
    int n_spec = model_tensor_spec_count(g);
    struct tensor_spec *specs = calloc((size_t)n_spec, sizeof *specs);
    struct stored *t = calloc((size_t)n_spec * 3, sizeof *t);
    struct shard *sh = NULL;
    json_t *cfg = NULL, *index = NULL;
    int n_t = 0, n_sh = 0, rc = -1;
    if (!specs || !t) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    model_tensor_specs(g, NULL, specs, n_spec);
    if (mkdir(o->out_dir, 0755) && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create: %s", o->out_dir, strerror(errno));
        goto out;
    }

    // Stored tensors in module order.
    for (int i = 0; i < n_spec; i++) {
        const struct tensor_spec *s = &specs[i];
        int parts = s->role == ROLE_QUANT ? 3 : 1;
        for (int p = 0; p < parts; p++) {
            struct stored *x = &t[n_t++];
            x->spec = s;
            x->ndim = s->ndim;
            memcpy(x->shape, s->dims, sizeof x->shape);
            if (s->role == ROLE_QUANT) {
                static const char *const sfx[3] = {"weight", "scales", "biases"};
                snprintf(x->name, sizeof x->name, CKPT_PREFIX "%s.%s", s->name, sfx[p]);
                x->part = p;
                x->dtype = p == 0 ? ST_U32 : ST_BF16;
                x->shape[s->ndim - 1] =
                    p == 0 ? s->dims[s->ndim - 1] * s->bits / 32 : s->dims[s->ndim - 1] / QWEN_GROUP;
            } else {
                snprintf(x->name, sizeof x->name, CKPT_PREFIX "%s", s->name);
                x->part = -1;
                x->dtype = s->role == ROLE_A_LOG ? ST_F32 : ST_BF16;
            }
            x->nbytes = (int64_t)st_dtype_size(x->dtype);
            for (int d = 0; d < x->ndim; d++) x->nbytes *= x->shape[d];
            x->key = name_key(o->seed, s->name); // the module name: scales and biases share it
            x->gain = synth_gain(o->profile, g, s);
        }
    }
    // Shards: cut before passing the limit.
    int64_t acc = 0;
    for (int i = 0; i < n_t; i++) {
        if (acc > 0 && acc + t[i].nbytes > o->max_shard_bytes) n_sh++, acc = 0;
        t[i].shard = n_sh;
        acc += t[i].nbytes;
    }
    n_sh++;
    sh = calloc((size_t)n_sh, sizeof *sh);
    if (!sh) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    for (int s = 0; s < n_sh; s++) sh[s].fd = -1;
    index = json_object();
    json_t *wm = json_object();
    int64_t total = 0;
    for (int s = 0; s < n_sh; s++) {
        snprintf(sh[s].file, sizeof sh[s].file, "model-%05d-of-%05d.safetensors", s + 1, n_sh);
        json_t *hdr = json_object();
        json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "mlx"));
        uint64_t off = 0;
        for (int rank = 0; rank < 3; rank++)
            for (int i = 0; i < n_t; i++) {
                if (t[i].shard != s || dtype_rank(t[i].dtype) != rank) continue;
                t[i].offset = off;
                json_t *shape = json_array();
                for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
                json_object_set_new(hdr, t[i].name,
                                    json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(t[i].dtype), "shape",
                                              shape, "data_offsets", (json_int_t)off,
                                              (json_int_t)(off + (uint64_t)t[i].nbytes)));
                json_object_set_new(wm, t[i].name, json_string(sh[s].file));
                off += (uint64_t)t[i].nbytes;
            }
        char *text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(hdr);
        size_t hl = strlen(text), padded = o->aligned ? (hl + 7) & ~(size_t)7 : hl + (hl % 2 == 0);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", o->out_dir, sh[s].file);
        sh[s].fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (sh[s].fd < 0) {
            free(text);
            snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
            goto out;
        }
        uint8_t len8[8];
        for (int b = 0; b < 8; b++) len8[b] = (uint8_t)((uint64_t)padded >> (8 * b));
        char *hbuf = malloc(8 + padded);
        memcpy(hbuf, len8, 8);
        memcpy(hbuf + 8, text, hl);
        memset(hbuf + 8 + hl, ' ', padded - hl);
        free(text);
        sh[s].data_start = 8 + padded;
        sh[s].data_len = off;
        ssize_t w = pwrite(sh[s].fd, hbuf, 8 + padded, 0);
        free(hbuf);
        if (w != (ssize_t)(8 + padded) || ftruncate(sh[s].fd, (off_t)(sh[s].data_start + off))) {
            snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
            goto out;
        }
        total += (int64_t)off;
    }
    struct model_size ms = model_size_of(g);
    json_object_set_new(
        index, "metadata",
        json_pack("{s:I, s:I}", "total_size", (json_int_t)total, "total_parameters", (json_int_t)ms.params));
    json_object_set_new(index, "weight_map", wm);

    // Tensor data, in parallel.
    struct job j = {.t = t, .n_t = n_t, .sh = sh};
    pthread_mutex_init(&j.lock, NULL);
    int nth = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nth < 1) nth = 1;
    if (nth > 64) nth = 64;
    pthread_t th[64];
    for (int i = 0; i < nth; i++) pthread_create(&th[i], NULL, worker, &j);
    for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.lock);
    if (j.failed) {
        snprintf(err, errlen, "%s", j.err);
        goto out;
    }

    cfg = make_config(g, specs, n_spec);
    if (write_json(o->out_dir, "config.json", cfg, err, errlen)) goto out;
    if (write_json(o->out_dir, "model.safetensors.index.json", index, err, errlen)) goto out;
    json_t *gen = json_pack("{s:[i,i], s:b}", "eos_token_id", TOKEN_IM_END, TOKEN_ENDOFTEXT, "do_sample", 0);
    int r = write_json(o->out_dir, "generation_config.json", gen, err, errlen);
    json_decref(gen);
    if (r) goto out;
    json_t *who = json_pack("{s:s, s:s, s:I, s:s}", "generator", "calla synth", "geometry", g->name, "seed",
                            (json_int_t)o->seed, "profile", synth_profile_name(o->profile));
    r = write_json(o->out_dir, "calla_synth.json", who, err, errlen);
    json_decref(who);
    if (r) goto out;
    if (synth_write_tokenizer(o->out_dir, err, errlen)) goto out;
    rc = 0;
out:
    for (int s = 0; sh && s < n_sh; s++)
        if (sh[s].fd >= 0 && close(sh[s].fd) && rc == 0) {
            snprintf(err, errlen, "%s: close failed: %s", sh[s].file, strerror(errno));
            rc = -1;
        }
    free(sh);
    free(t);
    free(specs);
    json_decref(cfg);
    json_decref(index);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// The tokenizer of a synthetic checkpoint
//
// The generated tokenizer.json has 448 model tokens (ids 0..447) and the 33 added tokens at
// their real ids 248044..248076, so the engine's stop ids and chat template work unchanged.
// Calla honours those ids; Hugging Face `tokenizers` ignores the ids of added tokens that are
// not in the model vocabulary and numbers them right after it, so HF would call <|im_end|> 450 (448 + 2)
// here.  Apart from that renumbering HF and this encoder agree on the whole golden corpus with
// this vocabulary too (checked while writing it).  The real vocabulary (contiguous 0..248043)
// has no such gap.

static const char *const added_names[TOKEN_ADDED_COUNT] = {
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
};

// The Qwen3.5 split regex (docs/MODEL.md §6), in tokenizer.json's (Oniguruma) form.
static const char qwen35_regex[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
                                   "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Words whose every prefix becomes a token (a merge chain per word), so the synthetic
// vocabulary has real multi-step merges.  A leading space is GPT-2's "Ġ".
static const char *const synth_words[] = {
    " the",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " lazy",
    " dog",
    "The",
    " a",
    " and",
    " of",
    " to",
    " in",
    " is",
    " that",
    " it",
    " for",
    " you",
    " with",
    " on",
    " as",
    " are",
    " this",
    " be",
    "Hello",
    " world",
    " Hello",
    ",",
    ".",
    "\n",
    "\n\n",
    "  ",
    "    ",
    "ing",
    "ed",
    "er",
    " what",
    " is",
    " your",
    " name",
    " model",
    " answer",
    " question",
    " think",
    " user",
    " assistant",
    " system",
    " antidisestablishmentarianism",
    " internationalization",
    "你好",
    "世界",
    " こんにちは",
};

static json_t *synthetic_tokenizer_json(void) {
    uint32_t b2u[256];
    tokenizer_bytelevel_map(b2u);
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    // Ids 0..255: bytes in the same order as the real vocabulary (printable bytes first).
    int32_t next = 0;
    char key[512];
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++)
            if ((b2u[b] == (uint32_t)b) == (pass == 0)) {
                key[utf8proc_encode_char((utf8proc_int32_t)b2u[b], (utf8proc_uint8_t *)key)] = 0;
                json_object_set_new(vocab, key, json_integer(next++));
            }
    for (size_t w = 0; w < sizeof synth_words / sizeof synth_words[0]; w++) {
        const unsigned char *s = (const unsigned char *)synth_words[w];
        char left[512] = "";
        size_t left_n = 0;
        for (size_t i = 0; s[i]; i++) {
            char ch[8];
            ch[utf8proc_encode_char((utf8proc_int32_t)b2u[s[i]], (utf8proc_uint8_t *)ch)] = 0;
            if (i > 0) {
                snprintf(key, sizeof key, "%s%s", left, ch);
                if (!json_object_get(vocab, key)) {
                    char m[520];
                    snprintf(m, sizeof m, "%s %s", left, ch);
                    json_array_append_new(merges, json_string(m));
                    json_object_set_new(vocab, key, json_integer(next++));
                }
            }
            left_n += (size_t)snprintf(left + left_n, sizeof left - left_n, "%s", ch);
        }
    }
    for (int i = 0; i < TOKEN_ADDED_COUNT; i++) {
        const char *name = added_names[i];
        int special = strcmp(name, "<think>") && strcmp(name, "</think>") && strcmp(name, "<tool_call>") &&
                      strcmp(name, "</tool_call>") && strcmp(name, "<tool_response>") &&
                      strcmp(name, "</tool_response>");
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", TOKEN_ADDED_FIRST + i,
                                               "content", name, "single_word", 0, "lstrip", 0, "rstrip", 0,
                                               "normalized", 0, "special", special));
    }
    json_t *bytelevel = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                                  "use_regex", 0);
    return json_pack("{s:s, s:n, s:n, s:o, s:{s:s}, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, O]}, s:O, s:o,"
                     " s:{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:b, s:o, s:o}}",
                     "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "type", "NFC",
                     "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
                     qwen35_regex, "behavior", "Isolated", "invert", 0, bytelevel, "post_processor", bytelevel,
                     "decoder", bytelevel, "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix",
                     "", "end_of_word_suffix", "", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab",
                     vocab, "merges", merges);
}

static int write_config(const char *out_dir, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out_dir);
    json_t *cfg = json_pack("{s:b, s:b, s:n, s:s, s:s, s:n, s:s, s:i, s:s, s:b}", "add_bos_token", 0,
                            "add_prefix_space", 0, "bos_token", "eos_token", "<|im_end|>", "pad_token", "<|endoftext|>",
                            "unk_token", "errors", "replace", "model_max_length", 262144, "tokenizer_class",
                            "Qwen2Tokenizer", "split_special_tokens", 0);
    int rc = cfg ? json_dump_file(cfg, path, JSON_INDENT(2)) : -1;
    json_decref(cfg);
    if (rc) snprintf(err, errlen, "%s: cannot write", path);
    return rc ? -1 : 0;
}

int synth_write_small_tokenizer(const char *out_dir, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", out_dir);
    json_t *tj = synthetic_tokenizer_json();
    int rc = tj ? json_dump_file(tj, path, JSON_COMPACT | JSON_ENSURE_ASCII) : -1;
    json_decref(tj);
    if (rc) {
        snprintf(err, errlen, "%s: cannot write", path);
        return -1;
    }
    return write_config(out_dir, err, errlen);
}

static int copy_file(const char *from, const char *to, char *err, size_t errlen) {
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    char buf[1 << 16];
    size_t n;
    int rc = 0;
    if (!in || !out) {
        snprintf(err, errlen, "%s: %s", in ? to : from, strerror(errno));
        rc = -1;
    }
    while (!rc && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) {
            snprintf(err, errlen, "%s: write failed", to);
            rc = -1;
        }
    if (in) fclose(in);
    if (out && fclose(out) && !rc) {
        snprintf(err, errlen, "%s: write failed", to);
        rc = -1;
    }
    return rc;
}

static bool is_file(const char *p) {
    struct stat st;
    return !stat(p, &st) && S_ISREG(st.st_mode);
}

int synth_write_tokenizer(const char *out_dir, char *err, size_t errlen) {
    char src[4096] = "", dst[4096];
    const char *env = getenv("CALLA_TOKENIZER_JSON");
    if (env && *env) {
        if (!is_file(env)) {
            snprintf(err, errlen, "CALLA_TOKENIZER_JSON=%s: not a file", env);
            return -1;
        }
        snprintf(src, sizeof src, "%s", env);
    } else if (is_file("build/tokenizer/tokenizer.json")) {
        snprintf(src, sizeof src, "build/tokenizer/tokenizer.json");
    } else {
        char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 32);
        if (n > 0) {
            exe[n] = 0;
            char *slash = strrchr(exe, '/');
            if (slash) {
                strcpy(slash, "/tokenizer/tokenizer.json");
                if (is_file(exe)) snprintf(src, sizeof src, "%s", exe);
            }
        }
    }
    if (!*src) return synth_write_small_tokenizer(out_dir, err, errlen);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", out_dir);
    if (copy_file(src, dst, err, errlen)) return -1;
    char *slash = strrchr(src, '/');
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%.*stokenizer_config.json", slash ? (int)(slash - src + 1) : 0, src);
    snprintf(dst, sizeof dst, "%s/tokenizer_config.json", out_dir);
    return is_file(cfg) ? copy_file(cfg, dst, err, errlen) : write_config(out_dir, err, errlen);
}
