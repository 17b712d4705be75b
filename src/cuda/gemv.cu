// gemv.cu: the decode step's products (docs/MODEL.md §2): k_dv, up to 4 matrices of one input in one
// grid, the input staged plain or RMS-normalised, each matrix with its epilogue (store, add into the
// residual, the causal conv + SiLU of the DeltaNet channels, or store + argmax for lm_head); and
// k_tcgemv, the tensor-core building block alone (its test's entry).
//
// Exact mode: every product on the CUDA cores in fp32 (gemv.cuh). Fast mode (the default) runs every
// 4-bit product with enough rows on the tensor cores with the input rounded to bf16 (tcgemv.cuh):
// ~1.3 instructions per code instead of ~3.5 (the DeltaNet and attention input projections, lm_head,
// o_proj / out_proj; the 8-bit router and shared gate stay on the CUDA cores). A kernel's time is the
// chain of its few warps, so the products split K over the warps of a block, each warp's super-steps
// loaded at once: one round trip of loads a task.
// The position is read on the device and no kernel depends on the host, so the whole step is one CUDA
// graph; with programmatic dependent launch (dec_launch.pdl) each kernel starts while its predecessor
// drains, prefetches its own weights into L2, and waits only before reading the predecessor's output.
#include "gemv.cuh"
#include "tcgemv.cuh"

// RMS staging (xs = x * rsqrt(mean(x^2) + eps) * w, k_rmsnorm, docs/MODEL.md §2.2) with x and the
// norm weights loaded in one round trip: a thread's float4s of both in flight at once, held in
// registers through the block sum. So K <= 4 STAGE_RMS_F4 per thread (every model shape);
// stage_input keeps the two-trip form for larger K.
enum { STAGE_RMS_F4 = 4 };
static __device__ void stage_rms_one_trip(const struct dv_desc &d, const float *x, float *xs, float *sh) {
    const float4 *x4 = (const float4 *)x, *w4 = (const float4 *)d.norm_w;
    const int n4 = d.K / 4;
    float4 xv[STAGE_RMS_F4], wv[STAGE_RMS_F4];
    float ss = 0; // (any order of the units)
#pragma unroll
    for (int j = 0; j < STAGE_RMS_F4; j++) {
        const int i = j * blockDim.x + threadIdx.x;
        if (i < n4) xv[j] = __ldg(x4 + i), wv[j] = __ldg(w4 + i);
    }
#pragma unroll
    for (int j = 0; j < STAGE_RMS_F4; j++)
        if (j * blockDim.x + threadIdx.x < n4)
            ss += xv[j].x * xv[j].x + xv[j].y * xv[j].y + xv[j].z * xv[j].z + xv[j].w * xv[j].w;
    const float r = 1.0f / sqrtf(block_sum(ss, sh) / (float)d.K + d.eps);
    float4 *xo = (float4 *)xs;
#pragma unroll
    for (int j = 0; j < STAGE_RMS_F4; j++) {
        const int i = j * blockDim.x + threadIdx.x;
        if (i < n4)
            xo[swz(i)] =
                make_float4(xv[j].x * r * wv[j].x, xv[j].y * r * wv[j].y, xv[j].z * r * wv[j].z, xv[j].w * r * wv[j].w);
    }
}

