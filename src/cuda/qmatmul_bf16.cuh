// qmatmul_bf16.cuh: the fast-mode kernel of qmatmul.cu (x in bf16), in a header of its own so that
// tools/sim/qmatmul_sim.cpp can run the same device code on the host (make qmatmul-sim).
#pragma once

#include "mma.cuh"
#ifndef QB_HOST_SIM
#include "wgmma.cuh"
#endif

// Fast mode: x already in bf16, the weights dequantized to bf16 as MLX does.
//
// y[r, n] = sum_k bf16(s_g[n] q[n, k] + b_g[n]) xb[r, k]
// with xb the bf16 activations (written once by k_to_bf16 or by their producer) and each weight
// dequantized by one fused bf16 multiply-add (fma.rn.bf16x2: the exact s q + b rounded once to
// bf16, what MLX's own quantized matmul computes in a bf16 model): one MMA per product, fp32
// accumulation, no per-group folding. (Keeping the weights exact and folding the scale and bias into
// an fp32 accumulator once per group costs 128 FFMA, a second accumulator tile and the row sums of x
// per warp and step, ~60% of the instructions: such a kernel issued at 0.45 instructions a cycle per
// scheduler; bench/NOTES.md.)
//
// Tile: 128 rows x 128 features, K one group (64) per step; 8 warps as two warpgroups of 64 rows x
// 128 features (4 wgmma m64n128k16 a step, sm_90a). A 3-stage cp.async pipeline (16-byte copies
// straight into shared memory): per stage the x tile (128 x 64 bf16, rows of 8 swizzled 16-byte
// chunks) and the raw codes of the 128 weight rows (4/8-bit words, unswizzled). The codes are
// dequantized once per block into a bf16 tile (swizzled as the x tile; 4-bit codes by LOP3 into
// 0x4300 | q = 128 + q and one exact bf16x2 fma of -128, 8-bit ones by I2F; then the fma with the
// row's scale and bias), double-buffered, one step ahead of the products. One barrier per step:
//   wait for step kt + 1's copies; barrier; issue step kt + 2's copies and its scale / bias loads;
//   issue step kt's wgmma; dequantize step kt + 1 under them; store step kt + 2's scale / bias pairs
//   to its stage; wait for the products.
// So each warpgroup's own dequantization runs under its products, and global loads run two steps
// ahead. At up to 128 registers a thread, two blocks an SM (16 warps: one block's barrier and
// dequantization do not idle the SM's tensor cores). The host simulator runs it on the wgmma model
// of tools/sim/sim_wgmma.h; test_cuda_kernels checks it on the GPU.
// The grid and the grouped (per-expert) form are those of qmatmul_kernel.
// GLU (k_qmatmul_bf16_swiglu): the up product of a SwiGLU ends in its activation. The
// epilogue reads the gate product's fp32 output g at the element it would write (same ldy, ymap,
// grouped rows) and stores bf16(silu(g) acc) to a bf16 output, instead of acc to y: the down
// product's input, without the fp32 round trips of k_swiglu and k_to_bf16 (ncu, one 4,096-token
// prefill with them: k_swiglu 3.4 ms, k_to_bf16 3.3 ms; with k_rmsnorm's bf16 copy, all of k_swiglu
// and about two thirds of k_to_bf16's elements go). The same expression (silu_f(g) * u)
// and rounding (f2bf16) as those two kernels, so the values are bit-identical (the PTX of silu_f is
// the same sequence in both). A template parameter, so the plain form carries none of it; the
// epilogue runs after the main loop, its registers within the launch bounds (ptxas -v: no more
// registers or spills than the plain form).
// tools/sim/qmatmul_sim.cpp runs this code on the host (make qmatmul-sim), with the copies landing at
// once or as late as their wait_group allows.
enum { QB_BM = 128, QB_BN = 128, QB_BK = 64, QB_THREADS = 256, QB_STAGES = 3, QB_BLOCKS = 2 };
static_assert(QB_BK == QGROUP, "one quantization group per K step");

