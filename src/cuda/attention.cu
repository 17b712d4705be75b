// attention.cu: full attention (MODEL.md §2.4): q/k RMSNorm + partial RoPE + KV append, then causal
// GQA softmax attention with the sigmoid output gate.
//
// Attention is split over blocks of keys (flash-decoding): each block of the grid (split, kv head,
// token group) runs an online softmax over its keys for the G = n_heads / n_kv query heads that
// share the kv head (one warp each) and TQ consecutive tokens, reading each K/V tile once into
// shared memory; a second kernel merges the splits and applies the gate. fp32 throughout; K/V bf16.
#include "common.cuh"

enum { AT_TILE = 32, AT_MAXD = 256, AT_MAXWARPS = 16 };

// ---- prep: norm + RoPE; k/v into the cache --------------------------------------------------

static __global__ void attn_prep_kernel(const float *qg, const float *k, const float *v, const float *q_norm,
                                        const float *k_norm, float *q, uint16_t *kc, uint16_t *vc, int p0, int cap,
                                        int n_heads, int n_kv, int D, int rope_dim, double theta, float eps) {
    __shared__ float buf[AT_MAXD];
    __shared__ float sh[32];
    const int t = blockIdx.x, h = blockIdx.y, p = p0 + t;
    const bool is_q = h < n_heads;
    const int j = h - n_heads;
    const float *src = is_q ? qg + ((size_t)t * n_heads + h) * 2 * D : k + ((size_t)t * n_kv + j) * D;
    const float *nw = is_q ? q_norm : k_norm;
    float ss = 0;
    for (int d = threadIdx.x; d < D; d += blockDim.x) ss += src[d] * src[d];
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    for (int d = threadIdx.x; d < D; d += blockDim.x) buf[d] = src[d] * r * nw[d];
    __syncthreads();
    const int half = rope_dim / 2;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float out = buf[d];
        if (d < rope_dim) {
            const int m = d < half ? d : d - half;
            const float inv_freq = (float)(1.0 / pow(theta, (double)(2 * m) / rope_dim));
            const float ang = (float)p * inv_freq;
            const float c = (float)cos((double)ang), s = (float)sin((double)ang);
            const float a = buf[m], b = buf[m + half];
            out = d < half ? a * c - b * s : a * s + b * c;
        }
        if (is_q) q[((size_t)t * n_heads + h) * D + d] = out;
        else {
            const size_t at = ((size_t)j * cap + p) * D + d;
            kc[at] = f2bf16(out);
            vc[at] = f2bf16(v[((size_t)t * n_kv + j) * D + d]);
        }
    }
}

extern "C" int k_attn_prep(const float *qg, const float *k, const float *v, const float *q_norm, const float *k_norm,
                           float *q, uint16_t *kc, uint16_t *vc, int T, int p0, int cap, int n_heads, int n_kv, int D,
                           int rope_dim, double theta, float eps, void *stream) {
    if (T <= 0) return 0;
    if (D > AT_MAXD) return (int)cudaErrorInvalidValue;
    dim3 grid(T, n_heads + n_kv);
    attn_prep_kernel<<<grid, 128, 0, (cudaStream_t)stream>>>(qg, k, v, q_norm, k_norm, q, kc, vc, p0, cap, n_heads,
                                                             n_kv, D, rope_dim, theta, eps);
    return launch_status();
}

// ---- split attention -------------------------------------------------------------------------

static __host__ __device__ int tokens_per_block(int G) {
    int tq = AT_MAXWARPS / G;
    return tq > 0 ? tq : 1;
}

