// bench.h: `calla bench`, one measurement of the reference report's protocol in a fresh process
// (docs/BENCH.md "The harness"), and the byte and FLOP models behind its GB/s and TFLOP/s.
//
// The JSON record (schema "calla.bench/1") is shared with the matrix runner, the report writer
// and the llama-bench adapter; bench_record_check lists the fields every record must have, and the
// optional ones it checks when present (engine.mode: records written before it have none).
#pragma once

#include "model.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_SCHEMA "calla.bench/1"

struct bench_options {
    const char *model_dir;
    int context;         // prompt tokens N
    int decode;          // timed decode steps D (docs/BENCH.md: 64)
    const char *backend; // "cpu", "cuda", or NULL (engine default)
    int threads;         // CPU backend threads (0: all cores)
    const char *label;   // arm name recorded in the JSON (NULL: "calla-<backend>")
    bool exact;          // the verification mode (engine_options.exact), recorded as engine.mode
    // Speculative decoding (the record's "speculative"): after the plain decode, the same tokens again
    // with drafts verified (engine_verify). NULL: none; "oracle": the plain continuation as drafts,
    // each token replaced by a wrong one with probability 1 - accept (seeded); "lookup": the drafter
    // (draft.h) on the prompt and the tokens so far.
    const char *draft;
    double accept;       // oracle: the probability a draft token is the right one (0 to 1)
    int draft_len;       // oracle: every draft's length; lookup: the longest (1 to engine_verify_max - 1)
    uint64_t draft_seed; // oracle: which tokens are replaced, and by what
    // Drafts pass the hit-rate gate the server's drafter applies (draft.h, struct draft_gate; the
    // backend's engine_verify_gate where it has one), so a run measures what a request gets; with
    // ungated every draft is verified: the mechanism alone.
    bool ungated;
};

// Token i of the synthetic prompt: (i * 2654435761) mod 2^32 mod vocab.
static inline int32_t bench_prompt_token(int64_t i, int vocab) {
    return (int32_t)((uint32_t)((uint64_t)i * 2654435761u) % (uint32_t)vocab);
}
// FNV-1a 64 over the ids as little-endian int32 (prompt and output fingerprints).
uint64_t bench_hash_tokens(const int32_t *ids, int n);

// Decode byte model: the bytes one decode step must move when it attends over ctx keys.
struct bench_bytes {
    int64_t dense;   // non-expert weights read every token: projections, router, shared expert, norms
    int64_t experts; // the n_experts_used routed experts of every layer (gate, up, down + scales)
    int64_t lm_head; // the whole lm_head (greedy needs every logit)
    int64_t embed;   // one embedding row
    int64_t kv;      // bf16 K and V of the attention layers at ctx keys, plus the new token's write
    int64_t state;   // DeltaNet recurrent + conv state, read and written (fp32)
    int64_t total;
};
struct bench_bytes bench_decode_bytes(const struct geometry *g, int64_t ctx);
// Prefill FLOP model for an n-token prompt (see bench.c for the terms).
double bench_prefill_flop(const struct geometry *g, int64_t n);

// Runs the protocol; *out is the record (caller json_decref). 0, or -1 with a message (a refusal
// of the context limit names the numbers).
int bench_run(const struct bench_options *o, json_t **out, char *err, size_t errlen);

// Structural check of a record (the CI smoke run; never the timings), "speculative" included when
// present. 0, or -1 naming the field.
int bench_record_check(const json_t *r, char *err, size_t errlen);

// llama-bench adapter (adapt.c): reads `llama-bench -o json` (or jsonl, or several arrays one
// after another) and maps the prompt-processing test of `context` tokens (0: the largest) and the
// text-generation test at that depth onto one record of this schema. Fields llama-bench does not
// measure (step times, token ids, memory, telemetry) are null with a reason.
int bench_adapt_llama_bench(const char *in_path, int context, const char *label, json_t **out, char *err,
                            size_t errlen);

// Small JSON helpers shared by bench, matrix, report and the adapter.
double json_num(const json_t *o, const char *path);      // "a.b.c"; NAN when absent or null
const char *json_str(const json_t *o, const char *path); // NULL when absent
int json_write_file(const json_t *j, const char *path, char *err, size_t errlen);
