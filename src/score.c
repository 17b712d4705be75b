// score.c: `calla score`: teacher-forced scoring of a sequence and the comparison of two runs
// (score.h has the contract and the KL approximation).
//
// Shapes: N tokens, P = N - 1 positions, K = top-k, V = vocab, C = tokens per forward call.
// The sequence is fed C tokens at a time with the logits of every row asked for ([C, V] floats
// held at once); the engine's chunked prefill is bit-identical however the sequence is cut, so C
// changes memory and speed, never the numbers. With --decode-from D the tokens from D on are fed
// one at a time through the decode path instead (a different kernel path on CUDA; the same
// arithmetic on the CPU backend, tests/test_score.c).
#include "score.h"

#include "checkpoint.h"
#include "commands.h"
#include "options.h"
#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef CALLA_GIT_COMMIT
#define CALLA_GIT_COMMIT "unknown"
#endif

// ---- input ----------------------------------------------------------------------------------------

static int check_length(int n, const char *what, char *err, size_t errlen) {
    if (n < 2) {
        snprintf(err, errlen, "%s: %d token%s; scoring needs at least 2", what, n, n == 1 ? "" : "s");
        return -1;
    }
    if (n > QWEN_MAX_CTX) {
        snprintf(err, errlen, "%s: %d tokens, more than the context of %d", what, n, QWEN_MAX_CTX);
        return -1;
    }
    return 0;
}

int score_read_tokens(const char *path, int vocab, int32_t **ids, int *n, char *err, size_t errlen) {
    size_t len;
    char *text = read_small_file(path, &len, err, errlen);
    if (!text) return -1;
    int cap = 1024, k = 0;
    int32_t *v = malloc(sizeof *v * (size_t)cap);
    const char *p = text;
    int rc = -1;
    while (v) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',') p++;
        if (!*p) {
            rc = 0;
            break;
        }
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || (*end && !strchr(" \t\r\n,", *end))) {
            snprintf(err, errlen, "%s: byte %zu: not a token id (give decimal ids separated by spaces or commas)", path,
                     (size_t)(p - text));
            break;
        }
        if (x < 0 || x >= vocab) {
            snprintf(err, errlen, "%s: token %lld at index %d is outside the vocabulary (0..%d)", path, x, k,
                     vocab - 1);
            break;
        }
        if (k == QWEN_MAX_CTX) {
            snprintf(err, errlen, "%s: more than %d tokens (the context)", path, QWEN_MAX_CTX);
            break;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, sizeof *v * (size_t)(cap *= 2));
            if (!nv) {
                snprintf(err, errlen, "out of memory");
                break;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    free(text);
    if (!v) snprintf(err, errlen, "out of memory");
    if (rc == 0 && check_length(k, path, err, errlen)) rc = -1;
    if (rc) {
        free(v);
        return -1;
    }
    *ids = v;
    *n = k;
    return 0;
}

// ---- one row ----------------------------------------------------------------------------------------

// The K largest of row[0..V) by descending value, ties to the lower id (ids ascend in the scan and
// an equal value never displaces), and the log-sum-exp (fp32 result, accumulated in double).
static float row_top_lse(const float *row, int V, int K, int32_t *ids, float *vals) {
    int n = 0;
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) {
        float x = row[v];
        mx = x > mx ? x : mx;
        if (n == K && !(x > vals[K - 1])) continue;
        int j = n < K ? n++ : K - 1;
        for (; j > 0 && x > vals[j - 1]; j--) vals[j] = vals[j - 1], ids[j] = ids[j - 1];
        vals[j] = x;
        ids[j] = v;
    }
    double s = 0;
    for (int v = 0; v < V; v++) s += exp((double)row[v] - mx);
    return (float)(mx + log(s));
}

struct row_cmp {
    double kl, nle_num, nle_den;
    double tail; // the reference's mass outside its stored ids
    bool same, clear;
};

