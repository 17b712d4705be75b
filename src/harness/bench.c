// bench.c: `calla bench`, the reference report's protocol in one fresh process (docs/BENCH.md).
//
//   1. load the checkpoint; print the device line and the model line (stderr)
//   2. prompt: token i = (i * 2654435761) mod 2^32 mod vocab
//   3. exact-shape warmup: the same prefill and the same decode steps, then the sequence is reset
//   4. timed prefill, TTFT-style: from submission until the first token id is on the host
//   5. timed decode: every step timed on its own, its token id read back (as the server does)
//   6. with --draft, the speculative pass: the same prompt, the same tokens decoded again with
//      drafts verified several tokens a forward (after a warmup of its own), timed the same way
//   7. one JSON record (schema "calla.bench/1") and one summary line on stdout
//
// Memory is measured, not computed: peak host RSS is the kernel's VmHWM; peak device memory is
// NVML's "used" polled every few milliseconds from before the engine loads until the end, minus
// the reading before the load (CUDA backend only; the CPU backend records null with the reason).
#include "bench.h"

#include "checkpoint.h"
#include "commands.h"
#include "draft.h"
#include "engine.h"
#include "nvml.h"
#include "options.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifdef CALLA_CUDA
#include <cuda_runtime_api.h>
#endif

#ifndef CALLA_GIT_COMMIT
#define CALLA_GIT_COMMIT "unknown"
#endif
#ifndef CALLA_GIT_DIRTY
#define CALLA_GIT_DIRTY 1
#endif

uint64_t bench_hash_tokens(const int32_t *ids, int n) {
    uint64_t h = FNV1A64_INIT;
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        const uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
        h = fnv1a64(h, le, 4);
    }
    return h;
}

// ---- the byte model (decode GB/s) ----------------------------------------------------------
//
// One decode step at a context of ctx keys must at least move:
//   dense    every non-expert weight once: attention q/k/v/o and DeltaNet in_proj_qkv/z/b/a and
//            out_proj (4-bit), router and shared-expert gate (8-bit), shared expert (4-bit),
//            norms, conv taps, A_log, dt_bias (fp32 as the backends hold them)
//   experts  the 8 routed experts of each layer (gate, up and down rows), codes + bf16 scales
//            and biases: bits/8 bytes per weight + 4 bytes per group of 64
//   lm_head  the whole matrix (greedy needs every logit); embed: one row
//   kv       the bf16 K and V of the 10 attention layers over ctx keys
//            (10 layers x 2 (K,V) x 2 heads x 256 x 2 B = 20 KiB per token), plus the new row
//   state    the DeltaNet state (32 x 128 x 128 fp32 per layer + conv window), read and written
// Activations, logits and scratch are ignored (small next to the above).
static int64_t quant_bytes(int64_t elems, int bits) {
    return elems * bits / 8 + (elems / QWEN_GROUP) * 4;
}

struct bench_bytes bench_decode_bytes(const struct geometry *g, int64_t ctx) {
    struct bench_bytes b = {0};
    int n = model_tensor_spec_count(g);
    struct tensor_spec *specs = malloc(sizeof *specs * (size_t)n);
    if (!specs) return b;
    model_tensor_specs(g, NULL, specs, n);
    for (int i = 0; i < n; i++) {
        const struct tensor_spec *s = &specs[i];
        int64_t elems = 1;
        for (int d = 0; d < s->ndim; d++) elems *= s->dims[d];
        if (s->role != ROLE_QUANT)
            b.dense += elems * 4;
        else if (!strcmp(s->name, "model.embed_tokens"))
            b.embed += quant_bytes(s->dims[1], s->bits);
        else if (!strcmp(s->name, "lm_head"))
            b.lm_head += quant_bytes(elems, s->bits);
        else if (s->ndim == 3)
            b.experts += quant_bytes(elems / s->dims[0], s->bits) * g->n_experts_used;
        else
            b.dense += quant_bytes(elems, s->bits);
    }
    free(specs);
    b.kv = model_state_sizes(g).kv_bytes_per_token * (ctx + 1);
    b.state = 2 * model_state_sizes(g).gdn_bytes;
    b.total = b.dense + b.experts + b.lm_head + b.embed + b.kv + b.state;
    return b;
}

// ---- the FLOP model (prefill TFLOP/s) ------------------------------------------------------
//
//   2 x (weights every prompt token multiplies: all but embed and lm_head, routed experts
//        counted n_experts_used of n_experts)                         per token
// + 2 x vocab x hidden for the one lm_head row (TTFT needs only the last token's logits)
// + causal attention, QK^T and PV: 2 x 2 x n_heads x head_dim x N(N+1)/2 per attention layer
//   (= 81,920 N^2 over the real model's 10 layers)
// + the DeltaNet recurrence: about 8 x v_heads x k_dim x v_dim per token per layer
//   (decay, S^T k, rank-1 update, q readout)
double bench_prefill_flop(const struct geometry *g, int64_t n) {
    int count = model_tensor_spec_count(g);
    struct tensor_spec *specs = malloc(sizeof *specs * (size_t)count);
    if (!specs) return 0;
    model_tensor_specs(g, NULL, specs, count);
    double active = 0;
    for (int i = 0; i < count; i++) {
        const struct tensor_spec *s = &specs[i];
        if (s->role != ROLE_QUANT || !strcmp(s->name, "model.embed_tokens") || !strcmp(s->name, "lm_head")) continue;
        double elems = 1;
        for (int d = 0; d < s->ndim; d++) elems *= (double)s->dims[d];
        if (s->ndim == 3) elems = elems / (double)s->dims[0] * g->n_experts_used;
        active += elems;
    }
    free(specs);
    int n_attn = g->n_layers / g->attn_interval, n_gdn = g->n_layers - n_attn;
    double N = (double)n;
    double attn = (double)n_attn * 4.0 * g->n_heads * g->head_dim * N * (N + 1) / 2.0;
    double gdn = (double)n_gdn * 8.0 * g->lin_v_heads * g->lin_k_dim * g->lin_v_dim * N;
    return 2.0 * active * N + 2.0 * (double)g->vocab * g->hidden + attn + gdn;
}

