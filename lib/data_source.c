/*
 * data_source.c — an opened token file, whatever its format (see data.h).
 *
 * data_source_open dispatches to the format readers (data_flat.c,
 * data_megatron.c), which map the file(s), validate them and fill the
 * DataSource; this file then applies the vocabulary limit and holds what
 * both formats share: mapping a file, reading and range-checking tokens,
 * the whole-file scan of `ringscan data check`, locating a token's document,
 * and the error-message helpers of the data module.
 *
 * Byte order: both formats are little-endian on disk and we read them in
 * place, so the host must be little-endian (every machine we target is;
 * the build stops otherwise rather than misread).
 *
 * Callers: data_pack.c (data_open), data_cli.c (check, inspect), tests.
 */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "data files are little-endian and read in place");

const char *const data_dtype_names[DATA_DTYPE_COUNT + 1] = {"uint8", "int8",   "int16", "uint16",
                                                            "int32", "uint32", "int64", NULL};

int data_dtype_bytes(DataDtype dt) {
    switch (dt) {
    case DATA_DTYPE_U8:
    case DATA_DTYPE_I8: return 1;
    case DATA_DTYPE_I16:
    case DATA_DTYPE_U16: return 2;
    case DATA_DTYPE_I32:
    case DATA_DTYPE_U32: return 4;
    case DATA_DTYPE_I64: return 8;
    default: RS_FATAL("data_dtype_bytes: dtype %d out of range", (int)dt);
    }
}

/* ---- messages ------------------------------------------------------------ */

int data_error(char *err, size_t n, int code, const char *hint, const char *fmt, ...) {
    if (!err || n == 0) return code;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(err, n, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < n && hint && *hint) snprintf(err + k, n - (size_t)k, "\n%s", hint);
    return code;
}

noreturn void data_fail(const char *err) {
    const char *nl = strchr(err, '\n');
    char msg[2048];
    snprintf(msg, sizeof msg, "%.*s", nl ? (int)(nl - err) : (int)strlen(err), err);
    error_exit(RS_EXIT_USAGE, __FILE__, __LINE__, nl ? nl + 1 : NULL, "%s", msg);
}

/* ---- mapping ------------------------------------------------------------- */