// The run's whole row (with its lse) against reference position p (score.h: the approximation).
static struct row_cmp compare_row(const float *row, float lse, const struct score_run *ref, int p, int32_t argmax) {
    struct row_cmp c = {0};
    const int K = ref->top_k, V = ref->vocab;
    const int32_t *rid = ref->top_ids + (size_t)p * K;
    const float *rl = ref->top_logits + (size_t)p * K;
    const double rlse = ref->lse[p];
    c.same = argmax == rid[0];
    c.clear = K >= 2 && (double)rl[0] - rl[1] > SCORE_CLEAR_MARGIN;
    if (ref->full) {
        const float *rf = ref->full + (size_t)p * V;
        for (int v = 0; v < V; v++) {
            double lr = rf[v] - rlse, lt = row[v] - (double)lse, d = (double)row[v] - rf[v];
            c.kl += exp(lr) * (lr - lt);
            c.nle_num += d * d;
            c.nle_den += (double)rf[v] * rf[v];
        }
        return c;
    }
    double pr_sum = 0, pt_sum = 0;
    for (int i = 0; i < K; i++) {
        double lr = rl[i] - rlse, lt = row[rid[i]] - (double)lse, d = (double)row[rid[i]] - rl[i];
        pr_sum += exp(lr);
        pt_sum += exp(lt);
        c.kl += exp(lr) * (lr - lt);
        c.nle_num += d * d;
        c.nle_den += (double)rl[i] * rl[i];
    }
    double tr = 1 - pr_sum, tt = 1 - pt_sum; // the tail buckets
    if (tr > 1e-12) c.kl += tr * (log(tr) - log(tt > 1e-30 ? tt : 1e-30));
    c.tail = tr;
    return c;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The q-quantile (nearest rank) of x[0..n), or -1 when out of memory.
static double quantile(const double *x, int n, double q) {
    double *s = malloc(sizeof *s * (size_t)n), v;
    if (!s) return -1;
    memcpy(s, x, sizeof *s * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    int rank = (int)ceil(q * n);
    v = s[(rank > 0 ? rank : 1) - 1];
    free(s);
    return v;
}

// Mean, 99.9th percentile and max of the per-position KL; 99th percentile of the logit error.
static void kl_summary(struct score_cmp *c) {
    int P = c->positions;
    double sum = 0, mx = 0;
    for (int i = 0; i < P; i++) sum += c->kl[i], mx = c->kl[i] > mx ? c->kl[i] : mx;
    c->kl_mean = sum / P;
    c->kl_p999 = quantile(c->kl, P, 0.999);
    c->kl_max = mx;
    c->nle_p99 = quantile(c->nle, P, 0.99);
}

// The totals of a comparison from its rows (c->kl allocated, c->positions set).
static void cmp_finish(struct score_cmp *c, const struct row_cmp *rc) {
    const int P = c->positions;
    double num = 0, den = 0;
    for (int p = 0; p < P; p++) {
        double nle = rc[p].nle_den > 0 ? sqrt(rc[p].nle_num / rc[p].nle_den) : 0;
        c->kl[p] = rc[p].kl;
        c->nle[p] = nle;
        c->top1_same += rc[p].same;
        c->n_clear += rc[p].clear;
        c->top1_same_clear += rc[p].clear && rc[p].same;
        c->nle_mean += nle / P;
        c->nle_max = nle > c->nle_max ? nle : c->nle_max;
        c->tail_max = rc[p].tail > c->tail_max ? rc[p].tail : c->tail_max;
        num += rc[p].nle_num;
        den += rc[p].nle_den;
    }
    c->nle_all = den > 0 ? sqrt(num / den) : 0;
    kl_summary(c);
}

// ---- the scoring loop ----------------------------------------------------------------------------

static int run_alloc(struct score_run *r, int n, int K, int V, bool full, char *err, size_t errlen) {
    const size_t P = (size_t)n - 1;
    memset(r, 0, sizeof *r);
    r->n_tokens = n, r->top_k = K, r->vocab = V;
    r->tokens = malloc(sizeof(int32_t) * (size_t)n);
    r->lse = malloc(sizeof(float) * P);
    r->target = malloc(sizeof(float) * P);
    r->top_ids = malloc(sizeof(int32_t) * P * K);
    r->top_logits = malloc(sizeof(float) * P * K);
    r->full = full ? malloc(sizeof(float) * P * V) : NULL;
    if (!r->tokens || !r->lse || !r->target || !r->top_ids || !r->top_logits || (full && !r->full)) {
        score_run_free(r);
        snprintf(err, errlen, "out of memory for %zu positions", P);
        return -1;
    }
    return 0;
}

int score_check_full(int n, char *err, size_t errlen) {
    if (n - 1 > SCORE_FULL_MAX_POSITIONS) {
        snprintf(err, errlen, "--full-logits keeps whole rows: at most %d positions (this sequence has %d)",
                 SCORE_FULL_MAX_POSITIONS, n - 1);
        return -1;
    }
    return 0;
}

int score_check_decode_from(int d, int n, char *err, size_t errlen) {
    if (d < 1 || d >= n) {
        snprintf(err, errlen, "--decode-from %d is out of range: the sequence has %d tokens, so it must be 1..%d", d, n,
                 n - 1);
        return -1;
    }
    return 0;
}

int score_check_reference(const struct score_run *ref, const int32_t *tokens, int n, int V, char *err, size_t errlen) {
    if (ref->vocab != V) {
        snprintf(err, errlen, "reference has a vocabulary of %d, the model %d", ref->vocab, V);
        return -1;
    }
    if (ref->n_tokens != n) {
        snprintf(err, errlen, "reference scored %d tokens, this run %d (the sequences must be the same)", ref->n_tokens,
                 n);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (ref->tokens[i] != tokens[i]) {
            snprintf(err, errlen, "reference token %d is %d, this run's %d (the sequences must be the same)", i,
                     ref->tokens[i], tokens[i]);
            return -1;
        }
    return 0;
}

int score_sequence(struct engine *e, const int32_t *tokens, int n, const struct score_options *o, struct score_run *out,
                   struct score_cmp *cmp, char *err, size_t errlen) {
    const int V = engine_geometry(e)->vocab, K = o->top_k, P = n - 1;
    const int C = o->chunk > 0 ? o->chunk : SCORE_CHUNK_DEFAULT;
    if (check_length(n, "sequence", err, errlen)) return -1;
    if (K < 1 || K > SCORE_TOP_K_MAX) {
        snprintf(err, errlen, "top-k %d is out of range (1 to %d)", K, SCORE_TOP_K_MAX);
        return -1;
    }
    if (o->full_logits && score_check_full(n, err, errlen)) return -1;
    if (o->decode_from && score_check_decode_from(o->decode_from, n, err, errlen)) return -1;
    if (o->ref && score_check_reference(o->ref, tokens, n, V, err, errlen)) return -1;
    if (run_alloc(out, n, K, V, o->full_logits, err, errlen)) return -1;
    snprintf(out->backend, sizeof out->backend, "%s", engine_backend(e));
    out->decode_from = o->decode_from;
    memcpy(out->tokens, tokens, sizeof(int32_t) * (size_t)n);
    struct row_cmp *rc = NULL;
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)(C < P ? C : P));
    int *rows = malloc(sizeof(int) * (size_t)(C < P ? C : P));
    struct seq *s = NULL;
    int status = -1;
    if (o->ref) {
        memset(cmp, 0, sizeof *cmp);
        cmp->positions = P;
        cmp->kl = malloc(sizeof(double) * (size_t)P);
        cmp->nle = malloc(sizeof(double) * (size_t)P);
        rc = malloc(sizeof *rc * (size_t)P);
    }
    if (!logits || !rows || (o->ref && (!cmp->kl || !cmp->nle || !rc))) {
        snprintf(err, errlen, "out of memory (%d rows of %d logits)", C < P ? C : P, V);
        goto out;
    }
    if (seq_new(e, n, &s, err, errlen)) goto out;
    const int prefill_end = o->decode_from ? o->decode_from : P; // positions before it: prefill
    for (int p0 = 0, m; p0 < P; p0 += m) {
        m = p0 >= prefill_end ? 1 : prefill_end - p0 < C ? prefill_end - p0 : C; // 1: a decode step
        for (int i = 0; i < m; i++) rows[i] = i;
        struct forward_opts fo = {.logit_rows = rows, .n_logit_rows = m, .logits = logits};
        int32_t next;
        if (engine_forward(e, s, tokens + p0, m, &fo, &next, err, errlen)) goto out;
        for (int i = 0; i < m; i++) {
            const int p = p0 + i;
            const float *row = logits + (size_t)i * V;
            out->lse[p] = row_top_lse(row, V, K, out->top_ids + (size_t)p * K, out->top_logits + (size_t)p * K);
            out->target[p] = row[tokens[p + 1]];
            if (out->full) memcpy(out->full + (size_t)p * V, row, sizeof(float) * (size_t)V);
            if (o->ref) rc[p] = compare_row(row, out->lse[p], o->ref, p, out->top_ids[(size_t)p * K]);
        }
    }
    if (o->ref) cmp_finish(cmp, rc);
    status = 0;
out:
    seq_free(s);
    free(logits);
    free(rows);
    free(rc);
    if (status) {
        score_run_free(out);
        if (o->ref) score_cmp_free(cmp);
    }
    return status;
}

struct score_totals score_totals_of(const struct score_run *r) {
    struct score_totals t = {.positions = r->n_tokens - 1};
    double sum = 0;
    for (int p = 0; p < t.positions; p++) sum += (double)r->lse[p] - r->target[p];
    t.nll = sum / t.positions;
    t.perplexity = exp(t.nll);
    return t;
}

void score_run_free(struct score_run *r) {
    free(r->tokens);
    free(r->lse);
    free(r->target);
    free(r->top_ids);
    free(r->top_logits);
    free(r->full);
    memset(r, 0, sizeof *r);
}

void score_cmp_free(struct score_cmp *c) {
    free(c->kl);
    free(c->nle);
    c->kl = NULL;
    c->nle = NULL;
}

// ---- JSON --------------------------------------------------------------------------------------------

static void write_floats(FILE *f, const float *x, int n) {
    for (int i = 0; i < n; i++) fprintf(f, i ? ",%.9g" : "%.9g", (double)x[i]);
}

static void write_comparison(FILE *f, const struct score_cmp *c, const char *ref_path) {
    json_t *rp = json_string(ref_path ? ref_path : "");
    char *q = json_dumps(rp, JSON_ENCODE_ANY);
    fprintf(f,
            "  \"comparison\": {\"reference\": %s, \"positions\": %d, \"kl_mean\": %.9g, \"kl_p999\": %.9g, "
            "\"kl_max\": %.9g, \"top1_agree\": %.9g, \"top1_same\": %d, \"clear_margin\": %g, \"n_clear\": %d, "
            "\"top1_agree_clear\": %.9g, \"top1_same_clear\": %d, \"nle_mean\": %.9g, \"nle_p99\": %.9g, "
            "\"nle_max\": %.9g, \"nle_all\": %.9g, \"ref_tail_max\": %.9g},\n",
            q ? q : "\"\"", c->positions, c->kl_mean, c->kl_p999, c->kl_max, (double)c->top1_same / c->positions,
            c->top1_same, SCORE_CLEAR_MARGIN, c->n_clear, c->n_clear ? (double)c->top1_same_clear / c->n_clear : 1.0,
            c->top1_same_clear, c->nle_mean, c->nle_p99, c->nle_max, c->nle_all, c->tail_max);
    free(q);
    json_decref(rp);
}

int score_write_json(const char *path, const struct score_run *r, const struct score_cmp *cmp, const char *ref_path,
                     const char *model_dir, char *err, size_t errlen) {
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    const int P = r->n_tokens - 1, K = r->top_k;
    struct score_totals t = score_totals_of(r);
    json_t *md = json_string(model_dir ? model_dir : "");
    char *mq = json_dumps(md, JSON_ENCODE_ANY);
    fprintf(f, "{\n  \"format\": \"%s\", \"version\": %d, \"producer\": \"calla %s\", \"backend\": \"%s\",\n",
            SCORE_FORMAT, SCORE_VERSION, CALLA_GIT_COMMIT, r->backend);
    fprintf(f, "  \"model\": %s, \"vocab\": %d, \"top_k\": %d, \"n_tokens\": %d,\n", mq ? mq : "\"\"", r->vocab, K,
            r->n_tokens);
    if (r->decode_from) fprintf(f, "  \"decode_from\": %d,\n", r->decode_from);
    free(mq);
    json_decref(md);
    fprintf(f, "  \"totals\": {\"positions\": %d, \"nll\": %.9g, \"perplexity\": %.9g},\n", t.positions, t.nll,
            t.perplexity);
    if (cmp) write_comparison(f, cmp, ref_path);
    fprintf(f, "  \"tokens\": [");
    for (int i = 0; i < r->n_tokens; i++) fprintf(f, i ? ",%d" : "%d", r->tokens[i]);
    fprintf(f, "],\n  \"positions\": [\n");
    for (int p = 0; p < P; p++) {
        fprintf(f, "    {\"lp\": %.9g, \"lse\": %.9g, \"target\": %.9g, ", (double)r->target[p] - r->lse[p],
                (double)r->lse[p], (double)r->target[p]);
        if (cmp) fprintf(f, "\"kl\": %.9g, \"nle\": %.9g, ", cmp->kl[p], cmp->nle[p]);
        fprintf(f, "\"ids\": [");
        for (int k = 0; k < K; k++) fprintf(f, k ? ",%d" : "%d", r->top_ids[(size_t)p * K + k]);
        fprintf(f, "], \"logits\": [");
        write_floats(f, r->top_logits + (size_t)p * K, K);
        fprintf(f, "]");
        if (r->full) {
            fprintf(f, ", \"full\": [");
            write_floats(f, r->full + (size_t)p * r->vocab, r->vocab);
            fprintf(f, "]");
        }
        fprintf(f, "}%s\n", p + 1 < P ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f)) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

// ---- reading a reference -----------------------------------------------------------------------

// An integer member within [lo, hi].
static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *v, const char *where, char *err,
                   size_t errlen) {
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi) {
        snprintf(err, errlen, "%s: \"%s\" must be an integer between %lld and %lld", where, key, lo, hi);
        return -1;
    }
    *v = json_integer_value(x);
    return 0;
}

