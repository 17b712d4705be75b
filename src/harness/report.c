// report.c: a results folder of bench records -> report.md + two SVG plots (docs/BENCH.md "The matrix runner").
//
// Records are grouped into cells (arm label x prompt tokens); each figure in a table is the
// median over the cell's rounds with its spread (min–max). Baselines are other arms in the same
// folder, the arms of another results folder (--compare) and the rows of a reference table
// (--reference, e.g. bench/reference/lily_m5.json: the reference report's M5 Pro and M5 Max rows).
//
// Sections: run log, identity, determinism, sweep tables, ratio tables, the straight-line fit of
// decode ms/token against context, prefill scaling per doubling, step drift, memory, telemetry;
// then the conversation benchmark's records, if any (report_agent.c).
#include "report.h"

#include "agentbench.h"
#include "bench.h"
#include "commands.h"
#include "options.h"

#include <dirent.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_ARMS = 24, MAX_CTX = 32, MAX_ROUNDS = 16 };

// Per-round figures of one record (NAN when the record does not have it).
struct run {
    double prefill_s, prefill_tps, decode_tps, ms_token, ms_first, ms_first16, ms_last16, ms_std;
    double gb_s, tflop_s, dev_peak, rss;
    char hash[24];
    int distinct; // distinct generated ids (-1: unknown)
    const json_t *rec;
};

struct cell {
    int ctx;
    int n;
    struct run runs[MAX_ROUNDS];
};

struct arm {
    char label[96];
    char origin[32]; // "run", "compare", "reference"
    char first_date[32];
    int n_cells;
    struct cell cells[MAX_CTX]; // ascending ctx
};

struct book {
    struct arm arms[MAX_ARMS];
    int n_arms;
    json_t *owned[512]; // loaded records (kept alive for rec pointers)
    int n_owned;
};

// ---- statistics ----------------------------------------------------------------------------

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Median, min and max over the finite values of field at byte offset off in the cell's runs.
struct stat {
    double med, min, max;
    int n;
};

static struct stat cell_stat(const struct cell *c, size_t off) {
    // Over several rounds, ms/token and prefill tok/s are the reciprocals of the median decode
    // tok/s and prefill time, so each table row stays self-consistent (1000 / tok/s; N / time).
    if (c->n > 1 && (off == offsetof(struct run, ms_token) || off == offsetof(struct run, prefill_tps))) {
        bool ms = off == offsetof(struct run, ms_token);
        struct stat b = cell_stat(c, ms ? offsetof(struct run, decode_tps) : offsetof(struct run, prefill_s));
        double k = ms ? 1e3 : c->ctx;
        struct stat d = {k / b.med, k / b.max, k / b.min, b.n};
        return d;
    }
    double v[MAX_ROUNDS];
    int k = 0;
    for (int i = 0; i < c->n; i++) {
        double x = *(const double *)((const char *)&c->runs[i] + off);
        if (isfinite(x)) v[k++] = x;
    }
    struct stat s = {NAN, NAN, NAN, k};
    if (!k) return s;
    qsort(v, (size_t)k, sizeof *v, cmp_d);
    s.min = v[0], s.max = v[k - 1];
    s.med = k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
    return s;
}
#define STAT(c, field) cell_stat((c), offsetof(struct run, field))

// ---- loading -------------------------------------------------------------------------------

static struct arm *arm_get(struct book *b, const char *label, const char *origin) {
    for (int i = 0; i < b->n_arms; i++)
        if (!strcmp(b->arms[i].label, label) && !strcmp(b->arms[i].origin, origin)) return &b->arms[i];
    if (b->n_arms == MAX_ARMS) return NULL;
    struct arm *a = &b->arms[b->n_arms++];
    memset(a, 0, sizeof *a);
    snprintf(a->label, sizeof a->label, "%s", label);
    snprintf(a->origin, sizeof a->origin, "%s", origin);
    return a;
}

static struct cell *cell_get(struct arm *a, int ctx) {
    int i = 0;
    while (i < a->n_cells && a->cells[i].ctx < ctx) i++;
    if (i < a->n_cells && a->cells[i].ctx == ctx) return &a->cells[i];
    if (a->n_cells == MAX_CTX) return NULL;
    memmove(&a->cells[i + 1], &a->cells[i], sizeof a->cells[0] * (size_t)(a->n_cells - i));
    a->n_cells++;
    memset(&a->cells[i], 0, sizeof a->cells[i]);
    a->cells[i].ctx = ctx;
    return &a->cells[i];
}

