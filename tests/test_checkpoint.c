// test_checkpoint.c: the loader accepts `calla synth` output at every test geometry (and
// sharded), synth is byte-identical per seed, and every kind of bad checkpoint is refused with
// a message naming the key or tensor.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "synth.h"

static char base[256];

static void make_synth_profile(const char *dir, const char *geometry, uint64_t seed, int64_t shard_bytes,
                               enum synth_profile p) {
    char err[512];
    struct synth_options o = {
        .g = geometry_find(geometry), .profile = p, .seed = seed, .out_dir = dir, .max_shard_bytes = shard_bytes};
    assert_non_null(o.g);
    if (synth_write(&o, err, sizeof err)) fail_msg("synth: %s", err);
}

static void make_synth(const char *dir, const char *geometry, uint64_t seed, int64_t shard_bytes) {
    make_synth_profile(dir, geometry, seed, shard_bytes, SYNTH_PROFILE_TRAINED);
}

static void fresh(char *dir, size_t n, const char *name) {
    snprintf(dir, n, "%s/%s", base, name);
    make_synth(dir, "tiny", 7, (int64_t)5 << 30);
}

// Opens dir; expects failure whose message contains every needle.
static void expect_refused(const char *dir, const char *needle1, const char *needle2) {
    struct model m;
    char err[1024] = "";
    int rc = checkpoint_open(dir, &m, err, sizeof err);
    if (rc == 0) {
        checkpoint_close(&m);
        fail_msg("checkpoint %s was accepted; expected an error containing \"%s\"", dir, needle1);
    }
    printf("    refused: %s\n", err);
    if (!strstr(err, needle1)) fail_msg("message \"%s\" lacks \"%s\"", err, needle1);
    if (needle2 && !strstr(err, needle2)) fail_msg("message \"%s\" lacks \"%s\"", err, needle2);
}

static void expect_accepted(const char *dir, struct model *m) {
    char err[1024];
    if (checkpoint_open(dir, m, err, sizeof err)) fail_msg("refused %s: %s", dir, err);
}

// ---- editing helpers ------------------------------------------------------------------------

static json_t *load_json(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    assert_non_null(j);
    return j;
}

static void save_json(const char *dir, const char *name, json_t *j) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(json_dump_file(j, path, JSON_INDENT(1)), 0);
    json_decref(j);
}

static json_t *text_config(json_t *cfg) {
    return json_object_get(cfg, "text_config");
}

static const char *SHARD = "model-00001-of-00001.safetensors";

// Reads the single shard as header JSON + data bytes.
static json_t *read_shard(const char *dir, uint8_t **data, size_t *data_len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, SHARD);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint64_t hl = 0;
    assert_int_equal(fread(&hl, 8, 1, f), 1);
    char *h = malloc(hl + 1);
    assert_int_equal(fread(h, 1, hl, f), hl);
    h[hl] = 0;
    fseek(f, 0, SEEK_END);
    *data_len = (size_t)ftell(f) - 8 - hl;
    fseek(f, (long)(8 + hl), SEEK_SET);
    *data = malloc(*data_len + 8);
    assert_int_equal(fread(*data, 1, *data_len, f), *data_len);
    fclose(f);
    json_t *j = json_loads(h, 0, NULL);
    free(h);
    assert_non_null(j);
    return j;
}

// Writes header (padded with `pad` extra spaces) + data; data_len may be cut to truncate.
static void write_shard(const char *dir, json_t *hdr, const uint8_t *data, size_t data_len, int pad) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, SHARD);
    char *h = json_dumps(hdr, JSON_COMPACT);
    uint64_t hl = strlen(h) + (uint64_t)pad;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, strlen(h), f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fwrite(data, 1, data_len, f);
    fclose(f);
    free(h);
}

// ---- acceptance -------------------------------------------------------------------------------

