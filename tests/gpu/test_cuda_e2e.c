// test_cuda_e2e.c: the CUDA backend against the CPU reference, end to end (issue 5, item 5).
//
//   test_cuda_e2e MODEL_DIR [N_PROMPT=64] [N_DECODE=32]
//
// 1. CPU and CUDA: prefill of N_PROMPT hash-prompt tokens with the logits of every row, then
//    N_DECODE greedy decode steps (each backend feeding the CPU's tokens, so rows stay aligned),
//    logits of every step. Per row: normalised error |cuda - cpu|_2 / |cpu|_2, and whether the
//    argmax agrees; a disagreement counts only where the CPU's top1 - top2 margin is clear.
// 2. CUDA state: prefill N + k decode steps == prefill of N + k tokens (next-token logits).
// 3. CUDA chunking: the prompt in chunks of 16 == one chunk.
// 4. CUDA determinism: two runs give bit-identical tokens and logits.
// Prints a table; exit 0 when every check passes, 1 when one fails, 2 on bad arguments, 77 when
// there is no suitable GPU (nothing ran: never a pass).
// TEST_GDN=recurrent: prefill's delta rule token by token (cuda_tuning's gdn_recurrent), not chunked.
#include "backend_cuda.h"
#include "engine.h"
#include "gpu/gpu_test.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TOL_ROW 2e-2      // normalised logit error per row (fp32 activations on both sides)
#define TOL_MEAN 5e-3     // mean over rows
#define MARGIN_CLEAR 0.5f // a token disagreement counts only above this CPU margin