// ---- small JSON helpers --------------------------------------------------------------------

static const json_t *json_path(const json_t *o, const char *path) {
    char key[64];
    while (o && *path) {
        const char *dot = strchr(path, '.');
        size_t len = dot ? (size_t)(dot - path) : strlen(path);
        if (len >= sizeof key) return NULL;
        memcpy(key, path, len);
        key[len] = 0;
        o = json_is_object(o) ? json_object_get(o, key) : NULL;
        path += len + (dot ? 1 : 0);
    }
    return o;
}

double json_num(const json_t *o, const char *path) {
    const json_t *v = json_path(o, path);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

const char *json_str(const json_t *o, const char *path) {
    const json_t *v = json_path(o, path);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

int json_write_file(const json_t *j, const char *path, char *err, size_t errlen) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(j, tmp, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) || rename(tmp, path)) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

static json_t *num_or_null(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}
static json_t *int_or_null(long long v) {
    return v >= 0 ? json_integer(v) : json_null();
}

static json_t *telemetry_json(const struct nvml_sample *s) {
    if (!s->available) return json_pack("{s:b, s:s}", "available", 0, "reason", s->reason);
    char reasons[256];
    nvml_reason_names(s->throttle, reasons, sizeof reasons);
    json_t *j = json_pack("{s:b, s:s, s:s, s:s, s:i}", "available", 1, "name", s->name, "uuid", s->uuid, "driver",
                          s->driver, "index", s->index);
    json_object_set_new(j, "temperature_c", int_or_null(s->temp_c));
    json_object_set_new(j, "power_w", num_or_null(s->power_w >= 0 ? s->power_w : NAN));
    json_object_set_new(j, "power_limit_w", num_or_null(s->power_limit_w >= 0 ? s->power_limit_w : NAN));
    json_object_set_new(j, "sm_clock_mhz", int_or_null(s->sm_clock_mhz));
    json_object_set_new(j, "mem_clock_mhz", int_or_null(s->mem_clock_mhz));
    json_object_set_new(j, "sm_clock_max_mhz", int_or_null(s->sm_clock_max_mhz));
    json_object_set_new(j, "mem_clock_max_mhz", int_or_null(s->mem_clock_max_mhz));
    json_object_set_new(j, "pstate", int_or_null(s->pstate));
    json_object_set_new(j, "utilization_gpu_pct", int_or_null(s->util_gpu_pct));
    json_object_set_new(j, "throttle_reasons_bits", int_or_null(s->throttle));
    json_object_set_new(j, "throttle_reasons", json_string(reasons));
    json_object_set_new(j, "memory_used_bytes", int_or_null(s->mem_used));
    json_object_set_new(j, "memory_total_bytes", int_or_null(s->mem_total));
    json_object_set_new(j, "compute_processes", int_or_null(s->n_processes));
    return j;
}

// ---- measured memory -----------------------------------------------------------------------

// Peak resident set of this process (getrusage's ru_maxrss, KiB on Linux): the mapped checkpoint
// pages a backend has touched and not released, plus the heap.
static long long host_peak_rss(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? -1 : (long long)ru.ru_maxrss * 1024;
}

// Polls NVML's used memory (device-wide and this process's) while the benchmark runs.
struct mem_poll {
    pthread_t thread;
    volatile int stop;
    long long baseline, peak, pid_peak;
};

static void *mem_poll_main(void *arg) {
    struct mem_poll *p = arg;
    long long pid = (long long)getpid();
    for (int it = 0; !p->stop; it++) {
        long long used, mine = -1;
        if (!nvml_memory_used(&used, pid, it % 8 == 0 ? &mine : NULL)) {
            if (used > p->peak) p->peak = used;
            if (mine > p->pid_peak) p->pid_peak = mine;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

// ---- device identity -----------------------------------------------------------------------

static json_t *cpu_device_json(int threads) {
    char model[256] = "unknown", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                snprintf(model, sizeof model, "%s", c + 2);
                model[strcspn(model, "\n")] = 0;
            }
            break;
        }
    if (f) fclose(f);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:n, s:n, s:n}", "kind", "cpu", "name", model, "cores",
                     (json_int_t)sysconf(_SC_NPROCESSORS_ONLN), "threads", (json_int_t)threads, "memory_bytes",
                     (json_int_t)pages * psz, "driver", "sm_count", "peak_gbs");
}

static json_t *gpu_device_json(const struct nvml_sample *s) {
    int sm = -1;
#ifdef CALLA_CUDA
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
        sm = v;
#endif
    json_t *j = json_pack("{s:s}", "kind", "gpu");
    json_object_set_new(j, "name", json_string(s->available ? s->name : "unknown"));
    json_object_set_new(j, "uuid", s->available ? json_string(s->uuid) : json_null());
    json_object_set_new(j, "driver", s->available ? json_string(s->driver) : json_null());
    json_object_set_new(j, "sm_count", int_or_null(sm));
    json_object_set_new(j, "memory_bytes", s->available ? int_or_null(s->mem_total) : json_null());
    double bw = nvml_peak_gbs(s);
    json_object_set_new(j, "peak_gbs", bw > 0 ? json_real(bw) : json_null());
    if (!s->available) json_object_set_new(j, "reason", json_string(s->reason));
    return j;
}