static void run_from_record(struct run *r, const json_t *j) {
    r->rec = j;
    r->prefill_s = json_num(j, "prefill.seconds");
    r->prefill_tps = json_num(j, "prefill.tok_s");
    r->decode_tps = json_num(j, "decode.tok_s");
    r->ms_token = isfinite(r->decode_tps) && r->decode_tps > 0 ? 1e3 / r->decode_tps : NAN;
    r->ms_first = json_num(j, "decode.ms_first");
    r->ms_first16 = json_num(j, "decode.ms_first16");
    r->ms_last16 = json_num(j, "decode.ms_last16");
    r->ms_std = json_num(j, "decode.ms_std");
    r->gb_s = json_num(j, "decode.gb_s");
    r->tflop_s = json_num(j, "prefill.tflop_s");
    r->dev_peak = json_num(j, "memory.device_peak_bytes");
    r->rss = json_num(j, "memory.host_peak_rss_bytes");
    const char *h = json_str(j, "tokens.hash");
    snprintf(r->hash, sizeof r->hash, "%s", h ? h : "");
    r->distinct = -1;
    const json_t *ids = json_object_get(json_object_get(j, "tokens"), "ids");
    if (json_is_array(ids)) {
        size_t n = json_array_size(ids);
        long long *v = malloc(sizeof *v * (n ? n : 1));
        if (v) {
            int d = 0;
            for (size_t i = 0; i < n; i++) {
                long long x = json_integer_value(json_array_get(ids, i));
                bool seen = false;
                for (int k = 0; k < d && !seen; k++) seen = v[k] == x;
                if (!seen) v[d++] = x;
            }
            r->distinct = d;
            free(v);
        }
    }
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// Loads every bench record of dir as arms of the given origin; label suffix appended when set.
static int load_dir(struct book *b, const char *dir, const char *origin, const char *suffix, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) return snprintf(err, errlen, "cannot open results folder %s", dir), -1;
    char *names[1024];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 1024) {
        size_t len = strlen(de->d_name);
        if (len > 5 && !strcmp(de->d_name + len - 5, ".json")) names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_name);
    int loaded = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        free(names[i]);
        json_error_t je;
        json_t *j = json_load_file(path, 0, &je);
        const char *schema = j ? json_str(j, "schema") : NULL;
        if (!schema || strcmp(schema, BENCH_SCHEMA) || b->n_owned == (int)(sizeof b->owned / sizeof b->owned[0])) {
            json_decref(j);
            continue;
        }
        b->owned[b->n_owned++] = j;
        char label[96];
        const char *l = json_str(j, "label");
        snprintf(label, sizeof label, "%s%s", l ? l : "unlabelled", suffix ? suffix : "");
        struct arm *a = arm_get(b, label, origin);
        int ctx = (int)json_num(j, "prompt.tokens");
        struct cell *c = a ? cell_get(a, ctx) : NULL;
        if (!c || c->n == MAX_ROUNDS) continue;
        run_from_record(&c->runs[c->n++], j);
        const char *date = json_str(j, "date");
        if (date && (!a->first_date[0] || strcmp(date, a->first_date) < 0))
            snprintf(a->first_date, sizeof a->first_date, "%s", date);
        loaded++;
    }
    return loaded;
}

// Reference table: {"arms": [{"label", "rows": [{prompt_tokens, prefill_s?, prefill_tok_s?,
// decode_tok_s?, ms_per_token?, ms_first16?, ms_last16?, ms_std?, ms_first?}]}]}
static int load_reference(struct book *b, const char *path, json_t **keep, char *err, size_t errlen) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) return snprintf(err, errlen, "%s: %s (line %d)", path, je.text, je.line), -1;
    *keep = j;
    const json_t *arms = json_object_get(j, "arms");
    if (!json_is_array(arms)) return snprintf(err, errlen, "%s: no \"arms\" array", path), -1;
    for (size_t i = 0; i < json_array_size(arms); i++) {
        const json_t *aj = json_array_get(arms, i);
        const char *label = json_str(aj, "label");
        const json_t *rows = json_object_get(aj, "rows");
        struct arm *a = label ? arm_get(b, label, "reference") : NULL;
        if (!a || !json_is_array(rows)) continue;
        for (size_t k = 0; k < json_array_size(rows); k++) {
            const json_t *row = json_array_get(rows, k);
            int ctx = (int)json_num(row, "prompt_tokens");
            struct cell *c = ctx > 0 ? cell_get(a, ctx) : NULL;
            if (!c || c->n) continue;
            struct run *r = &c->runs[c->n++];
            memset(r, 0, sizeof *r);
            r->prefill_tps = json_num(row, "prefill_tok_s");
            r->prefill_s = json_num(row, "prefill_s");
            if (!isfinite(r->prefill_s) && isfinite(r->prefill_tps)) r->prefill_s = ctx / r->prefill_tps;
            r->decode_tps = json_num(row, "decode_tok_s");
            r->ms_token = json_num(row, "ms_per_token");
            if (!isfinite(r->ms_token) && isfinite(r->decode_tps)) r->ms_token = 1e3 / r->decode_tps;
            r->ms_first = json_num(row, "ms_first");
            r->ms_first16 = json_num(row, "ms_first16");
            r->ms_last16 = json_num(row, "ms_last16");
            r->ms_std = json_num(row, "ms_std");
            r->gb_s = r->tflop_s = r->dev_peak = r->rss = NAN;
            r->distinct = -1;
        }
    }
    return 0;
}

// ---- formatting ----------------------------------------------------------------------------

static void fmt_num(char *buf, size_t len, double v, int decimals) {
    if (!isfinite(v)) {
        snprintf(buf, len, "–");
        return;
    }
    // thousands separators for the integer part, like the reference report's tables
    char raw[64];
    snprintf(raw, sizeof raw, "%.*f", decimals, fabs(v));
    char *dot = strchr(raw, '.');
    size_t ilen = dot ? (size_t)(dot - raw) : strlen(raw), k = 0;
    if (v < 0 && k + 1 < len) buf[k++] = '-';
    for (size_t i = 0; i < ilen && k + 2 < len; i++) {
        buf[k++] = raw[i];
        if ((ilen - i - 1) % 3 == 0 && i + 1 < ilen) buf[k++] = ',';
    }
    snprintf(buf + k, len - k, "%s", dot ? dot : "");
}

static void fmt_stat(char *buf, size_t len, struct stat s, int decimals) {
    char a[40], lo[40], hi[40];
    fmt_num(a, sizeof a, s.med, decimals);
    if (s.n < 2) {
        snprintf(buf, len, "%s", a);
        return;
    }
    fmt_num(lo, sizeof lo, s.min, decimals);
    fmt_num(hi, sizeof hi, s.max, decimals);
    snprintf(buf, len, "%s (%s–%s)", a, lo, hi);
}

static void fmt_duration(char *buf, size_t len, double s) {
    if (!isfinite(s))
        snprintf(buf, len, "–");
    else if (s < 1)
        snprintf(buf, len, "%.1f ms", s * 1e3);
    else if (s < 60)
        snprintf(buf, len, "%.2f s", s);
    else
        snprintf(buf, len, "%d min %d s", (int)(s / 60), (int)fmod(s, 60));
}

static void fmt_ratio(char *buf, size_t len, double a, double b) {
    if (isfinite(a) && isfinite(b) && b > 0)
        snprintf(buf, len, "%.2fx", a / b);
    else
        snprintf(buf, len, "–");
}

