// model.h: the one model Calla runs (Qwen3.6-35B-A3B, MLX 4-bit) and its small test geometries.
//
// The shape contract shared by the loader, the synthetic-checkpoint writer and every backend.
// Shape letters: H = hidden, V = vocab, T = tokens, E = experts, I = expert intermediate.
// Quantized matrices are MLX affine: w = scale * q + bias, one (scale, bias) pair per 64 inputs,
// q packed little-endian into uint32 words, first element in the least significant bits.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// The real 35B-A3B geometry as compile-time facts (kernels are specialised for these).
enum {
    QWEN_VOCAB = 248320,
    QWEN_HIDDEN = 2048,
    QWEN_LAYERS = 40,
    QWEN_HEADS = 16,   // query heads
    QWEN_KV_HEADS = 2, // GQA group 8
    QWEN_HEAD_DIM = 256,
    QWEN_ROPE_DIM = 64,    // partial_rotary_factor 0.25
    QWEN_LIN_K_HEADS = 16, // DeltaNet q/k heads
    QWEN_LIN_V_HEADS = 32, // DeltaNet v heads (2 per key head)
    QWEN_LIN_K_DIM = 128,
    QWEN_LIN_V_DIM = 128,
    QWEN_CONV_KERNEL = 4,
    QWEN_EXPERTS = 256,
    QWEN_EXPERTS_USED = 8,
    QWEN_MOE_INTER = 512,
    QWEN_SHARED_INTER = 512,
    QWEN_ATTN_INTERVAL = 4, // full attention at layers i % 4 == 3
    QWEN_MAX_CTX = 262144,
    QWEN_GROUP = 64, // quantization group size
    QWEN_PREFILL_CHUNK = 4096,
};
_Static_assert(QWEN_HIDDEN % QWEN_GROUP == 0, "hidden must be a whole number of quant groups");
_Static_assert(QWEN_MOE_INTER % QWEN_GROUP == 0, "expert intermediate must be a whole number of groups");
_Static_assert((QWEN_HEADS * QWEN_HEAD_DIM) % QWEN_GROUP == 0, "o_proj input must be whole groups");
_Static_assert(QWEN_HEADS % QWEN_KV_HEADS == 0, "GQA group must be whole");
_Static_assert(QWEN_LIN_V_HEADS % QWEN_LIN_K_HEADS == 0, "DeltaNet v heads per k head must be whole");
_Static_assert(QWEN_LAYERS % QWEN_ATTN_INTERVAL == 0, "layer pattern must repeat whole");

// Token ids the engine itself needs (the tokenizer knows the rest).
enum { TOKEN_ENDOFTEXT = 248044, TOKEN_IM_START = 248045, TOKEN_IM_END = 248046 };

// A geometry: the real one, or a small test geometry of the same architecture.
struct geometry {
    const char *name; // "qwen3.6-35b-a3b", or a test geometry name
    bool is_test;     // test geometries are accepted only when the config marks itself as one
    int vocab;        // V: embedding / lm_head rows
    int hidden;       // H
    int n_layers;
    int n_heads; // full attention query heads
    int n_kv_heads;
    int head_dim;
    int rope_dim;    // rotated dims per head (head_dim * partial_rotary_factor)
    int lin_k_heads; // DeltaNet key/query heads
    int lin_v_heads; // DeltaNet value heads
    int lin_k_dim;
    int lin_v_dim;
    int conv_kernel;
    int n_experts;      // E
    int n_experts_used; // top-k
    int moe_inter;      // I, per routed expert
    int shared_inter;   // shared expert intermediate
    int attn_interval;  // full attention at layers i % attn_interval == attn_interval - 1
    int max_ctx;        // max_position_embeddings
    double rope_theta;
    double rms_eps;
};

