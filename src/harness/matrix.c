// matrix.c: `calla matrix`, engines x contexts x rounds (docs/BENCH.md "The matrix runner").
//
//   preflight   refuse to start when the GPU is busy (utilization, other compute processes) or
//               reports a throttle reason other than idle; the verdict and reason are recorded
//   rounds      round r runs every context of every engine, each a fresh `calla bench` process
//               (or an external command through its adapter), in the same order every round
//   cooldowns   between arms: at least --cooldown-min-s, then until the GPU is back within
//               --cooldown-margin-c of its idle temperature (read at preflight), capped
//   output      OUT/<arm>-<ctx>-r<round>.json (raw records), OUT/raw/ (external engines' own
//               output), OUT/matrix.json (this run's log), OUT/report.md + SVG plots (report.c)
//   exit        0; 1 when a run failed; 3 when preflight refused; 4 when an arm's tokens differ
//               across rounds
#include "engine.h"
#include "bench.h"
#include "commands.h"
#include "nvml.h"
#include "options.h"
#include "report.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MATRIX_MAX_CTX = 32, MATRIX_MAX_ENGINES = 8 };

struct matrix {
    const char *model, *out, *calla, *llama_cmd, *reference, *compare, *title;
    const char *engines[MATRIX_MAX_ENGINES];
    int n_engines;
    int contexts[MATRIX_MAX_CTX];
    int n_ctx;
    int decode, rounds, first_round, threads;
    int cooldown_min_s, cooldown_max_s, cooldown_margin_c, busy_pct, run_timeout_s;
    bool force;
    int idle_temp;           // at preflight (-1: unknown)
    json_t *log;             // matrix.json
};

static void iso_date(char *buf, size_t len) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

static int parse_list(const char *s, char *buf, size_t buflen, const char **items, int cap) {
    snprintf(buf, buflen, "%s", s);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < cap; tok = strtok_r(NULL, ",", &save))
        items[n++] = tok;
    return n;
}

// ---- preflight -----------------------------------------------------------------------------

static bool uses_gpu(const struct matrix *m) {
    for (int i = 0; i < m->n_engines; i++)
        if (strcmp(m->engines[i], "cpu")) return true;
    return false;
}

// Fills verdict ("ok", "refused", "forced", "no-gpu") and reason. 0 to go on, -1 to refuse.
static int preflight(struct matrix *m, json_t *pre) {
    char reason[512] = "";
    struct nvml_sample s;
    nvml_read(&s);
    m->idle_temp = -1;
    if (!s.available) {
        snprintf(reason, sizeof reason, "NVML unavailable (%s); no GPU checks", s.reason);
        json_object_set_new(pre, "verdict", json_string(uses_gpu(m) && !m->force ? "refused" : "no-gpu"));
        json_object_set_new(pre, "reason", json_string(reason));
        return uses_gpu(m) && !m->force ? -1 : 0;
    }
    // utilization over about a second, so one idle sample does not hide a busy GPU
    int util_max = s.util_gpu_pct;
    long long reasons = s.throttle;
    for (int i = 0; i < 5; i++) {
        sleep_s(0.2);
        struct nvml_sample t;
        nvml_read(&t);
        if (t.util_gpu_pct > util_max) util_max = t.util_gpu_pct;
        if (t.throttle >= 0) reasons = reasons < 0 ? t.throttle : reasons | t.throttle;
    }
    m->idle_temp = s.temp_c;
    size_t k = 0;
    if (util_max > m->busy_pct)
        k += (size_t)snprintf(reason + k, sizeof reason - k, "GPU busy: utilization %d%% (limit %d%%); ", util_max,
                              m->busy_pct);
    if (s.n_processes > 0 && k < sizeof reason)
        k += (size_t)snprintf(reason + k, sizeof reason - k, "GPU busy: %d compute process(es) running; ",
                              s.n_processes);
    if (reasons > 0 && (reasons & ~(long long)NVML_REASONS_BENIGN) && k < sizeof reason) {
        char names[256];
        nvml_reason_names(reasons & ~(long long)NVML_REASONS_BENIGN, names, sizeof names);
        k += (size_t)snprintf(reason + k, sizeof reason - k, "GPU throttling: %s; ", names);
    }
    json_object_set_new(pre, "gpu", json_string(s.name));
    json_object_set_new(pre, "idle_temperature_c", json_integer(s.temp_c));
    json_object_set_new(pre, "utilization_max_pct", json_integer(util_max));
    json_object_set_new(pre, "compute_processes", json_integer(s.n_processes));
    char names[256];
    nvml_reason_names(reasons, names, sizeof names);
    json_object_set_new(pre, "throttle_reasons", json_string(names));
    if (k) {
        reason[k - 2] = 0;   // drop the trailing "; "
        bool go = m->force || !uses_gpu(m);
        json_object_set_new(pre, "verdict", json_string(m->force ? "forced" : !uses_gpu(m) ? "cpu-only" : "refused"));
        json_object_set_new(pre, "reason", json_string(reason));
        return go ? 0 : -1;
    }
    json_object_set_new(pre, "verdict", json_string("ok"));
    return 0;
}