static int get_number(json_t *o, const char *key, float *v, const char *where, char *err, size_t errlen) {
    json_t *x = json_object_get(o, key);
    if (!json_is_number(x) || !isfinite(json_number_value(x))) {
        snprintf(err, errlen, "%s: \"%s\" must be a finite number", where, key);
        return -1;
    }
    *v = (float)json_number_value(x);
    return 0;
}

// An array of exactly n ids in [0, vocab) (ids) or finite numbers (vals).
static int get_array(json_t *o, const char *key, int n, int vocab, int32_t *ids, float *vals, const char *where,
                     char *err, size_t errlen) {
    json_t *a = json_object_get(o, key);
    if (!json_is_array(a) || (int)json_array_size(a) != n) {
        snprintf(err, errlen, "%s: \"%s\" must be an array of %d %s", where, key, n, ids ? "token ids" : "numbers");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        json_t *x = json_array_get(a, (size_t)i);
        if (ids && (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)) {
            snprintf(err, errlen, "%s: \"%s\"[%d] is not a token id in 0..%d", where, key, i, vocab - 1);
            return -1;
        }
        if (vals && (!json_is_number(x) || !isfinite(json_number_value(x)))) {
            snprintf(err, errlen, "%s: \"%s\"[%d] is not a finite number", where, key, i);
            return -1;
        }
        if (ids)
            ids[i] = (int32_t)json_integer_value(x);
        else
            vals[i] = (float)json_number_value(x);
    }
    return 0;
}