static void test_accepts_every_test_geometry(void **state) {
    for (int i = 0; i < geometry_count(); i++) {
        const struct geometry *g = geometry_at(i);
        if (!g->is_test) continue;
        char dir[512];
        snprintf(dir, sizeof dir, "%s/accept-%s", base, g->name);
        make_synth(dir, g->name, 1, (int64_t)5 << 30);
        struct model m;
        expect_accepted(dir, &m);
        assert_string_equal(m.g.name, g->name);
        assert_int_equal(m.n_text_tensors, model_size_of(g).n_tensors);
        assert_int_equal(m.file_bytes, model_size_of(g).bytes + 2 * (g->n_layers - g->n_layers / g->attn_interval) *
                                                                    g->lin_v_heads); // A_log is stored as F32
        // Bound pointers cover every layer of the right kind.
        for (int l = 0; l < g->n_layers; l++) {
            if (geom_is_attn(g, l))
                assert_non_null(m.w.layers[l].q_proj.w);
            else
                assert_non_null(m.w.layers[l].in_qkv.w);
            assert_int_equal(m.w.layers[l].router.bits, 8);
            assert_int_equal(m.w.layers[l].ex_down.n_mat, g->n_experts);
        }
        checkpoint_close(&m);
    }
}

static void test_real_geometry_tensor_count(void **state) {
    // docs/MODEL.md §5.2: 7 global + 30 x 45 + 10 x 40 = 1757 stored text tensors.
    struct model_size ms = model_size_of(geometry_real());
    assert_int_equal(ms.n_tensors, 1757);
    assert_true(ms.params > 34600000000LL && ms.params < 34700000000LL);
    assert_int_equal(model_state_sizes(geometry_real()).kv_bytes_per_token, 20480);
}

static void test_sharded(void **state) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sharded", base);
    make_synth(dir, "tiny", 1, 4 << 20); // 4 MiB shards
    struct model m;
    expect_accepted(dir, &m);
    assert_true(m.n_shards >= 4); // the 16 MB embedding and lm_head each stand alone
    checkpoint_close(&m);
}

static int files_equal(const char *a, const char *b) {
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

static void test_synth_deterministic(void **state) {
    char a[512], b[512], c[512], fa[600], fb[600], fc[600];
    snprintf(a, sizeof a, "%s/det-a", base);
    snprintf(b, sizeof b, "%s/det-b", base);
    snprintf(c, sizeof c, "%s/det-c", base);
    make_synth(a, "tiny", 42, (int64_t)5 << 30);
    struct synth_options o = {
        .g = geometry_find("tiny"), .seed = 42, .out_dir = b, .max_shard_bytes = (int64_t)5 << 30, .threads = 1};
    char err[256];
    assert_int_equal(synth_write(&o, err, sizeof err), 0); // one thread: same bytes
    make_synth(c, "tiny", 43, (int64_t)5 << 30);
    const char *files[] = {SHARD, "config.json", "model.safetensors.index.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(fa, sizeof fa, "%s/%s", a, files[i]);
        snprintf(fb, sizeof fb, "%s/%s", b, files[i]);
        snprintf(fc, sizeof fc, "%s/%s", c, files[i]);
        assert_true(files_equal(fa, fb));
    }
    snprintf(fa, sizeof fa, "%s/%s", a, SHARD);
    snprintf(fc, sizeof fc, "%s/%s", c, SHARD);
    assert_false(files_equal(fa, fc));
}

// Each profile is byte-identical per seed; the two differ only in the scales and biases of the
// router, the embedding and the projections into the residual stream (synth.h), and both load.
static void test_synth_profiles(void **state) {
    char u1[512], u2[512], tr[512], fa[600], fb[600];
    snprintf(u1, sizeof u1, "%s/prof-u1", base);
    snprintf(u2, sizeof u2, "%s/prof-u2", base);
    snprintf(tr, sizeof tr, "%s/prof-tr", base);
    make_synth_profile(u1, "tiny", 9, (int64_t)5 << 30, SYNTH_PROFILE_UNIFORM);
    struct synth_options o = {.g = geometry_find("tiny"),
                              .profile = SYNTH_PROFILE_UNIFORM,
                              .seed = 9,
                              .out_dir = u2,
                              .max_shard_bytes = (int64_t)5 << 30,
                              .threads = 1};
    char err[256];
    assert_int_equal(synth_write(&o, err, sizeof err), 0);
    make_synth_profile(tr, "tiny", 9, (int64_t)5 << 30, SYNTH_PROFILE_TRAINED);
    const char *same[] = {SHARD, "config.json", "model.safetensors.index.json", "calla_synth.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(fa, sizeof fa, "%s/%s", u1, same[i]);
        snprintf(fb, sizeof fb, "%s/%s", u2, same[i]);
        assert_true(files_equal(fa, fb));
    }
    for (int i = 1; i < 3; i++) { // layout and validation inputs do not depend on the profile
        snprintf(fa, sizeof fa, "%s/%s", u1, same[i]);
        snprintf(fb, sizeof fb, "%s/%s", tr, same[i]);
        assert_true(files_equal(fa, fb));
    }
    uint8_t *du, *dt;
    size_t lu, lt;
    json_t *hu = read_shard(u1, &du, &lu), *ht = read_shard(tr, &dt, &lt);
    assert_int_equal(lu, lt);
    const char *name;
    json_t *v;
    int n_diff = 0;
    json_object_foreach(hu, name, v) {
        if (!strcmp(name, "__metadata__")) continue;
        size_t b = (size_t)json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 0));
        size_t e = (size_t)json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 1));
        static const char *const scaled[] = {".mlp.gate.",
                                             "embed_tokens.",
                                             ".self_attn.o_proj.",
                                             ".linear_attn.out_proj.",
                                             ".switch_mlp.down_proj.",
                                             ".shared_expert.down_proj."};
        bool expected = false;
        for (int k = 0; k < 6; k++) expected |= strstr(name, scaled[k]) != NULL;
        expected &= !strstr(name, ".weight"); // the codes are the same
        bool differs = memcmp(du + b, dt + b, e - b) != 0;
        if (differs != expected) fail_msg("%s: %s between the profiles", name, differs ? "differs" : "is the same");
        n_diff += differs;
    }
    // scales and biases: 4 routers, the embedding, 1 o_proj, 3 out_proj, 4 + 4 down_proj (tiny)
    assert_int_equal(n_diff, 2 * (4 + 1 + 1 + 3 + 4 + 4));
    json_t *who = load_json(tr, "calla_synth.json");
    assert_string_equal(json_string_value(json_object_get(who, "profile")), "trained");
    json_decref(who);
    json_decref(hu);
    json_decref(ht);
    free(du);
    free(dt);
    struct model m;
    expect_accepted(u1, &m);
    checkpoint_close(&m);
    expect_accepted(tr, &m);
    checkpoint_close(&m);
}