// Derived sizes.
static inline int geom_q_dim(const struct geometry *g) {
    return g->n_heads * g->head_dim;
}
static inline int geom_kv_dim(const struct geometry *g) {
    return g->n_kv_heads * g->head_dim;
}
static inline int geom_lin_key_dim(const struct geometry *g) {
    return g->lin_k_heads * g->lin_k_dim;
}
static inline int geom_lin_value_dim(const struct geometry *g) {
    return g->lin_v_heads * g->lin_v_dim;
}
static inline int geom_conv_dim(const struct geometry *g) {
    return 2 * geom_lin_key_dim(g) + geom_lin_value_dim(g);
}
static inline bool geom_is_attn(const struct geometry *g, int layer) {
    return layer % g->attn_interval == g->attn_interval - 1;
}

// Named geometries: the real model first, then the test geometries.
const struct geometry *geometry_find(const char *name);
const struct geometry *geometry_real(void);
int geometry_count(void);
const struct geometry *geometry_at(int i);

// The integers of config.json's text_config that the geometry fixes, one list for the checkpoint's
// validation (checkpoint.c: each required, equal) and synth's config (synth.c).
enum { GEOMETRY_CONFIG_INTS = 16 };
struct geometry_config_int {
    const char *key;
    long long v;
};
void geometry_config_ints(const struct geometry *g, struct geometry_config_int out[GEOMETRY_CONFIG_INTS]);

// ---- weights --------------------------------------------------------------------------------

// An MLX affine-quantized matrix, possibly a stack of n_mat matrices (experts). On the host the
// three arrays point into the mapped checkpoint at whatever alignment the file has (MLX does not
// pad its safetensors header, so data starts at arbitrary byte offsets): read them with
// qt_load_u32 / qt_load_u16, never through a cast to uint32_t * or uint16_t *.
struct qtensor {
    const void *w;      // [n_mat, rows, cols * bits / 32] packed codes, u32 little-endian
    const void *scales; // [n_mat, rows, cols / 64] bf16
    const void *biases; // [n_mat, rows, cols / 64] bf16
    int n_mat, rows, cols, bits;
};
// Element i of a u32 / u16 array at any alignment (memcpy compiles to one load where unaligned
// loads are allowed, as on x86-64 and arm64).
static inline uint32_t qt_load_u32(const void *p, size_t i) {
    uint32_t v;
    memcpy(&v, (const uint8_t *)p + 4 * i, 4);
    return v;
}
static inline uint16_t qt_load_u16(const void *p, size_t i) {
    uint16_t v;
    memcpy(&v, (const uint8_t *)p + 2 * i, 2);
    return v;
}
static inline size_t qt_words_per_row(const struct qtensor *t) {
    return (size_t)t->cols * t->bits / 32;
}
static inline size_t qt_groups_per_row(const struct qtensor *t) {
    return (size_t)t->cols / QWEN_GROUP;
}

struct layer_weights {
    float *input_norm; // [H] (the +1 already folded in by the conversion)
    float *post_norm;  // [H]
    // full attention (layers i % 4 == 3)
    struct qtensor q_proj; // [n_heads * 2 * head_dim, H]: per head [query(head_dim) | gate(head_dim)]
    struct qtensor k_proj; // [kv_dim, H]
    struct qtensor v_proj; // [kv_dim, H]
    struct qtensor o_proj; // [H, q_dim]
    float *q_norm;         // [head_dim]
    float *k_norm;         // [head_dim]
    // Gated DeltaNet (the other layers)
    struct qtensor in_qkv;   // [conv_dim, H]: [all q | all k | all v]
    struct qtensor in_z;     // [value_dim, H]
    struct qtensor in_b;     // [lin_v_heads, H]
    struct qtensor in_a;     // [lin_v_heads, H]
    struct qtensor out_proj; // [H, value_dim]
    float *conv_w;           // [conv_dim, conv_kernel]; tap conv_kernel-1 multiplies the current token
    float *A_log;            // [lin_v_heads]
    float *dt_bias;          // [lin_v_heads]
    float *gdn_norm;         // [lin_v_dim] gated RMSNorm weight, no +1
    // MoE (every layer)
    struct qtensor router;      // [E, H] 8-bit
    struct qtensor shared_gate; // [1, H] 8-bit (mlp.shared_expert_gate)
    struct qtensor se_gate;     // [shared_inter, H]
    struct qtensor se_up;       // [shared_inter, H]
    struct qtensor se_down;     // [H, shared_inter]
    struct qtensor ex_gate;     // [E][I, H]
    struct qtensor ex_up;       // [E][I, H]
    struct qtensor ex_down;     // [E][H, I]
};

