// pick.cu: the choice of the next token from one row of logits, on the device, with only the answer
// coming back to the host (a few hundred bytes, not the 1 MB row): the greedy token, the most
// likely token that a constraint's mask allows, and the log-probabilities of the chosen token and
// of the most likely ones (docs/API.md: logprobs are those of the model's own distribution,
// softmax of the raw logits).
//
// The row is cut into PK_BLOCKS slices, one block each (float4 loads, every warp on consecutive
// floats): per thread the largest key overall, the largest allowed key, an online log-sum-exp and,
// when log-probabilities are wanted, its PK_MAXTOP best keys (a sorted list in registers); the
// block merges its lists (a warp's 32, then its warps') and writes its partial to the workspace. The
// last block to finish (a ticket) merges the partials in block order, so the result does not depend
// on which block finished when. Keys order by value, then by the lower id (as the host's argmax and
// top-k do).
#include "common.cuh"
#include "pick.h"

enum { PK_THREADS = 256, PK_WARPS = PK_THREADS / WARP_SIZE, PK_BLOCKS = 128 };
static_assert(PK_MAXTOP <= WARP_SIZE, "the final merge writes one result a lane");

// Orders floats as unsigned integers (negative values reversed), then the lower id first.
static __device__ __forceinline__ unsigned long long pick_key(float v, int id) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return ((unsigned long long)u << 32) | (0xFFFFFFFFu - (uint32_t)id);
}
static __device__ __forceinline__ int key_id(unsigned long long k) {
    return (int)(0xFFFFFFFFu - (uint32_t)k);
}

static __device__ __forceinline__ unsigned long long warp_max_key(unsigned long long k) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long x = __shfl_xor_sync(0xffffffffu, k, o);
        k = x > k ? x : k;
    }
    return k;
}

// (m, s) pairs of an online log-sum-exp: s = sum exp(x - m).
static __device__ __forceinline__ void lse_add(float &m, float &s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f; // m = -inf the first time: s = 0 * 0 + 1
        m = x;
    } else {
        s += expf(x - m);
    }
}
static __device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2, s = s2;
        return;
    }
    const float M = fmaxf(m, m2);
    s = s * expf(m - M) + s2 * expf(m2 - M);
    m = M;
}

// Merges one sorted (descending) list of PK_MAXTOP keys per lane into the warp's n best, returned in
// lane order (lane j holds the j-th best; 0 past n). list is consumed.
static __device__ __forceinline__ unsigned long long warp_merge(unsigned long long (&list)[PK_MAXTOP], int n) {
    const int lane = threadIdx.x % WARP_SIZE;
    unsigned long long mine = 0;
    for (int j = 0; j < n; j++) {
        const unsigned long long best = warp_max_key(list[0]);
        if (lane == j) mine = best;
        if (best && list[0] == best) { // keys are unique (the id is in them): one lane pops
#pragma unroll
            for (int i = 0; i + 1 < PK_MAXTOP; i++) list[i] = list[i + 1];
            list[PK_MAXTOP - 1] = 0;
        }
    }
    return mine;
}

// One block's (or the whole row's) result.
struct pick_part {
    unsigned long long best, best_ok, top[PK_MAXTOP];
    float m, s;
};

// The keys of a block's PK_WARPS lists (one per warp, in lane order in wtop) merged by warp 0 into
// the block's n best, returned by warp 0 in lane order. sh: PK_WARPS x PK_MAXTOP keys.
static __device__ __forceinline__ unsigned long long block_merge(unsigned long long wtop, int n,
                                                                 unsigned long long (*sh)[PK_MAXTOP]) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane < PK_MAXTOP) sh[warp][lane] = lane < n ? wtop : 0;
    __syncthreads();
    unsigned long long list[PK_MAXTOP], r = 0;
    if (warp == 0) {
#pragma unroll
        for (int i = 0; i < PK_MAXTOP; i++) list[i] = lane < PK_WARPS ? sh[lane][i] : 0;
        r = warp_merge(list, n);
    }
    return r;
}