// ---- statistics ----------------------------------------------------------------------------

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double mean_of(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : NAN;
}

static double median_of(const double *v, int n) {
    if (!n) return NAN;
    double *c = malloc(sizeof *c * (size_t)n);
    if (!c) return NAN;
    memcpy(c, v, sizeof *c * (size_t)n);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

static double std_of(const double *v, int n) { // sample standard deviation
    if (n < 2) return 0;
    double m = mean_of(v, n), s = 0;
    for (int i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
    return sqrt(s / (n - 1));
}

static void iso_date(char *buf, size_t len) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void hex64(uint64_t h, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

// ---- the protocol --------------------------------------------------------------------------

// One prefill and d decode steps from an empty sequence. ids[0..d] receive the generated ids;
// step_s[0..d) the decode step times (may be NULL).
static int run_once(struct engine *e, struct seq *s, const int32_t *prompt, int n, int d, int32_t *ids,
                    double *prefill_s, double *step_s, char *err, size_t errlen) {
    int32_t tok;
    struct progress_line pl = {"calla bench", now_s()};
    const struct forward_opts fo = {.progress = progress_line, .progress_arg = &pl};
    double t0 = now_s();
    if (engine_forward(e, s, prompt, n, &fo, &tok, err, errlen)) return -1;
    *prefill_s = now_s() - t0; // engine_forward returns with the id on the host
    ids[0] = tok;
    for (int i = 0; i < d; i++) {
        double t = now_s();
        if (engine_forward(e, s, &tok, 1, NULL, &tok, err, errlen)) return -1;
        double dt = now_s() - t;
        if (step_s) step_s[i] = dt;
        ids[i + 1] = tok;
    }
    return 0;
}

// ---- the speculative pass ----------------------------------------------------------------------

struct spec_pass {
    double seconds;              // the decode steps' time, summed (as the plain pass's)
    int forwards, verifications; // steps: plain forwards and verifications
    long long drafted, accepted;
    bool tokens_match; // the tokens are the plain pass's
};

// A hash of (seed, i) in [0, 2^64): which oracle tokens are replaced, and by what.
static uint64_t mix64(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The prompt, then ids[1..d] again (ids: the plain pass's d + 1 tokens): each step a verification
// of [the last token, a draft] or, with no draft, a plain step; never a token the plain pass did
// not forward. The accepted tokens and the bonus one are checked against ids.
static int spec_once(struct engine *e, struct seq *s, const struct bench_options *o, const int32_t *prompt, int n,
                     int d, const int32_t *ids, struct spec_pass *r, char *err, size_t errlen) {
    const int V = engine_geometry(e)->vocab;
    const bool oracle = !strcmp(o->draft, "oracle");
    struct draft_policy policy = draft_policy_for(e); // the server's
    if (o->ungated) policy.gate = 0;
    struct draft_gate gate; // the oracle's drafts (the lookup drafter has its own)
    draft_gate_init(&gate, policy.gate, policy.rate_weight);
    struct drafter dr;
    *r = (struct spec_pass){.tokens_match = true};
    int32_t tok;
    if (engine_forward(e, s, prompt, n, NULL, &tok, err, errlen)) return -1;
    r->tokens_match = tok == ids[0];
    if (!oracle && draft_init(&dr, prompt, n, o->draft_len, &policy)) {
        snprintf(err, errlen, "out of memory for the drafter");
        return -1;
    }
    int rc = -1;
    for (int p = 0; p < d;) { // ids[0..p] are out; ids[p] is the next to forward
        int32_t v[DRAFT_LEN_MAX + 1], next[DRAFT_LEN_MAX + 1];
        const int limit = d - p - 1;
        const double t = now_s();
        int k = 0;
        if (oracle) {
            k = o->draft_len < limit ? o->draft_len : limit;
            for (int i = 1; i <= k; i++) {
                const uint64_t h = mix64(o->draft_seed, (uint64_t)(p + i));
                const bool right = (double)(h >> 11) * 0x1.0p-53 < o->accept;
                v[i] =
                    right ? ids[p + i] : (int32_t)((ids[p + i] + 1 + (int64_t)(mix64(h, 0) % (uint64_t)(V - 1))) % V);
            }
            if (k && !draft_gate_pass(&gate, v[1])) k = 0;
        } else {
            if (draft_push(&dr, ids[p])) goto out;
            k = draft_propose(&dr, limit, v + 1);
        }
        int got; // new tokens out of this step
        if (!k) {
            if (engine_forward(e, s, &ids[p], 1, NULL, &tok, err, errlen)) goto out;
            r->tokens_match &= tok == ids[p + 1];
            if (oracle) draft_gate_next(&gate, ids[p + 1]);
            got = 1;
            r->forwards++;
        } else {
            v[0] = ids[p];
            if (engine_verify(e, s, v, k + 1, next, err, errlen)) goto out;
            const int m = draft_accepted(v + 1, k, next);
            if (engine_verify_keep(e, s, m + 1, err, errlen)) goto out;
            if (oracle) {
                draft_gate_result(&gate, m > 0);
            } else {
                draft_result(&dr, k, m);
                for (int i = 1; i <= m; i++)
                    if (draft_push(&dr, ids[p + i])) goto out;
            }
            for (int i = 0; i <= m; i++) r->tokens_match &= next[i] == ids[p + 1 + i];
            r->drafted += k, r->accepted += m, r->verifications++;
            got = m + 1;
        }
        r->seconds += now_s() - t;
        p += got;
    }
    rc = 0;
out:
    if (!oracle) draft_free(&dr);
    return rc;
}

static json_t *spec_json(const struct bench_options *o, const struct spec_pass *r, int d, double plain_tok_s) {
    const bool oracle = !strcmp(o->draft, "oracle");
    json_t *j = json_pack("{s:s, s:i, s:b, s:I, s:I, s:i, s:i, s:f, s:f}", "draft", o->draft, "draft_len", o->draft_len,
                          "tokens_match", r->tokens_match, "drafted", (json_int_t)r->drafted, "accepted",
                          (json_int_t)r->accepted, "verifications", r->verifications, "plain_steps", r->forwards,
                          "seconds", r->seconds, "tok_s", d / r->seconds);
    json_object_set_new(j, "accept_p", oracle ? json_real(o->accept) : json_null());
    json_object_set_new(j, "gated", json_boolean(!o->ungated));
    json_object_set_new(j, "seed", oracle ? json_integer((json_int_t)o->draft_seed) : json_null());
    json_object_set_new(j, "acceptance",
                        r->drafted ? json_real((double)r->accepted / (double)r->drafted) : json_real(0));
    json_object_set_new(j, "mean_accepted",
                        r->verifications ? json_real((double)r->accepted / r->verifications) : json_real(0));
    json_object_set_new(j, "speedup", json_real(d / r->seconds / plain_tok_s));
    json_object_set_new(j, "note",
                        json_string(oracle ? "the plain pass's tokens as drafts, each replaced by a wrong "
                                             "one with probability 1 - accept_p (a hash of seed and position)"
                                           : "drafts of the prompt-lookup drafter (src/draft.h)"));
    return j;
}

int bench_run(const struct bench_options *o, json_t **out, char *err, size_t errlen) {
    const int N = o->context, D = o->decode;
    *out = NULL;
    if (N < 1 || D < 1) {
        snprintf(err, errlen, "--context and --decode must be at least 1 (got %d and %d)", N, D);
        return -1;
    }
    if ((long long)N + D + 1 > QWEN_MAX_CTX) {
        snprintf(err, errlen,
                 "prompt %d + decode %d + 1 lookahead = %lld tokens exceeds the limit of %d "
                 "(the longest prompt at %d decode steps is %d)",
                 N, D, (long long)N + D + 1, QWEN_MAX_CTX, D, QWEN_MAX_CTX - D - 1);
        return -1;
    }
    if (o->draft && strcmp(o->draft, "oracle") && strcmp(o->draft, "lookup")) {
        snprintf(err, errlen, "--draft \"%s\": oracle or lookup", o->draft);
        return -1;
    }
    if (o->draft && !(o->accept >= 0 && o->accept <= 1)) {
        snprintf(err, errlen, "--accept %g is out of range (0 to 1)", o->accept);
        return -1;
    }
    double wall0 = now_s();
    char date[32];
    iso_date(date, sizeof date);

    struct nvml_sample before_load;
    nvml_read(&before_load);
    struct mem_poll poll = {.baseline = -1, .peak = -1, .pid_peak = -1};
    bool polling = false;
    if (before_load.available) {
        poll.baseline = before_load.mem_used;
        poll.peak = before_load.mem_used;
        polling = !pthread_create(&poll.thread, NULL, mem_poll_main, &poll);
    }

    struct engine_options eo = {.backend = o->backend, .threads = o->threads, .exact = o->exact};
    struct engine *e = NULL;
    struct seq *s = NULL;
    int32_t *prompt = NULL, *ids = NULL, *warm_ids = NULL;
    double *steps = NULL;
    int rc = -1;
    double t_load = now_s();
    if (engine_open(o->model_dir, &eo, &e, err, errlen)) goto done;
    t_load = now_s() - t_load;
    const struct geometry *g = engine_geometry(e);
    const struct model *m = engine_model(e);
    const char *backend = engine_backend(e);
    bool gpu = strcmp(backend, "cpu") != 0;
    if ((long long)N + D + 1 > g->max_ctx) {
        snprintf(err, errlen, "prompt %d + decode %d + 1 = %lld tokens exceeds the model's context of %d", N, D,
                 (long long)N + D + 1, g->max_ctx);
        goto done;
    }
    struct model_size ms = model_size_of(g);
    int threads = o->threads;
    if (!threads) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    json_t *device = gpu ? gpu_device_json(&before_load) : cpu_device_json(threads);
    const char *dev_name = json_str(device, "name");
    fprintf(stderr, "# device %s: %s", backend, dev_name ? dev_name : "unknown");
    if (gpu)
        fprintf(stderr, ", %g SMs, %.1f GB, peak %.0f GB/s", json_num(device, "sm_count"),
                json_num(device, "memory_bytes") / 1e9, json_num(device, "peak_gbs"));
    else
        fprintf(stderr, ", %d threads", threads);
    fprintf(stderr, "\n# model %s: %.3f B params, %.3f GB, %.3f bits/weight; KV cache %.3f GB at %d tokens\n", g->name,
            ms.params / 1e9, (double)m->file_bytes / 1e9, 8.0 * (double)m->file_bytes / (double)ms.params,
            (double)model_state_sizes(g).kv_bytes_per_token * (N + D + 1) / 1e9, N + D + 1);

    prompt = malloc(sizeof *prompt * (size_t)N);
    ids = malloc(sizeof *ids * (size_t)(D + 1));
    warm_ids = malloc(sizeof *warm_ids * (size_t)(D + 1));
    steps = malloc(sizeof *steps * (size_t)D);
    if (!prompt || !ids || !warm_ids || !steps) {
        snprintf(err, errlen, "out of memory for a %d-token prompt", N);
        goto done;
    }
    for (int i = 0; i < N; i++) prompt[i] = bench_prompt_token(i, g->vocab);
    if (seq_new(e, N + D + 1, &s, err, errlen)) goto done;

    const int vmax = engine_verify_max(e);
    const int len_max = vmax - 1 < DRAFT_LEN_MAX ? vmax - 1 : DRAFT_LEN_MAX;
    if (o->draft && vmax < 2) {
        snprintf(err, errlen, "the %s backend does not verify drafts (engine_verify_max %d)", backend, vmax);
        goto done;
    }
    if (o->draft && (o->draft_len < 1 || o->draft_len > len_max)) {
        snprintf(err, errlen, "--draft-len %d: the %s backend takes drafts of 1 to %d tokens", o->draft_len, backend,
                 len_max);
        goto done;
    }
    double warm_prefill, prefill;
    double tw = now_s();
    if (run_once(e, s, prompt, N, D, warm_ids, &warm_prefill, NULL, err, errlen)) goto done;
    tw = now_s() - tw;
    seq_reset(s);
    struct nvml_sample before, after;
    nvml_read(&before);
    if (run_once(e, s, prompt, N, D, ids, &prefill, steps, err, errlen)) goto done;
    struct spec_pass spec = {0};
    if (o->draft) { // a warmup of its own (the verification's shapes), then the timed pass
        seq_reset(s);
        if (spec_once(e, s, o, prompt, N, D, ids, &spec, err, errlen)) goto done;
        seq_reset(s);
        if (spec_once(e, s, o, prompt, N, D, ids, &spec, err, errlen)) goto done;
    }
    nvml_read(&after);
    long long rss = host_peak_rss();
    if (polling) {
        poll.stop = 1;
        pthread_join(poll.thread, NULL);
        polling = false;
    }

    // Decode figures.
    double sum = 0, *ms_steps = malloc(sizeof *ms_steps * (size_t)D);
    if (!ms_steps) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    for (int i = 0; i < D; i++) sum += steps[i], ms_steps[i] = 1e3 * steps[i];
    int k16 = D < 16 ? D : 16;
    double bytes_sum = 0;
    for (int i = 0; i < D; i++) bytes_sum += (double)bench_decode_bytes(g, (int64_t)N + i).total;
    struct bench_bytes b0 = bench_decode_bytes(g, N);
    double flop = bench_prefill_flop(g, N);

    char h_prompt[17], h_ids[17], h_id[17];
    hex64(bench_hash_tokens(prompt, N), h_prompt);
    hex64(bench_hash_tokens(ids, D + 1), h_ids);
    hex64(m->identity, h_id);
    char label[64];
    snprintf(label, sizeof label, "calla-%s", backend);

    json_t *r = json_object();
    json_object_set_new(r, "schema", json_string(BENCH_SCHEMA));
    json_object_set_new(r, "date", json_string(date));
    json_object_set_new(r, "label", json_string(o->label ? o->label : label));
    json_t *build = json_pack("{s:s, s:b, s:b, s:b}", "compiler", __VERSION__,
#ifdef __OPTIMIZE__
                              "optimized", 1,
#else
                              "optimized", 0,
#endif
#ifdef NDEBUG
                              "ndebug", 1,
#else
                              "ndebug", 0,
#endif
#ifdef CALLA_CUDA
                              "cuda", 1
#else
                              "cuda", 0
#endif
    );
    // The mode asked for (the CPU backend is the fp32 oracle, exact always). CALLA_EXACT=1, which
    // engine_open applies on top of the options, is not seen here: the engine does not report it.
    const char *mode = o->exact || !gpu ? "exact" : "fast";
    json_object_set_new(r, "engine",
                        json_pack("{s:s, s:s, s:s, s:s, s:b, s:o}", "name", "calla", "backend", backend, "mode", mode,
                                  "commit", CALLA_GIT_COMMIT, "dirty", CALLA_GIT_DIRTY, "build", build));
    struct utsname un;
    char host[128] = "unknown";
    gethostname(host, sizeof host - 1);
    uname(&un);
    json_object_set_new(r, "host",
                        json_pack("{s:s, s:s, s:s, s:I}", "hostname", host, "os", un.sysname, "kernel", un.release,
                                  "cpus", (json_int_t)sysconf(_SC_NPROCESSORS_ONLN)));
    json_object_set_new(r, "device", device);
    json_object_set_new(r, "checkpoint",
                        json_pack("{s:s, s:s, s:b, s:s, s:I, s:I, s:f, s:I, s:f}", "path", m->dir, "geometry", g->name,
                                  "test_geometry", g->is_test, "identity", h_id, "params", (json_int_t)ms.params,
                                  "bytes", (json_int_t)m->file_bytes, "bits_per_weight",
                                  8.0 * (double)m->file_bytes / (double)ms.params, "layers", (json_int_t)g->n_layers,
                                  "load_s", t_load));
    json_object_set_new(r, "prompt",
                        json_pack("{s:i, s:s, s:s}", "tokens", N, "rule",
                                  "token i = (i * 2654435761) mod 2^32 mod vocab", "hash", h_prompt));
    json_object_set_new(r, "decode_steps", json_integer(D));
    json_object_set_new(r, "limit", json_pack("{s:i, s:i}", "max_tokens", QWEN_MAX_CTX, "used", N + D + 1));
    json_object_set_new(r, "kv_cache_bytes", json_integer(model_state_sizes(g).kv_bytes_per_token * (N + D + 1)));
    json_object_set_new(r, "warmup",
                        json_pack("{s:f, s:f, s:b}", "prefill_s", warm_prefill, "total_s", tw, "tokens_match",
                                  !memcmp(warm_ids, ids, sizeof *ids * (size_t)(D + 1))));
    json_object_set_new(r, "prefill",
                        json_pack("{s:f, s:f, s:f, s:f}", "seconds", prefill, "tok_s", N / prefill, "flop", flop,
                                  "tflop_s", flop / prefill / 1e12));
    json_t *arr = json_array();
    for (int i = 0; i < D; i++) json_array_append_new(arr, json_real(ms_steps[i]));
    json_t *dec = json_pack("{s:i, s:f, s:f, s:f, s:f}", "steps", D, "seconds", sum, "tok_s", D / sum, "ms_mean",
                            mean_of(ms_steps, D), "ms_median", median_of(ms_steps, D));
    double mn = ms_steps[0], mx = ms_steps[0];
    for (int i = 0; i < D; i++) mn = fmin(mn, ms_steps[i]), mx = fmax(mx, ms_steps[i]);
    json_object_set_new(dec, "ms_std", json_real(std_of(ms_steps, D)));
    json_object_set_new(dec, "ms_min", json_real(mn));
    json_object_set_new(dec, "ms_max", json_real(mx));
    json_object_set_new(dec, "ms_first", json_real(ms_steps[0]));
    json_object_set_new(dec, "ms_first16", json_real(mean_of(ms_steps, k16)));
    json_object_set_new(dec, "ms_last16", json_real(mean_of(ms_steps + D - k16, k16)));
    json_object_set_new(dec, "bytes_per_step", json_real(bytes_sum / D));
    json_object_set_new(dec, "gb_s", json_real(bytes_sum / sum / 1e9));
    json_object_set_new(dec, "step_ms", arr);
    json_object_set_new(r, "decode", dec);
    json_object_set_new(
        r, "models",
        json_pack("{s:s, s:s, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I}}", "bytes",
                  "decode bytes/step = non-expert weights (projections, router, shared expert, norms) + "
                  "n_experts_used routed experts per layer (4-bit codes + bf16 scale/bias per 64) + lm_head + "
                  "one embedding row + bf16 KV of the attention layers at the step's context + DeltaNet "
                  "state read and written (fp32); GB/s = sum over steps / sum of step times",
                  "flop",
                  "prefill FLOP = 2 x active weights (routed experts top-k, no embed/lm_head) x N + "
                  "2 x vocab x hidden (one lm_head row) + causal attention 4 x heads x head_dim x N(N+1)/2 "
                  "per attention layer + DeltaNet 8 x v_heads x k_dim x v_dim x N per layer",
                  "decode_bytes_at_prompt", "dense", (json_int_t)b0.dense, "experts", (json_int_t)b0.experts, "lm_head",
                  (json_int_t)b0.lm_head, "embed", (json_int_t)b0.embed, "kv", (json_int_t)b0.kv, "state",
                  (json_int_t)b0.state, "total", (json_int_t)b0.total));
    json_t *idarr = json_array();
    for (int i = 0; i <= D; i++) json_array_append_new(idarr, json_integer(ids[i]));
    json_object_set_new(r, "tokens",
                        json_pack("{s:o, s:s, s:s}", "ids", idarr, "hash", h_ids, "note",
                                  "ids[0] from the prefill, ids[1..] from the decode steps"));
    json_t *mem = json_object();
    json_object_set_new(mem, "host_peak_rss_bytes", int_or_null(rss));
    json_object_set_new(mem, "host_method", json_string("VmHWM from /proc/self/status"));
    json_object_set_new(mem, "engine_weight_bytes", json_integer(engine_weight_bytes(e)));
    if (gpu && poll.peak >= 0 && poll.baseline >= 0) {
        json_object_set_new(mem, "device_peak_bytes", json_integer(poll.peak - poll.baseline));
        json_object_set_new(mem, "device_process_peak_bytes", int_or_null(poll.pid_peak));
        json_object_set_new(mem, "device_baseline_bytes", json_integer(poll.baseline));
        json_object_set_new(mem, "device_method",
                            json_string("NVML device memory used, polled every 5 ms from before engine_open to "
                                        "the last step, minus the reading before engine_open"));
    } else {
        json_object_set_new(mem, "device_peak_bytes", json_null());
        json_object_set_new(mem, "device_reason",
                            json_string(gpu ? before_load.reason : "CPU backend: no device memory"));
    }
    json_object_set_new(r, "memory", mem);
    json_object_set_new(r, "telemetry",
                        json_pack("{s:o, s:o}", "before", telemetry_json(&before), "after", telemetry_json(&after)));
    if (o->draft) json_object_set_new(r, "speculative", spec_json(o, &spec, D, D / sum));
    json_object_set_new(r, "wall_s", json_real(now_s() - wall0));
    free(ms_steps);
    *out = r;
    rc = 0;
done:
    if (polling) {
        poll.stop = 1;
        pthread_join(poll.thread, NULL);
    }
    if (s) seq_free(s);
    if (e) engine_close(e);
    free(prompt);
    free(ids);
    free(warm_ids);
    free(steps);
    return rc;
}

// ---- structure check (CI) ------------------------------------------------------------------

int bench_record_check(const json_t *r, char *err, size_t errlen) {
    static const char *strings[] = {"schema",
                                    "date",
                                    "label",
                                    "engine.name",
                                    "engine.commit",
                                    "device.name",
                                    "checkpoint.path",
                                    "checkpoint.geometry",
                                    "checkpoint.identity",
                                    "prompt.hash",
                                    "tokens.hash"};
    static const char *numbers[] = {"prompt.tokens",     "decode_steps",
                                    "prefill.seconds",   "prefill.tok_s",
                                    "prefill.tflop_s",   "decode.tok_s",
                                    "decode.ms_mean",    "decode.ms_median",
                                    "decode.ms_std",     "decode.ms_first",
                                    "decode.ms_first16", "decode.ms_last16",
                                    "decode.gb_s",       "memory.host_peak_rss_bytes"};
    static const char *present[] = {"engine.dirty",    "memory.device_peak_bytes",   "telemetry.before",
                                    "telemetry.after", "telemetry.before.available", "telemetry.after.available"};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!json_str(r, strings[i])) return snprintf(err, errlen, "missing string \"%s\"", strings[i]), -1;
    if (strcmp(json_str(r, "schema"), BENCH_SCHEMA))
        return snprintf(err, errlen, "schema \"%s\", expected \"%s\"", json_str(r, "schema"), BENCH_SCHEMA), -1;
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++)
        if (isnan(json_num(r, numbers[i]))) return snprintf(err, errlen, "missing number \"%s\"", numbers[i]), -1;
    for (size_t i = 0; i < sizeof present / sizeof present[0]; i++)
        if (!json_path(r, present[i])) return snprintf(err, errlen, "missing field \"%s\"", present[i]), -1;
    const json_t *tb = json_path(r, "telemetry.before.available");
    if (!json_is_boolean(tb)) return snprintf(err, errlen, "telemetry.before.available is not a boolean"), -1;
    if (!json_is_true(tb) && !json_str(r, "telemetry.before.reason"))
        return snprintf(err, errlen, "telemetry.before is unavailable without a reason"), -1;
    const json_t *mode = json_path(r, "engine.mode"); // optional: older records have none
    const char *ms = json_string_value(mode);         // NULL unless a string
    if (mode && (!ms || (strcmp(ms, "fast") && strcmp(ms, "exact"))))
        return snprintf(err, errlen, "engine.mode must be \"fast\" or \"exact\""), -1;
    if (json_is_null(json_path(r, "memory.device_peak_bytes")) && !json_str(r, "memory.device_reason"))
        return snprintf(err, errlen, "memory.device_peak_bytes is null without memory.device_reason"), -1;
    int D = (int)json_num(r, "decode_steps");
    const json_t *steps = json_path(r, "decode.step_ms"), *ids = json_path(r, "tokens.ids");
    if (!json_is_array(steps) || (int)json_array_size(steps) != D)
        return snprintf(err, errlen, "decode.step_ms must hold decode_steps (%d) times", D), -1;
    if (!json_is_array(ids) || (int)json_array_size(ids) != D + 1)
        return snprintf(err, errlen, "tokens.ids must hold decode_steps + 1 (%d) ids", D + 1), -1;
    const json_t *sp = json_path(r, "speculative"); // optional: --draft
    if (sp) {
        static const char *spec_numbers[] = {
            "speculative.draft_len", "speculative.drafted", "speculative.accepted",   "speculative.seconds",
            "speculative.tok_s",     "speculative.speedup", "speculative.acceptance", "speculative.mean_accepted"};
        const char *draft = json_str(r, "speculative.draft");
        if (!draft || (strcmp(draft, "oracle") && strcmp(draft, "lookup")))
            return snprintf(err, errlen, "speculative.draft must be \"oracle\" or \"lookup\""), -1;
        for (size_t i = 0; i < sizeof spec_numbers / sizeof spec_numbers[0]; i++)
            if (isnan(json_num(r, spec_numbers[i])))
                return snprintf(err, errlen, "missing number \"%s\"", spec_numbers[i]), -1;
        if (!json_is_boolean(json_path(r, "speculative.tokens_match")))
            return snprintf(err, errlen, "speculative.tokens_match is not a boolean"), -1;
        const json_t *gated = json_path(r, "speculative.gated"); // (records before the gate have none)
        if (gated && !json_is_boolean(gated)) return snprintf(err, errlen, "speculative.gated is not a boolean"), -1;
        if (!strcmp(draft, "oracle") && isnan(json_num(r, "speculative.accept_p")))
            return snprintf(err, errlen, "an oracle record needs speculative.accept_p"), -1;
    }
    return 0;
}

// ---- the command ---------------------------------------------------------------------------

int cmd_bench(int argc, char **argv) {
    const char *dir = NULL, *backend = NULL, *json_path_out = NULL, *label = NULL, *draft = NULL, *accept = NULL;
    long long context = 0, decode = 64, threads = 0, draft_len = 4, draft_seed = 1;
    bool exact = false, ungated = false;
    const struct opt opts[] = {
        {"model", OPT_STR, &dir, 0, 0, "checkpoint directory (real or synthetic)"},
        {"context", OPT_INT, &context, 1, QWEN_MAX_CTX, "prompt tokens N (N + decode + 1 <= 262,144)"},
        {"decode", OPT_INT, &decode, 1, 4096, "timed decode steps (default 64)"},
        {"backend", OPT_STR, &backend, 0, 0, "cpu or cuda (default: cuda when an sm_90 GPU is present)"},
        {"threads", OPT_INT, &threads, 0, 1024, "CPU backend threads (0: all cores)"},
        {"json", OPT_STR, &json_path_out, 0, 0, "where to write the JSON record"},
        {"label", OPT_STR, &label, 0, 0, "arm name recorded in the JSON (default calla-<backend>)"},
        {"exact", OPT_FLAG, &exact, 0, 0, "CUDA backend: the verification mode (recorded as engine.mode)"},
        {"draft", OPT_STR, &draft, 0, 0,
         "then the same tokens with speculative decoding: oracle (the plain tokens "
         "as drafts, --accept of them right) or lookup (the drafter)"},
        {"accept", OPT_STR, &accept, 0, 0,
         "--draft oracle: the probability P (0 to 1) that a draft token is right "
         "(default 1)"},
        {"draft-len", OPT_INT, &draft_len, 1, DRAFT_LEN_MAX,
         "--draft: oracle drafts of D tokens, lookup at most D "
         "(default 4; at most engine_verify_max - 1)"},
        {"draft-seed", OPT_INT, &draft_seed, 0, (long long)1 << 62,
         "--draft oracle: which tokens are wrong (default 1)"},
        {"ungated", OPT_FLAG, &ungated, 0, 0,
         "--draft: verify every draft (default: drafts pass the server's hit-rate gate)"},
    };
    const int n = sizeof opts / sizeof opts[0];
    const char *summary = "one benchmark measurement (docs/BENCH.md protocol) in this process; writes a JSON record";
    int b = opts_begin(argc, argv, "bench", summary, opts, n);
    if (b) return b > 0 ? 0 : 2;
    char err[1024];
    if (!dir || !context || !json_path_out) {
        fprintf(stderr, "calla bench: --model, --context and --json are required\n");
        opts_usage(stderr, "bench", summary, opts, n);
        return 2;
    }
    if (context + decode + 1 > QWEN_MAX_CTX) {
        fprintf(stderr,
                "calla bench: prompt %lld + decode %lld + 1 lookahead = %lld tokens exceeds the limit of %d "
                "(the longest prompt at %lld decode steps is %lld)\n",
                context, decode, context + decode + 1, QWEN_MAX_CTX, decode, QWEN_MAX_CTX - decode - 1);
        return 2;
    }
    double p = 1;
    if (accept) {
        char *end;
        errno = 0;
        p = strtod(accept, &end);
        if (errno || end == accept || *end || !(p >= 0 && p <= 1)) {
            fprintf(stderr, "calla bench: --accept \"%s\" is not a probability (0 to 1)\n", accept);
            return 2;
        }
    }
    if ((accept || draft_seed != 1) && (!draft || strcmp(draft, "oracle"))) {
        fprintf(stderr, "calla bench: --accept and --draft-seed are for --draft oracle\n");
        return 2;
    }
    if (ungated && !draft) {
        fprintf(stderr, "calla bench: --ungated is for --draft\n");
        return 2;
    }
    struct bench_options bo = {.model_dir = dir,
                               .context = (int)context,
                               .decode = (int)decode,
                               .backend = backend,
                               .threads = (int)threads,
                               .label = label,
                               .exact = exact,
                               .draft = draft,
                               .accept = p,
                               .draft_len = (int)draft_len,
                               .draft_seed = (uint64_t)draft_seed,
                               .ungated = ungated};
    json_t *r;
    if (bench_run(&bo, &r, err, sizeof err)) {
        fprintf(stderr, "calla bench: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (json_write_file(r, json_path_out, err, sizeof err)) {
        fprintf(stderr, "calla bench: %s\n", err);
        rc = 1;
    }
    double dev = json_num(r, "memory.device_peak_bytes");
    char devs[32] = "n/a";
    if (isfinite(dev)) snprintf(devs, sizeof devs, "%.2f GB", dev / 1e9);
    printf("%s %s ctx %d: prefill %.3f s (%.1f tok/s, %.3g TFLOP/s), decode %.2f tok/s (%.3f ms/token, "
           "%.3g GB/s), rss %.2f GB, device %s, tokens %s -> %s\n",
           json_str(r, "label"), json_str(r, "checkpoint.geometry"), (int)context, json_num(r, "prefill.seconds"),
           json_num(r, "prefill.tok_s"), json_num(r, "prefill.tflop_s"), json_num(r, "decode.tok_s"),
           json_num(r, "decode.ms_mean"), json_num(r, "decode.gb_s"), json_num(r, "memory.host_peak_rss_bytes") / 1e9,
           devs, json_str(r, "tokens.hash"), json_path_out);
    if (draft) {
        char how[64] = "lookup";
        if (!strcmp(draft, "oracle")) snprintf(how, sizeof how, "oracle P %.2f", p);
        printf("%s speculative %s, D %d: decode %.2f tok/s (%.2fx plain), acceptance %.3f, mean accepted %.2f, "
               "tokens %s\n",
               json_str(r, "label"), how, (int)draft_len, json_num(r, "speculative.tok_s"),
               json_num(r, "speculative.speedup"), json_num(r, "speculative.acceptance"),
               json_num(r, "speculative.mean_accepted"),
               json_is_true(json_object_get(json_object_get(r, "speculative"), "tokens_match")) ? "as plain"
                                                                                                : "DIFFER");
    }
    json_decref(r);
    return rc;
}