static int decimals_for(double v) {
    return !isfinite(v) ? 1 : fabs(v) >= 100 ? 1 : fabs(v) >= 1 ? 2 : 4;
}

static const struct cell *find_cell(const struct arm *a, int ctx) {
    for (int i = 0; i < a->n_cells; i++)
        if (a->cells[i].ctx == ctx) return &a->cells[i];
    return NULL;
}

// ---- sections ------------------------------------------------------------------------------

static bool arm_is_calla(const struct arm *a);

static void section_sweep(FILE *f, const struct arm *a) {
    fprintf(f, "### %s\n\n", a->label);
    double peak = a->n_cells && a->cells[0].runs[0].rec ? json_num(a->cells[0].runs[0].rec, "device.peak_gbs") : NAN;
    fprintf(f, "| Prompt tokens | Prefill time | Prefill tok/s | Decode tok/s | Decode ms/token | Decode GB/s | "
               "%% of peak GB/s | Prefill TFLOP/s | Rounds |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < a->n_cells; i++) {
        const struct cell *c = &a->cells[i];
        struct stat pt = STAT(c, prefill_s), ptps = STAT(c, prefill_tps), dtps = STAT(c, decode_tps),
                    ms = STAT(c, ms_token), gb = STAT(c, gb_s), tf = STAT(c, tflop_s);
        char ctx[32], t[128], tlo[32], thi[32], b1[160], b2[160], b3[160], b4[160], b5[160];
        fmt_num(ctx, sizeof ctx, c->ctx, 0);
        fmt_duration(t, sizeof t, pt.med);
        if (pt.n > 1) {
            fmt_duration(tlo, sizeof tlo, pt.min);
            fmt_duration(thi, sizeof thi, pt.max);
            size_t l = strlen(t);
            snprintf(t + l, sizeof t - l, " (%s–%s)", tlo, thi);
        }
        fmt_stat(b1, sizeof b1, ptps, 1);
        fmt_stat(b2, sizeof b2, dtps, decimals_for(dtps.med));
        fmt_stat(b3, sizeof b3, ms, ms.med < 100 ? 3 : 1);
        fmt_stat(b4, sizeof b4, gb, decimals_for(gb.med));
        fmt_stat(b5, sizeof b5, tf, decimals_for(tf.med) + 1);
        char pk[32] = "–";
        if (isfinite(peak) && peak > 0 && isfinite(gb.med)) snprintf(pk, sizeof pk, "%.0f%%", 100 * gb.med / peak);
        fprintf(f, "| %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", ctx, t, b1, b2, b3, b4, pk, b5, c->n);
    }
    fprintf(f, "\n");
}

static int fit_line(const struct arm *a, double *icpt, double *slope);

static void section_ratio(FILE *f, const struct arm *a, const struct arm *b) {
    int shared = 0;
    for (int i = 0; i < a->n_cells; i++) shared += find_cell(b, a->cells[i].ctx) != NULL;
    if (!shared) return;
    fprintf(f, "#### %s / %s\n\n", a->label, b->label);
    fprintf(f,
            "| Context | %s decode | %s decode | ratio | %s prefill | %s prefill | ratio |\n"
            "|---:|---:|---:|---:|---:|---:|---:|\n",
            a->label, b->label, a->label, b->label);
    for (int i = 0; i < a->n_cells; i++) {
        const struct cell *ca = &a->cells[i], *cb = find_cell(b, ca->ctx);
        if (!cb) continue;
        struct stat da = STAT(ca, decode_tps), db = STAT(cb, decode_tps), pa = STAT(ca, prefill_tps),
                    pb = STAT(cb, prefill_tps);
        char ctx[32], s1[48], s2[48], s3[48], s4[48], r1[32], r2[32];
        fmt_num(ctx, sizeof ctx, ca->ctx, 0);
        fmt_num(s1, sizeof s1, da.med, 1);
        fmt_num(s2, sizeof s2, db.med, 1);
        fmt_num(s3, sizeof s3, pa.med, 1);
        fmt_num(s4, sizeof s4, pb.med, 1);
        fmt_ratio(r1, sizeof r1, da.med, db.med);
        fmt_ratio(r2, sizeof r2, pa.med, pb.med);
        fprintf(f, "| %s | %s | %s | %s | %s | %s | %s |\n", ctx, s1, s2, r1, s3, s4, r2);
    }
    fprintf(f, "\n");
    if (shared < 2) return;
    // the straight-line fit over the shared contexts only, as the reference report does
    struct arm *sa = calloc(2, sizeof *sa);
    if (!sa) return;
    for (int i = 0; i < a->n_cells; i++) {
        const struct cell *cb = find_cell(b, a->cells[i].ctx);
        if (!cb) continue;
        sa[0].cells[sa[0].n_cells++] = a->cells[i];
        sa[1].cells[sa[1].n_cells++] = *cb;
    }
    double ia, sla, ib, slb;
    fit_line(&sa[0], &ia, &sla);
    fit_line(&sa[1], &ib, &slb);
    free(sa);
    char r1[32], r2[32];
    fmt_ratio(r1, sizeof r1, ia, ib);
    fmt_ratio(r2, sizeof r2, sla, slb);
    fprintf(f,
            "| Fit over the %d shared contexts | Fixed (intercept) | Per 1K tokens of context |\n|---|---:|---:|\n"
            "| %s | %.3f ms | %.4f ms |\n| %s | %.3f ms | %.4f ms |\n| ratio | %s | %s |\n\n",
            shared, a->label, ia, sla, b->label, ib, slb, r1, r2);
}

// Least squares ms/token = a + b * (context / 1,000). Returns the number of points.
static int fit_line(const struct arm *a, double *icpt, double *slope) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int n = 0;
    for (int i = 0; i < a->n_cells; i++) {
        double y = STAT(&a->cells[i], ms_token).med, x = a->cells[i].ctx / 1000.0;
        if (!isfinite(y)) continue;
        sx += x, sy += y, sxx += x * x, sxy += x * y, n++;
    }
    *icpt = *slope = NAN;
    if (n < 2 || n * sxx - sx * sx == 0) return n;
    *slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    *icpt = (sy - *slope * sx) / n;
    return n;
}

