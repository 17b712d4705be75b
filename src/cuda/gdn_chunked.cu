// gdn_chunked.cu: the chunked gated delta rule for prefill (docs/MODEL.md §4, chunk BT = 64), on the
// tensor cores, with the gated RMSNorm. Same inputs and outputs as k_gdn_recurrent.
//
// Per value head h and chunk (rows r, s in [0, 64); gam = in-chunk cumulative log-decay):
//   L_rs = beta_r (k_r . k_s) exp(gam_r - gam_s)  (s < r)      P_rs = (q_r . k_s) exp(gam_r - gam_s)  (s <= r)
//   (I + L) U = diag(beta) V,   (I + L) W = diag(beta e^gam) K   (forward substitution, fp32)
//   V' = U - W S,   O = diag(e^gam) Q S + P V',   S <- e^gam_63 S + K^T diag(e^(gam_63 - gam)) V'
// Two kernels:
//   1. prep, grid (chunks, Hv), every chunk at once: L and P (mma), the forward substitution for U
//      and W (one column per thread, in registers). U goes into o (same shape), W, P and gam into
//      the workspace.
//   2. state, grid (Hv, Dv / NS): each block owns an NS-column slice of one head's state in shared
//      memory (fp32) and walks the chunks in order: V', O, S with mma. Every product there is
//      separable in dv, so the slices never talk to each other.
//   3. the gated RMSNorm over o, one warp per (t, h) row.
// Products run as mma.m16n8k16 with bf16 operands and fp32 accumulators; EXACT splits every
// operand into bf16 hi + lo and sums hi.hi + hi.lo + lo.hi (three mma), ~16 mantissa bits.
// Padding rows of the last chunk (t >= T) are zero (q = k = v = beta = 0, g = 0): they change
// nothing.
#ifdef GDN_HOST_EMU
#include "gdn_emu.h" // tools/sim/gdn_emu: runs these kernels on the CPU, thread by thread
#else
#include "mma.cuh"
#endif

namespace {

#ifndef GDN_HOST_EMU
__device__ __forceinline__ float *gdn_smem() {
    extern __shared__ float4 smem4[];
    return reinterpret_cast<float *>(smem4);
}
#endif

constexpr int BT = 64;      // chunk length
constexpr int DK = 128;     // key dim (the model's; the launcher checks)
constexpr int DV = 128;     // value dim
constexpr int NS = 32;      // state columns (dv) per block of the state kernel
constexpr int LDR = DK + 8; // row stride of [BT][DK] tiles read as row-major A or n-major B (= 8 mod 32)
constexpr int LDK = DK + 4; // row stride of K read k-major as A in K^T V' (= 4 mod 32)
constexpr int LDP = BT + 8; // row stride of P (row-major A)
constexpr int LDS = NS + 4; // row stride of S and V' slices (k-major B)
constexpr int PREP_THREADS = 256, STATE_THREADS = 128;

static_assert(PREP_THREADS == DK + DV, "prep: one thread per column of [U | W]");
static_assert(STATE_THREADS / WARP_SIZE * 16 == BT, "state: one warp per 16 rows of a chunk");
static_assert(DK == 2 * 16 * (STATE_THREADS / WARP_SIZE), "state: two 16-row dk tiles per warp in the S update");
static_assert(NS == 32, "state: four 8-column n tiles per warp");

constexpr int PREP_SMEM_FLOATS = 2 * BT * LDR + BT * BT + 2 * BT;
constexpr int STATE_SMEM_FLOATS = 2 * BT * LDR + BT * LDK + BT * LDP + DK * LDS + 2 * BT * LDS + BT;

// x0, x1 rounded to bf16 (nearest even), packed as an mma operand register: x0 in the low half.
__device__ __forceinline__ uint32_t bf2(float x0, float x1) {
#ifdef GDN_HOST_EMU
    return pack2(f2bf16(x0), f2bf16(x1));
#else
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(d) : "f"(x0), "f"(x1)); // first source -> high half
    return d;
#endif
}
// hi = bf16(x), lo = bf16(x - hi), packed pairwise: hi + lo carries ~16 mantissa bits.
__device__ __forceinline__ void split2(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    hi = bf2(x0, x1);
    lo = bf2(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xffff0000u));
}

