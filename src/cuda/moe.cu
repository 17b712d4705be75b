// moe.cu: the mixture of experts (docs/MODEL.md §2.6) on the device.
//
// Prefill: routing (softmax over all experts, top-k, renormalise), the dispatch that groups a
// chunk's (token, expert) pairs by expert for the grouped product (qmatmul.cu), and the weighted
// combine with the shared expert. Nothing here is read back: the grouped product takes counts and
// offsets from device memory.
// Decode (one token): two fused kernels. k_dv_moe_gateup routes in every block, then runs gate and up
// of the k routed experts and the shared expert with SwiGLU; k_dv_moe_down the k + 1 down products,
// weighted, added into the residual. Fast mode: both on the tensor cores (tcgemv.cuh); exact mode on
// the CUDA cores (gemv.cuh).
#include "gemv.cuh"
#include "tcgemv.cuh"

enum { DSP_THREADS = 256 };

// One block per token (route_block in common.cuh).
static __global__ void route_kernel(const float *logits, int E, int k, int *ids, float *w) {
    __shared__ float p[RT_MAXE];
    const int t = blockIdx.x;
    route_block(logits + (size_t)t * E, E, k, p, ids + (size_t)t * k, w + (size_t)t * k);
}

extern "C" int k_route(const float *logits, int T, int E, int k, int *ids, float *w, void *stream) {
    if (T <= 0) return 0;
    if (E > RT_MAXE || k > WARP_SIZE || k > E) return (int)cudaErrorInvalidValue;
    route_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(logits, E, k, ids, w);
    return launch_status();
}

// route_warp's twin for route_warp_kernel, whose ids and weights are global: the decode kernels call
// route_warp with shared ones, and one out-of-line function called with both would store through
// generic addresses in all of them.
static __device__ __noinline__ void route_warp_global(const float *x, int E, int k, int *ids, float *w) {
    if (E == RW_MAXE)
        route_warp_of<true>(x, E, k, ids, w);
    else
        route_warp_of<false>(x, E, k, ids, w);
}

// One warp per token (route_warp_of, the decode kernels' routing): for its tests against k_route's.
static __global__ void route_warp_kernel(const float *logits, int E, int k, int *ids, float *w) {
    const int t = blockIdx.x;
    route_warp_global(logits + (size_t)t * E, E, k, ids + (size_t)t * k, w + (size_t)t * k);
}

extern "C" int k_route_warp(const float *logits, int T, int E, int k, int *ids, float *w, void *stream) {
    if (T <= 0) return 0;
    if (E > RW_MAXE || k > WARP_SIZE || k > E) return (int)cudaErrorInvalidValue;
    route_warp_kernel<<<T, WARP_SIZE, 0, (cudaStream_t)stream>>>(logits, E, k, ids, w);
    return launch_status();
}

// One block per expert scans all n = T*k assignments in order. FILL = false: counts[e];
// FILL = true: slots[offs[e] ..] = the assignment indices of expert e, ascending.
template <bool FILL>
static __global__ void __launch_bounds__(DSP_THREADS)
    dispatch_kernel(const int *ids, int n, int *counts, const int *offs, int *slots) {
    __shared__ int wc[DSP_THREADS / WARP_SIZE];
    const int e = blockIdx.x, lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    int cursor = FILL ? offs[e] : 0;
    for (int base = 0; base < n; base += DSP_THREADS) {
        const int i = base + threadIdx.x;
        const bool f = i < n && ids[i] == e;
        const unsigned ballot = __ballot_sync(0xffffffffu, f);
        if (lane == 0) wc[wid] = __popc(ballot);
        __syncthreads();
        int before = 0, total = 0;
        for (int j = 0; j < DSP_THREADS / WARP_SIZE; j++) {
            if (j < wid) before += wc[j];
            total += wc[j];
        }
        if (FILL && f) slots[cursor + before + __popc(ballot & ((1u << lane) - 1))] = i;
        cursor += total;
        __syncthreads();
    }
    if (!FILL && threadIdx.x == 0) counts[e] = cursor;
}

// Exclusive scan of counts (one block, E <= 1024).
static __global__ void scan_kernel(const int *counts, int *offs, int E) {
    __shared__ int s[RT_MAXE];
    for (int e = threadIdx.x; e < E; e += blockDim.x) s[e] = counts[e];
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int e = 0; e < E; e++) {
            const int c = s[e];
            s[e] = acc;
            acc += c;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) offs[e] = s[e];
}