static void section_fit(FILE *f, struct arm *const *arms, int n) {
    fprintf(f, "| Arm | Fixed (intercept) | Per 1K tokens of context | Points |\n|---|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        double a, b;
        int k = fit_line(arms[i], &a, &b);
        if (k < 2)
            fprintf(f, "| %s | – | – | %d |\n", arms[i]->label, k);
        else
            fprintf(f, "| %s | %.3f ms | %.4f ms | %d |\n", arms[i]->label, a, b, k);
    }
    fprintf(f, "\n");
}

static void section_scaling(FILE *f, const struct arm *a) {
    if (a->n_cells < 2) return;
    fprintf(f, "| %s | Context ratio | Prefill time ratio | Per doubling |\n|---|---:|---:|---:|\n", a->label);
    for (int i = 1; i < a->n_cells; i++) {
        const struct cell *p = &a->cells[i - 1], *c = &a->cells[i];
        double t0 = STAT(p, prefill_s).med, t1 = STAT(c, prefill_s).med, cr = (double)c->ctx / p->ctx;
        char from[32], to[32];
        fmt_num(from, sizeof from, p->ctx, 0);
        fmt_num(to, sizeof to, c->ctx, 0);
        if (!isfinite(t0) || !isfinite(t1) || t0 <= 0)
            fprintf(f, "| %s → %s | %.2fx | – | – |\n", from, to, cr);
        else
            fprintf(f, "| %s → %s | %.2fx | %.2fx | %.2fx |\n", from, to, cr, t1 / t0, pow(t1 / t0, 1.0 / log2(cr)));
    }
    fprintf(f, "\n");
}

static void section_drift(FILE *f, const struct arm *a) {
    bool any = false;
    for (int i = 0; i < a->n_cells && !any; i++) any = isfinite(STAT(&a->cells[i], ms_first16).med);
    if (!any) return;
    fprintf(f,
            "| %s | First step ms | First 16 mean ms | Last 16 mean ms | Last/first 16 | Std ms |\n"
            "|---|---:|---:|---:|---:|---:|\n",
            a->label);
    for (int i = 0; i < a->n_cells; i++) {
        const struct cell *c = &a->cells[i];
        double f16 = STAT(c, ms_first16).med, l16 = STAT(c, ms_last16).med;
        char ctx[32], s1[48], s2[48], s3[48], s4[48], s5[32];
        fmt_num(ctx, sizeof ctx, c->ctx, 0);
        fmt_num(s1, sizeof s1, STAT(c, ms_first).med, 3);
        fmt_num(s2, sizeof s2, f16, 3);
        fmt_num(s3, sizeof s3, l16, 3);
        fmt_num(s4, sizeof s4, STAT(c, ms_std).med, 3);
        if (isfinite(f16) && isfinite(l16) && f16 > 0)
            snprintf(s5, sizeof s5, "%+.1f%%", 100 * (l16 / f16 - 1));
        else
            snprintf(s5, sizeof s5, "–");
        fprintf(f, "| %s | %s | %s | %s | %s | %s |\n", ctx, s1, s2, s3, s5, s4);
    }
    fprintf(f, "\n");
}

// Determinism: every round of a cell must produce the same token hash. Returns differing cells.
static int section_determinism(FILE *f, struct arm *const *arms, int n) {
    int bad = 0;
    fprintf(f, "| Arm | Context | Rounds | Output hash | Distinct ids | Across rounds |\n"
               "|---|---:|---:|---|---:|---|\n");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < arms[i]->n_cells; k++) {
            const struct cell *c = &arms[i]->cells[k];
            bool same = true, known = c->runs[0].hash[0] != 0;
            for (int r = 1; r < c->n; r++) same = same && !strcmp(c->runs[r].hash, c->runs[0].hash);
            char ctx[32];
            fmt_num(ctx, sizeof ctx, c->ctx, 0);
            const char *verdict = !known     ? "no token ids (external engine)"
                                  : c->n < 2 ? "one round: unchecked"
                                  : same     ? "identical"
                                             : "**DIFFERS: flagged, not averaged as reproducible**";
            if (known && c->n > 1 && !same) bad++;
            char distinct[16] = "–";
            if (c->runs[0].distinct >= 0) snprintf(distinct, sizeof distinct, "%d", c->runs[0].distinct);
            fprintf(f, "| %s | %s | %d | %s%s | %s | %s |\n", arms[i]->label, ctx, c->n, known ? c->runs[0].hash : "–",
                    known && !same ? " …" : "", distinct, verdict);
        }
    fprintf(f, "\n");
    return bad;
}

// A targets file (bench/targets/*.json, schema calla.targets/1): figures with their limits,
// checked for every Calla arm measured on a device of the file's device_kind. The numbers live
// in the file, not here.
static const struct {
    const char *name;
    size_t off;
} target_metrics[] = {
    {"decode_tok_s", offsetof(struct run, decode_tps)},
    {"prefill_s", offsetof(struct run, prefill_s)},
    {"device_peak_bytes", offsetof(struct run, dev_peak)},
};

// The cell a target row names: "context" exactly, or the largest of at least "context_at_least".
static const struct cell *target_cell(const struct arm *a, const json_t *row) {
    const double exact = json_num(row, "context"), least = json_num(row, "context_at_least");
    if (isfinite(exact)) return find_cell(a, (int)exact);
    const struct cell *c = NULL;
    for (int k = 0; isfinite(least) && k < a->n_cells; k++)
        if (a->cells[k].ctx >= least) c = &a->cells[k];
    return c;
}