template <int BITS> struct qb_layout { // dynamic shared memory, in bytes from its start (every part 16-byte aligned)
    static constexpr int STAGES = QB_STAGES;
    static constexpr int WPR = QB_BK * BITS / 32;                        // words per row per group
    static constexpr size_t X = 0;                                       // [STAGES][BM * BK] bf16
    static constexpr size_t WC = X + (size_t)STAGES * QB_BM * QB_BK * 2; // [STAGES][BN * WPR] u32
    static constexpr size_t WB = WC + (size_t)STAGES * QB_BN * WPR * 4;  // [2][BN * BK] bf16
    static constexpr size_t SC = WB + (size_t)2 * QB_BN * QB_BK * 2;     // [STAGES][BN] bf16x2 (s, s)
    static constexpr size_t BI = SC + (size_t)STAGES * QB_BN * 4;        // [STAGES][BN] bf16x2 (b, b)
    static constexpr size_t BYTES = BI + (size_t)STAGES * QB_BN * 4;
};

#ifndef QB_HOST_SIM
// bf16x2 {lo, hi} = {128 + q0, 128 + q1} -> {q0, q1}, exact (an fma of 1 and -128).
static __device__ __forceinline__ uint32_t bf2_minus128(uint32_t v) {
    uint32_t r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(0x3F803F80u), "r"(0xC300C300u));
    return r;
}
// bf16x2 a * s + b, each half rounded once (the weight s q + b of a code pair, q exact in bf16).
static __device__ __forceinline__ uint32_t bf2_fma(uint32_t a, uint32_t s, uint32_t b) {
    uint32_t r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(s), "r"(b));
    return r;
}
#define QB_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif
static __device__ __forceinline__ uint32_t bf16_of_code(uint32_t q) { // q < 256: exact in bf16
    return __float_as_uint((float)q) >> 16;
}

// The compact grid of the grouped form (M > 0: the rows of all experts together, at most M): block
// row y is the y-th row tile of all experts' tiles, ceil(count / QB_BM) each, counted in expert
// order, so the grid has at most M / QB_BM + E rows of blocks instead of E x ceil(max count / QB_BM)
// mostly past their expert's count (at 4,096 tokens, 8 of 256 experts, the down product's 131,072
// blocks become 8,192). Sets e = -1 past the last tile. Block-wide (every thread; E <= QB_THREADS).
static __device__ void qb_tile_of(const int *counts, int E, int y, int &e, int &mt) {
    __shared__ int wsum[QB_THREADS / WARP_SIZE], res[2];
    const int t = threadIdx.x, lane = t % WARP_SIZE, w = t / WARP_SIZE;
    const int n = t < E ? CEIL_DIV(counts[t], QB_BM) : 0;
    int inc = n; // inclusive scan within the warp
#pragma unroll
    for (int o = 1; o < WARP_SIZE; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
    }
    if (lane == WARP_SIZE - 1) wsum[w] = inc;
    if (t == 0) res[0] = -1;
    __syncthreads();
    int first = inc - n;
    for (int j = 0; j < w; j++) first += wsum[j];
    if (y >= first && y < first + n) res[0] = t, res[1] = y - first;
    __syncthreads();
    e = res[0], mt = res[1];
}

// The x and y rows of a block's rows r0 .. r0 + BM - 1 of its expert (base: the expert's first row;
// -1 past cnt), one thread each (both product kernels).
template <int BM>
static __device__ __forceinline__ void qm_rows(int r0, int cnt, int base, const int *xmap, int xdiv, const int *ymap,
                                               int *xrow, int *yrow) {
    const int tid = threadIdx.x;
    if (tid < BM) {
        int r = r0 + tid;
        if (r < cnt) {
            r += base;
            xrow[tid] = xmap ? xmap[r] / xdiv : r;
            yrow[tid] = ymap ? ymap[r] : r;
        } else {
            xrow[tid] = -1;
            yrow[tid] = -1;
        }
    }
}

// The mma.sync B fragments of a warp's 32 features wn .. wn + 31 at k16 step kk, from a bf16 weight
// tile W [features][64] stored as x is (rows of 8 swizzled 16-byte chunks): two ldmatrix .x4, each
// two n8 fragments (both product kernels).
static __device__ __forceinline__ void qm_b_frags(uint32_t (&bq)[4][2], const uint16_t *W, int wn, int kk, int lane) {
#pragma unroll
    for (int p = 0; p < 2; p++) {
        const int n = wn + p * 16 + lane % 8 + 8 * (lane / 16), c = kk * 2 + (lane / 8) % 2;
        uint32_t r4[4];
        ldsm_x4(r4, &W[n * QGROUP + swz(n, c) * 8]);
        bq[2 * p][0] = r4[0];
        bq[2 * p][1] = r4[1];
        bq[2 * p + 1][0] = r4[2];
        bq[2 * p + 1][1] = r4[3];
    }
}