// One warp: acc[nt] (rows 0..15, cols 8 nt .. 8 nt + 7) += sum_{k < K} A(i, k) B(k, j), K % 16 == 0,
// K <= KMAX; the k loop is unrolled UNROLL times.
//   A(i, k) = A_KMAJ ? As[k * lda + i] : As[i * lda + k]
//   B(k, j) = B_NMAJ ? Bs[j * ldb + k] : Bs[k * ldb + j]
// Operands are fp32 in shared memory, rounded to bf16 (or split hi + lo when EXACT) as loaded.
template <bool EXACT, bool A_KMAJ, bool B_NMAJ, int NT, int KMAX, int UNROLL = KMAX / 16>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const float *As, int lda, const float *Bs, int ldb,
                                         int K) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, c = lane & 3;
#pragma unroll(UNROLL)
    for (int k0 = 0; k0 < KMAX; k0 += 16) {
        if (k0 >= K) break;
        float a[8]; // fragment order: (g, 2c), (g + 8, 2c), (g, 2c + 8), (g + 8, 2c + 8), each k and k + 1
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int i = g + (q & 1) * 8, k = k0 + 2 * c + (q >> 1) * 8;
            if constexpr (A_KMAJ) {
                a[2 * q] = As[k * lda + i];
                a[2 * q + 1] = As[(k + 1) * lda + i];
            } else {
                const float2 v = *reinterpret_cast<const float2 *>(As + i * lda + k);
                a[2 * q] = v.x;
                a[2 * q + 1] = v.y;
            }
        }
        uint32_t ah[4], al[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if constexpr (EXACT)
                split2(a[2 * q], a[2 * q + 1], ah[q], al[q]);
            else
                ah[q] = bf2(a[2 * q], a[2 * q + 1]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int j = nt * 8 + g, k = k0 + 2 * c;
            float bv[4]; // (k, j), (k + 1, j), (k + 8, j), (k + 9, j)
            if constexpr (B_NMAJ) {
                const float2 v0 = *reinterpret_cast<const float2 *>(Bs + j * ldb + k);
                const float2 v1 = *reinterpret_cast<const float2 *>(Bs + j * ldb + k + 8);
                bv[0] = v0.x, bv[1] = v0.y, bv[2] = v1.x, bv[3] = v1.y;
            } else {
                bv[0] = Bs[k * ldb + j];
                bv[1] = Bs[(k + 1) * ldb + j];
                bv[2] = Bs[(k + 8) * ldb + j];
                bv[3] = Bs[(k + 9) * ldb + j];
            }
            if constexpr (EXACT) {
                uint32_t bh0, bl0, bh1, bl1;
                split2(bv[0], bv[1], bh0, bl0);
                split2(bv[2], bv[3], bh1, bl1);
                mma_bf16(acc[nt], al, bh0, bh1);
                mma_bf16(acc[nt], ah, bl0, bl1);
                mma_bf16(acc[nt], ah, bh0, bh1);
            } else {
                mma_bf16(acc[nt], ah, bf2(bv[0], bv[1]), bf2(bv[2], bv[3]));
            }
        }
    }
}

