// test_gdn_chunked.c: the chunked gated delta rule (docs/MODEL.md §4, chunk 64) against the token-by-
// token recurrence (§2.5), both in fp64 on the CPU (tests/gdn_ref.h), at a reduced head count with
// the real head dims: several chunks, a partial last chunk, T < 64, a nonzero starting state, mild
// (alpha in (0.5, 1)) and strong decays. Also prints the error that bf16 rounding of the tensor-core
// operands gives (what the fast CUDA kernel should land near), and bounds it.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "gdn_ref.h"

enum { HK = 2, HV = 4, DK = 128, DV = 128 };

// Runs the recurrence and the chunked form from the same state; returns the normalised errors of
// o (raw, before the norm) and of the final S.
static void compare(int T, int strong, int bf, uint64_t seed, double *eo, double *es) {
    const int C = 2 * HK * DK + HV * DV;
    struct gdnref_rng r = {seed};
    float *y = malloc(sizeof(float) * (size_t)T * C), *b = malloc(sizeof(float) * T * HV),
          *a = malloc(sizeof(float) * T * HV), Al[HV], dtb[HV];
    float *beta = malloc(sizeof(float) * T * HV), *g = malloc(sizeof(float) * T * HV);
    gdnref_inputs(&r, T, HK, HV, DK, DV, strong, y, b, a, Al, dtb);
    gdnref_gates(b, a, Al, dtb, T, HV, beta, g);
    const size_t ns = (size_t)HV * DK * DV, no = (size_t)T * HV * DV;
    double *S1 = malloc(sizeof(double) * ns), *S2 = malloc(sizeof(double) * ns);
    double *o1 = malloc(sizeof(double) * no), *o2 = malloc(sizeof(double) * no);
    for (size_t i = 0; i < ns; i++) S1[i] = S2[i] = 0.2 * (2 * gdnref_u(&r) - 1);
    gdnref_recurrent(y, beta, g, S1, o1, T, HK, HV, DK, DV);
    gdnref_chunked(y, beta, g, S2, o2, T, HK, HV, DK, DV, bf);
    *eo = gdnref_nerr_d(o2, o1, no);
    *es = gdnref_nerr_d(S2, S1, ns);
    free(y), free(b), free(a), free(beta), free(g), free(S1), free(S2), free(o1), free(o2);
}

static void test_exact(void **state) {
    (void)state;
    const int Ts[] = {1, 17, 64, 65, 150, 300};
    for (int strong = 0; strong < 2; strong++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            double eo, es;
            compare(Ts[i], strong, 0, 1234 + i + 77 * strong, &eo, &es);
            printf("  fp64 chunked vs recurrent  T %3d %s: o %.2e  S %.2e\n", Ts[i], strong ? "strong" : "mild  ", eo,
                   es);
            assert_true(eo < 1e-10);
            assert_true(es < 1e-10);
        }
}

// bf16 operands in the products (what the fast kernel does): the error stays well under 1e-2.
static void test_bf16_model(void **state) {
    (void)state;
    const int Ts[] = {64, 300};
    for (int strong = 0; strong < 2; strong++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            double eo, es;
            compare(Ts[i], strong, 1, 999 + i + 5 * strong, &eo, &es);
            printf("  bf16-operand chunked vs recurrent  T %3d %s: o %.2e  S %.2e\n", Ts[i],
                   strong ? "strong" : "mild  ", eo, es);
            assert_true(eo < 1e-2);
            assert_true(es < 1e-2);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_exact), cmocka_unit_test(test_bf16_model)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
