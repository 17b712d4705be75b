// tiny_engine.h: for tests: a tiny synthetic checkpoint (default profile) under $TMPDIR and a CPU
// engine on it, and their removal.
#pragma once

#include "engine.h"
#include "synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

// dir gets "$TMPDIR/calla-TAG-PID". 0, or -1 with a message on stderr.
static int tiny_engine_open(const char *tag, uint64_t seed, char *dir, size_t dirlen, struct engine **e) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, dirlen, "%s/calla-%s-%d", t && *t ? t : "/tmp", tag, (int)getpid());
    char err[512];
    struct synth_options so = {.g = geometry_find("tiny"), .seed = seed, .out_dir = dir, .max_shard_bytes = (int64_t)5 << 30};
    struct engine_options eo = {.backend = "cpu"};
    if (synth_write(&so, err, sizeof err) || engine_open(dir, &eo, e, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int tiny_engine_close(const char *dir, struct engine *e) {
    engine_close(e);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}