static __device__ __forceinline__ void lse_warp(float &m, float &s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

static __global__ void __launch_bounds__(PK_THREADS)
    pick_kernel(const float *__restrict__ x, int V, const uint32_t *__restrict__ allow, int n_top, int want_lp,
                struct pick_part *part, unsigned int *ticket, struct k_pick *out) {
    __shared__ unsigned long long sk[2][PK_WARPS], stop[PK_WARPS][PK_MAXTOP];
    __shared__ float sm[PK_WARPS], ss[PK_WARPS];
    __shared__ bool last;
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    unsigned long long best = 0, best_ok = 0, list[PK_MAXTOP];
#pragma unroll
    for (int i = 0; i < PK_MAXTOP; i++) list[i] = 0;
    float m = -INFINITY, s = 0.0f;
    auto take = [&](float v, int i, bool ok) {
        const unsigned long long k = pick_key(v, i);
        best = k > best ? k : best;
        if (ok) best_ok = k > best_ok ? k : best_ok;
        if (want_lp) lse_add(m, s, v);
        if (n_top && k > list[PK_MAXTOP - 1]) { // insert: the smallest falls off the end
            unsigned long long c = k;
#pragma unroll
            for (int j = 0; j < PK_MAXTOP; j++) {
                const unsigned long long hi = list[j] > c ? list[j] : c, lo = list[j] > c ? c : list[j];
                list[j] = hi, c = lo;
            }
        }
    };
    // float4 loads from the first 16-byte boundary (head floats before it, the tail after the last
    // whole float4: block 0 takes both one by one)
    const int head = min(V, (int)((16 - (uintptr_t)x % 16) % 16 / 4)), V4 = (V - head) / 4;
    const int per = CEIL_DIV(V4, (int)gridDim.x), b0 = blockIdx.x * per, b1 = min(V4, b0 + per);
    auto ok = [&](int i) { return allow && (__ldg(allow + (i >> 5)) >> (i & 31) & 1u); };
    for (int q = b0 + tid; q < b1; q += PK_THREADS) {
        const float4 v = __ldg((const float4 *)(x + head) + q);
        const int i = head + 4 * q;
        take(v.x, i, ok(i)), take(v.y, i + 1, ok(i + 1)), take(v.z, i + 2, ok(i + 2)), take(v.w, i + 3, ok(i + 3));
    }
    if (blockIdx.x == 0) {
        for (int i = tid; i < head; i += PK_THREADS) take(x[i], i, ok(i));
        for (int i = head + 4 * V4 + tid; i < V; i += PK_THREADS) take(x[i], i, ok(i));
    }
    best = warp_max_key(best), best_ok = warp_max_key(best_ok);
    lse_warp(m, s);
    unsigned long long top = n_top ? warp_merge(list, n_top) : 0;
    if (lane == 0) sk[0][warp] = best, sk[1][warp] = best_ok, sm[warp] = m, ss[warp] = s;
    top = n_top ? block_merge(top, n_top, stop) : 0; // (its barrier publishes sk, sm, ss too)
    if (!n_top) __syncthreads();
    if (warp == 0) {
        best = warp_max_key(lane < PK_WARPS ? sk[0][lane] : 0);
        best_ok = warp_max_key(lane < PK_WARPS ? sk[1][lane] : 0);
        m = lane < PK_WARPS ? sm[lane] : -INFINITY, s = lane < PK_WARPS ? ss[lane] : 0.0f;
        lse_warp(m, s);
        struct pick_part *p = part + blockIdx.x;
        if (lane < PK_MAXTOP) p->top[lane] = lane < n_top ? top : 0;
        if (lane == 0) p->best = best, p->best_ok = best_ok, p->m = m, p->s = s;
        __threadfence();
        if (lane == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
        __syncwarp();
    }
    __syncthreads();
    if (!last) return;
    // The last block: every partial, in block order (PK_BLOCKS <= PK_WARPS * WARP_SIZE).
    __threadfence();
    const int nb = gridDim.x;
    const int b = warp * WARP_SIZE + lane; // warp w merges blocks 32 w .. 32 w + 31
    const volatile struct pick_part *vp = part + (b < nb ? b : 0);
    best = b < nb ? vp->best : 0, best_ok = b < nb ? vp->best_ok : 0;
    m = b < nb ? vp->m : -INFINITY, s = b < nb ? vp->s : 0.0f;
#pragma unroll
    for (int i = 0; i < PK_MAXTOP; i++) list[i] = b < nb && n_top ? vp->top[i] : 0;
    best = warp_max_key(best), best_ok = warp_max_key(best_ok);
    lse_warp(m, s);
    top = n_top ? warp_merge(list, n_top) : 0;
    if (lane == 0) sk[0][warp] = best, sk[1][warp] = best_ok, sm[warp] = m, ss[warp] = s;
    top = n_top ? block_merge(top, n_top, stop) : 0;
    if (!n_top) __syncthreads();
    if (warp) return;
    best = warp_max_key(lane < PK_WARPS ? sk[0][lane] : 0);
    best_ok = warp_max_key(lane < PK_WARPS ? sk[1][lane] : 0);
    m = lane < PK_WARPS ? sm[lane] : -INFINITY, s = lane < PK_WARPS ? ss[lane] : 0.0f;
    lse_warp(m, s);
    const float lse = m + logf(s);
    const int greedy = key_id(best), chosen = allow ? (best_ok ? key_id(best_ok) : -1) : greedy;
    if (lane < n_top) {
        out->top_id[lane] = key_id(top);
        out->top_lp[lane] = x[key_id(top)] - lse;
    }
    if (lane == 0) {
        out->greedy = greedy;
        out->chosen = chosen;
        out->n_top = n_top;
        out->greedy_lp = want_lp ? x[greedy] - lse : 0.0f;
        out->chosen_lp = want_lp && chosen >= 0 ? x[chosen] - lse : 0.0f;
        *ticket = 0; // ready for the next call (kernels on one stream run in order)
    }
}

extern "C" size_t k_pick_ws_bytes(void) {
    return sizeof(struct pick_part) * PK_BLOCKS + 16;
}

extern "C" int k_pick(const float *logits, int V, const uint32_t *allow, int n_top, int want_lp, void *ws,
                      struct k_pick *out, void *stream) {
    if (V < 1 || n_top < 0 || n_top > PK_MAXTOP || (n_top && !want_lp) || !ws) return (int)cudaErrorInvalidValue;
    struct pick_part *part = (struct pick_part *)ws;
    unsigned int *ticket = (unsigned int *)(part + PK_BLOCKS);
    const int blocks = V / 4 < PK_BLOCKS * 64 ? CEIL_DIV(V / 4, 64) > 0 ? CEIL_DIV(V / 4, 64) : 1 : PK_BLOCKS;
    pick_kernel<<<blocks, PK_THREADS, 0, (cudaStream_t)stream>>>(logits, V, allow, n_top, want_lp, part, ticket, out);
    return launch_status();
}
