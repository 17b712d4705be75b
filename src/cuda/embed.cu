// embed.cu: token embedding lookup, dequantizing one row of the 4-bit table per token (§2.1).
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
