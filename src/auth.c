// auth.c: API keys (see auth.h).
#include "auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int auth_add_key(struct auth *a, const char *key, char *err, size_t errlen) {
    size_t n = strlen(key);
    if (n == 0 || n > AUTH_MAX_KEY_BYTES) {
        snprintf(err, errlen, "an API key must have 1 to %d bytes, got %zu", AUTH_MAX_KEY_BYTES, n);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)key[i] <= 0x20 || (unsigned char)key[i] >= 0x7f) {
            snprintf(err, errlen, "an API key must be printable ASCII without spaces (byte %zu is 0x%02x)", i,
                     (unsigned char)key[i]);
            return -1;
        }
    if (a->n == AUTH_MAX_KEYS) {
        snprintf(err, errlen, "at most %d API keys", AUTH_MAX_KEYS);
        return -1;
    }
    if (!(a->keys[a->n] = strdup(key))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    a->lens[a->n++] = n;
    return 0;
}

int auth_load_file(struct auth *a, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--api-key-file %s: %s", path, strerror(errno));
        return -1;
    }
    char line[AUTH_MAX_KEY_BYTES + 64], msg[256];
    int rc = 0, lineno = 0, added = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            snprintf(err, errlen, "--api-key-file %s:%d: the line is too long", path, lineno);
            rc = -1;
            break;
        }
        char *s = line;
        while (*s && isspace((unsigned char)*s)) s++;
        while (n > 0 && (line + n > s) && isspace((unsigned char)line[n - 1])) line[--n] = 0;
        if (!*s || *s == '#') continue;
        if (auth_add_key(a, s, msg, sizeof msg)) {
            snprintf(err, errlen, "--api-key-file %s:%d: %s", path, lineno, msg);
            rc = -1;
        }
        added++;
    }
    fclose(f);
    if (!rc && !added) {
        snprintf(err, errlen, "--api-key-file %s: no keys in the file", path);
        rc = -1;
    }
    return rc;
}

// 0 when t[0..tn) equals k[0..kn); the loop runs over tn bytes whatever k holds.
static unsigned ct_differs(const char *t, size_t tn, const char *k, size_t kn) {
    unsigned d = tn != kn;
    for (size_t i = 0; i < tn; i++) d |= (unsigned char)t[i] ^ (unsigned char)k[i < kn ? i : 0];
    return d;
}

bool auth_check(const struct auth *a, const char *authorization) {
    if (a->n == 0) return true;
    if (!authorization || strncasecmp(authorization, "Bearer ", 7)) return false;
    return auth_check_key(a, authorization + 7);
}

bool auth_check_key(const struct auth *a, const char *key) {
    if (a->n == 0) return true;
    if (!key) return false;
    const char *t = key;
    while (*t == ' ') t++;
    size_t tn = strlen(t);
    while (tn > 0 && (t[tn - 1] == ' ' || t[tn - 1] == '\t')) tn--;
    unsigned ok = 0;
    for (int i = 0; i < a->n; i++) ok |= !ct_differs(t, tn, a->keys[i], a->lens[i]);
    return ok != 0;
}

void auth_free(struct auth *a) {
    for (int i = 0; i < a->n; i++) free(a->keys[i]);
    a->n = 0;
}
