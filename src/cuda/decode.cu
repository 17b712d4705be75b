// decode.cu: the decode step (one token) as a few fused, memory-bound kernels (docs/MODEL.md §2).
//
// A decode step streams ~1.9 GB of 4-bit weights and does ~6 GFLOP: every kernel here is a
// matrix-vector product with its neighbours fused into it, so that a layer is 6 launches
// (DeltaNet) or 8 (attention), each reading its weights once with 16-byte loads:
//   k_dv            input staging (plain, RMSNorm, or the DeltaNet gated norm) + up to 4 matrices
//                   in one grid + an epilogue per matrix: store, add into the residual, the causal
//                   conv + SiLU of the DeltaNet channels, or store + argmax (lm_head)
//   k_dv_moe_gateup routing (softmax, top-k) in every block, then gate and up of the k routed
//                   experts and the shared expert with SwiGLU
//   k_dv_moe_down   the down products of the k + 1 experts, weighted, added into the residual
//   k_dv_gdn        the gated delta rule step of one value head slice (state in registers)
// Activations stay fp32 (the exact formula: per group of 64, scale * sum(q x) + bias * sum(x)),
// and codes become floats without conversion instructions: byte-permute a code under the exponent
// of 2^23, subtract 2^23.
// The position is read on the device and no kernel depends on the host, so the whole step is one
// CUDA graph; with programmatic dependent launch each kernel starts while its predecessor drains,
// prefetches its own weights into L2, and waits only before reading the predecessor's output.
#include "common.cuh"

// 4 warps a block, at least 8 blocks an SM (64 registers): 32 warps of loads in flight per SM.
enum { DV_WARPS = 4, DV_THREADS = DV_WARPS * WARP_SIZE, DV_MIN_BLOCKS = 8, DV_TASK_TARGET = 1024 };

static int g_pdl = 1;
extern "C" void k_set_pdl(int on) { g_pdl = on; }
extern "C" int k_pdl(void) { return g_pdl; }

static int sm_count(void) {
    static int n;
    if (!n) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        if (n < 1) n = 1;
    }
    return n;
}

// ---- building blocks --------------------------------------------------------------------------

// Code byte `sel` of v (bits 0..7 of that byte) as a float: 2^23 + code under the exponent, minus 2^23.
#define CODE_F(v, sel) (__int_as_float((int)__byte_perm((v), 0x4B000000u, 0x7440u | (sel))) - 8388608.0f)

// The staged input lives in shared memory as float4 units, unit u at swz(u): the lanes of a warp
// read the same unit of consecutive chunks (8 units apart for 4-bit codes, 4 for 8-bit), which
// would all fall in the same four banks; the swizzle spreads them over all 32.
static __device__ __forceinline__ int swz(int u) { return u ^ ((u >> 3) & 7); }

// d[i] += sum_j code_ij * x[j] over chunk c (16 bytes of codes: 32 4-bit or 16 8-bit, first in the
// low bits) of each of RW rows; x4: the swizzled input, read once for all rows.
template <int BITS, int RW>
static __device__ __forceinline__ void chunk_dot(const uint4 (&q)[RW], const float4 *x4, int c, float (&d)[RW]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (BITS == 4) {
            const float4 a = x4[swz(8 * c + 2 * i)], b = x4[swz(8 * c + 2 * i + 1)];
#pragma unroll
            for (int r = 0; r < RW; r++) {
                const uint32_t w = i == 0 ? q[r].x : i == 1 ? q[r].y : i == 2 ? q[r].z : q[r].w;
                const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;   // codes 0,2,4,6 | 1,3,5,7
                float d0 = CODE_F(lo, 0) * a.x;
                float d1 = CODE_F(hi, 0) * a.y;
                d0 = fmaf(CODE_F(lo, 1), a.z, d0);
                d1 = fmaf(CODE_F(hi, 1), a.w, d1);
                d0 = fmaf(CODE_F(lo, 2), b.x, d0);
                d1 = fmaf(CODE_F(hi, 2), b.y, d1);
                d0 = fmaf(CODE_F(lo, 3), b.z, d0);
                d1 = fmaf(CODE_F(hi, 3), b.w, d1);
                d[r] += d0 + d1;
            }
        } else {
            const float4 a = x4[swz(4 * c + i)];
#pragma unroll
            for (int r = 0; r < RW; r++) {
                const uint32_t w = i == 0 ? q[r].x : i == 1 ? q[r].y : i == 2 ? q[r].z : q[r].w;
                float d0 = CODE_F(w, 0) * a.x;
                float d1 = CODE_F(w, 1) * a.y;
                d0 = fmaf(CODE_F(w, 2), a.z, d0);
                d1 = fmaf(CODE_F(w, 3), a.w, d1);
                d[r] += d0 + d1;
            }
        }
    }
}

