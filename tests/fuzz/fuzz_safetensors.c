// libFuzzer target: the safetensors header parser must never read outside its buffer.
// Built and run by tools/dev/fuzz.sh (make fuzz).
#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct st_file f;
    char err[512];
    if (st_parse(data, size, "fuzz", &f, err, sizeof err) == 0) {
        for (int i = 0; i < f.n; i++) {   // touch every tensor's bytes: they must lie inside the buffer
            volatile uint8_t x = 0;
            for (uint64_t b = f.t[i].begin; b < f.t[i].end && b < f.t[i].begin + 64; b++) x ^= data[f.data_start + b];
            (void)x;
        }
        f.map = NULL;
        st_close(&f);
    }
    return 0;
}
