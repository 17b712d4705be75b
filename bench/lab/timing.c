// timing.c: a minimal timer of prefill and decode on the CUDA backend (calla bench is the full
// protocol, docs/BENCH.md).
//
//   timing MODEL_DIR N_PROMPT [N_DECODE=32] [WARMUP=1]
//
// Prefill of N_PROMPT hash-prompt tokens (docs/BENCH.md prompt) in chunks of 4,096, timed until the
// first token id is on the host; then N_DECODE greedy decode steps, each timed. With WARMUP, an
// identical run first (discarded). Prints one line. Exit 1 when the token ids of the two runs
// differ (or a run fails), 2 on bad arguments, 77 when there is no suitable GPU (never a pass).
#include "backend_cuda.h"
#include "engine.h"
#include "gpu/gpu_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int once(struct engine *e, const int32_t *prompt, int n, int d, int32_t *toks, double *pre, double *dec) {
    char err[512];
    struct seq *s;
    if (seq_new(e, n + d + 1, &s, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    double t0 = now_s();
    if (engine_forward(e, s, prompt, n, NULL, &toks[0], err, sizeof err)) goto fail;
    *pre = now_s() - t0;
    double t1 = now_s();
    for (int i = 0; i < d; i++)
        if (engine_forward(e, s, &toks[i], 1, NULL, &toks[i + 1], err, sizeof err)) goto fail;
    *dec = d ? (now_s() - t1) / d : 0;
    seq_free(s);
    return 0;
fail:
    fprintf(stderr, "%s\n", err);
    seq_free(s);
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: timing MODEL_DIR N_PROMPT [N_DECODE] [WARMUP]\n");
        return 2;
    }
    char why[256], err[512];
    const int n = atoi(argv[2]), d = argc > 3 ? atoi(argv[3]) : 32, warm = argc > 4 ? atoi(argv[4]) : 1;
    if (n < 1 || d < 0) {
        fprintf(stderr, "timing: N_PROMPT must be at least 1 and N_DECODE at least 0\n");
        return 2;
    }
    if (!backend_cuda_available(why, sizeof why)) {
        printf("timing: no suitable GPU (%s); ran nothing: FAIL\n", why);
        return 77;
    }
    struct engine_options o = {.backend = "cuda"};
    struct engine *e;
    double t0 = now_s();
    if (engine_open(argv[1], &o, &e, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const double load = now_s() - t0;
    const int V = engine_geometry(e)->vocab;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n), *t1 = calloc((size_t)d + 1, 4), *t2 = calloc((size_t)d + 1, 4);
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)(((uint64_t)i * 2654435761u % 4294967296u) % (uint64_t)V);
    double pre = 0, dec = 0, wpre = 0, wdec = 0;
    if (warm && once(e, prompt, n, d, t2, &wpre, &wdec)) return 1;
    if (once(e, prompt, n, d, t1, &pre, &dec)) return 1;
    const bool differ = warm && memcmp(t1, t2, sizeof(int32_t) * ((size_t)d + 1));
    printf("timing: %s ctx %d: load %.1f s, prefill %.3f s (%.0f tok/s), decode %.2f ms/token over %d steps%s%s\n",
           engine_geometry(e)->name, n, load, pre, n / pre, 1e3 * dec, d, warm ? "" : " (no warmup)",
           warm ? (differ ? "; TOKENS DIFFER from warmup: FAIL" : "; tokens repeat") : "");
    if (warm) printf("timing: warmup run prefill %.3f s, decode %.2f ms/token\n", wpre, 1e3 * wdec);
    engine_close(e);
    free(prompt);
    free(t1);
    free(t2);
    return differ ? 1 : 0;
}