// The sum of the inputs of chunk c (xs16: sums of 16 inputs; a 4-bit chunk spans two of them).
template <int BITS>
static __device__ __forceinline__ float chunk_xsum(const float *xs16, int c) {
    return BITS == 4 ? xs16[2 * c] + xs16[2 * c + 1] : xs16[c];
}

// One quantized row as pointers: codes (16-byte chunks), bf16 scales and biases per group of 64.
struct qrow {
    const uint4 *w;
    const uint16_t *s, *b;
};
static __device__ __forceinline__ qrow qrow_of(const struct dqt &W, size_t row) {
    const size_t wpr = (size_t)W.cols * W.bits / 32, gpr = W.cols / QGROUP;
    return {(const uint4 *)(W.w + row * wpr), W.scales + row * gpr, W.biases + row * gpr};
}

// How the lanes of a warp cover rows of K inputs at BITS: a group of lpr lanes per row (one
// 16-byte chunk per lane and step; a whole warp once a row has 32 chunks or more), rpp rows per
// pass, cpl chunks per lane; sub = lane within its group, rip = its row within the pass.
struct lanes {
    int lpr, rpp, cpl, sub, rip;
};
template <int BITS>
static __device__ __forceinline__ lanes lanes_of(int K) {
    const int cpr = K / (128 / BITS), lpr = cpr < WARP_SIZE ? cpr : WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    return {lpr, WARP_SIZE / lpr, cpr / lpr, lane % lpr, lane / lpr};
}

// Dot products of RW rows with the staged input xs [K] (xs16: sums of 16 inputs), each row by a
// group of lanes; every lane of the group gets its row's sum. Two chunks per row are loaded before
// either is used (2 * RW 16-byte loads in flight per lane, scales and biases with them).
template <int BITS, int RW>
static __device__ __forceinline__ void rows_dot(const qrow (&r)[RW], const lanes &L, const float *xs, const float *xs16,
                                                float (&acc)[RW]) {
    constexpr int CODES = 128 / BITS, CPG = QGROUP / CODES;   // chunks per group
#pragma unroll
    for (int i = 0; i < RW; i++) acc[i] = 0;
    for (int j = 0; j < L.cpl; j += 2) {
        const bool two = j + 1 < L.cpl;
        const int c0 = L.sub + j * L.lpr, c1 = two ? c0 + L.lpr : c0;
        uint4 q0[RW], q1[RW];
        float s0[RW], b0[RW], s1[RW], b1[RW];
#pragma unroll
        for (int i = 0; i < RW; i++) {
            q0[i] = __ldg(r[i].w + c0);
            q1[i] = __ldg(r[i].w + c1);
            s0[i] = bf16f(r[i].s[c0 / CPG]), b0[i] = bf16f(r[i].b[c0 / CPG]);
            s1[i] = bf16f(r[i].s[c1 / CPG]), b1[i] = bf16f(r[i].b[c1 / CPG]);
        }
        // acc += scale * sum(q x) + bias * sum(x), per row, for chunk c
        auto use = [&](const uint4 (&q)[RW], const float (&s)[RW], const float (&b)[RW], int c) {
            float d[RW] = {};
            chunk_dot<BITS, RW>(q, (const float4 *)xs, c, d);
            const float xsum = chunk_xsum<BITS>(xs16, c);
#pragma unroll
            for (int i = 0; i < RW; i++) acc[i] = fmaf(s[i], d[i], fmaf(b[i], xsum, acc[i]));
        };
        use(q0, s0, b0, c0);
        if (two) use(q1, s1, b1, c1);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        if (o < L.lpr)
#pragma unroll
            for (int i = 0; i < RW; i++) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
}

static __device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
// Prefetch bytes [p, p + n) into L2, the lanes of a warp taking 128-byte lines in turn.
static __device__ __forceinline__ void prefetch_range(const void *p, size_t n, int lane) {
    for (size_t off = (size_t)lane * 128; off < n; off += WARP_SIZE * 128) prefetch_l2((const char *)p + off);
}

// For each float4 i < n4 of src (global, 16-byte aligned): f(i, src[i]), with 8 loads in flight per
// thread before the first f. (A plain `dst[i] = src[i]` loop serialises: the compiler cannot move
// the next load above a store through a generic pointer, so each iteration would wait a round trip.)
template <typename F>
static __device__ __forceinline__ void for_float4(const float *__restrict__ src, int n4, F f) {
    const float4 *s4 = (const float4 *)src;
    for (int base = 0; base < n4; base += 8 * (int)blockDim.x) {
        float4 v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = base + j * (int)blockDim.x + (int)threadIdx.x;
            if (i < n4) v[j] = __ldg(s4 + i);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = base + j * (int)blockDim.x + (int)threadIdx.x;
            if (i < n4) f(i, v[j]);
        }
    }
}

