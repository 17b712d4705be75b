// kernels.h: the CUDA kernels' launchers, callable from C (backend_cuda.c and the GPU programs), by
// op family, one section a file of src/cuda/ (whichever phase, prefill or decode, calls them).
//
// Every launcher takes device pointers and a cudaStream_t (passed as void * so that C code need
// not include CUDA headers), or for the decode step's kernels a struct dec_launch, launches
// asynchronously and returns 0, or a CUDA error code when the launch itself failed. No launcher
// synchronises with the host.
// Activations are fp32 row-major [T, width]; the KV cache is bf16 [n_kv_heads, cap, head_dim].
#pragma once

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// An MLX affine-quantized matrix (or a stack of n_mat) in device memory; the MLX layout as is.
struct dqt {
    const uint32_t *w;       // [n_mat, rows, cols * bits / 32]
    const uint16_t *scales;  // [n_mat, rows, cols / 64] bf16
    const uint16_t *biases;  // [n_mat, rows, cols / 64] bf16
    int n_mat, rows, cols, bits;
};

// How the decode step's kernels (the k_dv* and k_dec_* launchers: one token, its position read on the
// device, the whole step one CUDA graph) run. The mode and the launch attribute are the caller's (the
// backend's per-engine tuning), passed with every launch: nothing here is process-wide.
struct dec_launch {
    void *stream;
    // Programmatic dependent launch: a kernel may start before its predecessor ends, and waits on
    // the device before reading its input (the backend's default; off for comparisons).
    bool pdl;
    // The verification mode: every product in fp32 on the CUDA cores. Else (fast) the large 4-bit
    // products on the tensor cores with their input rounded to bf16 (tcgemv.cuh).
    bool exact;
};

// ---- embed.cu: the embedding --------------------------------------------------------------------
// out[t, :] = dequant(E[tokens[t], :])            out [T, cols]
int k_embed(struct dqt E, const int32_t *tokens, int T, float *out, void *stream);
// x [H] = dequant(E[io[0]]); *best = 0 (best may be NULL).
int k_dv_embed(struct dqt E, const int *io, float *x, unsigned long long *best, const struct dec_launch *l);

// ---- rmsnorm.cu ---------------------------------------------------------------------------------
// y[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * w; rows of n (n <= 8192). In place allowed.
// x row t is x + xrow[t] * n when xrow != NULL (gather), else x + t * n.
// yb != NULL: also yb[t] = bf16(y[t]) [T, n] (k_to_bf16's rounding; the fast products' input).
int k_rmsnorm(const float *x, const int *xrow, const float *w, float *y, uint16_t *yb, int T, int n, float eps,
              void *stream);
// k_rmsnorm (y and yb bit-identical to it) and a 1-row product of the normed row: gy[t] = sum_k
// y[t, k] G[0, k], G dequantized in fp32 (s q + b), fp32 sums in the block (the MoE's shared-expert
// gate logit). G: rows 1, cols n, 4 or 8 bits (else cudaErrorInvalidValue). gy [T].
int k_rmsnorm_gate(const float *x, const int *xrow, const float *w, float *y, uint16_t *yb, int T, int n, float eps,
                   struct dqt G, float *gy, void *stream);

// ---- qmatmul.cu: prefill products on the tensor cores, dense or grouped by expert ---------------
// Tiled matrix product for prefill, optionally grouped by expert.
// Dense (counts == NULL): rows r < M, mat 0: y[r] = W x[r].
// Grouped (counts != NULL, offs != NULL): for expert e, rows r in [offs[e], offs[e] + counts[e]):
//   x row = xmap ? xmap[r] / xdiv : r;  y row = ymap ? ymap[r] : r;  W = W[e].
// maxrows bounds counts[e] (grid size without reading counts on the host).
int k_qmatmul(struct dqt W, const float *x, int ldx, const int *xmap, int xdiv, float *y, int ldy, const int *ymap,
              int M, const int *counts, const int *offs, int maxrows, void *stream);