static int read_position(json_t *pos, struct score_run *r, int p, const char *path, char *err, size_t errlen) {
    char where[1100];
    snprintf(where, sizeof where, "%s: positions[%d]", path, p);
    const int K = r->top_k, V = r->vocab;
    if (!json_is_object(pos)) {
        snprintf(err, errlen, "%s: not an object", where);
        return -1;
    }
    if (get_number(pos, "lse", &r->lse[p], where, err, errlen) ||
        get_number(pos, "target", &r->target[p], where, err, errlen) ||
        get_array(pos, "ids", K, V, r->top_ids + (size_t)p * K, NULL, where, err, errlen) ||
        get_array(pos, "logits", K, V, NULL, r->top_logits + (size_t)p * K, where, err, errlen))
        return -1;
    if (r->full && get_array(pos, "full", V, V, NULL, r->full + (size_t)p * V, where, err, errlen)) return -1;
    return 0;
}

int score_read_json(const char *path, struct score_run *r, char *err, size_t errlen) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    memset(r, 0, sizeof *r);
    if (!root) {
        snprintf(err, errlen, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
        return -1;
    }
    int rc = -1;
    long long version, vocab, top_k, n;
    json_t *fmt = json_object_get(root, "format");
    if (!json_is_object(root) || !json_is_string(fmt) || strcmp(json_string_value(fmt), SCORE_FORMAT)) {
        snprintf(err, errlen, "%s: not a score file (\"format\" must be \"%s\")", path, SCORE_FORMAT);
        goto out;
    }
    if (get_int(root, "version", SCORE_VERSION, SCORE_VERSION, &version, path, err, errlen) ||
        get_int(root, "vocab", 2, QWEN_VOCAB, &vocab, path, err, errlen) ||
        get_int(root, "top_k", 1, SCORE_TOP_K_MAX, &top_k, path, err, errlen) ||
        get_int(root, "n_tokens", 2, QWEN_MAX_CTX, &n, path, err, errlen))
        goto out;
    if (top_k > vocab) {
        snprintf(err, errlen, "%s: top_k %lld exceeds the vocabulary %lld", path, top_k, vocab);
        goto out;
    }
    json_t *positions = json_object_get(root, "positions");
    if (!json_is_array(positions) || (long long)json_array_size(positions) != n - 1) {
        snprintf(err, errlen, "%s: \"positions\" must be an array of n_tokens - 1 = %lld entries", path, n - 1);
        goto out;
    }
    bool full = json_object_get(json_array_get(positions, 0), "full") != NULL;
    if (full && n - 1 > SCORE_FULL_MAX_POSITIONS) {
        snprintf(err, errlen, "%s: full rows for %lld positions (at most %d)", path, n - 1, SCORE_FULL_MAX_POSITIONS);
        goto out;
    }
    if (run_alloc(r, (int)n, (int)top_k, (int)vocab, full, err, errlen)) goto out;
    json_t *b = json_object_get(root, "backend");
    snprintf(r->backend, sizeof r->backend, "%s", json_is_string(b) ? json_string_value(b) : "?");
    if (get_array(root, "tokens", (int)n, (int)vocab, r->tokens, NULL, path, err, errlen)) goto out;
    for (int p = 0; p < n - 1; p++)
        if (read_position(json_array_get(positions, (size_t)p), r, p, path, err, errlen)) goto out;
    rc = 0;
out:
    if (rc) score_run_free(r);
    json_decref(root);
    return rc;
}

