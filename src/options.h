// options.h: one table per command for command-line flags, with bounds; reject, never clamp.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum opt_type {
    OPT_STR,   // const char *
    OPT_INT,   // long long, within [min, max]
    OPT_FLAG,  // bool, takes no value
    OPT_STRS,  // struct opt_strs: a string flag that may be given up to OPT_STRS_MAX times
    OPT_ONOFF, // bool, takes "on" or "off"
};

enum { OPT_STRS_MAX = 64 };

struct opt_strs {
    const char *v[OPT_STRS_MAX];
    int n;
};

struct opt {
    const char *name; // without the leading "--"
    enum opt_type type;
    void *dst;
    long long min, max; // OPT_INT bounds, inclusive
    const char *help;
};

// Parses argv[1..argc) ("--name value" or "--name=value"). 0, or -1 with a message.
int opts_parse(int argc, char **argv, const struct opt *opts, int n, char *err, size_t errlen);
// True when argv[1..argc) holds --help or -h.
bool opts_wants_help(int argc, char **argv);
// The start of a command: with --help prints the usage to stdout and returns 1 (the command returns
// 0); otherwise parses, and on a bad flag prints "calla CMD: message" and returns -1 (the command
// returns 2); 0 to go on.
int opts_begin(int argc, char **argv, const char *cmd, const char *summary, const struct opt *opts, int n);
void opts_usage(FILE *f, const char *cmd, const char *summary, const struct opt *opts, int n);