extern "C" int k_moe_dispatch(const int *ids, int T, int E, int k, int *counts, int *offs, int *slots, void *stream) {
    if (T <= 0) return 0;
    if (E > RT_MAXE) return (int)cudaErrorInvalidValue;
    cudaStream_t st = (cudaStream_t)stream;
    dispatch_kernel<false><<<E, DSP_THREADS, 0, st>>>(ids, T * k, counts, nullptr, nullptr);
    scan_kernel<<<1, 256, 0, st>>>(counts, offs, E);
    dispatch_kernel<true><<<E, DSP_THREADS, 0, st>>>(ids, T * k, counts, offs, slots);
    return launch_status();
}

static __global__ void moe_combine_kernel(const float *shared, const float *sg, const float *w, const float *ye,
                                          float *out, int k, int H, int add) {
    const int t = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= H) return;
    float acc = shared[(size_t)t * H + c] * sigmoid_f(sg[t]);
    for (int i = 0; i < k; i++) acc += w[(size_t)t * k + i] * ye[((size_t)t * k + i) * H + c];
    out[(size_t)t * H + c] = add ? out[(size_t)t * H + c] + acc : acc;
}

extern "C" int k_moe_combine(const float *shared, const float *sg, const float *w, const float *ye, float *out, int T,
                             int k, int H, int add, void *stream) {
    if (T <= 0) return 0;
    moe_combine_kernel<<<dim3(CEIL_DIV(H, 256), T), 256, 0, (cudaStream_t)stream>>>(shared, sg, w, ye, out, k, H, add);
    return launch_status();
}

