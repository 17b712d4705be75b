// test_golden.c: the CPU engine against Hugging Face transformers (fixtures in tests/golden/).
//
// For every fixture: synthesize its checkpoint (same geometry, seed and synth profile as the
// generator used: "-trained" at the end of the reference name for the trained profile),
// prefill the prompt, and compare
//   - logits at the fixture's positions: normalised error ||ours - ref|| / ||ref|| over the kept
//     vocabulary ids, against TOL_F32 with an fp32 KV cache (the reference is fp32 throughout)
//     and TOL_BF16_KV with the production bf16 KV cache;
//   - the top-1 id wherever the reference's top1 - top2 margin is clear (> MARGIN_RMS x row rms);
//   - the greedy continuation, token for token, up to the first step whose reference margin is
//     not clear (and at least MIN_GEN tokens must be checked).
// Environment: CALLA_GOLDEN_FILES (colon-separated fixture paths; default tests/golden/*.golden),
// CALLA_GOLDEN_MODEL (use this checkpoint directory instead of synthesizing; its profile must be the
// fixture's), CALLA_BACKEND.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <glob.h>
#include <math.h>
#include <unistd.h>

#include "engine.h"
#include "golden.h"
#include "synth.h"

// fp32 vs fp32: only summation order differs (HF also runs the chunked delta rule, we run the
// recurrence). Measured at the test geometries: 2e-6 .. 1.3e-5, so 1e-4. At the full shape the
// 8-of-256 routing over 40 layers amplifies reassociation (measured 6.5e-5 .. 1.0e-4 on the
// 16-token fixture against HF fp32 on an H200, 2026-11-29), so 5e-4 there. Open: on the 64-token
// fixture the CPU engine gives 6.6e-5 and 8.4e-5 at positions 0 and 21 but 1.6e-3 at 42 and
// 1.6e-2 at 63 (top-1 the same at all four), against HF's chunked and its recurrent delta rule
// alike; a flipped near-tie among the prompt's 2,560 routing decisions would do this, but that
// is not proven (bench/NOTES.md), so the tolerance stays and that fixture fails it on the CPU.
#define TOL_F32      1e-4
#define TOL_F32_FULL 5e-4
// bf16 KV: K and V rounded to 8 mantissa bits in a quarter of the layers; measured 6e-5 .. 1.3e-3
// at the test geometries. At the full shape (random weights) the 8-of-256 routing over 40 layers
// amplifies those roundings: the CPU with a bf16 KV cache differs from itself with an fp32 one
// by a normalised error of 6.2e-2 on average and 1.9e-1 at worst over 96 rows (measured on the
// H200 machine, tests/gpu/test_cuda_e2e.c, 2026-11-29), so 2.5e-1 there; the tight full-shape
// check is the fp32-KV one above.
#define TOL_BF16_KV      1e-2
#define TOL_BF16_KV_FULL 2.5e-1
// A reference decision is "clear" when top1 - top2 exceeds a fraction of the row rms: MARGIN_RMS,
// or the mode's normalised-error tolerance when that is larger (an engine allowed to differ from
// the reference by 25% of the rms, as with a bf16 KV cache at the full shape, may rank two tokens
// 5% apart either way). Greedy decisions are checked teacher-forced: every step gets the
// reference's own prefix, and each clear step must pick the reference's token; at least MIN_GEN
// clear steps (4 at the full shape, where few margins are clear) must have been checked.
#define MARGIN_RMS   1e-2
#define MIN_GEN      16
#define MIN_GEN_FULL 4