// Copy n floats (n % 4 == 0) from global to shared memory, swizzled (SWZ) or not.
template <bool SWZ>
static __device__ __forceinline__ void copy_to_smem(float *__restrict__ dst, const float *__restrict__ src, int n) {
    float4 *d4 = (float4 *)dst;
    for_float4(src, n / 4, [&](int i, float4 v) { d4[SWZ ? swz(i) : i] = v; });
}

// xs[i] *= r * w[i] over n floats (n % 4 == 0; xs swizzled).
static __device__ __forceinline__ void smem_scale(float *__restrict__ xs, const float *__restrict__ w, float r, int n) {
    float4 *x4 = (float4 *)xs;
    for_float4(w, n / 4, [&](int i, float4 wv) {
        const float4 x = x4[swz(i)];
        x4[swz(i)] = make_float4(x.x * r * wv.x, x.y * r * wv.y, x.z * r * wv.z, x.w * r * wv.w);
    });
}

// The sums of 16 consecutive inputs (the bias term of a group is bias * sum(x)); xs swizzled.
static __device__ __forceinline__ void sums16(const float *xs, float *xs16, int n) {
    const float4 *x4 = (const float4 *)xs;
    for (int c = threadIdx.x; c < n / 16; c += blockDim.x) {
        const float4 a = x4[swz(4 * c)], b = x4[swz(4 * c + 1)], e = x4[swz(4 * c + 2)], f = x4[swz(4 * c + 3)];
        xs16[c] = a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w + e.x + e.y + e.z + e.w + f.x + f.y + f.z + f.w;
    }
}