// Loads and checks a targets file into *out; path NULL: the "targets" that `calla matrix` copied
// into dir/matrix.json, if any (*out stays NULL without them).
static int load_targets(const char *path, const char *dir, json_t **out, char *err, size_t errlen) {
    json_error_t je;
    json_t *j;
    char mpath[4096];
    if (!path) {
        snprintf(mpath, sizeof mpath, "%s/matrix.json", dir);
        json_t *m = json_load_file(mpath, 0, NULL);
        j = json_incref(json_object_get(m, "targets"));
        json_decref(m);
        if (!j) return 0;
        path = mpath;
    } else if (!(j = json_load_file(path, 0, &je))) {
        return snprintf(err, errlen, "%s: %s (line %d)", path, je.text, je.line), -1;
    }
    const json_t *rows = json_object_get(j, "targets");
    const char *bad = !json_is_array(rows)          ? "no \"targets\" array"
                      : !json_str(j, "device_kind") ? "no \"device_kind\""
                                                    : NULL;
    for (size_t k = 0; !bad && k < json_array_size(rows); k++) {
        const json_t *r = json_array_get(rows, k);
        const char *m = json_str(r, "metric");
        size_t i = 0;
        while (m && i < sizeof target_metrics / sizeof target_metrics[0] && strcmp(m, target_metrics[i].name)) i++;
        if (!m || i == sizeof target_metrics / sizeof target_metrics[0])
            bad = "a target with an unknown metric";
        else if (!json_str(r, "figure") || !json_str(r, "target") || !json_str(r, "unit") ||
                 !isfinite(json_num(r, "scale")))
            bad = "a target without figure, target, unit or scale";
        else if (isfinite(json_num(r, "at_least")) == isfinite(json_num(r, "at_most")))
            bad = "a target with neither or both of at_least, at_most";
        else if (!isfinite(json_num(r, "context")) && !isfinite(json_num(r, "context_at_least")))
            bad = "a target without context or context_at_least";
    }
    if (bad) {
        json_decref(j);
        return snprintf(err, errlen, "%s: %s", path, bad), -1;
    }
    *out = j;
    return 0;
}

static void section_targets(FILE *f, const json_t *targets, struct arm *const *arms, int n) {
    if (!targets) return;
    const json_t *rows = json_object_get(targets, "targets");
    const char *want_kind = json_str(targets, "device_kind"), *title = json_str(targets, "title");
    bool header = false;
    for (int i = 0; i < n; i++) {
        const json_t *r0 = arms[i]->cells[0].runs[0].rec;
        const char *kind = json_str(r0, "device.kind");
        if (!arm_is_calla(arms[i]) || !kind || strcmp(kind, want_kind)) continue;
        if (!header)
            fprintf(f, "## Targets (%s)\n\n| Arm | Figure | Target | Measured | Met |\n|---|---|---:|---:|---|\n",
                    title ? title : "targets");
        header = true;
        for (size_t k = 0; k < json_array_size(rows); k++) {
            const json_t *row = json_array_get(rows, k);
            const char *metric = json_str(row, "metric");
            size_t off = 0;
            for (size_t m = 0; m < sizeof target_metrics / sizeof target_metrics[0]; m++)
                if (!strcmp(metric, target_metrics[m].name)) off = target_metrics[m].off;
            const struct cell *c = target_cell(arms[i], row);
            const double least = json_num(row, "at_least"), most = json_num(row, "at_most");
            double v = c ? cell_stat(c, off).med : NAN;
            const char *met = !isfinite(v)                                 ? "not measured"
                              : (isfinite(least) ? v >= least : v <= most) ? "yes"
                                                                           : "**no**";
            char val[48];
            fmt_num(val, sizeof val, v * json_num(row, "scale"), 2);
            fprintf(f, "| %s | %s | %s | %s %s | %s |\n", arms[i]->label, json_str(row, "figure"),
                    json_str(row, "target"), val, isfinite(v) ? json_str(row, "unit") : "", met);
        }
        bool same = true, checked = false;
        for (int k = 0; k < arms[i]->n_cells; k++) {
            const struct cell *c = &arms[i]->cells[k];
            for (int r = 1; r < c->n; r++) checked = true, same = same && !strcmp(c->runs[r].hash, c->runs[0].hash);
        }
        fprintf(f, "| %s | greedy output across rounds | bit-identical | %s | %s |\n", arms[i]->label,
                checked ? (same ? "identical" : "differs") : "one round", checked ? (same ? "yes" : "**no**") : "–");
    }
    if (header) fprintf(f, "\n");
}

static void section_memory(FILE *f, struct arm *const *arms, int n) {
    fprintf(f, "| Arm | Context | Peak device memory (GB) | Peak host RSS (GB) | KV cache (GB, computed) |\n"
               "|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < arms[i]->n_cells; k++) {
            const struct cell *c = &arms[i]->cells[k];
            struct stat dev = STAT(c, dev_peak), rss = STAT(c, rss);
            char ctx[32], s1[256], s2[160], s3[48];
            fmt_num(ctx, sizeof ctx, c->ctx, 0);
            struct stat dg = {dev.med / 1e9, dev.min / 1e9, dev.max / 1e9, dev.n};
            struct stat rg = {rss.med / 1e9, rss.min / 1e9, rss.max / 1e9, rss.n};
            fmt_stat(s1, sizeof s1, dg, 3);
            fmt_stat(s2, sizeof s2, rg, 3);
            fmt_num(s3, sizeof s3, json_num(c->runs[0].rec, "kv_cache_bytes") / 1e9, 3);
            if (!isfinite(dev.med)) {
                const char *why = json_str(c->runs[0].rec, "memory.device_reason");
                snprintf(s1, sizeof s1, "n/a (%s)", why ? why : "not measured");
            }
            fprintf(f, "| %s | %s | %s | %s | %s |\n", arms[i]->label, ctx, s1, s2, s3);
        }
    fprintf(f, "\n");
}

static void telemetry_cell(char *buf, size_t len, const json_t *t) {
    if (!t)
        snprintf(buf, len, "–");
    else if (!json_is_true(json_object_get(t, "available")))
        snprintf(buf, len, "unavailable");
    else
        snprintf(buf, len, "%.0f °C, %.0f MHz, %.0f W, %s", json_num(t, "temperature_c"), json_num(t, "sm_clock_mhz"),
                 json_num(t, "power_w"), json_str(t, "throttle_reasons") ? json_str(t, "throttle_reasons") : "?");
}