static const char *tmpdir(void) {
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

// The fixture's synth profile: make_golden.py appends "-trained" to the reference name for a
// trained-profile checkpoint; the committed fixtures are all uniform.
static enum synth_profile fixture_profile(const struct golden *gd) {
    return strstr(gd->ref, "-trained") ? SYNTH_PROFILE_TRAINED : SYNTH_PROFILE_UNIFORM;
}

static int checkpoint_for(const struct golden *gd, char *dir, size_t n) {
    const char *model = getenv("CALLA_GOLDEN_MODEL");
    enum synth_profile want = fixture_profile(gd), have;
    char err[512];
    if (model) {
        snprintf(dir, n, "%s", model);
        if (synth_profile_of(model, &have, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return -1;
        }
        if (have != want) {
            fprintf(stderr,
                    "%s is a %s-profile checkpoint, the fixture was made from a %s one (calla synth --profile)\n",
                    model, synth_profile_name(have), synth_profile_name(want));
            return -1;
        }
        return 0;
    }
    snprintf(dir, n, "%s/calla-test-%s-%llu-%d", tmpdir(), gd->geometry, (unsigned long long)gd->seed, (int)getpid());
    const struct geometry *g = geometry_find(gd->geometry);
    if (!g) return -1;
    struct synth_options so = {
        .g = g, .profile = want, .seed = gd->seed, .out_dir = dir, .max_shard_bytes = (int64_t)5 << 30};
    if (synth_write(&so, err, sizeof err)) {
        fprintf(stderr, "synth: %s\n", err);
        return -1;
    }
    return 0;
}

static void remove_dir(const char *dir) {
    if (getenv("CALLA_GOLDEN_MODEL")) return;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

// Prefill + compare logits rows; then the greedy steps, teacher-forced. Returns the worst
// normalised error.
static double check_one(const struct golden *gd, const char *dir, bool kv_f32, double tol) {
    struct engine_options eo = {.backend = getenv("CALLA_BACKEND"), .kv_f32 = kv_f32};
    struct engine *e;
    char err[1024];
    if (engine_open(dir, &eo, &e, err, sizeof err)) fail_msg("engine_open: %s", err);
    const struct geometry *g = engine_geometry(e);
    const int V = g->vocab;
    const double clear = tol > MARGIN_RMS ? tol : MARGIN_RMS; // margin / rms above which a decision is clear
    struct seq *s;
    assert_int_equal(seq_new(e, (int)(gd->n_prompt + gd->n_gen + 1), &s, err, sizeof err), 0);
    int rows[64];
    for (uint32_t i = 0; i < gd->n_rows; i++) rows[i] = (int)gd->rows[i].pos;
    float *lg = malloc(sizeof(float) * (size_t)gd->n_rows * V);
    struct forward_opts fo = {.logit_rows = rows, .n_logit_rows = (int)gd->n_rows, .logits = lg};
    int32_t next;
    if (engine_forward(e, s, gd->prompt, (int)gd->n_prompt, &fo, &next, err, sizeof err)) fail_msg("forward: %s", err);
    double worst = 0;
    for (uint32_t i = 0; i < gd->n_rows; i++) {
        const struct golden_row *r = &gd->rows[i];
        const float *ours = lg + (size_t)i * V;
        double num = 0, den = 0, maxd = 0;
        for (uint32_t k = 0; k < r->n_ids; k++) {
            double d = (double)ours[r->ids[k]] - r->logits[k];
            num += d * d;
            den += (double)r->logits[k] * r->logits[k];
            if (fabs(d) > maxd) maxd = fabs(d);
        }
        double nerr = sqrt(num / den);
        int top = argmax(ours, V);
        printf("  %-6s %s kv=%s pos %4u: nerr %.3e (tol %.0e) max|d| %.3e  top1 %d/%d margin %.3f\n", gd->geometry,
               gd->ref, kv_f32 ? "f32 " : "bf16", r->pos, nerr, tol, maxd, top, r->top1, r->margin);
        if (nerr > worst) worst = nerr;
        if (!(nerr <= tol)) fail_msg("%s pos %u: normalised error %.3e > %.0e", gd->geometry, r->pos, nerr, tol);
        if (r->margin > clear * r->rms && top != r->top1)
            fail_msg("%s pos %u: top-1 %d, reference %d (margin %.4f)", gd->geometry, r->pos, top, r->top1, r->margin);
    }
    // Greedy steps, teacher-forced: step k sees the prompt and the reference's tokens 0 .. k-1.
    const double rms_last = gd->rows[gd->n_rows - 1].rms;
    uint32_t checked = 0, same = 0;
    int32_t tok = next;
    for (uint32_t k = 0; k < gd->n_gen; k++) {
        same += tok == gd->gen[k];
        if (gd->gen_margin[k] > clear * rms_last) {
            checked++;
            if (tok != gd->gen[k])
                fail_msg("%s: step %u picks %d, reference %d (margin %.4f)", gd->geometry, k, tok, gd->gen[k],
                         gd->gen_margin[k]);
        }
        int32_t fed = gd->gen[k];
        if (k + 1 < gd->n_gen && engine_forward(e, s, &fed, 1, NULL, &tok, err, sizeof err))
            fail_msg("decode: %s", err);
    }
    printf("  %-6s greedy steps (teacher-forced): %u of %u pick the reference's token; all %u clear ones do\n",
           gd->geometry, same, gd->n_gen, checked);
    const uint32_t min_gen = g->is_test ? MIN_GEN : MIN_GEN_FULL;
    if (checked < min_gen && checked < gd->n_gen) fail_msg("only %u greedy steps had a clear margin", checked);
    free(lg);
    seq_free(s);
    engine_close(e);
    return worst;
}

static void test_fixture(void **state) {
    const char *path = *state;
    struct golden gd;
    assert_int_equal(golden_load(path, &gd), 0);
    printf("%s: %s, seed %llu, prompt %u, %u rows, %u generated\n", path, gd.geometry, (unsigned long long)gd.seed,
           gd.n_prompt, gd.n_rows, gd.n_gen);
    char dir[4096];
    assert_int_equal(checkpoint_for(&gd, dir, sizeof dir), 0);
    bool fp32_ref = strstr(gd.ref, "float32") != NULL;
    const struct geometry *g = geometry_find(gd.geometry);
    assert_non_null(g);
    // The fp32 KV cache exists on the CPU only (the reference mode); CUDA always runs bf16 KV.
    const char *backend = getenv("CALLA_BACKEND");
    if (fp32_ref && !(backend && !strcmp(backend, "cuda")))
        check_one(&gd, dir, true, g->is_test ? TOL_F32 : TOL_F32_FULL);
    check_one(&gd, dir, false, g->is_test ? TOL_BF16_KV : TOL_BF16_KV_FULL);
    remove_dir(dir);
}

int main(void) {
    // Against HF fp32: the CUDA backend in its verification mode (fp32-level products); the fast
    // mode's bf16 products are checked per kernel on the GPU. CALLA_EXACT=0 overrides.
    setenv("CALLA_EXACT", "1", 0);
    static char *paths[64];
    int n = 0;
    const char *env = getenv("CALLA_GOLDEN_FILES");
    glob_t gl = {0};
    if (env) {
        char *copy = strdup(env);
        for (char *tok = strtok(copy, ":"); tok && n < 64; tok = strtok(NULL, ":")) paths[n++] = tok;
    } else {
        glob("tests/golden/*.golden", 0, NULL, &gl);
        for (size_t i = 0; i < gl.gl_pathc && n < 64; i++) paths[n++] = gl.gl_pathv[i];
    }
    if (!n) {
        fprintf(stderr, "no golden fixtures found (tests/golden/*.golden)\n---> HINT: tools/gen/make_golden.py\n");
        return 1;
    }
    struct CMUnitTest tests[64];
    for (int i = 0; i < n; i++) {
        struct CMUnitTest t = {paths[i], test_fixture, NULL, NULL, paths[i]};
        tests[i] = t;
    }
    return _cmocka_run_group_tests("golden", tests, (size_t)n, NULL, NULL);
}
