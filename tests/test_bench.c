// test_bench.c: the CI smoke run of the benchmark harness (issue 7). Checks structure, never timings:
//   - the byte and FLOP models at the real geometry against docs/BENCH.md's arithmetic
//   - the prompt rule and the context limit (refused with the numbers)
//   - one in-process bench record at the tiny geometry: every field docs/BENCH.md lists
//   - the speculative pass (--draft oracle at P = 1, 0, 0.5; --draft lookup) and its refusals
//   - the llama-bench adapter on a llama-bench JSON sample
//   - `calla matrix` on the CPU (tiny geometry, contexts 64 and 128, 4 steps, 2 rounds): raw
//     records, matrix.json, report.md sections, the two SVG plots, ratio tables with --compare
// The matrix runs $(BUILD)/calla next to this binary (build/tests/test_bench -> build/calla).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness/bench.h"
#include "commands.h"
#include "harness/report.h"
#include "synth.h"
#include "util.h"

static char g_tmp[1024];   // per-run scratch folder
static char g_model[1100]; // tiny checkpoint inside it

static int setup_all(void **state) {
    const char *t = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/calla-test-bench-%d", t && *t ? t : "/tmp", (int)getpid());
    snprintf(g_model, sizeof g_model, "%s/tiny", g_tmp);
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_tmp, g_tmp);
    if (system(cmd)) return -1;
    struct synth_options so = {
        .g = geometry_find("tiny"), .seed = 1, .out_dir = g_model, .max_shard_bytes = (int64_t)5 << 30};
    char err[512];
    if (synth_write(&so, err, sizeof err)) {
        fprintf(stderr, "synth: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown_all(void **state) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) ? -1 : 0;
}

static void test_models(void **state) {
    const struct geometry *g = geometry_real();
    // docs/BENCH.md: decode reads ~1.88 GB at 4K, ~3.14 GB at 64K, ~7.16 GB at 256K.
    struct bench_bytes b4 = bench_decode_bytes(g, 4096), b64 = bench_decode_bytes(g, 65536),
                       b256 = bench_decode_bytes(g, 262144);
    assert_true(fabs(b4.total / 1e9 - 1.88) < 0.02);
    assert_true(fabs(b64.total / 1e9 - 3.14) < 0.03);
    assert_true(fabs(b256.total / 1e9 - 7.16) < 0.05);
    assert_int_equal(model_state_sizes(g).kv_bytes_per_token, 10 * 2 * 2 * 256 * 2);
    assert_true(b4.experts < b4.dense); // 8 of 256 experts
    // ~4.9-5.0 GFLOP per token plus 81,920 N^2 of attention
    double per_token = bench_prefill_flop(g, 2) - bench_prefill_flop(g, 1) - 81920.0 * 3;
    assert_true(per_token > 4.8e9 && per_token < 5.1e9);
    double big = bench_prefill_flop(g, 262079), attn = 81920.0 * 262079.0 * 262079.0;
    assert_true(big > attn && big < attn * 1.25);
    assert_int_equal(bench_prompt_token(0, QWEN_VOCAB), 0);
    assert_int_equal(bench_prompt_token(1, QWEN_VOCAB), (int32_t)(2654435761u % QWEN_VOCAB));
    assert_int_equal(bench_prompt_token(2, QWEN_VOCAB), (int32_t)((uint32_t)(2ull * 2654435761u) % QWEN_VOCAB));
}

static void test_limit(void **state) {
    struct bench_options o = {.model_dir = g_model, .context = 262080, .decode = 64, .backend = "cpu"};
    json_t *r;
    char err[512];
    assert_int_equal(bench_run(&o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "262145"));
    assert_non_null(strstr(err, "262079"));
}

static void test_record(void **state) {
    struct bench_options o = {.model_dir = g_model, .context = 32, .decode = 3, .backend = "cpu", .label = "t"};
    json_t *r;
    char err[512];
    if (bench_run(&o, &r, err, sizeof err)) fail_msg("bench_run: %s", err);
    if (bench_record_check(r, err, sizeof err)) fail_msg("record: %s", err);
    assert_string_equal(json_str(r, "label"), "t");
    assert_string_equal(json_str(r, "engine.backend"), "cpu");
    assert_string_equal(json_str(r, "engine.mode"), "exact"); // the CPU backend: exact always
    assert_int_equal((int)json_num(r, "prompt.tokens"), 32);
    assert_true(json_is_true(json_object_get(json_object_get(r, "warmup"), "tokens_match")));
    assert_true(json_is_boolean(json_object_get(json_object_get(r, "engine"), "dirty")));
    assert_true(json_num(r, "memory.host_peak_rss_bytes") > 0);
    // engine.mode is optional (older records have none), but when present "fast" or "exact"
    json_t *eng = json_object_get(r, "engine");
    json_object_set_new(eng, "mode", json_string("fast"));
    if (bench_record_check(r, err, sizeof err)) fail_msg("mode fast: %s", err);
    json_object_del(eng, "mode");
    if (bench_record_check(r, err, sizeof err)) fail_msg("no mode: %s", err);
    json_object_set_new(eng, "mode", json_string("quick"));
    assert_int_equal(bench_record_check(r, err, sizeof err), -1);
    assert_non_null(strstr(err, "engine.mode"));
    json_object_set_new(eng, "mode", json_integer(1));
    assert_int_equal(bench_record_check(r, err, sizeof err), -1);
    json_decref(r);
}

// --draft: the speculative pass on the CPU. oracle P = 1 accepts every draft token, P = 0 none:
// ungated it verifies a draft every step, gated (the CPU's gate, the drafter's default 0.5 at a
// weight of 0.2) four misses shut the gate and the rest are plain steps; lookup runs the drafter;
// the tokens are the plain pass's in every case; refusals name the flag.
static void test_speculative(void **state) {
    char err[512];
    json_t *r;
    const struct {
        const char *draft;
        double p;
        bool ungated;
    } runs[] = {
        {"oracle", 1, false}, {"oracle", 0, true}, {"oracle", 0, false}, {"oracle", 0.5, true}, {"lookup", 0, false}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        struct bench_options o = {.model_dir = g_model,
                                  .context = 32,
                                  .decode = 12,
                                  .backend = "cpu",
                                  .draft = runs[i].draft,
                                  .accept = runs[i].p,
                                  .draft_len = 4,
                                  .draft_seed = 1,
                                  .ungated = runs[i].ungated};
        if (bench_run(&o, &r, err, sizeof err)) fail_msg("bench_run %s: %s", runs[i].draft, err);
        if (bench_record_check(r, err, sizeof err)) fail_msg("record %s: %s", runs[i].draft, err);
        json_t *sp = json_object_get(r, "speculative");
        assert_true(json_is_true(json_object_get(sp, "tokens_match")));
        const double drafted = json_num(r, "speculative.drafted"), accepted = json_num(r, "speculative.accepted");
        assert_true(json_num(r, "speculative.tok_s") > 0 && json_num(r, "speculative.speedup") > 0);
        assert_true(json_is_boolean(json_object_get(sp, "gated")) &&
                    json_is_true(json_object_get(sp, "gated")) == !runs[i].ungated);
        if (!strcmp(runs[i].draft, "oracle") && runs[i].p == 1) {
            // 12 tokens after the first: drafts of 4, 4 and 1 (never the last token), all right
            assert_int_equal((int)drafted, 9);
            assert_int_equal((int)accepted, 9);
            assert_true(json_num(r, "speculative.acceptance") == 1.0);
            assert_true(fabs(json_num(r, "speculative.mean_accepted") - 3.0) < 1e-9);
        } else if (!strcmp(runs[i].draft, "oracle") && runs[i].p == 0 && runs[i].ungated) {
            assert_true(drafted > 0);
            assert_int_equal((int)accepted, 0);
            assert_int_equal((int)json_num(r, "speculative.verifications"), 11); // one token a step; the last plain
        } else if (!strcmp(runs[i].draft, "oracle") && runs[i].p == 0) {
            assert_int_equal((int)accepted, 0);
            // rate 1 -> 0.8 -> 0.64 -> 0.51 -> 0.41: shut, and the looked-at drafts are wrong too
            assert_int_equal((int)json_num(r, "speculative.verifications"), 4);
            assert_int_equal((int)json_num(r, "speculative.plain_steps"), 8);
        } else if (!strcmp(runs[i].draft, "oracle")) {
            assert_true(accepted > 0 && accepted < drafted);
            assert_true(fabs(json_num(r, "speculative.accept_p") - 0.5) < 1e-9);
        } else {
            assert_true(json_is_null(json_object_get(sp, "accept_p")));
        }
        json_decref(r);
    }
    // A record without the pass has no "speculative"; a broken one is refused.
    struct bench_options o = {.model_dir = g_model,
                              .context = 16,
                              .decode = 2,
                              .backend = "cpu",
                              .draft = "oracle",
                              .accept = 1,
                              .draft_len = 2,
                              .draft_seed = 1};
    if (bench_run(&o, &r, err, sizeof err)) fail_msg("bench_run: %s", err);
    json_object_del(json_object_get(r, "speculative"), "acceptance");
    assert_int_equal(bench_record_check(r, err, sizeof err), -1);
    assert_non_null(strstr(err, "speculative.acceptance"));
    json_decref(r);
    o.draft_len = 8; // the CPU backend verifies 8 tokens: drafts of at most 7
    assert_int_equal(bench_run(&o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "--draft-len 8"));
    o.draft_len = 2, o.accept = 1.5;
    assert_int_equal(bench_run(&o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "--accept"));
    o.accept = 1, o.draft = "mtp";
    assert_int_equal(bench_run(&o, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "oracle or lookup"));
}

static const char llama_sample[] =
    "[{\"build_commit\": \"8cf427ff\", \"build_number\": 5163, \"cpu_info\": \"x\", \"gpu_info\": \"NVIDIA H200\","
    " \"backends\": \"CUDA\", \"model_filename\": \"q.gguf\", \"model_type\": \"qwen35moe 35B.A3B Q4_K\","
    " \"model_size\": 19000000000, \"model_n_params\": 34660610688, \"n_gpu_layers\": 99, \"n_prompt\": 512,"
    " \"n_gen\": 0, \"n_depth\": 0, \"test_time\": \"2026-11-29T00:00:00Z\", \"avg_ns\": 100000000,"
    " \"stddev_ns\": 1000, \"avg_ts\": 5120.0, \"stddev_ts\": 1.0, \"samples_ns\": [100000000],"
    " \"samples_ts\": [5120.0]}]\n"
    "[{\"build_commit\": \"8cf427ff\", \"gpu_info\": \"NVIDIA H200\", \"backends\": \"CUDA\", \"n_prompt\": 0,"
    " \"n_gen\": 64, \"n_depth\": 512, \"test_time\": \"2026-11-29T00:00:01Z\", \"avg_ns\": 320000000,"
    " \"stddev_ns\": 1000, \"avg_ts\": 200.0, \"stddev_ts\": 0.5, \"samples_ns\": [320000000],"
    " \"samples_ts\": [200.0]}]\n";

static void test_adapter(void **state) {
    char in[1200], err[512];
    snprintf(in, sizeof in, "%s/llama.json", g_tmp);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    fputs(llama_sample, f);
    fclose(f);
    json_t *r;
    if (bench_adapt_llama_bench(in, 0, NULL, &r, err, sizeof err)) fail_msg("adapt: %s", err);
    assert_string_equal(json_str(r, "schema"), BENCH_SCHEMA);
    assert_string_equal(json_str(r, "label"), "llama.cpp");
    assert_string_equal(json_str(r, "engine.commit"), "8cf427ff");
    assert_int_equal((int)json_num(r, "prompt.tokens"), 512);
    assert_int_equal((int)json_num(r, "decode_steps"), 64);
    assert_true(fabs(json_num(r, "prefill.seconds") - 0.1) < 1e-9);
    assert_true(fabs(json_num(r, "decode.tok_s") - 200.0) < 1e-9);
    assert_true(fabs(json_num(r, "decode.ms_mean") - 5.0) < 1e-9);
    assert_true(json_num(r, "decode.gb_s") > 0);
    assert_true(json_is_null(json_object_get(json_object_get(r, "memory"), "device_peak_bytes")));
    assert_non_null(json_str(r, "memory.device_reason"));
    json_decref(r);
    assert_int_equal(bench_adapt_llama_bench(in, 4096, NULL, &r, err, sizeof err), -1); // no such test
}

static void test_matrix(void **state) {
    char self[1024], calla[1100], out[1200], ref[1200], path[1400];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = 0;
    snprintf(calla, sizeof calla, "%s/../calla", dirname(self));
    if (access(calla, X_OK)) skip();
    snprintf(out, sizeof out, "%s/results", g_tmp);
    snprintf(ref, sizeof ref, "bench/reference/lily_m5.json");
    bool have_ref = !access(ref, R_OK);
    char *argv[] = {"matrix",
                    "--model",
                    g_model,
                    "--engines",
                    "cpu",
                    "--contexts",
                    "64,128",
                    "--decode",
                    "4",
                    "--rounds",
                    "2",
                    "--cooldown-min-s",
                    "0",
                    "--out",
                    out,
                    "--calla",
                    calla,
                    have_ref ? "--reference" : "--no-reference",
                    have_ref ? ref : NULL,
                    NULL};
    int argc = have_ref ? 19 : 18;
    assert_int_equal(cmd_matrix(argc, argv), 0);

    const int ctx[] = {64, 128};
    for (int c = 0; c < 2; c++)
        for (int r = 1; r <= 2; r++) {
            snprintf(path, sizeof path, "%s/calla-cpu-%d-r%d.json", out, ctx[c], r);
            json_error_t je;
            json_t *j = json_load_file(path, 0, &je);
            if (!j) fail_msg("%s: %s", path, je.text);
            char err[512];
            if (bench_record_check(j, err, sizeof err)) fail_msg("%s: %s", path, err);
            assert_int_equal((int)json_num(j, "matrix.round"), r);
            assert_int_equal((int)json_num(j, "decode_steps"), 4);
            json_decref(j);
        }
    snprintf(path, sizeof path, "%s/matrix.json", out);
    json_t *m = json_load_file(path, 0, NULL);
    assert_non_null(m);
    assert_non_null(json_str(m, "preflight.verdict"));
    assert_non_null(json_str(m, "finished"));
    assert_int_equal(json_array_size(json_object_get(m, "runs")), 4);
    assert_int_equal(json_array_size(json_object_get(m, "cooldowns")), 3);
    assert_int_equal((int)json_num(m, "nondeterministic_cells"), 0);
    json_decref(m);

    // report against itself as another results folder: the ratio tables appear
    struct report_options ro = {.dir = out, .compare_dir = out, .reference = have_ref ? ref : NULL};
    char err[512];
    if (report_write(&ro, err, sizeof err)) fail_msg("report: %s", err);
    snprintf(path, sizeof path, "%s/report.md", out);
    char *md = read_file(path, NULL);
    assert_non_null(md);
    static const char *sections[] = {"## Run",
                                     "## Identity",
                                     "## Determinism",
                                     "## Sweep",
                                     "### calla-cpu",
                                     "| Prompt tokens | Prefill time | Prefill tok/s | Decode tok/s | Decode ms/token",
                                     "## Ratios",
                                     "#### calla-cpu / calla-cpu [results]",
                                     "## Decode ms/token against context",
                                     "Per 1K tokens of context",
                                     "## Prefill scaling per context doubling",
                                     "## Step drift",
                                     "## Memory",
                                     "## Telemetry",
                                     "decode_ms.svg",
                                     "prefill_tps.svg",
                                     "identical",
                                     "| calla cpu, exact |"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
        if (!strstr(md, sections[i])) fail_msg("report.md lacks \"%s\"", sections[i]);
    if (have_ref && (!strstr(md, "### M5 Pro (reference)") || !strstr(md, "### M5 Max (reference)")))
        fail_msg("report.md lacks the reference rows");
    free(md);
    static const char *svgs[] = {"decode_ms.svg", "prefill_tps.svg"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", out, svgs[i]);
        char *svg = read_file(path, NULL);
        assert_non_null(svg);
        assert_non_null(strstr(svg, "<svg"));
        assert_non_null(strstr(svg, "<polyline"));
        assert_non_null(strstr(svg, "</svg>"));
        free(svg);
    }
}

static void test_matrix_refusals(void **state) {
    char out[1200];
    snprintf(out, sizeof out, "%s/refused", g_tmp);
    // over the limit: refused before anything runs, with the numbers
    char *a1[] = {"matrix", "--model", g_model, "--engines", "cpu", "--contexts", "262080", "--out", out, NULL};
    assert_int_equal(cmd_matrix(9, a1), 2);
    char *a2[] = {"matrix", "--model", g_model, "--engines", "tpu", "--out", out, NULL};
    assert_int_equal(cmd_matrix(7, a2), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models),          cmocka_unit_test(test_limit),   cmocka_unit_test(test_record),
        cmocka_unit_test(test_speculative),     cmocka_unit_test(test_adapter), cmocka_unit_test(test_matrix),
        cmocka_unit_test(test_matrix_refusals),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
