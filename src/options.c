// options.c: table-driven flag parsing (see options.h).
#include "options.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int opts_parse(int argc, char **argv, const struct opt *opts, int n, char *err, size_t errlen) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) {
            snprintf(err, errlen, "unexpected argument \"%s\" (flags start with --)", a);
            return -1;
        }
        a += 2;
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const struct opt *o = NULL;
        for (int k = 0; k < n && !o; k++)
            if (strlen(opts[k].name) == len && !strncmp(opts[k].name, a, len)) o = &opts[k];
        if (!o) {
            snprintf(err, errlen, "unknown flag --%.*s", (int)len, a);
            return -1;
        }
        if (o->type == OPT_FLAG) {
            if (eq) {
                snprintf(err, errlen, "--%s takes no value", o->name);
                return -1;
            }
            *(bool *)o->dst = true;
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) {
            snprintf(err, errlen, "--%s needs a value", o->name);
            return -1;
        }
        if (o->type == OPT_STR) {
            *(const char **)o->dst = val;
            continue;
        }
        if (o->type == OPT_ONOFF) {
            if (strcmp(val, "on") && strcmp(val, "off")) {
                snprintf(err, errlen, "--%s: \"%s\" is neither on nor off", o->name, val);
                return -1;
            }
            *(bool *)o->dst = !strcmp(val, "on");
            continue;
        }
        if (o->type == OPT_STRS) {
            struct opt_strs *l = o->dst;
            if (l->n == OPT_STRS_MAX) {
                snprintf(err, errlen, "--%s may be given at most %d times", o->name, OPT_STRS_MAX);
                return -1;
            }
            l->v[l->n++] = val;
            continue;
        }
        char *end;
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (errno || end == val || *end) {
            snprintf(err, errlen, "--%s: \"%s\" is not an integer", o->name, val);
            return -1;
        }
        if (v < o->min || v > o->max) {
            snprintf(err, errlen, "--%s: %lld is out of range (must be between %lld and %lld inclusive)", o->name, v,
                     o->min, o->max);
            return -1;
        }
        *(long long *)o->dst = v;
    }
    return 0;
}

bool opts_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

int opts_begin(int argc, char **argv, const char *cmd, const char *summary, const struct opt *opts, int n) {
    if (opts_wants_help(argc, argv)) {
        opts_usage(stdout, cmd, summary, opts, n);
        return 1;
    }
    char err[512];
    if (opts_parse(argc, argv, opts, n, err, sizeof err)) {
        fprintf(stderr, "calla %s: %s\n", cmd, err);
        return -1;
    }
    return 0;
}

void opts_usage(FILE *f, const char *cmd, const char *summary, const struct opt *opts, int n) {
    fprintf(f, "usage: calla %s [flags]\n  %s\n", cmd, summary);
    for (int k = 0; k < n; k++) {
        char left[48];
        snprintf(left, sizeof left, "--%s%s", opts[k].name,
                 opts[k].type == OPT_FLAG    ? ""
                 : opts[k].type == OPT_INT   ? " N"
                 : opts[k].type == OPT_ONOFF ? " on|off"
                                             : " S");
        fprintf(f, "  %-22s %s\n", left, opts[k].help);
    }
}
