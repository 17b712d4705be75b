// attention.cu: full attention (docs/MODEL.md §2.4): q/k RMSNorm + partial RoPE + KV append, then causal
// GQA softmax attention with the sigmoid output gate.
//
// Two attention kernels, both on the tensor cores:
// - decode (one token, its position read on the device): split over blocks of keys (flash-decoding),
//   each block (split, kv head) an online softmax over its keys for the G = n_heads / n_kv query
//   heads of the kv head; a second kernel merges the splits and applies the gate.
// - prefill (any T): FlashAttention (k_flash_attention below; the kernel in flash.cuh).
#include "mma.cuh"

enum { AT_TILE = 32, AT_MAXD = 256, AT_MAXWARPS = 16, AT_MIN_SPLIT = 64, AT_MAX_SPLITS = 1024, AT_PREP_THREADS = 128 };

// ---- prep: norm + RoPE; k/v into the cache --------------------------------------------------

static __global__ void attn_prep_kernel(const float *qg, const float *k, const float *v, const float *q_norm,
                                        const float *k_norm, float *q, uint16_t *kc, uint16_t *vc, int p0,
                                        const int *d_pos, int cap, int n_heads, int n_kv, int D, int rope_dim,
                                        double theta, float eps) {
    __shared__ float buf[AT_MAXD];
    __shared__ float sh[32];
    const int t = blockIdx.x, h = blockIdx.y, p = (d_pos ? *d_pos : p0) + t; // (written before the step)
    // RoPE's cos / sin of this thread's columns before the wait: they depend on the position only
    constexpr int PER = AT_MAXD / AT_PREP_THREADS;
    const int half = rope_dim / 2;
    float rc[PER], rs[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int d = threadIdx.x + i * AT_PREP_THREADS, m = d < half ? d : d - half;
        rc[i] = rs[i] = 0.0f;
        if (d < rope_dim) {
            const float inv_freq = (float)(1.0 / pow(theta, (double)(2 * m) / rope_dim));
            const float ang = (float)p * inv_freq;
            rc[i] = (float)cos((double)ang), rs[i] = (float)sin((double)ang);
        }
    }
    pdl_wait();
    const bool is_q = h < n_heads;
    const int j = h - n_heads;
    const float *src = is_q ? qg + ((size_t)t * n_heads + h) * 2 * D : k + ((size_t)t * n_kv + j) * D;
    const float *nw = is_q ? q_norm : k_norm;
    float vv[PER]; // the raw v of this thread's columns (kv heads), read with the input
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int d = threadIdx.x + i * AT_PREP_THREADS;
        vv[i] = !is_q && d < D ? v[((size_t)t * n_kv + j) * D + d] : 0.0f;
    }
    float ss = 0;
    for (int d = threadIdx.x; d < D; d += blockDim.x) ss += src[d] * src[d];
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    for (int d = threadIdx.x; d < D; d += blockDim.x) buf[d] = src[d] * r * nw[d];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int d = threadIdx.x + i * AT_PREP_THREADS;
        if (d >= D) break;
        float out = buf[d];
        if (d < rope_dim) {
            const int m = d < half ? d : d - half;
            const float c = rc[i], s = rs[i], a = buf[m], b = buf[m + half];
            out = d < half ? a * c - b * s : a * s + b * c;
        }
        if (is_q)
            q[((size_t)t * n_heads + h) * D + d] = out;
        else {
            const size_t at = ((size_t)j * cap + p) * D + d;
            kc[at] = f2bf16(out);
            vc[at] = f2bf16(vv[i]);
        }
    }
}

extern "C" int k_attn_prep(const float *qg, const float *k, const float *v, const float *q_norm, const float *k_norm,
                           float *q, uint16_t *kc, uint16_t *vc, int T, int p0, int cap, int n_heads, int n_kv, int D,
                           int rope_dim, double theta, float eps, void *stream) {
    if (T <= 0) return 0;
    if (D > AT_MAXD) return (int)cudaErrorInvalidValue;
    dim3 grid(T, n_heads + n_kv);
    attn_prep_kernel<<<grid, AT_PREP_THREADS, 0, (cudaStream_t)stream>>>(
        qg, k, v, q_norm, k_norm, q, kc, vc, p0, nullptr, cap, n_heads, n_kv, D, rope_dim, theta, eps);
    return launch_status();
}

