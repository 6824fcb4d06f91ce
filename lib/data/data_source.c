/*
 * data_source.c — an opened token file, whatever its format (see data.h).
 *
 * data_source_open dispatches to the format readers (data_format.h:
 * data_flat.c, data_megatron.c), which open the file(s), validate them and
 * fill the DataSource; this file then applies the vocabulary limit and
 * computes the fingerprint, and holds the whole-file scan of `ringscan data
 * check` and locating a token's document. Opening a file, reading its bytes
 * (pread, never a mapping: see data.h; a file that changed while it was read
 * is noticed there) and the error messages are data_file.c's, below the
 * format readers.
 *
 * Cost of pread against the shared mapping it replaced: microseconds per
 * sample (one pread per span unshuffled, one per document piece shuffled;
 * data_pack.c), noise against a training step. Many tiny shuffled documents
 * would cost one call each; data_pack.c reads a span's pieces in file order,
 * nearby ones by one pread, so even 1M-token samples of 1..5-token documents
 * stay cheap (tests/unit/test_data.c).
 *
 * Byte order: both formats are little-endian on disk and we reinterpret
 * their bytes, so the host must be little-endian (every machine we target
 * is; the build stops otherwise rather than misread).
 *
 * Callers: data_pack.c (data_open), data_cli.c (check, inspect), tests.
 */
#include "data.h"
#include "data_format.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "data files are little-endian and read in place");

/* ---- fingerprint ----------------------------------------------------------- */

