// model.c: the named geometries and the expected tensor table (docs/MODEL.md §1, §5.2).
#include "model.h"

#include <stdio.h>
#include <string.h>

// The real model first. Test geometries keep the architecture (3 DeltaNet : 1 attention,
// GQA, two value heads per key head, partial RoPE at a quarter of head_dim, the real vocabulary)
// at sizes that run in milliseconds on a CPU.
static const struct geometry geometries[] = {
    {
        .name = "qwen3.6-35b-a3b",
        .is_test = false,
        .vocab = QWEN_VOCAB,
        .hidden = QWEN_HIDDEN,
        .n_layers = QWEN_LAYERS,
        .n_heads = QWEN_HEADS,
        .n_kv_heads = QWEN_KV_HEADS,
        .head_dim = QWEN_HEAD_DIM,
        .rope_dim = QWEN_ROPE_DIM,
        .lin_k_heads = QWEN_LIN_K_HEADS,
        .lin_v_heads = QWEN_LIN_V_HEADS,
        .lin_k_dim = QWEN_LIN_K_DIM,
        .lin_v_dim = QWEN_LIN_V_DIM,
        .conv_kernel = QWEN_CONV_KERNEL,
        .n_experts = QWEN_EXPERTS,
        .n_experts_used = QWEN_EXPERTS_USED,
        .moe_inter = QWEN_MOE_INTER,
        .shared_inter = QWEN_SHARED_INTER,
        .attn_interval = QWEN_ATTN_INTERVAL,
        .max_ctx = QWEN_MAX_CTX,
        .rope_theta = 10000000.0,
        .rms_eps = 1e-6,
    },
    {
        // hidden 128, 4 layers, GQA 2, 2 v heads per k head, 8 experts top-2
        .name = "tiny",      .is_test = true,         .vocab = QWEN_VOCAB,
        .hidden = 128,       .n_layers = 4,           .n_heads = 4,
        .n_kv_heads = 2,     .head_dim = 64,          .rope_dim = 16,
        .lin_k_heads = 2,    .lin_v_heads = 4,        .lin_k_dim = 32,
        .lin_v_dim = 32,     .conv_kernel = 4,        .n_experts = 8,
        .n_experts_used = 2, .moe_inter = 64,         .shared_inter = 64,
        .attn_interval = 4,  .max_ctx = QWEN_MAX_CTX, .rope_theta = 10000000.0,
        .rms_eps = 1e-6,
    },
    {
        // hidden 256, 8 layers, GQA 4, head_dim 128, 16 experts top-4
        .name = "small",     .is_test = true,         .vocab = QWEN_VOCAB,
        .hidden = 256,       .n_layers = 8,           .n_heads = 8,
        .n_kv_heads = 2,     .head_dim = 128,         .rope_dim = 32,
        .lin_k_heads = 4,    .lin_v_heads = 8,        .lin_k_dim = 64,
        .lin_v_dim = 64,     .conv_kernel = 4,        .n_experts = 16,
        .n_experts_used = 4, .moe_inter = 128,        .shared_inter = 128,
        .attn_interval = 4,  .max_ctx = QWEN_MAX_CTX, .rope_theta = 10000000.0,
        .rms_eps = 1e-6,
    },
};

void geometry_config_ints(const struct geometry *g, struct geometry_config_int out[GEOMETRY_CONFIG_INTS]) {
    const struct geometry_config_int ints[GEOMETRY_CONFIG_INTS] = {
        {"vocab_size", g->vocab},
        {"hidden_size", g->hidden},
        {"num_hidden_layers", g->n_layers},
        {"num_attention_heads", g->n_heads},
        {"num_key_value_heads", g->n_kv_heads},
        {"head_dim", g->head_dim},
        {"linear_num_key_heads", g->lin_k_heads},
        {"linear_num_value_heads", g->lin_v_heads},
        {"linear_key_head_dim", g->lin_k_dim},
        {"linear_value_head_dim", g->lin_v_dim},
        {"linear_conv_kernel_dim", g->conv_kernel},
        {"num_experts", g->n_experts},
        {"num_experts_per_tok", g->n_experts_used},
        {"moe_intermediate_size", g->moe_inter},
        {"shared_expert_intermediate_size", g->shared_inter},
        {"max_position_embeddings", g->max_ctx},
    };
    memcpy(out, ints, sizeof ints);
}