extern "C" int k_dec_attn_prep(const float *qg, const float *k, const float *v, const float *q_norm,
                               const float *k_norm, float *q, uint16_t *kc, uint16_t *vc, const int *d_pos, int T,
                               int cap, int n_heads, int n_kv, int D, int rope_dim, double theta, float eps,
                               const struct dec_launch *l) {
    if (D > AT_MAXD || T < 1) return (int)cudaErrorInvalidValue;
    return launch_k(attn_prep_kernel, dim3(T, n_heads + n_kv), dim3(AT_PREP_THREADS), 0, l, qg, k, v, q_norm, k_norm, q,
                    kc, vc, 0, d_pos, cap, n_heads, n_kv, D, rope_dim, theta, eps);
}

// ---- decode attention: key splits, then their combine --------------------------------------------

// Decode with the position on the device (one CUDA graph serves every step): the grid has ns_max
// splits; the first n of them take split_len keys each, n and split_len from the key count.
static __device__ __forceinline__ void dec_split(int n_keys, int ns_max, int *n, int *split_len) {
    *n = min(ns_max, CEIL_DIV(n_keys, AT_MIN_SPLIT));
    *split_len = CEIL_DIV(CEIL_DIV(n_keys, *n), AT_TILE) * AT_TILE;
}

// Decode combine: one block per head; the split weights e^{m_s - M} once in shared memory, then
// DC_GROUPS groups of threads sum their share of the splits per column d (independent loads), and
// the groups' sums are added in a fixed order.
enum { DC_GROUPS = 4, DC_THREADS = DC_GROUPS * AT_MAXD };
static __global__ void __launch_bounds__(DC_THREADS)
    dec_combine_kernel(const float *part, const float *qg, float *o, int n_heads, int D, int stride, const int *d_pos) {
    __shared__ float ws[AT_MAX_SPLITS];
    __shared__ float sh[32];
    __shared__ float acc_g[DC_GROUPS][AT_MAXD];
    pdl_wait();
    const int tok = blockIdx.y; // token tok of the step's T: its own position, q, partials and output
    part += (size_t)tok * n_heads * stride * (D + 2), qg += (size_t)tok * n_heads * 2 * D,
        o += (size_t)tok * n_heads * D;
    int n_split, len;
    dec_split(d_pos[tok] + 1, stride, &n_split, &len);
    const int h = blockIdx.x, g = threadIdx.x / AT_MAXD, d = threadIdx.x % AT_MAXD;
    // the output gate, read with the first inputs rather than after the sums
    const float gate = g == 0 && d < D ? qg[(size_t)h * 2 * D + D + d] : 0.0f;
    const float *pp = part + (size_t)h * stride * (D + 2);
    float m = -INFINITY;
    for (int s = threadIdx.x; s < n_split; s += blockDim.x) m = fmaxf(m, pp[(size_t)s * (D + 2)]);
    const float M = block_max(m, sh);
    float l = 0;
    for (int s = threadIdx.x; s < n_split; s += blockDim.x) {
        const float ms = pp[(size_t)s * (D + 2)];
        const float w = ms == -INFINITY ? 0.0f : expf(ms - M);
        ws[s] = w;
        l += pp[(size_t)s * (D + 2) + 1] * w;
    }
    const float L = block_sum(l, sh); // (its barriers also publish ws)
    if (d < D) {
        float acc = 0;
#pragma unroll 8
        for (int s = g; s < n_split; s += DC_GROUPS) acc += pp[(size_t)s * (D + 2) + 2 + d] * ws[s];
        acc_g[g][d] = acc;
    }
    __syncthreads();
    if (g == 0 && d < D) {
        float acc = 0;
        for (int i = 0; i < DC_GROUPS; i++) acc += acc_g[i][d];
        o[(size_t)h * D + d] = acc / L * sigmoid_f(gate);
    }
}

// ---- decode attention on the tensor cores ---------------------------------------------------------
//
// The prefill kernel's arithmetic (below) for one token: a block (split, kv head) of 4 warps; the
// G <= 16 query heads of the kv head are the rows of one 16-row A tile (rows past G are zeros and
// never stored); the block streams its keys in tiles of 64 through a two-stage cp.async pipeline and
// warp w takes keys 16 w .. 16 w + 15 of every tile with its own online softmax; the four merge at
// the end into the split's partial (m in natural-log units, l, o) for dec_combine_kernel. Q and P go
// to the tensor cores as hi + lo bf16 (fp32-level error, as in prefill). Keys before the current
// position are requested before waiting on the predecessor (earlier steps wrote them).
enum { DT_WARPS = 4, DT_THREADS = DT_WARPS * WARP_SIZE, DT_BN = 64 };
static size_t dec_tc_smem(int D) {
    return (size_t)(2 * 16 + 4 * DT_BN) * D * sizeof(uint16_t);
}

