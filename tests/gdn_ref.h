// gdn_ref.h: CPU references for the gated delta rule (docs/MODEL.md §2.5 and §4), shared by the CPU
// test tests/test_gdn_chunked.c and the GPU test tests/gpu/test_gdn_chunked.c. Header-only.
//
// Layouts as the CUDA kernels: y [T, C] (C = 2 Hk Dk + Hv Dv: q heads | k heads | v heads, q and
// k already L2-normalised, q also by 1/sqrt(Dk)), b and a [T, Hv], S [Hv, Dk, Dv], o [T, Hv Dv].
//
//   gdnref_gates       beta and the log-decay g per (t, h), in fp32 exactly as the kernels do
//   gdnref_recurrent   the token-by-token recurrence (§2.5) in fp64: decay, read, delta, write, out
//   gdnref_chunked     the chunked form (§4, chunk 64) in fp64; bf != 0 rounds the operands of the
//                      products the bf16 tensor-core kernel rounds, to predict its error
//   gdnref_gated_norm  o = w * rmsnorm(o) * silu(z) per (t, h) row
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GDNREF_BT 64   // chunk length

static inline float gdnref_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static inline void gdnref_gates(const float *b, const float *a, const float *A_log, const float *dt_bias, int T, int Hv,
                                float *beta, float *g) {
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hv; h++) {
            const size_t i = (size_t)t * Hv + h;
            beta[i] = 1.0f / (1.0f + expf(-b[i]));
            g[i] = -expf(A_log[h]) * gdnref_softplus(a[i] + dt_bias[h]);
        }
}