// The same product with x already in bf16 (uint16 [*, ldx], the fast prefill mode): one
// bf16 MMA per product, fp32 accumulation, each weight dequantized to bf16 (s q + b rounded once,
// as MLX does). The result is bf16(W) x_bf16 to fp32 rounding. Needs W.cols % 64 == 0, ldx % 8 == 0
// and x 16-byte aligned (else cudaErrorInvalidValue). Grouped with M > 0: M bounds the rows of all
// experts together, and the grid holds only the experts' row tiles (M / 128 + E rows of blocks, not
// E x maxrows / 128; E <= 256); the same results. On warpgroup products (wgmma):
// cudaErrorInvalidDeviceFunction where the device does not run this binary's sm_90a code.
int k_qmatmul_bf16(struct dqt W, const uint16_t *x, int ldx, const int *xmap, int xdiv, float *y, int ldy,
                   const int *ymap, int M, const int *counts, const int *offs, int maxrows, void *stream);
// The up product of a SwiGLU with its activation in the epilogue (fast prefill):
// yb[row, n] = bf16(silu(gate[row, n]) * (W x)[row, n]), row and n as y's of k_qmatmul_bf16 (ldy,
// ymap, the grouped rows): gate is the gate product's fp32 output, yb [*, ldy] bf16 the down
// product's input. Bit-identical to k_qmatmul_bf16, k_swiglu and k_to_bf16 in turn.
int k_qmatmul_bf16_swiglu(struct dqt W, const uint16_t *x, int ldx, const int *xmap, int xdiv, const float *gate,
                          uint16_t *yb, int ldy, const int *ymap, int M, const int *counts, const int *offs,
                          int maxrows, void *stream);
// The dense product added into y (cuda_layer's o_proj / out_proj into the residual stream):
// y[r, n] += (W x)[r, n] for r < M (one product, matrix 0; no gather). Each element is read and
// written by the one thread that computes it, so y is bit-identical to the product into a buffer d,
// then k_add(y, d): the same fp32 sum, without d's write and two reads and k_add's launch. The exact
// kernel (k_qmatmul's) and the fast one (k_qmatmul_bf16's), their requirements as those launchers'.
int k_qmatmul_add(struct dqt W, const float *x, int ldx, float *y, int ldy, int M, void *stream);
int k_qmatmul_bf16_add(struct dqt W, const uint16_t *x, int ldx, float *y, int ldy, int M, void *stream);
// Several dense products of one input in one launch (prefill: the projections of a layer's normed
// input): segment i writes segs[i].y [M, segs[i].ldy] =
// segs[i].W x, bit-identical to its own k_qmatmul (k_qmatmul_bf16) launch; the blocks of small
// products fill the grid of the large ones instead of paying a launch each. 1 <= n <= QM_MAX_SEGS;
// every W with the same cols and bits (else cudaErrorInvalidValue) and rows > 0; no gather, no
// experts (n_mat ignored: matrix 0). The single-product launchers are the one-segment case.
enum { QM_MAX_SEGS = 4 };
struct qm_seg {
    struct dqt W;
    float *y;   // [M, ldy]
    int ldy;
};
int k_qmatmul_segs(const struct qm_seg *segs, int n, const float *x, int ldx, int M, void *stream);
int k_qmatmul_bf16_segs(const struct qm_seg *segs, int n, const uint16_t *x, int ldx, int M, void *stream);
// y[i] = bf16(x[i]), round to nearest even (n elements).
int k_to_bf16(const float *x, uint16_t *y, long n, void *stream);