static void test_ignores_vision_and_mtp(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "vision");
    uint8_t *data;
    size_t len;
    json_t *h = read_shard(dir, &data, &len);
    // Two extra tensors at the end of the data: 8 bytes each.
    data = realloc(data, len + 16);
    memset(data + len, 0, 16);
    json_object_set_new(h, "vision_tower.blocks.0.attn.qkv.weight",
                        json_pack("{s:s,s:[i],s:[I,I]}", "dtype", "BF16", "shape", 4, "data_offsets", (json_int_t)len,
                                  (json_int_t)len + 8));
    json_object_set_new(h, "mtp.fc.weight",
                        json_pack("{s:s,s:[i],s:[I,I]}", "dtype", "BF16", "shape", 4, "data_offsets",
                                  (json_int_t)len + 8, (json_int_t)len + 16));
    write_shard(dir, h, data, len + 16, 0);
    json_t *idx = load_json(dir, "model.safetensors.index.json");
    json_object_set_new(json_object_get(idx, "weight_map"), "vision_tower.blocks.0.attn.qkv.weight",
                        json_string(SHARD));
    json_object_set_new(json_object_get(idx, "weight_map"), "mtp.fc.weight", json_string(SHARD));
    save_json(dir, "model.safetensors.index.json", idx);
    json_decref(h);
    free(data);
    struct model m;
    expect_accepted(dir, &m);
    assert_int_equal(m.n_ignored, 2);
    checkpoint_close(&m);
}

static void make_synth_aligned(const char *dir, uint64_t seed) {
    char err[512];
    struct synth_options o = {
        .g = geometry_find("tiny"), .seed = seed, .out_dir = dir, .max_shard_bytes = (int64_t)5 << 30, .aligned = true};
    if (synth_write(&o, err, sizeof err)) fail_msg("synth: %s", err);
}