// Features n and n + 1 (those below N) of the output row at offset ro: y = v, for ADD y += v
// (k_add's x[i] += d[i]: the same fp32 sum), or for GLU yb = bf16(silu(gate) v): k_swiglu's
// expression, k_to_bf16's rounding.
template <bool GLU, bool ADD = false>
static __device__ __forceinline__ void qb_store(float *y, const float *gate, uint16_t *yb, size_t ro, int n, int N,
                                                float v0, float v1) {
    if constexpr (GLU) {
        if (n < N) yb[ro + n] = f2bf16(silu_f(gate[ro + n]) * v0);
        if (n + 1 < N) yb[ro + n + 1] = f2bf16(silu_f(gate[ro + n + 1]) * v1);
    } else if constexpr (ADD) {
        if (n < N) y[ro + n] += v0;
        if (n + 1 < N) y[ro + n + 1] += v1;
    } else {
        if (n < N) y[ro + n] = v0;
        if (n + 1 < N) y[ro + n + 1] = v1;
    }
}

// A warp's mma.sync accumulator tiles into the output through qb_store: tile (mi, ni) holds rows
// wm + 16 mi + g (+ 8) (yrow's entries; < 0: no row) and features n0 + wn + 8 ni + 2 c4 (+ 1).
template <bool GLU, bool ADD, int MI>
static __device__ __forceinline__ void qm_store_frags(const float (&acc)[MI][4][4], const int *yrow, int wm, int wn,
                                                      int g, int c4, int n0, int N, float *y, int ldy,
                                                      const float *gate, uint16_t *yb) {
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int yr = yrow[wm + mi * 16 + g + 8 * h];
            if (yr < 0) continue;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int n = n0 + wn + ni * 8 + 2 * c4;
                qb_store<GLU, ADD>(y, gate, yb, (size_t)yr * ldy, n, N, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
        }
}

// The products of one K step on warpgroup products: the x tile and the dequantized weight tile are
// already in wgmma's 128-byte-swizzle K-major layout (rows of 128 bytes, chunk c of row r at
// c ^ (r & 7), wgmma.cuh) once their stages start on 1024-byte boundaries, so each warpgroup (64 rows
// x 128 features) issues 4 wgmma m64n128k16 that read both straight from shared memory (~48 KB of
// shared-memory reads a step, half of what ldmatrix for mma.sync would read), and dequantizes step
// kt + 1 while they run.
// Dynamic shared memory: the layout, and 1 KB to align its start.
template <int BITS> inline constexpr size_t QB_SMEM = qb_layout<BITS>::BYTES + 1024;

// Segments (k_qmatmul_segs, k_qmatmul_bf16_segs): up to QM_MAX_SEGS dense products of one input
// (the same x, K and bits) in one launch, each into its own output with its own row stride. grid.x
// counts the N-tiles of all of them, segment after segment (a tile never straddles two), and a
// block maps its blockIdx.x to (segment, tile within it) at its start, then runs as the block of
// that segment's own launch would: the same tile, the same operations in the same order, so the
// outputs are bit-identical to separate launches. Tiny products (in_b / in_a, k_proj / v_proj) fill
// the grid of a large one instead of paying a launch each. The table rides in the kernel's
// parameters (nothing to upload); tile0 of the slots past the last segment is the total tile count,
// so they are never picked. The kernels take SEGS as a template
// parameter: without it (the single-product launchers) the product is the kernel's own parameters
// W1, y1, ldy1 (the table is passed but not read; ptxas gives those forms the registers of a
// kernel without segments); with it the fields are picked by a select chain on constant indices (no local
// copy of the table), K from segment 0 (shared), the output pointer and stride at the epilogue.
struct qm_segs {
    struct qm_seg s[QM_MAX_SEGS];
    int tile0[QM_MAX_SEGS]; // first N-tile (blockIdx.x) of segment i
};
// Host: the table of n products on tiles of bn features; returns grid.x, the N-tiles of all, or 0
// when the products cannot share a launch (n out of range, an empty product, another K or bits than
// the first's).
static inline int qm_table(const struct qm_seg *seg, int n, int bn, qm_segs *S) {
    if (n < 1 || n > QM_MAX_SEGS) return 0;
    int tiles = 0;
    for (int i = 0; i < n; i++) {
        if (seg[i].W.rows <= 0 || seg[i].W.cols != seg[0].W.cols || seg[i].W.bits != seg[0].W.bits) return 0;
        S->s[i] = seg[i];
        S->tile0[i] = tiles;
        tiles += CEIL_DIV(seg[i].W.rows, bn);
    }
    for (int i = n; i < QM_MAX_SEGS; i++) { // never picked: blockIdx.x < tiles
        S->s[i] = seg[0];
        S->tile0[i] = tiles;
    }
    return tiles;
}