static void section_telemetry(FILE *f, struct arm *const *arms, int n) {
    fprintf(f, "| Arm | Context | Round | Before (temp, SM clock, power, reasons) | After |\n"
               "|---|---:|---:|---|---|\n");
    const char *why = NULL;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < arms[i]->n_cells; k++)
            for (int r = 0; r < arms[i]->cells[k].n; r++) {
                const json_t *rec = arms[i]->cells[k].runs[r].rec, *tel = json_object_get(rec, "telemetry");
                char b[256], a[256], ctx[32];
                telemetry_cell(b, sizeof b, json_object_get(tel, "before"));
                telemetry_cell(a, sizeof a, json_object_get(tel, "after"));
                if (!why) why = json_str(tel, "before.reason");
                fmt_num(ctx, sizeof ctx, arms[i]->cells[k].ctx, 0);
                fprintf(f, "| %s | %s | %d | %s | %s |\n", arms[i]->label, ctx, r + 1, b, a);
            }
    if (why) fprintf(f, "\nNVML unavailable: %s.\n", why);
    fprintf(f, "\n");
}

static void section_identity(FILE *f, struct arm *const *arms, int n) {
    fprintf(f, "| Arm | Engine | Source | Device | Driver | Checkpoint | Date |\n|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        const json_t *r = arms[i]->cells[0].runs[0].rec;
        const json_t *dirty = json_object_get(json_object_get(r, "engine"), "dirty");
        const char *commit = json_str(r, "engine.commit");
        char src[96];
        snprintf(src, sizeof src, "%.12s%s", commit ? commit : "unknown",
                 json_is_true(dirty)    ? " (dirty)"
                 : json_is_false(dirty) ? ""
                                        : " (dirty flag unknown)");
        const char *eng = json_str(r, "engine.name"), *be = json_str(r, "engine.backend"),
                   *mode = json_str(r, "engine.mode"); // absent in older records and other engines'
        const char *dev = json_str(r, "device.name"), *drv = json_str(r, "device.driver");
        const char *geo = json_str(r, "checkpoint.geometry"), *id = json_str(r, "checkpoint.identity");
        fprintf(f, "| %s | %s %s%s%s | %s | %s | %s | %s %s | %s |\n", arms[i]->label, eng ? eng : "?", be ? be : "",
                mode ? ", " : "", mode ? mode : "", src, dev ? dev : "?", drv ? drv : "–", geo ? geo : "?",
                id ? id : "", arms[i]->first_date);
    }
    fprintf(f, "\n");
}

// ---- SVG -----------------------------------------------------------------------------------

static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

static double nice_step(double range) {
    double raw = range / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

// One chart: y = field of each arm's cell medians against the context (log2 x axis when the
// contexts span more than 8x).
static int write_svg(const char *path, const char *title, const char *ylabel, size_t off, struct arm *const *arms,
                     int n) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const double W = 760, H = 440, L = 80, R = 200, T = 40, B = 60;
    double xmin = INFINITY, xmax = -INFINITY, ymax = 0, ymin = INFINITY;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < arms[i]->n_cells; k++) {
            double y = cell_stat(&arms[i]->cells[k], off).med;
            if (!isfinite(y)) continue;
            xmin = fmin(xmin, arms[i]->cells[k].ctx), xmax = fmax(xmax, arms[i]->cells[k].ctx);
            ymax = fmax(ymax, y);
            if (y > 0) ymin = fmin(ymin, y);
        }
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">%s</text>\n", (W - R + L) / 2, title);
    if (!isfinite(xmin) || ymax <= 0) {
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">no data</text>\n</svg>\n", W / 2, H / 2);
        fclose(f);
        return 0;
    }
    bool logx = xmax / xmin > 8;
    if (xmax == xmin) xmin *= 0.5, xmax *= 1.5;
    double lx0 = logx ? log2(xmin) : xmin, lx1 = logx ? log2(xmax) : xmax, pad = (lx1 - lx0) * 0.05;
    lx0 -= pad, lx1 += pad;
    // log y when the arms differ by more than 20x (an H200 beside an M5), else linear from 0
    bool logy = ymax / ymin > 20;
    double ystep = nice_step(ymax * 1.1), ytop = ceil(ymax * 1.1 / ystep) * ystep, ybot = 0;
    if (logy) ybot = floor(log10(ymin)), ytop = ceil(log10(ymax)), ystep = 1;
#define PX(x)  (L + ((logx ? log2(x) : (x)) - lx0) / (lx1 - lx0) * (W - L - R))
#define PYV(v) (H - B - ((v)-ybot) / (ytop - ybot) * (H - T - B))
#define PY(y)  PYV(logy ? log10(y) : (y))
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L, H - B);
    for (double v = ybot; v <= ytop + ystep / 2; v += ystep) {
        double y = logy ? pow(10, v) : v;
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, PYV(v), W - R,
                PYV(v));
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L - 6, PYV(v) + 4, y);
    }
    // x ticks at every context that has data
    double ticks[MAX_CTX * MAX_ARMS];
    int nt = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < arms[i]->n_cells; k++) {
            bool seen = false;
            for (int t = 0; t < nt && !seen; t++) seen = ticks[t] == arms[i]->cells[k].ctx;
            if (!seen) ticks[nt++] = arms[i]->cells[k].ctx;
        }
    for (int t = 0; t < nt; t++) {
        char lab[32];
        if (ticks[t] >= 1024)
            snprintf(lab, sizeof lab, "%.0fK", ticks[t] / 1024);
        else
            snprintf(lab, sizeof lab, "%.0f", ticks[t]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"black\"/>\n", PX(ticks[t]), H - B,
                PX(ticks[t]), H - B + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n", PX(ticks[t]), H - B + 18, lab);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">prompt tokens (context)%s</text>\n", (W - R + L) / 2,
            H - 18, logx ? ", log scale" : "");
    fprintf(f, "<text x=\"18\" y=\"%.0f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.0f)\">%s%s</text>\n",
            (H - B + T) / 2, (H - B + T) / 2, ylabel, logy ? " (log scale)" : "");
    for (int i = 0; i < n; i++) {
        const char *col = colors[i % 8];
        bool dashed = !strcmp(arms[i]->origin, "reference");
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", col,
                dashed ? " stroke-dasharray=\"6 4\"" : "");
        for (int k = 0; k < arms[i]->n_cells; k++) {
            double y = cell_stat(&arms[i]->cells[k], off).med;
            if (isfinite(y)) fprintf(f, "%.1f,%.1f ", PX(arms[i]->cells[k].ctx), PY(y));
        }
        fprintf(f, "\"/>\n");
        for (int k = 0; k < arms[i]->n_cells; k++) {
            double y = cell_stat(&arms[i]->cells[k], off).med;
            if (isfinite(y))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%s %d: %g</title></circle>\n",
                        PX(arms[i]->cells[k].ctx), PY(y), col, arms[i]->label, arms[i]->cells[k].ctx, y);
        }
        double ly = T + 10 + 20 * i;
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                W - R + 12, ly, W - R + 36, ly, col, dashed ? " stroke-dasharray=\"6 4\"" : "");
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", W - R + 42, ly + 4, arms[i]->label);
    }
