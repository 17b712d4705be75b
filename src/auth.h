// auth.h: API keys for `calla serve` (Authorization: Bearer KEY; Anthropic's API also takes
// x-api-key: KEY), compared in constant time.
#pragma once

#include <stdbool.h>
#include <stddef.h>

enum { AUTH_MAX_KEYS = 256, AUTH_MAX_KEY_BYTES = 512 };

struct auth {
    char *keys[AUTH_MAX_KEYS]; // malloc'd copies
    size_t lens[AUTH_MAX_KEYS];
    int n; // 0: no keys, every request is accepted
};

// A key: 1 to AUTH_MAX_KEY_BYTES printable ASCII bytes, no spaces.  0, or -1 with a message.
int auth_add_key(struct auth *a, const char *key, char *err, size_t errlen);
// A file of keys, one a line; blank lines and lines starting with '#' are skipped, surrounding
// whitespace (a trailing \r too) is trimmed.  0, or -1 with a message naming the line.
int auth_load_file(struct auth *a, const char *path, char *err, size_t errlen);
// The value of an Authorization header (NULL: none) against the keys: true when there are no
// keys, or when it is "Bearer KEY" (scheme case-insensitive) with a known KEY.  The time taken
// depends only on the header's length and the number of keys, never on how much of a key matched.
bool auth_check(const struct auth *a, const char *authorization);
// The same for a bare key (the value of x-api-key; NULL: none): true when there are no keys, or
// when it is a known key (leading spaces, trailing spaces and tabs ignored, as after "Bearer").
bool auth_check_key(const struct auth *a, const char *key);
void auth_free(struct auth *a);