// True when [p, p + bytes) lies in one of m's mapped shards (bound in place, not copied).
static bool in_shard(const struct model *m, const void *p, size_t bytes) {
    for (int i = 0; i < m->n_shards; i++)
        if ((const uint8_t *)p >= m->shards[i].map &&
            (const uint8_t *)p + bytes <= m->shards[i].map + m->shards[i].size)
            return true;
    return false;
}

// synth writes MLX's unpadded layout by default (data at an odd offset: every U32 and BF16 tensor
// misaligned); --aligned pads the header. Both bind every quantized matrix in place, with the same
// bytes, and allocate the same host memory (the fp32 vectors); one more byte of header (write_shard
// pad 1: data at an even but not 4-aligned offset) changes nothing either.
static void test_unaligned_data(void **state) {
    char dir[512], dref[512];
    fresh(dir, sizeof dir, "unaligned");
    snprintf(dref, sizeof dref, "%s/unaligned-ref", base);
    make_synth_aligned(dref, 7);
    struct model m, ref;
    expect_accepted(dir, &m);
    expect_accepted(dref, &ref);
    int n = model_tensor_spec_count(&m.g), n_quant = 0;
    struct tensor_spec specs[n];
    model_tensor_specs(&m.g, NULL, specs, n);
    for (int i = 0; i < n; i++) n_quant += specs[i].role == ROLE_QUANT;
    assert_int_equal(m.n_unaligned, 3 * n_quant); // every quantized matrix's three arrays
    assert_int_equal(ref.n_unaligned, 0);
    assert_int_equal(m.owned_bytes, ref.owned_bytes);
    const size_t bytes = (size_t)ref.w.embed.rows * qt_words_per_row(&ref.w.embed) * 4;
    assert_true(in_shard(&m, m.w.embed.w, bytes) && in_shard(&ref, ref.w.embed.w, bytes));
    assert_int_equal((uintptr_t)m.w.embed.w % 2, 1);
    assert_memory_equal(m.w.embed.w, ref.w.embed.w, bytes);
    checkpoint_close(&m);

    uint8_t *data;
    size_t len;
    json_t *h = read_shard(dir, &data, &len);
    write_shard(dir, h, data, len, 1);
    json_decref(h);
    free(data);
    expect_accepted(dir, &m);
    assert_true(m.n_unaligned > 0);
    assert_int_equal(m.owned_bytes, ref.owned_bytes);
    assert_true(in_shard(&m, m.w.embed.w, bytes));
    assert_memory_equal(m.w.embed.w, ref.w.embed.w, bytes);
    checkpoint_close(&m);
    checkpoint_close(&ref);
}

// ---- refusals ---------------------------------------------------------------------------------

static void test_missing_config(void **state) {
    char dir[512], p[1100];
    fresh(dir, sizeof dir, "noconfig");
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    expect_refused(dir, "config.json: cannot open", NULL);
}

static void test_config_not_json(void **state) {
    char dir[512], p[1100];
    fresh(dir, sizeof dir, "badjson");
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{\"model_type\": \"qwen3_5_moe\", ", f);
    fclose(f);
    expect_refused(dir, "config.json: invalid JSON", NULL);
}

static void test_unknown_model_type(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "modeltype");
    json_t *c = load_json(dir, "config.json");
    json_object_set_new(c, "model_type", json_string("qwen3_next"));
    save_json(dir, "config.json", c);
    expect_refused(dir, "model_type: expected \"qwen3_5_moe\", got \"qwen3_next\"", NULL);
}

static void test_unmarked_small_model_is_not_the_real_one(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "unmarked");
    json_t *c = load_json(dir, "config.json");
    json_object_del(text_config(c), "calla_test_geometry");
    save_json(dir, "config.json", c);
    expect_refused(dir, "text_config.hidden_size: expected 2048, got 128", NULL);
}

static void test_unknown_test_geometry(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "unknowngeom");
    json_t *c = load_json(dir, "config.json");
    json_object_set_new(text_config(c), "calla_test_geometry", json_string("qwen3.6-35b-a3b"));
    save_json(dir, "config.json", c);
    expect_refused(dir, "calla_test_geometry", "is not a test geometry");
}

