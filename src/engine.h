// engine.h: a loaded model on a backend (CPU reference or CUDA), and per-sequence decode state.
//
// Everything above the backends (run, serve, bench) talks to this interface only:
//   engine_open        load + validate the checkpoint, upload to the backend
//   seq_new            a sequence with room for max_ctx tokens (KV cache + DeltaNet state)
//   engine_forward     feed tokens (prefill in chunks of 4,096, or one decode step) and get the
//                      greedy next token; optionally the logits of chosen rows
//   seq_copy           snapshot a sequence (the session cache)
#pragma once

#include "checkpoint.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct engine; // opaque: defined in backend.h, for engine.c and the backends only
struct seq;

struct engine_options {
    const char *backend; // "cpu", "cuda", or NULL for the default (CUDA when a suitable GPU is present)
    int threads;         // CPU backend threads (0: all cores)
    bool kv_f32;         // CPU backend: keep the KV cache in fp32 instead of bf16 (golden tests)
    int device;          // GPU index for a GPU backend (0: the first); the CPU backend ignores it
    bool gpu_exclusive;  // GPU backend: refuse a GPU that another process computes on (serve: one replica per GPU)
    // The verification mode: fp32-level products (CUDA: hi + lo operands in prefill, fp32 CUDA-core
    // products in decode) instead of the fast mode's bf16 inputs; the CPU backend is exact always.
    bool exact;
    // Developer and test settings, which the environment can also turn on (engine.c's table).
    bool cpu_reference;       // CPU backend: the naive reference kernels (tests/test_cpu_reference.c)
    bool cpu_no_avx;          // CPU backend: the portable kernels even where the CPU has AVX
    size_t cpu_alloc_limit;   // CPU backend: fail every scratch allocation above this many bytes (0: none)
    const char *router_trace; // CPU backend: append every routing decision to this file (NULL: none)
};

// The choice of the token after a forward's last row, made where its logits are: the CUDA backend
// keeps them on the device and sends back only this (not the 1 MB row), the CPU backend picks from
// its own row (src/pick.c, the reference of both).
enum { ENGINE_MAX_TOP = 20 }; // OpenAI's limit on top_logprobs

// Opt-in sampling (the server's --allow-sampling): l_i = logit_i - presence_penalty [i generated],
// z_i = l_i / temperature over the allowed ids, p_i ~ exp(z_i - max z); then, in this order, only
// the ids whose z is at least the top_k-th largest (ties at the boundary kept; 0: all), those with
// p_i >= min_p p_max, and those with p_i >= tau, the largest tau whose ids hold at least top_p of the
// mass kept so far; the draw u = U[0, 1) of (seed, step) walks the kept ids in id order. p_i / p_max
// is expf(z_i - max z) in float (0 below -87); masses are sums in double (in an order each backend
// documents: a draw can differ only where u or top_p falls within rounding of a boundary).
// temperature 0: the argmax of l (lowest id on ties).
struct engine_sampling {
    float temperature, top_p, min_p, presence_penalty;
    int top_k;
    uint64_t seed;
};

struct engine_pick {
    // The ids a constraint allows, a bitmask [ceil(vocab / 32)] (bit i % 32 of word i / 32), or NULL
    // for every id. Called once the forward is under way (the mask is computed meanwhile); NULL: none.
    const uint32_t *(*allow)(void *arg);
    void *allow_arg;
    int n_top;                              // -1: no log-probabilities; else this many alternatives (<= 20)
    const struct engine_sampling *sampling; // NULL: greedy (chosen is the allowed argmax)
    uint64_t step;                          // the draw's step (with sampling->seed, its random stream)
    const uint32_t *seen;                   // the generated ids as a bitmask as allow's (presence penalty; NULL: none)
};

struct engine_choice {
    int32_t greedy;             // the argmax of the row (lowest id on ties): forward's *next
    int32_t chosen;             // the allowed argmax, or the draw; -1 when the mask allows nothing
    float greedy_lp, chosen_lp; // their log-probabilities, softmax of the raw row (n_top >= 0)
    int n_top;                  // top_id / top_lp: the most likely ids, most likely first (lowest id on ties)
    int32_t top_id[ENGINE_MAX_TOP];
    float top_lp[ENGINE_MAX_TOP];
};

struct forward_opts {
    const int *logit_rows; // rows (0..n-1 of this call) whose logits are wanted, ascending
    int n_logit_rows;
    float *logits;             // [n_logit_rows, vocab]
    int chunk;                 // prefill chunk (0: QWEN_PREFILL_CHUNK; one of few tokens: the backend's short forwards)
    bool (*cancelled)(void *); // checked between chunks; forward returns ENGINE_CANCELLED
    void *cancel_arg;
    // Called after each chunk with the tokens of this call done so far and its total (a prefill's
    // progress: the CLI's progress line, the server's /metrics). NULL: not called.
    void (*progress)(void *arg, int done, int total);
    void *progress_arg;
    // The choice after the last row (NULL: none): *choice gets it, *next is its greedy id. Not with
    // logit_rows (the two are ways of reading the same row).
    const struct engine_pick *pick;
    struct engine_choice *choice;
};

enum { ENGINE_OK = 0, ENGINE_ERROR = -1, ENGINE_CANCELLED = -2 };

