// backend_cuda.c: the CUDA backend (host side) for compute capability 9.0 (H100/H200), built with
// the binary's sm_90a code (warpgroup products); load refuses any other device.
//
// Load uploads every weight once, walking the model's tensor table (model_tensor_specs) into a
// device copy of struct weights, in the MLX layout as stored (4/8-bit codes, bf16 scales and
// biases; the small fp32 vectors as fp32). A forward chunk is a fixed sequence of kernel launches on
// one stream (src/cuda/kernels.h) with no host synchronisation until the argmax (and any wanted
// logits) are read back at its end. Activations are fp32, the KV cache is bf16 [n_kv_heads, cap,
// head_dim] per attention layer, and the DeltaNet state is fp32 on the device. MoE routing, top-k and
// expert dispatch happen on the device.
//
// Two modes, per engine (struct cuda_tuning, from engine_options.exact): fast (the default), every
// large product on the tensor cores with its input rounded once to bf16 and fp32 accumulation; and
// the verification mode, fp32-level products (hi + lo operands in prefill, fp32 CUDA-core products
// in decode), which the end-to-end checks against the CPU oracle use.
//
// Decode (one token, forward_chunk with T = 1): fused kernels (gemv.cu, moe.cu, deltanet.cu,
// attention.cu's decode kernels) that read the position from device memory, so the whole step is
// captured once per sequence as a CUDA graph and replayed: one H2D copy of (token, position), ~260
// kernels with programmatic dependent launch (each prefetches its weights into L2 before waiting on
// its predecessor), one D2H copy of the argmax. The tuning's eager and pdl (tests) launch the same
// kernels without the graph or without PDL.
//
// Prefill (T > 1, and the layer probe): cuda_layer per layer. Fast mode: each product's input is
// rounded once to bf16 and read by k_qmatmul_bf16 (the weights dequantized to bf16 as MLX does); the
// router and lm_head stay on the exact kernel, and the shared-expert gate's one row is an fp32 dot
// product in the post-attention norm (k_rmsnorm_gate). Where the input has a producer of its own, the
// producer writes the bf16 copy: both RMS norms write u and bf16(u) in one pass (u stays: the router
// and the shared-expert gate read it), the up product of each SwiGLU ends in the activation and
// writes bf16(silu(gate) up) straight into the down product's input (k_qmatmul_bf16_swiglu),
// FlashAttention writes only o's bf16 copy (o_proj's input), and the chunked DeltaNet's gated norm
// writes its output's; each bit-identical to k_to_bf16 (and k_swiglu) after the producer, without
// their fp32 round trips (the recurrent rule's output still goes through k_to_bf16). The DeltaNet
// layers run the chunked gated delta rule (gdn_chunked.cu) where the heads allow (this model's), else
// the token-by-token rule (the test geometries, or the tuning's gdn_recurrent). The products of one
// input run as one launch a group (mm_segs: in_qkv, in_z, in_b, in_a; q, k, v), each output its own
// buffer, bit-identical to a launch each: the small ones fill the grid of the large ones instead of
// paying a launch's fixed cost each. The o_proj / out_proj products add into the residual stream in
// their epilogue (bit-identical to the product, then k_add). A prefill chunk is the embedding,
// cuda_layer per layer, the head; the layer probe (engine_layer_probe) runs one cuda_layer on hidden
// states from the host.
#ifdef CALLA_CUDA

#include "backend_cuda.h"
#include "backend.h"

#include "cuda/kernels.h"
#include "cuda/pick.h"
#include "pick.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    LM_ROWS = 64,         // lm_head rows per pass (bounds the logits buffer)
    DEC_MAX_SPLITS = 256, // most key splits of the decode attention (sized by sequence capacity)
};

struct scratch {
    int T;                                  // tokens the buffers hold
    float *x, *u;                           // [T, H]
    float *qg, *kb, *vb, *q, *o;            // attention: [T, 2QD], [T, KVD] x2, [T, QD] x2
    float *xin, *y, *z, *bb, *aa, *og;      // DeltaNet: [T, C] x2, [T, VD], [T, Hv] x2, [T, VD]
    float *rl, *sg, *w, *eg, *eu, *ea, *ye; // MoE: [T, E], [T], [T, k], [T*k, I] x3, [T*k, H]
    float *sgt, *sup, *sact, *shout;        // shared expert: [T, S] x3, [T, H]
    int *ids, *slots;                       // [T, k]
    int32_t *tokens;                        // [T]
    int *rows;                              // [T + 1] wanted rows
    float *gdn_ws;                          // the chunked delta rule's workspace (NULL: recurrent)
    uint16_t *xh, *xa;                      // fast products' bf16 inputs: [T, max(H, QD, VD)], [T * max(S, k I)]
    int32_t *h_tokens;                      // pinned [T]
    int *h_rows;                            // pinned [T + 1]
};

// Decode scratch at fixed addresses (the captured graphs point at them).
struct dec_bufs {
    int *io, *h_io;                     // [2] token, position (device, pinned host)
    unsigned long long *best, *h_best;  // argmax key (device, pinned host)
    float *x, *u;                       // [H] residual, normalised input of the MoE
    float *y, *z, *bb, *aa, *og;        // DeltaNet: [C], [VD], [Hv] x2, [VD]
    float *qg, *kb, *vb, *q, *o, *part; // attention: [2QD], [KVD] x2, [QD] x2, partials
    float *rl, *sg, *w, *act;           // MoE: [E], [1], [k + 1], [k + 1, I]
    int *ids;                           // [k + 1]
};

// The buffers of a short forward of T <= DQ_MAXT tokens through the decode kernels (mt_enqueue),
// each [T, width] (token t's row at t * width).
struct mt_bufs {
    int *io, *h_io;                     // [2 DQ_MAXT] tokens, then positions (device, pinned host)
    unsigned long long *best;           // [T] every row's argmax key (a verification)
    float *x, *u;                       // [T, H]
    float *xin, *y, *z, *bb, *aa, *og;  // DeltaNet: [T, C] x2, [T, VD], [T, Hv] x2, [T, VD]
    float *qg, *kb, *vb, *q, *o, *part; // attention: [T, 2QD], [T, KVD] x2, [T, QD] x2, the partials
    float *rl, *sg, *w, *act;           // MoE: [T, E], [T], [T, k + 1], [T, k + 1, I]
    int *ids;                           // [T, k + 1]
    unsigned long long *h_best;         // [T] pinned: a verification's argmax keys (best: device)
    // A verification's way back (verify_keep), allocated at the first one: each DeltaNet layer's
    // conv window and state from before it, and the inputs of its conv and rule for every token
    // (the in-projection writes them there), so that the kept tokens' steps can be run again.
    bool saved;
    float *conv0[QWEN_LAYERS], *S0[QWEN_LAYERS];                    // [KW - 1, C], [Hv, Dk, Dv]
    float *sxin[QWEN_LAYERS], *sbb[QWEN_LAYERS], *saa[QWEN_LAYERS]; // [T, C], [T, Hv] x2
};

struct cuda_engine {
    cudaStream_t stream;
    struct weights w; // device copies, in the host's shape (bound by upload_weights)
    void **allocs;
    int n_allocs, cap_allocs;
    struct scratch sc;
    int *counts, *offs; // [E]
    float *hn, *logits; // [LM_ROWS, H], [LM_ROWS, V]
    int *d_next, *h_next;
    struct dec_bufs dec;
    struct mt_bufs mt;
    // The choice on the device (forward_pick): the mask's pinned staging and device copy, k_pick's
    // workspace and result (device, pinned), the host sampler's row and scratch, and where the
    // latest choice's row of logits lies (last_logits).
    uint32_t *h_mask, *d_mask; // [ceil(V / 32)]
    void *pick_ws;
    struct k_pick *d_pick, *h_pick;
    float *h_row, *h_scratch; // [V] each (the host sampler: NULL until needed)
    const float *last_row;
    struct cuda_tuning tuning;   // as the engine's user last set it (backend_cuda_tuning)
    struct cuda_tuning applied;  // what the scratch and the next launches follow (apply_tuning)
    int probe_stage, probe_reps; // backend_cuda_probe_stage: this stage's launches repeated (DS_NONE: none)
};