// ---- decode -----------------------------------------------------------------------------------------

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
        if (r < lines_w)
            p = (const char *)D.w + mat * wb + r * 128;
        else if ((r -= lines_w) < lines_s)
            p = (const char *)D.scales + mat * sb + r * 128;
        else
            p = (const char *)D.biases + mat * sb + (r - lines_s) * 128;
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
    const size_t rb = (size_t)m.H * 4 / 8; // bytes of codes a row
    for (int t = gw; t < total; t += stride) {
        if (t < m.k * tasks_e) continue;
        const int n0 = (t % tasks_e) * L.rpp, nr = min(L.rpp, m.I - n0);
        prefetch_range((const char *)m.sgate.w + n0 * rb, nr * rb, lane);
        prefetch_range((const char *)m.sup.w + n0 * rb, nr * rb, lane);
    }
    pdl_wait();
    pdl_trigger();
    if (m.E <= RW_MAXE) {
        if (warp == 0)
            route_warp(m.logits, m.E, m.k, ids, wts);
        else
            copy_to_smem<true>(xs, m.u, m.H, threadIdx.x - WARP_SIZE, blockDim.x - WARP_SIZE);
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
    constexpr int NK = NW / 2; // warps a matrix
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, mat = warp % 2, kq = warp / 2;
    const int tiles_e = CEIL_DIV(m.I, TC_ROWS), total = (m.k + 1) * tiles_e;
    const bool split = m.tc_split && m.H % (NK * TC_SUPER) == 0;
    const int nS = tc_nsuper(m.H), S0 = kq * nS / NK, S1 = (kq + 1) * nS / NK;
    pdl_wait();
    pdl_trigger();
    if (warp == 0) {
        if (NW == 8)
            route_warp_of<true>(m.logits, m.E, m.k, ids, wts); // (E == RW_MAXE: the host checks)
        else
            route_warp(m.logits, m.E, m.k, ids, wts);
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
        if (NW == 8 || split) // (NW == 8: split, the host checks)
            v = tc_rows16<false>(W.w + base * wpr, W.scales + base * gpr, W.biases + base * gpr, m.I, m.H, n0, gt_smem,
                                 S0, S1);
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
        __syncthreads(); // part is read before the next tile writes it
    }
    prefetch_down(m, ids); // after the tiles: their weight loads go out first
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
    float xn = lane == 0 && n1 < m.H ? m.x[n1] : 0.0f; // the first row's residual, with the inputs
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
            const int cg = e * m.I / 32 + c; // the chunk's index in the staged act
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
// MT (k_dvq_moe_down): token blockIdx.y of several, its ids / w / act / x at their offsets.
template <bool MT = false>
static __global__ void __launch_bounds__(DN_TC_MAXW *WARP_SIZE, 1) dv_down_tc_kernel(const struct dv_moe m0) {
    extern __shared__ __align__(16) unsigned char dt_smem[];
    __shared__ float part[DN_TC_MAXW][WARP_SIZE], wts[DN_TC_MAXW];
    __shared__ int ids[DN_TC_MAXW];
    struct dv_moe m = m0;
    if (MT) {
        const size_t t = blockIdx.y;
        m.ids += t * (m.k + 1), m.w += t * (m.k + 1), m.act += t * (m.k + 1) * m.I, m.x += t * m.H;
    }
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, E1 = m.k + 1, I = m.I;
    const int sb = tc_smem_bytes(I), n0 = blockIdx.x * TC_ROWS, row = n0 + tc_lane_row(lane);
    const bool stores = warp == 0 && !(lane & 1) && row < m.H;
    pdl_wait();
    pdl_trigger();
    if ((int)threadIdx.x < E1) ids[threadIdx.x] = m.ids[threadIdx.x], wts[threadIdx.x] = m.w[threadIdx.x];
    const float xn = stores ? m.x[row] : 0.0f;                    // the residual, with the inputs
    const int upe = 32 * tc_nsuper(I), kc = I / 8;                // units an expert's staging has, and real ones
    for (int gu = threadIdx.x; gu < E1 * upe; gu += blockDim.x) { // warp-uniform: upe, blockDim.x multiples of 32
        const int e = gu / upe, u = gu % upe;
        float v[8] = {};
        if (u < kc) {
            const float4 a = __ldg((const float4 *)(m.act + (size_t)e * I) + 2 * u);
            const float4 b = __ldg((const float4 *)(m.act + (size_t)e * I) + 2 * u + 1);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        }
        tc_stage_unit(u, v, I, dt_smem + (size_t)e * sb);
    }
    if ((int)threadIdx.x < 4 * E1) // each area's zero chunk (tc_stage_close's, for all at once)
        ((uint4 *)(dt_smem + (size_t)(threadIdx.x / 4) * sb))[tc_zero_chunk(I) + threadIdx.x % 4] =
            make_uint4(0, 0, 0, 0);
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
        const long tiles = (long)(m->k + 1) * CEIL_DIV(m->I, TC_ROWS); // a block a tile
        struct dv_moe mm = *m;
        mm.tc_split = 1;
        if (m->E != RW_MAXE || !mm.tc_split || m->H % (4 * TC_SUPER)) // a test geometry's shape
            return launch_k(dv_gateup_tc_kernel<4, 4>,
                            dim3(grid_for_tasks<dv_gateup_tc_kernel<4, 4>>(tiles * 4, 4 * WARP_SIZE, tsmem)),
                            dim3(4 * WARP_SIZE), tsmem, l, mm);
        return launch_k(dv_gateup_tc_kernel<8, 3>,
                        dim3(grid_for_tasks<dv_gateup_tc_kernel<8, 3>>(tiles * 8, 8 * WARP_SIZE, tsmem)),
                        dim3(8 * WARP_SIZE), tsmem, l, mm);
    }
    const size_t smem = (size_t)(m->H + m->H / 16 + m->E) * sizeof(float);
    const long tasks = (long)(m->k + 1) * CEIL_DIV(m->I, rows_per_pass(m->H, 4));
    return launch_k(dv_gateup_kernel, dim3(grid_for_tasks<dv_gateup_kernel>(tasks, DV_THREADS, smem)), dim3(DV_THREADS),
                    smem, l, *m);
}

