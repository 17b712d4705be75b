// test_cuda_chunking.c: the CUDA prefill gives bit-identical results however a prompt is cut
// into chunks of two or more tokens (the session cache continues a snapshot with the rest of a
// prompt and must match one prefill). Cuts land on and beside the 64-key tiles of the prefill
// attention and past the first 1,024 keys, so queries fall in different blocks and rows.
//
//   test_cuda_chunking MODEL_DIR [N_PROMPT=2600]
//
// Exit 0 when every cut set ran and matched; 1 when one differs or none could run (N_PROMPT too
// short for every cut set), 2 on bad arguments, 77 when there is no suitable GPU (never a pass).
//
// One-token chunks run the decode kernels (matvec, 256-key splits): equal within rounding, not
// bit for bit, so they are not part of this check.
#include "backend_cuda.h"
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int prefill(struct engine *e, const int32_t *p, int n, const int *cuts, int n_cuts, float *last, int32_t *next) {
    char err[512];
    struct seq *s;
    if (seq_new(e, n + 1, &s, err, sizeof err)) {
        fprintf(stderr, "seq_new: %s\n", err);
        return -1;
    }
    int at = 0;
    for (int c = 0; c <= n_cuts; c++) {
        int end = c < n_cuts ? cuts[c] : n;
        int row = end - at - 1;
        struct forward_opts o = {.logit_rows = &row, .n_logit_rows = 1, .logits = last};
        if (engine_forward(e, s, p + at, end - at, c == n_cuts ? &o : NULL, next, err, sizeof err)) {
            fprintf(stderr, "forward: %s\n", err);
            seq_free(s);
            return -1;
        }
        at = end;
    }
    seq_free(s);
    return 0;
}

int main(int argc, char **argv) {
    // The bounds below are those of the verification mode (fp32-level products): the fast mode's
    // bf16 products are checked per kernel (test_cuda_kernels, the decode lab, test_tcgemv).
    // CALLA_EXACT=0 in the environment runs the fast mode against these bounds anyway.
    setenv("CALLA_EXACT", "1", 0);
    if (argc < 2) {
        fprintf(stderr, "usage: test_cuda_chunking MODEL_DIR [N_PROMPT]\n");
        return 2;
    }
    char why[256], err[512];
    const int n = argc > 2 ? atoi(argv[2]) : 2600;
    if (n < 4) {
        fprintf(stderr, "test_cuda_chunking: N_PROMPT must be at least 4\n");
        return 2;
    }
    if (!backend_cuda_available(why, sizeof why)) {
        printf("test_cuda_chunking: no suitable GPU (%s); ran nothing: FAIL\n", why);
        return 77;
    }
    struct engine *e;
    struct engine_options o = {.backend = "cuda"};
    if (engine_open(argv[1], &o, &e, err, sizeof err)) {
        fprintf(stderr, "cuda open: %s\n", err);
        return 1;
    }
    const int V = engine_geometry(e)->vocab;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) p[i] = (int32_t)(((uint64_t)(i + 11) * 2654435761u % 4294967296u) % (uint64_t)V);
    float *ref = malloc(sizeof(float) * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
    int32_t t_ref, t_got;
    if (prefill(e, p, n, NULL, 0, ref, &t_ref)) return 1;
    const int cut_sets[][3] = {{2, 0, 0}, {63, 0, 0}, {64, 0, 0}, {1025, 0, 0}, {700, 1500, 2100}, {n - 2, 0, 0}};
    const int n_set[] = {1, 1, 1, 1, 3, 1};
    int fails = 0, ran = 0;
    for (int k = 0; k < 6; k++) {
        bool ok_cuts = true;
        for (int c = 0; c < n_set[k]; c++) ok_cuts &= cut_sets[k][c] >= 2 && cut_sets[k][c] <= n - 2;
        if (!ok_cuts) continue;
        if (prefill(e, p, n, cut_sets[k], n_set[k], got, &t_got)) return 1;
        int same = !memcmp(ref, got, sizeof(float) * (size_t)V) && t_ref == t_got;
        fails += !same;
        ran++;
        printf("CHECK prefill %d cut at %d%s%s: %s\n", n, cut_sets[k][0], n_set[k] > 1 ? ",..." : "",
               same ? "" : " (logits differ)", same ? "PASS" : "FAIL");
    }
    free(p);
    free(ref);
    free(got);
    engine_close(e);
    if (!ran) printf("test_cuda_chunking: no cut set fits a prompt of %d tokens; ran nothing\n", n);
    printf("test_cuda_chunking: %s (%d cut sets)\n", fails || !ran ? "FAIL" : "PASS", ran);
    return fails || !ran ? 1 : 0;
}