template <int D>
static __global__ void __launch_bounds__(DT_THREADS, 1)
    dec_attn_tc_kernel(const float *q, const uint16_t *kc, const uint16_t *vc, float *part, const int *d_pos, int cap,
                       int n_heads, int n_kv) {
    constexpr int CH = D / 8;
    extern __shared__ __align__(16) uint16_t dt_smem[];
    uint16_t *Qh = dt_smem, *Ql = Qh + 16 * D, *Kb = Ql + 16 * D, *Vb = Kb + 2 * DT_BN * D; // K, V: [2][64][D]
    const int G = n_heads / n_kv, kvh = blockIdx.y, tok = blockIdx.z; // token tok of the step's T, at d_pos[tok]
    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE, g = lane / 4, c4 = lane % 4;
    q += (size_t)tok * n_heads * D, part += (size_t)tok * n_heads * gridDim.x * (D + 2);
    // This kernel runs only once its predecessor (attn_prep) has passed its own wait, so everything
    // before attn_prep (the position copy, earlier steps' K/V) is complete: keys below the step's
    // first position p0 need no wait; p0 .. pos are this step's, written by attn_prep.
    const int pos = d_pos[tok], p0 = d_pos[0];
    int n, split_len;
    dec_split(pos + 1, gridDim.x, &n, &split_len);
    if ((int)blockIdx.x >= n) return;
    split_len = CEIL_DIV(split_len, DT_BN) * DT_BN;
    const int kb = blockIdx.x * split_len, ke = min(kb + split_len, pos + 1);
    const int n_tiles = ke > kb ? CEIL_DIV(ke - kb, DT_BN) : 0;
    const uint16_t *kbase = kc + (size_t)kvh * cap * D, *vbase = vc + (size_t)kvh * cap * D;
    // tile j's keys below `below` (zeros past ke; the row `below` .. ke - 1 is left for later)
    auto load_tile = [&](int j, int below) {
        uint16_t *Kd = Kb + (j & 1) * DT_BN * D, *Vd = Vb + (j & 1) * DT_BN * D;
        for (int i = tid; i < DT_BN * CH; i += DT_THREADS) {
            const int r = i / CH, c = i % CH, key = kb + j * DT_BN + r;
            if (key >= below && key < ke) continue;
            const bool ok = key < ke;
            const size_t at = (size_t)(ok ? key : 0) * D + c * 8;
            cp_async16(Kd + r * D + swz(r, c) * 8, kbase + at, ok ? 16 : 0);
            cp_async16(Vd + r * D + swz(r, c) * 8, vbase + at, ok ? 16 : 0);
        }
        cp_async_commit();
    };
    const int fresh = max(kb, min(ke, p0)); // tile 0's keys from here to ke are this step's
    if (n_tiles) load_tile(0, fresh);
    pdl_wait();
    pdl_trigger();
    const int nf = n_tiles ? min(ke, kb + DT_BN) - fresh : 0;
    for (int i = tid; i < nf * CH; i += DT_THREADS) { // this step's keys in tile 0, written by attn_prep
        const int key = fresh + i / CH, r = key - kb, c = i % CH;
        *(uint4 *)(Kb + r * D + swz(r, c) * 8) = *(const uint4 *)(kbase + (size_t)key * D + c * 8);
        *(uint4 *)(Vb + r * D + swz(r, c) * 8) = *(const uint4 *)(vbase + (size_t)key * D + c * 8);
    }
    for (int i = tid; i < 16 * CH; i += DT_THREADS) { // Q rows -> hi/lo bf16
        const int r = i / CH, c = i % CH;
        float v[8] = {};
        if (r < G) {
            const float4 *src = (const float4 *)(q + ((size_t)kvh * G + r) * D + c * 8);
            const float4 a = src[0], b = src[1];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        }
        uint16_t hi[8], lo[8];
#pragma unroll
        for (int e = 0; e < 8; e++) split_bf16(v[e], &hi[e], &lo[e]);
        const int at = r * D + swz(r, c) * 8;
        *(uint4 *)(Qh + at) =
            make_uint4(pack2(hi[0], hi[1]), pack2(hi[2], hi[3]), pack2(hi[4], hi[5]), pack2(hi[6], hi[7]));
        *(uint4 *)(Ql + at) =
            make_uint4(pack2(lo[0], lo[1]), pack2(lo[2], lo[3]), pack2(lo[4], lo[5]), pack2(lo[6], lo[7]));
    }
    const float sl2 = rsqrtf((float)D) * 1.4426950408889634f; // 1/sqrt(D) * log2(e)
    float acc[D / 8][4] = {};
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0, l_b = 0;
    for (int j = 0; j < n_tiles; j++) {
        if (j + 1 < n_tiles) {
            load_tile(j + 1, ke);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Kt = Kb + (j & 1) * DT_BN * D, *Vt = Vb + (j & 1) * DT_BN * D;
        float s[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t ah[4], al[4], b[4];
            const int qr = lane % 16, qc = ks * 2 + lane / 16;
            ldsm_x4(ah, Qh + qr * D + swz(qr, qc) * 8);
            ldsm_x4(al, Ql + qr * D + swz(qr, qc) * 8);
            const int kr = warp * 16 + lane % 8 + 8 * (lane / 16), kcn = ks * 2 + (lane / 8) % 2;
            ldsm_x4(b, Kt + kr * D + swz(kr, kcn) * 8);
            mma_bf16(s[0], ah, b[0], b[1]);
            mma_bf16(s[0], al, b[0], b[1]);
            mma_bf16(s[1], ah, b[2], b[3]);
            mma_bf16(s[1], al, b[2], b[3]);
        }
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int ni = 0; ni < 2; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kb + j * DT_BN + warp * 16 + ni * 8 + 2 * c4 + (e & 1);
                const float v = key < ke ? s[ni][e] * sl2 : -INFINITY;
                s[ni][e] = v;
                if (e < 2)
                    mx_a = fmaxf(mx_a, v);
                else
                    mx_b = fmaxf(mx_b, v);
            }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
        }
        // a warp's keys can all lie past ke (the split's last tile): nothing changes then
        const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
        const float corr_a = mn_a == -INFINITY ? 1.0f : exp2f(m_a - mn_a);
        const float corr_b = mn_b == -INFINITY ? 1.0f : exp2f(m_b - mn_b);
        m_a = mn_a;
        m_b = mn_b;
        float rs_a = 0, rs_b = 0;
#pragma unroll
        for (int ni = 0; ni < 2; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float mn = e < 2 ? mn_a : mn_b;
                const float p = s[ni][e] == -INFINITY ? 0.0f : exp2f(s[ni][e] - mn);
                s[ni][e] = p;
                if (e < 2)
                    rs_a += p;
                else
                    rs_b += p;
            }
        l_a = l_a * corr_a + rs_a;
        l_b = l_b * corr_b + rs_b;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) {
            acc[dn][0] *= corr_a;
            acc[dn][1] *= corr_a;
            acc[dn][2] *= corr_b;
            acc[dn][3] *= corr_b;
        }
        uint32_t ph[4], pl[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float *sv = &s[r / 2][2 * (r % 2)];
            uint16_t h0, l0, h1, l1;
            split_bf16(sv[0], &h0, &l0);
            split_bf16(sv[1], &h1, &l1);
            ph[r] = pack2(h0, h1);
            pl[r] = pack2(l0, l1);
        }