static uint64_t data_fp_mix(uint64_t h, const void *p, size_t len) {
    const uint8_t *b = p;
    for (size_t i = 0; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    for (size_t i = len & ~(size_t)7; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int data_fingerprint(DataSource *src, char *err, size_t n) {
    uint64_t h = 1469598103934665603ull;
    int64_t head[3] = {src->token_bytes, src->n_tokens, src->n_docs};
    h = data_fp_mix(h, head, sizeof head);
    h = data_fp_mix(h, src->doc_start, (size_t)(src->n_docs + 1) * sizeof *src->doc_start);
    int64_t total = src->n_tokens * src->token_bytes;
    uint8_t *buf = RS_MALLOC(DATA_FP_BLOCK);
    int rc = 0;
    if (total <= (int64_t)DATA_FP_BLOCKS * DATA_FP_BLOCK) { /* small: every byte */
        for (int64_t o = 0; o < total && !rc; o += DATA_FP_BLOCK) {
            size_t m = (size_t)(total - o < DATA_FP_BLOCK ? total - o : DATA_FP_BLOCK);
            rc = data_source_read(src, buf, m, src->tok_off + o, err, n);
            if (!rc) h = data_fp_mix(h, buf, m);
        }
    } else {
        for (int b = 0; b < DATA_FP_BLOCKS && !rc; b++) {
            int64_t o = (total - DATA_FP_BLOCK) / (DATA_FP_BLOCKS - 1) * b;
            if (b == DATA_FP_BLOCKS - 1) o = total - DATA_FP_BLOCK;
            rc = data_source_read(src, buf, DATA_FP_BLOCK, src->tok_off + o, err, n);
            if (!rc) h = data_fp_mix(h, buf, DATA_FP_BLOCK);
        }
    }
    free(buf);
    src->fp.hash = h;
    return rc;
}

/* ---- opening --------------------------------------------------------------- */

void data_source_close(DataSource *src) {
    if (!src) return;
    if (src->map) munmap(src->map, src->map_len);
    if (src->fd >= 0) close(src->fd);
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
    src->fd = -1;
    src->format = format;
    int rc;
    if (format == DATA_FORMAT_FLAT) rc = data_flat_open(src, path, err, n);
    else if (format == DATA_FORMAT_MEGATRON) rc = data_megatron_open(src, path, err, n);
    else rc = data_error(err, n, RS_EXIT_USAGE, NULL, "data.format %d is not a known format", (int)format);
    if (!rc) {
        struct stat st;
        RS_CHECK(fstat(src->fd, &st) == 0, "fstat of %s: %s", src->path, strerror(errno));
        src->fp.bytes = (int64_t)st.st_size;
        src->fp.mtime_ns = data_mtime_ns(&st);
        src->fp.ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
        if (src->idx_path && stat(src->idx_path, &st) == 0) {
            src->fp.idx_bytes = (int64_t)st.st_size;
            src->fp.idx_mtime_ns = data_mtime_ns(&st);
        }
        rc = data_fingerprint(src, err, n);
    }
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

/* Token k of `p` (stored as src->dtype), widened. */
static int64_t data_token_at(const DataSource *src, const uint8_t *p, int64_t k) {
    p += (size_t)k * (size_t)src->token_bytes;
    switch (src->dtype) {
    case DATA_DTYPE_U8: return *p;
    case DATA_DTYPE_I8: return *(const int8_t *)p;
    case DATA_DTYPE_I16: return *(const int16_t *)p;
    case DATA_DTYPE_U16: return *(const uint16_t *)p;
    case DATA_DTYPE_I32: return *(const int32_t *)p;
    case DATA_DTYPE_U32: return *(const uint32_t *)p;
    case DATA_DTYPE_I64: return *(const int64_t *)p;
    default: RS_FATAL("data_token_at: dtype %d out of range", (int)src->dtype);
    }
}

int64_t data_source_token(const DataSource *src, int64_t i) {
    _Alignas(8) uint8_t b[8];
    char err[1024];
    if (data_source_read(src, b, (size_t)src->token_bytes, src->tok_off + i * src->token_bytes, err, sizeof err))
        RS_FATAL("%s", err);
    return data_token_at(src, b, 0);
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
 * fail too; the loop per dtype keeps the inner loop a plain load. `p` holds
 * tokens [start, start + n) of the file. */
#define DATA_COPY_LOOP(T)                                                                   \
    do {                                                                                    \
        const T *q = (const T *)p;                                                          \
        for (int64_t k = 0; k < n; k++) {                                                   \
            int64_t v = (int64_t)q[k];                                                      \
            if (__builtin_expect(v < 0 || v >= lim, 0)) return data_bad_token(src, start + k, v, err, en); \
            dst[k] = (int32_t)v;                                                            \
        }                                                                                   \
    } while (0)

static int data_convert(const DataSource *src, const uint8_t *p, int64_t start, int64_t n, int32_t *dst, char *err,
                        size_t en) {
    const int64_t lim = src->vocab_limit;
    switch (src->dtype) {
    case DATA_DTYPE_U8: DATA_COPY_LOOP(uint8_t); break;
    case DATA_DTYPE_I8: DATA_COPY_LOOP(int8_t); break;
    case DATA_DTYPE_I16: DATA_COPY_LOOP(int16_t); break;
    case DATA_DTYPE_U16: DATA_COPY_LOOP(uint16_t); break;
    case DATA_DTYPE_I32: DATA_COPY_LOOP(int32_t); break;
    case DATA_DTYPE_U32: DATA_COPY_LOOP(uint32_t); break;
    case DATA_DTYPE_I64: DATA_COPY_LOOP(int64_t); break;
    default: RS_FATAL("data_convert: dtype %d out of range", (int)src->dtype);
    }
    return 0;
}

int data_source_copy(const DataSource *src, int64_t start, int64_t n, int32_t *dst, char *err, size_t en) {
    RS_CHECK(start >= 0 && n >= 0 && start + n <= src->n_tokens, "token range [%lld, %lld) outside [0, %lld)",
             (long long)start, (long long)(start + n), (long long)src->n_tokens);
    _Alignas(8) uint8_t buf[1 << 15];
    const int tb = src->token_bytes;
    const int64_t per = (int64_t)sizeof buf / tb;
    for (int64_t k0 = 0; k0 < n; k0 += per) {
        int64_t m = n - k0 < per ? n - k0 : per;
        int rc = data_source_read(src, buf, (size_t)(m * tb), src->tok_off + (start + k0) * tb, err, en);
        if (!rc) rc = data_convert(src, buf, start + k0, m, dst + k0, err, en);
        if (rc) return rc;
    }
    return 0;
}

int data_source_scan(const DataSource *src, int64_t *min_id, int64_t *max_id, char *err, size_t n) {
    int64_t lo = INT64_MAX, hi = INT64_MIN, first_bad = -1;
    const int64_t per = (1 << 20) / src->token_bytes;
    uint8_t *buf = RS_MALLOC((size_t)per * (size_t)src->token_bytes);
    int rc = 0;
    for (int64_t k0 = 0; k0 < src->n_tokens && !rc; k0 += per) {
        int64_t m = src->n_tokens - k0 < per ? src->n_tokens - k0 : per;
        rc = data_source_read(src, buf, (size_t)(m * src->token_bytes), src->tok_off + k0 * src->token_bytes, err, n);
        for (int64_t k = 0; k < m && !rc; k++) {
            int64_t v = data_token_at(src, buf, k);
            if (v < lo) lo = v;
            if (v > hi) hi = v;
            if (first_bad < 0 && (v < 0 || v >= src->vocab_limit)) first_bad = k0 + k;
        }
    }
    free(buf);
    if (rc) return rc;
    *min_id = src->n_tokens ? lo : 0;
    *max_id = src->n_tokens ? hi : 0;
    if (first_bad >= 0) return data_bad_token(src, first_bad, data_source_token(src, first_bad), err, n);
    return 0;
}
