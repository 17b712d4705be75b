// spec_grid.c: the speculative mechanism's speed at a given acceptance, on the engine API alone
// (engine_verify / engine_verify_keep), against plain greedy decode in the same process.
//
//   spec_grid MODEL_DIR CTX N D1,D2,... P1,P2,...
//
// After CTX hash-prompt tokens, N greedy decode steps give the model's own continuation (timed: the
// plain decode). Then for every (D, P): from the same context, drafts of D tokens taken from that
// continuation, each replaced by a wrong id with probability 1 - P (seeded per point), verified in
// one forward of D + 1 tokens; the longest right prefix and the next token kept. Prints a line per
// point and a JSON line (spec_grid_json) with tok/s, the speed-up, the acceptance and whether the
// output equals the plain one token for token. Random weights never repeat their input, so real
// drafters' acceptance cannot be measured here: this is the mechanism at an acceptance P.
// Exit 0, 1 on an engine error, 2 on bad arguments, 77 without a GPU.
#include "backend_cuda.h"
#include "engine.h"
#include "gpu/gpu_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_list(const char *s, double *out, int max) {
    int n = 0;
    for (char *p = (char *)s; *p && n < max;) {
        out[n++] = strtod(p, &p);
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: spec_grid MODEL_DIR CTX N D1,D2,... P1,P2,...\n");
        return 2;
    }
    char why[256], err[512];
    if (!backend_cuda_available(why, sizeof why)) {
        printf("spec_grid: no suitable GPU (%s); ran nothing: FAIL\n", why);
        return 77;
    }
    const int ctx = atoi(argv[2]), N = atoi(argv[3]);
    double ds[16], ps[16];
    const int nd = parse_list(argv[4], ds, 16), np = parse_list(argv[5], ps, 16);
    if (ctx < 1 || N < 8 || nd < 1 || np < 1) return 2;
    struct engine_options o = {.backend = "cuda"};
    struct engine *e;
    if (engine_open(argv[1], &o, &e, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const int V = engine_geometry(e)->vocab, vmax = engine_verify_max(e);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)ctx), *ref = malloc(sizeof(int32_t) * (size_t)(N + 1)),
            *out = malloc(sizeof(int32_t) * (size_t)(N + 16));
    for (int i = 0; i < ctx; i++) prompt[i] = (int32_t)(((uint64_t)i * 2654435761u % 4294967296u) % (uint64_t)V);
    struct seq *base, *s;
    if (seq_new(e, ctx + N + 64, &base, err, sizeof err) || seq_new(e, ctx + N + 64, &s, err, sizeof err) ||
        engine_forward(e, base, prompt, ctx, NULL, &ref[0], err, sizeof err))
        goto fail;
    // plain greedy: ref[0] is the prompt's next token, ref[i + 1] the step after ref[i] (two rounds, the second timed)
    double plain = 0;
    for (int round = 0; round < 2; round++) {
        if (seq_copy(s, base, err, sizeof err)) goto fail;
        const double t0 = now_s();
        for (int i = 0; i < N; i++)
            if (engine_forward(e, s, &ref[i], 1, NULL, &ref[i + 1], err, sizeof err)) goto fail;
        plain = N / (now_s() - t0);
    }
    printf("spec_grid: ctx %d, %d tokens: plain decode %.1f tok/s; verify_max %d\n", ctx, N, plain, vmax);
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < np; b++) {
            const int D = (int)ds[a];
            const double P = ps[b];
            if (D < 1 || D + 1 > vmax) continue;
            uint64_t rs = 0x9e3779b97f4a7c15ull ^ (uint64_t)(D * 1000 + (int)(P * 100));
            long drafted = 0, accepted = 0, verifies = 0;
            double t = 0;
            for (int round = 0; round < 2; round++) {
                if (seq_copy(s, base, err, sizeof err)) goto fail;
                drafted = accepted = verifies = 0;
                int n = 0;   // tokens of out: out[0] = ref[0] came with the prompt
                out[n++] = ref[0];
                const double t0 = now_s();
                while (n <= N) {
                    const int d = D < N + 1 - n ? D : N + 1 - n;
                    int32_t tok[16], all[16];
                    tok[0] = out[n - 1];
                    for (int j = 1; j <= d; j++) {
                        const bool wrong = (double)(rng_next(&rs) >> 11) / 9007199254740992.0 >= P;
                        tok[j] = wrong ? (ref[n - 1 + j] + 1) % V : ref[n - 1 + j];
                    }
                    int m = 0;
                    if (d == 0) {
                        if (engine_forward(e, s, tok, 1, NULL, &all[0], err, sizeof err)) goto fail;
                    } else {
                        if (engine_verify(e, s, tok, d + 1, all, err, sizeof err)) goto fail;
                        while (m < d && tok[m + 1] == all[m]) m++;
                        if (engine_verify_keep(e, s, m + 1, err, sizeof err)) goto fail;
                        verifies++;
                    }
                    for (int j = 1; j <= m; j++) out[n++] = tok[j];
                    out[n++] = all[m];
                    drafted += d, accepted += m;
                }
                t = now_s() - t0;
            }
            int same = 0;
            for (int i = 0; i <= N; i++) same += out[i] == ref[i];
            const double tps = N / t;
            printf("spec_grid: ctx %d D %d P %.2f: %.1f tok/s, %.2fx plain, accepted %.3f of drafts, %.2f tokens a "
                   "verify, %d of %d tokens as plain\n",
                   ctx, D, P, tps, tps / plain, drafted ? (double)accepted / drafted : 0,
                   verifies ? (double)(N) / verifies : 0, same, N + 1);
            printf("spec_grid_json {\"ctx\": %d, \"tokens\": %d, \"D\": %d, \"P\": %.2f, \"plain_tok_s\": %.2f, "
                   "\"tok_s\": %.2f, \"speedup\": %.4f, \"acceptance\": %.4f, \"same_tokens\": %d}\n",
                   ctx, N, D, P, plain, tps, tps / plain, drafted ? (double)accepted / drafted : 0, same);
        }
    seq_free(s), seq_free(base);
    engine_close(e);
    free(prompt), free(ref), free(out);
    return 0;
fail:
    fprintf(stderr, "spec_grid: %s\n", err);
    return 1;
}