static void test_wrong_geometry_value(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "experts");
    json_t *c = load_json(dir, "config.json");
    json_object_set_new(text_config(c), "num_experts_per_tok", json_integer(3));
    save_json(dir, "config.json", c);
    expect_refused(dir, "text_config.num_experts_per_tok: expected 2, got 3", NULL);
}

static void test_wrong_layer_types(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "layertypes");
    json_t *c = load_json(dir, "config.json");
    json_array_set_new(json_object_get(text_config(c), "layer_types"), 3, json_string("linear_attention"));
    save_json(dir, "config.json", c);
    expect_refused(dir, "layer_types[3]: expected \"full_attention\"", NULL);
}

static void test_wrong_rope_theta(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "rope");
    json_t *c = load_json(dir, "config.json");
    json_object_set_new(json_object_get(text_config(c), "rope_parameters"), "rope_theta", json_real(1e6));
    save_json(dir, "config.json", c);
    expect_refused(dir, "rope_theta: expected 1e+07, got 1e+06", NULL);
}

static void test_wrong_default_bits(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "bits");
    json_t *c = load_json(dir, "config.json");
    json_object_set_new(json_object_get(c, "quantization"), "bits", json_integer(8));
    save_json(dir, "config.json", c);
    expect_refused(dir, "quantization.bits: expected 4, got 8", NULL);
}

static void test_wrong_group_size(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "group");
    json_t *c = load_json(dir, "config.json");
    json_object_set_new(json_object_get(c, "quantization"), "group_size", json_integer(32));
    save_json(dir, "config.json", c);
    expect_refused(dir, "quantization.group_size: expected 64, got 32", NULL);
}

static void test_missing_router_override(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "override");
    json_t *c = load_json(dir, "config.json");
    json_object_del(json_object_get(c, "quantization"), "language_model.model.layers.2.mlp.gate");
    save_json(dir, "config.json", c);
    expect_refused(dir, "language_model.model.layers.2.mlp.gate: expected 8 bits, got 4", NULL);
}

static void test_override_for_unknown_module(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "override2");
    json_t *c = load_json(dir, "config.json");
    json_object_set_new(json_object_get(c, "quantization"), "language_model.model.layers.9.mlp.gate",
                        json_pack("{s:i,s:i}", "group_size", 64, "bits", 8));
    save_json(dir, "config.json", c);
    expect_refused(dir, "language_model.model.layers.9.mlp.gate", "does not have");
}

// Applies edit to the shard header and rewrites it (data unchanged unless the edit returns a length).
static void edit_header(const char *dir, void (*edit)(json_t *h, size_t *len)) {
    uint8_t *data;
    size_t len;
    json_t *h = read_shard(dir, &data, &len);
    edit(h, &len);
    write_shard(dir, h, data, len, 0);
    json_decref(h);
    free(data);
}

static void drop_tensor(json_t *h, size_t *len) {
    json_object_del(h, "language_model.model.layers.1.linear_attn.A_log");
}
static void test_missing_tensor(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "missing");
    edit_header(dir, drop_tensor);
    json_t *idx = load_json(dir, "model.safetensors.index.json");
    json_object_del(json_object_get(idx, "weight_map"), "language_model.model.layers.1.linear_attn.A_log");
    save_json(dir, "model.safetensors.index.json", idx);
    expect_refused(dir, "tensor language_model.model.layers.1.linear_attn.A_log is missing", NULL);
}

// Appends a small BF16 tensor `name` at the end of the single shard and lists it in the index.
static void append_tensor(const char *dir, const char *name) {
    uint8_t *data;
    size_t len;
    json_t *h = read_shard(dir, &data, &len);
    data = realloc(data, len + 8);
    memset(data + len, 0, 8);
    json_object_set_new(h, name,
                        json_pack("{s:s,s:[i],s:[I,I]}", "dtype", "BF16", "shape", 4, "data_offsets", (json_int_t)len,
                                  (json_int_t)len + 8));
    write_shard(dir, h, data, len + 8, 0);
    json_decref(h);
    free(data);
    json_t *idx = load_json(dir, "model.safetensors.index.json");
    json_object_set_new(json_object_get(idx, "weight_map"), name, json_string(SHARD));
    save_json(dir, "model.safetensors.index.json", idx);
}

