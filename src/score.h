// score.h: teacher-forced scoring of a token sequence (`calla score`), and the comparison of a run
// against a reference run (another backend, or HF transformers through tools/device/hf_score.py).
//
// Shapes: N = tokens in the sequence, P = N - 1 scored positions (position p holds the model's
// distribution after tokens 0..p, scored on token p + 1), K = top-k kept per position, V = vocab.
//
// What a run keeps per position: the log-sum-exp of the row, the logit of the next token, and the
// K largest logits with their ids (optionally the whole row, --full-logits). The comparison needs
// only the reference's stored values and the current run's whole rows, so it is computed while the
// current run scores (like llama-perplexity --kl-divergence):
//   KL(ref || run) over the reference's top-k ids plus one tail bucket holding the rest of the
//   mass on each side. Merging the tail into one bucket can only lower KL (log-sum inequality),
//   so this is a lower bound of the true KL, exact when the reference's tail mass is 0 and exact
//   always when the reference holds full rows.
//   normalised logit error ||a - b|| / ||b|| over the reference's stored logits (its top-k ids, or
//   every id with full rows): the top-k are the largest logits, so this weighs the head of the
//   distribution, where decisions are made.
#pragma once

#include "engine.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum { SCORE_TOP_K_MAX = 256, SCORE_TOP_K_DEFAULT = 16, SCORE_CHUNK_DEFAULT = 512 };
enum { SCORE_FULL_MAX_POSITIONS = 256 }; // --full-logits: 256 rows are 254 MB in memory, ~0.7 GB of JSON
#define SCORE_CLEAR_MARGIN 0.05          // a reference top-2 margin above this makes top-1 a clear decision
#define SCORE_FORMAT       "calla-score"
#define SCORE_VERSION      1

struct score_run {
    int n_tokens, top_k, vocab;
    int32_t *tokens;   // [N]
    float *lse;        // [P] log-sum-exp of the row (fp32, the value both sides use)
    float *target;     // [P] logit of token p + 1
    int32_t *top_ids;  // [P, K] by descending logit, ties to the lower id
    float *top_logits; // [P, K]
    float *full;       // [P, V] or NULL
    char backend[32];  // "cpu", "cuda", "hf-5.17.0-float32", ...
    int decode_from;   // score_options.decode_from of the run (0: all prefill); not read back
};

struct score_totals {
    int positions;
    double nll;        // mean negative log-likelihood (nats per token)
    double perplexity; // exp(nll)
};

struct score_cmp {
    int positions;
    double kl_mean, kl_p999, kl_max;
    int top1_same;                     // run's argmax == reference's top-1
    int n_clear, top1_same_clear;      // positions whose reference top-2 margin > SCORE_CLEAR_MARGIN
    double nle_mean, nle_p99, nle_max; // per-position normalised logit error (p99: nearest rank)
    double nle_all;                    // over every stored logit of every position
    double tail_max;                   // largest reference mass outside its top-k (how far KL is a bound)
    double *kl;                        // [P] per position
    double *nle;                       // [P] per position
};

struct score_options {
    int top_k;
    int chunk;        // tokens per engine_forward call (their logits are held: chunk x V floats)
    bool full_logits; // keep whole rows
    // 0: every token fed as prefill, `chunk` at a time. D in 1..N-1: tokens 0..D-1 as prefill (in
    // chunks), then tokens D..N-2 one at a time through the decode path (engine_forward with
    // n = 1), so positions D.. are the decode kernels' rows: a greedy continuation made elsewhere
    // (tools/device/hf_score.py --greedy) is teacher-forced through them.
    int decode_from;
    const struct score_run *ref; // compare against this while scoring, or NULL
};

// Reads token ids (decimal, separated by whitespace or commas) from path; 2..QWEN_MAX_CTX of them,
// each in 0..vocab-1.
int score_read_tokens(const char *path, int vocab, int32_t **ids, int *n, char *err, size_t errlen);

// Scores tokens[0..n) on e. out (and cmp when o->ref) are filled; free with score_run_free and
// score_cmp_free. The reference must hold the same tokens.
int score_sequence(struct engine *e, const int32_t *tokens, int n, const struct score_options *o, struct score_run *out,
                   struct score_cmp *cmp, char *err, size_t errlen);
// The reference must be of the same vocabulary and hold the same tokens. 0, or -1 with a message.
int score_check_reference(const struct score_run *ref, const int32_t *tokens, int n, int vocab, char *err,
                          size_t errlen);
// --decode-from D must satisfy 1 <= D < n. 0, or -1 with a message naming D.
int score_check_decode_from(int decode_from, int n, char *err, size_t errlen);
// Full rows are kept for at most SCORE_FULL_MAX_POSITIONS positions.
int score_check_full(int n_tokens, char *err, size_t errlen);
struct score_totals score_totals_of(const struct score_run *r);

int score_write_json(const char *path, const struct score_run *r, const struct score_cmp *cmp, const char *ref_path,
                     const char *model_dir, char *err, size_t errlen);
// Reads a run written by score_write_json or tools/device/hf_score.py, validated in full.
int score_read_json(const char *path, struct score_run *r, char *err, size_t errlen);

void score_run_free(struct score_run *r);
void score_cmp_free(struct score_cmp *c);
void score_print_summary(FILE *f, const struct score_run *r, const struct score_cmp *cmp);
