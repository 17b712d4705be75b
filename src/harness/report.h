// report.h: report.md and SVG plots from a results folder of bench records (docs/BENCH.md "The matrix runner").
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

struct report_options {
    const char *dir;         // results folder: *.json bench records (+ matrix.json, the runner's log)
    const char *compare_dir; // another results folder to put beside this one (NULL: none)
    const char *reference;   // a reference table (bench/reference/*.json; NULL: none)
    const char *title;       // report heading (NULL: "Calla benchmark")
    const char *targets;     // targets to check (bench/targets/*.json; NULL: the "targets" of
                             // dir/matrix.json, which `calla matrix` copies there; none: no section)
};

// Writes dir/report.md, dir/decode_ms.svg and dir/prefill_tps.svg (a folder of agentbench records
// only: report.md alone). 0, or -1 with a message.
int report_write(const struct report_options *o, char *err, size_t errlen);

// The conversation section (report_agent.c) for the `calla agentbench` records of dir, checked
// against the "conversation" rows of targets (NULL: none). Returns the records used (0: no section).
int report_agent_section(FILE *f, const char *dir, const json_t *targets);
// The number of agentbench records in dir.
int report_agent_count(const char *dir);
