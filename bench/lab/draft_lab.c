// draft_lab.c: the prompt-lookup drafter's policy (src/draft.h) measured on edit tasks over real
// text, with no model: the "model" is forced to produce the edited text, so a draft token is right
// exactly when it is the text's next token, and a verification of T tokens is charged by a cost
// model in decode steps. What the policy's defaults were chosen on.
//
//   draft_lab TOKENIZER_DIR FILE... [--policy N_MAX,N_MIN,LEN_INIT,GATE,WEIGHT] [--len-max D]
//
// Each FILE (a source file, a document) gives four tasks, its text as the prompt after one line of
// instruction: "rename" (the file again, its most frequent identifier renamed everywhere),
// "comment" (a comment line added after every 25th line), "lines" (every 12th line changed at its
// end) and "other" (the next FILE, cyclically: text that copies nothing). Each task prints the
// drafts, their acceptance, the mean accepted length per verification and the speed-up over plain
// decoding under three cost models of a verification of T tokens:
//   lin0.1, lin0.3   1 + beta (T - 1) decode steps
//   moe              a batch-1 step that reads all of its weights once, 70% of them every token and
//                    30% the routed experts, whose distinct count grows with T as 8 of 256 do per
//                    token (the full shape's byte model at 4K context, docs/BENCH.md)
//   h200             the H200's measured verification of T tokens at 6,000 of context, kept whole or
//                    cut back (version 12), over its measured decode step
// Exit 0, 1 on an error, 2 on bad arguments.
#include "draft.h"
#include "tokenizer.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


// ---- the edits -----------------------------------------------------------------------------------

struct text {
    char *p;
    size_t n, cap;
};
static void add(struct text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        t->cap = 2 * (t->n + n + 1);
        t->p = realloc(t->p, t->cap);
        if (!t->p) exit(1);
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}
static bool ident(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// The most frequent identifier of 4 to 31 characters (a plain count over a small open table).
static void frequent_word(const char *s, size_t n, char *out) {
    enum { SLOTS = 1 << 14 };
    static char words[SLOTS][32];
    static int count[SLOTS];
    memset(count, 0, sizeof count);
    int best = -1;
    for (size_t i = 0; i < n;) {
        if (!ident(s[i]) || (s[i] >= '0' && s[i] <= '9')) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && ident(s[j])) j++;
        const size_t len = j - i;
        if (len >= 4 && len < 32) {
            uint32_t h = 2166136261u;
            for (size_t k = i; k < j; k++) h = (h ^ (unsigned char)s[k]) * 16777619u;
            for (uint32_t at = h % SLOTS;; at = (at + 1) % SLOTS) {
                if (!count[at]) memcpy(words[at], s + i, len), words[at][len] = 0;
                else if (strlen(words[at]) != len || memcmp(words[at], s + i, len)) continue;
                if (++count[at] > (best < 0 ? 0 : count[best])) best = (int)at;
                break;
            }
        }
        i = j;
    }
    snprintf(out, 32, "%s", best >= 0 ? words[best] : "the");
}

static void rename_word(const char *s, size_t n, struct text *out) {
    char w[32], to[40];
    frequent_word(s, n, w);
    snprintf(to, sizeof to, "%s_2", w);
    const size_t wl = strlen(w);
    for (size_t i = 0; i < n;) {
        if (i + wl <= n && !memcmp(s + i, w, wl) && (i == 0 || !ident(s[i - 1])) && (i + wl == n || !ident(s[i + wl]))) {
            add(out, to, strlen(to));
            i += wl;
        } else {
            add(out, s + i, 1);
            i++;
        }
    }
}

// Each line, and after every every-th line (kind 0) a comment line, or (kind 1) the line changed at its end.
static void edit_lines(const char *s, size_t n, int every, int kind, struct text *out) {
    int line = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && s[j] != '\n') j++;
        line++;
        const bool hit = line % every == 0;
        add(out, s + i, j - i);
        if (hit && kind == 1) add(out, " // changed", 11);
        if (j < n) add(out, "\n", 1);
        if (hit && kind == 0) add(out, "// checked here\n", 16);
        i = j + 1;
    }
}

// ---- the replay ----------------------------------------------------------------------------------

enum { COSTS = 4 };
static const char *const cost_names[COSTS] = {"lin0.1", "lin0.3", "moe", "h200"};

// The H200's verification of T = 2..8 tokens at 6,000 of context, kept whole and cut back, in ms
// (bench/results/2026-12-01-h200-v12/raw/warm.txt), over its decode step there (1.625 ms).
static const double h200_kept[9] = {0, 0, 3.022, 3.585, 4.024, 5.058, 5.476, 6.315, 6.614};
static const double h200_cut[9] = {0, 0, 3.754, 4.282, 4.708, 5.725, 6.235, 6.966, 7.326};
enum { H200_T_MAX = 8 };

static double cost(int kind, int T, bool cut) {
    if (kind == 0) return 1 + 0.1 * (T - 1);
    if (kind == 1) return 1 + 0.3 * (T - 1);
    if (kind == 2) {
        const double experts = 256 * (1 - pow(1 - 8.0 / 256, T)) / 8; // distinct routed experts, in tokens' worth
        return 0.7 + 0.3 * experts;
    }
    const double *ms = cut ? h200_cut : h200_kept; // past T = 8 (unmeasured): the last step's slope
    const int t = T < H200_T_MAX ? T : H200_T_MAX;
    return (ms[t] + (T - t) * (ms[H200_T_MAX] - ms[H200_T_MAX - 1])) / 1.625;
}

