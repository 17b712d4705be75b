// synth.h: random-weight checkpoints in the exact MLX layout, byte-identical for a given seed.
#pragma once

#include "model.h"

// Value distributions. UNIFORM is the first one (router logits with standard deviation ~2, nearly
// flat top-k weights; embedding rows of rms 1/sqrt(hidden) so the first layer's output swamps the
// embedding, and every block writing as much into the residual stream as the stream holds), which
// the golden fixtures were made from. TRAINED (the default) is conditioned like a trained model:
//   - router logits spread like a trained MoE (std ~3.6 across experts): the top-k weights are
//     peaked, so a near-tie between the k-th and (k+1)-th expert moves little;
//   - embedding rows of rms ~1 and the projections that write into the residual stream (o_proj,
//     linear_attn.out_proj, the experts' and shared expert's down_proj) scaled by 1/sqrt(2 layers)
//     (GPT-2's residual scaling): each block adds a small part to a stream that stays near rms 1
//     instead of each block's rounding being amplified by the next (measured with HF on the small
//     geometry, bf16 vs fp32: final hidden state error 18% uniform, ~1% trained).
// Only scales and biases of those matrices differ between the two; codes and layout are the same.
enum synth_profile { SYNTH_PROFILE_TRAINED = 0, SYNTH_PROFILE_UNIFORM = 1 };

// Router gain of the trained profile (weights std ~ gain / sqrt(hidden), so router logits have a
// std ~ 1.03 gain, the 1.03 being the rms of the normed input); UNIFORM keeps the table's 2.0.
// The other gains are model.c's, scaled as above.
#define SYNTH_ROUTER_GAIN_TRAINED 3.5f

const char *synth_profile_name(enum synth_profile p);
// 0 and *p set, or -1 for an unknown name.
int synth_profile_parse(const char *name, enum synth_profile *p);
// The profile a checkpoint directory was written with (its calla_synth.json; a directory without
// one is taken as UNIFORM, the only distribution before profiles). 0, or -1 with a message.
int synth_profile_of(const char *dir, enum synth_profile *p, char *err, size_t errlen);

struct synth_options {
    const struct geometry *g;
    enum synth_profile profile; // 0: trained
    uint64_t seed;
    const char *out_dir;
    int64_t max_shard_bytes; // 5 GiB like mlx-lm; smaller to test sharding
    int threads;             // 0: all cores
    bool aligned;            // pad each header to 8 bytes (every tensor naturally aligned); default:
                             // MLX's unpadded header, data at an odd offset (synth.c)
};

int synth_write(const struct synth_options *o, char *err, size_t errlen);

// Puts tokenizer.json + tokenizer_config.json into a synthetic checkpoint directory.  Source, in
// order: $CALLA_TOKENIZER_JSON (a tokenizer.json; a tokenizer_config.json beside it is copied
// too); build/tokenizer/tokenizer.json under the working directory or beside the running
// binary (made by tools/gen/make_tokenizer_json.py from the real Qwen3.6 vocabulary); otherwise a
// small byte-level vocabulary generated here (256 bytes, a few hundred English merges, the 33
// added tokens at 248044..248076).
int synth_write_tokenizer(const char *out_dir, char *err, size_t errlen);
// Writes only the generated small tokenizer (what tests use to be independent of the build).
int synth_write_small_tokenizer(const char *out_dir, char *err, size_t errlen);

// The generator behind every synthetic value: SplitMix64's finaliser used as a counter-based
// hash, so any element can be computed independently (threads) and identically everywhere.
static inline uint64_t synth_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
// Element i of the stream identified by key.
static inline uint64_t synth_rand(uint64_t key, uint64_t i) {
    return synth_mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
}
// Uniform in [0, 1) with 24 bits.
static inline float synth_unit(uint64_t r) {
    return (float)(r >> 40) * (1.0f / 16777216.0f);
}
