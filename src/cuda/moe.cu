// moe.cu: MoE routing on the device (softmax over all experts, top-k, renormalise: docs/MODEL.md §2.6),
// the dispatch that groups a chunk's (token, expert) pairs by expert for the grouped product,
// and the weighted combine with the shared expert.
//
// Nothing here is read back: the grouped product takes counts/offsets from device memory.
#include "common.cuh"

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

// One warp per token (route_warp, the decode kernels' routing): for its tests against k_route's.
static __global__ void route_warp_kernel(const float *logits, int E, int k, int *ids, float *w) {
    const int t = blockIdx.x;
    route_warp(logits + (size_t)t * E, E, k, ids + (size_t)t * k, w + (size_t)t * k);
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
static __global__ void __launch_bounds__(DSP_THREADS) dispatch_kernel(const int *ids, int n, int *counts, const int *offs,
                                                                      int *slots) {
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
