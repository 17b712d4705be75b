// safetensors.h: read-only safetensors files over mmap, with a header parser that never reads
// outside the buffer it is given (fuzzed in tests/fuzz_safetensors.c).
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "U32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data; offsets are relative to the first byte after the header.
#pragma once

#include <stddef.h>
#include <stdint.h>

enum st_dtype {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_U16,
    ST_I16,
    ST_F16,
    ST_BF16,
    ST_U32,
    ST_I32,
    ST_F32,
    ST_U64,
    ST_I64,
    ST_F64
};

enum { ST_MAX_DIMS = 8, ST_MAX_HEADER = 256 << 20 };

struct st_tensor {
    char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; // byte range within the data section
    const uint8_t *data; // points into the mapped file
};

struct st_file {
    char *path;
    uint8_t *map; // whole file, read-only (NULL for a parsed buffer)
    size_t size;
    size_t data_start; // 8 + header length
    int n;
    struct st_tensor *t; // sorted by begin
    char *format;        // __metadata__.format, or NULL
};

const char *st_dtype_name(enum st_dtype d);
size_t st_dtype_size(enum st_dtype d);

// Parses and validates the header of a complete file image buf[0..len): every offset inside the
// data section, sizes equal to shape x dtype, no two tensors overlapping. 0 on success; -1 with
// a message naming the tensor and the offending value otherwise.
int st_parse(const uint8_t *buf, size_t len, const char *what, struct st_file *out, char *err, size_t errlen);

// mmaps path and parses it. 0 or -1 with a message.
int st_open(const char *path, struct st_file *out, char *err, size_t errlen);
void st_close(struct st_file *f);
