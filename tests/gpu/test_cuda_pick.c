// test_cuda_pick.c: k_pick (src/cuda/pick.cu) against a double-precision host reference on random
// rows of logits at the model's vocabulary, with planted ties, masks of several densities (and one
// that allows nothing), every top-k from 0 to 20; then its time a call.
// Exit 0 when every check passes, 1 when one fails, 2 on a CUDA error, 77 without a GPU.
#include "backend_cuda.h"
#include "cuda/kernels.h"
#include "cuda/pick.h"
#include "gpu/gpu_test.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails, checks;

static void check(bool ok, const char *what, int c) {
    checks++;
    if (!ok) {
        fails++;
        printf("FAIL case %d: %s\n", c, what);
    }
}

// Host reference: (value desc, id asc) order.
static bool better(const float *x, int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); }

int main(int argc, char **argv) {
    char why[256];
    if (!backend_cuda_available(why, sizeof why)) {
        printf("test_cuda_pick: no suitable GPU (%s); ran nothing: FAIL\n", why);
        return 77;
    }
    if (argc > 1) rng ^= strtoull(argv[1], NULL, 10) * 0x9E3779B97F4A7C15ull;
    const int V = 248320, W = (V + 31) / 32;
    float *x = malloc(sizeof(float) * V), *dx;
    uint32_t *mask = malloc(4u * W), *dmask;
    struct k_pick *dout, out;
    void *ws;
    CUDA_OK(cudaMalloc(&ws, k_pick_ws_bytes()));
    CUDA_OK(cudaMemset(ws, 0, k_pick_ws_bytes()));
    CUDA_OK(cudaMalloc((void **)&dx, sizeof(float) * V));
    CUDA_OK(cudaMalloc((void **)&dmask, 4u * W));
    CUDA_OK(cudaMalloc((void **)&dout, sizeof out));
    int *order = malloc(sizeof(int) * V);
    for (int c = 0; c < 40; c++) {
        const float scale = c % 3 == 0 ? 3.0f : c % 3 == 1 ? 12.0f : 0.5f;
        for (int i = 0; i < V; i++) x[i] = scale * frand();
        // ties at the top and inside the top 20: the lower id must win
        const int a = (int)(rnd() % V), b = (int)(rnd() % V);
        x[a] = x[b] = 3.5f * scale;
        for (int k = 0; k < 6; k++) x[rnd() % V] = 2.0f * scale;
        const int density = c % 4;   // 0: no mask, 1: 1 in 2, 2: 1 in 2,000, 3: nothing allowed (c = 3) or one id
        for (int w = 0; w < W; w++) mask[w] = density == 1 ? rnd() : 0;
        if (density == 2)
            for (int k = 0; k < V / 2000; k++) {
                const int i = (int)(rnd() % V);
                mask[i >> 5] |= 1u << (i & 31);
            }
        if (density == 3 && c != 3) {
            const int i = (int)(rnd() % V);
            mask[i >> 5] |= 1u << (i & 31);
        }
        const int n_top = c % 21, want = n_top || c % 2;
        // the last cases: a row that starts off a 16-byte boundary and ends in a partial float4
        const int off = c >= 36 ? c - 35 : 0, n = V - off - (c >= 36 ? 2 : 0);
        CUDA_OK(cudaMemcpy(dx, x, sizeof(float) * V, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dmask, mask, 4u * W, cudaMemcpyHostToDevice));
        memset(&out, 0x5a, sizeof out);
        CUDA_OK(cudaMemcpy(dout, &out, sizeof out, cudaMemcpyHostToDevice));
        CUDA_OK((cudaError_t)k_pick(dx + off, n, density ? dmask : NULL, n_top, want, ws, dout, NULL));
        CUDA_OK(cudaMemcpy(&out, dout, sizeof out, cudaMemcpyDeviceToHost));
        // reference, on the row x + off [n] (the mask indexed from the row's start, as the kernel does)
        if (off) {
            memmove(x, x + off, sizeof(float) * n);
            for (int i = n; i < V; i++) x[i] = -INFINITY;
        }
        int g = 0, ch = -1;
        double mx = -INFINITY, s = 0;
        for (int i = 0; i < n; i++) {
            if (better(x, i, g)) g = i;
            if (density && (mask[i >> 5] >> (i & 31) & 1u) && (ch < 0 || better(x, i, ch))) ch = i;
            mx = x[i] > mx ? x[i] : mx;
        }
        for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
        const double lse = mx + log(s);
        if (!density) ch = g;
        check(out.greedy == g, "greedy id", c);
        check(out.chosen == ch, "chosen id (masked argmax)", c);
        if (want) {
            check(fabs(out.greedy_lp - (x[g] - lse)) <= 1e-5 * (1 + fabs(x[g] - lse)), "greedy logprob", c);
            if (ch >= 0) check(fabs(out.chosen_lp - (x[ch] - lse)) <= 1e-5 * (1 + fabs(x[ch] - lse)), "chosen logprob", c);
        }
        check(out.n_top == n_top, "n_top", c);
        // the reference top n_top by partial selection
        for (int i = 0; i < n; i++) order[i] = i;
        for (int j = 0; j < n_top; j++) {
            int b2 = j;
            for (int i = j + 1; i < n; i++)
                if (better(x, order[i], order[b2])) b2 = i;
            const int t = order[j];
            order[j] = order[b2], order[b2] = t;
            check(out.top_id[j] == order[j], "top id", c);
            check(fabs(out.top_lp[j] - (x[order[j]] - lse)) <= 1e-5 * (1 + fabs(x[order[j]] - lse)), "top logprob", c);
        }
    }
    // Time: greedy with a mask, and top 20 with log-probabilities (the two request kinds).
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int form = 0; form < 3; form++) {
        const int n_top = form == 2 ? 20 : 0, want = form != 0;
        for (int r = 0; r < 10; r++) k_pick(dx, V, form == 0 ? dmask : NULL, n_top, want, ws, dout, NULL);
        CUDA_OK(cudaEventRecord(e0, 0));
        for (int r = 0; r < 200; r++) k_pick(dx, V, form == 0 ? dmask : NULL, n_top, want, ws, dout, NULL);
        CUDA_OK(cudaEventRecord(e1, 0));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        printf("k_pick %-28s %.1f us a call\n",
               form == 0 ? "masked argmax:" : form == 1 ? "argmax + logprob:" : "argmax + top 20 logprobs:", 1e3 * ms / 200);
    }
    printf("test_cuda_pick: %d checks, %d failed: %s\n", checks, fails, fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
