// report_agent.c: the conversation section of report.md, from the `calla agentbench` records of a
// results folder (docs/BENCH.md "The conversation benchmark").
//
// Records are grouped into arms by label; a figure is the median over the arm's rounds (the
// spread in brackets when there are several). The first Calla arm is the one the others are
// measured against: a ratio is that arm's time over the other's (0.25x: four times as fast).
#include "report.h"

#include "agentbench.h"
#include "bench.h"

#include <dirent.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { AGENT_MAX_ARMS = 8, AGENT_MAX_ROUNDS = 16, AGENT_MAX_FILES = 256 };

struct agent_arm {
    char label[96];
    bool calla; // engine.name "calla"
    const json_t *rec[AGENT_MAX_ROUNDS];
    int n;
};

struct agent_book {
    struct agent_arm arms[AGENT_MAX_ARMS];
    int n;
    json_t *owned[AGENT_MAX_FILES];
    int n_owned;
};

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void book_free(struct agent_book *b) {
    for (int i = 0; i < b->n_owned; i++) json_decref(b->owned[i]);
}

// Loads dir's agentbench records; Calla arms first, each group in label order.
static void book_load(struct agent_book *b, const char *dir) {
    memset(b, 0, sizeof *b);
    DIR *d = opendir(dir);
    if (!d) return;
    char *names[AGENT_MAX_FILES];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < AGENT_MAX_FILES) {
        size_t len = strlen(de->d_name);
        if (len > 5 && !strcmp(de->d_name + len - 5, ".json")) names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_name);
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        free(names[i]);
        json_t *j = json_load_file(path, 0, NULL);
        const char *schema = json_str(j, "schema"), *label = json_str(j, "label");
        char err[256];
        if (!schema || strcmp(schema, AGENTBENCH_SCHEMA) || !label || agentbench_record_check(j, err, sizeof err)) {
            json_decref(j);
            continue;
        }
        b->owned[b->n_owned++] = j;
        struct agent_arm *a = NULL;
        for (int k = 0; k < b->n && !a; k++)
            if (!strcmp(b->arms[k].label, label)) a = &b->arms[k];
        if (!a && b->n < AGENT_MAX_ARMS) {
            a = &b->arms[b->n++];
            snprintf(a->label, sizeof a->label, "%s", label);
            const char *e = json_str(j, "engine.name");
            a->calla = e && !strcmp(e, "calla");
        }
        if (a && a->n < AGENT_MAX_ROUNDS) a->rec[a->n++] = j;
    }
    for (int i = 1; i < b->n; i++) // a stable sort: Calla's arms first
        for (int k = i; k > 0 && b->arms[k].calla && !b->arms[k - 1].calla; k--) {
            struct agent_arm t = b->arms[k];
            b->arms[k] = b->arms[k - 1];
            b->arms[k - 1] = t;
        }
}

int report_agent_count(const char *dir) {
    struct agent_book *b = malloc(sizeof *b);
    if (!b) return 0;
    book_load(b, dir);
    int n = b->n_owned;
    book_free(b);
    free(b);
    return n;
}

// ---- figures ---------------------------------------------------------------------------------

struct spread {
    double med, min, max;
    int n;
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static struct spread spread_of(double *v, int n) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) v[k++] = v[i];
    struct spread s = {NAN, NAN, NAN, k};
    if (!k) return s;
    qsort(v, (size_t)k, sizeof *v, cmp_d);
    s.min = v[0], s.max = v[k - 1];
    s.med = k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
    return s;
}

// A figure of every round: the record's path, or turns[turn].path when turn >= 0.
static struct spread arm_stat(const struct agent_arm *a, int turn, const char *path) {
    double v[AGENT_MAX_ROUNDS];
    for (int i = 0; i < a->n; i++) {
        const json_t *o = turn < 0 ? a->rec[i] : json_array_get(json_object_get(a->rec[i], "turns"), (size_t)turn);
        v[i] = o ? json_num(o, path) : NAN;
    }
    return spread_of(v, a->n);
}

static void fmt_spread(char *buf, size_t len, struct spread s, double scale, int decimals, const char *unit) {
    if (!isfinite(s.med)) {
        snprintf(buf, len, "–");
        return;
    }
    if (s.n < 2 || s.min == s.max)
        snprintf(buf, len, "%.*f%s", decimals, s.med * scale, unit);
    else
        snprintf(buf, len, "%.*f%s (%.*f–%.*f)", decimals, s.med * scale, unit, decimals, s.min * scale, decimals,
                 s.max * scale);
}

static void fmt_ratio(char *buf, size_t len, double a, double b) {
    if (isfinite(a) && isfinite(b) && b > 0)
        snprintf(buf, len, "%.2fx", a / b);
    else
        snprintf(buf, len, "–");
}

