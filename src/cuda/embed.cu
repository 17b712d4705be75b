// embed.cu: token embedding lookup, dequantizing one row of the 4-bit table per token (§2.1).
#include "common.cuh"

static __global__ void embed_kernel(struct dqt E, const int32_t *tokens, float *out) {
    const int t = blockIdx.x, K = E.cols, per = 32 / E.bits;
    const size_t row = (size_t)tokens[t];
    const uint32_t *w = E.w + row * (size_t)(K / per);
    const uint16_t *s = E.scales + row * (size_t)(K / QGROUP), *b = E.biases + row * (size_t)(K / QGROUP);
    const uint32_t mask = (1u << E.bits) - 1;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        uint32_t q = (w[k / per] >> ((k % per) * E.bits)) & mask;
        out[(size_t)t * K + k] = bf16f(s[k / QGROUP]) * (float)q + bf16f(b[k / QGROUP]);
    }
}

extern "C" int k_embed(struct dqt E, const int32_t *tokens, int T, float *out, void *stream) {
    if (T <= 0) return 0;
    embed_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(E, tokens, out);
    return launch_status();
}
