// synth.h: random-weight checkpoints in the exact MLX layout, byte-identical for a given seed.
#pragma once

#include "model.h"

struct synth_options {
    const struct geometry *g;
    uint64_t seed;
    const char *out_dir;
    int64_t max_shard_bytes;   // 5 GiB like mlx-lm; smaller to test sharding
    int threads;               // 0: all cores
};

int synth_write(const struct synth_options *o, char *err, size_t errlen);

// The generator behind every synthetic value: SplitMix64's finaliser used as a counter-based
// hash, so any element can be computed independently (threads) and identically everywhere.
static inline uint64_t synth_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
// Element i of the stream identified by key.
static inline uint64_t synth_rand(uint64_t key, uint64_t i) { return synth_mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull); }
// Uniform in [0, 1) with 24 bits.
static inline float synth_unit(uint64_t r) { return (float)(r >> 40) * (1.0f / 16777216.0f); }
