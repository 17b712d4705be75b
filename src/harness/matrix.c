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
//   agentbench  --agentbench ARGS: each arm is a server (`calla serve` on cpu or cuda, or the
//               --llama-server command) started fresh each round on a free loopback port, driven
//               through `calla agentbench ARGS` once it answers /health, then stopped; the records
//               are OUT/<arm>-agent-r<round>.json, the server's log OUT/raw/<arm>-serve-r<round>.log
//   exit        0; 1 when a run failed; 3 when preflight refused; 4 when an arm's tokens differ
//               across rounds (a Calla arm's replies, with --agentbench)
#include "engine.h"
#include "agentbench.h"
#include "bench.h"
#include "commands.h"
#include "http_client.h"
#include "nvml.h"
#include "options.h"
#include "report.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MATRIX_MAX_CTX = 32, MATRIX_MAX_ENGINES = 8 };

struct matrix {
    const char *model, *out, *calla, *llama_cmd, *reference, *compare, *title;
    const char *agent_args; // --agentbench: the arms are servers driven by `calla agentbench ARGS`
    const char *server_cmd; // --llama-server: the command that serves the llama-server arm
    int serve_wait_s;       // how long a server may take to answer /health
    const char *engines[MATRIX_MAX_ENGINES];
    int n_engines;
    int contexts[MATRIX_MAX_CTX];
    int n_ctx;
    int decode, rounds, first_round, threads;
    int cooldown_min_s, cooldown_max_s, cooldown_margin_c, busy_pct, run_timeout_s;
    bool force;
    int idle_temp; // at preflight (-1: unknown)
    json_t *log;   // matrix.json
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
        reason[k - 2] = 0; // drop the trailing "; "
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
        setpgid(0, 0); // its own group, so a timeout stops what it started too
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

// Replaces {prompt}, {decode}, {model} and {port} in an external command template.
static void expand(char *dst, size_t len, const char *tmpl, const struct matrix *m, int ctx, int port) {
    size_t k = 0;
    for (const char *p = tmpl; *p && k + 1 < len;) {
        char val[64];
        const char *rep = NULL;
        size_t skip = 0;
        if (!strncmp(p, "{prompt}", 8))
            snprintf(val, sizeof val, "%d", ctx), rep = val, skip = 8;
        else if (!strncmp(p, "{decode}", 8))
            snprintf(val, sizeof val, "%d", m->decode), rep = val, skip = 8;
        else if (!strncmp(p, "{model}", 7))
            rep = m->model ? m->model : "", skip = 7;
        else if (!strncmp(p, "{port}", 6))
            snprintf(val, sizeof val, "%d", port), rep = val, skip = 6;
        if (rep) {
            int w = snprintf(dst + k, len - k, "%s", rep);
            k += w > 0 ? (size_t)w : 0;
            if (k >= len) k = len - 1;
            p += skip;
        } else
            dst[k++] = *p++;
    }
    dst[k] = 0;
}

static void label_of(const char *engine, char *buf, size_t len) {
    if (!strcmp(engine, "llama-bench"))
        snprintf(buf, len, "llama.cpp");
    else if (!strcmp(engine, "llama-server"))
        snprintf(buf, len, "llama-server");
    else
        snprintf(buf, len, "calla-%s", engine);
}

// Runs one arm; writes OUT/<label>-<ctx>-r<round>.json. 0, or -1 (recorded in failures).
static int run_arm(struct matrix *m, const char *engine, int ctx, int round, char *file, size_t filelen) {
    char label[64], path[4096], err[1024];
    label_of(engine, label, sizeof label);
    snprintf(file, filelen, "%s-%d-r%d.json", label, ctx, round);
    snprintf(path, sizeof path, "%s/%s", m->out, file);
    unlink(path); // a failed run must not leave an earlier invocation's record in the report
    int rc;
    if (!strcmp(engine, "llama-bench")) {
        char cmd[8192], raw[4096];
        expand(cmd, sizeof cmd, m->llama_cmd, m, ctx, 0);
        snprintf(raw, sizeof raw, "%s/raw/llama-bench-%d-r%d.out", m->out, ctx, round);
        char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        fprintf(stderr, "calla matrix: %s\n", cmd);
        rc = spawn(argv, raw, m->run_timeout_s);
        json_t *r = NULL;
        if (!rc && !bench_adapt_llama_bench(raw, ctx, label, &r, err, sizeof err)) {
            json_object_set_new(r, "command", json_string(cmd));
            rc = json_write_file(r, path, err, sizeof err) ? 1 : 0;
        } else if (!rc)
            rc = 1;
        if (rc) fprintf(stderr, "calla matrix: llama-bench arm at %d failed: %s\n", ctx, rc == 1 ? err : "exit");
        json_decref(r);
    } else {
        char c_ctx[16], c_dec[16], c_thr[16];
        snprintf(c_ctx, sizeof c_ctx, "%d", ctx);
        snprintf(c_dec, sizeof c_dec, "%d", m->decode);
        snprintf(c_thr, sizeof c_thr, "%d", m->threads);
        char *argv[] = {(char *)m->calla,
                        "bench",
                        "--model",
                        (char *)m->model,
                        "--context",
                        c_ctx,
                        "--decode",
                        c_dec,
                        "--backend",
                        (char *)engine,
                        "--threads",
                        c_thr,
                        "--json",
                        path,
                        "--label",
                        label,
                        NULL};
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

// ---- an agentbench arm: a server, the conversation, the server stopped ----------------------

// A TCP port on 127.0.0.1 that was free a moment ago (the server binds it next). 0 when none.
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int port = 0;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &al))
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

// Starts argv in its own process group, stdout and stderr to log_path. The pid, or -1.
static pid_t server_start(char *const argv[], const char *log_path) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (!pid) {
        setpgid(0, 0);
        if (!freopen(log_path, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(127);
        execv(argv[0], argv);
        fprintf(stderr, "calla matrix: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

// Waits until the server answers GET /health with 200 (llama-server: 503 while it loads). 0, or -1
// when it exited or ran past wait_s.
static int server_ready(pid_t pid, int port, int wait_s, char *err, size_t errlen) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    struct http_url u;
    if (http_url_parse(url, &u, err, errlen)) return -1;
    double t0 = now_s();
    for (;;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return snprintf(err, errlen, "the server exited (status %d) before answering /health",
                            WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)),
                   -1;
        struct http_request rq = {.method = "GET", .path = "/health", .timeout_s = 5};
        struct http_response resp;
        char e2[256];
        if (!http_do(&u, &rq, &resp, e2, sizeof e2)) {
            http_response_free(&resp);
            if (resp.status == 200) return 0;
        }
        if (now_s() - t0 > wait_s)
            return snprintf(err, errlen, "the server did not answer /health within %d s", wait_s), -1;
        sleep_s(0.25);
    }
}

// SIGTERM to the server's group, SIGKILL after 30 s.
static void server_stop(pid_t pid) {
    kill(-pid, SIGTERM);
    double t0 = now_s();
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_s() - t0 > 30) {
            fprintf(stderr, "calla matrix: the server (pid %d) ignored SIGTERM for 30 s; killing it\n", (int)pid);
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        sleep_s(0.05);
    }
    kill(-pid, SIGKILL); // whatever it started and left behind
}

// One round of an engine: OUT/<label>-agent-r<round>.json. 0, or -1.
static int run_agent_arm(struct matrix *m, const char *engine, int round, char *file, size_t filelen) {
    char label[64], path[4096], log[4096], table[4096], err[1024];
    label_of(engine, label, sizeof label);
    snprintf(file, filelen, "%s-agent-r%d.json", label, round);
    snprintf(path, sizeof path, "%s/%s", m->out, file);
    snprintf(log, sizeof log, "%s/raw/%s-serve-r%d.log", m->out, label, round);
    snprintf(table, sizeof table, "%s/raw/%s-agent-r%d.txt", m->out, label, round);
    unlink(path);
    int port = free_port();
    if (!port) {
        fprintf(stderr, "calla matrix: no free port on 127.0.0.1\n");
        return -1;
    }
    bool llama = !strcmp(engine, "llama-server");
    char c_port[16], c_thr[16], cmd[8192];
    snprintf(c_port, sizeof c_port, "%d", port);
    snprintf(c_thr, sizeof c_thr, "%d", m->threads);
    pid_t pid;
    if (llama) {
        expand(cmd, sizeof cmd, m->server_cmd, m, 0, port);
        fprintf(stderr, "calla matrix: %s\n", cmd);
        char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        pid = server_start(argv, log);
    } else {
        char *argv[] = {(char *)m->calla, "serve", "--model", (char *)m->model, "--backend", (char *)engine,
                        "--threads",      c_thr,   "--host",  "127.0.0.1",      "--port",    c_port,
                        "--quiet",        NULL};
        pid = server_start(argv, log);
    }
    if (pid < 0) {
        fprintf(stderr, "calla matrix: cannot start the %s server: %s\n", label, strerror(errno));
        return -1;
    }
    int rc = -1;
    if (server_ready(pid, port, m->serve_wait_s, err, sizeof err)) {
        fprintf(stderr, "calla matrix: %s: %s (log: %s)\n", label, err, log);
    } else {
        snprintf(cmd, sizeof cmd,
                 "'%s' agentbench --url http://127.0.0.1:%d --flavor %s --label %s --json '%s' --quiet %s", m->calla,
                 port, llama ? "llama-server" : "calla", label, path, m->agent_args);
        fprintf(stderr, "calla matrix: %s\n", cmd);
        char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        rc = spawn(argv, table, m->run_timeout_s) ? -1 : 0;
        if (rc) fprintf(stderr, "calla matrix: the %s conversation failed (output: %s)\n", label, table);
    }
    server_stop(pid);
    if (rc) return -1;
    json_t *r = json_load_file(path, 0, NULL);
    if (!r || agentbench_record_check(r, err, sizeof err)) {
        fprintf(stderr, "calla matrix: %s: %s\n", path, r ? err : "no record");
        json_decref(r);
        return -1;
    }
    json_object_set_new(
        r, "matrix",
        json_pack("{s:s, s:s, s:i, s:s}", "arm", label, "engine", engine, "round", round, "server_log", log));
    if (llama) json_object_set_new(r, "server_command", json_string(cmd));
    int w = json_write_file(r, path, err, sizeof err);
    json_decref(r);
    return w;
}

// A Calla arm's replies must repeat across rounds (greedy, a fresh server each round). Returns the
// arms that differ; other engines' differences are only reported.
static int check_agent_determinism(struct matrix *m) {
    int bad = 0;
    for (int e = 0; e < m->n_engines; e++) {
        char label[64], path[4096], first[24] = "";
        label_of(m->engines[e], label, sizeof label);
        for (int r = 1; r <= 16; r++) {
            snprintf(path, sizeof path, "%s/%s-agent-r%d.json", m->out, label, r);
            if (access(path, R_OK)) continue;
            json_t *j = json_load_file(path, 0, NULL);
            const char *h = j ? json_str(j, "summary.replies_hash") : NULL;
            if (h && !first[0])
                snprintf(first, sizeof first, "%s", h);
            else if (h && strcmp(h, first)) {
                bool ours = strcmp(m->engines[e], "llama-server") != 0;
                fprintf(stderr, "calla matrix: %s: round %d replied %s, the first round %s%s\n", label, r, h, first,
                        ours ? ": NOT reproducible" : " (the peer's own nondeterminism, reported only)");
                bad += ours;
            }
            json_decref(j);
        }
    }
    return bad;
}

// ---- the command ---------------------------------------------------------------------------

static int check_determinism(struct matrix *m) {
    int bad = 0;
    for (int e = 0; e < m->n_engines; e++)
        for (int c = 0; c < m->n_ctx; c++) {
            char label[64], path[4096], first[24] = "";
            label_of(m->engines[e], label, sizeof label);
            for (int r = 1; r <= 16; r++) { // every round in the folder, earlier invocations too
                snprintf(path, sizeof path, "%s/%s-%d-r%d.json", m->out, label, m->contexts[c], r);
                if (access(path, R_OK)) continue;
                json_t *j = json_load_file(path, 0, NULL);
                const char *h = j ? json_str(j, "tokens.hash") : NULL;
                if (h && !first[0])
                    snprintf(first, sizeof first, "%s", h);
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
    long long cmin = 10, cmax = 300, margin = 5, busy = 5, run_timeout = 3600, serve_wait = 900;
    const char *reference = NULL, *default_reference = "bench/reference/lily_m5.json";
    const char *targets = NULL, *default_targets = "bench/targets/h200.json";
    bool no_reference = false, no_targets = false;
    const struct opt opts[] = {
        {"model", OPT_STR, &m.model, 0, 0, "checkpoint directory"},
        {"engines", OPT_STR, &engines, 0, 0,
         "comma list of cuda, cpu, llama-bench; with --agentbench: cuda, cpu, llama-server (default cuda)"},
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
        {"agentbench", OPT_STR, &m.agent_args, 0, 0,
         "run the conversation benchmark instead, engines as arms (cpu, cuda, llama-server): each a fresh server "
         "driven by `calla agentbench ARGS` (\"\" for its defaults)"},
        {"llama-server", OPT_STR, &m.server_cmd, 0, 0,
         "command that serves the llama-server arm on 127.0.0.1:{port}; {port} {model} are replaced"},
        {"serve-wait-s", OPT_INT, &serve_wait, 1, 86400, "seconds a server may take to answer /health (default 900)"},
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
    m.busy_pct = (int)busy, m.run_timeout_s = (int)run_timeout, m.serve_wait_s = (int)serve_wait;
    // the external engine of this mode: llama-bench beside `calla bench`, llama-server beside agentbench
    const char *ext = m.agent_args ? "llama-server" : "llama-bench",
               *ext_cmd = m.agent_args ? m.server_cmd : m.llama_cmd;
    for (int i = 0; i < m.n_engines; i++) {
        const char *e = m.engines[i];
        if (strcmp(e, "cpu") && strcmp(e, "cuda") && strcmp(e, ext)) {
            fprintf(stderr, "calla matrix: unknown engine \"%s\" (cpu, cuda or %s%s)\n", e, ext,
                    m.agent_args ? " with --agentbench" : "");
            return 2;
        }
        if (!strcmp(e, ext) && !ext_cmd) {
            fprintf(stderr, "calla matrix: the %s engine needs --%s 'COMMAND'%s\n", ext, ext,
                    m.agent_args ? " (with {port})" : "");
            return 2;
        }
        if (strcmp(e, ext) && !m.model) {
            fprintf(stderr, "calla matrix: --model is required for the %s engine\n", e);
            return 2;
        }
    }
    if (m.agent_args) m.n_ctx = 0; // a conversation has no context sweep
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
    if (no_reference)
        m.reference = NULL;
    else if (reference && access(reference, R_OK)) {
        fprintf(stderr, "calla matrix: cannot read reference %s\n", reference);
        return 2;
    } else
        m.reference = reference ? reference : !access(default_reference, R_OK) ? default_reference : NULL;
    if (no_targets)
        targets = NULL;
    else if (targets && access(targets, R_OK)) {
        fprintf(stderr, "calla matrix: cannot read targets %s\n", targets);
        return 2;
    } else if (!targets && !access(default_targets, R_OK))
        targets = default_targets;
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
    m.log = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:[], s:[], s:[], s:[]}", "schema", "calla.matrix/1", "command",
                      cmdline, "started", date, "rounds", m.rounds, "first_round", m.first_round, "decode", m.decode,
                      "engines", "contexts", "cooldowns", "failures");
    if (m.agent_args) json_object_set_new(m.log, "agentbench", json_string(m.agent_args));
    for (int i = 0; i < m.n_engines; i++)
        json_array_append_new(json_object_get(m.log, "engines"), json_string(m.engines[i]));
    for (int i = 0; i < m.n_ctx; i++)
        json_array_append_new(json_object_get(m.log, "contexts"), json_integer(m.contexts[i]));
    json_object_set_new(m.log, "runs", json_array());
    if (targets) { // the report reads them there
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

    json_t *old_log = json_load_file(logpath, 0, NULL); // an earlier invocation into the same folder
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

    int failures = 0, total = m.rounds * (m.agent_args ? 1 : m.n_ctx) * m.n_engines, done = 0;
    double t_all = now_s();
    for (int r = m.first_round; m.agent_args && r < m.first_round + m.rounds; r++)
        for (int e = 0; e < m.n_engines; e++) {
            char file[256];
            if (done)
                cooldown(&m, json_string_value(json_object_get(
                                 json_array_get(json_object_get(m.log, "runs"), (size_t)done - 1), "file")));
            fprintf(stderr, "calla matrix: [%d/%d] round %d, %s, conversation\n", done + 1, total, r, m.engines[e]);
            double t0 = now_s();
            int rc = run_agent_arm(&m, m.engines[e], r, file, sizeof file);
            json_array_append_new(json_object_get(m.log, "runs"),
                                  json_pack("{s:s, s:s, s:i, s:b, s:f}", "file", file, "engine", m.engines[e], "round",
                                            r, "ok", rc == 0, "seconds", now_s() - t0));
            if (rc) {
                char what[512];
                snprintf(what, sizeof what, "%s conversation, round %d", m.engines[e], r);
                json_array_append_new(json_object_get(m.log, "failures"), json_string(what));
                failures++;
            }
            done++;
            json_write_file(m.log, logpath, err, sizeof err);
        }
    for (int r = m.first_round; !m.agent_args && r < m.first_round + m.rounds; r++)
        for (int c = 0; c < m.n_ctx; c++)
            for (int e = 0; e < m.n_engines; e++) {
                char file[256];
                if (done)
                    cooldown(&m, json_string_value(json_object_get(
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
    int bad = m.agent_args ? check_agent_determinism(&m) : check_determinism(&m);
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
            bad            ? "tokens DIFFER across rounds (flagged)"
            : m.agent_args ? "Calla's replies identical across rounds"
                           : "tokens identical across rounds",
            m.out);
    return failures ? 1 : bad ? 4 : 0;
}