int data_map_file(const char *path, const char *what, void **ptr, size_t *len, char *err, size_t n) {
    *ptr = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return data_error(err, n, RS_EXIT_USAGE, "check the path (data.path in the config, or the argument)",
                              "%s %s does not exist", what, path);
        return data_error(err, n, RS_EXIT_USAGE, NULL, "%s %s cannot be opened: %s", what, path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return data_error(err, n, RS_EXIT_FAIL, NULL, "%s %s: fstat failed: %s", what, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return data_error(err, n, RS_EXIT_USAGE, NULL, "%s %s is not a regular file", what, path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return data_error(err, n, RS_EXIT_FAIL, NULL, "%s %s: mmap of %lld bytes failed: %s", what, path,
                              (long long)st.st_size, strerror(e));
        }
        *ptr = p;
        *len = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

/* ---- opening --------------------------------------------------------------- */

void data_source_close(DataSource *src) {
    if (!src) return;
    for (int i = 0; i < 2; i++)
        if (src->map[i]) munmap(src->map[i], src->map_len[i]);
    free(src->doc_start_owned);
    free(src->path);
    free(src->idx_path);
    free(src);
}

int data_source_open(DataSource **out, DataFormat format, const char *path, int64_t vocab_size, char *err,
                     size_t n) {
    *out = NULL;
    if (!path || !*path)
        return data_error(err, n, RS_EXIT_USAGE, "set data.path to a flat token file or a Megatron prefix",
                          "data.path is empty: no training data given");
    if (vocab_size > DATA_VOCAB_MAX)
        return data_error(err, n, RS_EXIT_USAGE, NULL, "vocab_size %lld is larger than %lld (token ids are int32)",
                          (long long)vocab_size, (long long)DATA_VOCAB_MAX);
    DataSource *src = RS_CALLOC(1, sizeof *src);
    src->format = format;
    int rc;
    if (format == DATA_FORMAT_FLAT) rc = data_flat_open(src, path, err, n);
    else if (format == DATA_FORMAT_MEGATRON) rc = data_megatron_open(src, path, err, n);
    else rc = data_error(err, n, RS_EXIT_USAGE, NULL, "data.format %d is not a known format", (int)format);
    if (rc) {
        data_source_close(src);
        return rc;
    }
    if (vocab_size > 0) {
        if (src->file_vocab > vocab_size) {
            char hint[256];
            snprintf(hint, sizeof hint,
                     "the data was tokenized for a vocabulary of %lld: set model.vocab_size >= %lld, or use data\n"
                     "tokenized for this model",
                     (long long)src->file_vocab, (long long)src->file_vocab);
            rc = data_error(err, n, RS_EXIT_USAGE, hint,
                            "data file %s was made for vocab_size %lld (its header), larger than model.vocab_size "
                            "%lld",
                            src->path, (long long)src->file_vocab, (long long)vocab_size);
            data_source_close(src);
            return rc;
        }
        src->vocab_limit = vocab_size;
        src->vocab_is_model = true;
    } else {
        src->vocab_limit = src->file_vocab > 0 ? src->file_vocab : DATA_VOCAB_MAX;
    }
    *out = src;
    return 0;
}

/* ---- tokens ---------------------------------------------------------------- */

int64_t data_source_token(const DataSource *src, int64_t i) {
    const uint8_t *p = src->tokens + (size_t)i * (size_t)src->token_bytes;
    switch (src->dtype) {
    case DATA_DTYPE_U8: return *p;
    case DATA_DTYPE_I8: return *(const int8_t *)p;
    case DATA_DTYPE_I16: return *(const int16_t *)p;
    case DATA_DTYPE_U16: return *(const uint16_t *)p;
    case DATA_DTYPE_I32: return *(const int32_t *)p;
    case DATA_DTYPE_U32: return *(const uint32_t *)p;
    case DATA_DTYPE_I64: return *(const int64_t *)p;
    default: RS_FATAL("data_source_token: dtype %d out of range", (int)src->dtype);
    }
}

int64_t data_source_doc_of(const DataSource *src, int64_t i) {
    /* largest d in [0, n_docs) with doc_start[d] <= i: that document is
     * non-empty, since an empty d would have doc_start[d + 1] <= i too */
    int64_t lo = 0, hi = src->n_docs; /* answer in [lo, hi) */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (src->doc_start[mid] <= (uint64_t)i) lo = mid;
        else hi = mid;
    }
    return lo;
}

static int data_bad_token(const DataSource *src, int64_t index, int64_t value, char *err, size_t n) {
    char hint[320];
    if (src->vocab_is_model)
        snprintf(hint, sizeof hint,
                 "model.vocab_size is %lld; the data holds larger ids: it was tokenized for another\n"
                 "vocabulary (raise model.vocab_size, or re-tokenize); `ringscan data check %s --vocab %lld`\n"
                 "scans the whole file",
                 (long long)src->vocab_limit, src->format == DATA_FORMAT_FLAT ? src->path : "PREFIX",
                 (long long)src->vocab_limit);
    else if (src->file_vocab > 0)
        snprintf(hint, sizeof hint, "the file's header says vocab_size %lld: the file is corrupt or was written "
                 "by a broken tool", (long long)src->file_vocab);
    else
        snprintf(hint, sizeof hint, "token ids are int32 and never negative");
    return data_error(err, n, RS_EXIT_USAGE, hint,
                      "data file %s: token id %lld at token index %lld (document %lld) is outside [0, %lld)",
                      src->path, (long long)value, (long long)index, (long long)data_source_doc_of(src, index),
                      (long long)src->vocab_limit);
}

/* The range check compares as signed 64-bit so negative ids of signed dtypes
 * fail too; the loop per dtype keeps the inner loop a plain load. */
#define DATA_COPY_LOOP(T)                                                                   \
    do {                                                                                    \
        const T *p = (const T *)src->tokens + start;                                        \
        for (int64_t k = 0; k < n; k++) {                                                   \
            int64_t v = (int64_t)p[k];                                                      \
            if (__builtin_expect(v < 0 || v >= lim, 0)) return data_bad_token(src, start + k, v, err, en); \
            dst[k] = (int32_t)v;                                                            \
        }                                                                                   \
    } while (0)

int data_source_copy(const DataSource *src, int64_t start, int64_t n, int32_t *dst, char *err, size_t en) {
    RS_CHECK(start >= 0 && n >= 0 && start + n <= src->n_tokens, "token range [%lld, %lld) outside [0, %lld)",
             (long long)start, (long long)(start + n), (long long)src->n_tokens);
    const int64_t lim = src->vocab_limit;
    switch (src->dtype) {
    case DATA_DTYPE_U8: DATA_COPY_LOOP(uint8_t); break;
    case DATA_DTYPE_I8: DATA_COPY_LOOP(int8_t); break;
    case DATA_DTYPE_I16: DATA_COPY_LOOP(int16_t); break;
    case DATA_DTYPE_U16: DATA_COPY_LOOP(uint16_t); break;
    case DATA_DTYPE_I32: DATA_COPY_LOOP(int32_t); break;
    case DATA_DTYPE_U32: DATA_COPY_LOOP(uint32_t); break;
    case DATA_DTYPE_I64: DATA_COPY_LOOP(int64_t); break;
    default: RS_FATAL("data_source_copy: dtype %d out of range", (int)src->dtype);
    }
    return 0;
}

#define DATA_SCAN_LOOP(T)                                                                   \
    do {                                                                                    \
        const T *p = (const T *)src->tokens;                                                \
        for (int64_t k = 0; k < src->n_tokens; k++) {                                       \
            int64_t v = (int64_t)p[k];                                                      \
            if (v < lo) lo = v;                                                             \
            if (v > hi) hi = v;                                                             \
            if (first_bad < 0 && (v < 0 || v >= src->vocab_limit)) first_bad = k;           \
        }                                                                                   \
    } while (0)

int data_source_scan(const DataSource *src, int64_t *min_id, int64_t *max_id, char *err, size_t n) {
    int64_t lo = INT64_MAX, hi = INT64_MIN, first_bad = -1;
    switch (src->dtype) {
    case DATA_DTYPE_U8: DATA_SCAN_LOOP(uint8_t); break;
    case DATA_DTYPE_I8: DATA_SCAN_LOOP(int8_t); break;
    case DATA_DTYPE_I16: DATA_SCAN_LOOP(int16_t); break;
    case DATA_DTYPE_U16: DATA_SCAN_LOOP(uint16_t); break;
    case DATA_DTYPE_I32: DATA_SCAN_LOOP(int32_t); break;
    case DATA_DTYPE_U32: DATA_SCAN_LOOP(uint32_t); break;
    case DATA_DTYPE_I64: DATA_SCAN_LOOP(int64_t); break;
    default: RS_FATAL("data_source_scan: dtype %d out of range", (int)src->dtype);
    }
    *min_id = src->n_tokens ? lo : 0;
    *max_id = src->n_tokens ? hi : 0;
    if (first_bad >= 0) return data_bad_token(src, first_bad, data_source_token(src, first_bad), err, n);
    return 0;
}
