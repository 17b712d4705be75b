// web.h: the chat page's files (src/web/), compiled into the binary: tools/gen/embed.sh turns them
// into byte arrays and this table (BUILD/web_files.c), and `calla serve` answers GET / with them.
#pragma once

#include <stddef.h>

struct web_file {
    const char *path;          // its URL path: "/" + the file's name under src/web/
    const unsigned char *data; // its bytes, exactly as in src/web/
    size_t len;
};

extern const struct web_file web_files[]; // ends with an entry whose path is NULL