// ---- 1. per chunk: gates, L, P, U, W ---------------------------------------------------------
// grid (NC, Hv), PREP_THREADS. U -> o rows t < T; W -> Wg [Hv, NC*BT, DK] (padding rows zero);
// P -> Pg [Hv, NC, BT, BT]; gam -> Gg [Hv, NC*BT].
template <bool EXACT>
__global__ void __launch_bounds__(PREP_THREADS, 2)
    gdn_chunk_prep_kernel(const float *__restrict__ y, const float *__restrict__ b, const float *__restrict__ a,
                          const float *__restrict__ A_log, const float *__restrict__ dt_bias, float *__restrict__ o,
                          float *__restrict__ Wg, float *__restrict__ Pg, float *__restrict__ Gg, int T, int Hk,
                          int Hv) {
    float *Ks = gdn_smem();    // [BT][LDR]
    float *Qs = Ks + BT * LDR; // [BT][LDR]
    float *Ls = Qs + BT * LDR; // [BT][BT] strictly lower L
    float *bs = Ls + BT * BT;  // beta [BT]
    float *gs = bs + BT;       // g, then gam [BT]
    const int ch = blockIdx.x, NC = gridDim.x, h = blockIdx.y, tid = threadIdx.x, t0 = ch * BT;
    const int kh = h / (Hv / Hk), KD = Hk * DK, C = 2 * KD + Hv * DV;
    const size_t NCT = (size_t)NC * BT;

    for (int e = tid; e < BT * DK / 4; e += PREP_THREADS) {
        const int r = e / (DK / 4), d = e % (DK / 4) * 4;
        float4 qv = make_float4(0, 0, 0, 0), kv = qv;
        if (t0 + r < T) {
            const float *row = y + (size_t)(t0 + r) * C + (size_t)kh * DK + d;
            qv = *reinterpret_cast<const float4 *>(row);
            kv = *reinterpret_cast<const float4 *>(row + KD);
        }
        *reinterpret_cast<float4 *>(Qs + r * LDR + d) = qv;
        *reinterpret_cast<float4 *>(Ks + r * LDR + d) = kv;
    }
    if (tid < BT) {
        const int t = t0 + tid;
        float be = 0, gg = 0;
        if (t < T) {
            be = sigmoid_f(b[(size_t)t * Hv + h]);
            gg = -expf(A_log[h]) * softplus_f(a[(size_t)t * Hv + h] + dt_bias[h]);
        }
        bs[tid] = be;
        gs[tid] = gg;
    }
    __syncthreads();
    if (tid < WARP_SIZE) { // inclusive prefix sum of g over the 64 rows
        float x0 = gs[tid], x1 = gs[tid + 32];
#pragma unroll
        for (int off = 1; off < WARP_SIZE; off <<= 1) {
            const float y0 = __shfl_up_sync(0xffffffffu, x0, off), y1 = __shfl_up_sync(0xffffffffu, x1, off);
            if (tid >= off) x0 += y0, x1 += y1;
        }
        x1 += __shfl_sync(0xffffffffu, x0, 31);
        gs[tid] = x0;
        gs[tid + 32] = x1;
        Gg[(size_t)h * NCT + t0 + tid] = x0;
        Gg[(size_t)h * NCT + t0 + tid + 32] = x1;
    }
    __syncthreads();

    // K K^T and Q K^T: warp w owns rows 16 (w & 3) .., columns 32 (w >> 2) ..
    {
        const int warp = tid / WARP_SIZE, lane = tid % WARP_SIZE, g = lane >> 2, c = lane & 3;
        const int m0 = (warp & 3) * 16, n0 = (warp >> 2) * 32;
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) kk[nt][i] = qk[nt][i] = 0;
        warp_mma<EXACT, false, true, 4, DK, 1>(kk, Ks + m0 * LDR, LDR, Ks + n0 * LDR, LDR, DK);
        warp_mma<EXACT, false, true, 4, DK, 1>(qk, Qs + m0 * LDR, LDR, Ks + n0 * LDR, LDR, DK);
        float *Pc = Pg + ((size_t)h * NC + ch) * BT * BT;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int r = m0 + g + 8 * hf;
                float l[2], p[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int s = n0 + nt * 8 + 2 * c + e;
                    const float G = s <= r ? expf(gs[r] - gs[s]) : 0.0f;
                    l[e] = s < r ? bs[r] * kk[nt][2 * hf + e] * G : 0.0f;
                    p[e] = s <= r ? qk[nt][2 * hf + e] * G : 0.0f;
                }
                const int s0 = n0 + nt * 8 + 2 * c;
                *reinterpret_cast<float2 *>(Ls + r * BT + s0) = make_float2(l[0], l[1]);
                *reinterpret_cast<float2 *>(Pc + (size_t)r * BT + s0) = make_float2(p[0], p[1]);
            }
    }
    __syncthreads();

    // (I + L) X = R, one column per thread: columns 0..DV-1 are U (R = beta V), DV.. are W
    // (R = beta e^gam K). Left-looking, the column in registers.
    float x[BT];
    if (tid < DV) {
        const float *vcol = y + 2 * (size_t)KD + (size_t)h * DV + tid;
#pragma unroll
        for (int r = 0; r < BT; r++) x[r] = t0 + r < T ? bs[r] * vcol[(size_t)(t0 + r) * C] : 0.0f;
    } else {
        const int d = tid - DV;
#pragma unroll
        for (int r = 0; r < BT; r++) x[r] = bs[r] * expf(gs[r]) * Ks[r * LDR + d];
    }
#pragma unroll
    for (int r = 1; r < BT; r++) {
        float acc = x[r];
#pragma unroll
        for (int s = 0; s < BT; s += 4) {
            if (s < r) {
                const float4 l = *reinterpret_cast<const float4 *>(Ls + r * BT + s);
                acc -= l.x * x[s];
                if (s + 1 < r) acc -= l.y * x[s + 1];
                if (s + 2 < r) acc -= l.z * x[s + 2];
                if (s + 3 < r) acc -= l.w * x[s + 3];
            }
        }
        x[r] = acc;
    }
    if (tid < DV) {
        float *ocol = o + (size_t)h * DV + tid;
#pragma unroll
        for (int r = 0; r < BT; r++)
            if (t0 + r < T) ocol[(size_t)(t0 + r) * Hv * DV] = x[r];
    } else {
        float *wcol = Wg + ((size_t)h * NCT + t0) * DK + (tid - DV);
#pragma unroll
        for (int r = 0; r < BT; r++) wcol[(size_t)r * DK] = x[r];
    }
}