// part[((t * n_heads + h) * n_split + split) * (D + 2)]: running max m, sum l, then o[D] (unnormalised).
template <int D>
static __global__ void __launch_bounds__(AT_MAXWARPS * WARP_SIZE)
    attention_kernel(const float *q, const uint16_t *kc, const uint16_t *vc, float *part, int T, int p0, int cap,
                     int n_heads, int n_kv, int split_len, int n_split) {
    constexpr int KW = D / 2;   // K tile row stride in words; lanes read it swizzled (no bank conflicts)
    constexpr int DL = D / WARP_SIZE;
    __shared__ uint32_t Ks[AT_TILE * KW];
    __shared__ __align__(16) uint16_t Vs[AT_TILE * D];
    __shared__ __align__(16) float qs[AT_MAXWARPS][D];
    const int split = blockIdx.x, kvh = blockIdx.y, G = n_heads / n_kv, TQ = tokens_per_block(G);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int tl = warp / G, h = kvh * G + warp % G;   // this warp's token (in the group) and head
    const int t = blockIdx.z * TQ + tl;
    const bool active = t < T && tl < TQ;
    const int kb = split * split_len;
    const int t_last = min(T - 1, (int)blockIdx.z * TQ + TQ - 1);
    const int ke_block = min(kb + split_len, p0 + t_last + 1);          // keys this block visits
    const int ke = active ? min(kb + split_len, p0 + t + 1) : kb;        // keys this warp uses
    if (active)
        for (int d = lane; d < D; d += WARP_SIZE) qs[warp][d] = q[((size_t)t * n_heads + h) * D + d];
    float m = -INFINITY, l = 0, o[DL];
#pragma unroll
    for (int i = 0; i < DL; i++) o[i] = 0;
    const float scale = rsqrtf((float)D);
    const uint32_t *kbase = (const uint32_t *)(kc + (size_t)kvh * cap * D);
    const uint32_t *vbase = (const uint32_t *)(vc + (size_t)kvh * cap * D);
    for (int k0 = kb; k0 < ke_block; k0 += AT_TILE) {
        __syncthreads();
        const int nk = min(AT_TILE, ke_block - k0);
        for (int i = threadIdx.x; i < AT_TILE * (D / 2); i += blockDim.x) {
            const int r = i / (D / 2), c = i % (D / 2);
            uint32_t kv = 0, vv = 0;
            if (r < nk) {
                kv = kbase[(size_t)(k0 + r) * (D / 2) + c];
                vv = vbase[(size_t)(k0 + r) * (D / 2) + c];
            }
            Ks[r * KW + c] = kv;
            ((uint32_t *)Vs)[i] = vv;
        }
        __syncthreads();
        if (!active || k0 >= ke) continue;
        // score of key k0 + lane
        const int key = k0 + lane;
        float s = -INFINITY;
        if (key < ke) {
            float acc = 0;
            const uint32_t *kr = Ks + lane * KW;
            const float2 *q2 = (const float2 *)qs[warp];
#pragma unroll 8
            for (int i = 0; i < KW; i++) {
                const int c = (i + lane) % KW;   // lane j starts at word j: distinct banks
                const uint32_t w = kr[c];
                const float2 qq = q2[c];
                acc += qq.x * __uint_as_float(w << 16) + qq.y * __uint_as_float(w & 0xffff0000u);
            }
            s = acc * scale;
        }
        const float m_new = fmaxf(m, warp_max(s));
        const float pj = key < ke ? expf(s - m_new) : 0.0f;
        const float corr = expf(m - m_new);
        l = l * corr + warp_sum(pj);
#pragma unroll
        for (int i = 0; i < DL; i++) o[i] *= corr;
        const int nv = min(AT_TILE, ke - k0);
        for (int jj = 0; jj < nv; jj++) {
            const float pv = __shfl_sync(0xffffffffu, pj, jj);
#pragma unroll
            for (int i = 0; i < DL; i++) o[i] += pv * bf16f(Vs[jj * D + lane + WARP_SIZE * i]);
        }
        m = m_new;
    }
    if (!active) return;
    float *pp = part + (((size_t)t * n_heads + h) * n_split + split) * (D + 2);
    if (lane == 0) {
        pp[0] = m;
        pp[1] = l;
    }
#pragma unroll
    for (int i = 0; i < DL; i++) pp[2 + lane + WARP_SIZE * i] = o[i];
}

// o[t, h*D + d] = sum_s o_s e^{m_s - M} / sum_s l_s e^{m_s - M} * sigmoid(gate)
static __global__ void attention_combine_kernel(const float *part, const float *qg, float *o, int n_heads, int D,
                                                int n_split) {
    const int t = blockIdx.x, h = blockIdx.y;
    const float *pp = part + ((size_t)t * n_heads + h) * n_split * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, pp[(size_t)s * (D + 2)]);
    float L = 0;
    for (int s = 0; s < n_split; s++) {
        const float ms = pp[(size_t)s * (D + 2)];
        if (ms != -INFINITY) L += pp[(size_t)s * (D + 2) + 1] * expf(ms - M);
    }
    const float *gate = qg + ((size_t)t * n_heads + h) * 2 * D + D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0;
        for (int s = 0; s < n_split; s++) {
            const float ms = pp[(size_t)s * (D + 2)];
            if (ms != -INFINITY) acc += pp[(size_t)s * (D + 2) + 2 + d] * expf(ms - M);
        }
        o[((size_t)t * n_heads + h) * D + d] = acc / L * sigmoid_f(gate[d]);
    }
}

extern "C" long k_attention_part_floats(int T, int n_keys, int n_heads, int D, int split_len) {
    return (long)T * n_heads * CEIL_DIV(n_keys, split_len) * (D + 2);
}

extern "C" int k_attention(const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, float *o,
                           float *part, int T, int p0, int cap, int n_heads, int n_kv, int D, int split_len,
                           void *stream) {
    if (T <= 0) return 0;
    const int G = n_heads / n_kv, TQ = tokens_per_block(G), n_split = CEIL_DIV(p0 + T, split_len);
    if (G > AT_MAXWARPS || n_heads % n_kv || split_len % AT_TILE) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    dim3 grid(n_split, n_kv, CEIL_DIV(T, TQ));
    const int threads = G * TQ * WARP_SIZE;
    switch (D) {
    case 256: attention_kernel<256><<<grid, threads, 0, st>>>(q, kc, vc, part, T, p0, cap, n_heads, n_kv, split_len, n_split); break;
    case 128: attention_kernel<128><<<grid, threads, 0, st>>>(q, kc, vc, part, T, p0, cap, n_heads, n_kv, split_len, n_split); break;
    case 64: attention_kernel<64><<<grid, threads, 0, st>>>(q, kc, vc, part, T, p0, cap, n_heads, n_kv, split_len, n_split); break;
    default: return (int)cudaErrorInvalidValue;
    }
    int rc = launch_status();
    if (rc) return rc;
    attention_combine_kernel<<<dim3(T, n_heads), 128, 0, st>>>(part, qg, o, n_heads, D, n_split);
    return launch_status();
}
