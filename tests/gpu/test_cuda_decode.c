// test_cuda_decode.c: the decode paths end to end, checked.
//
//   test_cuda_decode e2e MODEL_DIR N STEPS   prefill N hash-prompt tokens, then STEPS greedy steps
//                                            on the graph (with and without PDL) and eager paths
//                                            and (N <= 512) the CPU oracle: logits per step
//                                            compared, tokens compared where the margin is clear,
//                                            ms per step; then the fast mode against the exact one
// Exit 0 when every check passes, 1 when one fails, 2 on a CUDA error or bad arguments, 77 when
// there is no GPU (ran nothing: gpu-check records a FAIL). The decode kernels one by one, and the
// measurements of the step (replay, stages, profile), are bench/lab/decode_lab.c.
#include "backend_cuda.h"
#include "checkpoint.h"
#include "engine.h"
#include "gpu/gpu_test.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails, checks;

// ---- end to end ---------------------------------------------------------------------------------

// Prefill n tokens of the hash prompt, then steps greedy steps feeding `forced` (when not NULL)
// or its own tokens; logits of each step into lg [steps, V], the token fed at each step into tok,
// ms/step into *ms.
static int run(struct engine *e, int n, int steps, const int32_t *forced, float *lg, int32_t *tok, double *ms) {
    const int V = engine_geometry(e)->vocab;
    char err[512];
    struct seq *s;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)n), next;
    for (int i = 0; i < n; i++) p[i] = (int32_t)((uint32_t)((uint64_t)i * 2654435761u) % (uint32_t)V);
    if (seq_new(e, n + steps + 1, &s, err, sizeof err)) goto fail;
    if (engine_forward(e, s, p, n, NULL, &next, err, sizeof err)) goto fail;
    double t = 0;
    for (int k = 0; k < steps; k++) {
        int32_t in = forced ? forced[k] : next;
        int r0 = 0;
        struct forward_opts o = {.logit_rows = &r0, .n_logit_rows = lg ? 1 : 0, .logits = lg ? lg + (size_t)k * V : NULL};
        const double t0 = now_s();
        if (engine_forward(e, s, &in, 1, &o, &next, err, sizeof err)) goto fail;
        if (k >= 2) t += now_s() - t0;   // the first steps capture the graph
        tok[k] = in;
    }
    *ms = steps > 2 ? 1000 * t / (steps - 2) : 0;
    seq_free(s);
    free(p);
    return 0;
fail:
    fprintf(stderr, "forward: %s\n", err);
    free(p);
    return -1;
}

