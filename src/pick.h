// pick.h: the choice of the next token from one row of logits on the host (struct engine_pick ->
// struct engine_choice, engine.h): what the CPU backend does, and the reference the device's
// choice (src/cuda/pick.cu) is tested against.
#pragma once

#include "engine.h"

// c = the choice from row x [V] under p, with allow the constraint's bitmask (NULL: every id).
// Needs [V] floats of scratch for sampling with top_k or top_p (NULL otherwise allowed); returns 0,
// or -1 when it needed scratch and got none.
int pick_row(const float *x, int V, const struct engine_pick *p, const uint32_t *allow, float *scratch,
             struct engine_choice *c);

// The draw of sampling step `step` of stream `seed`: U[0, 1) with 24 bits (host and device alike).
static inline float pick_uniform(uint64_t seed, uint64_t step) {
    uint64_t z = seed + (step + 1) * 0x9E3779B97F4A7C15ull; // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}