// ---- 2. per head slice: the chunks in order ---------------------------------------------------
// grid (Hv, DV / NS), STATE_THREADS. o holds U on entry (rows t < T) and O on exit.
template <bool EXACT>
__global__ void __launch_bounds__(STATE_THREADS, 1)
    gdn_chunk_state_kernel(const float *__restrict__ y, const float *__restrict__ Wg, const float *__restrict__ Pg,
                           const float *__restrict__ Gg, float *__restrict__ S, float *o, int T, int NC, int Hk,
                           int Hv) {
    float *Ws = gdn_smem();    // [BT][LDR]  W of the chunk
    float *Qs = Ws + BT * LDR; // [BT][LDR]  q rows
    float *Ks = Qs + BT * LDR; // [BT][LDK]  k rows
    float *Ps = Ks + BT * LDK; // [BT][LDP]  P
    float *Ss = Ps + BT * LDP; // [DK][LDS]  the state slice, fp32
    float *Vp = Ss + DK * LDS; // [BT][LDS]  V'
    float *Vs = Vp + BT * LDS; // [BT][LDS]  diag(e^(gam_63 - gam)) V'
    float *gs = Vs + BT * LDS; // [BT]       gam
    const int h = blockIdx.x, dv0 = blockIdx.y * NS, tid = threadIdx.x;
    const int warp = tid / WARP_SIZE, lane = tid % WARP_SIZE, g = lane >> 2, c = lane & 3, m0 = warp * 16;
    const int kh = h / (Hv / Hk), KD = Hk * DK, C = 2 * KD + Hv * DV;
    const size_t NCT = (size_t)NC * BT, ldo = (size_t)Hv * DV;
    float *Sh = S + (size_t)h * DK * DV + dv0;
    float *oh = o + (size_t)h * DV + dv0;

    for (int e = tid; e < DK * NS / 4; e += STATE_THREADS) {
        const int r = e / (NS / 4), j = e % (NS / 4) * 4;
        *reinterpret_cast<float4 *>(Ss + r * LDS + j) = *reinterpret_cast<const float4 *>(Sh + (size_t)r * DV + j);
    }
    // W, q rows and gam of chunk ch (the buffers step b reads)
    auto load_wq = [&](int ch) {
        const int t0 = ch * BT;
        for (int e = tid; e < BT * DK / 4; e += STATE_THREADS) {
            const int r = e / (DK / 4), d = e % (DK / 4) * 4;
            const bool ok = t0 + r < T;
            cp_async16(Ws + r * LDR + d, Wg + ((size_t)h * NCT + t0 + r) * DK + d, 16);
            cp_async16(Qs + r * LDR + d, y + (size_t)(ok ? t0 + r : 0) * C + (size_t)kh * DK + d, ok ? 16 : 0);
        }
        if (tid < BT / 4) cp_async16(gs + tid * 4, Gg + (size_t)h * NCT + t0 + tid * 4, 16);
        cp_async_commit();
    };
    // k rows and P of chunk ch (the buffers steps c and d read)
    auto load_kp = [&](int ch) {
        const int t0 = ch * BT;
        for (int e = tid; e < BT * DK / 4; e += STATE_THREADS) {
            const int r = e / (DK / 4), d = e % (DK / 4) * 4;
            const bool ok = t0 + r < T;
            cp_async16(Ks + r * LDK + d, y + (size_t)(ok ? t0 + r : 0) * C + KD + (size_t)kh * DK + d, ok ? 16 : 0);
        }
        const float *Pc = Pg + ((size_t)h * NC + ch) * BT * BT;
        for (int e = tid; e < BT * BT / 4; e += STATE_THREADS) {
            const int r = e / (BT / 4), s = e % (BT / 4) * 4;
            cp_async16(Ps + r * LDP + s, Pc + (size_t)r * BT + s, 16);
        }
        cp_async_commit();
    };
    // cp.async groups in flight: W/q/gam of chunk ch (issued during chunk ch - 1), then K/P of
    // chunk ch (issued at the top of chunk ch, landing while step b runs).
    load_wq(0);
    for (int ch = 0; ch < NC; ch++) {
        const int t0 = ch * BT;
        load_kp(ch);
        cp_async_wait<1>(); // W, q, gam of this chunk landed (K, P may still fly)
        __syncthreads();    // ... for every thread; also: the state slice is in place (first chunk)
        const float gl = gs[BT - 1];

        // b. V' = U - W S and Q S (rows m0 .. m0 + 15 of this warp), U read from o
        float u[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int t = t0 + m0 + g + 8 * hf, j = nt * 8 + 2 * c;
                float2 v = make_float2(0, 0);
                if (t < T) v = *reinterpret_cast<const float2 *>(oh + (size_t)t * ldo + j);
                u[nt][2 * hf] = v.x;
                u[nt][2 * hf + 1] = v.y;
            }
        float aw[4][4], aq[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) aw[nt][i] = aq[nt][i] = 0;
        warp_mma<EXACT, false, false, 4, DK>(aw, Ws + m0 * LDR, LDR, Ss, LDS, DK);
        warp_mma<EXACT, false, false, 4, DK>(aq, Qs + m0 * LDR, LDR, Ss, LDS, DK);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = m0 + g + 8 * hf;
            const float eg = expf(gs[r]), el = expf(gl - gs[r]);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int j = nt * 8 + 2 * c;
                const float v0 = u[nt][2 * hf] - aw[nt][2 * hf], v1 = u[nt][2 * hf + 1] - aw[nt][2 * hf + 1];
                *reinterpret_cast<float2 *>(Vp + r * LDS + j) = make_float2(v0, v1);
                *reinterpret_cast<float2 *>(Vs + r * LDS + j) = make_float2(v0 * el, v1 * el);
                aq[nt][2 * hf] *= eg;
                aq[nt][2 * hf + 1] *= eg;
            }
        }
        cp_async_wait<0>(); // K, P of this chunk landed
        __syncthreads();    // ... for every thread; V' complete; W, q, gam free; S unread until the next chunk
        if (ch + 1 < NC) load_wq(ch + 1);

        // c. O = diag(e^gam) Q S + P V' (P is lower triangular: k up to m0 + 16)
        warp_mma<EXACT, false, false, 4, BT>(aq, Ps + m0 * LDP, LDP, Vp, LDS, m0 + 16);
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int t = t0 + m0 + g + 8 * hf, j = nt * 8 + 2 * c;
                if (t < T)
                    *reinterpret_cast<float2 *>(oh + (size_t)t * ldo + j) =
                        make_float2(aq[nt][2 * hf], aq[nt][2 * hf + 1]);
            }

        // d. S <- e^gam_63 S + K^T Vs, dk rows 32 warp .. 32 warp + 31 (each warp its own rows)
        const float eL = expf(gl);
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const int k0 = warp * 32 + mi * 16;
            float as[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const float2 v = *reinterpret_cast<const float2 *>(Ss + (k0 + g + 8 * hf) * LDS + nt * 8 + 2 * c);
                    as[nt][2 * hf] = eL * v.x;
                    as[nt][2 * hf + 1] = eL * v.y;
                }
            warp_mma<EXACT, true, false, 4, BT>(as, Ks + k0, LDK, Vs, LDS, BT);
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++)
                    *reinterpret_cast<float2 *>(Ss + (k0 + g + 8 * hf) * LDS + nt * 8 + 2 * c) =
                        make_float2(as[nt][2 * hf], as[nt][2 * hf + 1]);
        }
        __syncthreads(); // K, P, V' free for the next chunk; S complete
    }
    for (int e = tid; e < DK * NS / 4; e += STATE_THREADS) {
        const int r = e / (NS / 4), j = e % (NS / 4) * 4;
        *reinterpret_cast<float4 *>(Sh + (size_t)r * DV + j) = *reinterpret_cast<const float4 *>(Ss + r * LDS + j);
    }
}