// Waits between arms; records what it did.
static void cooldown(struct matrix *m, const char *after) {
    double t0 = now_s();
    sleep_s(m->cooldown_min_s);
    struct nvml_sample s;
    nvml_read(&s);
    int t_start = s.available ? s.temp_c : -1, t_end = t_start;
    bool reached = true;
    if (s.available && m->idle_temp >= 0 && s.temp_c >= 0) {
        while (s.temp_c > m->idle_temp + m->cooldown_margin_c && now_s() - t0 < m->cooldown_max_s) {
            sleep_s(1);
            nvml_read(&s);
        }
        t_end = s.temp_c;
        reached = s.temp_c <= m->idle_temp + m->cooldown_margin_c;
    }
    json_t *c = json_pack("{s:s, s:f, s:b}", "after", after, "seconds", now_s() - t0, "reached_idle", reached);
    if (t_start >= 0) {
        json_object_set_new(c, "temperature_start_c", json_integer(t_start));
        json_object_set_new(c, "temperature_end_c", json_integer(t_end));
    }
    json_array_append_new(json_object_get(m->log, "cooldowns"), c);
}

// ---- one arm -------------------------------------------------------------------------------

// fork + exec; stdout to out_path when given. Returns the exit status (or -1).
static int spawn(char *const argv[], const char *out_path, int timeout_s) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (!pid) {
        setpgid(0, 0);   // its own group, so a timeout stops what it started too
        if (out_path) {
            FILE *f = freopen(out_path, "w", stdout);
            if (!f) _exit(127);
        }
        execv(argv[0], argv);
        fprintf(stderr, "calla matrix: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int st;
    double t0 = now_s();
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return -1;
        if (timeout_s > 0 && now_s() - t0 > timeout_s) {
            fprintf(stderr, "calla matrix: %s ran past %d s; stopping it\n", argv[0], timeout_s);
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            return 124;
        }
        sleep_s(0.05);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

// Replaces {prompt}, {decode} and {model} in the external command template.
static void expand(char *dst, size_t len, const char *tmpl, const struct matrix *m, int ctx) {
    size_t k = 0;
    for (const char *p = tmpl; *p && k + 1 < len;) {
        char val[64];
        const char *rep = NULL;
        size_t skip = 0;
        if (!strncmp(p, "{prompt}", 8)) snprintf(val, sizeof val, "%d", ctx), rep = val, skip = 8;
        else if (!strncmp(p, "{decode}", 8)) snprintf(val, sizeof val, "%d", m->decode), rep = val, skip = 8;
        else if (!strncmp(p, "{model}", 7)) rep = m->model ? m->model : "", skip = 7;
        if (rep) {
            int w = snprintf(dst + k, len - k, "%s", rep);
            k += w > 0 ? (size_t)w : 0;
            if (k >= len) k = len - 1;
            p += skip;
        } else dst[k++] = *p++;
    }
    dst[k] = 0;
}

static void label_of(const char *engine, char *buf, size_t len) {
    if (!strcmp(engine, "llama-bench")) snprintf(buf, len, "llama.cpp");
    else snprintf(buf, len, "calla-%s", engine);
}

// Runs one arm; writes OUT/<label>-<ctx>-r<round>.json. 0, or -1 (recorded in failures).
static int run_arm(struct matrix *m, const char *engine, int ctx, int round, char *file, size_t filelen) {
    char label[64], path[4096], err[1024];
    label_of(engine, label, sizeof label);
    snprintf(file, filelen, "%s-%d-r%d.json", label, ctx, round);
    snprintf(path, sizeof path, "%s/%s", m->out, file);
    unlink(path);   // a failed run must not leave an earlier invocation's record in the report
    int rc;
    if (!strcmp(engine, "llama-bench")) {
        char cmd[8192], raw[4096];
        expand(cmd, sizeof cmd, m->llama_cmd, m, ctx);
        snprintf(raw, sizeof raw, "%s/raw/llama-bench-%d-r%d.out", m->out, ctx, round);
        char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        fprintf(stderr, "calla matrix: %s\n", cmd);
        rc = spawn(argv, raw, m->run_timeout_s);
        json_t *r = NULL;
        if (!rc && !bench_adapt_llama_bench(raw, ctx, label, &r, err, sizeof err)) {
            json_object_set_new(r, "command", json_string(cmd));
            rc = json_write_file(r, path, err, sizeof err) ? 1 : 0;
        } else if (!rc) rc = 1;
        if (rc) fprintf(stderr, "calla matrix: llama-bench arm at %d failed: %s\n", ctx, rc == 1 ? err : "exit");
        json_decref(r);
    } else {
        char c_ctx[16], c_dec[16], c_thr[16];
        snprintf(c_ctx, sizeof c_ctx, "%d", ctx);
        snprintf(c_dec, sizeof c_dec, "%d", m->decode);
        snprintf(c_thr, sizeof c_thr, "%d", m->threads);
        char *argv[] = {(char *)m->calla, "bench", "--model", (char *)m->model, "--context", c_ctx, "--decode", c_dec,
                        "--backend", (char *)engine, "--threads", c_thr, "--json", path, "--label", label, NULL};
        rc = spawn(argv, NULL, m->run_timeout_s);
    }
    if (rc) return -1;
    // tag the record with its place in the matrix
    json_t *r = json_load_file(path, 0, NULL);
    if (!r) return -1;
    json_object_set_new(r, "matrix", json_pack("{s:s, s:i, s:i}", "arm", label, "round", round, "context", ctx));
    int w = json_write_file(r, path, err, sizeof err);
    json_decref(r);
    return w;
}

// ---- the command ---------------------------------------------------------------------------

static int check_determinism(struct matrix *m) {
    int bad = 0;
    for (int e = 0; e < m->n_engines; e++)
        for (int c = 0; c < m->n_ctx; c++) {
            char label[64], path[4096], first[24] = "";
            label_of(m->engines[e], label, sizeof label);
            for (int r = 1; r <= 16; r++) {   // every round in the folder, earlier invocations too
                snprintf(path, sizeof path, "%s/%s-%d-r%d.json", m->out, label, m->contexts[c], r);
                if (access(path, R_OK)) continue;
                json_t *j = json_load_file(path, 0, NULL);
                const char *h = j ? json_str(j, "tokens.hash") : NULL;
                if (h && !first[0]) snprintf(first, sizeof first, "%s", h);
                else if (h && strcmp(h, first)) {
                    fprintf(stderr,
                            "calla matrix: %s at %d: round %d produced tokens %s, the first round %s: "
                            "NOT reproducible\n",
                            label, m->contexts[c], r, h, first);
                    bad++;
                }
                json_decref(j);
            }
        }
    return bad;
}

int cmd_matrix(int argc, char **argv) {
    struct matrix m = {0};
    const char *engines = "cuda", *contexts = "4096,16384,65536,131072,262079";
    long long first_round = 1, decode = 64, rounds = 2, threads = 0;
    long long cmin = 10, cmax = 300, margin = 5, busy = 5, run_timeout = 3600;
    const char *reference = NULL, *default_reference = "bench/reference/lily_m5.json";
    const char *targets = NULL, *default_targets = "bench/targets/h200.json";
    bool no_reference = false, no_targets = false;
    const struct opt opts[] = {
        {"model", OPT_STR, &m.model, 0, 0, "checkpoint directory"},
        {"engines", OPT_STR, &engines, 0, 0, "comma list of cuda, cpu, llama-bench (default cuda)"},
        {"contexts", OPT_STR, &contexts, 0, 0, "comma list of prompt tokens (default 4096,...,262079)"},
        {"decode", OPT_INT, &decode, 1, 4096, "decode steps per run (default 64)"},
        {"rounds", OPT_INT, &rounds, 1, 16, "rounds (default 2)"},
        {"first-round", OPT_INT, &first_round, 1, 16,
         "number of the first round (default 1): split a sweep over several invocations into one --out"},
        {"threads", OPT_INT, &threads, 0, 1024, "CPU backend threads (0: all cores)"},
        {"out", OPT_STR, &m.out, 0, 0, "results folder (created)"},
        {"cooldown-min-s", OPT_INT, &cmin, 0, 3600, "seconds to wait between arms at least (default 10)"},
        {"cooldown-max-s", OPT_INT, &cmax, 0, 3600, "cap on the wait for idle temperature (default 300)"},
        {"cooldown-margin-c", OPT_INT, &margin, 0, 50, "degrees above the idle temperature that count as cool (5)"},
        {"busy-pct", OPT_INT, &busy, 0, 100, "GPU utilization above which the GPU counts as busy (default 5)"},
        {"run-timeout-s", OPT_INT, &run_timeout, 0, 86400,
         "stop a run after this many seconds (default 3600; 0: never)"},
        {"force", OPT_FLAG, &m.force, 0, 0, "run even when the GPU is busy or throttling (recorded)"},
        {"llama-bench", OPT_STR, &m.llama_cmd, 0, 0,
         "command for the llama-bench arm; {prompt} {decode} {model} are replaced; must print -o json"},
        {"calla", OPT_STR, &m.calla, 0, 0, "calla binary for the bench runs (default: this one)"},
        {"reference", OPT_STR, &reference, 0, 0,
         "reference table for ratio tables (default bench/reference/lily_m5.json)"},
        {"no-reference", OPT_FLAG, &no_reference, 0, 0, "no reference table"},
        {"targets", OPT_STR, &targets, 0, 0,
         "targets the report checks, copied into matrix.json (default bench/targets/h200.json)"},
        {"no-targets", OPT_FLAG, &no_targets, 0, 0, "no targets"},
        {"compare", OPT_STR, &m.compare, 0, 0, "another results folder for ratio tables"},
        {"title", OPT_STR, &m.title, 0, 0, "report heading"},
    };
    const int n = sizeof opts / sizeof opts[0];
    const char *summary = "engines x contexts x rounds of `calla bench`, each in a fresh process; writes a results "
                          "folder with the raw JSON, report.md and plots";
    int b = opts_begin(argc, argv, "matrix", summary, opts, n);
    if (b) return b > 0 ? 0 : 2;
    char err[1024];
    if (!m.out) {
        fprintf(stderr, "calla matrix: --out is required\n");
        return 2;
    }
    char ebuf[512], cbuf[1024];
    const char *citems[MATRIX_MAX_CTX];
    m.n_engines = parse_list(engines, ebuf, sizeof ebuf, m.engines, MATRIX_MAX_ENGINES);
    m.n_ctx = parse_list(contexts, cbuf, sizeof cbuf, citems, MATRIX_MAX_CTX);
    m.decode = (int)decode, m.rounds = (int)rounds, m.first_round = (int)first_round, m.threads = (int)threads;
    if (first_round + rounds - 1 > 16) {
        fprintf(stderr, "calla matrix: --first-round %lld + --rounds %lld goes past round 16\n", first_round, rounds);
        return 2;
    }
    m.cooldown_min_s = (int)cmin, m.cooldown_max_s = (int)cmax, m.cooldown_margin_c = (int)margin;
    m.busy_pct = (int)busy, m.run_timeout_s = (int)run_timeout;
    for (int i = 0; i < m.n_engines; i++) {
        const char *e = m.engines[i];
        if (strcmp(e, "cpu") && strcmp(e, "cuda") && strcmp(e, "llama-bench")) {
            fprintf(stderr, "calla matrix: unknown engine \"%s\" (cpu, cuda or llama-bench)\n", e);
            return 2;
        }
        if (!strcmp(e, "llama-bench") && !m.llama_cmd) {
            fprintf(stderr, "calla matrix: the llama-bench engine needs --llama-bench 'COMMAND'\n");
            return 2;
        }
        if (strcmp(e, "llama-bench") && !m.model) {
            fprintf(stderr, "calla matrix: --model is required for the %s engine\n", e);
            return 2;
        }
    }
    for (int i = 0; i < m.n_ctx; i++) {
        char *end;
        long v = strtol(citems[i], &end, 10);
        if (end == citems[i] || *end || v < 1) {
            fprintf(stderr, "calla matrix: --contexts: \"%s\" is not a token count\n", citems[i]);
            return 2;
        }
        if (v + decode + 1 > QWEN_MAX_CTX) {
            fprintf(stderr,
                    "calla matrix: prompt %ld + decode %lld + 1 lookahead = %lld tokens exceeds the limit of %d "
                    "(the longest prompt at %lld decode steps is %lld)\n",
                    v, decode, v + decode + 1, QWEN_MAX_CTX, decode, QWEN_MAX_CTX - decode - 1);
            return 2;
        }
        m.contexts[i] = (int)v;
    }
    if (no_reference) m.reference = NULL;
    else if (reference && access(reference, R_OK)) {
        fprintf(stderr, "calla matrix: cannot read reference %s\n", reference);
        return 2;
    } else m.reference = reference ? reference : !access(default_reference, R_OK) ? default_reference : NULL;
    if (no_targets) targets = NULL;
    else if (targets && access(targets, R_OK)) {
        fprintf(stderr, "calla matrix: cannot read targets %s\n", targets);
        return 2;
    } else if (!targets && !access(default_targets, R_OK)) targets = default_targets;
    static char self[4096];
    if (!m.calla) {
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0) {
            fprintf(stderr, "calla matrix: cannot find this binary; give --calla PATH\n");
            return 2;
        }
        self[len] = 0;
        m.calla = self;
    }
    char raw[4096];
    snprintf(raw, sizeof raw, "%s/raw", m.out);
    if ((mkdir(m.out, 0755) && errno != EEXIST) || (mkdir(raw, 0755) && errno != EEXIST)) {
        fprintf(stderr, "calla matrix: cannot create %s: %s\n", m.out, strerror(errno));
        return 1;
    }

    char date[32], cmdline[4096] = "calla";
    size_t k = 5;
    for (int i = 0; i < argc && k < sizeof cmdline; i++) {
        bool q = strpbrk(argv[i], " '\"{}") != NULL;
        k += (size_t)snprintf(cmdline + k, sizeof cmdline - k, q ? " '%s'" : " %s", argv[i]);
    }
    iso_date(date, sizeof date);
    m.log = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:[], s:[], s:[], s:[]}", "schema", "calla.matrix/1",
                      "command", cmdline, "started", date, "rounds", m.rounds, "first_round", m.first_round, "decode",
                      m.decode, "engines", "contexts", "cooldowns", "failures");
    for (int i = 0; i < m.n_engines; i++)
        json_array_append_new(json_object_get(m.log, "engines"), json_string(m.engines[i]));
    for (int i = 0; i < m.n_ctx; i++)
        json_array_append_new(json_object_get(m.log, "contexts"), json_integer(m.contexts[i]));
    json_object_set_new(m.log, "runs", json_array());
    if (targets) {   // the report reads them there
        json_error_t je;
        json_t *t = json_load_file(targets, 0, &je);
        if (!t) {
            fprintf(stderr, "calla matrix: %s: %s (line %d)\n", targets, je.text, je.line);
            json_decref(m.log);
            return 2;
        }
        json_object_set_new(m.log, "targets", t);
    }
    char logpath[4096];
    snprintf(logpath, sizeof logpath, "%s/matrix.json", m.out);

    json_t *old_log = json_load_file(logpath, 0, NULL);   // an earlier invocation into the same folder
    if (old_log) {
        char keep[4096];
        const char *st = json_str(old_log, "started");
        snprintf(keep, sizeof keep, "%s/matrix-%s.json", m.out, st ? st : "earlier");
        if (rename(logpath, keep)) fprintf(stderr, "calla matrix: cannot keep the earlier %s\n", logpath);
        json_decref(old_log);
    }
    json_t *pre = json_object();
    json_object_set_new(m.log, "preflight", pre);
    int refused = preflight(&m, pre);
    fprintf(stderr, "calla matrix: preflight %s%s%s\n", json_str(pre, "verdict"), json_str(pre, "reason") ? ": " : "",
            json_str(pre, "reason") ? json_str(pre, "reason") : "");
    if (refused) {
        json_write_file(m.log, logpath, err, sizeof err);
        fprintf(stderr, "calla matrix: refusing to start (recorded in %s; --force to override)\n", logpath);
        json_decref(m.log);
        return 3;
    }
    json_write_file(m.log, logpath, err, sizeof err);

    int failures = 0, total = m.rounds * m.n_ctx * m.n_engines, done = 0;
    double t_all = now_s();
    for (int r = m.first_round; r < m.first_round + m.rounds; r++)
        for (int c = 0; c < m.n_ctx; c++)
            for (int e = 0; e < m.n_engines; e++) {
                char file[256];
                if (done) cooldown(&m, json_string_value(json_object_get(
                                           json_array_get(json_object_get(m.log, "runs"), (size_t)done - 1), "file")));
                fprintf(stderr, "calla matrix: [%d/%d] round %d, %s, context %d\n", done + 1, total, r, m.engines[e],
                        m.contexts[c]);
                double t0 = now_s();
                int rc = run_arm(&m, m.engines[e], m.contexts[c], r, file, sizeof file);
                json_array_append_new(json_object_get(m.log, "runs"),
                                      json_pack("{s:s, s:s, s:i, s:i, s:b, s:f}", "file", file, "engine", m.engines[e],
                                                "context", m.contexts[c], "round", r, "ok", rc == 0, "seconds",
                                                now_s() - t0));
                if (rc) {
                    char what[512];
                    snprintf(what, sizeof what, "%s at context %d, round %d", m.engines[e], m.contexts[c], r);
                    json_array_append_new(json_object_get(m.log, "failures"), json_string(what));
                    failures++;
                }
                done++;
                json_write_file(m.log, logpath, err, sizeof err);
            }
    int bad = check_determinism(&m);
    iso_date(date, sizeof date);
    json_object_set_new(m.log, "finished", json_string(date));
    json_object_set_new(m.log, "seconds", json_real(now_s() - t_all));
    json_object_set_new(m.log, "nondeterministic_cells", json_integer(bad));
    json_write_file(m.log, logpath, err, sizeof err);
    json_decref(m.log);

    struct report_options ro = {.dir = m.out, .compare_dir = m.compare, .reference = m.reference, .title = m.title};
    if (report_write(&ro, err, sizeof err)) {
        fprintf(stderr, "calla matrix: report: %s\n", err);
        return 1;
    }
    fprintf(stderr, "calla matrix: %d runs, %d failed, %s; %s/report.md\n", total, failures,
            bad ? "tokens DIFFER across rounds (flagged)" : "tokens identical across rounds", m.out);
    return failures ? 1 : bad ? 4 : 0;
}