// ---- gemv.cu: the decode step's products --------------------------------------------------------
enum { DV_MAXSEG = 4, DV_MAXK = 4096 };
enum { DV_IN_PLAIN, DV_IN_RMS };                                 // input transform
enum { DV_OUT_STORE, DV_OUT_ADD, DV_OUT_CONV, DV_OUT_ARGMAX };   // per-matrix epilogue
struct dv_seg {
    struct dqt W;            // [rows, K], one matrix (n_mat ignored: matrix 0)
    float *y;                // [rows]
    int mode;                // DV_OUT_*
};
// y_s = epilogue_s(W_s xs) for each segment s, xs = transform(x):
//   DV_IN_PLAIN xs = x; DV_IN_RMS xs = rmsnorm(x) * norm_w.
//   DV_OUT_STORE y = v; DV_OUT_ADD y += v; DV_OUT_CONV (channel n) y = silu(conv over the KW-1 rows
//   of conv_state [KW-1, C] and v), conv_state shifted by one row; DV_OUT_ARGMAX y = v and *best =
//   max(*best, key(v, n)) where the key orders by value, then by the lower row (the host decodes
//   row = 0xffffffff - (uint32_t)key).
struct dv_desc {
    struct dv_seg seg[DV_MAXSEG];
    int n_seg;
    const float *x;          // [K]
    int K;                   // multiple of 64, <= DV_MAXK
    int in_mode;
    const float *norm_w;     // [K]
    float eps;
    float *x_out;            // when set: the transformed input is stored here ([K])
    const float *conv_w;     // DV_OUT_CONV: [C, KW]
    float *conv_state;       // DV_OUT_CONV: [KW - 1, C], oldest row first
    int C, KW;
    unsigned long long *best;   // DV_OUT_ARGMAX
    int prefetch;            // prefetch the block's weights into L2 before waiting on the predecessor
};
int k_dv(const struct dv_desc *d, const struct dec_launch *l);
// The same products for T tokens at once (a short forward: an append, a draft's verification),
// fast mode: token t's input at x + t * ldx, its outputs at seg.y + t * seg.W.rows (DV_OUT_STORE,
// DV_OUT_ADD, DV_OUT_ARGMAX with best[t]; no DV_OUT_CONV: the conv of several tokens runs after,
// k_gdn_conv), its transformed input (x_out) at x_out + t * K. 4-bit segments on the tensor cores,
// each weight read once for all tokens (tcgemv.cuh's tc_rows16_xq); 8-bit ones (the router, the
// shared-expert gate) token by token on the CUDA cores, each token as k_dv would compute it.
enum { DQ_MAXT = 8 };
struct dq_desc {
    struct dv_desc d;        // the products (d.x: token 0's input; d.conv_*, d.prefetch unused)
    int T;                   // 1 .. DQ_MAXT
    int ldx;                 // floats between two tokens' inputs
};
int k_dvq(const struct dq_desc *q, const struct dec_launch *l);
// y [rows] = W x for a 4-bit matrix (matrix 0) on the tensor cores (tcgemv.cuh): x as bf16, codes as
// bf16, fp32 accumulation. K = W->cols a multiple of 64, <= 8192 (shared memory <= 48 KB).
int k_tcgemv(const struct dqt *W, const float *x, float *y, void *stream);

// ---- elementwise.cu -----------------------------------------------------------------------------
// y[t, i] = silu(g[t, i]) * u[t, i]   (n = T * width)
int k_swiglu(const float *g, const float *u, float *y, long n, void *stream);
// x[i] += d[i]
int k_add(float *x, const float *d, long n, void *stream);

// ---- attention.cu: full attention ---------------------------------------------------------------
// Attention pre-processing: per token t and head: RMSNorm(q_norm / k_norm), RoPE at p0 + t.
//  q heads from qg [T, n_heads * 2 * D] (query | gate per head) into q [T, n_heads, D];
//  k heads from k [T, n_kv * D] into the cache kc at rows p0 + t; raw v into vc.
int k_attn_prep(const float *qg, const float *k, const float *v, const float *q_norm, const float *k_norm,
                float *q, uint16_t *kc, uint16_t *vc, int T, int p0, int cap, int n_heads, int n_kv, int D,
                int rope_dim, double theta, float eps, void *stream);
// Causal GQA attention with the output gate, o[t, h] = softmax(q k^T / sqrt(D)) v * sigmoid(gate) over
// keys 0 .. p0 + t for token t: prefill attention on the tensor cores (FlashAttention, no partials),
// keys in fixed tiles of 64 from position 0, so a query's result is bit-identical however the prompt
// is cut into chunks. D 64, 128 or 256; n_heads / n_kv must divide 128. exact 1: Q and P split into
// bf16 hi + lo, the fp32 formula's result to fp32 rounding (~5e-6); exact 0 (the fast prefill mode):
// Q and P rounded once to bf16, one mma per product, fp32 accumulation and softmax (~1e-3, bounded in
// test_cuda_kernels).
// ob (NULL: o in fp32): exact 0 only, 4-byte aligned: the kernel writes o's bf16 copy to ob instead of
// o (o unused), the fast o_proj's input, bit-identical to o then k_to_bf16. The fast mode at D = 256
// runs on warpgroup products: cudaErrorInvalidDeviceFunction where the device does not run this
// binary's sm_90a code (k_has_sm90a).
int k_flash_attention(const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, float *o,
                      uint16_t *ob, int T, int p0, int cap, int n_heads, int n_kv, int D, int exact, void *stream);

