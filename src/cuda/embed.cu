// embed.cu: token embedding lookup, dequantizing one row of the 4-bit table per token (§2.1): the
// prefill chunk's tokens (k_embed), and the decode step's one token read on the device (k_dv_embed).
#include "common.cuh"

static __global__ void embed_kernel(struct dqt E, const int32_t *tokens, float *out) {
    const int t = blockIdx.x;
    dequant_row(E, (size_t)tokens[t], out + (size_t)t * E.cols);
}

extern "C" int k_embed(struct dqt E, const int32_t *tokens, int T, float *out, void *stream) {
    if (T <= 0) return 0;
    embed_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(E, tokens, out);
    return launch_status();
}

// ---- decode -----------------------------------------------------------------------------------------

// x = dequant(E[io[0]]); also clears the argmax key of the step.
static __global__ void dv_embed_kernel(struct dqt E, const int *io, float *x, unsigned long long *best) {
    pdl_wait();
    pdl_trigger();
    dequant_row(E, (size_t)io[0], x);
    if (threadIdx.x == 0 && best) *best = 0;
}

extern "C" int k_dv_embed(struct dqt E, const int *io, float *x, unsigned long long *best, const struct dec_launch *l) {
    return launch_k(dv_embed_kernel, dim3(1), dim3(256), 0, l, E, io, x, best);
}