// The segment of N-tile bx (0 without SEGS).
template <bool SEGS> static __device__ __forceinline__ int qm_seg_of(const qm_segs &S, int bx) {
    int i = 0;
    if constexpr (SEGS) {
#pragma unroll
        for (int j = 1; j < QM_MAX_SEGS; j++)
            if (bx >= S.tile0[j]) i = j;
    }
    return i;
}
// f(segment i) for a segment index known only at run time, by constant indices.
template <bool SEGS, typename F> static __device__ __forceinline__ auto qm_get(const qm_segs &S, int i, F f) {
    auto v = f(S.s[0]);
    if constexpr (SEGS) {
#pragma unroll
        for (int j = 1; j < QM_MAX_SEGS; j++)
            if (i == j) v = f(S.s[j]);
    }
    return v;
}
// Segment i's matrix (K and bits: segment 0's, shared by every segment) and first feature of tile bx;
// without SEGS the single product W1 and bx * BN.
template <bool SEGS, int BN, int BITS>
static __device__ __forceinline__ struct dqt qm_matrix(const qm_segs &S, const struct dqt &W1, int i, int bx, int *n0) {
    if constexpr (!SEGS) {
        *n0 = bx * BN;
        return W1;
    }
    int t0 = 0;
#pragma unroll
    for (int j = 1; j < QM_MAX_SEGS; j++)
        if (i == j) t0 = S.tile0[j];
    *n0 = (bx - t0) * BN;
    struct dqt W;
    W.w = qm_get<SEGS>(S, i, [](const qm_seg &g) { return g.W.w; });
    W.scales = qm_get<SEGS>(S, i, [](const qm_seg &g) { return g.W.scales; });
    W.biases = qm_get<SEGS>(S, i, [](const qm_seg &g) { return g.W.biases; });
    W.n_mat = S.s[0].W.n_mat;
    W.rows = qm_get<SEGS>(S, i, [](const qm_seg &g) { return g.W.rows; });
    W.cols = S.s[0].W.cols;
    W.bits = BITS;
    return W;
}
// Segment i's output and row stride; without SEGS the single product's y1, ldy1.
template <bool SEGS>
static __device__ __forceinline__ void qm_output(const qm_segs &S, int i, float *y1, int ldy1, float **y, int *ldy) {
    *y = y1;
    *ldy = ldy1;
    if constexpr (SEGS) {
        *y = qm_get<SEGS>(S, i, [](const qm_seg &o) { return o.y; });
        *ldy = qm_get<SEGS>(S, i, [](const qm_seg &o) { return o.ldy; });
    }
}

