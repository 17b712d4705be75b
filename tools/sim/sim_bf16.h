// sim_bf16.h: the bit casts and bf16 conversions of src/cuda/common.cuh for the host simulators
// (tools/sim/*_sim.cpp): bf16 as the high half of an fp32, rounding to nearest even, NaN kept quiet.
#pragma once

static float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static uint16_t f2bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