// ---- the command ---------------------------------------------------------------------------------

void score_print_summary(FILE *f, const struct score_run *r, const struct score_cmp *cmp) {
    struct score_totals t = score_totals_of(r);
    fprintf(f, "positions %d  nll %.6f  perplexity %.4f  (backend %s, top-%d kept)\n", t.positions, t.nll, t.perplexity,
            r->backend, r->top_k);
    if (r->decode_from)
        fprintf(f, "tokens 0..%d fed as prefill; positions %d..%d scored by one-token decode steps\n",
                r->decode_from - 1, r->decode_from, t.positions - 1);
    if (!cmp) return;
    fprintf(f, "vs reference: KL mean %.3e  p99.9 %.3e  max %.3e  (reference tail mass up to %.2e)\n", cmp->kl_mean,
            cmp->kl_p999, cmp->kl_max, cmp->tail_max);
    fprintf(f, "  top-1 agreement %.4f (%d/%d); where the reference margin > %g: %.4f (%d/%d)\n",
            (double)cmp->top1_same / cmp->positions, cmp->top1_same, cmp->positions, SCORE_CLEAR_MARGIN,
            cmp->n_clear ? (double)cmp->top1_same_clear / cmp->n_clear : 1.0, cmp->top1_same_clear, cmp->n_clear);
    fprintf(f, "  normalised logit error: mean %.3e  p99 %.3e  max %.3e  all %.3e\n", cmp->nle_mean, cmp->nle_p99,
            cmp->nle_max, cmp->nle_all);
}