// W1, y1, ldy1: the product (SEGS off); S: the products of one dense x (SEGS on; qm_segs above). GLU
// (SEGS off): y1 unused; gate [*, ldy1] fp32 and yb [*, ldy1] bf16 (else both unused). ADD (SEGS and
// GLU off, k_qmatmul_bf16_add): y1 += W x, each element read and written by the one thread that
// computes it, so bit-identical to the plain form into a buffer d, then k_add(y1, d) (the residual
// add of cuda_layer's o_proj / out_proj without d's write and two reads).
template <int BITS, bool GLU, bool SEGS = false, bool ADD = false>
static __global__ void __launch_bounds__(QB_THREADS, QB_BLOCKS)
    qmatmul_bf16_kernel(struct dqt W1, const uint16_t *x, int ldx, const int *xmap, int xdiv, float *y1, int ldy1,
                        const int *ymap, int M, const int *counts, const int *offs, const float *gate, uint16_t *yb,
                        const qm_segs S) {
    static_assert(!(ADD && (GLU || SEGS)), "the add form: one plain product");
    constexpr int STAGES = QB_STAGES;
    using L = qb_layout<BITS>;
    constexpr int PER = 32 / BITS, WPR = L::WPR, WCH = WPR / 4; // codes per word; words, chunks per row
    constexpr int XT = QB_BM * QB_BK, WT = QB_BN * WPR;         // elements of one stage
    QB_DYNAMIC_SMEM(qb_raw);
    // (the host simulator's smem_u32 models shared addresses too: tools/sim/sim_wgmma.h)
    unsigned char *const qb_smem = qb_raw + ((1024 - (smem_u32(qb_raw) & 1023)) & 1023);
    uint16_t *const Xt = (uint16_t *)(qb_smem + L::X);
    uint32_t *const Wc = (uint32_t *)(qb_smem + L::WC);
    uint16_t *const Wb = (uint16_t *)(qb_smem + L::WB);
    uint32_t *const Sc = (uint32_t *)(qb_smem + L::SC), *const Bi = (uint32_t *)(qb_smem + L::BI);
    __shared__ int xrow[QB_BM], yrow[QB_BM];

    int e = blockIdx.z, mt = blockIdx.y;
    if (counts && M > 0) { // the compact grid
        qb_tile_of(counts, W1.n_mat, blockIdx.y, e, mt);
        if (e < 0) return;
    }
    int base = 0, cnt = M;
    if (counts) {
        base = offs[e];
        cnt = counts[e];
    }
    const int r0 = mt * QB_BM;
    if (r0 >= cnt) return;
    const int seg = qm_seg_of<SEGS>(S, blockIdx.x);
    int n0;
    const struct dqt W = qm_matrix<SEGS, QB_BN, BITS>(S, W1, seg, blockIdx.x, &n0);
    const int tid = threadIdx.x, N = W.rows, K = W.cols;
    qm_rows<QB_BM>(r0, cnt, base, xmap, xdiv, ymap, xrow, yrow);
    const size_t mat = counts ? (size_t)e : 0;
    const int wpr = K / PER, ng = K / QB_BK;
    const bool has_sc = tid < QB_BN && n0 + tid < N;
    const size_t sgrow = has_sc ? (mat * N + n0 + tid) * (size_t)ng : 0;
    __syncthreads();

    // Copies of step kt into stage st (one commit group per call, empty past the end).
    auto load_tile = [&](int kt, int st) {
        if (kt < ng) {
            const int k0 = kt * QB_BK;
            uint16_t *X = Xt + st * XT;
#pragma unroll
            for (int i = 0; i < QB_BM * 8 / QB_THREADS; i++) { // 4 chunks of 8 x values
                const int id = tid + i * QB_THREADS, r = id / 8, ch = id % 8, xr = xrow[r];
                const uint16_t *src = xr >= 0 ? x + (size_t)xr * ldx + k0 + ch * 8 : x;
                cp_async16(&X[r * QB_BK + swz(r, ch) * 8], src, xr >= 0 ? 16 : 0);
            }
            uint32_t *Wd = Wc + st * WT;
#pragma unroll
            for (int i = 0; i < QB_BN * WCH / QB_THREADS; i++) { // 1 (4-bit) or 2 (8-bit) chunks of codes
                const int id = tid + i * QB_THREADS, n = id / WCH, ch = id % WCH;
                const bool ok = n0 + n < N;
                const uint32_t *src = ok ? W.w + (mat * N + n0 + n) * (size_t)wpr + (size_t)kt * WPR + ch * 4 : W.w;
                cp_async16(&Wd[n * WPR + ch * 4], src, ok ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    auto load_sb = [&](int kt, uint32_t &sv, uint32_t &bv) { // as bf16x2 pairs (v, v)
        sv = 0;
        bv = 0;
        if (has_sc && kt < ng) {
            sv = W.scales[sgrow + kt] * 0x10001u;
            bv = W.biases[sgrow + kt] * 0x10001u;
        }
    };

    // Dequantize the codes of step kt (stage kt % STAGES) into Wb[kt % 2] (bf16 s q + b, swizzled as
    // the x tile).
    auto dequant = [&](int kt) {
        if (kt >= ng) return;
        const int st = kt % STAGES;
        const uint32_t *Wd = Wc + st * WT;
        uint16_t *Wo = Wb + (kt % 2) * (QB_BN * QB_BK);
#pragma unroll
        for (int i = 0; i < QB_BN * 8 / QB_THREADS; i++) { // 4 chunks of 8 codes
            const int id = tid + i * QB_THREADS, n = id / 8, ch = id % 8;
            const uint32_t s2 = Sc[st * QB_BN + n], b2 = Bi[st * QB_BN + n];
            uint32_t o[4];
            if constexpr (BITS == 4) {
                const uint32_t w = Wd[n * WPR + ch]; // codes 8 ch .. 8 ch + 7, code j at bits 4 j
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    const uint32_t t = w >> (8 * p);
                    o[p] = bf2_fma(bf2_minus128((t & 0xFu) | ((t & 0xF0u) << 12) | 0x43004300u), s2, b2);
                }
            } else {
                static_assert(BITS == 8, "4 or 8 bits");
                const uint2 w = *(const uint2 *)&Wd[n * WPR + ch * 2]; // code j at bits 8 (j % 4) of word j / 4
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    const uint32_t t = (p < 2 ? w.x : w.y) >> (16 * (p % 2));
                    o[p] = bf2_fma(bf16_of_code(t & 0xFFu) | (bf16_of_code((t >> 8) & 0xFFu) << 16), s2, b2);
                }
            }
            *(uint4 *)&Wo[n * QB_BK + swz(n, ch) * 8] = make_uint4(o[0], o[1], o[2], o[3]);
        }
    };

    for (int kt = 0; kt < STAGES - 1; kt++) load_tile(kt, kt);
    if (tid < QB_BN) {
#pragma unroll
        for (int kt = 0; kt < STAGES - 1; kt++) {
            uint32_t sv, bv;
            load_sb(kt, sv, bv);
            Sc[kt * QB_BN + tid] = sv;
            Bi[kt * QB_BN + tid] = bv;
        }
    }
    cp_async_wait<STAGES - 2>(); // step 0 has landed (this thread's copies)
    __syncthreads();
    dequant(0);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) // the host simulator defines it with its wgmma model (tools/sim/sim_wgmma.h)
    const int lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, g = lane / 4, c4 = lane % 4;
    // Every shared-memory write a wgmma reads (cp.async copies, dequant's stores) is followed by
    // fence.proxy.async in the writing thread, then a barrier.
    fence_async_smem();
    float acc[QB_BN / 2] = {}; // this warpgroup's 64 x 128: row g (+ 8) of the warp's 16, acc[4 ni + 2 h + j]
    const int wg = warp / 4;
    const uint64_t dX = wg_desc(smem_u32(Xt) + wg * 64 * 128, 16, 1024), dW = wg_desc(smem_u32(Wb), 16, 1024);
    for (int kt = 0; kt < ng; kt++) {
        const int st = kt % STAGES;
        cp_async_wait<STAGES - 3>(); // this thread's copies of step kt + 1 have landed
        fence_async_smem();
        // Everyone's have; Wb of step kt is written; every thread is done with step kt - 1 (its
        // products were waited for), so its stage, its Wb and its scales are free.
        __syncthreads();
        load_tile(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        uint32_t nsv, nbv;
        load_sb(kt + STAGES - 1, nsv, nbv);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < QB_BK / 16; kk++)
            wgmma_64x128_ss(acc, dX + ((st * XT * 2 + kk * 32) >> 4),
                            dW + (((kt % 2) * QB_BN * QB_BK * 2 + kk * 32) >> 4));
        wg_commit();
        dequant(kt + 1); // under the products
        fence_async_smem();
        if (tid < QB_BN) {
            Sc[((kt + STAGES - 1) % STAGES) * QB_BN + tid] = nsv;
            Bi[((kt + STAGES - 1) % STAGES) * QB_BN + tid] = nbv;
        }
        wg_wait<0>();
#ifndef QB_HOST_SIM // pins acc after the wait (the host model is synchronous; no "f" registers there)
#pragma unroll
        for (int i = 0; i < QB_BN / 2; i++) asm volatile("" : "+f"(acc[i])::"memory");
#endif
    }
    cp_async_wait<0>();
    float *y;
    int ldy;
    qm_output<SEGS>(S, seg, y1, ldy1, &y, &ldy);
    const int wr = wg * 64 + (warp % 4) * 16 + g;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int yr = yrow[wr + 8 * h];
        if (yr < 0) continue;
#pragma unroll
        for (int ni = 0; ni < QB_BN / 8; ni++) {
            const int n = n0 + ni * 8 + 2 * c4;
            qb_store<GLU, ADD>(y, gate, yb, (size_t)yr * ldy, n, N, acc[4 * ni + 2 * h], acc[4 * ni + 2 * h + 1]);
        }
    }
#else
    __trap(); // built for sm_90 without the "a" features: the backend refuses such a device at load
#endif
}