#undef PX
#undef PY
#undef PYV
    fprintf(f, "</svg>\n");
    return fclose(f) ? -1 : 0;
}

// ---- the report ----------------------------------------------------------------------------

// Calla's own arms first (in the order they ran), then external engines.
static bool arm_is_calla(const struct arm *a) {
    const char *e = a->n_cells && a->cells[0].runs[0].rec ? json_str(a->cells[0].runs[0].rec, "engine.name") : NULL;
    return e && !strcmp(e, "calla");
}

static int cmp_arm_date(const void *a, const void *b) {
    const struct arm *x = *(struct arm *const *)a, *y = *(struct arm *const *)b;
    if (arm_is_calla(x) != arm_is_calla(y)) return arm_is_calla(x) ? -1 : 1;
    int c = strcmp(x->first_date, y->first_date);
    return c ? c : strcmp(x->label, y->label);
}

static void runlog_one(FILE *f, json_t *m) {
    const char *cmdline = json_str(m, "command"), *start = json_str(m, "started"), *end = json_str(m, "finished");
    if (cmdline) fprintf(f, "```\n%s\n```\n\n", cmdline);
    fprintf(f, "- started %s, finished %s\n", start ? start : "?", end ? end : "(not finished)");
    const char *pre = json_str(m, "preflight.verdict"), *why = json_str(m, "preflight.reason");
    if (pre) fprintf(f, "- preflight: %s%s%s\n", pre, why ? ": " : "", why ? why : "");
    double rounds = json_num(m, "rounds"), dec = json_num(m, "decode");
    const char *agent = json_str(m, "agentbench");
    if (isfinite(rounds) && agent)
        fprintf(f, "- rounds %.0f, conversations: `calla agentbench %s`\n", rounds, agent);
    else if (isfinite(rounds))
        fprintf(f, "- rounds %.0f, decode steps %.0f\n", rounds, dec);
    const json_t *cool = json_object_get(m, "cooldowns");
    if (json_is_array(cool) && json_array_size(cool)) {
        double tot = 0, mx = 0;
        for (size_t i = 0; i < json_array_size(cool); i++) {
            double s = json_num(json_array_get(cool, i), "seconds");
            if (isfinite(s)) tot += s, mx = fmax(mx, s);
        }
        fprintf(f, "- %zu cooldowns between arms, %.0f s in all (longest %.0f s)\n", json_array_size(cool), tot, mx);
    }
    const json_t *fail = json_object_get(m, "failures");
    for (size_t i = 0; json_is_array(fail) && i < json_array_size(fail); i++)
        fprintf(f, "- **failed**: %s\n", json_string_value(json_array_get(fail, i)));
    fprintf(f, "\n");
}

// matrix.json and the logs of earlier invocations into the same folder (matrix-<date>.json),
// oldest first.
static void section_runlog(FILE *f, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char *names[64];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 63) {
        size_t len = strlen(de->d_name);
        if (!strncmp(de->d_name, "matrix-", 7) && len > 5 && !strcmp(de->d_name + len - 5, ".json"))
            names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_name);
    names[n++] = strdup("matrix.json");
    bool header = false;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        free(names[i]);
        json_t *m = json_load_file(path, 0, NULL);
        if (!m) continue;
        if (!header) fprintf(f, "## Run\n\n");
        header = true;
        runlog_one(f, m);
        json_decref(m);
    }
}

