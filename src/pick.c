// pick.c: the choice of the next token from one row of logits on the host (pick.h).
#include "pick.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool allowed(const uint32_t *allow, int i) {
    return !allow || (allow[i >> 5] >> (i & 31) & 1u);
}
static bool seen(const uint32_t *s, int i) {
    return s && (s[i >> 5] >> (i & 31) & 1u);
}
static bool better(const float *x, int a, int b) {
    return x[a] > x[b] || (x[a] == x[b] && a < b);
}

// The sampler's cuts need the largest values of z in order, which a sort of the whole row would
// give at ~45 ms a step. Instead a histogram of zmax - z finds the top bins that hold everything a
// cut can reach; only their ids are collected, and only the bin a cut falls in is sorted. The bins
// span the 87 below zmax where weights are not 0 (the last bin, open, holds only zeros).
enum { BINS = 1024 };
#define BIN_SCALE ((BINS - 1) / 88.0f)
static int bin_of(float zmax, float z) {
    const float d = (zmax - z) * BIN_SCALE;
    return d < BINS - 1 ? (int)d : BINS - 1;
}

// p_i / p_max = exp(z_i - max z); 0 under float's normal range, where expf is slow and the mass nil.
static float weight(float dz) {
    return dz >= -87.0f ? expf(dz) : 0.0f;
}

struct cand {
    int id, bin;
    float z, w;
};
static int cand_desc(const void *a, const void *b) {
    const float x = ((const struct cand *)a)->z, y = ((const struct cand *)b)->z;
    return x > y ? -1 : x < y;
}

static float z_of(const float *x, int i, const struct engine_pick *p) {
    const struct engine_sampling *s = p->sampling;
    const float l = x[i] - (seen(p->seen, i) ? s->presence_penalty : 0.0f);
    return s->temperature > 0 ? l / s->temperature : l;
}

// The draw u among the candidates c[0..n) (id order) whose z is at least zcut.
static int draw_among(const struct cand *c, int n, float zcut, double u) {
    double mass = 0, acc = 0;
    for (int i = 0; i < n; i++)
        if (c[i].z >= zcut) mass += c[i].w;
    const double target = u * mass;
    int last = -1;
    for (int i = 0; i < n; i++) {
        if (!(c[i].z >= zcut)) continue;
        acc += c[i].w;
        last = c[i].id;
        if (acc > target) break;
    }
    return last;
}

