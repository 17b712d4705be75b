// deltanet.cu: Gated DeltaNet (docs/MODEL.md §2.5): causal depthwise conv + SiLU, L2 norms, the gated
// delta rule token by token with an fp32 state, and the gated RMSNorm; the decode step's rule
// (k_dv_gdn). The chunked form of the rule for prefill is gdn_chunked.cu.
//
// The recurrence kernel keeps each head's state in registers (a quarter column S[dk.., dv] per
// thread) for the whole chunk: the state is read and written once per chunk, and each token
// costs two short loops over dk plus two shuffle reductions. The decode step's kernel keeps a value
// head's state in registers across a block, with the gated norm in its epilogue.
#include "common.cuh"

// ---- conv + SiLU + L2 norms in one pass -------------------------------------------------------

// state[r] = xe[T + r] for r < KW - 1 (ascending r reads ahead of the writes).
static __global__ void gdn_conv_state_kernel(const float *xin, float *state, int T, int C, int KW) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int r = 0; r < KW - 1; r++) {
        const int src = T + r;
        state[(size_t)r * C + c] = src < KW - 1 ? state[(size_t)src * C + c] : xin[(size_t)(src - (KW - 1)) * C + c];
    }
}

// y[t, c] = silu(sum_j w[c, j] * xe[t + j, c]), xe = [state rows (KW-1) | xin rows (T)], then the q
// and k heads L2-normalised (q also by 1/sqrt(Dk)). A block of DK threads owns the DK channels of one
// head slice (q, k, or DK channels of v) and GC_TT consecutive tokens: a thread reads its channel's
// GC_TT + KW - 1 rows of xe once, all loads in flight together, and slides the conv window in
// registers. The conv is one fma chain from 0 (j = 0 .. KW-1), and each token's sum of squares is
// added in a block_sum's order: warp_sum's xor tree within a warp, then the four warp sums of a
// 128-thread block as its second warp_sum adds them, (w0 + w2) + (w1 + w3), with 0 for the warps a
// head of DK < 128 leaves empty there (adding +0 to a sum of squares changes no bit): every DK sums
// in the order of one 128-thread block_sum.
enum { GC_TT = 32 }; // tokens a block: one a lane after the transposed reduction

// p[i]: this lane's value for token i. Returns, on lane l, the sum over the warp's lanes for token
// l, in warp_sum's order: at the step of stride o a lane keeps the half of its open tokens on its
// side of o and trades the other half with lane ^ o, so it adds the same pairs warp_sum adds (each
// pair's sum is commutative), 31 shuffles for 32 tokens instead of 160.
template <int O> static __device__ __forceinline__ void transposed_step(float (&p)[GC_TT], int lane) {
    const bool hi = lane & O;
#pragma unroll
    for (int j = 0; j < O; j++) { // p[j], p[j + O]: open tokens base + j, base + O + j
        const float send = hi ? p[j] : p[j + O], keep = hi ? p[j + O] : p[j];
        p[j] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}
static __device__ __forceinline__ float warp_sum_transposed(float (&p)[GC_TT]) {
    static_assert(GC_TT == WARP_SIZE, "one token a lane");
    const int lane = threadIdx.x % WARP_SIZE;
    transposed_step<16>(p, lane);
    transposed_step<8>(p, lane);
    transposed_step<4>(p, lane);
    transposed_step<2>(p, lane);
    transposed_step<1>(p, lane);
    return p[0];
}

// grid (ceil(C / DK), ceil(T / GC_TT)); slices below 2 * Hk are q (below Hk) and k heads.
template <int DK, int KW>
static __global__ void __launch_bounds__(DK)
    gdn_conv_norm_kernel(const float *__restrict__ xin, const float *__restrict__ state,
                         const float *__restrict__ conv_w, float *__restrict__ y, int T, int C, int Hk) {
    static_assert(DK % WARP_SIZE == 0 && DK <= 128, "a 128-thread block's sum order");
    constexpr int NW = DK / WARP_SIZE, NX = GC_TT + KW - 1;
    __shared__ float part[4][GC_TT]; // warp sums, 0 in the rows of warps that a DK < 128 leaves empty
    __shared__ float rs[GC_TT];      // each token's scale
    const int c = blockIdx.x * DK + threadIdx.x, t0 = blockIdx.y * GC_TT, cc = c < C ? c : C - 1;
    float w[KW], xe[NX]; // xe[i]: row t0 + i of [state (KW - 1 rows) | xin]
#pragma unroll
    for (int j = 0; j < KW; j++) w[j] = conv_w[(size_t)cc * KW + j];
#pragma unroll
    for (int i = 0; i < KW - 1; i++) // the first tile's halo is the state; a later tile's, xin rows
        xe[i] = t0 == 0 ? state[(size_t)i * C + cc] : xin[(size_t)(t0 + i - (KW - 1)) * C + cc];
#pragma unroll
    for (int i = KW - 1; i < NX; i++) // rows past T (the last tile's tail): row T - 1 again, not stored
        xe[i] = xin[(size_t)min(t0 + i - (KW - 1), T - 1) * C + cc];
    __syncthreads(); // keeps ptxas from spreading the loads through the compute: all NX in flight at once
    float v[GC_TT];
#pragma unroll
    for (int i = 0; i < GC_TT; i++) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < KW; j++) s = fmaf(w[j], xe[i + j], s);
        v[i] = silu_f(s);
    }
    if (blockIdx.x < 2 * Hk) { // block-uniform; such a slice is whole (2 * Hk * DK <= C)
        const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
        float p[GC_TT];
#pragma unroll
        for (int i = 0; i < GC_TT; i++) p[i] = __fmul_rn(v[i], v[i]); // rounded alone, as fma(x, x, 0)
        part[wid][lane] = warp_sum_transposed(p);
#pragma unroll
        for (int k = NW; k < 4; k++)
            if (threadIdx.x < GC_TT) part[k][threadIdx.x] = 0.0f;
        __syncthreads();
        if (threadIdx.x < GC_TT) {
            const int i = threadIdx.x;
            const float ss = (part[0][i] + part[2][i]) + (part[1][i] + part[3][i]);
            float r = 1.0f / sqrtf(ss + 1e-6f);
            if (blockIdx.x < Hk) r /= sqrtf((float)DK);
            rs[i] = r;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < GC_TT; i++) v[i] = __fmul_rn(v[i], rs[i]);
    }
    if (c >= C) return;
    float *yc = y + (size_t)t0 * C + c;
    if (t0 + GC_TT <= T) {
#pragma unroll
        for (int i = 0; i < GC_TT; i++) yc[(size_t)i * C] = v[i];
    } else {
#pragma unroll
        for (int i = 0; i < GC_TT; i++)
            if (t0 + i < T) yc[(size_t)i * C] = v[i];
    }
}

