// gpu_test.h: what the GPU test programs share: a seeded xorshift generator, the clock, the
// normalised error of a row, the top-1 margin of a row of logits, and CUDA_OK (for programs that
// include cuda_runtime.h).
#pragma once

#include "engine.h"
#include "util.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 88172645463325252ull;   // a program may seed it (any nonzero value)
static inline uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static inline float frand(void) { return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }   // [-1, 1)

// |a - ref|_2 / |ref|_2 over n floats; a NaN in a makes it infinite.
static inline double nerr_f(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        num += isnan(a[i]) ? INFINITY : d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// The argmax of x[n] (lowest index on ties) and its margin over the runner-up.
static inline int argmax_margin(const float *x, int n, float *margin) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    float s = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > s) s = x[i];
    *margin = x[b] - s;
    return b;
}

// Exit 2 with the CUDA error and where it happened.
#define CUDA_OK(call)                                                                                  \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);   \
            exit(2);                                                                                   \
        }                                                                                              \
    } while (0)