int geometry_count(void) {
    return (int)(sizeof geometries / sizeof geometries[0]);
}
const struct geometry *geometry_at(int i) {
    return &geometries[i];
}
const struct geometry *geometry_real(void) {
    return &geometries[0];
}

const struct geometry *geometry_find(const char *name) {
    if (!strcmp(name, "full") || !strcmp(name, "qwen3.5-35b-a3b")) return geometry_real();
    for (int i = 0; i < geometry_count(); i++)
        if (!strcmp(geometries[i].name, name)) return &geometries[i];
    return NULL;
}

// ---- the tensor table ----------------------------------------------------------------------

struct spec_builder {
    struct tensor_spec *specs;
    int cap, n;
    struct tensor_spec overflow; // written when counting past cap
};

static struct tensor_spec *spec_add(struct spec_builder *b, enum tensor_role role, const char *fmt, int layer) {
    struct tensor_spec *s = b->n < b->cap ? &b->specs[b->n] : &b->overflow;
    b->n++;
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, fmt, layer);
    s->role = role;
    return s;
}

static void add_quant(struct spec_builder *b, const char *fmt, int layer, int n_mat, int rows, int cols, int bits,
                      float gain, struct qtensor *dst) {
    struct tensor_spec *s = spec_add(b, ROLE_QUANT, fmt, layer);
    s->bits = bits;
    s->gain = gain;
    if (n_mat) {
        s->ndim = 3;
        s->dims[0] = n_mat, s->dims[1] = rows, s->dims[2] = cols;
    } else {
        s->ndim = 2;
        s->dims[0] = rows, s->dims[1] = cols;
    }
    s->qdst = dst;
}

static void add_plain(struct spec_builder *b, enum tensor_role role, const char *fmt, int layer, int ndim, int64_t d0,
                      int64_t d1, int64_t d2, float **dst) {
    struct tensor_spec *s = spec_add(b, role, fmt, layer);
    s->ndim = ndim;
    s->dims[0] = d0, s->dims[1] = d1, s->dims[2] = d2;
    s->fdst = dst;
}

