// test_agentbench.c: `calla agentbench` and `calla matrix --agentbench` end to end
// (tests/test_agentbench.py: a tiny synthetic checkpoint served on the CPU, a stand-in for
// llama-server, the chat template for llama-server checked against the official renderings).
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    // BUILD/tests/test_agentbench -> BUILD/calla
    char bin[PATH_MAX], cmd[2 * PATH_MAX];
    snprintf(bin, sizeof bin, "%s", argv[0]);
    for (int k = 0; k < 2; k++) {
        char *slash = strrchr(bin, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(bin, sizeof bin, "%s", k ? "." : "..");
    }
    snprintf(cmd, sizeof cmd, "python3 tests/test_agentbench.py --bin %s/calla", bin);
    fprintf(stderr, "%s\n", cmd);
    int rc = system(cmd);
    return rc == 0 ? 0 : 1;
}
