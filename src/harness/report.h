// report.h: report.md and SVG plots from a results folder of bench records (docs/BENCH.md "The matrix runner").
#pragma once

#include <stddef.h>

struct report_options {
    const char *dir;             // results folder: *.json bench records (+ matrix.json, the runner's log)
    const char *compare_dir;     // another results folder to put beside this one (NULL: none)
    const char *reference;       // a reference table (bench/reference/*.json; NULL: none)
    const char *title;           // report heading (NULL: "Calla benchmark")
    const char *targets;         // targets to check (bench/targets/*.json; NULL: the "targets" of
                                 // dir/matrix.json, which `calla matrix` copies there; none: no section)
};

// Writes dir/report.md, dir/decode_ms.svg and dir/prefill_tps.svg. 0, or -1 with a message.
int report_write(const struct report_options *o, char *err, size_t errlen);