int model_tensor_specs(const struct geometry *g, struct weights *w, struct tensor_spec *specs, int cap) {
    struct spec_builder b = {.specs = specs, .cap = cap};
    static struct weights scratch; // binding target when the caller does not bind
    struct weights *W = w ? w : &scratch;
    const int H = g->hidden;

    add_quant(&b, "model.embed_tokens", 0, 0, g->vocab, H, 4, 1.0f, &W->embed);
    add_quant(&b, "lm_head", 0, 0, g->vocab, H, 4, 4.0f, &W->lm_head);
    add_plain(&b, ROLE_NORM, "model.norm.weight", 0, 1, H, 0, 0, &W->final_norm);
    for (int i = 0; i < g->n_layers; i++) {
        struct layer_weights *L = &W->layers[i];
        add_plain(&b, ROLE_NORM, "model.layers.%d.input_layernorm.weight", i, 1, H, 0, 0, &L->input_norm);
        add_plain(&b, ROLE_NORM, "model.layers.%d.post_attention_layernorm.weight", i, 1, H, 0, 0, &L->post_norm);
        if (geom_is_attn(g, i)) {
            add_quant(&b, "model.layers.%d.self_attn.q_proj", i, 0, 2 * geom_q_dim(g), H, 4, 1.0f, &L->q_proj);
            add_quant(&b, "model.layers.%d.self_attn.k_proj", i, 0, geom_kv_dim(g), H, 4, 1.0f, &L->k_proj);
            add_quant(&b, "model.layers.%d.self_attn.v_proj", i, 0, geom_kv_dim(g), H, 4, 1.0f, &L->v_proj);
            add_quant(&b, "model.layers.%d.self_attn.o_proj", i, 0, H, geom_q_dim(g), 4, 1.0f, &L->o_proj);
            add_plain(&b, ROLE_NORM, "model.layers.%d.self_attn.q_norm.weight", i, 1, g->head_dim, 0, 0, &L->q_norm);
            add_plain(&b, ROLE_NORM, "model.layers.%d.self_attn.k_norm.weight", i, 1, g->head_dim, 0, 0, &L->k_norm);
        } else {
            const int C = geom_conv_dim(g), VD = geom_lin_value_dim(g), HV = g->lin_v_heads;
            add_quant(&b, "model.layers.%d.linear_attn.in_proj_qkv", i, 0, C, H, 4, 1.0f, &L->in_qkv);
            add_quant(&b, "model.layers.%d.linear_attn.in_proj_z", i, 0, VD, H, 4, 1.0f, &L->in_z);
            add_quant(&b, "model.layers.%d.linear_attn.in_proj_b", i, 0, HV, H, 4, 1.0f, &L->in_b);
            add_quant(&b, "model.layers.%d.linear_attn.in_proj_a", i, 0, HV, H, 4, 1.0f, &L->in_a);
            add_quant(&b, "model.layers.%d.linear_attn.out_proj", i, 0, H, VD, 4, 1.0f, &L->out_proj);
            add_plain(&b, ROLE_CONV, "model.layers.%d.linear_attn.conv1d.weight", i, 3, C, g->conv_kernel, 1,
                      &L->conv_w);
            add_plain(&b, ROLE_A_LOG, "model.layers.%d.linear_attn.A_log", i, 1, HV, 0, 0, &L->A_log);
            add_plain(&b, ROLE_DT_BIAS, "model.layers.%d.linear_attn.dt_bias", i, 1, HV, 0, 0, &L->dt_bias);
            add_plain(&b, ROLE_GATED_NORM, "model.layers.%d.linear_attn.norm.weight", i, 1, g->lin_v_dim, 0, 0,
                      &L->gdn_norm);
        }
        const int E = g->n_experts, I = g->moe_inter, S = g->shared_inter;
        add_quant(&b, "model.layers.%d.mlp.gate", i, 0, E, H, 8, 2.0f, &L->router);
        add_quant(&b, "model.layers.%d.mlp.shared_expert_gate", i, 0, 1, H, 8, 1.0f, &L->shared_gate);
        add_quant(&b, "model.layers.%d.mlp.shared_expert.gate_proj", i, 0, S, H, 4, 1.0f, &L->se_gate);
        add_quant(&b, "model.layers.%d.mlp.shared_expert.up_proj", i, 0, S, H, 4, 1.0f, &L->se_up);
        add_quant(&b, "model.layers.%d.mlp.shared_expert.down_proj", i, 0, H, S, 4, 1.0f, &L->se_down);
        add_quant(&b, "model.layers.%d.mlp.switch_mlp.gate_proj", i, E, I, H, 4, 1.0f, &L->ex_gate);
        add_quant(&b, "model.layers.%d.mlp.switch_mlp.up_proj", i, E, I, H, 4, 1.0f, &L->ex_up);
        add_quant(&b, "model.layers.%d.mlp.switch_mlp.down_proj", i, E, H, I, 4, 1.0f, &L->ex_down);
    }
    return b.n;
}

int model_tensor_spec_count(const struct geometry *g) {
    return model_tensor_specs(g, NULL, NULL, 0);
}

int64_t tensor_spec_elems(const struct tensor_spec *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->dims[d];
    return n;
}

struct model_size model_size_of(const struct geometry *g) {
    struct model_size z = {0, 0, 0};
    int n = model_tensor_spec_count(g);
    struct tensor_spec specs[n];
    model_tensor_specs(g, NULL, specs, n);
    for (int i = 0; i < n; i++) {
        int64_t e = tensor_spec_elems(&specs[i]);
        z.params += e;
        if (specs[i].role == ROLE_QUANT) {
            z.bytes += e * specs[i].bits / 8 + 2 * (e / QWEN_GROUP) * 2;
            z.n_tensors += 3;
        } else {
            z.bytes += e * 2; // bf16 as written by synth; real files may hold some as f32
            z.n_tensors += 1;
        }
    }
    return z;
}

struct state_sizes model_state_sizes(const struct geometry *g) {
    struct state_sizes z = {0};
    for (int i = 0; i < g->n_layers; i++) geom_is_attn(g, i) ? z.n_attn++ : z.n_gdn++;
    z.kv_row = (int64_t)geom_kv_dim(g);
    z.conv_bytes = (int64_t)(g->conv_kernel - 1) * geom_conv_dim(g) * (int64_t)sizeof(float);
    z.recurrent_bytes = (int64_t)g->lin_v_heads * g->lin_k_dim * g->lin_v_dim * (int64_t)sizeof(float);
    z.kv_bytes_per_token = (int64_t)z.n_attn * 2 * z.kv_row * 2;
    z.gdn_bytes = (int64_t)z.n_gdn * (z.conv_bytes + z.recurrent_bytes);
    return z;
}
