// pick_lab.c: the host sampler's time a step (src/pick.c, pick_row with sampling) on rows of the
// vocabulary's size, under the settings clients send (Qwen's recommended ones first).
//
//   pick_lab [SPREAD=3] [STEPS=50]
//
// The row: Gaussian logits of standard deviation SPREAD (a random-weight model's rows are about
// 3; a trained model's are more peaked, which only shortens the cuts' sorts). Prints ms per draw
// for each setting. Exit 0, 2 on bad arguments.
#include "pick.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    enum { V = 248320 };
    const double spread = argc > 1 ? atof(argv[1]) : 3.0;
    const int steps = argc > 2 ? atoi(argv[2]) : 50;
    if (!(spread > 0) || steps < 1) {
        fprintf(stderr, "usage: pick_lab [SPREAD > 0] [STEPS >= 1]\n");
        return 2;
    }
    float *x = malloc(sizeof *x * V), *scratch = malloc(sizeof *scratch * V);
    if (!x || !scratch) return 1;
    uint64_t r = 1;
    for (int i = 0; i < V; i++) { // Box-Muller over a xorshift stream
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const double a = ((r >> 11) + 0.5) * 0x1.0p-53;
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const double b = (r >> 11) * 0x1.0p-53;
        x[i] = (float)(spread * sqrt(-2 * log(a)) * cos(6.283185307179586 * b));
    }
    const struct {
        const char *name;
        struct engine_sampling s;
    } cases[] = {
        {"temperature 0.6, top_p 0.95, top_k 20", {.temperature = 0.6f, .top_p = 0.95f, .top_k = 20}},
        {"temperature 0.7, top_p 0.8, top_k 20", {.temperature = 0.7f, .top_p = 0.8f, .top_k = 20}},
        {"temperature 1", {.temperature = 1, .top_p = 1}},
        {"temperature 1, min_p 0.05", {.temperature = 1, .top_p = 1, .min_p = 0.05f}},
        {"temperature 1, top_p 0.95", {.temperature = 1, .top_p = 0.95f}},
        {"temperature 1, top_k 40", {.temperature = 1, .top_p = 1, .top_k = 40}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct engine_choice ch;
        const double t = now_s();
        for (int k = 0; k < steps; k++) {
            const struct engine_pick p = {.n_top = -1, .sampling = &cases[c].s, .step = (uint64_t)k};
            pick_row(x, V, &p, NULL, scratch, &ch);
        }
        printf("%-40s %7.3f ms a draw\n", cases[c].name, (now_s() - t) / steps * 1e3);
    }
    free(x), free(scratch);
    return 0;
}