// Stage the input vector into shared memory: xs [K] fp32 with the input transform applied, xs16
// [K / 16] the sums of 16; zs [K] scratch for the gate of DV_IN_GATED.
static __device__ void stage_input(const struct dv_desc &d, float *xs, float *xs16, float *zs) {
    __shared__ float sh[32];
    const int K = d.K;
    copy_to_smem<true>(xs, d.x, K);
    if (d.in_mode == DV_IN_GATED) copy_to_smem<false>(zs, d.z, K);
    __syncthreads();
    if (d.in_mode == DV_IN_RMS) {   // xs = x * rsqrt(mean(x^2) + eps) * w   (k_rmsnorm, docs/MODEL.md §2.2)
        float ss = 0;
        for (int i = threadIdx.x; i < K; i += blockDim.x) ss += xs[i] * xs[i];   // (any order of the units)
        ss = block_sum(ss, sh);
        smem_scale(xs, d.norm_w, 1.0f / sqrtf(ss / (float)K + d.eps), K);
    } else if (d.in_mode == DV_IN_GATED) {   // per head: w * (o * rsqrt(mean(o^2) + eps)) * silu(z)
        const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nw = blockDim.x / WARP_SIZE;
        float4 *x4 = (float4 *)xs;
        const float4 *z4 = (const float4 *)zs, *w4 = (const float4 *)d.norm_w;
        const int U = d.Dv / 4;   // units per head
        for (int h = warp; h < d.Hv; h += nw) {
            float ss = 0;
            for (int i = lane; i < U; i += WARP_SIZE) {
                const float4 o = x4[swz(h * U + i)];
                ss += o.x * o.x + o.y * o.y + o.z * o.z + o.w * o.w;
            }
            ss = warp_sum(ss);
            const float r = 1.0f / sqrtf(ss / (float)d.Dv + d.eps);
            for (int i = lane; i < U; i += WARP_SIZE) {
                const float4 o = x4[swz(h * U + i)], z = z4[h * U + i], w = __ldg(w4 + i);
                x4[swz(h * U + i)] = make_float4(w.x * (o.x * r) * silu_f(z.x), w.y * (o.y * r) * silu_f(z.y),
                                                 w.z * (o.z * r) * silu_f(z.z), w.w * (o.w * r) * silu_f(z.w));
            }
        }
    }
    __syncthreads();
    sums16(xs, xs16, K);
    if (d.x_out && blockIdx.x == 0)
        for (int u = threadIdx.x; u < K / 4; u += blockDim.x) ((float4 *)d.x_out)[u] = ((const float4 *)xs)[swz(u)];
    __syncthreads();
}

// Orderable key of (value, row): the larger value wins, then the lower row.
static __device__ __forceinline__ unsigned long long argmax_key(float v, int n) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (uint32_t)(0xFFFFFFFFu - (uint32_t)n);
}

// ---- k_dv: staged input x up to 4 matrices ----------------------------------------------------

// Rows of segment s at [n0, n0 + RW * rpp): lane group rip takes rows n0 + i * rpp + rip.
template <int BITS, int RW>
static __device__ __forceinline__ void dv_task(const struct dv_desc &d, const struct dv_seg &s, int n0, const lanes &L,
                                               const float *xs, const float *xs16, unsigned long long *best) {
    const int R = s.W.rows;
    qrow r[RW];
    int n[RW];
#pragma unroll
    for (int i = 0; i < RW; i++) {
        n[i] = n0 + i * L.rpp + L.rip;
        r[i] = qrow_of(s.W, (size_t)min(n[i], R - 1));
    }
    float acc[RW];
    rows_dot<BITS, RW>(r, L, xs, xs16, acc);
    if (L.sub) return;
#pragma unroll
    for (int i = 0; i < RW; i++) {
        const int row = n[i];
        if (row >= R) continue;
        const float v = acc[i];
        switch (s.mode) {
        case DV_OUT_STORE: s.y[row] = v; break;
        case DV_OUT_ADD: s.y[row] += v; break;
        case DV_OUT_CONV: {   // channel row: y = silu(sum_j w_j xe_j) over xe = (state rows | v); shift
            const int C = d.C, KW = d.KW;
            const float *w = d.conv_w + (size_t)row * KW;
            float *st = d.conv_state + row;
            float acc_c = 0;
            for (int j = 0; j < KW - 1; j++) acc_c += w[j] * st[(size_t)j * C];
            acc_c += w[KW - 1] * v;
            for (int j = 0; j + 1 < KW - 1; j++) st[(size_t)j * C] = st[(size_t)(j + 1) * C];
            st[(size_t)(KW - 2) * C] = v;
            s.y[row] = silu_f(acc_c);
            break;
        }
        case DV_OUT_ARGMAX: {
            s.y[row] = v;
            const unsigned long long k = argmax_key(v, row);
            if (k > *best) *best = k;
            break;
        }
        }
    }
}