template <int DK>
static void gdn_conv_norm(const float *xin, const float *state, const float *conv_w, float *y, int T, int C, int Hk,
                          cudaStream_t st) {
    gdn_conv_norm_kernel<DK, 4>
        <<<dim3(CEIL_DIV(C, DK), CEIL_DIV(T, GC_TT)), DK, 0, st>>>(xin, state, conv_w, y, T, C, Hk);
}

extern "C" int k_gdn_conv(const float *xin, float *state, const float *conv_w, float *y, int T, int C, int KW, int Hk,
                          int Dk, void *stream) {
    if (T <= 0) return 0;
    if (KW != 4 || (Dk != 32 && Dk != 64 && Dk != 128)) return (int)cudaErrorInvalidValue; // every geometry's
    cudaStream_t st = (cudaStream_t)stream;
    // reads the state before gdn_conv_state_kernel overwrites it
    if (Dk == 128)
        gdn_conv_norm<128>(xin, state, conv_w, y, T, C, Hk, st);
    else if (Dk == 64)
        gdn_conv_norm<64>(xin, state, conv_w, y, T, C, Hk, st);
    else
        gdn_conv_norm<32>(xin, state, conv_w, y, T, C, Hk, st);
    gdn_conv_state_kernel<<<CEIL_DIV(C, 256), 256, 0, st>>>(xin, state, T, C, KW);
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
    case 128:
        gdn_recurrent_kernel<128><<<grid, WARP_SIZE, 0, st>>>(y, b, a, A_log, dt_bias, S, o, T, C, Hk, Hv, Dv);
        break;
    case 64:
        gdn_recurrent_kernel<64><<<grid, WARP_SIZE, 0, st>>>(y, b, a, A_log, dt_bias, S, o, T, C, Hk, Hv, Dv);
        break;
    case 32:
        gdn_recurrent_kernel<32><<<grid, WARP_SIZE, 0, st>>>(y, b, a, A_log, dt_bias, S, o, T, C, Hk, Hv, Dv);
        break;
    default:
        return (int)cudaErrorInvalidValue;
    }
    int rc = launch_status();
    if (rc) return rc;
    gdn_gated_norm_kernel<<<dim3(T, Hv), 128, 0, st>>>(o, z, gdn_norm, Hv, Dv, eps);
    return launch_status();
}

// ---- decode: the gated delta rule step ---------------------------------------------------------