// The sequence from --tokens or --text. 0, or -1 with a message.
static int load_sequence(const char *dir, const char *tokens_path, const char *text_path, int vocab, int32_t **ids,
                         int *n, char *err, size_t errlen) {
    if (tokens_path) return score_read_tokens(tokens_path, vocab, ids, n, err, errlen);
    size_t len;
    char *text = read_small_file(text_path, &len, err, errlen);
    if (!text) return -1;
    struct tokenizer *tok;
    size_t n_ids = 0;
    int rc = tokenizer_load(dir, &tok, err, errlen);
    if (!rc) {
        rc = tokenizer_encode(tok, text, len, ids, &n_ids, err, errlen);
        tokenizer_free(tok);
    }
    free(text);
    if (rc) return -1;
    *n = n_ids > QWEN_MAX_CTX ? QWEN_MAX_CTX + 1 : (int)n_ids;
    if (check_length(*n, text_path, err, errlen)) {
        free(*ids);
        return -1;
    }
    return 0;
}

int cmd_score(int argc, char **argv) {
    const char *dir = NULL, *tokens_path = NULL, *text_path = NULL, *backend = NULL, *json = NULL, *ref_path = NULL;
    long long top_k = SCORE_TOP_K_DEFAULT, chunk = SCORE_CHUNK_DEFAULT, threads = 0, decode_from = 0;
    bool full = false, kv_f32 = false, exact = false;
    const struct opt opts[] = {
        {"model", OPT_STR, &dir, 0, 0, "checkpoint directory"},
        {"tokens", OPT_STR, &tokens_path, 0, 0, "file of token ids (decimal, separated by spaces or commas)"},
        {"text", OPT_STR, &text_path, 0, 0, "file of text, tokenized with the checkpoint's tokenizer"},
        {"backend", OPT_STR, &backend, 0, 0, "cpu or cuda (default: cuda when an sm_90 GPU is present)"},
        {"json", OPT_STR, &json, 0, 0, "write every position and the totals here (the --reference format)"},
        {"top-k", OPT_INT, &top_k, 1, SCORE_TOP_K_MAX, "largest logits kept per position (default 16)"},
        {"reference", OPT_STR, &ref_path, 0, 0, "compare with a run written by --json or tools/device/hf_score.py"},
        {"full-logits", OPT_FLAG, &full, 0, 0, "keep whole rows (at most 256 positions): exact KL in comparisons"},
        {"chunk", OPT_INT, &chunk, 1, QWEN_PREFILL_CHUNK, "tokens per forward call; holds chunk x vocab floats (512)"},
        {"decode-from", OPT_INT, &decode_from, 1, QWEN_MAX_CTX - 1,
         "tokens before N as prefill, each later one alone through the decode path (1 <= N < tokens)"},
        {"threads", OPT_INT, &threads, 0, 1024, "CPU threads (0: all cores)"},
        {"kv-f32", OPT_FLAG, &kv_f32, 0, 0, "CPU backend: fp32 KV cache instead of bf16"},
        {"exact", OPT_FLAG, &exact, 0, 0, "CUDA backend: the verification mode (fp32-level products; CALLA_EXACT=1)"},
    };
    const int nopt = sizeof opts / sizeof opts[0];
    const char *summary =
        "teacher-forced scoring: log-probability of each next token, NLL, perplexity, KL vs a reference";
    int b = opts_begin(argc, argv, "score", summary, opts, nopt);
    if (b) return b > 0 ? 0 : 2;
    char err[1536];
    if (!dir || !!tokens_path + !!text_path != 1) {
        fprintf(stderr, "calla score: --model and one of --tokens, --text are required\n");
        return 2;
    }
    int32_t *ids = NULL;
    int n = 0, rc = 2;
    struct score_run ref = {0}, run = {0};
    struct score_cmp cmp = {0};
    struct engine *e = NULL;
    if (load_sequence(dir, tokens_path, text_path, QWEN_VOCAB, &ids, &n, err, sizeof err) ||
        (ref_path && score_read_json(ref_path, &ref, err, sizeof err)) ||
        (ref_path && score_check_reference(&ref, ids, n, QWEN_VOCAB, err, sizeof err)) ||
        (full && score_check_full(n, err, sizeof err)) ||
        (decode_from && score_check_decode_from((int)decode_from, n, err, sizeof err))) {
        fprintf(stderr, "calla score: %s\n", err);
        goto out;
    }
    rc = 1;
    struct engine_options eo = {.backend = backend, .threads = (int)threads, .kv_f32 = kv_f32, .exact = exact};
    if (engine_open(dir, &eo, &e, err, sizeof err)) {
        fprintf(stderr, "calla score: %s\n", err);
        goto out;
    }
    struct score_options so = {.top_k = (int)top_k,
                               .chunk = (int)chunk,
                               .full_logits = full,
                               .decode_from = (int)decode_from,
                               .ref = ref_path ? &ref : NULL};
    if (score_sequence(e, ids, n, &so, &run, &cmp, err, sizeof err)) {
        fprintf(stderr, "calla score: %s\n", err);
        goto out;
    }
    score_print_summary(stdout, &run, ref_path ? &cmp : NULL);
    if (json && score_write_json(json, &run, ref_path ? &cmp : NULL, ref_path, dir, err, sizeof err)) {
        fprintf(stderr, "calla score: %s\n", err);
        goto out;
    }
    rc = 0;
out:
    engine_close(e);
    score_run_free(&run);
    score_run_free(&ref);
    score_cmp_free(&cmp);
    free(ids);
    return rc;
}
