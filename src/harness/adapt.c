// adapt.c: another engine as an arm beside ours. `calla adapt-llama-bench IN OUT` maps llama.cpp's
// `llama-bench -o json` output onto the bench record schema (bench.h), so the matrix runner and
// the report treat it like a Calla run.
//
// llama-bench reports one object per test: a prompt-processing test (n_prompt = N, n_gen = 0) and
// a text-generation test (n_prompt = 0, n_gen = D, n_depth = N for the context). Its numbers are
// the mean over its repetitions (avg_ns, avg_ts); the samples are kept. It does not time single
// decode steps, return token ids, or measure memory; those fields are null with a reason.
// Its prompt is random tokens, not our hash prompt, so expert routing differs (the reference
// report makes the same caveat about engine-to-engine comparisons).
#include "bench.h"

#include "commands.h"
#include "options.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Reads every JSON value in the file (an array, several arrays, or JSON lines) into one array of
// test objects.
static json_t *load_tests(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(err, errlen, "cannot open %s", path), NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) return snprintf(err, errlen, "out of memory reading %s", path), NULL;
    json_t *tests = json_array();
    size_t off = 0;
    while (off < n) {
        while (off < n && (buf[off] == ' ' || buf[off] == '\n' || buf[off] == '\r' || buf[off] == '\t')) off++;
        if (off >= n) break;
        json_error_t je;
        json_t *v = json_loadb(buf + off, n - off, JSON_DISABLE_EOF_CHECK, &je);
        if (!v) {
            snprintf(err, errlen, "%s: not llama-bench JSON at byte %zu: %s", path, off, je.text);
            json_decref(tests);
            free(buf);
            return NULL;
        }
        off += je.position;
        if (json_is_array(v))
            json_array_extend(tests, v);
        else if (json_is_object(v))
            json_array_append(tests, v);
        json_decref(v);
    }
    free(buf);
    if (!json_array_size(tests)) {
        snprintf(err, errlen, "%s holds no llama-bench tests", path);
        json_decref(tests);
        return NULL;
    }
    return tests;
}

static long long geti(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long long)json_integer_value(v) : json_is_real(v) ? (long long)json_real_value(v) : 0;
}

static json_t *copy_or_null(const json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return v ? json_deep_copy(v) : json_null();
}

