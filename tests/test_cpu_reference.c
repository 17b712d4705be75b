// test_cpu_reference.c: the CPU backend's fast paths give the reference's bits. The oracle's qmatmul
// and attention compute 16 outputs at a time (src/backend_cpu.c, "the fast kernels");
// CALLA_CPU_REFERENCE=1 at load selects the loops they replaced (qmatmul_ref, attend_ref: one serial
// dot per output). Every logit of a chunked prefill and of decode steps after it must be the same
// float, bit for bit (memcmp), on the tiny and small geometries, with both KV cache types, at token
// counts that are not multiples of the 16 lanes, at other thread counts, past one qmatmul pass of
// 512 tokens, and with the AVX kernel (x86-64 CPUs that have it) and without (CALLA_CPU_AVX=0).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "synth.h"

static char dirs[2][256]; // tiny, small

struct run {
    int T, chunk, every, decode; // prefill T tokens in chunks; logits of rows every `every` and the last
};

// Logits of the run (prefill rows, then one row per decode step) into a new buffer; *n floats.
static float *logits_of(const char *dir, bool reference, bool avx, bool kv_f32, int threads, const struct run *r,
                        size_t *n) {
    char err[512];
    struct engine *e;
    struct engine_options eo = {.backend = "cpu", .kv_f32 = kv_f32, .threads = threads};
    // The hooks are read at load and are process-wide: the engine opened next without them clears them.
    if (reference) setenv("CALLA_CPU_REFERENCE", "1", 1);
    if (!avx) setenv("CALLA_CPU_AVX", "0", 1);
    int rc = engine_open(dir, &eo, &e, err, sizeof err);
    unsetenv("CALLA_CPU_REFERENCE");
    unsetenv("CALLA_CPU_AVX");
    if (rc) fail_msg("engine_open: %s", err);
    const int V = engine_geometry(e)->vocab, N = r->T + r->decode;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)N);
    for (int i = 0; i < N; i++) t[i] = (int32_t)((((uint64_t)(i + 17) * 2654435761u) & 0xffffffffu) % (uint32_t)V);
    int *rows = malloc(sizeof(int) * (size_t)r->T), nr = 0;
    for (int i = 0; i < r->T; i += r->every) rows[nr++] = i;
    if (rows[nr - 1] != r->T - 1) rows[nr++] = r->T - 1;
    *n = (size_t)(nr + r->decode) * V;
    float *lg = malloc(sizeof(float) * *n);
    struct seq *s;
    if (seq_new(e, N, &s, err, sizeof err)) fail_msg("seq_new: %s", err);
    int32_t next;
    struct forward_opts o = {.logit_rows = rows, .n_logit_rows = nr, .logits = lg, .chunk = r->chunk};
    if (engine_forward(e, s, t, r->T, &o, &next, err, sizeof err)) fail_msg("prefill: %s", err);
    for (int k = 0; k < r->decode; k++) {
        int row = 0;
        struct forward_opts od = {.logit_rows = &row, .n_logit_rows = 1, .logits = lg + (size_t)(nr + k) * V};
        if (engine_forward(e, s, &t[r->T + k], 1, &od, &next, err, sizeof err)) fail_msg("decode: %s", err);
    }
    seq_free(s);
    engine_close(e);
    free(t);
    free(rows);
    return lg;
}

static void same_bits(const char *dir, bool kv_f32, const struct run *r) {
    size_t na, nb;
    float *ref = logits_of(dir, true, false, kv_f32, 1, r, &na);
    for (int avx = 0; avx < 2; avx++) {
        float *fast = logits_of(dir, false, avx, kv_f32, 3, r, &nb);
        assert_int_equal(na, nb);
        size_t diff = 0, first = 0;
        for (size_t i = 0; i < na; i++)
            if (memcmp(&ref[i], &fast[i], sizeof(float)) && !diff++) first = i;
        if (diff)
            fail_msg("%s kv %s T %d avx %d: %zu of %zu logits differ from the reference, first at %zu (%.9g vs %.9g)",
                     dir, kv_f32 ? "f32" : "bf16", r->T, avx, diff, na, first, (double)ref[first], (double)fast[first]);
        assert_memory_equal(ref, fast, sizeof(float) * na);
        free(fast);
    }
    free(ref);
}

// Chunks of 20 (20, 20, 5): attention at p0 > 0, partial lane groups; then 4 decode steps.
static void test_tiny_chunked(void **state) {
    const struct run r = {.T = 45, .chunk = 20, .every = 1, .decode = 4};
    same_bits(dirs[0], false, &r);
    same_bits(dirs[0], true, &r);
}

static void test_small_chunked(void **state) {
    const struct run r = {.T = 45, .chunk = 20, .every = 1, .decode = 4};
    same_bits(dirs[1], false, &r);
    same_bits(dirs[1], true, &r);
}

// One chunk of 531 tokens: two qmatmul passes (512 + 19), an odd token left over.
static void test_tiny_long(void **state) {
    const struct run r = {.T = 531, .chunk = 0, .every = 53, .decode = 2};
    same_bits(dirs[0], false, &r);
}

static int setup(void **state) {
    const char *names[2] = {"tiny", "small"}, *t = getenv("TMPDIR");
    for (int i = 0; i < 2; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s/calla-cpuref-%s-%d", t && *t ? t : "/tmp", names[i], (int)getpid());
        char err[512];
        struct synth_options so = {.g = geometry_find(names[i]),
                                   .seed = 11 + (uint64_t)i,
                                   .out_dir = dirs[i],
                                   .max_shard_bytes = (int64_t)5 << 30};
        if (synth_write(&so, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state) {
    char cmd[600];
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dirs[i]);
        rc |= system(cmd);
    }
    return rc;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_chunked),
        cmocka_unit_test(test_small_chunked),
        cmocka_unit_test(test_tiny_long),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