extern "C" int k_dv_moe_down(const struct dv_moe *m, const struct dec_launch *l) {
    if (m->k < 1 || m->k >= WARP_SIZE || m->I % 64 || m->down.bits != 4 || m->sdown.bits != 4 ||
        m->sdown.cols != m->I || (m->k + 1) * (m->I / 32) > DN_ITEMS * WARP_SIZE)
        return (int)cudaErrorInvalidValue;
    if (!l->exact && m->I % TC_SUPER == 0 && m->k + 1 <= DN_TC_MAXW) {
        const size_t smem = (size_t)(m->k + 1) * tc_smem_bytes(m->I);
        static size_t raised;
        if (smem > 48 * 1024 && smem > raised) { // (the model's 9 experts: 12 KB)
            const cudaError_t e =
                cudaFuncSetAttribute(dv_down_tc_kernel<>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return (int)e;
            raised = smem;
        }
        return launch_k(dv_down_tc_kernel<>, dim3(CEIL_DIV(m->H, TC_ROWS)), dim3((m->k + 1) * WARP_SIZE), smem, l, *m);
    }
    const int nx = (m->k + 1) * m->I;
    const size_t smem = (size_t)(nx + nx / 16) * sizeof(float);
    return launch_k(dv_down_kernel, dim3(grid_for_tasks<dv_down_kernel>(m->H, DV_THREADS, smem)), dim3(DV_THREADS),
                    smem, l, *m);
}

// ---- the MoE of several tokens (k_dvq_moe_*) ----------------------------------------------------------

// Gate and up for T tokens: warp t routes token t; the block stages every token's u (tc_stage_xq)
// and lists the distinct experts the tokens chose (in the order of their first choice; the shared
// expert last) with each token's slot in its own list, all threads at once (the first (token,
// choice) pair of each expert by atomicMin, its rank among those by ballots); then a block takes
// 64 rows of one listed expert: warp 2 r + mat computes rows 16 r .. 16 r + 15 of gate (mat 0) or
// up (mat 1) over all of K for every token at once (tc_rows16_xq), and the gate warp writes
// silu(gate) * up for the tokens that chose the expert.
enum {
    DQ_MAXU = DQ_MAXT * 8 + 1,
    GQ_ROWS = 4 * TC_ROWS
}; // distinct experts of DQ_MAXT tokens at k = 8, and the shared one
template <int NQ>
static __global__ void __launch_bounds__(8 * WARP_SIZE, NQ == 1 ? 2 : 1) dvq_gateup_kernel(const struct dq_moe q) {
    extern __shared__ __align__(16) unsigned char gq_smem[];
    __shared__ int ids[DQ_MAXT][WARP_SIZE];
    __shared__ float wts[DQ_MAXT][WARP_SIZE], part[8][NQ][2][WARP_SIZE];
    __shared__ int uexp[DQ_MAXU], n_u, first[RW_MAXE], rank[DQ_MAXT * 8];
    __shared__ unsigned lead[2];
    __shared__ signed char slot[DQ_MAXU][DQ_MAXT];
    const struct dv_moe &m = q.m;
    const int T = q.T, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, mat = warp % 2, sub = warp / 2;
    const int K1 = m.k + 1, np = T * m.k; // (token, choice) pairs: at most 64, warps 0 and 1
    for (int i = threadIdx.x; i < m.E; i += blockDim.x) first[i] = INT_MAX;
    for (int i = threadIdx.x; i < DQ_MAXU * DQ_MAXT; i += blockDim.x) slot[i / DQ_MAXT][i % DQ_MAXT] = -1;
    pdl_wait();
    pdl_trigger();
    if (warp < T) route_warp_of<true>(m.logits + (size_t)warp * m.E, m.E, m.k, ids[warp], wts[warp]); // (E == RW_MAXE)
    tc_stage_xq(
        [&](int t, int u, float(&v)[8]) {
            const float4 *p = (const float4 *)(m.u + (size_t)t * m.H) + 2 * u;
            const float4 a = __ldg(p), b = __ldg(p + 1);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        },
        T, m.H, gq_smem); // (its closing barrier publishes ids, wts, first and slot too)
    const int p = threadIdx.x, pe = p < np ? ids[p / m.k][p % m.k] : 0;
    if (p < np) atomicMin(&first[pe], p);
    __syncthreads();
    const bool leads = p < np && first[pe] == p;
    if (warp < 2) {
        const unsigned b = __ballot_sync(0xffffffffu, leads);
        if (lane == 0) lead[warp] = b;
    }
    __syncthreads();
    const int n_lead = __popc(lead[0]) + __popc(lead[1]);
    if (leads) {
        const int r = (warp ? __popc(lead[0]) : 0) + __popc(lead[warp] & ((1u << lane) - 1));
        rank[p] = r, uexp[r] = pe;
    }
    __syncthreads();
    if (p < np) slot[rank[first[pe]]][p / m.k] = (signed char)(p % m.k);
    if (p < T) slot[n_lead][p] = (signed char)m.k; // the shared expert: every token, slot k
    if (p == 0) uexp[n_lead] = -1, n_u = n_lead + 1;
    if (blockIdx.x == 0 && threadIdx.x < T * K1) {
        const int t = threadIdx.x / K1, j = threadIdx.x % K1;
        m.ids[threadIdx.x] = j < m.k ? ids[t][j] : -1;
        m.w[threadIdx.x] = j < m.k ? wts[t][j] : sigmoid_f(m.shared_logit[t]);
    }
    __syncthreads();
    const int tiles_e = CEIL_DIV(m.I, GQ_ROWS), total = n_u * tiles_e, g = lane / 4, tl = lane % 4;
    const size_t wpr = (size_t)m.H / 8, gpr = (size_t)m.H / QGROUP;
    for (int task = blockIdx.x; task < total; task += gridDim.x) {
        const int ue = task / tiles_e, n0 = (task % tiles_e) * GQ_ROWS + sub * TC_ROWS, e = uexp[ue];
        const bool shared = e < 0;
        const struct dqt &W = mat ? (shared ? m.sup : m.up) : (shared ? m.sgate : m.gate);
        const size_t base = shared ? 0 : (size_t)e * m.I;
        float o[NQ][2];
        tc_rows16_xq<NQ>(W.w + base * wpr, W.scales + base * gpr, W.biases + base * gpr, m.I, m.H, n0, gq_smem, T, o);
#pragma unroll
        for (int j = 0; j < NQ; j++) part[warp][j][0][lane] = o[j][0], part[warp][j][1][lane] = o[j][1];
        __syncthreads();
        if (mat == 0)
#pragma unroll
            for (int j = 0; j < NQ; j++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int t = 4 * j + tl, row = n0 + g + 8 * r;
                    if (t >= T || row >= m.I || slot[ue][t] < 0) continue;
                    m.act[((size_t)t * K1 + slot[ue][t]) * m.I + row] =
                        silu_f(part[warp][j][r][lane]) * part[warp + 1][j][r][lane];
                }
        __syncthreads();
    }
}

extern "C" int k_dvq_moe_gateup(const struct dq_moe *q, const struct dec_launch *l) {
    const struct dv_moe *m = &q->m;
    if (q->T < 1 || q->T > DQ_MAXT || l->exact || m->E != RW_MAXE || m->k != 8 || m->H % (4 * TC_SUPER) ||
        m->H > DV_MAXK || m->I % TC_ROWS || m->gate.bits != 4 || m->up.bits != 4 || m->sgate.bits != 4 ||
        m->sup.bits != 4 || m->sgate.rows != m->I)
        return (int)cudaErrorInvalidValue;
    const size_t smem = (size_t)q->T * tc_area_bytes(m->H);
    const long tasks = (long)(q->T * m->k + 1) * CEIL_DIV(m->I, GQ_ROWS);
#define GQ_LAUNCH(NQ)                                                                                                  \
    do {                                                                                                               \
        static size_t raised;                                                                                          \
        if (smem > 48 * 1024 && smem > raised) {                                                                       \
            const cudaError_t e =                                                                                      \
                cudaFuncSetAttribute(dvq_gateup_kernel<NQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);   \
            if (e != cudaSuccess) return (int)e;                                                                       \
            raised = smem;                                                                                             \
        }                                                                                                              \
        return launch_k(dvq_gateup_kernel<NQ>,                                                                         \
                        dim3(grid_for_tasks<dvq_gateup_kernel<NQ>>(tasks * 8, 8 * WARP_SIZE, smem)),                   \
                        dim3(8 * WARP_SIZE), smem, l, *q);                                                             \
    } while (0)
    if (q->T <= 4) GQ_LAUNCH(1);
    GQ_LAUNCH(2);
#undef GQ_LAUNCH
}

// Down for T tokens: the decode kernel, a row of blocks a token (the experts' down matrices read again
// from L2 by the tokens that share them).
extern "C" int k_dvq_moe_down(const struct dq_moe *q, const struct dec_launch *l) {
    const struct dv_moe *m = &q->m;
    if (q->T < 1 || q->T > DQ_MAXT || l->exact || m->k + 1 > DN_TC_MAXW || m->I % TC_SUPER || m->down.bits != 4 ||
        m->sdown.bits != 4 || m->sdown.cols != m->I)
        return (int)cudaErrorInvalidValue;
    const size_t smem = (size_t)(m->k + 1) * tc_smem_bytes(m->I);
    if (smem > 48 * 1024) return (int)cudaErrorInvalidValue; // (the model's 9 experts: 12 KB)
    return launch_k(dv_down_tc_kernel<true>, dim3(CEIL_DIV(m->H, TC_ROWS), q->T), dim3((m->k + 1) * WARP_SIZE), smem, l,
                    q->m);
}