#pragma unroll
        for (int p = 0; p < D / 16; p++) {
            uint32_t b[4];
            const int vr = warp * 16 + lane % 8 + 8 * ((lane / 8) % 2), vcn = p * 2 + lane / 16;
            ldsm_x4_t(b, Vt + vr * D + swz(vr, vcn) * 8);
            mma_bf16(acc[2 * p], ph, b[0], b[1]);
            mma_bf16(acc[2 * p], pl, b[0], b[1]);
            mma_bf16(acc[2 * p + 1], ph, b[2], b[3]);
            mma_bf16(acc[2 * p + 1], pl, b[2], b[3]);
        }
        __syncthreads(); // every warp is done with stage j & 1 before it is loaded again
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
    }
    // merge the 4 warps: rows r < G of each warp as (m, l, o[D]) in scratch over the K/V stages
    float *scr = (float *)Kb;
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = g + 8 * half;
        if (r >= G) continue;
        float *sp = scr + (size_t)(warp * 16 + r) * (D + 2);
        if (c4 == 0) sp[0] = half ? m_b : m_a, sp[1] = half ? l_b : l_a;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++)
            *(float2 *)(sp + 2 + dn * 8 + 2 * c4) = make_float2(acc[dn][2 * half], acc[dn][2 * half + 1]);
    }
    __syncthreads();
    for (int r = warp; r < G; r += DT_WARPS) {
        float M = -INFINITY, wt[DT_WARPS], L = 0;
#pragma unroll
        for (int w = 0; w < DT_WARPS; w++) M = fmaxf(M, scr[(size_t)(w * 16 + r) * (D + 2)]);
#pragma unroll
        for (int w = 0; w < DT_WARPS; w++) {
            const float *sp = scr + (size_t)(w * 16 + r) * (D + 2);
            wt[w] = sp[0] == -INFINITY ? 0.0f : exp2f(sp[0] - M);
            L += sp[1] * wt[w];
        }
        float *pp = part + ((size_t)(kvh * G + r) * gridDim.x + blockIdx.x) * (D + 2);
        if (lane == 0) pp[0] = M * 0.6931471805599453f, pp[1] = L; // natural-log units, as the split kernels
        for (int d = lane; d < D; d += WARP_SIZE) {
            float o = 0;
#pragma unroll
            for (int w = 0; w < DT_WARPS; w++) o += scr[(size_t)(w * 16 + r) * (D + 2) + 2 + d] * wt[w];
            pp[2 + d] = o;
        }
    }
}

