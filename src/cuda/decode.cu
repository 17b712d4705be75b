// decode.cu: the decode step (one token) as a few fused, memory-bound kernels (docs/MODEL.md §2).
//
// A decode step streams ~1.9 GB of 4-bit weights and does ~6 GFLOP: every kernel here is a
// matrix-vector product with its neighbours fused into it, so that a layer is 6 launches
// (DeltaNet) or 8 (attention), each reading its weights once with 16-byte loads:
//   k_dv            input staging (plain or RMSNorm) + up to 4 matrices
//                   in one grid + an epilogue per matrix: store, add into the residual, the causal
//                   conv + SiLU of the DeltaNet channels, or store + argmax (lm_head)
//   k_dv_moe_gateup routing (softmax, top-k) in every block, then gate and up of the k routed
//                   experts and the shared expert with SwiGLU (fast mode: on the tensor cores)
//   k_dv_moe_down   the down products of the k + 1 experts, weighted, added into the residual
//                   (fast mode: on the tensor cores, a warp an expert)
//   k_dv_gdn        the gated delta rule step of one value head (state in registers) + its gated norm
// Exact mode: activations stay fp32 (per group of 64, scale * sum(q x) + bias * sum(x)), and codes
// become floats without conversion instructions: byte-permute a code under the exponent of 2^23,
// subtract 2^23. Fast mode (the default) runs every 4-bit product on the tensor cores with the input
// rounded to bf16 (tcgemv.cuh): ~1.3 instructions per code instead of ~3.5: the DeltaNet and attention
// input projections, lm_head, o_proj / out_proj, the experts' gate, up and down (the 8-bit router and
// shared gate stay on the CUDA cores). A kernel's time is the chain of its few warps (bench/NOTES.md,
// versions 10 and 11), so the products split K over the warps of a block, each warp's super-steps
// loaded at once: one round trip of loads a task.
// The position is read on the device and no kernel depends on the host, so the whole step is one
// CUDA graph; with programmatic dependent launch (default; CALLA_PDL=0 off) each kernel starts while its
// predecessor drains, prefetches its own weights into L2, and waits only before reading the
// predecessor's output.
#include "common.cuh"
#include "tcgemv.cuh"

// 4 warps a block, at least 8 blocks an SM (64 registers): 32 warps of loads in flight per SM.
// DV_ONE_WAVE: warps resident at once on an H200 (132 SMs x 8 blocks x 4 warps).
enum { DV_WARPS = 4, DV_THREADS = DV_WARPS * WARP_SIZE, DV_MIN_BLOCKS = 8, DV_ONE_WAVE = 132 * 8 * DV_WARPS };

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
// group of lanes; every lane of the group gets its row's sum. NB chunks per row are loaded before
// any is used (4 16-byte loads in flight per lane, scales and biases with them): a
// row of up to 4 chunks a lane (K <= 4096 at 4 bits) is one round trip (2 chunks a row for RW = 2).
template <int BITS, int RW>
static __device__ __forceinline__ void rows_dot(const qrow (&r)[RW], const lanes &L, const float *xs, const float *xs16,
                                                float (&acc)[RW]) {
    constexpr int CODES = 128 / BITS, CPG = QGROUP / CODES;   // chunks per group
    constexpr int NB = RW == 1 ? 4 : 2;
#pragma unroll
    for (int i = 0; i < RW; i++) acc[i] = 0;
    for (int j = 0; j < L.cpl; j += NB) {
        uint4 q[NB][RW];
        float sc[NB][RW], bi[NB][RW];
        int c[NB];
#pragma unroll
        for (int b = 0; b < NB; b++) {
            c[b] = L.sub + min(j + b, L.cpl - 1) * L.lpr;
#pragma unroll
            for (int i = 0; i < RW; i++) {
                q[b][i] = __ldg(r[i].w + c[b]);
                sc[b][i] = bf16f(r[i].s[c[b] / CPG]), bi[b][i] = bf16f(r[i].b[c[b] / CPG]);
            }
        }
        // acc += scale * sum(q x) + bias * sum(x), per row, for chunk c
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (b > 0 && j + b >= L.cpl) continue;
            float d[RW] = {};
            chunk_dot<BITS, RW>(q[b], (const float4 *)xs, c[b], d);
            const float xsum = chunk_xsum<BITS>(xs16, c[b]);
#pragma unroll
            for (int i = 0; i < RW; i++) acc[i] = fmaf(sc[b][i], d[i], fmaf(bi[b][i], xsum, acc[i]));
        }
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
// Threads tid of nt take the float4s in turn (by default the whole block).
template <typename F>
static __device__ __forceinline__ void for_float4(const float *__restrict__ src, int n4, F f, int tid = threadIdx.x,
                                                  int nt = blockDim.x) {
    const float4 *s4 = (const float4 *)src;
    for (int base = 0; base < n4; base += 8 * nt) {
        float4 v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = base + j * nt + tid;
            if (i < n4) v[j] = __ldg(s4 + i);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = base + j * nt + tid;
            if (i < n4) f(i, v[j]);
        }
    }
}