// Bound by walking the tensor table (model_tensor_specs): checkpoint.c binds the host copy into
// the mapped shards, and the CUDA backend binds its device copy (same shape, device pointers).
struct weights {
    struct qtensor embed;   // [V, H]
    struct qtensor lm_head; // [V, H]
    float *final_norm;      // [H]
    struct layer_weights layers[QWEN_LAYERS];
};

// ---- the expected tensor list (one table for the loader and the synthetic writer) -----------

enum tensor_role {
    ROLE_QUANT,      // quantized matrix: .weight (U32) .scales .biases (BF16)
    ROLE_NORM,       // RMSNorm weight with the +1 folded in
    ROLE_GATED_NORM, // DeltaNet gated RMSNorm weight (no +1)
    ROLE_CONV,       // depthwise conv weight [C, K, 1]
    ROLE_A_LOG,
    ROLE_DT_BIAS,
};

struct tensor_spec {
    char name[112]; // after "language_model."; for ROLE_QUANT the module path (no .weight)
    enum tensor_role role;
    int bits;   // ROLE_QUANT: 4 or 8
    float gain; // ROLE_QUANT: synthetic weight scale (std ~ gain / sqrt(cols))
    int ndim;   // logical shape: quant [n_mat,] rows, cols; plain: as stored
    int64_t dims[3];
    struct qtensor *qdst; // where the loader binds it (NULL when not binding)
    float **fdst;
};

#define CKPT_PREFIX "language_model."

// Fills specs (capacity cap) for geometry g; binds destinations into w when w != NULL.
// Returns the count.
int model_tensor_specs(const struct geometry *g, struct weights *w, struct tensor_spec *specs, int cap);
int model_tensor_spec_count(const struct geometry *g);

// Totals for reporting: parameters (logical weights) and bytes as stored.
struct model_size {
    int64_t params;
    int64_t bytes;
    int64_t n_tensors; // stored tensors (a quantized matrix is three)
};
struct model_size model_size_of(const struct geometry *g);
// Elements of a spec's logical shape (a quantized matrix: n_mat x rows x cols weights).
int64_t tensor_spec_elems(const struct tensor_spec *s);

// ---- per-sequence state (the one place its sizes are computed; both backends read them) -------

struct state_sizes {
    int n_attn, n_gdn;       // layers of each kind
    int64_t kv_row;          // elements one token adds to one attention layer's K (and to its V): n_kv_heads * head_dim
    int64_t conv_bytes;      // one DeltaNet layer's conv window, fp32 [conv_kernel - 1, conv_dim]
    int64_t recurrent_bytes; // one DeltaNet layer's recurrent state, fp32 [lin_v_heads, lin_k_dim, lin_v_dim]
    int64_t kv_bytes_per_token; // bf16 K and V of all attention layers
    int64_t gdn_bytes;          // conv window + recurrent state of all DeltaNet layers
};
struct state_sizes model_state_sizes(const struct geometry *g);
// One attention layer's K (or V) cache [n_kv_heads, cap, head_dim] at elem bytes an element.
static inline size_t state_kv_bytes(const struct state_sizes *s, int cap, size_t elem) {
    return (size_t)s->kv_row * (size_t)cap * elem;
}
