// sse_events.h: a job's output channel read as a client reads a stream of named server-sent
// events (tests/test_anthropic.c, tests/test_responses.c).
#pragma once

#include "job.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

// The events as [{"event": NAME ("" when unnamed), "data": the parsed JSON}]; NULL when a data
// line is not JSON.  Comments are skipped.
static json_t *sse_events(const struct job *j) {
    json_t *out = json_array();
    const char *p = j->out.p ? j->out.p : "", *end = p + j->out.len;
    char name[96] = "";
    while (out && p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) break;
        if (!strncmp(p, "event: ", 7)) {
            snprintf(name, sizeof name, "%.*s", (int)(nl - p - 7), p + 7);
        } else if (!strncmp(p, "data: ", 6)) {
            json_t *d = json_loadb(p + 6, (size_t)(nl - p - 6), 0, NULL);
            if (!d) {
                json_decref(out);
                return NULL;
            }
            json_array_append_new(out, json_pack("{s:s, s:o}", "event", name, "data", d));
            name[0] = 0;
        }
        p = nl + 1;
    }
    return out;
}