// Stage the input vector x (d's transform) into shared memory: xs [K] fp32 with the input transform
// applied, xs16 [K / 16] the sums of 16; x_out (block 0, when set) gets the transformed input.
static __device__ void stage_input_of(const struct dv_desc &d, const float *x, float *x_out, float *xs, float *xs16) {
    __shared__ float sh[32];
    const int K = d.K;
    if (d.in_mode == DV_IN_RMS && K <= 4 * STAGE_RMS_F4 * (int)blockDim.x) { // every model shape
        stage_rms_one_trip(d, x, xs, sh);
    } else {
        copy_to_smem<true>(xs, x, K);
        __syncthreads();
        if (d.in_mode == DV_IN_RMS) { // the two-trip form: x staged, then scaled by w from global
            float ss = 0;
            for (int i = threadIdx.x; i < K; i += blockDim.x) ss += xs[i] * xs[i]; // (any order of the units)
            ss = block_sum(ss, sh);
            smem_scale(xs, d.norm_w, 1.0f / sqrtf(ss / (float)K + d.eps), K);
        }
    }
    __syncthreads();
    sums16(xs, xs16, K);
    if (x_out && blockIdx.x == 0)
        for (int u = threadIdx.x; u < K / 4; u += blockDim.x) ((float4 *)x_out)[u] = ((const float4 *)xs)[swz(u)];
    __syncthreads();
}
static __device__ __forceinline__ void stage_input(const struct dv_desc &d, float *xs, float *xs16) {
    stage_input_of(d, d.x, d.x_out, xs, xs16);
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
    float r;                             // DV_OUT_ADD: y[row]
    float w[DV_MAXKW], st[DV_MAXKW - 1]; // DV_OUT_CONV: taps, state rows (oldest first)
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
    case DV_OUT_STORE:
        s.y[row] = v;
        break;
    case DV_OUT_ADD:
        s.y[row] = (e ? e->r : s.y[row]) + v;
        break;
    case DV_OUT_CONV: { // channel row: y = silu(sum_j w_j xe_j) over xe = (state rows | v); shift
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
static __device__ __forceinline__ int dv_row(int n0, int i, const lanes &L) {
    return n0 + i * L.rpp + L.rip;
}

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
    int first[DV_MAXSEG + 1]; // task prefix over the segments
    __device__ dv_taskmap(const struct dv_desc &d, int per) {
        first[0] = 0;
#pragma unroll
        for (int s = 0; s < DV_MAXSEG; s++)
            first[s + 1] = first[s] + (s < d.n_seg ? CEIL_DIV(d.seg[s].W.rows, per) : 0);
    }
    __device__ int total() const {
        return first[DV_MAXSEG];
    }
    __device__ int seg_of(int t) const { // the segment of task t
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
    const int per = RW * L.rpp; // rows per task
    const dv_taskmap T(d, per);
    if (d.prefetch) { // this warp's weights: they do not depend on the predecessor
        const size_t rb = (size_t)d.K * BITS / 8;
        for (int t = gw; t < T.total(); t += stride) {
            const int s = T.seg_of(t), n0 = (t - T.first[s]) * per, nr = min(per, d.seg[s].W.rows - n0);
            prefetch_range((const char *)d.seg[s].W.w + (size_t)n0 * rb, (size_t)nr * rb, lane);
        }
    }
    pdl_wait();
    pdl_trigger();
    __shared__ dv_epi epi[DV_THREADS][RW]; // the first task's epilogue inputs, copied with the input
    if (gw < T.total())
        dv_task_epi<RW>(d, d.seg[T.seg_of(gw)], (gw - T.first[T.seg_of(gw)]) * per, L, epi[threadIdx.x]);
    stage_input(d, xs, xs16);
    unsigned long long best = 0;
    for (int t = gw; t < T.total(); t += stride) {
        const int s = T.seg_of(t);
        dv_task<BITS, RW>(d, d.seg[s], (t - T.first[s]) * per, L, xs, xs16, t == gw ? epi[threadIdx.x] : nullptr,
                          &best);
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
static bool tc_split_k(int K) {
    return K % (TC_SUPER * DV_WARPS) == 0;
}

// The RMS-normalised input x * rsqrt(mean(x^2) + eps) * w staged for tc_rows16 in one pass, with no
// fp32 copy in shared memory (two barriers and a pass fewer than stage_input then tc_stage_x_by):
// thread t loads the x and w of units t + j blockDim.x (j < U), the units it then converts. The sum
// of squares adds in another order than stage_input's (r may differ in its last bit).
template <int U> static __device__ __forceinline__ void tc_stage_rms(const struct dv_desc &d, unsigned char *tsm) {
    __shared__ float sh[32];
    const int K = d.K, nc = 32 * tc_nsuper(K), kc = K / 8, nt = blockDim.x;
    const float4 *x4 = (const float4 *)d.x, *w4 = (const float4 *)d.norm_w;
    float4 xv[2 * U], wv[2 * U];
    float ss = 0; // (any order of the units)
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
        if (u >= nc) break; // warp-uniform
        const float4 a = xv[2 * j], b = xv[2 * j + 1], wa = wv[2 * j], wb = wv[2 * j + 1];
        const float v[8] = {a.x * r * wa.x, a.y * r * wa.y, a.z * r * wa.z, a.w * r * wa.w,
                            b.x * r * wb.x, b.y * r * wb.y, b.z * r * wb.z, b.w * r * wb.w};
        tc_stage_unit(u, v, K, tsm);
    }
    tc_stage_close(K, tsm, threadIdx.x);
}
enum { TC_RMS_UNITS = 2 }; // tc_stage_rms's units a thread: K <= 16 blockDim.x (every model shape)

// The prologue both forms share: (with PDL) an L2 prefetch of the tasks' codes a warp will run,
// a quarter each when the block shares a task; the wait; with epi (the split form) the epilogue
// inputs of the block's first task copied by the lanes of warp 0 that store (epi[lane]); the input
// staged in tc's layout (an RMS input in one pass, tc_stage_rms; else staged as k_dv's, then again).
static __device__ __forceinline__ void dv_tc_begin(const struct dv_desc &d, const dv_taskmap &T, int first, int stride,
                                                   bool split, float *xs, float *xs16, unsigned char *tsm,
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
        tc_stage_rms<TC_RMS_UNITS>(d, tsm); // every model shape
        return;
    }
    if (d.in_mode == DV_IN_PLAIN && !d.x_out) { // o_proj / out_proj (dv_tc_split_kernel<8>): bf16 from x at once
        tc_stage_x(d.x, d.K, tsm);
        return;
    }
    stage_input(d, xs, xs16);
    const float4 *x4 = (const float4 *)xs;
    tc_stage_x_by(
        [&](int u, float(&v)[8]) {
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
    __shared__ dv_epi epi[WARP_SIZE]; // the first task's epilogue inputs, copied by warp 0 with the input
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

static size_t dv_smem_bytes(const struct dv_desc *d);
template <int BITS, int RW> static int dv_launch(const struct dv_desc *d, long tasks, const struct dec_launch *l) {
    const size_t smem = dv_smem_bytes(d);
    return launch_k(dv_kernel<BITS, RW>, dim3(grid_for_tasks<dv_kernel<BITS, RW>>(tasks, DV_THREADS, smem)),
                    dim3(DV_THREADS), smem, l, *d);
}

static long dv_tasks(const struct dv_desc *d, int RW) {
    long t = 0;
    for (int s = 0; s < d->n_seg; s++) t += CEIL_DIV(d->seg[s].W.rows, RW * rows_per_pass(d->K, d->seg[s].W.bits));
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
static size_t dv_tc_smem(const struct dv_desc *d) {
    return dv_smem_bytes(d) + (size_t)tc_smem_bytes(d->K);
}

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

template <int BITS> static int dv_pick(const struct dv_desc *d, const struct dec_launch *l) {
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

// ---- k_tcgemv: the building block alone ------------------------------------------------------------

// y [rows] = W x (4-bit, matrix 0), a warp a 16-row task: tcgemv.cuh's tc_rows16 as k_dv's whole-K
// tensor-core form runs it, for tests/gpu/test_tcgemv.c.
enum { TC_WARPS = 4, TC_THREADS = TC_WARPS * WARP_SIZE, TC_MIN_BLOCKS = 5, TC_MAX_SMEM = 48 * 1024 };

// Grid-stride over 16-row tasks, a warp a task.
static __global__ void __launch_bounds__(TC_THREADS, TC_MIN_BLOCKS)
    tc_kernel(const uint32_t *__restrict__ w, const uint16_t *__restrict__ s, const uint16_t *__restrict__ b,
              const float *__restrict__ x, float *__restrict__ y, int R, int K) {
    extern __shared__ __align__(16) unsigned char tc_smem[];
    tc_stage_x(x, K, tc_smem);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int tasks = CEIL_DIV(R, TC_ROWS);
    for (int task = blockIdx.x * TC_WARPS + warp; task < tasks; task += gridDim.x * TC_WARPS) {
        const int n0 = task * TC_ROWS;
        const float v = tc_rows16(w, s, b, R, K, n0, tc_smem);
        const int row = n0 + tc_lane_row(lane);
        if (!(lane & 1) && row < R) y[row] = v;
    }
}

extern "C" int k_tcgemv(const struct dqt *W, const float *x, float *y, void *stream) {
    if (!W || W->bits != 4 || W->cols < 64 || W->cols % 64 || W->rows < 1) return (int)cudaErrorInvalidValue;
    const int K = W->cols, R = W->rows;
    const size_t smem = (size_t)tc_smem_bytes(K);
    if (smem > TC_MAX_SMEM) return (int)cudaErrorInvalidValue;
    static int per_sm, sms; // occupancy asked once (fixed block size; shared memory never limits)
    if (!per_sm) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1) sms = 1;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tc_kernel, TC_THREADS, smem) != cudaSuccess ||
            per_sm < 1)
            per_sm = 1;
    }
    const long tasks = CEIL_DIV(R, TC_ROWS), want = CEIL_DIV(tasks, TC_WARPS), cap = (long)per_sm * sms;
    const int grid = (int)(want < cap ? want : cap);
    tc_kernel<<<grid, TC_THREADS, smem, (cudaStream_t)stream>>>(W->w, W->scales, W->biases, x, y, R, K);
    return launch_status();
}

// ---- k_dvq: the products of several tokens ----------------------------------------------------------

// 4-bit segments: a block takes a 16-row task, its warps split the super-steps (as dv_tc_split_kernel),
// each warp runs every token at once (tc_rows16_xq), warp 0 adds the parts and stores. The inputs of
// the T tokens are staged once a block, RMS-normalised or plain (tc_stage_xq).
template <int NQ> static __global__ void __launch_bounds__(DV_THREADS, 2) dvq_tc_kernel(const struct dq_desc q) {
    extern __shared__ __align__(16) unsigned char dq_smem[];
    __shared__ float part[DV_WARPS][NQ][2][WARP_SIZE];
    __shared__ float rs[DQ_MAXT];
    const struct dv_desc &d = q.d;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, K = d.K, T = q.T;
    const dv_taskmap M(d, TC_ROWS);
    const int nS = tc_nsuper(K), S0 = warp * nS / DV_WARPS, S1 = (warp + 1) * nS / DV_WARPS;
    pdl_wait();
    pdl_trigger();
    if (d.in_mode == DV_IN_RMS)
        for (int t = warp; t < T; t += DV_WARPS) { // each token's 1 / rms, a warp a token (no block barriers)
            const float4 *x4 = (const float4 *)(d.x + (size_t)t * q.ldx);
            float ss = 0;
            for (int i = lane; i < K / 4; i += WARP_SIZE) {
                const float4 v = __ldg(x4 + i);
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            ss = warp_sum(ss);
            if (lane == 0) rs[t] = 1.0f / sqrtf(ss / (float)K + d.eps);
        }
    __syncthreads();
    const bool rms = d.in_mode == DV_IN_RMS;
    tc_stage_xq(
        [&](int t, int u, float(&v)[8]) {
            const float4 *x4 = (const float4 *)(d.x + (size_t)t * q.ldx) + 2 * u;
            const float4 a = __ldg(x4), b = __ldg(x4 + 1);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
            if (rms) {
                const float4 wa = __ldg((const float4 *)d.norm_w + 2 * u),
                             wb = __ldg((const float4 *)d.norm_w + 2 * u + 1);
                const float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = v[j] * rs[t] * w8[j];
            }
            if (d.x_out && blockIdx.x == 0) {
                float4 *o = (float4 *)(d.x_out + (size_t)t * K) + 2 * u;
                o[0] = make_float4(v[0], v[1], v[2], v[3]), o[1] = make_float4(v[4], v[5], v[6], v[7]);
            }
        },
        T, K, dq_smem);
    unsigned long long best[NQ] = {};
    const int g = lane / 4, tl = lane % 4;
    for (int task = blockIdx.x; task < M.total(); task += gridDim.x) {
        const int s = M.seg_of(task), n0 = (task - M.first[s]) * TC_ROWS;
        const struct dqt &W = d.seg[s].W;
        float o[NQ][2];
        tc_rows16_xq<NQ>(W.w, W.scales, W.biases, W.rows, K, n0, dq_smem, T, o, S0, S1);
#pragma unroll
        for (int j = 0; j < NQ; j++) part[warp][j][0][lane] = o[j][0], part[warp][j][1][lane] = o[j][1];
        __syncthreads();
        if (warp == 0)
#pragma unroll
            for (int j = 0; j < NQ; j++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int t = 4 * j + tl, row = n0 + g + 8 * r;
                    if (t >= T || row >= W.rows) continue;
                    const float v =
                        (part[0][j][r][lane] + part[1][j][r][lane]) + (part[2][j][r][lane] + part[3][j][r][lane]);
                    float *y = d.seg[s].y + (size_t)t * W.rows + row;
                    switch (d.seg[s].mode) {
                    case DV_OUT_ADD:
                        *y += v;
                        break;
                    case DV_OUT_ARGMAX: {
                        *y = v;
                        const unsigned long long k = argmax_key(v, row);
                        best[j] = k > best[j] ? k : best[j];
                        break;
                    }
                    default:
                        *y = v;
                    }
                }
        __syncthreads();
    }
    if (d.best && warp == 0)
#pragma unroll
        for (int j = 0; j < NQ; j++) { // the lanes of one token: tl fixed, g = 0 .. 7
            unsigned long long b = best[j];
#pragma unroll
            for (int o = 4; o < WARP_SIZE; o <<= 1) {
                const unsigned long long x = __shfl_xor_sync(0xffffffffu, b, o);
                b = x > b ? x : b;
            }
            if (g == 0 && 4 * j + tl < T && b) atomicMax(d.best + 4 * j + tl, b);
        }
}

// 8-bit segments: every token as k_dv's CUDA-core form computes it (the same staging and sums), its
// rows' codes read again from L1 for the next token.
static __global__ void __launch_bounds__(DV_THREADS, 4) dvq_cc_kernel(const struct dq_desc q) {
    extern __shared__ __align__(16) float dv_smem[];
    const struct dv_desc &d = q.d;
    float *xs = dv_smem, *xs16 = dv_smem + d.K;
    const int warp = threadIdx.x / WARP_SIZE;
    const int gw = blockIdx.x * DV_WARPS + warp, stride = gridDim.x * DV_WARPS;
    const lanes L = lanes_of<8>(d.K);
    const dv_taskmap M(d, L.rpp);
    pdl_wait();
    pdl_trigger();
    for (int t = 0; t < q.T; t++) {
        __syncthreads(); // the previous token's tasks are done with xs
        stage_input_of(d, d.x + (size_t)t * q.ldx, d.x_out ? d.x_out + (size_t)t * d.K : nullptr, xs, xs16);
        for (int task = gw; task < M.total(); task += stride) {
            const int s = M.seg_of(task), n = (task - M.first[s]) * L.rpp + L.rip, R = d.seg[s].W.rows;
            const qrow r[1] = {qrow_of(d.seg[s].W, (size_t)min(n, R - 1))};
            float acc[1];
            rows_dot<8, 1>(r, L, xs, xs16, acc);
            if (!L.sub && n < R) d.seg[s].y[(size_t)t * R + n] = acc[0]; // DV_OUT_STORE (k_dvq checks)
        }
    }
}

extern "C" int k_dvq(const struct dq_desc *q, const struct dec_launch *l) {
    const struct dv_desc *d = &q->d;
    if (q->T < 1 || q->T > DQ_MAXT || d->n_seg < 1 || d->n_seg > DV_MAXSEG || d->K % TC_SUPER || d->K > DV_MAXK ||
        l->exact || q->ldx < d->K || q->ldx % 4)
        return (int)cudaErrorInvalidValue;
    const int bits = d->seg[0].W.bits;
    for (int s = 0; s < d->n_seg; s++) {
        const struct dqt *W = &d->seg[s].W;
        if (W->bits != bits || W->cols != d->K || W->rows < 1 || d->seg[s].mode == DV_OUT_CONV ||
            (d->seg[s].mode == DV_OUT_ARGMAX && (bits != 4 || !d->best)))
            return (int)cudaErrorInvalidValue;
    }
    if (bits == 8) {
        for (int s = 0; s < d->n_seg; s++)
            if (d->seg[s].mode != DV_OUT_STORE) return (int)cudaErrorInvalidValue;
        const size_t smem = dv_smem_bytes(d);
        return launch_k(dvq_cc_kernel, dim3(grid_for_tasks<dvq_cc_kernel>(dv_tasks(d, 1), DV_THREADS, smem)),
                        dim3(DV_THREADS), smem, l, *q);
    }
    if (bits != 4) return (int)cudaErrorInvalidValue;
    const size_t smem = (size_t)q->T * tc_area_bytes(d->K);
    const long tasks = dv_tc_tasks(d);
#define DQ_LAUNCH(NQ)                                                                                                  \
    do {                                                                                                               \
        static size_t raised;                                                                                          \
        if (smem > 48 * 1024 && smem > raised) {                                                                       \
            const cudaError_t e =                                                                                      \
                cudaFuncSetAttribute(dvq_tc_kernel<NQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);       \
            if (e != cudaSuccess) return (int)e;                                                                       \
            raised = smem;                                                                                             \
        }                                                                                                              \
        return launch_k(dvq_tc_kernel<NQ>,                                                                             \
                        dim3(grid_for_tasks<dvq_tc_kernel<NQ>>(tasks * DV_WARPS, DV_THREADS, smem)), dim3(DV_THREADS), \
                        smem, l, *q);                                                                                  \
    } while (0)
    if (q->T <= 4) DQ_LAUNCH(1);
    DQ_LAUNCH(2);
#undef DQ_LAUNCH
}