// Attention of T consecutive tokens, token t at position d_pos[t] (= d_pos[0] + t) and seeing the
// keys up to its own: prep (norms, RoPE, K/V into the cache at d_pos[t]) and the split attention
// over ns_max key splits (the first ones used, by the key count) + combine. Inputs and outputs are
// [T] rows of the one-token shapes; part holds T * n_heads * ns_max * (D + 2) floats.
int k_dec_attn_prep(const float *qg, const float *k, const float *v, const float *q_norm, const float *k_norm,
                    float *q, uint16_t *kc, uint16_t *vc, const int *d_pos, int T, int cap, int n_heads, int n_kv,
                    int D, int rope_dim, double theta, float eps, const struct dec_launch *l);
// The key splits k_dec_attention's grid should have for sequences of up to cap keys (at most `most`).
int k_dec_attn_splits(int cap, int n_heads, int n_kv, int D, int most);
int k_dec_attention(const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, float *o, float *part,
                    const int *d_pos, int T, int ns_max, int cap, int n_heads, int n_kv, int D, const struct dec_launch *l);

// ---- deltanet.cu, gdn_chunked.cu: Gated DeltaNet ------------------------------------------------
// DeltaNet causal conv + SiLU. xin [T, C] pre-conv; state [KW - 1, C] (oldest first), updated.
// y [T, C]. Then L2-normalises q and k heads (q also by 1/sqrt(Dk)). One pass: KW = 4, Dk 32, 64 or
// 128 (every geometry; else cudaErrorInvalidValue).
int k_gdn_conv(const float *xin, float *state, const float *conv_w, float *y, int T, int C, int KW, int Hk, int Dk,
               void *stream);
// The gated delta rule, token by token (docs/MODEL.md §2.5), with the gated RMSNorm:
// y [T, C] normalised conv output, b/a [T, Hv], z [T, Hv*Dv], S [Hv, Dk, Dv] fp32 (updated);
// o [T, Hv*Dv] = gdn_norm * rmsnorm(S^T q) * silu(z).
int k_gdn_recurrent(const float *y, const float *b, const float *a, const float *z, const float *A_log,
                    const float *dt_bias, const float *gdn_norm, float *S, float *o, int T, int Hk, int Hv, int Dk,
                    int Dv, float eps, void *stream);

// The same rule, chunked (docs/MODEL.md §4, chunks of 64) on the tensor cores, with the gated RMSNorm:
// the same inputs and outputs as k_gdn_recurrent (S updated, o [T, Hv*Dv] normed). Dk = Dv = 128
// only; y, S, o and ws 16-byte aligned. ws: k_gdn_chunked_ws_floats(T, Hv, Dk) floats of scratch.
// exact 0: bf16 operands, fp32 accumulate (normalised error vs the fp32 recurrence ~3e-3);
// exact 1: operands split into bf16 hi + lo (three products), ~1e-5. The state stays fp32.
long k_gdn_chunked_ws_floats(int T, int Hv, int Dk);
// ob (NULL: none): o's bf16 copy too (k_to_bf16's rounding), written by the gated norm.
int k_gdn_chunked(const float *y, const float *b, const float *a, const float *z, const float *A_log,
                  const float *dt_bias, const float *gdn_norm, float *S, float *o, uint16_t *ob, float *ws, int T,
                  int Hk, int Hv, int Dk, int Dv, float eps, int exact, void *stream);
// The same, running only some of its kernels (a benchmark's breakdown; stages 7 = k_gdn_chunked):
// 1 the per-chunk preparation (U, W, P), 2 the state walk over the chunks, 4 the gated norm.
int k_gdn_chunked_stages(const float *y, const float *b, const float *a, const float *z, const float *A_log,
                         const float *dt_bias, const float *gdn_norm, float *S, float *o, uint16_t *ob, float *ws,
                         int T, int Hk, int Hv, int Dk, int Dv, float eps, int exact, int stages, void *stream);

