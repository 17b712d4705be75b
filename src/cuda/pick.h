// pick.h: the next token chosen on the device from one row of logits (src/cuda/pick.cu), callable
// from C. Only struct k_pick comes back to the host.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { PK_MAXTOP = 20 };   // OpenAI's limit on top_logprobs

struct k_pick {
    int32_t greedy;                // argmax of the row (lowest id on ties)
    int32_t chosen;                // the argmax over the allowed ids (no mask: greedy; none allowed: -1)
    float greedy_lp, chosen_lp;    // their log-probabilities under softmax(row) (0 without want_lp)
    int32_t n_top;                 // top_id / top_lp hold the n_top most likely ids, most likely first
    int32_t top_id[PK_MAXTOP];
    float top_lp[PK_MAXTOP];
};

// out (device memory) = the pick of logits [V] (device): allow (NULL: none) a bitmask [ceil(V / 32)]
// of the ids the constraint allows (bit i % 32 of word i / 32); n_top (0..PK_MAXTOP) most likely ids
// with their log-probabilities, which need want_lp. ws: k_pick_ws_bytes() of device memory, zeroed
// once before the first call (the kernel leaves it ready for the next), used by one stream at a
// time. cudaErrorInvalidValue on bad arguments.
size_t k_pick_ws_bytes(void);
int k_pick(const float *logits, int V, const uint32_t *allow, int n_top, int want_lp, void *ws, struct k_pick *out,
           void *stream);

#ifdef __cplusplus
}
#endif
