// backend_cuda.h: the CUDA backend's hooks for the GPU tests and the lab (tests/gpu/, bench/lab/).
// Nothing in the product calls them; the backend itself is struct backend_ops backend_cuda (backend.h).
#pragma once

#include "engine.h"

#include <stdbool.h>

// backend_cuda.available on device 0 (the GPU programs' probe): 1, or 0 with the reason in msg.
int backend_cuda_available(char *msg, size_t msglen);

// What stays tunable in the CUDA backend, per engine. Filled at load (both exact bits from
// engine_options.exact, the rest as below); a test changes it through backend_cuda_tuning, and the
// next forward (or layer probe, or embedding) applies it: the prefill scratch is reallocated where
// its mode or delta rule changed, and a sequence's decode graph is captured again where the decode
// mode or PDL differs from its capture's.
struct cuda_tuning {
    bool exact_prefill; // prefill products, attention and delta rule on hi + lo operands (verification)
    bool exact_decode;  // decode products in fp32 on the CUDA cores (verification)
    bool pdl;           // decode kernels with programmatic dependent launch (true at load)
    bool eager;         // decode kernel by kernel instead of the captured graph (false at load)
    // Prefill's delta rule token by token instead of chunked (false at load; the test geometries'
    // heads have no chunked form and run the recurrence always).
    bool gdn_recurrent;
};
// e's tuning, to change in place; NULL when e does not run on the CUDA backend.
struct cuda_tuning *backend_cuda_tuning(struct engine *e);

// Test hook: s's captured decode graph (graph mode, after a decode step of s) launched n times back to
// back on the device, the same step each time (its token and position), with no host round trip
// between: *ms = device time per step. s's state is garbage afterwards. 0 or -1.
int backend_cuda_decode_replay(struct engine *e, struct seq *s, int n, double *ms);

// Stages of the decode step, for the stage probe (a measurement: what one stage costs in the step).
enum dec_stage {
    DS_NONE,
    DS_GDN_IN,
    DS_GDN,
    DS_GDN_OUT,
    DS_ATTN_IN,
    DS_ATTN_PREP,
    DS_ATTN,
    DS_ATTN_OUT,
    DS_ROUTER,
    DS_GATEUP,
    DS_DOWN,
    DS_LM,
    DS_COUNT
};
extern const char *const dec_stage_names[DS_COUNT];
// Test hook: the stage's launches enqueued reps times (0: skipped, 2: twice) in every layer of the
// decode graphs captured from now on (DS_NONE: the real step). The step's output is garbage unless
// reps == 1: for timing only.
void backend_cuda_probe_stage(struct engine *e, enum dec_stage stage, int reps);