static void test_extra_tensor(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "extra");
    append_tensor(dir, "language_model.model.layers.1.linear_attn.dt_bias_extra");
    expect_refused(dir, "tensor language_model.model.layers.1.linear_attn.dt_bias_extra", "is not part of");
}

static void test_extra_layer(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "extralayer");
    append_tensor(dir, "language_model.model.layers.4.input_layernorm.weight"); // tiny has 4 layers
    expect_refused(dir, "language_model.model.layers.4.input_layernorm.weight", "is not part of");
}

static void test_tensor_not_in_index(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "notindex");
    json_t *idx = load_json(dir, "model.safetensors.index.json");
    json_object_del(json_object_get(idx, "weight_map"), "language_model.model.norm.weight");
    save_json(dir, "model.safetensors.index.json", idx);
    expect_refused(dir, "language_model.model.norm.weight", "missing from model.safetensors.index.json");
}

static void scales_f16(json_t *h, size_t *len) {
    json_object_set_new(json_object_get(h, "language_model.model.layers.0.mlp.shared_expert.up_proj.scales"), "dtype",
                        json_string("F16"));
}
static void test_wrong_dtype(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "dtype");
    edit_header(dir, scales_f16);
    expect_refused(dir, "mlp.shared_expert.up_proj.scales: expected dtype BF16, got F16", NULL);
}

static void reshape_norm(json_t *h, size_t *len) {
    json_t *t = json_object_get(h, "language_model.model.norm.weight");
    json_object_set_new(t, "shape", json_pack("[i,i]", 2, 64));
}
static void test_wrong_shape(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "shape");
    edit_header(dir, reshape_norm);
    expect_refused(dir, "tensor language_model.model.norm.weight: expected shape [128], got [2, 64]", NULL);
}

// Router stored 4-bit while the config says 8-bit: the shapes give it away.
static void router_4bit(json_t *h, size_t *len) {
    json_t *t = json_object_get(h, "language_model.model.layers.0.mlp.gate.weight");
    json_t *off = json_object_get(t, "data_offsets");
    json_int_t b = json_integer_value(json_array_get(off, 0));
    json_object_set_new(t, "shape", json_pack("[i,i]", 8, 16));
    json_array_set_new(off, 1, json_integer(b + 8 * 16 * 4));
}
static void test_bits_from_shapes(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "routerbits");
    edit_header(dir, router_4bit);
    expect_refused(dir, "layers.0.mlp.gate.weight", "4 bits per weight");
}

static void nothing(json_t *h, size_t *len) {
    *len -= 1000;
}
static void test_truncated_shard(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "truncated");
    edit_header(dir, nothing);
    expect_refused(dir, "past the data section", "truncated");
}

static void overlap(json_t *h, size_t *len) {
    // Point the final norm at the embedding's bytes: same size would be needed, so resize both.
    json_t *a = json_object_get(h, "language_model.model.layers.0.input_layernorm.weight");
    json_t *b = json_object_get(h, "language_model.model.layers.0.post_attention_layernorm.weight");
    json_object_set(b, "data_offsets", json_object_get(a, "data_offsets"));
}
static void test_offsets_overlap(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "overlap");
    edit_header(dir, overlap);
    expect_refused(dir, "overlap", "layernorm");
}

static void lying_offsets(json_t *h, size_t *len) {
    json_t *t = json_object_get(h, "language_model.model.norm.weight");
    json_array_set_new(json_object_get(t, "data_offsets"), 1, json_integer((json_int_t)1 << 50));
}
static void test_offsets_beyond_file(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "lying");
    edit_header(dir, lying_offsets);
    expect_refused(dir, "language_model.model.norm.weight", "data_offsets");
}

static void test_header_length_lies(void **state) {
    char dir[512], p[1100];
    fresh(dir, sizeof dir, "hdrlen");
    snprintf(p, sizeof p, "%s/%s", dir, SHARD);
    int fd = open(p, O_WRONLY);
    uint64_t huge = (uint64_t)1 << 40;
    assert_int_equal(pwrite(fd, &huge, 8, 0), 8);
    close(fd);
    expect_refused(dir, "header length", SHARD);
}

static const char *shard_of(json_t *idx, const char *tensor) {
    return json_string_value(json_object_get(json_object_get(idx, "weight_map"), tensor));
}