// All segments have BITS-bit codes; RW row-passes per task.
template <int BITS, int RW>
static __global__ void __launch_bounds__(DV_THREADS, DV_MIN_BLOCKS) dv_kernel(const struct dv_desc d) {
    extern __shared__ __align__(16) float dv_smem[];
    float *xs = dv_smem, *xs16 = dv_smem + d.K, *zs = xs16 + d.K / 16;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int gw = blockIdx.x * DV_WARPS + warp, stride = gridDim.x * DV_WARPS;
    const lanes L = lanes_of<BITS>(d.K);
    const int per = RW * L.rpp;   // rows per task
    int first[DV_MAXSEG + 1];     // task prefix over the segments
    first[0] = 0;
#pragma unroll
    for (int s = 0; s < DV_MAXSEG; s++) first[s + 1] = first[s] + (s < d.n_seg ? CEIL_DIV(d.seg[s].W.rows, per) : 0);
    const int total = first[DV_MAXSEG];
    auto seg_of = [&](int t) {   // the segment of task t
        int s = 0;
        while (t >= first[s + 1]) s++;
        return s;
    };
    if (d.prefetch) {   // this warp's weights: they do not depend on the predecessor
        const size_t rb = (size_t)d.K * BITS / 8;
        for (int t = gw; t < total; t += stride) {
            const int s = seg_of(t), n0 = (t - first[s]) * per, nr = min(per, d.seg[s].W.rows - n0);
            prefetch_range((const char *)d.seg[s].W.w + (size_t)n0 * rb, (size_t)nr * rb, lane);
        }
    }
    pdl_wait();
    pdl_trigger();
    stage_input(d, xs, xs16, zs);
    unsigned long long best = 0;
    for (int t = gw; t < total; t += stride) {
        const int s = seg_of(t);
        dv_task<BITS, RW>(d, d.seg[s], (t - first[s]) * per, L, xs, xs16, &best);
    }
    if (d.best) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long b = __shfl_xor_sync(0xffffffffu, best, o);
            best = b > best ? b : best;
        }
        if (lane == 0 && best) atomicMax(d.best, best);
    }
}

// Blocks for a grid-stride kernel: enough for the tasks, at most what fits on the GPU at once.
// (The occupancy is asked once per kernel: every call site passes the same block size, and the
// shared memory of these kernels never limits them below their registers.)
template <auto KERN>
static int grid_for_tasks(long tasks, int threads, size_t smem) {
    static int per_sm;   // one per kernel
    if (!per_sm && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KERN, threads, smem) != cudaSuccess ||
                    per_sm < 1))
        per_sm = 1;
    const long want = CEIL_DIV(tasks, threads / WARP_SIZE), cap = (long)per_sm * sm_count();
    return (int)(want < cap ? (want > 0 ? want : 1) : cap);
}

template <int BITS, int RW>
static int dv_launch(const struct dv_desc *d, long tasks, void *stream) {
    const size_t smem = (size_t)(d->K + d->K / 16 + (d->in_mode == DV_IN_GATED ? d->K : 0)) * sizeof(float);
    return launch_k(dv_kernel<BITS, RW>, dim3(grid_for_tasks<dv_kernel<BITS, RW>>(tasks, DV_THREADS, smem)),
                    dim3(DV_THREADS), smem, stream, *d);
}

// Rows a warp covers per pass at K inputs and BITS (lanes_of's rpp, on the host).
static int rows_per_pass(int K, int bits) {
    const int cpr = K / (128 / bits);
    return cpr < WARP_SIZE ? WARP_SIZE / cpr : 1;
}

static long dv_tasks(const struct dv_desc *d, int RW) {
    long t = 0;
    for (int s = 0; s < d->n_seg; s++)
        t += CEIL_DIV(d->seg[s].W.rows, RW * rows_per_pass(d->K, d->seg[s].W.bits));
    return t;
}

template <int BITS>
static int dv_pick(const struct dv_desc *d, void *stream) {
    // Two rows per pass keep x reads shared and registers low; one where the rows are few.
    if (dv_tasks(d, 2) >= DV_TASK_TARGET) return dv_launch<BITS, 2>(d, dv_tasks(d, 2), stream);
    return dv_launch<BITS, 1>(d, dv_tasks(d, 1), stream);
}