// ---- 3. o[t, h] = w * rmsnorm(o[t, h]) * silu(z[t, h]); one warp per row ----------------------
// ob (when set): o's bf16 copy, out_proj's input in the fast mode (k_to_bf16's rounding).
__global__ void gdn_gated_norm_warp_kernel(float *o, uint16_t *ob, const float *z, const float *w, long rows, int Dv,
                                           float eps) {
    const long row = (long)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    float *x = o + row * Dv;
    const float *zz = z + row * Dv;
    float ss = 0;
    for (int d = lane; d < Dv; d += WARP_SIZE) ss += x[d] * x[d];
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)Dv + eps);
    for (int d = lane; d < Dv; d += WARP_SIZE) {
        const float v = w[d] * (x[d] * r) * silu_f(zz[d]);
        x[d] = v;
        if (ob) ob[row * Dv + d] = f2bf16(v);
    }
}

#ifndef GDN_HOST_EMU
template <bool EXACT>
int launch_chunked(const float *y, const float *b, const float *a, const float *A_log, const float *dt_bias, float *S,
                   float *o, float *ws, int T, int Hk, int Hv, int stages, cudaStream_t st) {
    const int NC = CEIL_DIV(T, BT);
    const size_t NCT = (size_t)NC * BT;
    float *Wg = ws, *Pg = Wg + (size_t)Hv * NCT * DK, *Gg = Pg + (size_t)Hv * NCT * BT;
    const int prep_smem = PREP_SMEM_FLOATS * (int)sizeof(float), state_smem = STATE_SMEM_FLOATS * (int)sizeof(float);
    cudaError_t e =
        cudaFuncSetAttribute(gdn_chunk_prep_kernel<EXACT>, cudaFuncAttributeMaxDynamicSharedMemorySize, prep_smem);
    if (e != cudaSuccess) return (int)e;
    e = cudaFuncSetAttribute(gdn_chunk_state_kernel<EXACT>, cudaFuncAttributeMaxDynamicSharedMemorySize, state_smem);
    if (e != cudaSuccess) return (int)e;
    if (stages & 1) {
        gdn_chunk_prep_kernel<EXACT>
            <<<dim3(NC, Hv), PREP_THREADS, prep_smem, st>>>(y, b, a, A_log, dt_bias, o, Wg, Pg, Gg, T, Hk, Hv);
        const int rc = launch_status();
        if (rc) return rc;
    }
    if (stages & 2) {
        gdn_chunk_state_kernel<EXACT>
            <<<dim3(Hv, DV / NS), STATE_THREADS, state_smem, st>>>(y, Wg, Pg, Gg, S, o, T, NC, Hk, Hv);
        const int rc = launch_status();
        if (rc) return rc;
    }
    return 0;
}