// The sampled id (engine.h, struct engine_sampling), -1 when nothing is allowed. w[V] is scratch:
// w_i = exp(z_i - max z), 0 for the ids not allowed or under min_p. Masses are sums in double: in id order, and
// the top_p walk's bin by bin, each bin in id order until the one it ends in, which it walks down.
static int sample(const float *x, int V, const struct engine_pick *p, const uint32_t *allow, float *w) {
    const struct engine_sampling *s = p->sampling;
    int best = -1, n = 0;
    float zmax = -INFINITY;
    for (int i = 0; i < V; i++) {
        w[i] = -INFINITY;
        const float z = allowed(allow, i) ? z_of(x, i, p) : NAN;
        if (z != z) continue; // (not allowed, or a NaN logit)
        w[i] = z;
        if (best < 0 || z > zmax) best = i, zmax = z; // lowest id on ties (ascending scan, strict >)
        n++;
    }
    if (best < 0 || s->temperature <= 0) return best;
    const float wmin = s->min_p; // p_i >= min_p p_max is w_i >= min_p
    const bool by_k = s->top_k > 0 && s->top_k < n, by_p = s->top_p < 1.0f;
    int count[BINS] = {0};
    double binmass[BINS] = {0}, kept = 0; // over the ids min_p keeps (w > 0)
    for (int i = 0; i < V; i++) {
        if (w[i] == -INFINITY) {
            w[i] = 0;
            continue;
        }
        const int b = bin_of(zmax, w[i]);
        w[i] = weight(w[i] - zmax);
        if (!(w[i] >= wmin)) w[i] = 0;
        if (w[i] > 0) count[b]++, binmass[b] += w[i], kept += w[i];
    }
    const double u = pick_uniform(s->seed, p->step);
    if (!by_k && !by_p) { // the draw over the whole row
        const double target = u * kept;
        double acc = 0;
        int last = best;
        for (int i = 0; i < V; i++) {
            if (!(w[i] > 0)) continue;
            acc += w[i];
            last = i;
            if (acc > target) return i;
        }
        return last;
    }
    // The top bins that hold the top_k largest, or a little more than top_p of the mass kept (the bins
    // sum in another order than the walk: a margin, and every bin when the walk falls short).
    int top = 0, nc = count[0];
    double m = binmass[0];
    while (top < BINS - 1 && !(by_k ? nc >= s->top_k : m >= (s->top_p + 1e-6) * kept)) {
        top++;
        nc += count[top], m += binmass[top];
    }
    for (;;) {
        const bool whole = by_k || top == BINS - 1; // every id the cuts can keep is a candidate
        struct cand *c = malloc(sizeof *c * (size_t)nc * 2);
        if (!c) return best; // (only the draw is lost)
        // The ids of bins up to top (the last is open) have w >= exp(-(top + 1) / BIN_SCALE): a bound
        // under it skips the others at a compare.
        const float wlo = top < BINS - 1 ? 0.99f * expf(-(float)(top + 1) / BIN_SCALE) : 0.0f;
        int k = 0, at[BINS + 1] = {0};
        for (int i = 0; i < V && k < nc; i++) {
            if (!(w[i] > 0 && w[i] >= wlo)) continue;
            const float z = z_of(x, i, p);
            const int b = bin_of(zmax, z);
            if (b <= top) c[k++] = (struct cand){i, b, z, w[i]}, at[b + 1]++;
        }
        // r: the candidates by bin, the most likely bin first; a bin is sorted by z when a cut falls in it.
        struct cand *r = c + nc;
        for (int b = 0; b <= top; b++) at[b + 1] += at[b];
        int fill[BINS];
        memcpy(fill, at, sizeof fill);
        for (int i = 0; i < k; i++) r[fill[c[i].bin]++] = c[i];
        float zcut = -INFINITY;
        if (by_k && k >= s->top_k) {
            int b = 0;
            while (at[b + 1] < s->top_k) b++;
            qsort(r + at[b], (size_t)(at[b + 1] - at[b]), sizeof *r, cand_desc);
            zcut = r[s->top_k - 1].z;
        }
        bool reached = !by_p;
        if (by_p) {
            double mass = 0, acc = 0; // the mass both cuts keep so far (min_p's alone: kept)
            if (by_k)
                for (int i = 0; i < k; i++) mass += c[i].z >= zcut ? c[i].w : 0;
            else
                mass = kept;
            const double target = s->top_p * mass;
            for (int b = 0; b <= top && !reached; b++) {
                double in_bin = 0;
                for (int i = at[b]; i < at[b + 1]; i++) in_bin += r[i].z >= zcut ? r[i].w : 0;
                if (acc + in_bin < target) {
                    acc += in_bin;
                    continue;
                }
                qsort(r + at[b], (size_t)(at[b + 1] - at[b]), sizeof *r, cand_desc);
                for (int i = at[b]; i < at[b + 1] && r[i].z >= zcut; i++) {
                    acc += r[i].w;
                    if (acc >= target) {
                        zcut = r[i].z;
                        reached = true;
                        break;
                    }
                }
            }
        }
        const int id = reached || whole ? draw_among(c, k, zcut, u) : -1;
        free(c);
        if (reached || whole) return id >= 0 ? id : best;
        top = BINS - 1, nc = 0;
        for (int b = 0; b < BINS; b++) nc += count[b];
    }
}

int pick_row(const float *x, int V, const struct engine_pick *p, const uint32_t *allow, float *scratch,
             struct engine_choice *c) {
    memset(c, 0, sizeof *c);
    int g = 0, ch = -1;
    for (int i = 1; i < V; i++)
        if (better(x, i, g)) g = i;
    if (p->sampling) {
        if (!scratch) return -1;
        ch = sample(x, V, p, allow, scratch);
    } else {
        for (int i = 0; i < V; i++)
            if (allowed(allow, i) && (ch < 0 || better(x, i, ch))) ch = i;
    }
    c->greedy = g;
    c->chosen = ch;
    if (p->n_top < 0) return 0;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - x[g]);
    const float lse = x[g] + (float)log(sum);
    c->greedy_lp = x[g] - lse;
    c->chosen_lp = ch >= 0 ? x[ch] - lse : 0.0f;
    const int k = p->n_top < ENGINE_MAX_TOP ? p->n_top : ENGINE_MAX_TOP;
    for (int i = 0; i < V && k > 0; i++) { // insertion into a sorted list: most fail the first compare
        if (c->n_top == k && !better(x, i, c->top_id[k - 1])) continue;
        int at = c->n_top < k ? c->n_top++ : k - 1;
        while (at > 0 && better(x, i, c->top_id[at - 1])) {
            c->top_id[at] = c->top_id[at - 1];
            at--;
        }
        c->top_id[at] = i;
    }
    for (int t = 0; t < c->n_top; t++) c->top_lp[t] = x[c->top_id[t]] - lse;
    return 0;
}
