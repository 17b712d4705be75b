// deltanet.cu: Gated DeltaNet (docs/MODEL.md §2.5): causal depthwise conv + SiLU, L2 norms, the gated
// delta rule token by token with an fp32 state, and the gated RMSNorm.
//
// The recurrence kernel keeps each head's state in registers (a quarter column S[dk.., dv] per
// thread) for the whole chunk: the state is read and written once per chunk, and each token
// costs two short loops over dk plus two shuffle reductions.
#include "common.cuh"

// ---- conv --------------------------------------------------------------------------------------

// y[t, c] = silu(sum_j w[c, j] * xe[t + j, c]), xe = [state rows (KW-1) | xin rows (T)].
static __global__ void gdn_conv_kernel(const float *xin, const float *state, const float *conv_w, float *y, int T,
                                       int C, int KW) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (c >= C) return;
    float s = 0;
    for (int j = 0; j < KW; j++) {
        const int r = t + j;   // row of xe
        const float xv = r < KW - 1 ? state[(size_t)r * C + c] : xin[(size_t)(r - (KW - 1)) * C + c];
        s += conv_w[(size_t)c * KW + j] * xv;
    }
    y[(size_t)t * C + c] = silu_f(s);
}

// state[r] = xe[T + r] for r < KW - 1 (ascending r reads ahead of the writes).
static __global__ void gdn_conv_state_kernel(const float *xin, float *state, int T, int C, int KW) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int r = 0; r < KW - 1; r++) {
        const int src = T + r;
        state[(size_t)r * C + c] = src < KW - 1 ? state[(size_t)src * C + c] : xin[(size_t)(src - (KW - 1)) * C + c];
    }
}

// L2-normalise q and k heads in place (q also by 1/sqrt(Dk)); one block per (t, head of 2*Hk).
static __global__ void gdn_l2norm_kernel(float *y, int C, int Hk, int Dk) {
    __shared__ float sh[32];
    const int t = blockIdx.x, kh = blockIdx.y;
    float *x = y + (size_t)t * C + (size_t)kh * Dk;
    float ss = 0;
    for (int d = threadIdx.x; d < Dk; d += blockDim.x) ss += x[d] * x[d];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss + 1e-6f);
    if (kh < Hk) r /= sqrtf((float)Dk);
    for (int d = threadIdx.x; d < Dk; d += blockDim.x) x[d] *= r;
}