struct cuda_seq {
    uint16_t *k[QWEN_LAYERS], *v[QWEN_LAYERS]; // [n_kv, cap, D] bf16
    float *conv[QWEN_LAYERS];                  // [KW - 1, C]
    float *S[QWEN_LAYERS];                     // [Hv, Dk, Dv]
    cudaGraphExec_t graph;                     // the decode step, captured on first use
    bool graph_pdl, graph_exact;               // the tuning's pdl and exact_decode at capture
    int graph_stage, graph_reps;               // the stage probe's probe_stage, probe_reps at capture
};

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t ck_ = (call);                                                                                      \
        if (ck_ != cudaSuccess) {                                                                                      \
            snprintf(err, errlen, "CUDA error %s at %s:%d (%s)", cudaGetErrorString(ck_), __FILE__, __LINE__, #call);  \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)
#define KL(call)                                                                                                       \
    do {                                                                                                               \
        int kl_ = (call);                                                                                              \
        if (kl_) {                                                                                                     \
            snprintf(err, errlen, "kernel launch failed: %s at %s:%d (%s)", cudaGetErrorString((cudaError_t)kl_),      \
                     __FILE__, __LINE__, #call);                                                                       \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

static int cuda_available(int device, char *msg, size_t msglen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(msg, msglen, "no usable CUDA device (%s)", cudaGetErrorString(e));
        cudaGetLastError();
        return 0;
    }
    if (n < 1) {
        snprintf(msg, msglen, "no CUDA device found");
        return 0;
    }
    if (device < 0 || device >= n) {
        snprintf(msg, msglen, "GPU %d does not exist (%d CUDA device%s: 0..%d)", device, n, n == 1 ? "" : "s", n - 1);
        return 0;
    }
    struct cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        snprintf(msg, msglen, "cannot query CUDA device %d (%s)", device, cudaGetErrorString(e));
        return 0;
    }
    if (p.major != 9 || p.minor != 0) {
        snprintf(msg, msglen, "GPU %d (%s) has compute capability %d.%d; the CUDA backend needs 9.0 (H100/H200)",
                 device, p.name, p.major, p.minor);
        return 0;
    }
    snprintf(msg, msglen, "%s, compute capability 9.0, %d SMs, %.1f GiB", p.name, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1 << 30));
    return 1;
}

int backend_cuda_available(char *msg, size_t msglen) {
    return cuda_available(0, msg, msglen);
}

// ---- allocation ---------------------------------------------------------------------------

static void *dalloc(struct cuda_engine *ce, size_t bytes, char *err, size_t errlen) {
    void *p = NULL;
    if (ce->n_allocs == ce->cap_allocs) {
        int nc = ce->cap_allocs ? 2 * ce->cap_allocs : 256;
        void **na = realloc(ce->allocs, sizeof *na * (size_t)nc);
        if (!na) {
            snprintf(err, errlen, "out of host memory");
            return NULL;
        }
        ce->allocs = na;
        ce->cap_allocs = nc;
    }
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    ce->allocs[ce->n_allocs++] = p;
    return p;
}

enum { UPLOAD_SLICE = 64 << 20 }; // bytes copied (and their host pages released) at a time

// Copies bytes from the mapped checkpoint (any alignment: cudaMemcpy stages pageable memory itself,
// so there is no host copy) into a new device buffer, a slice at a time, dropping each slice's
// pages after its copy so host RSS stays near one slice, not the checkpoint.
static int upload(struct cuda_engine *ce, const void *src, size_t bytes, void **dst, struct engine *e, char *err,
                  size_t errlen) {
    *dst = dalloc(ce, bytes, err, errlen);
    if (!*dst) return -1;
    for (size_t o = 0; o < bytes; o += UPLOAD_SLICE) {
        const size_t n = bytes - o < UPLOAD_SLICE ? bytes - o : UPLOAD_SLICE;
        cudaError_t r = cudaMemcpy((char *)*dst + o, (const char *)src + o, n, cudaMemcpyHostToDevice);
        if (r != cudaSuccess) {
            snprintf(err, errlen, "upload of %zu bytes failed: %s", bytes, cudaGetErrorString(r));
            return -1;
        }
        checkpoint_release(&e->model, (const char *)src + o, n); // done: synchronous from pageable memory
    }
    e->weight_bytes += (int64_t)bytes;
    return 0;
}

// Uploads every tensor of the table (model_tensor_specs) and binds its device copy into ce->w:
// the table is bound twice, once into the host weights and once into ce->w, so entry i of both
// is the same tensor (checked by name) and the walk needs no list of its own.
static int upload_weights(struct engine *e, char *err, size_t errlen) {
    struct cuda_engine *ce = e->impl;
    const struct geometry *g = &e->model.g;
    const int n = model_tensor_spec_count(g);
    struct tensor_spec *host = malloc(sizeof *host * 2 * (size_t)n), *dev = host + n;
    int rc = -1;
    if (!host) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    model_tensor_specs(g, &e->model.w, host, n);
    model_tensor_specs(g, &ce->w, dev, n);
    for (int i = 0; i < n; i++) {
        if (strcmp(host[i].name, dev[i].name)) {
            snprintf(err, errlen, "tensor table mismatch at %d: %s vs %s", i, host[i].name, dev[i].name);
            goto out;
        }
        if (host[i].role == ROLE_QUANT) {
            const struct qtensor *h = host[i].qdst;
            struct qtensor *d = dev[i].qdst;
            const size_t rows = (size_t)h->n_mat * h->rows;
            void *w, *sc, *b;
            if (upload(ce, h->w, rows * qt_words_per_row(h) * 4, &w, e, err, errlen) ||
                upload(ce, h->scales, rows * qt_groups_per_row(h) * 2, &sc, e, err, errlen) ||
                upload(ce, h->biases, rows * qt_groups_per_row(h) * 2, &b, e, err, errlen))
                goto out;
            *d = *h;
            d->w = w, d->scales = sc, d->biases = b;
        } else {
            void *f;
            if (upload(ce, *host[i].fdst, sizeof(float) * (size_t)tensor_spec_elems(&host[i]), &f, e, err, errlen))
                goto out;
            *dev[i].fdst = f;
        }
    }
    rc = 0;
out:
    free(host);
    return rc;
}

// The kernels' view of a device matrix.
static struct dqt dq(const struct qtensor *t) {
    return (struct dqt){.w = t->w,
                        .scales = t->scales,
                        .biases = t->biases,
                        .n_mat = t->n_mat,
                        .rows = t->rows,
                        .cols = t->cols,
                        .bits = t->bits};
}

static void free_scratch(struct scratch *s) {
    float **f[] = {&s->x,  &s->u,  &s->qg, &s->kb, &s->vb,  &s->q,   &s->o,    &s->xin,
                   &s->y,  &s->z,  &s->bb, &s->aa, &s->og,  &s->rl,  &s->sg,   &s->w,
                   &s->eg, &s->eu, &s->ea, &s->ye, &s->sgt, &s->sup, &s->sact, &s->shout};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        cudaFree(*f[i]);
        *f[i] = NULL;
    }
    cudaFree(s->ids);
    cudaFree(s->slots);
    cudaFree(s->gdn_ws);
    cudaFree(s->xh);
    cudaFree(s->xa);
    cudaFree(s->tokens);
    cudaFree(s->rows);
    cudaFreeHost(s->h_tokens);
    cudaFreeHost(s->h_rows);
    memset(s, 0, sizeof *s);
}

// The chunked delta rule (src/cuda/gdn_chunked.cu) is built for this model's head size (128); the
// test geometries, and the tuning's gdn_recurrent, run the token-by-token recurrence (8x slower on a
// 4K chunk), whose results do not depend on where a prompt is cut (the chunked rule's differ by
// rounding).
static int gdn_chunked_fits(const struct geometry *g, const struct cuda_tuning *t) {
    return g->lin_k_dim == 128 && g->lin_v_dim == 128 && !t->gdn_recurrent;
}

// Scratch for chunks of up to T tokens (grows; never shrinks).
static int ensure_scratch(struct engine *e, int T, char *err, size_t errlen) {
    struct cuda_engine *ce = e->impl;
    struct scratch *s = &ce->sc;
    if (s->T >= T) return 0;
    const struct geometry *g = &e->model.g;
    cudaStreamSynchronize(ce->stream);
    free_scratch(s);
    const size_t t = (size_t)T, H = g->hidden, QD = geom_q_dim(g), KVD = geom_kv_dim(g), C = geom_conv_dim(g),
                 VD = geom_lin_value_dim(g), Hv = g->lin_v_heads, E = g->n_experts, K = g->n_experts_used,
                 I = g->moe_inter, S = g->shared_inter;
    struct {
        void **p;
        size_t bytes;
    } a[] = {
        {(void **)&s->x, t * H * 4},      {(void **)&s->u, t * H * 4},      {(void **)&s->qg, t * 2 * QD * 4},
        {(void **)&s->kb, t * KVD * 4},   {(void **)&s->vb, t * KVD * 4},   {(void **)&s->q, t * QD * 4},
        {(void **)&s->o, t * QD * 4},     {(void **)&s->xin, t * C * 4},    {(void **)&s->y, t * C * 4},
        {(void **)&s->z, t * VD * 4},     {(void **)&s->bb, t * Hv * 4},    {(void **)&s->aa, t * Hv * 4},
        {(void **)&s->og, t * VD * 4},    {(void **)&s->rl, t * E * 4},     {(void **)&s->sg, t * 4},
        {(void **)&s->w, t * K * 4},      {(void **)&s->eg, t * K * I * 4}, {(void **)&s->eu, t * K * I * 4},
        {(void **)&s->ea, t * K * I * 4}, {(void **)&s->ye, t * K * H * 4}, {(void **)&s->sgt, t * S * 4},
        {(void **)&s->sup, t * S * 4},    {(void **)&s->sact, t * S * 4},   {(void **)&s->shout, t * H * 4},
        {(void **)&s->ids, t * K * 4},    {(void **)&s->slots, t * K * 4},  {(void **)&s->tokens, t * 4},
        {(void **)&s->rows, (t + 1) * 4},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        cudaError_t r = cudaMalloc(a[i].p, a[i].bytes);
        if (r != cudaSuccess) {
            snprintf(err, errlen, "cudaMalloc of %zu bytes of scratch for %d tokens failed: %s", a[i].bytes, T,
                     cudaGetErrorString(r));
            cudaGetLastError();
            free_scratch(s);
            return -1;
        }
    }
    if (gdn_chunked_fits(g, &ce->applied) && T > 1) {
        const size_t bytes = (size_t)k_gdn_chunked_ws_floats(T, g->lin_v_heads, g->lin_k_dim) * sizeof(float);
        if (cudaMalloc((void **)&s->gdn_ws, bytes) != cudaSuccess) {
            snprintf(err, errlen, "cudaMalloc of %zu bytes of DeltaNet workspace for %d tokens failed", bytes, T);
            cudaGetLastError();
            free_scratch(s);
            return -1;
        }
    }
    if (!ce->applied.exact_prefill && T > 1) { // the fast products' bf16 inputs
        const size_t w = H > QD ? (H > VD ? H : VD) : (QD > VD ? QD : VD), a2 = S > K * I ? S : K * I;
        if (cudaMalloc((void **)&s->xh, t * w * 2) != cudaSuccess ||
            cudaMalloc((void **)&s->xa, t * a2 * 2) != cudaSuccess) {
            snprintf(err, errlen, "cudaMalloc of the bf16 product inputs for %d tokens failed", T);
            cudaGetLastError();
            free_scratch(s);
            return -1;
        }
    }
    if (cudaMallocHost((void **)&s->h_tokens, t * 4) != cudaSuccess ||
        cudaMallocHost((void **)&s->h_rows, (t + 1) * 4) != cudaSuccess) {
        snprintf(err, errlen, "cudaMallocHost failed");
        cudaGetLastError();
        free_scratch(s);
        return -1;
    }
    s->T = T;
    return 0;
}

// ---- load / unload ------------------------------------------------------------------------

static int dec_alloc(struct engine *e, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    struct dec_bufs *d = &ce->dec;
    const size_t H = g->hidden, C = geom_conv_dim(g), VD = geom_lin_value_dim(g), Hv = g->lin_v_heads,
                 QD = geom_q_dim(g), KVD = geom_kv_dim(g), E = g->n_experts, K1 = g->n_experts_used + 1,
                 I = g->moe_inter, D = g->head_dim;
    struct {
        void **p;
        size_t bytes;
    } a[] = {
        {(void **)&d->io, 8},       {(void **)&d->best, 8},
        {(void **)&d->x, H * 4},    {(void **)&d->u, H * 4},
        {(void **)&d->y, C * 4},    {(void **)&d->z, VD * 4},
        {(void **)&d->bb, Hv * 4},  {(void **)&d->aa, Hv * 4},
        {(void **)&d->og, VD * 4},  {(void **)&d->qg, 2 * QD * 4},
        {(void **)&d->kb, KVD * 4}, {(void **)&d->vb, KVD * 4},
        {(void **)&d->q, QD * 4},   {(void **)&d->o, QD * 4},
        {(void **)&d->rl, E * 4},   {(void **)&d->sg, 4},
        {(void **)&d->w, K1 * 4},   {(void **)&d->act, K1 * I * 4},
        {(void **)&d->ids, K1 * 4}, {(void **)&d->part, (size_t)g->n_heads * DEC_MAX_SPLITS * (D + 2) * 4},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if (!(*a[i].p = dalloc(ce, a[i].bytes, err, errlen))) return -1;
    if (cudaMallocHost((void **)&d->h_io, 8) != cudaSuccess || cudaMallocHost((void **)&d->h_best, 8) != cudaSuccess) {
        snprintf(err, errlen, "cudaMallocHost failed");
        cudaGetLastError();
        return -1;
    }
    return 0;
}

static int mt_alloc(struct engine *e, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    struct mt_bufs *m = &ce->mt;
    const size_t T = DQ_MAXT, H = g->hidden, C = geom_conv_dim(g), VD = geom_lin_value_dim(g), Hv = g->lin_v_heads,
                 QD = geom_q_dim(g), KVD = geom_kv_dim(g), E = g->n_experts, K1 = g->n_experts_used + 1,
                 I = g->moe_inter;
    struct {
        void **p;
        size_t bytes;
    } a[] = {
        {(void **)&m->io, 2 * T * 4},
        {(void **)&m->best, 8},
        {(void **)&m->x, T * H * 4},
        {(void **)&m->u, T * H * 4},
        {(void **)&m->xin, T * C * 4},
        {(void **)&m->y, T * C * 4},
        {(void **)&m->z, T * VD * 4},
        {(void **)&m->bb, T * Hv * 4},
        {(void **)&m->aa, T * Hv * 4},
        {(void **)&m->og, T * VD * 4},
        {(void **)&m->qg, T * 2 * QD * 4},
        {(void **)&m->kb, T * KVD * 4},
        {(void **)&m->vb, T * KVD * 4},
        {(void **)&m->q, T * QD * 4},
        {(void **)&m->o, T * QD * 4},
        {(void **)&m->rl, T * E * 4},
        {(void **)&m->sg, T * 4},
        {(void **)&m->w, T * K1 * 4},
        {(void **)&m->act, T * K1 * I * 4},
        {(void **)&m->ids, T * K1 * 4},
        {(void **)&m->best, T * 8},
        {(void **)&m->part, T * g->n_heads * DEC_MAX_SPLITS * (g->head_dim + 2) * 4},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if (!(*a[i].p = dalloc(ce, a[i].bytes, err, errlen))) return -1;
    if (cudaMallocHost((void **)&m->h_io, 2 * T * 4) != cudaSuccess ||
        cudaMallocHost((void **)&m->h_best, T * 8) != cudaSuccess) {
        snprintf(err, errlen, "cudaMallocHost failed");
        cudaGetLastError();
        return -1;
    }
    return 0;
}

static void cuda_unload(struct engine *e) {
    struct cuda_engine *ce = e->impl;
    if (!ce) return;
    if (ce->stream) cudaStreamSynchronize(ce->stream);
    for (int i = 0; i < ce->n_allocs; i++) cudaFree(ce->allocs[i]);
    free(ce->allocs);
    free_scratch(&ce->sc);
    cudaFreeHost(ce->h_next);
    cudaFreeHost(ce->h_mask);
    cudaFreeHost(ce->h_pick);
    cudaFreeHost(ce->h_row);
    free(ce->h_scratch);
    cudaFreeHost(ce->dec.h_io);
    cudaFreeHost(ce->mt.h_io);
    cudaFreeHost(ce->dec.h_best);
    if (ce->stream) cudaStreamDestroy(ce->stream);
    free(ce);
    e->impl = NULL;
}

static int cuda_load(struct engine *e, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = calloc(1, sizeof *ce);
    if (!ce) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    e->impl = ce;
    e->weight_bytes = 0;
    CK(cudaSetDevice(e->opts.device));
    CK(cudaStreamCreateWithFlags(&ce->stream, cudaStreamNonBlocking));
    const size_t H = g->hidden;
    if (upload_weights(e, err, errlen)) goto fail_msg;
    if (!(ce->counts = dalloc(ce, (size_t)g->n_experts * 4, err, errlen)) ||
        !(ce->offs = dalloc(ce, (size_t)g->n_experts * 4, err, errlen)) ||
        !(ce->hn = dalloc(ce, (size_t)LM_ROWS * H * 4, err, errlen)) ||
        !(ce->logits = dalloc(ce, (size_t)LM_ROWS * g->vocab * 4, err, errlen)) ||
        !(ce->d_next = dalloc(ce, 4, err, errlen)))
        goto fail_msg;
    CK(cudaMallocHost((void **)&ce->h_next, 4));
    const size_t mask_bytes = 4 * (((size_t)g->vocab + 31) / 32);
    if (!(ce->d_mask = dalloc(ce, mask_bytes, err, errlen)) ||
        !(ce->pick_ws = dalloc(ce, k_pick_ws_bytes(), err, errlen)) ||
        !(ce->d_pick = dalloc(ce, sizeof(struct k_pick), err, errlen)))
        goto fail_msg;
    CK(cudaMemset(ce->pick_ws, 0, k_pick_ws_bytes()));
    CK(cudaMallocHost((void **)&ce->h_mask, mask_bytes));
    CK(cudaMallocHost((void **)&ce->h_pick, sizeof(struct k_pick)));
    if (dec_alloc(e, err, errlen) || mt_alloc(e, err, errlen)) goto fail_msg;
    // The fast mode unless the engine was opened exact (engine_options.exact): tensor-core products
    // on bf16 activations with fp32 accumulation, or the verification mode's fp32-level products.
    ce->tuning = (struct cuda_tuning){.exact_prefill = e->opts.exact, .exact_decode = e->opts.exact, .pdl = true};
    ce->applied = ce->tuning;
    if (!k_has_sm90a()) { // the fast mode's attention and products run on warpgroup products
        snprintf(err, errlen, "GPU %d does not run this binary's sm_90a code (wgmma), which the CUDA backend needs",
                 e->opts.device);
        goto fail_msg;
    }
    if (ensure_scratch(e, 1, err, errlen)) goto fail_msg;
    CK(cudaDeviceSynchronize());
    return 0;
fail:
fail_msg:
    cuda_unload(e);
    return -1;
}

// ---- sequences ----------------------------------------------------------------------------

static void cuda_seq_release(struct seq *s) {
    struct cuda_seq *cs = s->impl;
    if (!cs) return;
    if (cs->graph) cudaGraphExecDestroy(cs->graph);
    for (int i = 0; i < QWEN_LAYERS; i++) {
        cudaFree(cs->k[i]);
        cudaFree(cs->v[i]);
        cudaFree(cs->conv[i]);
        cudaFree(cs->S[i]);
    }
    free(cs);
    s->impl = NULL;
}

static void cuda_seq_clear(struct seq *s) {
    const struct geometry *g = &s->e->model.g;
    const struct state_sizes *z = &s->e->model.state;
    struct cuda_engine *ce = s->e->impl;
    struct cuda_seq *cs = s->impl;
    for (int i = 0; i < g->n_layers; i++)
        if (!geom_is_attn(g, i)) {
            cudaMemsetAsync(cs->conv[i], 0, (size_t)z->conv_bytes, ce->stream);
            cudaMemsetAsync(cs->S[i], 0, (size_t)z->recurrent_bytes, ce->stream);
        }
    cudaStreamSynchronize(ce->stream);
}

static int cuda_seq_alloc(struct engine *e, struct seq *s, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    const struct state_sizes *z = &e->model.state;
    struct cuda_seq *cs = calloc(1, sizeof *cs);
    if (!cs) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->impl = cs;
    for (int i = 0; i < g->n_layers; i++) {
        if (geom_is_attn(g, i)) {
            CK(cudaMalloc((void **)&cs->k[i], state_kv_bytes(z, s->cap, 2)));
            CK(cudaMalloc((void **)&cs->v[i], state_kv_bytes(z, s->cap, 2)));
        } else {
            CK(cudaMalloc((void **)&cs->conv[i], (size_t)z->conv_bytes));
            CK(cudaMalloc((void **)&cs->S[i], (size_t)z->recurrent_bytes));
        }
    }
    cuda_seq_clear(s);
    return 0;
fail:
    cudaGetLastError();
    cuda_seq_release(s);
    {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", err);
        snprintf(err, errlen, "cannot allocate a %d-token sequence on the GPU: %s", s->cap, tmp);
    }
    return -1;
}

static int cuda_seq_copy(struct seq *dst, const struct seq *src, char *err, size_t errlen) {
    const struct geometry *g = &src->e->model.g;
    const struct state_sizes *z = &src->e->model.state;
    struct cuda_engine *ce = src->e->impl;
    struct cuda_seq *d = dst->impl;
    const struct cuda_seq *sc = src->impl;
    const size_t D = g->head_dim;
    for (int i = 0; i < g->n_layers; i++) {
        if (geom_is_attn(g, i)) {
            CK(cudaMemcpy2DAsync(d->k[i], (size_t)dst->cap * D * 2, sc->k[i], (size_t)src->cap * D * 2,
                                 (size_t)src->pos * D * 2, g->n_kv_heads, cudaMemcpyDeviceToDevice, ce->stream));
            CK(cudaMemcpy2DAsync(d->v[i], (size_t)dst->cap * D * 2, sc->v[i], (size_t)src->cap * D * 2,
                                 (size_t)src->pos * D * 2, g->n_kv_heads, cudaMemcpyDeviceToDevice, ce->stream));
        } else {
            CK(cudaMemcpyAsync(d->conv[i], sc->conv[i], (size_t)z->conv_bytes, cudaMemcpyDeviceToDevice, ce->stream));
            CK(cudaMemcpyAsync(d->S[i], sc->S[i], (size_t)z->recurrent_bytes, cudaMemcpyDeviceToDevice, ce->stream));
        }
    }
    CK(cudaStreamSynchronize(ce->stream));
    return 0;
fail:
    return -1;
}

// ---- forward ------------------------------------------------------------------------------

// y [T, W.rows] = x [T, W.cols] W^T
static int mm(const struct qtensor *W, const float *x, int T, float *y, void *st) {
    return k_qmatmul(dq(W), x, W->cols, NULL, 1, y, W->rows, NULL, T, NULL, NULL, 0, st);
}
// The same from the bf16 copy xb of x when there is one (the fast prefill products), else mm.
static int mmb(const struct qtensor *W, const float *x, const uint16_t *xb, int T, float *y, void *st) {
    if (!xb) return mm(W, x, T, y, st);
    return k_qmatmul_bf16(dq(W), xb, W->cols, NULL, 1, y, W->rows, NULL, T, NULL, NULL, 0, st);
}
// y [T, W.rows] += x [T, W.cols] W^T (from xb when there is one, as mmb): the residual add in the
// product's epilogue (k_qmatmul_bf16_add, k_qmatmul_add), bit-identical to mmb into a buffer, then k_add.
static int mmb_add(const struct qtensor *W, const float *x, const uint16_t *xb, int T, float *y, void *st) {
    if (xb) return k_qmatmul_bf16_add(dq(W), xb, W->cols, y, W->rows, T, st);
    return k_qmatmul_add(dq(W), x, W->cols, y, W->rows, T, st);
}
// The products of one input x (its bf16 copy xb when there is one), y[i] [T, W[i]->rows] = x W[i]^T, in
// one launch when they share K and bits (k_qmatmul_bf16_segs on xb, else k_qmatmul_segs on x):
// bit-identical to mmb on each, without a launch's fixed cost per product. Else (another K or bits)
// one mmb each.
static int mm_segs(const struct qtensor *const *W, float *const *y, int n, const float *x, const uint16_t *xb, int T,
                   void *st) {
    int one = n <= QM_MAX_SEGS;
    for (int i = 1; i < n; i++) one = one && W[i]->cols == W[0]->cols && W[i]->bits == W[0]->bits;
    if (!one) {
        for (int i = 0; i < n; i++) {
            const int rc = mmb(W[i], x, xb, T, y[i], st);
            if (rc) return rc;
        }
        return 0;
    }
    struct qm_seg seg[QM_MAX_SEGS];
    for (int i = 0; i < n; i++) seg[i] = (struct qm_seg){dq(W[i]), y[i], W[i]->rows};
    return xb ? k_qmatmul_bf16_segs(seg, n, xb, W[0]->cols, T, st) : k_qmatmul_segs(seg, n, x, W[0]->cols, T, st);
}
// xb = bf16(x) [n] when fast, and the copy to read (NULL: the exact products on x).
static uint16_t *to_bf16(int fast, const float *x, uint16_t *xb, long n, void *st, int *rc) {
    if (!fast) return NULL;
    *rc = k_to_bf16(x, xb, n, st);
    return xb;
}

// ---- decode -----------------------------------------------------------------------------------

// Layer L's MoE for the decode kernels: its router logits rl, shared-expert logit sg and normed
// input u in, the experts' activations act, ids and weights w as scratch, the residual x updated.
static struct dv_moe layer_moe(const struct geometry *g, const struct layer_weights *L, const float *rl,
                               const float *sg, const float *u, float *act, int *ids, float *w, float *x) {
    return (struct dv_moe){.logits = rl,
                           .shared_logit = sg,
                           .u = u,
                           .gate = dq(&L->ex_gate),
                           .up = dq(&L->ex_up),
                           .down = dq(&L->ex_down),
                           .sgate = dq(&L->se_gate),
                           .sup = dq(&L->se_up),
                           .sdown = dq(&L->se_down),
                           .E = g->n_experts,
                           .k = g->n_experts_used,
                           .H = g->hidden,
                           .I = g->moe_inter,
                           .act = act,
                           .ids = ids,
                           .w = w,
                           .x = x};
}

static int dec_splits(const struct geometry *g, int cap) {
    return k_dec_attn_splits(cap, g->n_heads, g->n_kv_heads, g->head_dim, DEC_MAX_SPLITS);
}

// Enqueues one decode step of sequence s on the engine's stream: reads (token, position) from
// dec.h_io, leaves the argmax key in dec.h_best and the logits in ce->logits row 0.
static int dec_enqueue(struct engine *e, struct seq *s, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    struct cuda_seq *cs = s->impl;
    struct dec_bufs *d = &ce->dec;
    const struct dec_launch dl = {.stream = ce->stream, .pdl = ce->applied.pdl, .exact = ce->applied.exact_decode},
                            *st = &dl;
    const int H = g->hidden, D = g->head_dim;
    const float eps = (float)g->rms_eps;
    const int pf = dl.pdl; // with PDL the GEMVs prefetch their weights into L2 before the wait
// The launches of stage sg, probe_reps times when the stage probe names it (backend_cuda_probe_stage).
#define STAGE(sg, call)                                                                                                \
    for (int rep_ = 0; rep_ < (ce->probe_stage == (sg) ? ce->probe_reps : 1); rep_++) KL(call)
    CK(cudaMemcpyAsync(d->io, d->h_io, 8, cudaMemcpyHostToDevice, ce->stream));
    KL(k_dv_embed(dq(&ce->w.embed), d->io, d->x, d->best, st));
    for (int i = 0; i < g->n_layers; i++) {
        const struct layer_weights *L = &ce->w.layers[i];
        struct dv_desc in = {
            .x = d->x, .K = H, .in_mode = DV_IN_RMS, .norm_w = L->input_norm, .eps = eps, .prefetch = pf};
        if (geom_is_attn(g, i)) {
            in.seg[0] = (struct dv_seg){dq(&L->q_proj), d->qg, DV_OUT_STORE};
            in.seg[1] = (struct dv_seg){dq(&L->k_proj), d->kb, DV_OUT_STORE};
            in.seg[2] = (struct dv_seg){dq(&L->v_proj), d->vb, DV_OUT_STORE};
            in.n_seg = 3;
            STAGE(DS_ATTN_IN, k_dv(&in, st));
            STAGE(DS_ATTN_PREP,
                  k_dec_attn_prep(d->qg, d->kb, d->vb, L->q_norm, L->k_norm, d->q, cs->k[i], cs->v[i], d->io + 1, 1,
                                  s->cap, g->n_heads, g->n_kv_heads, D, g->rope_dim, g->rope_theta, eps, st));
            STAGE(DS_ATTN, k_dec_attention(d->q, d->qg, cs->k[i], cs->v[i], d->o, d->part, d->io + 1, 1,
                                           dec_splits(g, s->cap), s->cap, g->n_heads, g->n_kv_heads, D, st));
            struct dv_desc out = {.x = d->o, .K = geom_q_dim(g), .in_mode = DV_IN_PLAIN, .prefetch = pf, .n_seg = 1};
            out.seg[0] = (struct dv_seg){dq(&L->o_proj), d->x, DV_OUT_ADD};
            STAGE(DS_ATTN_OUT, k_dv(&out, st));
        } else {
            in.seg[0] = (struct dv_seg){dq(&L->in_qkv), d->y, DV_OUT_CONV};
            in.seg[1] = (struct dv_seg){dq(&L->in_z), d->z, DV_OUT_STORE};
            in.seg[2] = (struct dv_seg){dq(&L->in_b), d->bb, DV_OUT_STORE};
            in.seg[3] = (struct dv_seg){dq(&L->in_a), d->aa, DV_OUT_STORE};
            in.n_seg = 4;
            in.conv_w = L->conv_w;
            in.conv_state = cs->conv[i];
            in.C = geom_conv_dim(g);
            in.KW = g->conv_kernel;
            STAGE(DS_GDN_IN, k_dv(&in, st));
            STAGE(DS_GDN, k_dv_gdn(d->y, d->bb, d->aa, L->A_log, L->dt_bias, cs->S[i], d->z, L->gdn_norm, eps, d->og,
                                   g->lin_k_heads, g->lin_v_heads, g->lin_k_dim, g->lin_v_dim, st));
            struct dv_desc out = {
                .x = d->og, .K = geom_lin_value_dim(g), .in_mode = DV_IN_PLAIN, .prefetch = pf, .n_seg = 1};
            out.seg[0] = (struct dv_seg){dq(&L->out_proj), d->x, DV_OUT_ADD};
            STAGE(DS_GDN_OUT, k_dv(&out, st));
        }
        struct dv_desc r = {.x = d->x,
                            .K = H,
                            .in_mode = DV_IN_RMS,
                            .norm_w = L->post_norm,
                            .eps = eps,
                            .x_out = d->u,
                            .prefetch = pf,
                            .n_seg = 2};
        r.seg[0] = (struct dv_seg){dq(&L->router), d->rl, DV_OUT_STORE};
        r.seg[1] = (struct dv_seg){dq(&L->shared_gate), d->sg, DV_OUT_STORE};
        STAGE(DS_ROUTER, k_dv(&r, st));
        const struct dv_moe m = layer_moe(g, L, d->rl, d->sg, d->u, d->act, d->ids, d->w, d->x);
        STAGE(DS_GATEUP, k_dv_moe_gateup(&m, st));
        STAGE(DS_DOWN, k_dv_moe_down(&m, st));
    }
    struct dv_desc lm = {.x = d->x,
                         .K = H,
                         .in_mode = DV_IN_RMS,
                         .norm_w = ce->w.final_norm,
                         .eps = eps,
                         .best = d->best,
                         .prefetch = 0,
                         .n_seg = 1}; // (its 286 MB do not fit in L2)
    lm.seg[0] = (struct dv_seg){dq(&ce->w.lm_head), ce->logits, DV_OUT_ARGMAX};
    STAGE(DS_LM, k_dv(&lm, st));
#undef STAGE
    CK(cudaMemcpyAsync(d->h_best, d->best, 8, cudaMemcpyDeviceToHost, ce->stream));
    return 0;
fail:
    return -1;
}

// Whether a forward of 2 .. DQ_MAXT tokens can run through the decode kernels (mt_enqueue): fast
// mode, the model's shapes (the multi-token kernels' K splits, 256 experts, k = 8).
static bool mt_fits(const struct engine *e, const struct cuda_tuning *t) {
    const struct geometry *g = &e->model.g;
    return !t->exact_prefill && !t->exact_decode && g->hidden % (4 * 256) == 0 && geom_q_dim(g) % 256 == 0 &&
           geom_lin_value_dim(g) % 256 == 0 && g->moe_inter % 256 == 0 && g->n_experts == 256 &&
           g->n_experts_used == 8 && g->lin_k_dim == 128 && g->lin_v_dim == 128;
}

// Enqueues a forward of tokens[0..T) (2 <= T <= DQ_MAXT) at s's position through the decode kernels
// in their several-token forms: every weight read once for the T tokens (the experts once for the
// tokens that chose them), the DeltaNet conv and rule token by token (k_gdn_conv, k_gdn_recurrent),
// the attention of every token at its own position in one launch. Plain: the last row's logits land
// in ce->logits row 0 and its argmax key in dec.h_best once the stream is through. verify: every
// row's logits (ce->logits rows 0..T-1) and argmax key (mt.h_best), the DeltaNet inputs kept in
// mt.sxin / sbb / saa for verify_keep.
static int mt_enqueue(struct engine *e, struct seq *s, const int32_t *tokens, int T, bool verify, char *err,
                      size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    struct cuda_seq *cs = s->impl;
    struct mt_bufs *m = &ce->mt;
    const struct dec_launch dl = {.stream = ce->stream, .pdl = ce->applied.pdl, .exact = false}, *st = &dl;
    void *stream = ce->stream;
    const int H = g->hidden, D = g->head_dim, QD = geom_q_dim(g);
    const int C = geom_conv_dim(g), VD = geom_lin_value_dim(g), Hv = g->lin_v_heads;
    const float eps = (float)g->rms_eps;
    for (int t = 0; t < T; t++) m->h_io[t] = tokens[t], m->h_io[DQ_MAXT + t] = s->pos + t;
    CK(cudaMemcpyAsync(m->io, m->h_io, sizeof(int) * 2 * DQ_MAXT, cudaMemcpyHostToDevice, stream));
    const int *pos = m->io + DQ_MAXT;
    KL(k_embed(dq(&ce->w.embed), m->io, T, m->x, stream));
    for (int i = 0; i < g->n_layers; i++) {
        const struct layer_weights *L = &ce->w.layers[i];
        struct dq_desc in = {
            .d = {.x = m->x, .K = H, .in_mode = DV_IN_RMS, .norm_w = L->input_norm, .eps = eps}, .T = T, .ldx = H};
        if (geom_is_attn(g, i)) {
            in.d.seg[0] = (struct dv_seg){dq(&L->q_proj), m->qg, DV_OUT_STORE};
            in.d.seg[1] = (struct dv_seg){dq(&L->k_proj), m->kb, DV_OUT_STORE};
            in.d.seg[2] = (struct dv_seg){dq(&L->v_proj), m->vb, DV_OUT_STORE};
            in.d.n_seg = 3;
            KL(k_dvq(&in, st));
            KL(k_dec_attn_prep(m->qg, m->kb, m->vb, L->q_norm, L->k_norm, m->q, cs->k[i], cs->v[i], pos, T, s->cap,
                               g->n_heads, g->n_kv_heads, D, g->rope_dim, g->rope_theta, eps, st));
            KL(k_dec_attention(m->q, m->qg, cs->k[i], cs->v[i], m->o, m->part, pos, T, dec_splits(g, s->cap), s->cap,
                               g->n_heads, g->n_kv_heads, D, st));
            struct dq_desc out = {.d = {.x = m->o, .K = QD, .in_mode = DV_IN_PLAIN, .n_seg = 1}, .T = T, .ldx = QD};
            out.d.seg[0] = (struct dv_seg){dq(&L->o_proj), m->x, DV_OUT_ADD};
            KL(k_dvq(&out, st));
        } else {
            float *xin = verify ? m->sxin[i] : m->xin, *bb = verify ? m->sbb[i] : m->bb,
                  *aa = verify ? m->saa[i] : m->aa;
            in.d.seg[0] = (struct dv_seg){dq(&L->in_qkv), xin, DV_OUT_STORE};
            in.d.seg[1] = (struct dv_seg){dq(&L->in_z), m->z, DV_OUT_STORE};
            in.d.seg[2] = (struct dv_seg){dq(&L->in_b), bb, DV_OUT_STORE};
            in.d.seg[3] = (struct dv_seg){dq(&L->in_a), aa, DV_OUT_STORE};
            in.d.n_seg = 4;
            KL(k_dvq(&in, st));
            KL(k_gdn_conv(xin, cs->conv[i], L->conv_w, m->y, T, C, g->conv_kernel, g->lin_k_heads, g->lin_k_dim,
                          stream));
            KL(k_gdn_recurrent(m->y, bb, aa, m->z, L->A_log, L->dt_bias, L->gdn_norm, cs->S[i], m->og, T,
                               g->lin_k_heads, Hv, g->lin_k_dim, g->lin_v_dim, eps, stream));
            struct dq_desc out = {.d = {.x = m->og, .K = VD, .in_mode = DV_IN_PLAIN, .n_seg = 1}, .T = T, .ldx = VD};
            out.d.seg[0] = (struct dv_seg){dq(&L->out_proj), m->x, DV_OUT_ADD};
            KL(k_dvq(&out, st));
        }
        struct dq_desc r = {.d = {.x = m->x,
                                  .K = H,
                                  .in_mode = DV_IN_RMS,
                                  .norm_w = L->post_norm,
                                  .eps = eps,
                                  .x_out = m->u,
                                  .n_seg = 2},
                            .T = T,
                            .ldx = H};
        r.d.seg[0] = (struct dv_seg){dq(&L->router), m->rl, DV_OUT_STORE};
        r.d.seg[1] = (struct dv_seg){dq(&L->shared_gate), m->sg, DV_OUT_STORE};
        KL(k_dvq(&r, st));
        const struct dq_moe mo = {.m = layer_moe(g, L, m->rl, m->sg, m->u, m->act, m->ids, m->w, m->x), .T = T};
        KL(k_dvq_moe_gateup(&mo, st));
        KL(k_dvq_moe_down(&mo, st));
    }
    if (verify) {
        CK(cudaMemsetAsync(m->best, 0, sizeof *m->best * (size_t)T, stream));
        struct dq_desc lm = {.d = {.x = m->x,
                                   .K = H,
                                   .in_mode = DV_IN_RMS,
                                   .norm_w = ce->w.final_norm,
                                   .eps = eps,
                                   .best = m->best,
                                   .n_seg = 1},
                             .T = T,
                             .ldx = H};
        lm.d.seg[0] = (struct dv_seg){dq(&ce->w.lm_head), ce->logits, DV_OUT_ARGMAX};
        KL(k_dvq(&lm, st));
        CK(cudaMemcpyAsync(m->h_best, m->best, sizeof *m->best * (size_t)T, cudaMemcpyDeviceToHost, stream));
        return 0;
    }
    CK(cudaMemsetAsync(ce->dec.best, 0, sizeof *ce->dec.best, stream));
    struct dv_desc lm = {.x = m->x + (size_t)(T - 1) * H,
                         .K = H,
                         .in_mode = DV_IN_RMS,
                         .norm_w = ce->w.final_norm,
                         .eps = eps,
                         .best = ce->dec.best,
                         .n_seg = 1};
    lm.seg[0] = (struct dv_seg){dq(&ce->w.lm_head), ce->logits, DV_OUT_ARGMAX};
    KL(k_dv(&lm, st));
    CK(cudaMemcpyAsync(ce->dec.h_best, ce->dec.best, 8, cudaMemcpyDeviceToHost, stream));
    return 0;
fail:
    return -1;
}

// Captures the decode step of s as a graph (once per sequence, launch mode and stage probe).
static int dec_capture(struct engine *e, struct seq *s, char *err, size_t errlen) {
    struct cuda_engine *ce = e->impl;
    struct cuda_seq *cs = s->impl;
    if (cs->graph && cs->graph_pdl == ce->applied.pdl && cs->graph_exact == ce->applied.exact_decode &&
        cs->graph_stage == ce->probe_stage && cs->graph_reps == ce->probe_reps)
        return 0;
    if (cs->graph) cudaGraphExecDestroy(cs->graph);
    cs->graph = NULL;
    cudaGraph_t graph = NULL;
    CK(cudaStreamBeginCapture(ce->stream, cudaStreamCaptureModeThreadLocal));
    const int rc = dec_enqueue(e, s, err, errlen);
    const cudaError_t ec = cudaStreamEndCapture(ce->stream, &graph);
    if (rc) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        return -1;
    }
    CK(ec);
    const cudaError_t ei = cudaGraphInstantiate(&cs->graph, graph, 0);
    cudaGraphDestroy(graph);
    CK(ei);
    cs->graph_pdl = ce->applied.pdl, cs->graph_exact = ce->applied.exact_decode;
    cs->graph_stage = ce->probe_stage, cs->graph_reps = ce->probe_reps;
    return 0;
fail:
    cudaGetLastError();
    cs->graph = NULL;
    return -1;
}

// Enqueues the decode step of token at s's position (the captured graph, or kernel by kernel):
// its logits land in ce->logits row 0, its argmax key in dec.h_best once the stream is through.
static int dec_launch(struct engine *e, struct seq *s, int32_t token, char *err, size_t errlen) {
    struct cuda_engine *ce = e->impl;
    struct cuda_seq *cs = s->impl;
    struct dec_bufs *d = &ce->dec;
    d->h_io[0] = token;
    d->h_io[1] = s->pos;
    if (ce->applied.eager) return dec_enqueue(e, s, err, errlen);
    if (dec_capture(e, s, err, errlen)) return -1;
    CK(cudaGraphLaunch(cs->graph, ce->stream));
    return 0;
fail:
    return -1;
}

// The id in an argmax key (the kernels' DV_OUT_ARGMAX: the value's order bits high, the inverted
// id low, so that the lowest id wins a tie).
static int32_t argmax_key_id(unsigned long long key) {
    return (int32_t)(0xffffffffu - (uint32_t)(key & 0xffffffffu));
}

// The argmax of a decode step, once the stream is through.
static int dec_next(struct cuda_engine *ce, int32_t *next, char *err, size_t errlen) {
    const unsigned long long best = *ce->dec.h_best;
    if (!best) {
        snprintf(err, errlen, "decode produced no argmax (non-finite logits?)");
        return -1;
    }
    *next = argmax_key_id(best);
    return 0;
}

static int cuda_decode(struct engine *e, struct seq *s, int32_t token, int want_logits, float *logits, int32_t *next,
                       char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    void *st = ce->stream;
    if (dec_launch(e, s, token, err, errlen)) goto fail;
    if (want_logits)
        CK(cudaMemcpyAsync(logits, ce->logits, sizeof(float) * (size_t)g->vocab, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    return dec_next(ce, next, err, errlen);
fail:
    cudaStreamSynchronize(st);
    return -1;
}

int backend_cuda_decode_replay(struct engine *e, struct seq *s, int n, double *ms) {
    struct cuda_engine *ce = e->impl;
    struct cuda_seq *cs = s->impl;
    cudaEvent_t a = NULL, b = NULL;
    float t = 0;
    if (!cs->graph || n < 1 || cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) goto fail;
    if (cudaEventRecord(a, ce->stream) != cudaSuccess) goto fail;
    for (int i = 0; i < n; i++)
        if (cudaGraphLaunch(cs->graph, ce->stream) != cudaSuccess) goto fail;
    if (cudaEventRecord(b, ce->stream) != cudaSuccess || cudaEventSynchronize(b) != cudaSuccess ||
        cudaEventElapsedTime(&t, a, b) != cudaSuccess)
        goto fail;
    cudaEventDestroy(a), cudaEventDestroy(b);
    *ms = t / n;
    return 0;
fail:
    cudaStreamSynchronize(ce->stream);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    return -1;
}

const char *const dec_stage_names[DS_COUNT] = {"none",      "gdn in",   "gdn step", "gdn out", "attn in", "attn prep",
                                               "attention", "attn out", "router",   "gate/up", "down",    "lm_head"};

void backend_cuda_probe_stage(struct engine *e, enum dec_stage stage, int reps) {
    struct cuda_engine *ce = e->impl;
    ce->probe_stage = stage;
    ce->probe_reps = stage == DS_NONE ? 1 : reps;
}

struct cuda_tuning *backend_cuda_tuning(struct engine *e) {
    return e->ops == &backend_cuda ? &((struct cuda_engine *)e->impl)->tuning : NULL;
}

// Brings the tuning the user set into effect before a forward: a change of the prefill's mode or
// delta rule reallocates the scratch (which holds the bf16 inputs and the chunked rule's workspace
// only where they are used); decode's mode and PDL are read at each step (dec_capture recaptures).
static void apply_tuning(struct cuda_engine *ce) {
    const struct cuda_tuning *t = &ce->tuning, *a = &ce->applied;
    if (t->exact_prefill != a->exact_prefill || t->gdn_recurrent != a->gdn_recurrent) {
        cudaStreamSynchronize(ce->stream);
        free_scratch(&ce->sc); // ensure_scratch allocates it again for the next chunk
    }
    ce->applied = *t;
}

// Decoder layer i (docs/MODEL.md §2.2) on the residual stream ce->sc.x [T, H] in place, at positions
// s->pos..: the prefill kernels for any T (a layer probe may pass one row), fast (bf16 inputs to the
// products) or not. Leaves the router's logits in ce->sc.rl [T, E]. Enqueues only: no synchronisation.
// forward_chunk runs it for every layer, the layer probe for one.
static int cuda_layer(struct engine *e, struct seq *s, int i, int T, int fast, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    struct cuda_seq *cs = s->impl;
    struct scratch *b = &ce->sc;
    void *st = ce->stream;
    const int H = g->hidden, p0 = s->pos, E = g->n_experts, K = g->n_experts_used, I = g->moe_inter;
    const int S = g->shared_inter, D = g->head_dim;
    const float eps = (float)g->rms_eps;
    int rc = 0;
    const struct layer_weights *L = &ce->w.layers[i];
    // fast: the norm writes u's bf16 copy xh too, the products' input (one pass, no k_to_bf16)
    KL(k_rmsnorm(b->x, NULL, L->input_norm, b->u, fast ? b->xh : NULL, T, H, eps, st));
    const uint16_t *ub = fast ? b->xh : NULL;
    if (geom_is_attn(g, i)) {
        const struct qtensor *qkv[] = {&L->q_proj, &L->k_proj, &L->v_proj};
        float *qkv_y[] = {b->qg, b->kb, b->vb};
        KL(mm_segs(qkv, qkv_y, 3, b->u, ub, T, st));
        KL(k_attn_prep(b->qg, b->kb, b->vb, L->q_norm, L->k_norm, b->q, cs->k[i], cs->v[i], T, p0, s->cap, g->n_heads,
                       g->n_kv_heads, D, g->rope_dim, g->rope_theta, eps, st));
        // fast: the flash kernel writes only o's bf16 copy xh, o_proj's input (no fp32 o, no
        // k_to_bf16); else o in fp32
        uint16_t *ob = fast ? b->xh : NULL;
        KL(k_flash_attention(b->q, b->qg, cs->k[i], cs->v[i], b->o, ob, T, p0, s->cap, g->n_heads, g->n_kv_heads, D,
                             ce->applied.exact_prefill, st));
        KL(mmb_add(&L->o_proj, b->o, ob, T, b->x, st)); // x += the attention's output
    } else {
        const struct qtensor *in[] = {&L->in_qkv, &L->in_z, &L->in_b, &L->in_a};
        float *in_y[] = {b->xin, b->z, b->bb, b->aa};
        KL(mm_segs(in, in_y, 4, b->u, ub, T, st));
        KL(k_gdn_conv(b->xin, cs->conv[i], L->conv_w, b->y, T, geom_conv_dim(g), g->conv_kernel, g->lin_k_heads,
                      g->lin_k_dim, st));
        const uint16_t *gb = NULL; // fast: og's bf16 copy, from the gated norm (chunked) or k_to_bf16
        if (b->gdn_ws && T > 1) {  // chunks of 64 tokens on the tensor cores (this model's heads)
            KL(k_gdn_chunked(b->y, b->bb, b->aa, b->z, L->A_log, L->dt_bias, L->gdn_norm, cs->S[i], b->og,
                             fast ? b->xh : NULL, b->gdn_ws, T, g->lin_k_heads, g->lin_v_heads, g->lin_k_dim,
                             g->lin_v_dim, eps, ce->applied.exact_prefill, st));
            gb = fast ? b->xh : NULL;
        } else {
            KL(k_gdn_recurrent(b->y, b->bb, b->aa, b->z, L->A_log, L->dt_bias, L->gdn_norm, cs->S[i], b->og, T,
                               g->lin_k_heads, g->lin_v_heads, g->lin_k_dim, g->lin_v_dim, eps, st));
            gb = to_bf16(fast, b->og, b->xh, (long)T * geom_lin_value_dim(g), st, &rc);
            KL(rc);
        }
        KL(mmb_add(&L->out_proj, b->og, gb, T, b->x, st)); // x += the DeltaNet's output
    }
    // MoE (the router and the shared-expert gate read the fp32 u in both modes; fast: the norm
    // writes its bf16 copy xh too). The norm also forms the shared-expert gate's logit sg from u in
    // fp32 (one row: in the router's launch it took a second wave of blocks); the router is the exact
    // product alone.
    KL(k_rmsnorm_gate(b->x, NULL, L->post_norm, b->u, fast ? b->xh : NULL, T, H, eps, dq(&L->shared_gate), b->sg, st));
    const uint16_t *mb = fast ? b->xh : NULL;
    KL(mm(&L->router, b->u, T, b->rl, st)); // exact, on the fp32 u, in both modes
    KL(k_route(b->rl, T, E, K, b->ids, b->w, st));
    KL(mmb(&L->se_gate, b->u, mb, T, b->sgt, st));
    const uint16_t *sb = NULL; // fast: the up product's epilogue writes bf16(silu(gate) up) into xa
    if (mb) {
        KL(k_qmatmul_bf16_swiglu(dq(&L->se_up), mb, L->se_up.cols, NULL, 1, b->sgt, b->xa, L->se_up.rows, NULL, T, NULL,
                                 NULL, 0, st));
        sb = b->xa;
    } else {
        KL(mmb(&L->se_up, b->u, mb, T, b->sup, st));
        KL(k_swiglu(b->sgt, b->sup, b->sact, (long)T * S, st));
    }
    KL(mmb(&L->se_down, b->sact, sb, T, b->shout, st));
    KL(k_moe_dispatch(b->ids, T, E, K, ce->counts, ce->offs, b->slots, st));
    if (mb) { // fast: mb still holds bf16(u); the up product's epilogue writes bf16(silu(gate) up) into xa
        // M = T K: the compact grid, the experts' row tiles only
        KL(k_qmatmul_bf16(dq(&L->ex_gate), mb, H, b->slots, K, b->eg, I, NULL, T * K, ce->counts, ce->offs, T, st));
        KL(k_qmatmul_bf16_swiglu(dq(&L->ex_up), mb, H, b->slots, K, b->eg, b->xa, I, NULL, T * K, ce->counts, ce->offs,
                                 T, st));
        KL(k_qmatmul_bf16(dq(&L->ex_down), b->xa, I, NULL, 1, b->ye, H, b->slots, T * K, ce->counts, ce->offs, T, st));
    } else {
        KL(k_qmatmul(dq(&L->ex_gate), b->u, H, b->slots, K, b->eg, I, NULL, 0, ce->counts, ce->offs, T, st));
        KL(k_qmatmul(dq(&L->ex_up), b->u, H, b->slots, K, b->eu, I, NULL, 0, ce->counts, ce->offs, T, st));
        KL(k_swiglu(b->eg, b->eu, b->ea, (long)T * K * I, st));
        KL(k_qmatmul(dq(&L->ex_down), b->ea, I, NULL, 1, b->ye, H, b->slots, 0, ce->counts, ce->offs, T, st));
    }
    KL(k_moe_combine(b->shout, b->sg, b->w, b->ye, b->x, T, K, H, 1, st)); // x += the MoE's output
    return 0;
fail:
    return -1;
}

// Scratch for a prefill chunk (or a layer probe) of T tokens; *fast: whether its products take bf16
// inputs (the fast mode; a single row, the layer probe's T = 1, runs the exact products).
static int prefill_prepare(struct engine *e, int T, int *fast, char *err, size_t errlen) {
    struct cuda_engine *ce = e->impl;
    if (ensure_scratch(e, T, err, errlen)) return -1;
    *fast = !ce->applied.exact_prefill && T > 1 && ce->sc.xh && ce->sc.xa;
    return 0;
}

// Enqueues a prefill chunk's embedding and layers: the residual stream ce->sc.x [T, H] holds the
// last layer's output when the stream is through.
static int prefill_enqueue(struct engine *e, struct seq *s, const int32_t *tokens, int T, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    int fast;
    if (prefill_prepare(e, T, &fast, err, errlen)) return -1;
    struct scratch *b = &ce->sc;
    void *st = ce->stream;
    memcpy(b->h_tokens, tokens, sizeof(int32_t) * (size_t)T);
    CK(cudaMemcpyAsync(b->tokens, b->h_tokens, sizeof(int32_t) * (size_t)T, cudaMemcpyHostToDevice, st));
    KL(k_embed(dq(&ce->w.embed), b->tokens, T, b->x, st));
    for (int i = 0; i < g->n_layers; i++)
        if (cuda_layer(e, s, i, T, fast, err, errlen)) return -1;
    return 0;
fail:
    return -1;
}

static int cuda_forward_chunk(struct engine *e, struct seq *s, const int32_t *tokens, int T, const int *rows,
                              int n_rows, float *logits, int32_t *next, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    apply_tuning(ce);
    if (T == 1) return cuda_decode(e, s, tokens[0], n_rows, logits, next, err, errlen);
    void *st = ce->stream;
    if (T <= DQ_MAXT && mt_fits(e, &ce->applied) && (n_rows == 0 || (n_rows == 1 && rows[0] == T - 1))) {
        if (mt_enqueue(e, s, tokens, T, false, err, errlen)) goto fail;
        if (n_rows)
            CK(cudaMemcpyAsync(logits, ce->logits, sizeof(float) * (size_t)g->vocab, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        return dec_next(ce, next, err, errlen);
    }
    struct scratch *b = &ce->sc;
    const int H = g->hidden;
    const float eps = (float)g->rms_eps;
    if (prefill_enqueue(e, s, tokens, T, err, errlen)) goto fail;
    // Final norm and lm_head for the wanted rows and the last row, LM_ROWS rows at a time.
    int nw = 0;
    for (int r = 0; r < n_rows; r++) b->h_rows[nw++] = rows[r];
    if (!nw || b->h_rows[nw - 1] != T - 1) b->h_rows[nw++] = T - 1;
    CK(cudaMemcpyAsync(b->rows, b->h_rows, sizeof(int) * (size_t)nw, cudaMemcpyHostToDevice, st));
    const size_t V = (size_t)g->vocab;
    for (int r0 = 0; r0 < nw; r0 += LM_ROWS) {
        const int n = nw - r0 < LM_ROWS ? nw - r0 : LM_ROWS;
        KL(k_rmsnorm(b->x, b->rows + r0, ce->w.final_norm, ce->hn, NULL, n, H, eps, st));
        KL(mm(&ce->w.lm_head, ce->hn, n, ce->logits, st));
        if (logits && r0 < n_rows) {
            const int nc = n_rows - r0 < n ? n_rows - r0 : n;
            CK(cudaMemcpyAsync(logits + (size_t)r0 * V, ce->logits, sizeof(float) * V * (size_t)nc,
                               cudaMemcpyDeviceToHost, st));
        }
        if (r0 + n == nw) KL(k_argmax(ce->logits + (size_t)(n - 1) * V, (int)V, ce->d_next, st));
        if (r0 + n < nw) CK(cudaStreamSynchronize(st)); // the logits buffer is reused
    }
    CK(cudaMemcpyAsync(ce->h_next, ce->d_next, sizeof(int), cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    *next = *ce->h_next;
    return 0;
fail:
    cudaStreamSynchronize(st);
    return -1;
}

static void *cuda_host_alloc(size_t bytes);

// A chunk and the choice after its last row on the device (k_pick): the constraint's mask goes
// up (31 KB) while the forward runs, the choice comes back (~200 bytes), the row of logits stays.
// Sampling draws on the host from the row (pick.c).
static int cuda_forward_pick(struct engine *e, struct seq *s, const int32_t *tokens, int T, const struct engine_pick *p,
                             struct engine_choice *c, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    void *st = ce->stream;
    const size_t V = (size_t)g->vocab;
    apply_tuning(ce);
    if (T == 1) {
        if (dec_launch(e, s, tokens[0], err, errlen)) goto fail;
        ce->last_row = ce->logits;
    } else if (T <= DQ_MAXT && mt_fits(e, &ce->applied)) {
        if (mt_enqueue(e, s, tokens, T, false, err, errlen)) goto fail;
        ce->last_row = ce->logits;
    } else {
        struct scratch *b = &ce->sc;
        if (prefill_enqueue(e, s, tokens, T, err, errlen)) goto fail;
        b->h_rows[0] = T - 1;
        CK(cudaMemcpyAsync(b->rows, b->h_rows, sizeof(int), cudaMemcpyHostToDevice, st));
        KL(k_rmsnorm(b->x, b->rows, ce->w.final_norm, ce->hn, NULL, 1, g->hidden, (float)g->rms_eps, st));
        KL(mm(&ce->w.lm_head, ce->hn, 1, ce->logits, st));
        ce->last_row = ce->logits;
    }
    const uint32_t *allow = p->allow ? p->allow(p->allow_arg) : NULL; // computed while the forward runs
    if (p->sampling) {                                                // the row to the host, the draw there
        if ((!ce->h_row && !(ce->h_row = cuda_host_alloc(sizeof(float) * V))) ||
            (!ce->h_scratch && !(ce->h_scratch = malloc(sizeof(float) * V)))) {
            snprintf(err, errlen, "out of host memory for a row of logits");
            goto fail;
        }
        CK(cudaMemcpyAsync(ce->h_row, ce->last_row, sizeof(float) * V, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        if (pick_row(ce->h_row, (int)V, p, allow, ce->h_scratch, c)) goto fail;
        return 0;
    }
    if (allow) {
        memcpy(ce->h_mask, allow, 4 * ((V + 31) / 32));
        CK(cudaMemcpyAsync(ce->d_mask, ce->h_mask, 4 * ((V + 31) / 32), cudaMemcpyHostToDevice, st));
    }
    KL(k_pick(ce->last_row, (int)V, allow ? ce->d_mask : NULL, p->n_top > 0 ? p->n_top : 0, p->n_top >= 0, ce->pick_ws,
              ce->d_pick, st));
    CK(cudaMemcpyAsync(ce->h_pick, ce->d_pick, sizeof *ce->h_pick, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    const struct k_pick *k = ce->h_pick;
    *c = (struct engine_choice){.greedy = k->greedy,
                                .chosen = k->chosen,
                                .greedy_lp = k->greedy_lp,
                                .chosen_lp = k->chosen_lp,
                                .n_top = k->n_top};
    memcpy(c->top_id, k->top_id, sizeof c->top_id[0] * (size_t)k->n_top);
    memcpy(c->top_lp, k->top_lp, sizeof c->top_lp[0] * (size_t)k->n_top);
    return 0;
fail:
    cudaStreamSynchronize(st);
    return -1;
}

// ---- speculative verification -------------------------------------------------------------------
//
// A verification is a short forward (mt_enqueue) with every row's argmax. Its way back: before it,
// each DeltaNet layer's conv window and state are copied aside (63 MB at the model's shape, ~40 us);
// the in-projections write the conv and rule inputs of every token to per-layer buffers; a keep of
// fewer tokens puts the copies back and runs the conv and the rule again over the kept tokens'
// inputs (two launches a layer, the outputs unused). The attention layers need nothing: rows past
// the kept position are dead, the next forward writes them again.

static int cuda_verify_max(const struct engine *e) {
    const struct cuda_engine *ce = e->impl;
    return mt_fits(e, &ce->tuning) ? DQ_MAXT : 0; // the tuning the next forward applies
}

// A forward of a few dozen tokens runs faster as short forwards of DQ_MAXT tokens than through the
// prefill path, whose fixed work a chunk is ~25 ms. Version 12 on the H200
// (bench/results/2026-12-01-h200-v12): a short forward of 8 costs 5.78 ms at 0 of context and 6.28
// at 6,000 (+0.083 ms a thousand keys: its attention reads the keys for each of the 8), the prefill
// path's chunk of T about 28.9 + 0.30 T ms (33.7 at 16, 48.3 at 64). The longest T whose pieces cost
// under 0.9 of the chunk, and every shorter one's too: 48 at 0, 40 at 6,000, 32 at 16,384; none past
// that, where the growth is unmeasured. Only where the short forward runs (mt_fits).
static int cuda_short_split(const struct engine *e, int pos) {
    const struct cuda_engine *ce = e->impl;
    if (!mt_fits(e, &ce->tuning) || pos > 16384) return 0;
    const double piece = 5.78 + 0.083e-3 * pos;
    int split = 0;
    for (int T = DQ_MAXT + 1; T <= 64 && (T + DQ_MAXT - 1) / DQ_MAXT * piece < 0.9 * (28.9 + 0.30 * T); T++) split = T;
    return split;
}

// On the H200 a verification of n tokens costs about 1.2 + 0.4 n decode steps (2 tokens: 1.9, 8:
// 4.1; bench/results/2026-12-01-h200-v12): a draft pays only when most of it is right. Replayed
// over 32 edit tasks on real text with those costs (bench/lab/draft_lab.c, bench/NOTES.md), a gate
// of 0.9 keeps text that copies nothing at 0.99-1.01x (0.8: 0.92-0.98x) and the edits at 1.5-1.9x.
static float cuda_verify_gate(const struct engine *e) {
    (void)e;
    return 0.9f;
}

static int verify_alloc(struct engine *e, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    const struct state_sizes *z = &e->model.state;
    struct cuda_engine *ce = e->impl;
    struct mt_bufs *m = &ce->mt;
    if (m->saved) return 0;
    const size_t T = DQ_MAXT, C = geom_conv_dim(g), Hv = g->lin_v_heads;
    for (int i = 0; i < g->n_layers; i++) {
        if (geom_is_attn(g, i)) continue;
        if (!(m->conv0[i] = dalloc(ce, (size_t)z->conv_bytes, err, errlen)) ||
            !(m->S0[i] = dalloc(ce, (size_t)z->recurrent_bytes, err, errlen)) ||
            !(m->sxin[i] = dalloc(ce, T * C * 4, err, errlen)) || !(m->sbb[i] = dalloc(ce, T * Hv * 4, err, errlen)) ||
            !(m->saa[i] = dalloc(ce, T * Hv * 4, err, errlen)))
            return -1;
    }
    m->saved = true;
    return 0;
}

static int cuda_verify(struct engine *e, struct seq *s, const int32_t *tokens, int n, int32_t *all_next, char *err,
                       size_t errlen) {
    const struct geometry *g = &e->model.g;
    const struct state_sizes *z = &e->model.state;
    struct cuda_engine *ce = e->impl;
    struct cuda_seq *cs = s->impl;
    struct mt_bufs *m = &ce->mt;
    void *st = ce->stream;
    apply_tuning(ce);
    if (!mt_fits(e, &ce->applied) || n < 2 || n > DQ_MAXT) {
        snprintf(err, errlen, "no short forward of %d tokens in this mode", n);
        return -1;
    }
    if (verify_alloc(e, err, errlen)) return -1;
    for (int i = 0; i < g->n_layers; i++) {
        if (geom_is_attn(g, i)) continue;
        CK(cudaMemcpyAsync(m->conv0[i], cs->conv[i], (size_t)z->conv_bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaMemcpyAsync(m->S0[i], cs->S[i], (size_t)z->recurrent_bytes, cudaMemcpyDeviceToDevice, st));
    }
    if (mt_enqueue(e, s, tokens, n, true, err, errlen)) goto fail;
    CK(cudaStreamSynchronize(st));
    for (int t = 0; t < n; t++) {
        const unsigned long long b = m->h_best[t];
        if (!b) {
            snprintf(err, errlen, "verification row %d produced no argmax (non-finite logits?)", t);
            return -1;
        }
        all_next[t] = argmax_key_id(b);
    }
    return 0;
fail:
    cudaStreamSynchronize(st);
    return -1;
}

static int cuda_verify_keep(struct engine *e, struct seq *s, int n, int keep, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    const struct state_sizes *z = &e->model.state;
    struct cuda_engine *ce = e->impl;
    struct cuda_seq *cs = s->impl;
    struct mt_bufs *m = &ce->mt;
    void *st = ce->stream;
    const float eps = (float)g->rms_eps;
    (void)n;
    for (int i = 0; i < g->n_layers; i++) {
        if (geom_is_attn(g, i)) continue;
        const struct layer_weights *L = &ce->w.layers[i];
        CK(cudaMemcpyAsync(cs->conv[i], m->conv0[i], (size_t)z->conv_bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaMemcpyAsync(cs->S[i], m->S0[i], (size_t)z->recurrent_bytes, cudaMemcpyDeviceToDevice, st));
        KL(k_gdn_conv(m->sxin[i], cs->conv[i], L->conv_w, m->y, keep, geom_conv_dim(g), g->conv_kernel, g->lin_k_heads,
                      g->lin_k_dim, st));
        KL(k_gdn_recurrent(m->y, m->sbb[i], m->saa[i], m->z, L->A_log, L->dt_bias, L->gdn_norm, cs->S[i], m->og, keep,
                           g->lin_k_heads, g->lin_v_heads, g->lin_k_dim, g->lin_v_dim, eps, st));
    }
    CK(cudaStreamSynchronize(st));
    return 0;
fail:
    cudaStreamSynchronize(st);
    return -1;
}

static int cuda_last_logits(struct engine *e, float *out, char *err, size_t errlen) {
    struct cuda_engine *ce = e->impl;
    if (!ce->last_row) {
        snprintf(err, errlen, "no forward has made a choice yet");
        return -1;
    }
    CK(cudaMemcpy(out, ce->last_row, sizeof(float) * (size_t)e->model.g.vocab, cudaMemcpyDeviceToHost));
    return 0;
fail:
    return -1;
}

static int cuda_embed(struct engine *e, const int32_t *tokens, int T, float *out, char *err, size_t errlen) {
    struct cuda_engine *ce = e->impl;
    apply_tuning(ce);
    void *st = ce->stream;
    if (ensure_scratch(e, T, err, errlen)) return -1;
    struct scratch *b = &ce->sc;
    memcpy(b->h_tokens, tokens, sizeof(int32_t) * (size_t)T);
    CK(cudaMemcpyAsync(b->tokens, b->h_tokens, sizeof(int32_t) * (size_t)T, cudaMemcpyHostToDevice, st));
    KL(k_embed(dq(&ce->w.embed), b->tokens, T, b->x, st));
    CK(cudaMemcpyAsync(out, b->x, sizeof(float) * (size_t)T * e->model.g.hidden, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    return 0;
fail:
    cudaStreamSynchronize(st);
    return -1;
}

// One layer of a prefill chunk (engine_layer_probe): x_in up into the residual stream, cuda_layer,
// the stream and the router's logits down.
static int cuda_layer_probe(struct engine *e, struct seq *s, int layer, const float *x_in, int T, float *x_out,
                            float *router_logits, char *err, size_t errlen) {
    const struct geometry *g = &e->model.g;
    struct cuda_engine *ce = e->impl;
    void *st = ce->stream;
    apply_tuning(ce);
    int fast;
    if (prefill_prepare(e, T, &fast, err, errlen)) return -1;
    struct scratch *b = &ce->sc;
    const size_t n = (size_t)T * g->hidden;
    CK(cudaMemcpyAsync(b->x, x_in, sizeof(float) * n, cudaMemcpyHostToDevice, st));
    if (cuda_layer(e, s, layer, T, fast, err, errlen)) goto fail;
    CK(cudaMemcpyAsync(x_out, b->x, sizeof(float) * n, cudaMemcpyDeviceToHost, st));
    if (router_logits)
        CK(cudaMemcpyAsync(router_logits, b->rl, sizeof(float) * (size_t)T * g->n_experts, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    return 0;
fail:
    cudaStreamSynchronize(st);
    return -1;
}

static void *cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    return cudaMallocHost(&p, bytes) == cudaSuccess ? p : NULL;
}

static void cuda_host_free(void *p) {
    cudaFreeHost(p);
}

const struct backend_ops backend_cuda = {
    .name = "cuda",
    .available = cuda_available,
    .load = cuda_load,
    .unload = cuda_unload,
    .seq_alloc = cuda_seq_alloc,
    .seq_release = cuda_seq_release,
    .seq_clear = cuda_seq_clear,
    .seq_copy = cuda_seq_copy,
    .forward_chunk = cuda_forward_chunk,
    .forward_pick = cuda_forward_pick,
    .last_logits = cuda_last_logits,
    .verify_max = cuda_verify_max,
    .verify_gate = cuda_verify_gate,
    .short_split = cuda_short_split,
    .verify = cuda_verify,
    .verify_keep = cuda_verify_keep,
    .embed = cuda_embed,
    .layer_probe = cuda_layer_probe,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
};

#endif // CALLA_CUDA