extern "C" int k_dv(const struct dv_desc *d, void *stream) {
    if (d->n_seg < 1 || d->n_seg > DV_MAXSEG || d->K < 64 || d->K % 64 || d->K > DV_MAXK)
        return (int)cudaErrorInvalidValue;
    const int bits = d->seg[0].W.bits;
    for (int s = 0; s < d->n_seg; s++) {
        const struct dqt *W = &d->seg[s].W;
        if ((W->bits != 4 && W->bits != 8) || W->bits != bits || W->cols != d->K || W->rows < 1)
            return (int)cudaErrorInvalidValue;
        if (d->seg[s].mode == DV_OUT_CONV && (!d->conv_w || !d->conv_state || d->KW < 2 || W->rows > d->C))
            return (int)cudaErrorInvalidValue;
        if (d->seg[s].mode == DV_OUT_ARGMAX && !d->best) return (int)cudaErrorInvalidValue;
    }
    if (d->in_mode == DV_IN_GATED && (!d->z || d->Hv * d->Dv != d->K)) return (int)cudaErrorInvalidValue;
    return bits == 4 ? dv_pick<4>(d, stream) : dv_pick<8>(d, stream);
}

// ---- embedding -----------------------------------------------------------------------------------

// x = dequant(E[io[0]]); also clears the argmax key of the step.
static __global__ void dv_embed_kernel(struct dqt E, const int *io, float *x, unsigned long long *best) {
    pdl_wait();
    pdl_trigger();
    dequant_row(E, (size_t)io[0], x);
    if (threadIdx.x == 0 && best) *best = 0;
}

extern "C" int k_dv_embed(struct dqt E, const int *io, float *x, unsigned long long *best, void *stream) {
    return launch_k(dv_embed_kernel, dim3(1), dim3(256), 0, stream, E, io, x, best);
}

// ---- MoE -----------------------------------------------------------------------------------------

// Stage v [n] into shared memory with the sums of 16 (n a multiple of 16).
static __device__ void stage_plain(const float *v, int n, float *xs, float *xs16) {
    copy_to_smem<true>(xs, v, n);
    __syncthreads();
    sums16(xs, xs16, n);
    __syncthreads();
}

// Routing in every block (the logits are 1 KB), then tasks of one (gate, up) row pair of one expert
// e < k + 1 (e == k: the shared expert): act[e, n] = silu(gate_e[n] u) * (up_e[n] u).
// Block 0 writes ids[0..k) and w[0..k], w[k] = sigmoid(shared gate logit), for k_dv_moe_down.
static __global__ void __launch_bounds__(DV_THREADS, DV_MIN_BLOCKS) dv_gateup_kernel(const struct dv_moe m) {
    extern __shared__ __align__(16) float mg_smem[];
    float *xs = mg_smem, *xs16 = xs + m.H, *p = xs16 + m.H / 16;
    __shared__ int ids[WARP_SIZE];
    __shared__ float wts[WARP_SIZE];
    const int warp = threadIdx.x / WARP_SIZE;
    pdl_wait();
    pdl_trigger();
    route_block(m.logits, m.E, m.k, p, ids, wts);
    if (blockIdx.x == 0 && threadIdx.x <= m.k) {
        m.ids[threadIdx.x] = threadIdx.x < m.k ? ids[threadIdx.x] : -1;
        m.w[threadIdx.x] = threadIdx.x < m.k ? wts[threadIdx.x] : sigmoid_f(m.shared_logit[0]);
    }
    stage_plain(m.u, m.H, xs, xs16);
    const lanes L = lanes_of<4>(m.H);
    const int tasks_e = CEIL_DIV(m.I, L.rpp), total = (m.k + 1) * tasks_e;
    for (int t = blockIdx.x * DV_WARPS + warp; t < total; t += gridDim.x * DV_WARPS) {
        const int e = t / tasks_e, n = (t % tasks_e) * L.rpp + L.rip;
        const bool shared = e == m.k;
        const size_t row = (shared ? 0 : (size_t)ids[e] * m.I) + (size_t)min(n, m.I - 1);
        const qrow r[2] = {qrow_of(shared ? m.sgate : m.gate, row), qrow_of(shared ? m.sup : m.up, row)};
        float acc[2];
        rows_dot<4, 2>(r, L, xs, xs16, acc);
        if (!L.sub && n < m.I) m.act[(size_t)e * m.I + n] = silu_f(acc[0]) * acc[1];
    }
}