// Copy n floats (n % 4 == 0) from global to shared memory, swizzled (SWZ) or not, by threads tid of nt.
template <bool SWZ>
static __device__ __forceinline__ void copy_to_smem(float *__restrict__ dst, const float *__restrict__ src, int n,
                                                    int tid = threadIdx.x, int nt = blockDim.x) {
    float4 *d4 = (float4 *)dst;
    for_float4(src, n / 4, [&](int i, float4 v) { d4[SWZ ? swz(i) : i] = v; }, tid, nt);
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

// RMS staging (xs = x * rsqrt(mean(x^2) + eps) * w, k_rmsnorm, docs/MODEL.md §2.2) with x and the
// norm weights loaded in one round trip: a thread's float4s of both in flight at once, held in
// registers through the block sum. So K <= 4 STAGE_RMS_F4 per thread (every model shape);
// stage_input keeps the two-trip form for larger K.
enum { STAGE_RMS_F4 = 4 };
static __device__ void stage_rms_one_trip(const struct dv_desc &d, float *xs, float *sh) {
    const float4 *x4 = (const float4 *)d.x, *w4 = (const float4 *)d.norm_w;
    const int n4 = d.K / 4;
    float4 xv[STAGE_RMS_F4], wv[STAGE_RMS_F4];
    float ss = 0;   // (any order of the units)
#pragma unroll
    for (int j = 0; j < STAGE_RMS_F4; j++) {
        const int i = j * blockDim.x + threadIdx.x;
        if (i < n4) xv[j] = __ldg(x4 + i), wv[j] = __ldg(w4 + i);
    }
#pragma unroll
    for (int j = 0; j < STAGE_RMS_F4; j++)
        if (j * blockDim.x + threadIdx.x < n4) ss += xv[j].x * xv[j].x + xv[j].y * xv[j].y + xv[j].z * xv[j].z + xv[j].w * xv[j].w;
    const float r = 1.0f / sqrtf(block_sum(ss, sh) / (float)d.K + d.eps);
    float4 *xo = (float4 *)xs;
#pragma unroll
    for (int j = 0; j < STAGE_RMS_F4; j++) {
        const int i = j * blockDim.x + threadIdx.x;
        if (i < n4)
            xo[swz(i)] = make_float4(xv[j].x * r * wv[j].x, xv[j].y * r * wv[j].y, xv[j].z * r * wv[j].z, xv[j].w * r * wv[j].w);
    }
}

// Stage the input vector into shared memory: xs [K] fp32 with the input transform applied, xs16
// [K / 16] the sums of 16.
static __device__ void stage_input(const struct dv_desc &d, float *xs, float *xs16) {
    __shared__ float sh[32];
    const int K = d.K;
    if (d.in_mode == DV_IN_RMS && K <= 4 * STAGE_RMS_F4 * (int)blockDim.x) {   // every model shape
        stage_rms_one_trip(d, xs, sh);
    } else {
        copy_to_smem<true>(xs, d.x, K);
        __syncthreads();
        if (d.in_mode == DV_IN_RMS) {   // the two-trip form: x staged, then scaled by w from global
            float ss = 0;
            for (int i = threadIdx.x; i < K; i += blockDim.x) ss += xs[i] * xs[i];   // (any order of the units)
            ss = block_sum(ss, sh);
            smem_scale(xs, d.norm_w, 1.0f / sqrtf(ss / (float)K + d.eps), K);
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

// The block's best argmax key into *best (every lane holds its own).
static __device__ __forceinline__ void best_reduce(unsigned long long best, unsigned long long *out) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long b = __shfl_xor_sync(0xffffffffu, best, o);
        best = b > best ? b : best;
    }
    if (threadIdx.x % WARP_SIZE == 0 && best) atomicMax(out, best);
}

// ---- k_dv: staged input x up to 4 matrices ----------------------------------------------------

// What the epilogue of an output row reads besides the product: the residual (DV_OUT_ADD), or the
// conv taps and state rows (DV_OUT_CONV, KW <= DV_MAXKW). Where the row is known before the product
// (a warp's first task), its storing lane copies them into its own slot of shared memory by cp.async
// while the input is staged (dv_epi_load: no registers held, nothing waited for), so that the
// epilogue does not wait one more round trip after the product.
enum { DV_MAXKW = 4 };
struct dv_epi {
    float r;                                 // DV_OUT_ADD: y[row]
    float w[DV_MAXKW], st[DV_MAXKW - 1];    // DV_OUT_CONV: taps, state rows (oldest first)
};
static __device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
static __device__ __forceinline__ void dv_epi_load(const struct dv_desc &d, const struct dv_seg &s, int row,
                                                   dv_epi *e) {
    if (s.mode == DV_OUT_ADD) cp_async4(&e->r, s.y + row);
    if (s.mode != DV_OUT_CONV) return;
    for (int j = 0; j < d.KW; j++) cp_async4(&e->w[j], d.conv_w + (size_t)row * d.KW + j);
    for (int j = 0; j + 1 < d.KW; j++) cp_async4(&e->st[j], d.conv_state + (size_t)j * d.C + row);
}

// The epilogue of output row `row` of segment s with product v. e: the row's inputs copied by
// dv_epi_load (this thread's copies), or NULL: read them now.
static __device__ __forceinline__ void dv_out(const struct dv_desc &d, const struct dv_seg &s, int row, float v,
                                              unsigned long long *best, const dv_epi *e = nullptr) {
    if (e) asm volatile("cp.async.wait_all;\n" ::: "memory");
    switch (s.mode) {
    case DV_OUT_STORE: s.y[row] = v; break;
    case DV_OUT_ADD: s.y[row] = (e ? e->r : s.y[row]) + v; break;
    case DV_OUT_CONV: {   // channel row: y = silu(sum_j w_j xe_j) over xe = (state rows | v); shift
        const int C = d.C, KW = d.KW;
        const float *w = e ? e->w : d.conv_w + (size_t)row * KW;
        float *st = d.conv_state + row;
        float acc_c = 0;
        for (int j = 0; j < KW - 1; j++) acc_c += w[j] * (e ? e->st[j] : st[(size_t)j * C]);
        acc_c += w[KW - 1] * v;
        for (int j = 0; j + 1 < KW - 1; j++) st[(size_t)j * C] = e ? e->st[j + 1] : st[(size_t)(j + 1) * C];
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

// The row of pass i of a task at n0 that this lane's group takes.
static __device__ __forceinline__ int dv_row(int n0, int i, const lanes &L) { return n0 + i * L.rpp + L.rip; }

// The epilogue inputs of this lane's rows of a task (the lanes that store: L.sub == 0) into e[0..RW).
template <int RW>
static __device__ __forceinline__ void dv_task_epi(const struct dv_desc &d, const struct dv_seg &s, int n0,
                                                   const lanes &L, dv_epi *e) {
#pragma unroll
    for (int i = 0; i < RW; i++)
        if (!L.sub && dv_row(n0, i, L) < s.W.rows) dv_epi_load(d, s, dv_row(n0, i, L), e + i);
}

// Rows of segment s at [n0, n0 + RW * rpp): lane group rip takes rows n0 + i * rpp + rip. e: the
// epilogue inputs copied by dv_task_epi, or NULL.
template <int BITS, int RW>
static __device__ __forceinline__ void dv_task(const struct dv_desc &d, const struct dv_seg &s, int n0, const lanes &L,
                                               const float *xs, const float *xs16, const dv_epi *e,
                                               unsigned long long *best) {
    const int R = s.W.rows;
    qrow r[RW];
#pragma unroll
    for (int i = 0; i < RW; i++) r[i] = qrow_of(s.W, (size_t)min(dv_row(n0, i, L), R - 1));
    float acc[RW];
    rows_dot<BITS, RW>(r, L, xs, xs16, acc);
    if (L.sub) return;
#pragma unroll
    for (int i = 0; i < RW; i++) {
        const int n = dv_row(n0, i, L);
        if (n >= R) continue;
        dv_out(d, s, n, acc[i], best, e ? e + i : nullptr);
    }
}

// The tasks of a descriptor: tasks of `per` rows, segment after segment.
struct dv_taskmap {
    int first[DV_MAXSEG + 1];   // task prefix over the segments
    __device__ dv_taskmap(const struct dv_desc &d, int per) {
        first[0] = 0;
#pragma unroll
        for (int s = 0; s < DV_MAXSEG; s++) first[s + 1] = first[s] + (s < d.n_seg ? CEIL_DIV(d.seg[s].W.rows, per) : 0);
    }
    __device__ int total() const { return first[DV_MAXSEG]; }
    __device__ int seg_of(int t) const {   // the segment of task t
        int s = 0;
        while (t >= first[s + 1]) s++;
        return s;
    }
};

// All segments have BITS-bit codes; RW row-passes per task.
template <int BITS, int RW>
static __global__ void __launch_bounds__(DV_THREADS, DV_MIN_BLOCKS) dv_kernel(const struct dv_desc d) {
    extern __shared__ __align__(16) float dv_smem[];
    float *xs = dv_smem, *xs16 = dv_smem + d.K;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int gw = blockIdx.x * DV_WARPS + warp, stride = gridDim.x * DV_WARPS;
    const lanes L = lanes_of<BITS>(d.K);
    const int per = RW * L.rpp;   // rows per task
    const dv_taskmap T(d, per);
    if (d.prefetch) {   // this warp's weights: they do not depend on the predecessor
        const size_t rb = (size_t)d.K * BITS / 8;
        for (int t = gw; t < T.total(); t += stride) {
            const int s = T.seg_of(t), n0 = (t - T.first[s]) * per, nr = min(per, d.seg[s].W.rows - n0);
            prefetch_range((const char *)d.seg[s].W.w + (size_t)n0 * rb, (size_t)nr * rb, lane);
        }
    }
    pdl_wait();
    pdl_trigger();
    __shared__ dv_epi epi[DV_THREADS][RW];   // the first task's epilogue inputs, copied with the input
    if (gw < T.total()) dv_task_epi<RW>(d, d.seg[T.seg_of(gw)], (gw - T.first[T.seg_of(gw)]) * per, L, epi[threadIdx.x]);
    stage_input(d, xs, xs16);
    unsigned long long best = 0;
    for (int t = gw; t < T.total(); t += stride) {
        const int s = T.seg_of(t);
        dv_task<BITS, RW>(d, d.seg[s], (t - T.first[s]) * per, L, xs, xs16, t == gw ? epi[threadIdx.x] : nullptr, &best);
    }
    if (d.best) best_reduce(best, d.best);
}

// k_dv on the tensor cores (fast mode, 4-bit segments): the input staged as k_dv's, then again as
// bf16 in tcgemv.cuh's layout; tasks of 16 rows of one segment (tc_rows16), each lane finishing
// one row (lanes t = 0 and 2 of a quad store). Two forms:
//   dv_tc_split_kernel (K a multiple of 1,024: every model shape) a block takes a task and its
//     warps split K (a quarter of the super-steps each, all loaded at once, the four partial sums
//     added in shared memory): a task is one round trip of loads instead of a warp's walk through
//     K / 256 super-steps two at a time. 80 registers, 6 blocks an SM: the DeltaNet (772 tasks)
//     and attention (576) input projections run as one wave of 792 blocks (at 128 registers, two
//     waves of 528).
//   dv_tc_kernel a warp takes a task whole: where there are more tasks than warps resident
//     anyway (lm_head's 15,520) and where K is not a multiple of 1,024 (test geometries).
enum { DV_TC_MIN_BLOCKS = 4, DV_TC_SPLIT_MIN_BLOCKS = 6, DV_TC_MIN_ROWS = 8192 };
static bool tc_split_k(int K) { return K % (TC_SUPER * DV_WARPS) == 0; }

// The RMS-normalised input x * rsqrt(mean(x^2) + eps) * w staged for tc_rows16 in one pass, with no
// fp32 copy in shared memory (two barriers and a pass fewer than stage_input then tc_stage_x_by):
// thread t loads the x and w of units t + j blockDim.x (j < U), the units it then converts. The sum
// of squares adds in another order than stage_input's (r may differ in its last bit).
template <int U>
static __device__ __forceinline__ void tc_stage_rms(const struct dv_desc &d, unsigned char *tsm) {
    __shared__ float sh[32];
    const int K = d.K, nc = 32 * tc_nsuper(K), kc = K / 8, nt = blockDim.x;
    const float4 *x4 = (const float4 *)d.x, *w4 = (const float4 *)d.norm_w;
    float4 xv[2 * U], wv[2 * U];
    float ss = 0;   // (any order of the units)
#pragma unroll
    for (int j = 0; j < U; j++) {
        const int u = j * nt + (int)threadIdx.x;
        const float4 z = make_float4(0, 0, 0, 0);
        xv[2 * j] = u < kc ? __ldg(x4 + 2 * u) : z, xv[2 * j + 1] = u < kc ? __ldg(x4 + 2 * u + 1) : z;
        wv[2 * j] = u < kc ? __ldg(w4 + 2 * u) : z, wv[2 * j + 1] = u < kc ? __ldg(w4 + 2 * u + 1) : z;
    }
#pragma unroll
    for (int j = 0; j < 2 * U; j++) ss += xv[j].x * xv[j].x + xv[j].y * xv[j].y + xv[j].z * xv[j].z + xv[j].w * xv[j].w;
    const float r = 1.0f / sqrtf(block_sum(ss, sh) / (float)K + d.eps);
#pragma unroll
    for (int j = 0; j < U; j++) {
        const int u = j * nt + (int)threadIdx.x;
        if (u >= nc) break;   // warp-uniform
        const float4 a = xv[2 * j], b = xv[2 * j + 1], wa = wv[2 * j], wb = wv[2 * j + 1];
        const float v[8] = {a.x * r * wa.x, a.y * r * wa.y, a.z * r * wa.z, a.w * r * wa.w,
                            b.x * r * wb.x, b.y * r * wb.y, b.z * r * wb.z, b.w * r * wb.w};
        tc_stage_unit(u, v, K, tsm);
    }
    tc_stage_close(K, tsm, threadIdx.x);
}
enum { TC_RMS_UNITS = 2 };   // tc_stage_rms's units a thread: K <= 16 blockDim.x (every model shape)

// The prologue both forms share: (with PDL) an L2 prefetch of the tasks' codes a warp will run,
// a quarter each when the block shares a task; the wait; with epi (the split form) the epilogue
// inputs of the block's first task copied by the lanes of warp 0 that store (epi[lane]); the input
// staged in tc's layout (an RMS input in one pass, tc_stage_rms; else staged as k_dv's, then again).
static __device__ __forceinline__ void dv_tc_begin(const struct dv_desc &d, const dv_taskmap &T, int first,
                                                   int stride, bool split, float *xs, float *xs16, unsigned char *tsm,
                                                   dv_epi *epi = nullptr) {
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (d.prefetch) {
        const size_t rb = (size_t)d.K / 2;
        for (int t = first; t < T.total(); t += stride) {
            const int s = T.seg_of(t), n0 = (t - T.first[s]) * TC_ROWS, nr = min(TC_ROWS, d.seg[s].W.rows - n0);
            const size_t n = (size_t)nr * rb, q = split ? n / (blockDim.x / WARP_SIZE) : n;
            prefetch_range((const char *)d.seg[s].W.w + (size_t)n0 * rb + (split ? warp * q : 0), q, lane);
        }
    }
    pdl_wait();
    pdl_trigger();
    if (epi && first < T.total() && warp == 0 && !(lane & 1)) {
        const int s = T.seg_of(first), row = (first - T.first[s]) * TC_ROWS + tc_lane_row(lane);
        if (row < d.seg[s].W.rows) dv_epi_load(d, d.seg[s], row, &epi[lane]);
    }
    if (d.in_mode == DV_IN_RMS && !d.x_out && 32 * tc_nsuper(d.K) <= TC_RMS_UNITS * (int)blockDim.x) {
        tc_stage_rms<TC_RMS_UNITS>(d, tsm);   // every model shape
        return;
    }
    if (d.in_mode == DV_IN_PLAIN && !d.x_out) {   // o_proj / out_proj (dv_tc_split_kernel<8>): bf16 from x at once
        tc_stage_x(d.x, d.K, tsm);
        return;
    }
    stage_input(d, xs, xs16);
    const float4 *x4 = (const float4 *)xs;
    tc_stage_x_by(
        [&](int u, float (&v)[8]) {
            const float4 a = x4[swz(2 * u)], b = x4[swz(2 * u + 1)];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        },
        d.K, tsm);
}

static __global__ void __launch_bounds__(DV_THREADS, DV_TC_MIN_BLOCKS) dv_tc_kernel(const struct dv_desc d) {
    extern __shared__ __align__(16) float dv_smem[];
    float *xs = dv_smem, *xs16 = dv_smem + d.K;
    unsigned char *tsm = (unsigned char *)(xs16 + d.K / 16);
    const int lane = threadIdx.x % WARP_SIZE, first = blockIdx.x * DV_WARPS + threadIdx.x / WARP_SIZE;
    const int stride = gridDim.x * DV_WARPS;
    const dv_taskmap T(d, TC_ROWS);
    dv_tc_begin(d, T, first, stride, false, xs, xs16, tsm);
    unsigned long long best = 0;
    for (int t = first; t < T.total(); t += stride) {
        const int s = T.seg_of(t), n0 = (t - T.first[s]) * TC_ROWS, row = n0 + tc_lane_row(lane);
        const struct dqt &W = d.seg[s].W;
        const float v = tc_rows16(W.w, W.scales, W.biases, W.rows, d.K, n0, tsm);
        if (!(lane & 1) && row < W.rows) dv_out(d, d.seg[s], row, v, &best);
    }
    if (d.best) best_reduce(best, d.best);
}

template <int NW, int MINB>
static __global__ void __launch_bounds__(NW *WARP_SIZE, MINB) dv_tc_split_kernel(const struct dv_desc d) {
    extern __shared__ __align__(16) float dv_smem[];
    __shared__ float part[NW][WARP_SIZE];
    float *xs = dv_smem, *xs16 = dv_smem + d.K;
    unsigned char *tsm = (unsigned char *)(xs16 + d.K / 16);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const dv_taskmap T(d, TC_ROWS);
    const int nS = tc_nsuper(d.K), S0 = warp * nS / NW, S1 = (warp + 1) * nS / NW;
    __shared__ dv_epi epi[WARP_SIZE];   // the first task's epilogue inputs, copied by warp 0 with the input
    dv_tc_begin(d, T, blockIdx.x, gridDim.x, true, xs, xs16, tsm, epi);
    unsigned long long best = 0;
    for (int t = blockIdx.x; t < T.total(); t += gridDim.x) {
        const int s = T.seg_of(t), n0 = (t - T.first[s]) * TC_ROWS, row = n0 + tc_lane_row(lane);
        const struct dqt &W = d.seg[s].W;
        part[warp][lane] = tc_rows16<false>(W.w, W.scales, W.biases, W.rows, d.K, n0, tsm, S0, S1);
        __syncthreads();
        if (warp == 0 && !(lane & 1) && row < W.rows) {
            float v = (part[0][lane] + part[1][lane]) + (part[2][lane] + part[3][lane]);
            if (NW == 8) v += (part[4][lane] + part[5][lane]) + (part[6][lane] + part[7][lane]);
            dv_out(d, d.seg[s], row, v, &best, t == (int)blockIdx.x ? &epi[lane] : nullptr);
        }
        __syncthreads();
    }
    if (d.best) best_reduce(best, d.best);
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

static size_t dv_smem_bytes(const struct dv_desc *d);
template <int BITS, int RW>
static int dv_launch(const struct dv_desc *d, long tasks, const struct dec_launch *l) {
    const size_t smem = dv_smem_bytes(d);
    return launch_k(dv_kernel<BITS, RW>, dim3(grid_for_tasks<dv_kernel<BITS, RW>>(tasks, DV_THREADS, smem)),
                    dim3(DV_THREADS), smem, l, *d);
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

static size_t dv_smem_bytes(const struct dv_desc *d) {
    return (size_t)(d->K + d->K / 16) * sizeof(float);
}

// The 16-row tasks of d's segments and the shared memory of the tensor-core forms (k_dv's staging, then tc's).
static long dv_tc_tasks(const struct dv_desc *d) {
    long tasks = 0;
    for (int s = 0; s < d->n_seg; s++) tasks += CEIL_DIV(d->seg[s].W.rows, TC_ROWS);
    return tasks;
}
static size_t dv_tc_smem(const struct dv_desc *d) { return dv_smem_bytes(d) + (size_t)tc_smem_bytes(d->K); }

// The tensor-core form where it pays: fast mode, 4-bit, enough rows to fill the GPU with 16-row
// tasks. The K split (a block a task) where K allows it, and only where the tasks are fewer than
// the warps the whole-K form keeps resident: past that every warp has a task anyway and the split
// only adds the partial sums' round trip through shared memory.
static int dv_tc_launch(const struct dv_desc *d, const struct dec_launch *l) {
    const long tasks = dv_tc_tasks(d);
    const size_t smem = dv_tc_smem(d);
    const long resident = (long)DV_TC_MIN_BLOCKS * DV_WARPS * sm_count();
    constexpr auto split = dv_tc_split_kernel<DV_WARPS, DV_TC_SPLIT_MIN_BLOCKS>;
    if (tc_split_k(d->K) && tasks < resident)
        return launch_k(split, dim3(grid_for_tasks<split>(tasks * DV_WARPS, DV_THREADS, smem)), dim3(DV_THREADS), smem,
                        l, *d);
    return launch_k(dv_tc_kernel, dim3(grid_for_tasks<dv_tc_kernel>(tasks, DV_THREADS, smem)), dim3(DV_THREADS), smem,
                    l, *d);
}

// o_proj and out_proj (2,048 rows, K = 4,096: 128 tasks of 16 rows) on the tensor cores, a block of 8 warps a
// task, each warp's two super-steps loaded at once (fast mode).
// 80 registers, three blocks an SM: the tasks in one wave.
enum { DV_TC8_WARPS = 8, DV_TC8_MIN_BLOCKS = 3, DV_TC8_MAX_TASKS = 132 * DV_TC8_MIN_BLOCKS };
static int dv_tc8_launch(const struct dv_desc *d, const struct dec_launch *l) {
    const size_t smem = dv_tc_smem(d);
    constexpr auto kern = dv_tc_split_kernel<DV_TC8_WARPS, DV_TC8_MIN_BLOCKS>;
    return launch_k(kern, dim3(grid_for_tasks<kern>(dv_tc_tasks(d) * DV_TC8_WARPS, DV_TC8_WARPS * WARP_SIZE, smem)),
                    dim3(DV_TC8_WARPS * WARP_SIZE), smem, l, *d);
}

template <int BITS>
static int dv_pick(const struct dv_desc *d, const struct dec_launch *l) {
    if (BITS == 4 && !l->exact) {
        long rows = 0;
        for (int s = 0; s < d->n_seg; s++) rows += d->seg[s].W.rows;
        if (rows >= DV_TC_MIN_ROWS) return dv_tc_launch(d, l);
        if (d->in_mode == DV_IN_PLAIN && !d->x_out && !d->best && d->K % (TC_SUPER * DV_TC8_WARPS) == 0 &&
            dv_tc_tasks(d) <= DV_TC8_MAX_TASKS)
            return dv_tc8_launch(d, l);
    }
    // Two rows per pass keep x reads shared; one row (and all four of its chunks a lane in flight
    // at once) where one-row tasks still fit on the GPU in one wave.
    if (dv_tasks(d, 1) > DV_ONE_WAVE) return dv_launch<BITS, 2>(d, dv_tasks(d, 2), l);
    return dv_launch<BITS, 1>(d, dv_tasks(d, 1), l);
}

extern "C" int k_dv(const struct dv_desc *d, const struct dec_launch *l) {
    if (d->n_seg < 1 || d->n_seg > DV_MAXSEG || d->K < 64 || d->K % 64 || d->K > DV_MAXK)
        return (int)cudaErrorInvalidValue;
    const int bits = d->seg[0].W.bits;
    for (int s = 0; s < d->n_seg; s++) {
        const struct dqt *W = &d->seg[s].W;
        if ((W->bits != 4 && W->bits != 8) || W->bits != bits || W->cols != d->K || W->rows < 1)
            return (int)cudaErrorInvalidValue;
        if (d->seg[s].mode == DV_OUT_CONV &&
            (!d->conv_w || !d->conv_state || d->KW < 2 || d->KW > DV_MAXKW || W->rows > d->C))
            return (int)cudaErrorInvalidValue;
        if (d->seg[s].mode == DV_OUT_ARGMAX && !d->best) return (int)cudaErrorInvalidValue;
    }
    if (d->in_mode != DV_IN_PLAIN && d->in_mode != DV_IN_RMS) return (int)cudaErrorInvalidValue;
    return bits == 4 ? dv_pick<4>(d, l) : dv_pick<8>(d, l);
}

// ---- embedding -----------------------------------------------------------------------------------

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

// ---- MoE -----------------------------------------------------------------------------------------

// Stage v [n] into shared memory with the sums of 16 (n a multiple of 16).
static __device__ void stage_plain(const float *v, int n, float *xs, float *xs16) {
    copy_to_smem<true>(xs, v, n);
    __syncthreads();
    sums16(xs, xs16, n);
    __syncthreads();
}

// Prefetch into L2, by all threads of the grid, the down matrices (codes, scales, biases) of the
// k routed experts ids[] and the shared expert: k_dv_moe_down then reads them from L2 instead of
// waiting a DRAM round trip per row.
static __device__ void prefetch_down(const struct dv_moe &m, const int *ids) {
    const size_t wb = (size_t)m.H * m.I * m.down.bits / 8, sb = (size_t)m.H * (m.I / QGROUP) * 2;
    const size_t lines_w = CEIL_DIV(wb, 128), lines_s = CEIL_DIV(sb, 128), per_e = lines_w + 2 * lines_s;
    const size_t n = (m.k + 1) * per_e, nt = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += nt) {
        const int e = (int)(i / per_e);
        size_t r = i % per_e;
        const bool shared = e == m.k;
        const struct dqt &D = shared ? m.sdown : m.down;
        const size_t mat = shared ? 0 : (size_t)ids[e];
        const char *p;
        if (r < lines_w) p = (const char *)D.w + mat * wb + r * 128;
        else if ((r -= lines_w) < lines_s) p = (const char *)D.scales + mat * sb + r * 128;
        else p = (const char *)D.biases + mat * sb + (r - lines_s) * 128;
        prefetch_l2(p);
    }
}

// Routing in every block by warp 0 (route_warp; route_block past RW_MAXE experts) while the other
// warps stage u, then tasks of one (gate, up) row pair of one expert e < k + 1 (e == k: the shared
// expert): act[e, n] = silu(gate_e[n] u) * (up_e[n] u). Block 0 writes ids[0..k) and w[0..k],
// w[k] = sigmoid(shared gate logit), for k_dv_moe_down; every block prefetches its share of the
// down matrices it will read. The shared expert's rows are prefetched before the wait.
static __global__ void __launch_bounds__(DV_THREADS, DV_MIN_BLOCKS) dv_gateup_kernel(const struct dv_moe m) {
    extern __shared__ __align__(16) float mg_smem[];
    float *xs = mg_smem, *xs16 = xs + m.H, *p = xs16 + m.H / 16;
    __shared__ int ids[WARP_SIZE];
    __shared__ float wts[WARP_SIZE];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const lanes L = lanes_of<4>(m.H);
    const int tasks_e = CEIL_DIV(m.I, L.rpp), total = (m.k + 1) * tasks_e;
    const int gw = blockIdx.x * DV_WARPS + warp, stride = gridDim.x * DV_WARPS;
    const size_t rb = (size_t)m.H * 4 / 8;   // bytes of codes a row
    for (int t = gw; t < total; t += stride) {
        if (t < m.k * tasks_e) continue;
        const int n0 = (t % tasks_e) * L.rpp, nr = min(L.rpp, m.I - n0);
        prefetch_range((const char *)m.sgate.w + n0 * rb, nr * rb, lane);
        prefetch_range((const char *)m.sup.w + n0 * rb, nr * rb, lane);
    }
    pdl_wait();
    pdl_trigger();
    if (m.E <= RW_MAXE) {
        if (warp == 0) route_warp(m.logits, m.E, m.k, ids, wts);
        else copy_to_smem<true>(xs, m.u, m.H, threadIdx.x - WARP_SIZE, blockDim.x - WARP_SIZE);
        __syncthreads();
    } else {
        route_block(m.logits, m.E, m.k, p, ids, wts);
        copy_to_smem<true>(xs, m.u, m.H);
        __syncthreads();
    }
    sums16(xs, xs16, m.H);
    if (blockIdx.x == 0 && threadIdx.x <= m.k) {
        m.ids[threadIdx.x] = threadIdx.x < m.k ? ids[threadIdx.x] : -1;
        m.w[threadIdx.x] = threadIdx.x < m.k ? wts[threadIdx.x] : sigmoid_f(m.shared_logit[0]);
    }
    prefetch_down(m, ids);
    __syncthreads();
    for (int t = gw; t < total; t += stride) {
        const int e = t / tasks_e, n = (t % tasks_e) * L.rpp + L.rip;
        const bool shared = e == m.k;
        const size_t row = (shared ? 0 : (size_t)ids[e] * m.I) + (size_t)min(n, m.I - 1);
        const qrow r[2] = {qrow_of(shared ? m.sgate : m.gate, row), qrow_of(shared ? m.sup : m.up, row)};
        float acc[2];
        rows_dot<4, 2>(r, L, xs, xs16, acc);
        if (!L.sub && n < m.I) m.act[(size_t)e * m.I + n] = silu_f(acc[0]) * acc[1];
    }
}

// The whole-K form, out of line: gate/up takes it where K is not a multiple of 512 (test
// geometries), and inlined beside the split form it would cost the split form registers.
static __device__ __noinline__ float tc_rows16_whole(const uint32_t *w, const uint16_t *sc, const uint16_t *bi, int R,
                                                     int K, int n0, const unsigned char *sm) {
    return tc_rows16(w, sc, bi, R, K, n0, sm);
}

// Fast mode: gate and up on the tensor cores. Warp 0 routes (route_warp) while the others stage u as
// bf16 (tcgemv.cuh: the two round trips side by side, not one after the other); then a block takes
// a 16-row tile of one expert: its NW warps alternate gate and up rows, each matrix's NW / 2 warps
// splitting K, and warp 0 writes silu(gate) * up. Block 0 writes ids / w for k_dv_moe_down, and every
// block prefetches its share of the down matrices, as above, once its tiles are done (their own
// weight loads go out first). Two forms:
//   NW = 8 (the model's shape: 256 experts, K a multiple of 4 super-steps): each warp's two
//     super-steps loaded at once, one round trip (with 4 warps a warp walks four: two); 80 registers
//     for three blocks an SM (the 288 tiles in one wave), so no calls: the routing inline (an out-of-line
//     call spills around it) and no whole-K path;
//   NW = 4: any shape (K not a multiple of 2 super-steps: warps 0 and 1 take all of K).
template <int NW, int MINB>
static __global__ void __launch_bounds__(NW *WARP_SIZE, MINB) dv_gateup_tc_kernel(const struct dv_moe m) {
    extern __shared__ __align__(16) unsigned char gt_smem[];
    __shared__ int ids[WARP_SIZE];
    __shared__ float wts[WARP_SIZE], part[NW][WARP_SIZE];
    constexpr int NK = NW / 2;   // warps a matrix
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, mat = warp % 2, kq = warp / 2;
    const int tiles_e = CEIL_DIV(m.I, TC_ROWS), total = (m.k + 1) * tiles_e;
    const bool split = m.tc_split && m.H % (NK * TC_SUPER) == 0;
    const int nS = tc_nsuper(m.H), S0 = kq * nS / NK, S1 = (kq + 1) * nS / NK;
    pdl_wait();
    pdl_trigger();
    if (warp == 0) {
        if (NW == 8) route_warp_of<true>(m.logits, m.E, m.k, ids, wts);   // (E == RW_MAXE: the host checks)
        else route_warp(m.logits, m.E, m.k, ids, wts);
    }
    // (the staging's closing barrier publishes ids and wts too)
    tc_stage_x(m.u, m.H, gt_smem, (int)threadIdx.x - WARP_SIZE, (int)blockDim.x - WARP_SIZE);
    if (blockIdx.x == 0 && threadIdx.x <= m.k) {
        m.ids[threadIdx.x] = threadIdx.x < m.k ? ids[threadIdx.x] : -1;
        m.w[threadIdx.x] = threadIdx.x < m.k ? wts[threadIdx.x] : sigmoid_f(m.shared_logit[0]);
    }
    const size_t wpr = (size_t)m.H / 8, gpr = (size_t)m.H / QGROUP;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const int e = t / tiles_e, n0 = (t % tiles_e) * TC_ROWS;
        const bool shared = e == m.k;
        const struct dqt &W = mat ? (shared ? m.sup : m.up) : (shared ? m.sgate : m.gate);
        const size_t base = shared ? 0 : (size_t)ids[e] * m.I;
        float v = 0;
        if (NW == 8 || split)   // (NW == 8: split, the host checks)
            v = tc_rows16<false>(W.w + base * wpr, W.scales + base * gpr, W.biases + base * gpr, m.I, m.H, n0, gt_smem, S0, S1);
        else if (kq == 0)
            v = tc_rows16_whole(W.w + base * wpr, W.scales + base * gpr, W.biases + base * gpr, m.I, m.H, n0, gt_smem);
        part[warp][lane] = v;
        __syncthreads();
        const int row = n0 + tc_lane_row(lane);
        if (warp == 0 && !(lane & 1) && row < m.I) {
            float g = 0, u = 0;
#pragma unroll
            for (int q = 0; q < NK; q++) g += part[2 * q][lane], u += part[2 * q + 1][lane];
            m.act[(size_t)e * m.I + row] = silu_f(g) * u;
        }
        __syncthreads();   // part is read before the next tile writes it
    }
    prefetch_down(m, ids);   // after the tiles: their weight loads go out first
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
    const int n1 = blockIdx.x * DV_WARPS + warp;
    float xn = lane == 0 && n1 < m.H ? m.x[n1] : 0.0f;   // the first row's residual, with the inputs
    stage_plain(m.act, nx, xs, xs16);
    const int cpr = m.I / 32, items = (m.k + 1) * cpr;
    for (int n = n1; n < m.H; n += gridDim.x * DV_WARPS) {
        if (n != n1 && lane == 0) xn = m.x[n];
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
        if (lane == 0) m.x[n] = xn + acc;
    }
}

// Fast mode, K = I a multiple of 256 (the model's 512): x[n] += sum_e w_e (down_e[n] bf16(act_e)) on the
// tensor cores. A block takes 16 output rows and has a warp an expert (k + 1 <= DN_TC_MAXW): the block
// stages each expert's act as bf16 (tcgemv.cuh's layout, an area an expert), warp e multiplies expert
// e's 16 rows by it (its super-steps loaded at once), and warp 0 adds the experts' sums, weighted, into
// the residual in the experts' order. (k_dv_moe_down's CUDA-core form walked each row on one warp:
// ~3.5 instructions a code against ~1.3 here.)
enum { DN_TC_MAXW = 16 };
static __global__ void __launch_bounds__(DN_TC_MAXW *WARP_SIZE, 1) dv_down_tc_kernel(const struct dv_moe m) {
    extern __shared__ __align__(16) unsigned char dt_smem[];
    __shared__ float part[DN_TC_MAXW][WARP_SIZE], wts[DN_TC_MAXW];
    __shared__ int ids[DN_TC_MAXW];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, E1 = m.k + 1, I = m.I;
    const int sb = tc_smem_bytes(I), n0 = blockIdx.x * TC_ROWS, row = n0 + tc_lane_row(lane);
    const bool stores = warp == 0 && !(lane & 1) && row < m.H;
    pdl_wait();
    pdl_trigger();
    if ((int)threadIdx.x < E1) ids[threadIdx.x] = m.ids[threadIdx.x], wts[threadIdx.x] = m.w[threadIdx.x];
    const float xn = stores ? m.x[row] : 0.0f;   // the residual, with the inputs
    const int upe = 32 * tc_nsuper(I), kc = I / 8;   // units an expert's staging has, and real ones
    for (int gu = threadIdx.x; gu < E1 * upe; gu += blockDim.x) {   // warp-uniform: upe, blockDim.x multiples of 32
        const int e = gu / upe, u = gu % upe;
        float v[8] = {};
        if (u < kc) {
            const float4 a = __ldg((const float4 *)(m.act + (size_t)e * I) + 2 * u);
            const float4 b = __ldg((const float4 *)(m.act + (size_t)e * I) + 2 * u + 1);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        }
        tc_stage_unit(u, v, I, dt_smem + (size_t)e * sb);
    }
    if ((int)threadIdx.x < 4 * E1)   // each area's zero chunk (tc_stage_close's, for all at once)
        ((uint4 *)(dt_smem + (size_t)(threadIdx.x / 4) * sb))[tc_zero_chunk(I) + threadIdx.x % 4] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    const bool shared = warp == m.k;
    const struct dqt &D = shared ? m.sdown : m.down;
    const size_t base = shared ? 0 : (size_t)ids[warp] * m.H, wpr = (size_t)I / 8, gpr = (size_t)I / QGROUP;
    part[warp][lane] = tc_rows16<false>(D.w + base * wpr, D.scales + base * gpr, D.biases + base * gpr, m.H, I, n0,
                                        dt_smem + (size_t)warp * sb);
    __syncthreads();
    if (stores) {
        float acc = 0;
        for (int e = 0; e < E1; e++) acc = fmaf(wts[e], part[e][lane], acc);
        m.x[row] = xn + acc;
    }
}

extern "C" int k_dv_moe_gateup(const struct dv_moe *m, const struct dec_launch *l) {
    if (m->k < 1 || m->k >= WARP_SIZE || m->E > RT_MAXE || m->H % 64 || m->H > DV_MAXK || m->I % 64 ||
        m->gate.bits != 4 || m->up.bits != 4 || m->sgate.bits != 4 || m->sup.bits != 4 || m->sgate.rows != m->I)
        return (int)cudaErrorInvalidValue;
    if (!l->exact && m->E <= RW_MAXE) {
        const size_t tsmem = (size_t)tc_smem_bytes(m->H);
        const long tiles = (long)(m->k + 1) * CEIL_DIV(m->I, TC_ROWS);   // a block a tile
        struct dv_moe mm = *m;
        mm.tc_split = 1;
        if (m->E != RW_MAXE || !mm.tc_split || m->H % (4 * TC_SUPER))   // a test geometry's shape
            return launch_k(dv_gateup_tc_kernel<4, 4>,
                            dim3(grid_for_tasks<dv_gateup_tc_kernel<4, 4>>(tiles * 4, 4 * WARP_SIZE, tsmem)),
                            dim3(4 * WARP_SIZE), tsmem, l, mm);
        return launch_k(dv_gateup_tc_kernel<8, 3>,
                        dim3(grid_for_tasks<dv_gateup_tc_kernel<8, 3>>(tiles * 8, 8 * WARP_SIZE, tsmem)),
                        dim3(8 * WARP_SIZE), tsmem, l, mm);
    }
    const size_t smem = (size_t)(m->H + m->H / 16 + m->E) * sizeof(float);
    const long tasks = (long)(m->k + 1) * CEIL_DIV(m->I, rows_per_pass(m->H, 4));
    return launch_k(dv_gateup_kernel, dim3(grid_for_tasks<dv_gateup_kernel>(tasks, DV_THREADS, smem)),
                    dim3(DV_THREADS), smem, l, *m);
}

extern "C" int k_dv_moe_down(const struct dv_moe *m, const struct dec_launch *l) {
    if (m->k < 1 || m->k >= WARP_SIZE || m->I % 64 || m->down.bits != 4 || m->sdown.bits != 4 ||
        m->sdown.cols != m->I || (m->k + 1) * (m->I / 32) > DN_ITEMS * WARP_SIZE)
        return (int)cudaErrorInvalidValue;
    if (!l->exact && m->I % TC_SUPER == 0 && m->k + 1 <= DN_TC_MAXW) {
        const size_t smem = (size_t)(m->k + 1) * tc_smem_bytes(m->I);
        static size_t raised;
        if (smem > 48 * 1024 && smem > raised) {   // (the model's 9 experts: 12 KB)
            const cudaError_t e =
                cudaFuncSetAttribute(dv_down_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return (int)e;
            raised = smem;
        }
        return launch_k(dv_down_tc_kernel, dim3(CEIL_DIV(m->H, TC_ROWS)), dim3((m->k + 1) * WARP_SIZE), smem, l,
                        *m);
    }
    const int nx = (m->k + 1) * m->I;
    const size_t smem = (size_t)(nx + nx / 16) * sizeof(float);
    return launch_k(dv_down_kernel, dim3(grid_for_tasks<dv_down_kernel>(m->H, DV_THREADS, smem)),
                    dim3(DV_THREADS), smem, l, *m);
}

// ---- the gated delta rule step -------------------------------------------------------------------

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
    for (int i = 0; i < DP; i++) st[i] = Sh[(size_t)i * Dv];   // this step's own state: no wait needed
    const float A = A_log[h], dtb = dt_bias[h], nw = norm_w[col];   // weights: no wait needed
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
    for (int p = 0; p < GD_PARTS; p++) out += red[p][col];   // every part has the column's output
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
    case 128: return launch_k(dv_gdn_kernel<128>, grid, block, 0, l, y, b, a, A_log, dt_bias, S, z, norm_w, eps, o, Hk, Hv, Dv);
    case 64: return launch_k(dv_gdn_kernel<64>, grid, block, 0, l, y, b, a, A_log, dt_bias, S, z, norm_w, eps, o, Hk, Hv, Dv);
    case 32: return launch_k(dv_gdn_kernel<32>, grid, block, 0, l, y, b, a, A_log, dt_bias, S, z, norm_w, eps, o, Hk, Hv, Dv);
    default: return (int)cudaErrorInvalidValue;
    }
}