// One gated delta rule step for every value head: y [C] the conv output (after SiLU), b/a [Hv],
// S [Hv, Dk, Dv] updated, o [Hv * Dv] = the gated norm of S^T q: w * rmsnorm_head(S^T q) * silu(z)
// with z [Hv * Dv], w = norm_w [Dv]. Dv a multiple of 32, at most 128.
int k_dv_gdn(const float *y, const float *b, const float *a, const float *A_log, const float *dt_bias, float *S,
             const float *z, const float *norm_w, float eps, float *o, int Hk, int Hv, int Dk, int Dv,
             const struct dec_launch *l);

// ---- moe.cu: the mixture of experts -------------------------------------------------------------
// MoE routing: softmax over E logits per token, top-k (ties: lower id), renormalised.
// ids [T, k], w [T, k]. E <= 1024, k <= 32.
int k_route(const float *logits, int T, int E, int k, int *ids, float *w, void *stream);
// The same by one warp per token (route_warp: the decode step's routing; E <= 256).
int k_route_warp(const float *logits, int T, int E, int k, int *ids, float *w, void *stream);
// Expert dispatch for the grouped product: counts[E], offs[E], slots[T*k] (slot = t*k + i, grouped
// by expert, tokens ascending within an expert). work must hold E ints.
int k_moe_dispatch(const int *ids, int T, int E, int k, int *counts, int *offs, int *slots, void *stream);
// out[t] = sigmoid(sg[t]) * shared[t] + sum_i w[t, i] * ye[t*k + i]   (rows of H); add: out[t] += that
// instead (the residual add of the layer's end, as k_add after the store would round it)
int k_moe_combine(const float *shared, const float *sg, const float *w, const float *ye, float *out, int T, int k,
                  int H, int add, void *stream);

// The MoE of one token (docs/MODEL.md §2.6): k_dv_moe_gateup routes (every block, from logits [E]) and
// writes act [k + 1, I] (slot k: the shared expert), ids [k + 1] and w [k + 1] (w[k] =
// sigmoid(shared_logit)); k_dv_moe_down adds sum_e w_e down_e act_e into x [H].
struct dv_moe {
    const float *logits, *shared_logit, *u;   // [E], [1], the normalised input [H]
    struct dqt gate, up, down;                // routed [E][I, H], [E][I, H], [E][H, I]
    struct dqt sgate, sup, sdown;             // shared [I, H], [I, H], [H, I]
    int E, k, H, I;
    float *act;                               // [k + 1, I]
    int *ids;                                 // [k + 1]
    float *w;                                 // [k + 1]
    float *x;                                 // [H] the residual stream
    int tc_split;                             // (k_dv_moe_gateup sets 1) gate/up split K where H allows
};
int k_dv_moe_gateup(const struct dv_moe *m, const struct dec_launch *l);
int k_dv_moe_down(const struct dv_moe *m, const struct dec_launch *l);
// The same for T tokens at once (fast mode, the model's 256 experts and k = 8): token t's inputs at
// logits + t E, shared_logit + t, u + t H, its outputs at act + t (k + 1) I, ids + t (k + 1), w + t (k + 1)
// and x + t H. Gate and up read each chosen expert's weights once for every token that chose it.
struct dq_moe {
    struct dv_moe m;
    int T;   // 1 .. DQ_MAXT
};
int k_dvq_moe_gateup(const struct dq_moe *q, const struct dec_launch *l);
int k_dvq_moe_down(const struct dq_moe *q, const struct dec_launch *l);

// ---- argmax.cu ----------------------------------------------------------------------------------
// Argmax of x[n] (lowest index on ties) into *out.
int k_argmax(const float *x, int n, int *out, void *stream);

// ---- device.cu ----------------------------------------------------------------------------------
// Whether the device runs this binary's sm_90a code (wgmma, setmaxnreg): probed once, not in a capture.
int k_has_sm90a(void);

#ifdef __cplusplus
}
#endif