extern "C" int k_gdn_conv(const float *xin, float *state, const float *conv_w, float *y, int T, int C, int KW, int Hk,
                          int Dk, void *stream) {
    if (T <= 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    gdn_conv_kernel<<<dim3(CEIL_DIV(C, 256), T), 256, 0, st>>>(xin, state, conv_w, y, T, C, KW);
    gdn_conv_state_kernel<<<CEIL_DIV(C, 256), 256, 0, st>>>(xin, state, T, C, KW);
    gdn_l2norm_kernel<<<dim3(T, 2 * Hk), 128, 0, st>>>(y, C, Hk, Dk);
    return launch_status();
}

// ---- the delta rule --------------------------------------------------------------------------


// grid (Hv, Dv / RC_COLS), one warp: lane = part * RC_COLS + col owns rows
// [part * DK / RC_PARTS, ..) of column dv = blockIdx.y * RC_COLS + col of head h's state, in
// registers; the two dot products over dk are summed across the RC_PARTS lanes of a column with
// shuffles. o_raw [T, Hv*Dv].
enum { RC_PARTS = 4, RC_COLS = WARP_SIZE / RC_PARTS };
template <int DK>
static __global__ void __launch_bounds__(WARP_SIZE)
    gdn_recurrent_kernel(const float *y, const float *b, const float *a, const float *A_log, const float *dt_bias,
                         float *S, float *o, int T, int C, int Hk, int Hv, int Dv) {
    constexpr int DP = DK / RC_PARTS;
    __shared__ float ks[DK], qs[DK];
    const int h = blockIdx.x, lane = threadIdx.x, col = lane % RC_COLS, part = lane / RC_COLS;
    const int dv = blockIdx.y * RC_COLS + col, dk0 = part * DP;
    const int kh = h / (Hv / Hk), KD = Hk * DK;
    float *Sh = S + (size_t)h * DK * Dv;
    float st[DP];
#pragma unroll
    for (int i = 0; i < DP; i++) st[i] = Sh[(size_t)(dk0 + i) * Dv + dv];
    const float A = -expf(A_log[h]), dtb = dt_bias[h];
    for (int t = 0; t < T; t++) {
        const float *row = y + (size_t)t * C;
        __syncwarp();
        for (int d = lane; d < DK; d += WARP_SIZE) {
            qs[d] = row[(size_t)kh * DK + d];
            ks[d] = row[KD + (size_t)kh * DK + d];
        }
        __syncwarp();
        const float v = row[2 * KD + (size_t)h * Dv + dv];
        const float beta = sigmoid_f(b[(size_t)t * Hv + h]);
        const float alpha = expf(A * softplus_f(a[(size_t)t * Hv + h] + dtb));
        float m = 0;
#pragma unroll
        for (int i = 0; i < DP; i++) {
            st[i] *= alpha;
            m += st[i] * ks[dk0 + i];
        }
#pragma unroll
        for (int off = RC_COLS; off < WARP_SIZE; off <<= 1) m += __shfl_xor_sync(0xffffffffu, m, off);
        const float delta = beta * (v - m);
        float out = 0;
#pragma unroll
        for (int i = 0; i < DP; i++) {
            st[i] += ks[dk0 + i] * delta;
            out += st[i] * qs[dk0 + i];
        }
#pragma unroll
        for (int off = RC_COLS; off < WARP_SIZE; off <<= 1) out += __shfl_xor_sync(0xffffffffu, out, off);
        if (part == 0) o[(size_t)t * Hv * Dv + (size_t)h * Dv + dv] = out;
    }
#pragma unroll
    for (int i = 0; i < DP; i++) Sh[(size_t)(dk0 + i) * Dv + dv] = st[i];
}

// o[t, h] = gdn_norm * rmsnorm(o[t, h]) * silu(z[t, h]); one block per (t, h).
static __global__ void gdn_gated_norm_kernel(float *o, const float *z, const float *w, int Hv, int Dv, float eps) {
    __shared__ float sh[32];
    const int t = blockIdx.x, h = blockIdx.y;
    float *x = o + ((size_t)t * Hv + h) * Dv;
    const float *zz = z + ((size_t)t * Hv + h) * Dv;
    float ss = 0;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) ss += x[d] * x[d];
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)Dv + eps);
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) x[d] = w[d] * (x[d] * r) * silu_f(zz[d]);
}

extern "C" int k_gdn_recurrent(const float *y, const float *b, const float *a, const float *z, const float *A_log,
                               const float *dt_bias, const float *gdn_norm, float *S, float *o, int T, int Hk, int Hv,
                               int Dk, int Dv, float eps, void *stream) {
    if (T <= 0) return 0;
    if (Dv % RC_COLS || Hv % Hk) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    const int C = 2 * Hk * Dk + Hv * Dv;
    dim3 grid(Hv, Dv / RC_COLS);
    switch (Dk) {
    case 128: gdn_recurrent_kernel<128><<<grid, WARP_SIZE, 0, st>>>(y, b, a, A_log, dt_bias, S, o, T, C, Hk, Hv, Dv); break;
    case 64: gdn_recurrent_kernel<64><<<grid, WARP_SIZE, 0, st>>>(y, b, a, A_log, dt_bias, S, o, T, C, Hk, Hv, Dv); break;
    case 32: gdn_recurrent_kernel<32><<<grid, WARP_SIZE, 0, st>>>(y, b, a, A_log, dt_bias, S, o, T, C, Hk, Hv, Dv); break;
    default: return (int)cudaErrorInvalidValue;
    }
    int rc = launch_status();
    if (rc) return rc;
    gdn_gated_norm_kernel<<<dim3(T, Hv), 128, 0, st>>>(o, z, gdn_norm, Hv, Dv, eps);
    return launch_status();
}