#endif

} // namespace

extern "C" long k_gdn_chunked_ws_floats(int T, int Hv, int Dk) {
    const long NCT = (long)CEIL_DIV(T > 0 ? T : 1, BT) * BT;
    return (long)Hv * NCT * (Dk + BT + 1);
}

#ifndef GDN_HOST_EMU
extern "C" int k_gdn_chunked_stages(const float *y, const float *b, const float *a, const float *z, const float *A_log,
                                    const float *dt_bias, const float *gdn_norm, float *S, float *o, uint16_t *ob,
                                    float *ws, int T, int Hk, int Hv, int Dk, int Dv, float eps, int exact, int stages,
                                    void *stream) {
    if (T <= 0) return 0;
    if (Dk != DK || Dv != DV || Hk <= 0 || Hv % Hk) return (int)cudaErrorInvalidValue;
    const int C = 2 * Hk * Dk + Hv * Dv;
    if (C % 4 || ((uintptr_t)y | (uintptr_t)S | (uintptr_t)o | (uintptr_t)ws) % 16) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    int rc = exact ? launch_chunked<true>(y, b, a, A_log, dt_bias, S, o, ws, T, Hk, Hv, stages, st)
                   : launch_chunked<false>(y, b, a, A_log, dt_bias, S, o, ws, T, Hk, Hv, stages, st);
    if (rc) return rc;
    if (stages & 4) {
        const long rows = (long)T * Hv;
        gdn_gated_norm_warp_kernel<<<(unsigned)CEIL_DIV(rows, 8), 8 * WARP_SIZE, 0, st>>>(o, ob, z, gdn_norm, rows, Dv,
                                                                                          eps);
        return launch_status();
    }
    return 0;
}

extern "C" int k_gdn_chunked(const float *y, const float *b, const float *a, const float *z, const float *A_log,
                             const float *dt_bias, const float *gdn_norm, float *S, float *o, uint16_t *ob, float *ws,
                             int T, int Hk, int Hv, int Dk, int Dv, float eps, int exact, void *stream) {
    return k_gdn_chunked_stages(y, b, a, z, A_log, dt_bias, gdn_norm, S, o, ob, ws, T, Hk, Hv, Dk, Dv, eps, exact, 7,
                                stream);
}
#endif
