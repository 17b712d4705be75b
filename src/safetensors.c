// safetensors.c: header parsing and mmap (see safetensors.h).
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},     [ST_U16] = {"U16", 2},
    [ST_I16] = {"I16", 2},   [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2}, [ST_U32] = {"U32", 4},
    [ST_I32] = {"I32", 4},   [ST_F32] = {"F32", 4}, [ST_U64] = {"U64", 8},   [ST_I64] = {"I64", 8},
    [ST_F64] = {"F64", 8},
};

const char *st_dtype_name(enum st_dtype d) {
    return dtypes[d].name;
}
size_t st_dtype_size(enum st_dtype d) {
    return dtypes[d].size;
}

static int parse_dtype(const char *s, enum st_dtype *out) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(s, dtypes[i].name)) {
            *out = (enum st_dtype)i;
            return 0;
        }
    return -1;
}

static int cmp_begin(const void *a, const void *b) {
    const struct st_tensor *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static void st_free_tensors(struct st_file *f) {
    for (int i = 0; i < f->n; i++) free(f->t[i].name);
    free(f->t);
    free(f->format);
    f->t = NULL;
    f->format = NULL;
    f->n = 0;
}

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        snprintf(err, errlen, __VA_ARGS__);                                                                            \
        goto fail;                                                                                                     \
    } while (0)

static int parse_tensor(const char *what, const char *key, json_t *v, uint64_t data_len, struct st_tensor *t, char *err,
                        size_t errlen) {
    if (!json_is_object(v)) FAIL("%s: tensor %s: header entry is not an object", what, key);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt)) FAIL("%s: tensor %s: missing or non-string \"dtype\"", what, key);
    if (parse_dtype(json_string_value(dt), &t->dtype))
        FAIL("%s: tensor %s: unknown dtype \"%s\"", what, key, json_string_value(dt));
    if (!json_is_array(sh)) FAIL("%s: tensor %s: missing or non-array \"shape\"", what, key);
    if (json_array_size(sh) > ST_MAX_DIMS)
        FAIL("%s: tensor %s: %zu dimensions (at most %d)", what, key, json_array_size(sh), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    uint64_t elems = 1;
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(sh, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > ((json_int_t)1 << 40))
            FAIL("%s: tensor %s: shape[%d] is not a non-negative integer below 2^40", what, key, d);
        t->shape[d] = json_integer_value(x);
        if (t->shape[d] && elems > (UINT64_MAX >> 4) / (uint64_t)t->shape[d])
            FAIL("%s: tensor %s: shape overflows", what, key);
        elems *= (uint64_t)t->shape[d];
    }
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
        !json_is_integer(json_array_get(off, 1)))
        FAIL("%s: tensor %s: \"data_offsets\" must be [begin, end]", what, key);
    json_int_t b = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
    if (b < 0 || e < b)
        FAIL("%s: tensor %s: data_offsets [%lld, %lld] are not ordered", what, key, (long long)b, (long long)e);
    if ((uint64_t)e > data_len)
        FAIL("%s: tensor %s: data_offsets end %lld lies past the data section (%llu bytes): truncated file?", what, key,
             (long long)e, (unsigned long long)data_len);
    uint64_t want = elems * st_dtype_size(t->dtype);
    if ((uint64_t)(e - b) != want)
        FAIL("%s: tensor %s: data_offsets span %lld bytes but shape x %s needs %llu", what, key, (long long)(e - b),
             st_dtype_name(t->dtype), (unsigned long long)want);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    return 0;
fail:
    return -1;
}

int st_parse(const uint8_t *buf, size_t len, const char *what, struct st_file *out, char *err, size_t errlen) {
    json_t *root = NULL;
    memset(out, 0, sizeof *out);
    if (len < 8) FAIL("%s: %zu bytes is too short for a safetensors file", what, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > ST_MAX_HEADER)
        FAIL("%s: header length %llu exceeds %d bytes", what, (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > len - 8)
        FAIL("%s: header length %llu exceeds the file (%zu bytes): truncated file?", what, (unsigned long long)hlen,
             len);
    json_error_t je;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) FAIL("%s: header is not valid JSON: %s (line %d)", what, je.text, je.line);
    if (!json_is_object(root)) FAIL("%s: header is not a JSON object", what);
    out->data_start = 8 + (size_t)hlen;
    uint64_t data_len = len - out->data_start;
    size_t cap = json_object_size(root);
    out->t = calloc(cap ? cap : 1, sizeof *out->t);
    if (!out->t) FAIL("%s: out of memory", what);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) FAIL("%s: __metadata__ is not an object", what);
            json_t *fmt = json_object_get(v, "format");
            if (fmt && json_is_string(fmt)) out->format = strdup(json_string_value(fmt));
            continue;
        }
        struct st_tensor *t = &out->t[out->n];
        memset(t, 0, sizeof *t);
        if (parse_tensor(what, key, v, data_len, t, err, errlen)) goto fail;
        t->name = strdup(key);
        if (!t->name) FAIL("%s: out of memory", what);
        t->data = buf + out->data_start + t->begin;
        out->n++;
    }
    qsort(out->t, (size_t)out->n, sizeof *out->t, cmp_begin);
    for (int i = 1; i < out->n; i++)
        if (out->t[i].begin < out->t[i - 1].end)
            FAIL("%s: tensors %s and %s overlap in the data section", what, out->t[i - 1].name, out->t[i].name);
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    st_free_tensors(out);
    return -1;
}

int st_open(const char *path, struct st_file *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        return -1;
    }
    if (st_parse(map ? map : (const uint8_t *)"", size, path, out, err, errlen)) {
        if (map) munmap(map, size);
        return -1;
    }
    out->map = map;
    out->size = size;
    out->path = strdup(path);
    return 0;
}

void st_close(struct st_file *f) {
    st_free_tensors(f);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}