static double nerr(const float *a, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// Prefill the prompt (logits of every row) and decode n_dec steps feeding forced[] (or its own
// greedy tokens when forced is NULL). logits: [(n_p + n_dec), V]; toks: the greedy token after
// each row of the prompt's last row and each step.
static int run_seq(struct engine *e, const int32_t *prompt, int n_p, const int32_t *forced, int n_dec, int chunk,
                   float *logits, int32_t *toks, double *t_pre, double *t_dec) {
    const int V = engine_geometry(e)->vocab;
    char err[512];
    struct seq *s;
    if (seq_new(e, n_p + n_dec + 1, &s, err, sizeof err)) {
        fprintf(stderr, "seq_new: %s\n", err);
        return -1;
    }
    int rows[n_p];
    for (int i = 0; i < n_p; i++) rows[i] = i;
    struct forward_opts o = {.logit_rows = rows, .n_logit_rows = n_p, .logits = logits, .chunk = chunk};
    int32_t next;
    double t0 = now_s();
    if (engine_forward(e, s, prompt, n_p, &o, &next, err, sizeof err)) goto fail;
    double t1 = now_s();
    toks[0] = next;
    for (int k = 0; k < n_dec; k++) {
        int32_t in = forced ? forced[k] : toks[k];
        int r0 = 0;
        struct forward_opts od = {.logit_rows = &r0, .n_logit_rows = 1, .logits = logits + (size_t)(n_p + k) * V};
        if (engine_forward(e, s, &in, 1, &od, &next, err, sizeof err)) goto fail;
        toks[k + 1] = next;
    }
    if (t_pre) *t_pre = t1 - t0;
    if (t_dec) *t_dec = n_dec ? (now_s() - t1) / n_dec : 0;
    seq_free(s);
    return 0;
fail:
    fprintf(stderr, "forward: %s\n", err);
    seq_free(s);
    return -1;
}

int main(int argc, char **argv) {
    // The bounds below are those of the verification mode (fp32-level products): the fast mode's
    // bf16 products are checked per kernel (test_cuda_kernels, the decode lab, test_tcgemv).
    // CALLA_EXACT=0 in the environment runs the fast mode against these bounds anyway.
    setenv("CALLA_EXACT", "1", 0);
    if (argc < 2) {
        fprintf(stderr, "usage: test_cuda_e2e MODEL_DIR [N_PROMPT] [N_DECODE]\n");
        return 2;
    }
    const char *dir = argv[1];
    const int n_p = argc > 2 ? atoi(argv[2]) : 64, n_dec = argc > 3 ? atoi(argv[3]) : 32;
    char err[512], why[256];
    if (n_p < 1 || n_dec < 1) {
        fprintf(stderr, "test_cuda_e2e: N_PROMPT and N_DECODE must be at least 1\n");
        return 2;
    }
    if (!backend_cuda_available(why, sizeof why)) {
        printf("test_cuda_e2e: no suitable GPU (%s); ran nothing: FAIL\n", why);
        return 77;
    }
    struct engine *ec, *eg;
    struct engine_options oc = {.backend = "cpu"}, og = {.backend = "cuda"};
    double t0 = now_s();
    if (engine_open(dir, &oc, &ec, err, sizeof err)) {
        fprintf(stderr, "cpu open: %s\n", err);
        return 1;
    }
    if (engine_open(dir, &og, &eg, err, sizeof err)) {
        fprintf(stderr, "cuda open: %s\n", err);
        return 1;
    }
    const char *gdn_env = getenv("TEST_GDN");   // "recurrent": prefill's delta rule token by token
    backend_cuda_tuning(eg)->gdn_recurrent = gdn_env && !strcmp(gdn_env, "recurrent");
    printf("# model %s (%s), loaded in %.1f s, %s, GPU weights %.3f GB\n", dir, engine_geometry(eg)->name, now_s() - t0,
           why, (double)engine_weight_bytes(eg) / 1e9);
    const int V = engine_geometry(ec)->vocab, R = n_p + n_dec;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(n_p + n_dec + 8));
    for (int i = 0; i < n_p + n_dec + 8; i++) prompt[i] = (int32_t)(((uint64_t)i * 2654435761u % 4294967296u) % (uint64_t)V);
    float *lc = malloc(sizeof(float) * (size_t)R * V), *lg = malloc(sizeof(float) * (size_t)R * V);
    float *lg2 = malloc(sizeof(float) * (size_t)R * V);
    int32_t *tc = malloc(sizeof(int32_t) * (size_t)(n_dec + 1)), *tg = malloc(sizeof(int32_t) * (size_t)(n_dec + 1));
    int32_t *tg2 = malloc(sizeof(int32_t) * (size_t)(n_dec + 1));
    int fails = 0;
    double tpc, tdc, tpg, tdg;
    if (run_seq(ec, prompt, n_p, NULL, n_dec, 0, lc, tc, &tpc, &tdc)) return 1;
    // CUDA decodes the CPU's tokens so that every row compares the same context.
    if (run_seq(eg, prompt, n_p, tc, n_dec, 0, lg, tg, &tpg, &tdg)) return 1;
    printf("# cpu: prefill %.2f s, decode %.1f ms/step; cuda: prefill %.3f s, decode %.2f ms/step\n", tpc,
           1e3 * tdc, tpg, 1e3 * tdg);
    double worst = 0, sum = 0;
    int agree = 0, clear = 0, clear_bad = 0;
    printf("%-6s %-8s %-12s %-8s %-8s %-10s\n", "row", "pos", "nerr", "cpu_top", "gpu_top", "cpu_margin");
    for (int r = 0; r < R; r++) {
        float mc, mg;
        int ac = argmax_margin(lc + (size_t)r * V, V, &mc), ag = argmax_margin(lg + (size_t)r * V, V, &mg);
        double ne = nerr(lg + (size_t)r * V, lc + (size_t)r * V, V);
        worst = ne > worst ? ne : worst;
        sum += ne;
        agree += ac == ag;
        if (mc > MARGIN_CLEAR) {
            clear++;
            clear_bad += ac != ag;
        }
        if (r < 4 || r == n_p - 1 || r == R - 1 || ac != ag || ne > TOL_ROW)
            printf("%-6d %-8d %-12.3e %-8d %-8d %-10.4f%s\n", r, r < n_p ? r : r, ne, ac, ag, mc,
                   ac != ag ? (mc > MARGIN_CLEAR ? "  MISMATCH" : "  (tie-ish)") : "");
    }
    // Sensitivity of the model itself to rounding: the same prompt through the decode kernels
    // (chunk 1: matvec, gathered experts, split attention) against the prefill kernels (tiled).
    // Same math, different summation order; with random weights the 40-layer network amplifies
    // rounding, and a router near-tie flips a discrete expert choice.
    double self_mean = 0, self_max = 0;
    {
        float *l1 = malloc(sizeof(float) * (size_t)n_p * V);
        int32_t t1[1];
        if (run_seq(eg, prompt, n_p, NULL, 0, 1, l1, t1, NULL, NULL)) return 1;
        for (int r = 0; r < n_p; r++) {
            double ne = nerr(l1 + (size_t)r * V, lg + (size_t)r * V, V);
            self_mean += ne / n_p;
            self_max = ne > self_max ? ne : self_max;
        }
        free(l1);
        printf("INFO gpu self-sensitivity (decode kernels vs prefill kernels, prompt rows): nerr max %.3e mean %.3e\n",
               self_max, self_mean);
    }
    // The reference's own sensitivity to the bf16 KV cache: the CPU with an fp32 KV cache against
    // the CPU with the production bf16 one (same tokens). A bf16 rounding that flips by one unit
    // (2^-8 relative) in K or V is the smallest perturbation the GPU's different summation order
    // can cause; this measures what the network makes of such perturbations.
    double kv_mean = 0, kv_max = 0;
    {
        struct engine *ef;
        struct engine_options of = {.backend = "cpu", .kv_f32 = true};
        if (engine_open(dir, &of, &ef, err, sizeof err)) {
            fprintf(stderr, "cpu open: %s\n", err);
            return 1;
        }
        float *lf = malloc(sizeof(float) * (size_t)R * V);
        int32_t *tf = malloc(sizeof(int32_t) * (size_t)(n_dec + 1));
        if (run_seq(ef, prompt, n_p, tc, n_dec, 0, lf, tf, NULL, NULL)) return 1;
        for (int r = 0; r < R; r++) {
            double ne = nerr(lc + (size_t)r * V, lf + (size_t)r * V, V);
            kv_mean += ne / R;
            kv_max = ne > kv_max ? ne : kv_max;
        }
        free(lf);
        free(tf);
        engine_close(ef);
        printf("INFO cpu bf16-KV vs fp32-KV sensitivity (all rows): nerr max %.3e mean %.3e\n", kv_max, kv_mean);
    }
    // Pass: no disagreement where the CPU's margin is clear, and a mean error within TOL_MEAN or
    // within twice the larger of the two sensitivities measured above.
    int over = 0;
    for (int r = 0; r < R; r++) over += nerr(lg + (size_t)r * V, lc + (size_t)r * V, V) > TOL_ROW;
    const double floor_mean = self_mean > kv_mean ? self_mean : kv_mean;
    const double tol_mean = TOL_MEAN > 2 * floor_mean ? TOL_MEAN : 2 * floor_mean;
    int ok1 = sum / R <= tol_mean && clear_bad == 0;
    fails += !ok1;
    printf("CHECK cuda-vs-cpu logits: rows %d, nerr max %.3e mean %.3e (tol mean %.1e; %d rows over %.0e); argmax "
           "agree %d/%d; clear-margin (>%.1f) rows %d, mismatches %d  %s\n",
           R, worst, sum / R, tol_mean, over, TOL_ROW, agree, R, MARGIN_CLEAR, clear, clear_bad, ok1 ? "PASS" : "FAIL");
    // 2. state: prefill N + k decode == prefill N + k. Uses the CUDA greedy tokens.
    {
        const int k = n_dec < 8 ? n_dec : 8;
        int32_t *seqtok = malloc(sizeof(int32_t) * (size_t)(n_p + k + 1));
        memcpy(seqtok, prompt, sizeof(int32_t) * (size_t)n_p);
        for (int i = 0; i < k; i++) seqtok[n_p + i] = tc[i];
        // a: prefill n_p + k, logits of the last row
        float *la = malloc(sizeof(float) * (size_t)(n_p + k) * V), *lb = lg;   // lb rows = run above
        int32_t ta[1];
        if (run_seq(eg, seqtok, n_p + k, NULL, 0, 0, la, ta, NULL, NULL)) return 1;
        // run above: after prefill n_p and k decodes of tc[0..k), row n_p + k - 1 holds the logits
        double ne = nerr(la + (size_t)(n_p + k - 1) * V, lb + (size_t)(n_p + k - 1) * V, V);
        int ok = ne <= 1e-3 && ta[0] == tg[k];
        fails += !ok;
        printf("CHECK state: prefill %d + %d decode vs prefill %d: nerr %.3e, next %d vs %d  %s\n", n_p, k, n_p + k, ne,
               tg[k], ta[0], ok ? "PASS" : "FAIL");
        free(la);
        free(seqtok);
    }
    // 3. chunked prefill (chunks of 16) vs one chunk
    {
        float *lk = malloc(sizeof(float) * (size_t)n_p * V);
        int32_t tk[1];
        if (run_seq(eg, prompt, n_p, NULL, 0, 16, lk, tk, NULL, NULL)) return 1;
        double w = 0;
        for (int r = 0; r < n_p; r++) {
            double ne = nerr(lk + (size_t)r * V, lg + (size_t)r * V, V);
            w = ne > w ? ne : w;
        }
        // The bound. With the token-by-token recurrence (test geometries, or TEST_GDN=recurrent)
        // a cut changes nothing but the attention tiles' order: 1e-3. With the chunked
        // delta rule (this model's heads, the default) each call groups its tokens in chunks of 64
        // from its own start, so cutting at 16 computes the same recurrence in another grouping:
        // rounding only (the kernel agrees with the recurrence to ~7e-6 across calls,
        // test_gdn_chunked T 130+170), which the random full-shape network amplifies as it does
        // the decode-vs-prefill summation order measured above. Measured on the H200
        // (2026-11-30): chunks of 16 vs one chunk 3.1e-2 max against a self-sensitivity of 5.6e-2
        // max. So there the bound is twice that measured sensitivity; the next token must agree.
        const char *gdn = getenv("TEST_GDN");
        const struct geometry *geo = engine_geometry(eg);
        const bool chunked_gdn = geo->lin_k_dim == 128 && geo->lin_v_dim == 128 && !(gdn && !strcmp(gdn, "recurrent"));
        const double tol = chunked_gdn && 2 * self_max > 1e-3 ? 2 * self_max : 1e-3;
        int ok = w <= tol && tk[0] == tg[0];
        fails += !ok;
        printf("CHECK chunks of 16 vs one chunk: nerr max %.3e (tol %.1e, %s delta rule), next %d vs %d  %s\n", w, tol,
               chunked_gdn ? "chunked" : "recurrent", tk[0], tg[0], ok ? "PASS" : "FAIL");
        free(lk);
    }
    // 4. determinism: a second identical run, bitwise
    {
        if (run_seq(eg, prompt, n_p, tc, n_dec, 0, lg2, tg2, NULL, NULL)) return 1;
        int same = !memcmp(lg, lg2, sizeof(float) * (size_t)R * V) && !memcmp(tg, tg2, sizeof(int32_t) * (size_t)(n_dec + 1));
        // and free-running greedy twice
        int32_t *f1 = malloc(sizeof(int32_t) * (size_t)(n_dec + 1)), *f2 = malloc(sizeof(int32_t) * (size_t)(n_dec + 1));
        if (run_seq(eg, prompt, n_p, NULL, n_dec, 0, lg2, f1, NULL, NULL) ||
            run_seq(eg, prompt, n_p, NULL, n_dec, 0, lg2, f2, NULL, NULL))
            return 1;
        same &= !memcmp(f1, f2, sizeof(int32_t) * (size_t)(n_dec + 1));
        int greedy_match = 0;
        for (int i = 0; i <= n_dec; i++) greedy_match += f1[i] == tc[i];
        fails += !same;
        printf("CHECK determinism: two runs bit-identical logits and tokens  %s (free-running greedy matches CPU on "
               "%d/%d tokens)\n",
               same ? "PASS" : "FAIL", greedy_match, n_dec + 1);
        printf("# cpu tokens: ");
        for (int i = 0; i <= n_dec; i++) printf("%s%d", i ? "," : "", tc[i]);
        printf("\n# gpu tokens: ");
        for (int i = 0; i <= n_dec; i++) printf("%s%d", i ? "," : "", f1[i]);
        printf("\n");
        free(f1);
        free(f2);
    }
    engine_close(ec);
    engine_close(eg);
    printf("test_cuda_e2e: %s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