// Round to bf16 (nearest even) through fp32.
static inline double gdnref_bf(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

// S [Hv, Dk, Dv] fp64, updated; o [T, Hv Dv] fp64 raw (before the gated norm).
static inline void gdnref_recurrent(const float *y, const float *beta, const float *g, double *S, double *o, int T,
                                    int Hk, int Hv, int Dk, int Dv) {
    const int C = 2 * Hk * Dk + Hv * Dv, KD = Hk * Dk;
    double *m = (double *)malloc(sizeof(double) * Dv);
    for (int h = 0; h < Hv; h++) {
        double *Sh = S + (size_t)h * Dk * Dv;
        const int kh = h / (Hv / Hk);
        for (int t = 0; t < T; t++) {
            const float *q = y + (size_t)t * C + (size_t)kh * Dk, *k = y + (size_t)t * C + KD + (size_t)kh * Dk;
            const float *v = y + (size_t)t * C + 2 * KD + (size_t)h * Dv;
            const double alpha = exp((double)g[(size_t)t * Hv + h]), bt = beta[(size_t)t * Hv + h];
            for (size_t i = 0; i < (size_t)Dk * Dv; i++) Sh[i] *= alpha;
            for (int dv = 0; dv < Dv; dv++) m[dv] = 0;
            for (int dk = 0; dk < Dk; dk++)
                for (int dv = 0; dv < Dv; dv++) m[dv] += Sh[(size_t)dk * Dv + dv] * k[dk];
            for (int dv = 0; dv < Dv; dv++) m[dv] = bt * (v[dv] - m[dv]);
            for (int dk = 0; dk < Dk; dk++)
                for (int dv = 0; dv < Dv; dv++) Sh[(size_t)dk * Dv + dv] += k[dk] * m[dv];
            double *oh = o + (size_t)t * Hv * Dv + (size_t)h * Dv;
            for (int dv = 0; dv < Dv; dv++) oh[dv] = 0;
            for (int dk = 0; dk < Dk; dk++)
                for (int dv = 0; dv < Dv; dv++) oh[dv] += Sh[(size_t)dk * Dv + dv] * q[dk];
        }
    }
    free(m);
}

// The chunked form, per value head and chunk of BT = 64 (rows r, s in [0, n), n = valid rows):
//   gam_r = sum_{s<=r} g_s;  Gam_rs = exp(gam_r - gam_s) for s <= r
//   L_rs = beta_r (k_r . k_s) Gam_rs for s < r;  (I + L) U = diag(beta) V;  (I + L) W = diag(beta e^gam) K
//   P_rs = (q_r . k_s) Gam_rs for s <= r
//   V' = U - W S;  O = diag(e^gam) Q S + P V';  S <- e^gam_last S + K^T diag(e^(gam_last - gam)) V'
// Padding rows (zeros, g = 0) change nothing, so the last partial chunk is just shorter here.
static inline void gdnref_chunked(const float *y, const float *beta, const float *g, double *S, double *o, int T,
                                  int Hk, int Hv, int Dk, int Dv, int bf) {
    const int C = 2 * Hk * Dk + Hv * Dv, KD = Hk * Dk, BT = GDNREF_BT;
    double *gam = (double *)malloc(sizeof(double) * BT), *Lm = (double *)malloc(sizeof(double) * BT * BT);
    double *P = (double *)malloc(sizeof(double) * BT * BT), *U = (double *)malloc(sizeof(double) * BT * Dv);
    double *W = (double *)malloc(sizeof(double) * BT * Dk), *Vp = (double *)malloc(sizeof(double) * BT * Dv);
    double *Sn = (double *)malloc(sizeof(double) * Dk * Dv);
#define RB(x) (bf ? gdnref_bf(x) : (double)(x))
    for (int h = 0; h < Hv; h++) {
        double *Sh = S + (size_t)h * Dk * Dv;
        const int kh = h / (Hv / Hk);
        for (int t0 = 0; t0 < T; t0 += BT) {
            const int n = T - t0 < BT ? T - t0 : BT;
#define QQ(r, d) y[(size_t)(t0 + (r)) * C + (size_t)kh * Dk + (d)]
#define KK(r, d) y[(size_t)(t0 + (r)) * C + KD + (size_t)kh * Dk + (d)]
#define VV(r, d) y[(size_t)(t0 + (r)) * C + 2 * KD + (size_t)h * Dv + (d)]
#define BETA(r) ((double)beta[(size_t)(t0 + (r)) * Hv + h])
            double acc = 0;
            for (int r = 0; r < n; r++) gam[r] = acc += (double)g[(size_t)(t0 + r) * Hv + h];
            for (int r = 0; r < n; r++)
                for (int s = 0; s < n; s++) {
                    double kk = 0, qk = 0;
                    for (int d = 0; d < Dk; d++) {
                        kk += RB(KK(r, d)) * RB(KK(s, d));
                        qk += RB(QQ(r, d)) * RB(KK(s, d));
                    }
                    const double G = s <= r ? exp(gam[r] - gam[s]) : 0;
                    Lm[r * BT + s] = s < r ? BETA(r) * kk * G : 0;
                    P[r * BT + s] = s <= r ? qk * G : 0;
                }
            // forward substitution, row by row
            for (int r = 0; r < n; r++) {
                for (int j = 0; j < Dv; j++) {
                    double x = BETA(r) * VV(r, j);
                    for (int s = 0; s < r; s++) x -= Lm[r * BT + s] * U[s * Dv + j];
                    U[r * Dv + j] = x;
                }
                for (int j = 0; j < Dk; j++) {
                    double x = BETA(r) * exp(gam[r]) * KK(r, j);
                    for (int s = 0; s < r; s++) x -= Lm[r * BT + s] * W[s * Dk + j];
                    W[r * Dk + j] = x;
                }
            }
            // V' = U - W S; O = diag(e^gam) Q S + P V'
            for (int r = 0; r < n; r++)
                for (int j = 0; j < Dv; j++) {
                    double ws = 0, qs = 0;
                    for (int d = 0; d < Dk; d++) {
                        ws += RB(W[r * Dk + d]) * RB(Sh[(size_t)d * Dv + j]);
                        qs += RB(QQ(r, d)) * RB(Sh[(size_t)d * Dv + j]);
                    }
                    Vp[r * Dv + j] = U[r * Dv + j] - ws;
                    o[(size_t)(t0 + r) * Hv * Dv + (size_t)h * Dv + j] = exp(gam[r]) * qs;
                }
            for (int r = 0; r < n; r++)
                for (int j = 0; j < Dv; j++) {
                    double pv = 0;
                    for (int s = 0; s <= r; s++) pv += RB(P[r * BT + s]) * RB(Vp[s * Dv + j]);
                    o[(size_t)(t0 + r) * Hv * Dv + (size_t)h * Dv + j] += pv;
                }
            // S <- e^gam_last S + K^T diag(e^(gam_last - gam)) V'
            const double gl = gam[n - 1];
            for (int d = 0; d < Dk; d++)
                for (int j = 0; j < Dv; j++) {
                    double s = 0;
                    for (int r = 0; r < n; r++) s += RB(KK(r, d)) * RB(exp(gl - gam[r]) * Vp[r * Dv + j]);
                    Sn[(size_t)d * Dv + j] = exp(gl) * Sh[(size_t)d * Dv + j] + s;
                }
            memcpy(Sh, Sn, sizeof(double) * Dk * Dv);
#undef QQ
#undef KK
#undef VV
#undef BETA
        }
    }
#undef RB
    free(gam);
    free(Lm);
    free(P);
    free(U);
    free(W);
    free(Vp);
    free(Sn);
}

// o[t, h] = w * o * rsqrt(mean(o^2) + eps) * silu(z), in place, fp64 on the raw output.
static inline void gdnref_gated_norm(double *o, const float *z, const float *w, int T, int Hv, int Dv, double eps) {
    for (size_t row = 0; row < (size_t)T * Hv; row++) {
        double *x = o + row * Dv, ss = 0;
        const float *zz = z + row * Dv;
        for (int d = 0; d < Dv; d++) ss += x[d] * x[d];
        const double r = 1.0 / sqrt(ss / Dv + eps);
        for (int d = 0; d < Dv; d++) x[d] = w[d] * (x[d] * r) * (zz[d] / (1.0 + exp(-(double)zz[d])));
    }
}

// Normalised error |x - ref|_2 / |ref|_2 (NaN when x holds a NaN).
static inline double gdnref_nerr_d(const double *x, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) return NAN;
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static inline double gdnref_nerr_f(const float *x, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) return NAN;
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// Random inputs with the model's ranges: q, k L2-normalised (q also / sqrt(Dk)), v ~ [-1, 1),
// beta = sigmoid(b) over ~(0.05, 0.95), alpha = exp(g) in ~(0.62, 0.998) when strong == 0 (A_log = 0,
// dt_bias = 0, a in [-6, -0.5)), in ~(0.003, 0.993) when strong != 0 (A_log = 1, a in [-6, 2)).
struct gdnref_rng {
    uint64_t s;
};
static inline double gdnref_u(struct gdnref_rng *r) {   // [0, 1)
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (double)(r->s >> 11) / 9007199254740992.0;
}
static inline void gdnref_inputs(struct gdnref_rng *r, int T, int Hk, int Hv, int Dk, int Dv, int strong, float *y,
                                 float *b, float *a, float *A_log, float *dt_bias) {
    const int C = 2 * Hk * Dk + Hv * Dv;
    for (size_t i = 0; i < (size_t)T * C; i++) y[i] = (float)(2 * gdnref_u(r) - 1);
    for (int t = 0; t < T; t++)
        for (int kh = 0; kh < 2 * Hk; kh++) {
            float *x = y + (size_t)t * C + (size_t)kh * Dk, ss = 0;
            for (int d = 0; d < Dk; d++) ss += x[d] * x[d];
            float rs = 1.0f / sqrtf(ss + 1e-6f);
            if (kh < Hk) rs /= sqrtf((float)Dk);
            for (int d = 0; d < Dk; d++) x[d] *= rs;
        }
    for (size_t i = 0; i < (size_t)T * Hv; i++) {
        b[i] = (float)(6 * gdnref_u(r) - 3);
        a[i] = (float)(strong ? 8 * gdnref_u(r) - 6 : 5.5 * gdnref_u(r) - 6);
    }
    for (int h = 0; h < Hv; h++) {
        A_log[h] = strong ? 1.0f : 0.0f;
        dt_bias[h] = 0;
    }
}
