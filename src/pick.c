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

static int cmp_desc(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

// The sampled id (engine.h, struct engine_sampling), -1 when nothing is allowed.
static int sample(const float *x, int V, const struct engine_pick *p, const uint32_t *allow, float *z) {
    const struct engine_sampling *s = p->sampling;
    int best = -1, n = 0;
    float zmax = -INFINITY;
    for (int i = 0; i < V; i++) {
        z[i] = -INFINITY;
        if (!allowed(allow, i)) continue;
        const float l = x[i] - (seen(p->seen, i) ? s->presence_penalty : 0.0f);
        z[i] = s->temperature > 0 ? l / s->temperature : l;
        if (best < 0 || z[i] > z[best]) best = i; // lowest id on ties (ascending scan, strict >)
        zmax = fmaxf(zmax, z[i]);
        n++;
    }
    if (best < 0 || s->temperature <= 0) return best;
    // thresholds on z: top_k, min_p, then top_p; the values sorted once (descending) where needed
    float cut = -INFINITY;
    float *sorted = NULL;
    if ((s->top_k > 0 && s->top_k < n) || s->top_p < 1.0f) {
        sorted = malloc(sizeof(float) * (size_t)n);
        if (!sorted) return best; // (only a threshold is lost: the caller's scratch holds z)
        int k = 0;
        for (int i = 0; i < V; i++)
            if (z[i] > -INFINITY) sorted[k++] = z[i];
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_desc);
    }
    if (s->top_k > 0 && s->top_k < n) cut = sorted[s->top_k - 1];
    if (s->min_p > 0) cut = fmaxf(cut, zmax + logf(s->min_p));
    if (s->top_p < 1.0f) {
        double mass = 0, acc = 0;
        for (int i = 0; i < n && sorted[i] >= cut; i++) mass += exp((double)sorted[i] - zmax);
        for (int i = 0; i < n && sorted[i] >= cut; i++) {
            acc += exp((double)sorted[i] - zmax);
            if (acc >= s->top_p * mass) {
                cut = fmaxf(cut, sorted[i]);
                break;
            }
        }
    }
    free(sorted);
    double mass = 0;
    for (int i = 0; i < V; i++)
        if (z[i] >= cut && z[i] > -INFINITY) mass += exp((double)z[i] - zmax);
    const double target = pick_uniform(s->seed, p->step) * mass;
    double acc = 0;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (!(z[i] >= cut && z[i] > -INFINITY)) continue;
        acc += exp((double)z[i] - zmax);
        last = i;
        if (acc > target) return i;
    }
    return last;
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