static int arm_requests(const struct agent_arm *a) {
    int n = 0;
    for (int i = 0; i < a->n; i++) {
        int k = (int)json_array_size(json_object_get(a->rec[i], "turns"));
        if (k > n) n = k;
    }
    return n;
}

static const char *replies_verdict(const struct agent_arm *a) {
    if (a->n < 2) return "one round: unchecked";
    const char *h0 = json_str(a->rec[0], "summary.replies_hash");
    for (int i = 1; i < a->n; i++) {
        const char *h = json_str(a->rec[i], "summary.replies_hash");
        if (!h || !h0 || strcmp(h, h0)) return a->calla ? "**DIFFER: not reproducible**" : "differ";
    }
    return "identical";
}

// The targets' "conversation" rows: {figure, target, peer, metric "wall_ratio", at_most}, checked for
// every Calla arm run on a device of the file's device_kind against the arm labelled peer.
static void section_targets(FILE *f, const struct agent_book *b, const json_t *targets) {
    const json_t *rows = json_object_get(targets, "conversation");
    if (!json_is_array(rows) || !json_array_size(rows)) return;
    const char *kind = json_str(targets, "device_kind");
    fprintf(f, "| Target | Arm | Peer | Measured | Limit | Verdict |\n|---|---|---|---:|---|---|\n");
    size_t k;
    const json_t *row;
    json_array_foreach(rows, k, row) {
        const char *peer = json_str(row, "peer"), *fig = json_str(row, "figure"), *lim = json_str(row, "target");
        const char *metric = json_str(row, "metric");
        double at_most = json_num(row, "at_most");
        if (!metric || strcmp(metric, "wall_ratio")) { // the one figure this section knows
            fprintf(f, "| %s | – | – | – | %s | unknown metric \"%s\" |\n", fig ? fig : "?", lim ? lim : "?",
                    metric ? metric : "");
            continue;
        }
        const struct agent_arm *p = NULL;
        for (int i = 0; peer && i < b->n; i++)
            if (!strcmp(b->arms[i].label, peer)) p = &b->arms[i];
        for (int i = 0; i < b->n; i++) {
            const struct agent_arm *a = &b->arms[i];
            if (!a->calla) continue;
            const char *eng = json_str(a->rec[0], "matrix.engine");
            const char *dev = !eng ? NULL : !strcmp(eng, "cpu") ? "cpu" : "gpu";
            double r = p ? arm_stat(a, -1, "summary.wall_s").med / arm_stat(p, -1, "summary.wall_s").med : NAN;
            char meas[32] = "–";
            if (isfinite(r)) snprintf(meas, sizeof meas, "%.3f", r);
            const char *verdict = !p                                   ? "no peer arm in this run"
                                  : kind && dev && strcmp(kind, dev)   ? "not checked (another device kind)"
                                  : !isfinite(r) || !isfinite(at_most) ? "–"
                                  : r <= at_most                       ? "met"
                                                                       : "**NOT met**";
            fprintf(f, "| %s | %s | %s | %s | %s | %s |\n", fig ? fig : "?", a->label, peer ? peer : "?", meas,
                    lim ? lim : "?", verdict);
        }
    }
    fprintf(f, "\n");
}