template <int D>
static int dec_tc_launch(const float *q, const uint16_t *kc, const uint16_t *vc, float *part, const int *d_pos, int T,
                         int ns_max, int cap, int n_heads, int n_kv, const struct dec_launch *l) {
    static bool attr;
    if (!attr) {
        const cudaError_t e = cudaFuncSetAttribute(dec_attn_tc_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)dec_tc_smem(D));
        if (e != cudaSuccess) return (int)e;
        attr = true;
    }
    return launch_k(dec_attn_tc_kernel<D>, dim3(ns_max, n_kv, T), dim3(DT_THREADS), dec_tc_smem(D), l, q, kc, vc, part,
                    d_pos, cap, n_heads, n_kv);
}

// Key splits for a decode grid over sequences of up to cap keys: at least AT_MIN_SPLIT keys a split,
// and no more blocks than fit on the GPU at once (each iterates over its keys).
extern "C" int k_dec_attn_splits(int cap, int n_heads, int n_kv, int D, int most) {
    int n = CEIL_DIV(cap, AT_MIN_SPLIT);
    if (n > most) n = most;
    if (n_kv > 0 && n_heads / n_kv <= 16) {
        int dev = 0, sms = 1;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        const int fit = sms / n_kv; // one block an SM
        if (n > fit) n = fit;
    }
    return n < 1 ? 1 : n;
}

extern "C" int k_dec_attention(const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, float *o,
                               float *part, const int *d_pos, int T, int ns_max, int cap, int n_heads, int n_kv, int D,
                               const struct dec_launch *l) {
    const int G = n_heads / n_kv;
    if (G > AT_MAXWARPS || AT_MAXWARPS % G || n_heads % n_kv || ns_max < 1 || ns_max > AT_MAX_SPLITS || T < 1)
        return (int)cudaErrorInvalidValue;
    int rc;
    switch (D) { // (G <= 16 = AT_MAXWARPS: the query heads of a kv head fill one 16-row tile)
    case 256:
        rc = dec_tc_launch<256>(q, kc, vc, part, d_pos, T, ns_max, cap, n_heads, n_kv, l);
        break;
    case 128:
        rc = dec_tc_launch<128>(q, kc, vc, part, d_pos, T, ns_max, cap, n_heads, n_kv, l);
        break;
    case 64:
        rc = dec_tc_launch<64>(q, kc, vc, part, d_pos, T, ns_max, cap, n_heads, n_kv, l);
        break;
    default:
        return (int)cudaErrorInvalidValue;
    }
    if (rc) return rc;
    return launch_k(dec_combine_kernel, dim3(n_heads, T), dim3(DC_THREADS), 0, l, (const float *)part, qg, o, n_heads,
                    D, ns_max, d_pos);
}