int report_write(const struct report_options *o, char *err, size_t errlen) {
    struct book *b = calloc(1, sizeof *b);
    json_t *ref = NULL, *targets = NULL;
    int rc = -1;
    if (!b) return snprintf(err, errlen, "out of memory"), -1;
    int n_run = load_dir(b, o->dir, "run", NULL, err, errlen);
    if (n_run < 0) goto out;
    int n_agent = report_agent_count(o->dir);
    if (n_run == 0 && n_agent == 0) {
        snprintf(err, errlen, "%s holds no bench records (schema %s) and no agentbench records (schema %s)", o->dir,
                 BENCH_SCHEMA, AGENTBENCH_SCHEMA);
        goto out;
    }
    if (o->compare_dir) {
        const char *base = strrchr(o->compare_dir, '/');
        char suffix[96];
        snprintf(suffix, sizeof suffix, " [%s]", base && base[1] ? base + 1 : o->compare_dir);
        if (load_dir(b, o->compare_dir, "compare", suffix, err, errlen) < 0) goto out;
    }
    if (o->reference && load_reference(b, o->reference, &ref, err, errlen)) goto out;
    if (load_targets(o->targets, o->dir, &targets, err, errlen)) goto out;

    struct arm *all[MAX_ARMS], *runs[MAX_ARMS], *base[MAX_ARMS];
    int n_all = 0, n_runs = 0, n_base = 0;
    for (int i = 0; i < b->n_arms; i++) {
        all[n_all++] = &b->arms[i];
        if (!strcmp(b->arms[i].origin, "run"))
            runs[n_runs++] = &b->arms[i];
        else
            base[n_base++] = &b->arms[i];
    }
    qsort(runs, (size_t)n_runs, sizeof *runs, cmp_arm_date);
    n_all = 0;
    for (int i = 0; i < n_runs; i++) all[n_all++] = runs[i];
    for (int i = 0; i < n_base; i++) all[n_all++] = base[i];

    char path[4096];
    snprintf(path, sizeof path, "%s/report.md", o->dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "cannot write %s", path);
        goto out;
    }
    fprintf(f, "# %s\n\n", o->title ? o->title : "Calla benchmark");
    if (n_run) {
        fprintf(f,
                "Protocol: docs/BENCH.md (the reference report's harness). Each figure is the median over rounds, "
                "with the spread (min–max) in brackets when there is more than one round. Decode tok/s = steps / sum "
                "of "
                "step times; ms/token = 1000 / decode tok/s. GB/s and TFLOP/s come from the byte and FLOP models "
                "documented in `src/harness/bench.c` and recorded in each JSON.\n\n");
    }
    section_runlog(f, o->dir);
    if (n_run) {
        fprintf(f, "## Identity\n\n");
        section_identity(f, runs, n_runs);
        fprintf(f, "## Determinism (greedy output across rounds)\n\n");
        int bad = section_determinism(f, runs, n_runs);
        fprintf(f, "%s\n\n",
                bad ? "**Some arms produced different tokens across rounds; see the flagged rows.**"
                    : "Every arm with two or more rounds repeated its output exactly.");
        section_targets(f, targets, runs, n_runs);
        fprintf(f, "## Sweep\n\n");
        for (int i = 0; i < n_runs; i++) section_sweep(f, runs[i]);
        if (n_base) {
            fprintf(f, "## Baselines\n\n");
            for (int i = 0; i < n_base; i++) section_sweep(f, base[i]);
        }
        if (n_base || n_runs > 1) {
            fprintf(f, "## Ratios\n\n");
            for (int i = 0; i < n_runs; i++) {
                for (int k = 0; k < n_base; k++) section_ratio(f, runs[i], base[k]);
                if (i > 0) section_ratio(f, runs[0], runs[i]);
            }
            // the reference rows against each other (reproduces the reference report's own comparison)
            for (int i = 1; i < n_base; i++)
                if (!strcmp(base[i]->origin, base[0]->origin)) section_ratio(f, base[0], base[i]);
        }
        fprintf(f, "## Decode ms/token against context (least-squares line)\n\n");
        section_fit(f, all, n_all);
        fprintf(f, "## Prefill scaling per context doubling\n\n"
                   "Per doubling = (time ratio)^(1 / log2(context ratio)); 2.00x is linear, 4.00x quadratic.\n\n");
        for (int i = 0; i < n_all; i++) section_scaling(f, all[i]);
        fprintf(f, "## Step drift\n\n");
        for (int i = 0; i < n_all; i++) section_drift(f, all[i]);
        fprintf(f, "## Memory (measured)\n\n");
        section_memory(f, runs, n_runs);
        fprintf(f, "## Telemetry (NVML, before and after each timed run)\n\n");
        section_telemetry(f, runs, n_runs);
        fprintf(f, "## Plots\n\n![decode ms/token](decode_ms.svg)\n\n![prefill tok/s](prefill_tps.svg)\n");
    }
    report_agent_section(f, o->dir, targets);
    if (fclose(f)) {
        snprintf(err, errlen, "cannot write %s", path);
        goto out;
    }
    if (!n_run) { // a conversation benchmark alone: no sweep to plot
        rc = 0;
        goto out;
    }
    snprintf(path, sizeof path, "%s/decode_ms.svg", o->dir);
    if (write_svg(path, "Decode ms/token against context", "decode ms/token", offsetof(struct run, ms_token), all,
                  n_all)) {
        snprintf(err, errlen, "cannot write %s", path);
        goto out;
    }
    snprintf(path, sizeof path, "%s/prefill_tps.svg", o->dir);
    if (write_svg(path, "Prefill tok/s against context", "prefill tok/s", offsetof(struct run, prefill_tps), all,
                  n_all)) {
        snprintf(err, errlen, "cannot write %s", path);
        goto out;
    }
    rc = 0;
out:
    for (int i = 0; i < b->n_owned; i++) json_decref(b->owned[i]);
    json_decref(ref);
    json_decref(targets);
    free(b);
    return rc;
}

int cmd_report(int argc, char **argv) {
    const char *dir = NULL, *compare = NULL, *reference = NULL, *title = NULL, *targets = NULL;
    const struct opt opts[] = {
        {"results", OPT_STR, &dir, 0, 0, "results folder (bench JSON records)"},
        {"compare", OPT_STR, &compare, 0, 0, "another results folder for ratio tables"},
        {"reference", OPT_STR, &reference, 0, 0, "reference table (e.g. bench/reference/lily_m5.json)"},
        {"title", OPT_STR, &title, 0, 0, "report heading"},
        {"targets", OPT_STR, &targets, 0, 0,
         "targets to check (e.g. bench/targets/h200.json; default: those calla matrix recorded in matrix.json)"},
    };
    const int n = sizeof opts / sizeof opts[0];
    const char *summary = "write report.md, decode_ms.svg and prefill_tps.svg for a results folder";
    int b = opts_begin(argc, argv, "report", summary, opts, n);
    if (b) return b > 0 ? 0 : 2;
    char err[1024];
    if (!dir) {
        fprintf(stderr, "calla report: --results is required\n");
        return 2;
    }
    struct report_options ro = {
        .dir = dir, .compare_dir = compare, .reference = reference, .title = title, .targets = targets};
    if (report_write(&ro, err, sizeof err)) {
        fprintf(stderr, "calla report: %s\n", err);
        return 1;
    }
    printf("%s/report.md\n", dir);
    return 0;
}
