// libFuzzer target: config.json validation must refuse or accept any bytes without crashing.
// Built and run by tools/dev/fuzz.sh (make fuzz).
#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct geometry g;
    char err[512];
    checkpoint_parse_config((const char *)data, size, &g, err, sizeof err);
    return 0;
}
