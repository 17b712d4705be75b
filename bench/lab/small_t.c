// small_t.c: what a forward of T tokens costs after a cached context (the agent turn's shape), and
// what a decode step costs when its next token is chosen under logprobs or a constraint: on the
// device (forward_opts.pick) against the row of logits read back and taken apart on the host.
//
//   small_t MODEL_DIR CTX T1,T2,...        for each T: the forward of T hash-prompt tokens at position
//                                          CTX (the context restored from a snapshot each time),
//                                          host wall time until the next token id is on the host,
//                                          median of 5 after one warm-up; then 64 decode steps each:
//                                          plain, the choice on the device (top 5 logprobs; a mask),
//                                          the row to the host and gen_logprobs there; and a
//                                          verification of 2 .. 8 tokens, kept whole and cut to one
//   small_t MODEL_DIR CTX --profile T      one warm forward of T tokens between cudaProfilerStart /
//                                          Stop (run under ncu --profile-from-start off)
// Exit 0, 1 on an engine error, 2 on bad arguments, 77 without a GPU.
#include "backend_cuda.h"
#include "engine.h"
#include "gpu/gpu_test.h"
#include "generate.h"

#include <cuda_profiler_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t *mask_of(void *arg) { return arg; }

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: small_t MODEL_DIR CTX T1,T2,... | small_t MODEL_DIR CTX --profile T\n");
        return 2;
    }
    char why[256], err[512];
    if (!backend_cuda_available(why, sizeof why)) {
        printf("small_t: no suitable GPU (%s); ran nothing: FAIL\n", why);
        return 77;
    }
    const int ctx = atoi(argv[2]);
    const int profile = !strcmp(argv[3], "--profile");
    int ts[64], nt = 0;
    if (profile) {
        if (argc < 5) return 2;
        ts[nt++] = atoi(argv[4]);
    } else {
        for (char *p = argv[3]; *p && nt < 64;) {
            ts[nt++] = (int)strtol(p, &p, 10);
            if (*p == ',') p++;
        }
    }
    int tmax = 1;
    for (int i = 0; i < nt; i++) tmax = ts[i] > tmax ? ts[i] : tmax;
    struct engine_options o = {.backend = "cuda"};
    struct engine *e;
    if (engine_open(argv[1], &o, &e, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const int V = engine_geometry(e)->vocab, cap = ctx + tmax + 300;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(ctx + tmax + 80));
    for (int i = 0; i < ctx + tmax + 80; i++) prompt[i] = (int32_t)(((uint64_t)i * 2654435761u % 4294967296u) % (uint64_t)V);
    struct seq *base, *s;
    int32_t next = 0;
    if (seq_new(e, cap, &base, err, sizeof err) || seq_new(e, cap, &s, err, sizeof err)) goto fail;
    if (ctx && engine_forward(e, base, prompt, ctx, NULL, &next, err, sizeof err)) goto fail;
    for (int i = 0; i < nt; i++) {
        const int T = ts[i];
        double t[6];
        for (int r = 0; r < 6; r++) {
            if (seq_copy(s, base, err, sizeof err)) goto fail;
            if (profile && r == 1) cudaProfilerStart();
            const double t0 = now_s();
            if (engine_forward(e, s, prompt + ctx, T, NULL, &next, err, sizeof err)) goto fail;
            t[r] = now_s() - t0;
            if (profile && r == 1) {
                cudaProfilerStop();
                printf("small_t: profiled one forward of %d tokens at %d: %.3f ms\n", T, ctx, 1e3 * t[r]);
                goto done;
            }
        }
        qsort(t + 1, 5, sizeof t[0], cmp_d);
        printf("small_t: ctx %d T %5d: %8.3f ms (min %.3f, max %.3f)\n", ctx, T, 1e3 * t[3], 1e3 * t[1], 1e3 * t[5]);
    }
    // Verification (engine_verify) of n = 2 .. max tokens: kept whole, and cut back to one token
    // (the DeltaNet state put back and one step run again): what a draft costs when it is all
    // accepted and when it is all rejected.
    for (int n = 2; !profile && n <= engine_verify_max(e); n++) {
        int32_t all[64];
        double t[2][6];
        for (int keep = 0; keep < 2; keep++)
            for (int r = 0; r < 6; r++) {
                if (seq_copy(s, base, err, sizeof err)) goto fail;
                const double t0 = now_s();
                if (engine_verify(e, s, prompt + ctx, n, all, err, sizeof err) ||
                    engine_verify_keep(e, s, keep ? 1 : n, err, sizeof err))
                    goto fail;
                t[keep][r] = now_s() - t0;
            }
        qsort(t[0] + 1, 5, sizeof t[0][0], cmp_d);
        qsort(t[1] + 1, 5, sizeof t[1][0], cmp_d);
        printf("small_t: ctx %d verify %d: %.3f ms kept whole, %.3f ms cut to 1\n", ctx, n, 1e3 * t[0][3], 1e3 * t[1][3]);
    }
    // Decode: plain; the choice on the device with top-5 logprobs, then under a mask (1 id in 4);
    // the row of logits to the host and gen_logprobs there (what a step cost before the choice).
    {
        float *logits = engine_logits_alloc(e, (size_t)V);
        const int W = (V + 31) / 32;
        uint32_t *mask = malloc(4u * W);
        for (int w = 0; w < W; w++) mask[w] = 0x11111111u;
        const int last = 0;
        struct engine_pick lp5 = {.n_top = 5}, masked = {.allow = mask_of, .allow_arg = mask, .n_top = -1};
        struct engine_choice ch;
        struct forward_opts modes[4] = {{0},
                                        {.pick = &lp5, .choice = &ch},
                                        {.pick = &masked, .choice = &ch},
                                        {.logit_rows = &last, .n_logit_rows = 1, .logits = logits}};
        static const char *const names[4] = {"plain", "device choice, top 5 logprobs", "device choice, a mask",
                                             "row to the host, gen_logprobs"};
        if (!logits || !mask || seq_copy(s, base, err, sizeof err)) goto fail;
        int32_t tok = prompt[ctx];
        for (int m = 0; m < 4; m++) {
            const double t0 = now_s();
            for (int k = 0; k < 64; k++) {
                if (engine_forward(e, s, &tok, 1, m ? &modes[m] : NULL, &tok, err, sizeof err)) goto fail;
                if (m == 3) {
                    struct token_lp lp;
                    gen_logprobs(logits, V, tok, 5, &lp);
                }
            }
            printf("small_t: decode at %d, %s: %.3f ms a step\n", ctx + 64 * m, names[m], 1e3 * (now_s() - t0) / 64);
        }
        engine_logits_free(e, logits);
        free(mask);
    }
done:
    seq_free(s);
    seq_free(base);
    engine_close(e);
    free(prompt);
    return 0;
fail:
    fprintf(stderr, "small_t: %s\n", err);
    return 1;
}