int bench_adapt_llama_bench(const char *in_path, int context, const char *label, json_t **out, char *err,
                            size_t errlen) {
    *out = NULL;
    json_t *tests = load_tests(in_path, err, errlen);
    if (!tests) return -1;
    const json_t *pp = NULL, *tg = NULL;
    size_t i;
    json_t *t;
    int N = context;
    if (!N) {
        json_array_foreach(tests, i, t) {
            if (geti(t, "n_prompt") > N && geti(t, "n_gen") == 0) N = (int)geti(t, "n_prompt");
        }
    }
    json_array_foreach(tests, i, t) {
        long long np = geti(t, "n_prompt"), ng = geti(t, "n_gen"), nd = geti(t, "n_depth");
        if (np == N && ng == 0 && (!pp || nd == 0)) pp = t;
        if (np == 0 && ng > 0 && nd == N && !tg) tg = t;
    }
    if (pp && !tg) { // a generation test at another depth (older llama-bench has no -d): noted below
        json_array_foreach(tests, i, t) {
            if (!tg && geti(t, "n_prompt") == 0 && geti(t, "n_gen") > 0) tg = t;
        }
    }
    if (!pp && !tg) {
        snprintf(err, errlen, "%s: no prompt-processing test of %d tokens and no generation test", in_path, N);
        json_decref(tests);
        return -1;
    }
    if (!N && tg) N = (int)geti(tg, "n_depth");
    const json_t *any = pp ? pp : tg;
    const struct geometry *g = geometry_real();

    json_t *r = json_object();
    json_object_set_new(r, "schema", json_string(BENCH_SCHEMA));
    json_object_set_new(r, "date", copy_or_null(any, "test_time"));
    json_object_set_new(r, "label", json_string(label ? label : "llama.cpp"));
    json_object_set_new(r, "source", json_pack("{s:s, s:s}", "adapter", "calla adapt-llama-bench", "input", in_path));
    json_t *build = json_object();
    static const char *keys[] = {"build_number", "n_gpu_layers", "flash_attn", "type_k",     "type_v",
                                 "n_batch",      "n_ubatch",     "n_threads",  "split_mode", "use_mmap"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (json_object_get(any, keys[k])) json_object_set_new(build, keys[k], copy_or_null(any, keys[k]));
    json_t *eng = json_object();
    json_object_set_new(eng, "name", json_string("llama.cpp"));
    json_object_set_new(eng, "backend", copy_or_null(any, "backends"));
    json_object_set_new(eng, "commit", copy_or_null(any, "build_commit"));
    json_object_set_new(eng, "dirty", json_null());
    json_object_set_new(eng, "build", build);
    json_object_set_new(r, "engine", eng);
    const char *gpu = json_str(any, "gpu_info");
    json_t *dev = json_object();
    json_object_set_new(dev, "kind", json_string(gpu && *gpu ? "gpu" : "cpu"));
    const char *cpu = json_str(any, "cpu_info");
    json_object_set_new(dev, "name", json_string(gpu && *gpu ? gpu : cpu ? cpu : "unknown"));
    json_object_set_new(dev, "cpu", copy_or_null(any, "cpu_info"));
    json_object_set_new(dev, "driver", json_null());
    json_object_set_new(r, "device", dev);
    json_t *ck = json_object();
    json_object_set_new(ck, "path", copy_or_null(any, "model_filename"));
    json_object_set_new(ck, "geometry", copy_or_null(any, "model_type"));
    json_object_set_new(ck, "identity", json_null());
    json_object_set_new(ck, "params", copy_or_null(any, "model_n_params"));
    json_object_set_new(ck, "bytes", copy_or_null(any, "model_size"));
    json_object_set_new(r, "checkpoint", ck);
    json_object_set_new(r, "prompt", json_pack("{s:i, s:s}", "tokens", N, "rule", "llama-bench's random tokens"));
    int D = tg ? (int)geti(tg, "n_gen") : 0;
    json_object_set_new(r, "decode_steps", json_integer(D));
    if (pp) {
        double s = geti(pp, "avg_ns") / 1e9;
        json_t *p = json_pack("{s:f, s:f, s:f}", "seconds", s, "tok_s", json_num(pp, "avg_ts"), "stddev_s",
                              geti(pp, "stddev_ns") / 1e9);
        json_object_set_new(p, "samples_tok_s", copy_or_null(pp, "samples_ts"));
        double flop = bench_prefill_flop(g, N);
        json_object_set_new(p, "tflop_s", json_real(flop / s / 1e12));
        json_object_set_new(p, "note",
                            json_string("prompt processing time of llama-bench's pp test (no sampling); "
                                        "TFLOP/s from Calla's FLOP model of the real geometry"));
        json_object_set_new(r, "prefill", p);
    } else {
        json_object_set_new(r, "prefill", json_pack("{s:n, s:n, s:s}", "seconds", "tok_s", "note", "no pp test"));
    }
    if (tg) {
        double ts = json_num(tg, "avg_ts"), depth = (double)geti(tg, "n_depth");
        double bytes = 0;
        for (int k = 0; k < D; k++) bytes += (double)bench_decode_bytes(g, (int64_t)depth + k).total;
        json_t *d = json_pack("{s:i, s:f, s:f, s:f, s:f}", "steps", D, "seconds", geti(tg, "avg_ns") / 1e9, "tok_s", ts,
                              "ms_mean", 1e3 / ts, "depth", depth);
        json_object_set_new(d, "samples_tok_s", copy_or_null(tg, "samples_ts"));
        json_object_set_new(d, "bytes_per_step", json_real(D ? bytes / D : NAN));
        json_object_set_new(d, "gb_s", json_real(D ? bytes / D * ts / 1e9 : NAN));
        json_object_set_new(d, "step_ms", json_null());
        json_object_set_new(d, "note",
                            json_string(depth == N ? "tg test at depth N; llama-bench does not time single "
                                                     "steps (first/last 16, std unavailable)"
                                                   : "tg test at a depth other than the prompt length"));
        json_object_set_new(r, "decode", d);
    } else {
        json_object_set_new(r, "decode", json_pack("{s:n, s:s}", "tok_s", "note", "no tg test"));
    }
    json_object_set_new(
        r, "tokens",
        json_pack("{s:n, s:n, s:s}", "ids", "hash", "note", "llama-bench does not return generated tokens"));
    json_object_set_new(r, "memory",
                        json_pack("{s:n, s:n, s:s}", "host_peak_rss_bytes", "device_peak_bytes", "device_reason",
                                  "llama-bench does not report memory"));
    json_t *na = json_pack("{s:b, s:s}", "available", 0, "reason", "external engine: not sampled by the adapter");
    json_object_set_new(r, "telemetry", json_pack("{s:O, s:O}", "before", na, "after", na));
    json_decref(na);
    json_decref(tests);
    *out = r;
    return 0;
}

int cmd_adapt_llama_bench(int argc, char **argv) {
    const char *label = NULL;
    long long context = 0;
    const struct opt opts[] = {
        {"context", OPT_INT, &context, 0, 1 << 20, "prompt tokens of the pp test to take (0: the largest)"},
        {"label", OPT_STR, &label, 0, 0, "arm name (default llama.cpp)"},
    };
    const int n = sizeof opts / sizeof opts[0];
    const char *summary = "IN OUT: map `llama-bench -o json` output (IN) onto one bench record (OUT)";
    // positional IN OUT first, flags after
    bool positional = argc >= 3 && strncmp(argv[1], "--", 2) && strncmp(argv[2], "--", 2);
    if (!positional && !opts_wants_help(argc, argv)) {
        opts_usage(stderr, "adapt-llama-bench", summary, opts, n);
        return 2;
    }
    int b = positional ? opts_begin(argc - 2, argv + 2, "adapt-llama-bench", summary, opts, n)
                       : opts_begin(argc, argv, "adapt-llama-bench", summary, opts, n);
    if (b) return b > 0 ? 0 : 2;
    char err[1024];
    json_t *r;
    if (bench_adapt_llama_bench(argv[1], (int)context, label, &r, err, sizeof err) ||
        json_write_file(r, argv[2], err, sizeof err)) {
        fprintf(stderr, "calla adapt-llama-bench: %s\n", err);
        return 1;
    }
    printf("%s ctx %d: prefill %.3f s (%.1f tok/s), decode %.2f tok/s -> %s\n", json_str(r, "label"),
           (int)json_num(r, "prompt.tokens"), json_num(r, "prefill.seconds"), json_num(r, "prefill.tok_s"),
           json_num(r, "decode.tok_s"), argv[2]);
    json_decref(r);
    return 0;
}