static void test_index_names_wrong_shard(void **state) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/index-wrong", base);
    make_synth(dir, "tiny", 1, 8 << 20);
    json_t *idx = load_json(dir, "model.safetensors.index.json");
    char other[128];
    snprintf(other, sizeof other, "%s", shard_of(idx, "language_model.model.embed_tokens.weight"));
    assert_string_not_equal(other, shard_of(idx, "language_model.lm_head.weight"));
    json_object_set_new(json_object_get(idx, "weight_map"), "language_model.lm_head.weight", json_string(other));
    save_json(dir, "model.safetensors.index.json", idx);
    expect_refused(dir, "language_model.lm_head.weight", "listed in");
}

static void test_missing_shard(void **state) {
    char dir[512], p[800], name[128];
    snprintf(dir, sizeof dir, "%s/shard-gone", base);
    make_synth(dir, "tiny", 1, 8 << 20);
    json_t *idx = load_json(dir, "model.safetensors.index.json");
    snprintf(name, sizeof name, "%s", shard_of(idx, "language_model.lm_head.weight"));
    json_decref(idx);
    snprintf(p, sizeof p, "%s/%s", dir, name);
    assert_int_equal(unlink(p), 0);
    expect_refused(dir, name, "cannot open");
}

// Released shard pages read back the same bytes, at any alignment (the weights are bound in the
// mapping, never copied to the heap, where MADV_DONTNEED would zero them).
static void release_and_compare(const char *dir) {
    struct model m;
    expect_accepted(dir, &m);
    const struct qtensor *t = &m.w.lm_head;
    size_t bytes = (size_t)t->rows * qt_words_per_row(t) * 4;
    assert_true(in_shard(&m, t->w, bytes));
    uint8_t *before = malloc(bytes);
    memcpy(before, t->w, bytes);
    checkpoint_release(&m, t->w, bytes);
    assert_memory_equal(before, t->w, bytes);
    free(before);
    checkpoint_close(&m);
}

static void test_release_pages(void **state) {
    char dir[512];
    fresh(dir, sizeof dir, "release");
    release_and_compare(dir); // unaligned (the synthetic default)
    snprintf(dir, sizeof dir, "%s/release-aligned", base);
    make_synth_aligned(dir, 7);
    release_and_compare(dir);
}

static int setup(void **state) {
    const char *t = getenv("TMPDIR");
    snprintf(base, sizeof base, "%s/calla-ckpt-%d", t && *t ? t : "/tmp", (int)getpid());
    return mkdir(base, 0755);
}

static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    return system(cmd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts_every_test_geometry),
        cmocka_unit_test(test_real_geometry_tensor_count),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_synth_deterministic),
        cmocka_unit_test(test_synth_profiles),
        cmocka_unit_test(test_ignores_vision_and_mtp),
        cmocka_unit_test(test_unaligned_data),
        cmocka_unit_test(test_release_pages),
        cmocka_unit_test(test_missing_config),
        cmocka_unit_test(test_config_not_json),
        cmocka_unit_test(test_unknown_model_type),
        cmocka_unit_test(test_unmarked_small_model_is_not_the_real_one),
        cmocka_unit_test(test_unknown_test_geometry),
        cmocka_unit_test(test_wrong_geometry_value),
        cmocka_unit_test(test_wrong_layer_types),
        cmocka_unit_test(test_wrong_rope_theta),
        cmocka_unit_test(test_wrong_default_bits),
        cmocka_unit_test(test_wrong_group_size),
        cmocka_unit_test(test_missing_router_override),
        cmocka_unit_test(test_override_for_unknown_module),
        cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_extra_tensor),
        cmocka_unit_test(test_extra_layer),
        cmocka_unit_test(test_tensor_not_in_index),
        cmocka_unit_test(test_wrong_dtype),
        cmocka_unit_test(test_wrong_shape),
        cmocka_unit_test(test_bits_from_shapes),
        cmocka_unit_test(test_truncated_shard),
        cmocka_unit_test(test_offsets_overlap),
        cmocka_unit_test(test_offsets_beyond_file),
        cmocka_unit_test(test_header_length_lies),
        cmocka_unit_test(test_index_names_wrong_shard),
        cmocka_unit_test(test_missing_shard),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