// x[n] += sum_{e <= k} w_e * down_e[n] act_e: a warp per output row, its lanes over the (expert,
// chunk) pairs of the row (up to DN_ITEMS each), every load issued before the first use.
enum { DN_ITEMS = 6 };
static __global__ void __launch_bounds__(DV_THREADS, 6) dv_down_kernel(const struct dv_moe m) {
    extern __shared__ __align__(16) float md_smem[];
    const int nx = (m.k + 1) * m.I;
    float *xs = md_smem, *xs16 = xs + nx;
    __shared__ int ids[WARP_SIZE];
    __shared__ float wts[WARP_SIZE];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    pdl_wait();
    pdl_trigger();
    if (threadIdx.x <= m.k) ids[threadIdx.x] = m.ids[threadIdx.x], wts[threadIdx.x] = m.w[threadIdx.x];
    stage_plain(m.act, nx, xs, xs16);
    const int cpr = m.I / 32, items = (m.k + 1) * cpr;
    for (int n = blockIdx.x * DV_WARPS + warp; n < m.H; n += gridDim.x * DV_WARPS) {
        uint4 q[DN_ITEMS][1];
        float sc[DN_ITEMS], bi[DN_ITEMS];
#pragma unroll
        for (int j = 0; j < DN_ITEMS; j++) {
            const int it = min(lane + j * WARP_SIZE, items - 1), e = it / cpr, c = it % cpr;
            const bool shared = e == m.k;
            const qrow r = qrow_of(shared ? m.sdown : m.down, (shared ? 0 : (size_t)ids[e] * m.H) + n);
            q[j][0] = __ldg(r.w + c);
            sc[j] = bf16f(r.s[c / 2]), bi[j] = bf16f(r.b[c / 2]);
        }
        float acc = 0;
#pragma unroll
        for (int j = 0; j < DN_ITEMS; j++) {
            const int it = lane + j * WARP_SIZE, e = it / cpr, c = it % cpr;
            if (it >= items) break;
            const int cg = e * m.I / 32 + c;   // the chunk's index in the staged act
            float d[1] = {0};
            chunk_dot<4, 1>(q[j], (const float4 *)xs, cg, d);
            acc = fmaf(wts[e], fmaf(sc[j], d[0], bi[j] * chunk_xsum<4>(xs16, cg)), acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) m.x[n] += acc;
    }
}

extern "C" int k_dv_moe_gateup(const struct dv_moe *m, void *stream) {
    if (m->k < 1 || m->k >= WARP_SIZE || m->E > RT_MAXE || m->H % 64 || m->H > DV_MAXK || m->I % 64 ||
        m->gate.bits != 4 || m->up.bits != 4 || m->sgate.bits != 4 || m->sup.bits != 4 || m->sgate.rows != m->I)
        return (int)cudaErrorInvalidValue;
    const size_t smem = (size_t)(m->H + m->H / 16 + m->E) * sizeof(float);
    const long tasks = (long)(m->k + 1) * CEIL_DIV(m->I, rows_per_pass(m->H, 4));
    return launch_k(dv_gateup_kernel, dim3(grid_for_tasks<dv_gateup_kernel>(tasks, DV_THREADS, smem)),
                    dim3(DV_THREADS), smem, stream, *m);
}

extern "C" int k_dv_moe_down(const struct dv_moe *m, void *stream) {
    if (m->k < 1 || m->k >= WARP_SIZE || m->I % 64 || m->down.bits != 4 || m->sdown.bits != 4 ||
        m->sdown.cols != m->I || (m->k + 1) * (m->I / 32) > DN_ITEMS * WARP_SIZE)
        return (int)cudaErrorInvalidValue;
    const int nx = (m->k + 1) * m->I;
    const size_t smem = (size_t)(nx + nx / 16) * sizeof(float);
    return launch_k(dv_down_kernel, dim3(grid_for_tasks<dv_down_kernel>(m->H, DV_THREADS, smem)),
                    dim3(DV_THREADS), smem, stream, *m);
}

// ---- the gated delta rule step -------------------------------------------------------------------

// Block (value head h, slice of 32 value columns); thread (part, col) keeps rows
// [part * DK / 8, ..) of column col of the head's state in registers. Reads the conv output y
// [C] = (q heads | k heads | v heads) after SiLU; L2-normalises q and k (q also by 1/sqrt(DK));
// S = alpha S; m = S^T k; S += k (beta (v - m))^T; o = S^T q (before the gated norm, which the
// out_proj kernel applies while staging its input).
enum { GD_PARTS = 8, GD_COLS = 32 };
template <int DK>
static __global__ void __launch_bounds__(GD_PARTS *GD_COLS)
    dv_gdn_kernel(const float *y, const float *b, const float *a, const float *A_log, const float *dt_bias, float *S,
                  float *o, int Hk, int Hv, int Dv) {
    constexpr int DP = DK / GD_PARTS;
    __shared__ float qs[DK], ks[DK], red[GD_PARTS][GD_COLS];
    __shared__ float sh[32];
    const int h = blockIdx.x, col = threadIdx.x % GD_COLS, part = threadIdx.x / GD_COLS;
    const int dv = blockIdx.y * GD_COLS + col, kh = h / (Hv / Hk), KD = Hk * DK;
    float *Sh = S + (size_t)h * DK * Dv + (size_t)part * DP * Dv + dv;
    float st[DP];
#pragma unroll
    for (int i = 0; i < DP; i++) st[i] = Sh[(size_t)i * Dv];   // this step's own state: no wait needed
    pdl_wait();
    pdl_trigger();
    float qv = 0, kv = 0;
    if (threadIdx.x < DK) qv = y[(size_t)kh * DK + threadIdx.x], kv = y[KD + (size_t)kh * DK + threadIdx.x];
    const float qss = block_sum(qv * qv, sh);
    const float kss = block_sum(kv * kv, sh);
    if (threadIdx.x < DK) {
        const float rq = 1.0f / sqrtf(qss + 1e-6f) / sqrtf((float)DK), rk = 1.0f / sqrtf(kss + 1e-6f);
        qs[threadIdx.x] = qv * rq;
        ks[threadIdx.x] = kv * rk;
    }
    __syncthreads();
    const float v = y[2 * (size_t)KD + (size_t)h * Dv + dv];
    const float beta = sigmoid_f(b[h]);
    const float alpha = expf(-expf(A_log[h]) * softplus_f(a[h] + dt_bias[h]));
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
    if (part == 0) {
        out = 0;
#pragma unroll
        for (int p = 0; p < GD_PARTS; p++) out += red[p][col];
        o[(size_t)h * Dv + dv] = out;
    }
#pragma unroll
    for (int i = 0; i < DP; i++) Sh[(size_t)i * Dv] = st[i];
}

extern "C" int k_dv_gdn(const float *y, const float *b, const float *a, const float *A_log, const float *dt_bias,
                        float *S, float *o, int Hk, int Hv, int Dk, int Dv, void *stream) {
    if (Dv % GD_COLS || Hv % Hk) return (int)cudaErrorInvalidValue;
    const dim3 grid(Hv, Dv / GD_COLS), block(GD_PARTS * GD_COLS);
    switch (Dk) {
    case 128: return launch_k(dv_gdn_kernel<128>, grid, block, 0, stream, y, b, a, A_log, dt_bias, S, o, Hk, Hv, Dv);
    case 64: return launch_k(dv_gdn_kernel<64>, grid, block, 0, stream, y, b, a, A_log, dt_bias, S, o, Hk, Hv, Dv);
    case 32: return launch_k(dv_gdn_kernel<32>, grid, block, 0, stream, y, b, a, A_log, dt_bias, S, o, Hk, Hv, Dv);
    default: return (int)cudaErrorInvalidValue;
    }
}