int report_agent_section(FILE *f, const char *dir, const json_t *targets) {
    struct agent_book *b = malloc(sizeof *b);
    if (!b) return 0;
    book_load(b, dir);
    if (!b->n) {
        book_free(b);
        free(b);
        return 0;
    }
    const json_t *c0 = json_object_get(b->arms[0].rec[0], "conversation");
    const char *hash = json_str(c0, "hash");
    bool same = true;
    for (int i = 0; i < b->n; i++)
        for (int k = 0; k < b->arms[i].n; k++) {
            const char *h = json_str(b->arms[i].rec[k], "conversation.hash");
            same = same && h && hash && !strcmp(h, hash);
        }
    fprintf(f, "## Conversation (calla agentbench)\n\n");
    fprintf(f,
            "Protocol: docs/BENCH.md \"The conversation benchmark\": a coding agent's conversation through "
            "`/v1/chat/completions`, streamed; seed %.0f, %.0f requests (the opening system turn of ~%.0f "
            "estimated tokens with %.0f tool definitions, then %.0f appends of a tool result of %.0f–%.0f "
            "estimated tokens), %.0f tokens generated a turn%s, tool_choice \"required\" every %.0f turns, thinking "
            "%s. %s\n\n",
            json_num(c0, "seed"), json_num(c0, "requests"), json_num(c0, "system_tokens"), json_num(c0, "tools"),
            json_num(c0, "turns"), json_num(c0, "min_result"), json_num(c0, "max_result"), json_num(c0, "gen"),
            json_is_true(json_object_get(c0, "ignore_eos")) ? " (ignore_eos)" : " (stop tokens honoured)",
            json_num(c0, "required_every"), json_is_true(json_object_get(c0, "thinking")) ? "on" : "off",
            same ? "Every arm was sent the same conversation (hash identical)."
                 : "**The arms were not sent the same conversation (their hashes differ): the figures do not "
                   "compare.**");
    fprintf(f,
            "TTFT: request sent to the first streamed chunk; decode tok/s: (tokens - 1) / first to last chunk; "
            "wall time: the whole conversation. Ratios: %s / the other arm.\n\n",
            b->arms[0].label);
    fprintf(f, "| Arm | Rounds | Wall time | TTFT opening | TTFT median of the appends | Decode tok/s (median) | "
               "Final prompt tokens | Prefilled tokens | Replies across rounds |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < b->n; i++) {
        const struct agent_arm *a = &b->arms[i];
        char w[64], t0[64], tm[64], d[64], p[64], pf[64];
        fmt_spread(w, sizeof w, arm_stat(a, -1, "summary.wall_s"), 1, 3, " s");
        fmt_spread(t0, sizeof t0, arm_stat(a, -1, "summary.ttft_ms_first"), 1, 1, " ms");
        fmt_spread(tm, sizeof tm, arm_stat(a, -1, "summary.ttft_ms_median_appends"), 1, 1, " ms");
        fmt_spread(d, sizeof d, arm_stat(a, -1, "summary.decode_tok_s_median"), 1, 1, "");
        fmt_spread(p, sizeof p, arm_stat(a, -1, "summary.prompt_tokens_last"), 1, 0, "");
        fmt_spread(pf, sizeof pf, arm_stat(a, -1, "summary.prefilled_tokens_sum"), 1, 0, "");
        fprintf(f, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", a->label, a->n, w, t0, tm, d, p, pf,
                replies_verdict(a));
    }
    fprintf(f, "\n");
    section_targets(f, b, targets);

    const struct agent_arm *base = &b->arms[0];
    int n = arm_requests(base);
    fprintf(f, "### Per turn (median over rounds)\n\n| Turn | Tool | Choice | New tokens | Prompt |");
    for (int i = 0; i < b->n; i++) fprintf(f, " %s cached | %s TTFT ms |", b->arms[i].label, b->arms[i].label);
    for (int i = 1; i < b->n; i++) fprintf(f, " TTFT %s / %s |", base->label, b->arms[i].label);
    fprintf(f, "\n|---:|---|---|---:|---:|");
    for (int i = 0; i < b->n; i++) fprintf(f, "---:|---:|");
    for (int i = 1; i < b->n; i++) fprintf(f, "---:|");
    fprintf(f, "\n");
    for (int k = 0; k < n; k++) {
        const json_t *t = json_array_get(json_object_get(base->rec[0], "turns"), (size_t)k);
        const char *tool = json_str(t, "tool");
        char nt[32], pr[32];
        fmt_spread(nt, sizeof nt, arm_stat(base, k, "new_tokens"), 1, 0, "");
        fmt_spread(pr, sizeof pr, arm_stat(base, k, "prompt_tokens"), 1, 0, "");
        fprintf(f, "| %d | %s | %s | %s | %s |", k, tool && *tool ? tool : "(opening)", json_str(t, "tool_choice"), nt,
                pr);
        for (int i = 0; i < b->n; i++) {
            char ca[32], tt[64];
            fmt_spread(ca, sizeof ca, arm_stat(&b->arms[i], k, "cached_tokens"), 1, 0, "");
            fmt_spread(tt, sizeof tt, arm_stat(&b->arms[i], k, "ttft_ms"), 1, 1, "");
            fprintf(f, " %s | %s |", ca, tt);
        }
        for (int i = 1; i < b->n; i++) {
            char r[32];
            fmt_ratio(r, sizeof r, arm_stat(base, k, "ttft_ms").med, arm_stat(&b->arms[i], k, "ttft_ms").med);
            fprintf(f, " %s |", r);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "| **wall** | | | | |");
    for (int i = 0; i < b->n; i++) {
        char w[64];
        fmt_spread(w, sizeof w, arm_stat(&b->arms[i], -1, "summary.wall_s"), 1, 3, " s");
        fprintf(f, " | %s |", w);
    }
    for (int i = 1; i < b->n; i++) {
        char r[32];
        fmt_ratio(r, sizeof r, arm_stat(base, -1, "summary.wall_s").med,
                  arm_stat(&b->arms[i], -1, "summary.wall_s").med);
        fprintf(f, " %s |", r);
    }
    fprintf(f, "\n\n");
    int count = b->n_owned;
    book_free(b);
    free(b);
    return count;
}
