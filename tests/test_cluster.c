// test_cluster.c: Calla replicas behind a real HAProxy (tests/test_cluster.py, tools/cluster.sh,
// deploy/haproxy.cfg) on a tiny synthetic checkpoint made here, CPU backend.
//
// Without haproxy installed the Python suite skips (exit 0), except under CI=true, where it fails.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "synth.h"
#include "tokenizer.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char model_dir[] = "/tmp/calla_cluster_model_XXXXXX";
static char bin_dir[PATH_MAX];

static void test_cluster(void **state) {
    char cmd[2 * PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "python3 tests/test_cluster.py --bin %s/calla --model %s", bin_dir, model_dir);
    fprintf(stderr, "%s\n", cmd);
    assert_int_equal(system(cmd), 0);
}

static int setup(void **state) {
    char err[512];
    if (!mkdtemp(model_dir)) return -1;
    struct synth_options so = {.g = geometry_find("tiny"), .seed = 1, .out_dir = model_dir, .max_shard_bytes = 1 << 30};
    if (synth_write(&so, err, sizeof err)) {
        fprintf(stderr, "synth: %s\n", err);
        return -1;
    }
    struct stat st;
    char tj[PATH_MAX];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", model_dir);
    if (stat(tj, &st) && synth_write_tokenizer(model_dir, err, sizeof err)) {
        fprintf(stderr, "tokenizer: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", model_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    // BUILD/tests/test_cluster -> BUILD
    snprintf(bin_dir, sizeof bin_dir, "%s", argv[0]);
    for (int k = 0; k < 2; k++) {
        char *slash = strrchr(bin_dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(bin_dir, sizeof bin_dir, "%s", k ? "." : "..");
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster),
    };
    return cmocka_run_group_tests_name("cluster", tests, setup, teardown);
}
