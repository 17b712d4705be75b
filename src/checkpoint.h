// checkpoint.h: open an MLX checkpoint directory (config.json, model.safetensors.index.json,
// shards) and validate it against the exact Qwen3.6-35B-A3B layout, or against a test geometry
// when the config marks itself as one (text_config.calla_test_geometry).
#pragma once

#include "bf16.h"
#include "model.h"
#include "safetensors.h"

struct model {
    char *dir;
    struct geometry g;        // validated geometry (copy of a named one)
    struct state_sizes state; // per-sequence state sizes of g (model_state_sizes), for the backends
    struct weights w;         // quantized matrices bound into the mapped shards at any alignment; fp32 vectors owned
    struct st_file *shards;
    int n_shards;
    void **owned; // allocations made at load: the fp32 plain tensors (norms, conv, A_log, dt_bias)
    int n_owned, cap_owned;
    int64_t owned_bytes;    // their total: the host memory a load adds besides the mapping
    int64_t file_bytes;     // text tensors, as stored
    int64_t n_text_tensors; // stored text tensors
    int64_t n_ignored;      // vision_tower / model.visual / mtp tensors skipped
    int64_t n_unaligned;    // stored U32/BF16 tensors not naturally aligned in their file (read in place)
    uint64_t identity;      // FNV-1a hash of config.json and the index, for bench records
};

// Opens and validates dir. 0, or -1 with a message naming the key or tensor, the expected
// and the actual value.
int checkpoint_open(const char *dir, struct model *m, char *err, size_t errlen);
void checkpoint_close(struct model *m);

// Drops this process's pages of [p, p + bytes) where that range lies in a mapped shard (a backend
// that has copied the weights elsewhere calls it so host RSS does not hold the checkpoint twice).
// Later reads fault the pages back in from the file; ranges outside the shards (the owned fp32
// vectors) are left alone.
void checkpoint_release(const struct model *m, const void *p, size_t bytes);

// Parses config.json text into a geometry and checks the quantization block against specs.
// Exposed for tests and the fuzzer.
int checkpoint_parse_config(const char *text, size_t len, struct geometry *g, char *err, size_t errlen);
// A whole file (at most 64 MiB), NUL-terminated, *len its length; NULL with a message.
char *read_small_file(const char *path, size_t *len, char *err, size_t errlen);