int engine_open(const char *model_dir, const struct engine_options *o, struct engine **out, char *err, size_t errlen);
void engine_close(struct engine *e);
const struct geometry *engine_geometry(const struct engine *e);
const struct model *engine_model(const struct engine *e);
const char *engine_backend(const struct engine *e);
// Bytes the backend holds for weights (device memory for CUDA).
int64_t engine_weight_bytes(const struct engine *e);

int seq_new(struct engine *e, int max_ctx, struct seq **out, char *err, size_t errlen);
void seq_free(struct seq *s);
int seq_pos(const struct seq *s); // tokens consumed so far
int seq_capacity(const struct seq *s);
void seq_reset(struct seq *s); // back to the empty state
// dst must come from the same engine with capacity >= src's position.
int seq_copy(struct seq *dst, const struct seq *src, char *err, size_t errlen);

// Consumes tokens[0..n) at positions seq_pos.., in chunks. *next = argmax of the last row's
// logits (lowest id on ties). Refuses (ENGINE_ERROR, state unchanged) if the sequence would
// pass its capacity or a token id is outside the vocabulary.
// A backend that runs out of memory returns ENGINE_ERROR with a message, never aborts; seq_pos
// then counts the chunks done, but the failed chunk may have changed some layers' state, so
// reset the sequence (or seq_copy into it) before using it again.
int engine_forward(struct engine *e, struct seq *s, const int32_t *tokens, int n, const struct forward_opts *o,
                   int32_t *next, char *err, size_t errlen);

// ---- speculative verification ------------------------------------------------------------------
// A draft of what greedy decoding will produce is checked in one forward: tokens[0] is the token
// just chosen, tokens[1..n) the draft. engine_verify consumes all n (seq_pos moves by n) and sets
// all_next[i] = the argmax of row i's logits (lowest id on ties), as n decode steps would; draft
// token i + 1 is right exactly when it equals all_next[i]. engine_verify_keep then keeps the first
// keep of the n tokens (1 <= keep <= n): seq_pos moves back by n - keep, and the sequence is as if
// only those had been forwarded (the KV rows after them are dead, the DeltaNet conv window and
// state those of the last kept token). Until the keep, the sequence must not be forwarded, copied
// or verified again; keep == n keeps everything (and is cheap).
//
// The most tokens (draft + 1) engine_verify takes here: the backend's short forward, where n
// tokens cost little more than one; 0 when a verification would cost what n decode steps cost
// (speculation would only lose).
int engine_verify_max(const struct engine *e);
// The share of drafts (their first token right) under which speculating costs more than it saves
// here: what a verification costs in decode steps decides it. 0: the drafter's own default.
float engine_verify_gate(const struct engine *e);
int engine_verify(struct engine *e, struct seq *s, const int32_t *tokens, int n, int32_t *all_next, char *err,
                  size_t errlen);
int engine_verify_keep(struct engine *e, struct seq *s, int keep, char *err, size_t errlen);

// Host memory for n floats of logits (forward_opts.logits): page-locked on the CUDA backend, so
// that a step's row (1 MB) comes back by DMA rather than through a staging copy (the constrained
// decoder reads one every step); malloc elsewhere.  NULL when out of memory.
float *engine_logits_alloc(struct engine *e, size_t n);
// The last row of the latest forward that made a choice (forward_opts.pick), into out [vocab]: what
// the constrained decoder reads in the rare steps the choice does not settle (near the end of its
// budget). Valid until the engine's next forward.
int engine_last_logits(struct engine *e, float *out, char *err, size_t errlen);
void engine_logits_free(struct engine *e, float *p);

// ---- the layer probe (tests: tests/gpu/test_cuda_layers.c, tests/test_engine.c) -------------------
// A backend's layers one at a time, fed hidden states from outside (the CPU oracle's), so that
// a backend is checked layer by layer with no rounding carried from the layers before.

// out [n, hidden] = the embedding rows of tokens[0..n) (h_0, the first layer's input).
// ENGINE_ERROR with a message when the backend has no probe or a token id is outside the vocabulary.
int engine_embed(struct engine *e, const int32_t *tokens, int n, float *out, char *err, size_t errlen);
// Runs decoder layer `layer` (docs/MODEL.md §2.2: mixer, MoE, both residual adds) on x_in [n, hidden]
// at positions seq_pos(s) .. seq_pos(s) + n - 1, the prefill path in whatever mode the backend is
// in (CUDA: fast or CALLA_EXACT=1), reading and updating that layer's state in s (KV cache rows,
// DeltaNet conv and recurrent state); s's position does not move. x_out [n, hidden] (may be x_in)
// gets the layer's output; router_logits [n, n_experts], when not NULL, the router's logits.
// n is at most QWEN_PREFILL_CHUNK and the sequence's room; ENGINE_ERROR with a message otherwise.
int engine_layer_probe(struct engine *e, struct seq *s, int layer, const float *x_in, int n, float *x_out,
                       float *router_logits, char *err, size_t errlen);

// A forward_opts.progress for terminals: "calla run: prefill 8,192 / 65,536 tokens (12%), 1.6 s"
// on stderr, rewritten in place after each chunk and ended by a newline. Prints only when stderr
// is a terminal and the call spans more than one chunk. arg: a struct progress_line.
struct progress_line {
    const char *who; // "calla run", "calla bench"
    double t0;       // now_s() at the start (util.h)
};
void progress_line(void *arg, int done, int total);