static int e2e(const char *dir, int n, int steps) {
    char err[512];
    struct engine *e = NULL, *cpu = NULL;
    struct engine_options o = {.backend = "cuda"};
    if (engine_open(dir, &o, &e, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    const int V = engine_geometry(e)->vocab;
    struct cuda_tuning *tu = backend_cuda_tuning(e);
    tu->exact_prefill = true;   // the paths compared here differ in decode only
    const bool eager[] = {false, false, true}, pdl[] = {true, false, true};
    float *lg[4];
    int32_t *tok[4];
    double ms[4] = {0};
    for (int m = 0; m < 4; m++) lg[m] = malloc(sizeof(float) * (size_t)steps * V), tok[m] = malloc(4 * (size_t)steps);
    // Exact mode for the comparison of paths (fast mode is checked per kernel by the lab and
    // test_tcgemv, and reported against exact mode below). Path 0 runs greedily; the others are
    // fed its tokens, so rows stay aligned.
    tu->exact_decode = true;
    for (int m = 0; m < 3; m++) {
        tu->eager = eager[m], tu->pdl = pdl[m];
        if (run(e, n, steps, m ? tok[0] : NULL, lg[m], tok[m], &ms[m])) return 2;
    }
    int have_cpu = 0;
    if (n <= 512) {
        struct engine_options oc = {.backend = "cpu", .kv_f32 = false};
        engine_close(e);   // the CPU engine maps the same checkpoint
        e = NULL;
        if (engine_open(dir, &oc, &cpu, err, sizeof err) == 0) {
            have_cpu = run(cpu, n, steps, tok[0], lg[3], tok[3], &ms[3]) == 0;
            engine_close(cpu);
        }
    }
    // graph+pdl vs graph vs eager: the same kernels, the same order: bit-identical.
    const char *names[] = {"graph+pdl", "graph", "eager", "cpu oracle"};
    printf("decode paths, %s, prompt %d, %d steps\n", dir, n, steps);
    printf("%-11s %9s %12s %12s %9s\n", "path", "ms/step", "nerr mean", "nerr max", "tok diff");
    int bad = 0;
    for (int m = 0; m < 4; m++) {
        if (m == 3 && !have_cpu) continue;
        double mean = 0, mx = 0;
        int diff = 0;
        for (int k = 0; k < steps; k++) {
            const double ne = nerr_f(lg[0] + (size_t)k * V, lg[m] + (size_t)k * V, (size_t)V);
            mean += ne / steps;
            if (ne > mx) mx = ne;
            float mg, m0;
            const int tm = argmax_margin(lg[m] + (size_t)k * V, V, &mg), t0 = argmax_margin(lg[0] + (size_t)k * V, V, &m0);
            if (t0 != tm && mg > 0.5f) diff++;   // test_cuda_e2e's MARGIN_CLEAR
        }
        printf("%-11s %9.3f %12.3e %12.3e %9d\n", names[m], ms[m], mean, mx, diff);
        // Same kernels (graph, eager): exact. CPU: other summation orders in fp32 over a
        // full-shape random model (routing near-ties flip: README.md, Correctness), so the bound is
        // the one test_cuda_e2e uses for CUDA vs CPU (2e-2 per row), and no clear-margin flips.
        const double tol = m <= 2 ? 0.0 : 2e-2;
        checks++;
        if (!(mx <= tol) || diff) {
            fails++;
            bad = 1;
            printf("FAIL %s: nerr max %.3e (bound %.1e), %d clear-margin token differences\n", names[m], mx, tol, diff);
        }
    }
    // Determinism: the graph path again gives the same tokens.
    if (!e) {
        if (engine_open(dir, &o, &e, err, sizeof err)) return 2;
        tu = backend_cuda_tuning(e);
        tu->exact_prefill = tu->exact_decode = true;
    }
    tu->eager = false, tu->pdl = true;
    int32_t *again = malloc(4 * (size_t)steps);
    double ms2;
    if (run(e, n, steps, NULL, NULL, again, &ms2)) return 2;
    checks++;
    if (memcmp(again, tok[0], 4 * (size_t)steps)) {
        fails++;
        bad = 1;
        printf("FAIL graph path tokens differ between two runs\n");
    }
    printf("graph+pdl again: %.3f ms/step, tokens %s\n", ms2, bad ? "-" : "identical");
    // Fast mode (the default): fed the exact path's tokens, its logits against exact mode's
    // (reported: the fast mode's bound is per kernel, not end to end), then greedy twice:
    // deterministic.
    tu->exact_decode = false;
    float *lf = malloc(sizeof(float) * (size_t)steps * V);
    int32_t *tf = malloc(4 * (size_t)steps), *g1 = malloc(4 * (size_t)steps), *g2 = malloc(4 * (size_t)steps);
    double msf, msg;
    if (run(e, n, steps, tok[0], lf, tf, &msf) || run(e, n, steps, NULL, NULL, g1, &msg) ||
        run(e, n, steps, NULL, NULL, g2, &msg))
        return 2;
    double fmean = 0, fmax = 0;
    int fflip = 0;
    for (int k = 0; k < steps; k++) {
        const double ne = nerr_f(lg[0] + (size_t)k * V, lf + (size_t)k * V, (size_t)V);
        fmean += ne / steps;
        if (ne > fmax) fmax = ne;
        float mg, m0;
        const int tm = argmax_margin(lf + (size_t)k * V, V, &mg), t0 = argmax_margin(lg[0] + (size_t)k * V, V, &m0);
        if (t0 != tm && mg > 0.5f) fflip++;
    }
    // The bound is loose on purpose: fast mode's rounding is bounded per kernel (the lab,
    // test_tcgemv); end to end it measured 4.7e-3 mean, 9.8e-3 max at the full shape (2026-11-30).
    // 0.1 leaves 10x headroom for other checkpoints and still fails on a wrong layout, expert or
    // row (errors of order 1). Clear-margin flips are reported, not bounded.
    printf("%-11s %9.3f %12.3e %12.3e %9d   (fast mode vs exact, bound 1e-1)\n", "fast graph", msg, fmean, fmax,
           fflip);
    checks++;
    if (!(fmax <= 0.1)) {
        fails++;
        bad = 1;
        printf("FAIL fast mode: nerr max %.3e against exact mode\n", fmax);
    }
    checks++;
    if (memcmp(g1, g2, 4 * (size_t)steps)) {
        fails++;
        bad = 1;
        printf("FAIL fast mode: greedy tokens differ between two runs\n");
    }
    free(lf), free(tf), free(g1), free(g2);
    engine_close(e);
    return bad;
}

int main(int argc, char **argv) {
    rng = 0x9E3779B97F4A7C15ull;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "test_cuda_decode: no CUDA device: this test needs an sm_90 GPU: ran nothing\n");
        return 77;
    }
    if (argc >= 5 && !strcmp(argv[1], "e2e")) e2e(argv[2], atoi(argv[3]), atoi(argv[4]));
    else {
        fprintf(stderr, "usage: test_cuda_decode e2e MODEL_DIR N STEPS\n");
        return 2;
    }
    printf("%d passed, %d failed\n", checks - fails, fails);
    return fails ? 1 : checks ? 0 : 1;
}
