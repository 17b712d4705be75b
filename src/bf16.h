// bf16.h: bf16 <-> fp32 on the host (bf16 as the high half of an fp32), and the rounding of the
// prefill's fast dequantization; plain C, shared by the backends, the tests and the host simulators.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

// bf16 <-> f32
static inline float bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}
static inline uint16_t f32_to_bf16(float f) { // round to nearest even; NaN stays NaN
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    if ((v.u & 0x7fffffff) > 0x7f800000) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fff + ((v.u >> 16) & 1)) >> 16);
}
// bf16(a s + b) rounded once (to nearest even), as fma.rn.bf16x2 computes it: the prefill's fast
// products dequantize a weight so (q s + b, q a code, s and b bf16). The double sum is exact
// wherever a s and b lie within 2^37 of each other (every real scale and bias), and it is rounded
// to 8 significant bits directly, not through fp32.
static inline uint16_t bf16_fma_round(float a, float s, float b) {
    const double v = (double)a * s + b;
    if (v == 0 || !isfinite(v)) return f32_to_bf16((float)v);
    int e;
    const double m = frexp(v, &e);                                   // |m| in [0.5, 1)
    return f32_to_bf16((float)ldexp(nearbyint(ldexp(m, 8)), e - 8)); // exact in fp32 and in bf16
}