struct result {
    double speed[COSTS];
    long long drafted, accepted, verifications;
};

static struct result replay(const int32_t *p, int np, const int32_t *c, int nc, int len_max,
                            const struct draft_policy *pol) {
    struct drafter d;
    struct result r = {0};
    if (draft_init(&d, p, np, len_max, pol)) return r;
    double spent[COSTS] = {0};
    draft_push(&d, c[0]);
    int32_t out[DRAFT_LEN_MAX];
    for (int i = 0; i < nc - 1;) {
        const int k = draft_propose(&d, nc - 1 - i, out);
        if (!k) {
            for (int m = 0; m < COSTS; m++) spent[m] += 1;
            draft_push(&d, c[++i]);
            continue;
        }
        const int m = draft_accepted(out, k, c + i + 1);
        draft_result(&d, k, m);
        for (int q = 0; q < COSTS; q++) spent[q] += cost(q, k + 1, m < k);
        r.verifications++;
        for (int j = 0; j <= m; j++) draft_push(&d, c[i + 1 + j]);
        i += m + 1;
    }
    for (int q = 0; q < COSTS; q++) r.speed[q] = (nc - 1) / spent[q];
    r.drafted = d.drafted, r.accepted = d.accepted;
    draft_free(&d);
    return r;
}

int main(int argc, char **argv) {
    struct draft_policy pol = DRAFT_POLICY_DEFAULT;
    int len_max = 7, nf = 0;
    const char *files[64], *tdir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--policy") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d,%d,%d,%f,%f", &pol.n_max, &pol.n_min, &pol.len_init, &pol.gate, &pol.rate_weight) != 5)
                return fprintf(stderr, "draft_lab: --policy N_MAX,N_MIN,LEN_INIT,GATE,WEIGHT\n"), 2;
        } else if (!strcmp(argv[i], "--len-max") && i + 1 < argc) {
            len_max = atoi(argv[++i]);
        } else if (!tdir) {
            tdir = argv[i];
        } else if (nf < 64) {
            files[nf++] = argv[i];
        }
    }
    if (!tdir || nf < 1) {
        fprintf(stderr, "usage: draft_lab TOKENIZER_DIR FILE... [--policy N_MAX,N_MIN,LEN_INIT,GATE,WEIGHT] [--len-max D]\n");
        return 2;
    }
    struct tokenizer *t;
    char err[512];
    if (tokenizer_load(tdir, &t, err, sizeof err)) return fprintf(stderr, "draft_lab: %s\n", err), 1;
    printf("policy n %d..%d, len_init %d, gate %.2f, weight %.2f, len_max %d\n", pol.n_max, pol.n_min, pol.len_init,
           pol.gate, pol.rate_weight, len_max);
    printf("%-28s %-8s %7s %7s %7s %6s %6s", "file", "task", "tokens", "drafted", "accept", "mean", "");
    for (int q = 0; q < COSTS; q++) printf(" %7s", cost_names[q]);
    printf("\n");
    double logsum[COSTS] = {0};
    int tasks = 0;
    for (int f = 0; f < nf; f++) {
        size_t n, no;
        char *s = read_file(files[f], &n), *other = read_file(files[(f + 1) % nf], &no);
        if (!s || !other) return fprintf(stderr, "draft_lab: cannot read %s\n", s ? files[(f + 1) % nf] : files[f]), 1;
        struct text prompt = {0};
        add(&prompt, "Rewrite this file as asked, in full:\n", 37);
        add(&prompt, s, n);
        int32_t *pid;
        size_t np;
        if (tokenizer_encode(t, prompt.p, prompt.n, &pid, &np, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
        static const char *const names[] = {"rename", "comment", "lines", "other"};
        for (int k = 0; k < 4; k++) {
            struct text c = {0};
            if (k == 0) rename_word(s, n, &c);
            else if (k == 1) edit_lines(s, n, 25, 0, &c);
            else if (k == 2) edit_lines(s, n, 12, 1, &c);
            else add(&c, other, no);
            int32_t *cid;
            size_t nc;
            if (tokenizer_encode(t, c.p, c.n, &cid, &nc, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
            const struct result r = replay(pid, (int)np, cid, (int)nc, len_max, &pol);
            const char *base = strrchr(files[f], '/');
            printf("%-28.28s %-8s %7zu %7lld %6.0f%% %6.2f %6s", base ? base + 1 : files[f], names[k], nc, r.drafted,
                   r.drafted ? 100.0 * r.accepted / r.drafted : 0.0,
                   r.verifications ? (double)r.accepted / r.verifications : 0.0, "");
            for (int q = 0; q < COSTS; q++) printf(" %6.2fx", r.speed[q]), logsum[q] += log(r.speed[q]);
            printf("\n");
            tasks++;
            free(cid);
            free(c.p);
        }
        free(pid);
        free(prompt.p);
        free(s);
        free(other);
    }
    printf("%-28s %-8s %7s %7s %7s %6s %6s", "geometric mean", "", "", "", "", "", "");
    for (int q = 0; q < COSTS; q++) printf(" %6.2fx", exp(logsum[q] / tasks));
    printf("\n");
    tokenizer_free(t);
    return 0;
}