// ---- prefill: FlashAttention on the tensor cores (the kernel: flash.cuh) --------------------------

#include "flash.cuh"

template <int D, bool EXACT, typename OT>
static int flash_launch(dim3 grid, cudaStream_t st, const float *q, const float *qg, const uint16_t *kc,
                        const uint16_t *vc, OT *o, int T, int p0, int cap, int n_heads, int n_kv) {
    static bool raised; // the dynamic shared-memory limit, once per kernel
    const size_t smem = flash_smem_bytes(D, EXACT);
    if (!raised) {
        cudaError_t e = cudaFuncSetAttribute(flash_attention_kernel<D, EXACT, OT>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        raised = true;
    }
    flash_attention_kernel<D, EXACT, OT><<<grid, FA_THREADS, smem, st>>>(q, qg, kc, vc, o, T, p0, cap, n_heads, n_kv);
    return launch_status();
}

// The fast mode at D = 256 runs the warp-specialized warpgroup-product kernel (flash_wg.cuh): it needs
// the binary's sm_90a code, which the backend checks at load (k_has_sm90a).
#include "flash_wg.cuh"

// OT: float (o) or uint16_t (its bf16 copy only, fa_store).
template <typename OT>
static int flash_ws_launch(dim3 grid, cudaStream_t st, const float *q, const float *qg, const uint16_t *kc,
                           const uint16_t *vc, OT *o, int T, int p0, int cap, int n_heads, int n_kv) {
    static bool raised; // one per output type
    const size_t smem = flash_wg_smem_bytes();
    if (!raised) {
        cudaError_t e =
            cudaFuncSetAttribute(flash_ws_kernel<OT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        raised = true;
    }
    flash_ws_kernel<OT><<<grid, FW_WS_THREADS, smem, st>>>(q, qg, kc, vc, o, T, p0, cap, n_heads, n_kv);
    return launch_status();
}

// ob (fast mode only; NULL: o in fp32): the kernel writes o's bf16 copy there instead (o unused), o_proj's
// input, bit-identical to o then k_to_bf16 (without a 134 MB read + 67 MB write a 4K chunk and layer).
extern "C" int k_flash_attention(const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, float *o,
                                 uint16_t *ob, int T, int p0, int cap, int n_heads, int n_kv, int D, int exact,
                                 void *stream) {
    if (T <= 0) return 0;
    if (n_kv <= 0 || n_heads % n_kv || FA_BM % (n_heads / n_kv) || p0 + T > cap) return (int)cudaErrorInvalidValue;
    if (ob && (exact || (uintptr_t)ob % 4)) return (int)cudaErrorInvalidValue; // pairs stored as 4 bytes
    dim3 grid(CEIL_DIV(T, FA_BM / (n_heads / n_kv)), n_kv);
    cudaStream_t st = (cudaStream_t)stream;
    if (exact) {
        switch (D) {
        case 256:
            return flash_launch<256, true>(grid, st, q, qg, kc, vc, o, T, p0, cap, n_heads, n_kv);
        case 128:
            return flash_launch<128, true>(grid, st, q, qg, kc, vc, o, T, p0, cap, n_heads, n_kv);
        case 64:
            return flash_launch<64, true>(grid, st, q, qg, kc, vc, o, T, p0, cap, n_heads, n_kv);
        default:
            return (int)cudaErrorInvalidValue;
        }
    }
    // fast: this model's head dimension on warpgroup products, the test geometries' on mma.sync
#define FA_FAST(d)                                                                                                     \
    (ob ? flash_launch<d, false>(grid, st, q, qg, kc, vc, ob, T, p0, cap, n_heads, n_kv)                               \
        : flash_launch<d, false>(grid, st, q, qg, kc, vc, o, T, p0, cap, n_heads, n_kv))
    switch (D) {
    case FW_D:
        if (!k_has_sm90a()) return (int)cudaErrorInvalidDeviceFunction;
        return ob ? flash_ws_launch(grid, st, q, qg, kc, vc, ob, T, p0, cap, n_heads, n_kv)
                  : flash_ws_launch(grid, st, q, qg, kc, vc, o, T, p0, cap, n_heads, n_kv);
    case 128:
        return FA_FAST(128);
    case 64:
        return FA_FAST(64);
    default:
        return (int)cudaErrorInvalidValue;
    }
#undef FA_FAST
}