// Block = value head h; thread (part, col) keeps rows [part * DK / 8, ..) of column col of the
// head's state in registers. Reads the conv output y [C] = (q heads | k heads | v heads) after
// SiLU; L2-normalises q and k (q also by 1/sqrt(DK)); S = alpha S; m = S^T k; S += k (beta (v - m))^T;
// o = S^T q; then the gated norm of the head (docs/MODEL.md §2.5): out = w * (o * rsqrt(mean(o^2) + eps))
// * silu(z), so that the out_proj kernel stages a plain input.
enum { GD_PARTS = 8, GD_MAXDV = 128 };
template <int DK>
static __global__ void __launch_bounds__(GD_PARTS *GD_MAXDV)
    dv_gdn_kernel(const float *y, const float *b, const float *a, const float *A_log, const float *dt_bias, float *S,
                  const float *z, const float *norm_w, float eps, float *o, int Hk, int Hv, int Dv) {
    constexpr int DP = DK / GD_PARTS;
    __shared__ float qs[DK], ks[DK], red[GD_PARTS][GD_MAXDV];
    __shared__ float sh[2 * 32];
    const int h = blockIdx.x, col = threadIdx.x % Dv, part = threadIdx.x / Dv;
    const int kh = h / (Hv / Hk), KD = Hk * DK;
    float *Sh = S + (size_t)h * DK * Dv + (size_t)part * DP * Dv + col;
    float st[DP];
#pragma unroll
    for (int i = 0; i < DP; i++) st[i] = Sh[(size_t)i * Dv];      // this step's own state: no wait needed
    const float A = A_log[h], dtb = dt_bias[h], nw = norm_w[col]; // weights: no wait needed
    pdl_wait();
    pdl_trigger();
    // Every input of the step in one round trip (q, k, v, b, a, z), before the first barrier.
    float qv = 0, kv = 0;
    if (threadIdx.x < DK) qv = y[(size_t)kh * DK + threadIdx.x], kv = y[KD + (size_t)kh * DK + threadIdx.x];
    const float v = y[2 * (size_t)KD + (size_t)h * Dv + col], bh = b[h], ah = a[h];
    const float zz = part == 0 ? z[(size_t)h * Dv + col] : 0.0f;
    const float2 qk = block_sum2(qv * qv, kv * kv, sh);
    const float qss = qk.x, kss = qk.y;
    if (threadIdx.x < DK) {
        const float rq = 1.0f / sqrtf(qss + 1e-6f) / sqrtf((float)DK), rk = 1.0f / sqrtf(kss + 1e-6f);
        qs[threadIdx.x] = qv * rq;
        ks[threadIdx.x] = kv * rk;
    }
    __syncthreads();
    const float beta = sigmoid_f(bh);
    const float alpha = expf(-expf(A) * softplus_f(ah + dtb));
    float m = 0;
#pragma unroll
    for (int i = 0; i < DP; i++) {
        st[i] *= alpha;
        m += st[i] * ks[part * DP + i];
    }
    red[part][col] = m;
    __syncthreads();
    m = 0;
#pragma unroll
    for (int p = 0; p < GD_PARTS; p++) m += red[p][col];
    const float delta = beta * (v - m);
    float out = 0;
#pragma unroll
    for (int i = 0; i < DP; i++) {
        st[i] += ks[part * DP + i] * delta;
        out += st[i] * qs[part * DP + i];
    }
    __syncthreads();
    red[part][col] = out;
    __syncthreads();
    out = 0;
#pragma unroll
    for (int p = 0; p < GD_PARTS; p++) out += red[p][col]; // every part has the column's output
    const float ss = block_sum(part == 0 ? out * out : 0.0f, sh);
    if (part == 0) {
        const float r = 1.0f / sqrtf(ss / (float)Dv + eps);
        o[(size_t)h * Dv + col] = nw * (out * r) * silu_f(zz);
    }
#pragma unroll
    for (int i = 0; i < DP; i++) Sh[(size_t)i * Dv] = st[i];
}

extern "C" int k_dv_gdn(const float *y, const float *b, const float *a, const float *A_log, const float *dt_bias,
                        float *S, const float *z, const float *norm_w, float eps, float *o, int Hk, int Hv, int Dk,
                        int Dv, const struct dec_launch *l) {
    if (Dv % WARP_SIZE || Dv > GD_MAXDV || Hv % Hk || Dk > GD_PARTS * Dv) return (int)cudaErrorInvalidValue;
    const dim3 grid(Hv), block(GD_PARTS * Dv);
    switch (Dk) {
    case 128:
        return launch_k(dv_gdn_kernel<128>, grid, block, 0, l, y, b, a, A_log, dt_bias, S, z, norm_w, eps, o, Hk, Hv,
                        Dv);
    case 64:
        return launch_k(dv_gdn_kernel<64>, grid, block, 0, l, y, b, a, A_log, dt_bias, S, z, norm_w, eps, o, Hk, Hv,
                        Dv);
    case 32:
        return launch_k(dv_gdn_kernel<32>, grid, block, 0, l, y, b, a, A_log, dt_bias, S, z, norm_w, eps, o, Hk, Hv,
                        Dv);
    default:
        return (int)cudaErrorInvalidValue;
    }
}
