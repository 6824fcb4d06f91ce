/*
 * data_flat.c — ringscan's flat token file: reader (validation) and writer.
 *
 * Format, version 1 (also in docs/data-format.md). Little-endian throughout.
 *
 *   offset          bytes               field
 *   0               8                   magic, the ASCII bytes "RSTOKENS"
 *   8               4   uint32          version = 1
 *   12              4   uint32          token_bytes: 2 (uint16 tokens) or 4 (uint32 tokens)
 *   16              8   uint64          vocab_size the tokens were made for: every id < vocab_size;
 *                                       1 .. 2^31-1, and <= 65536 when token_bytes = 2
 *   24              8   uint64          n_tokens
 *   32              8   uint64          n_docs
 *   40              24                  reserved, zero
 *   64              8 * (n_docs + 1)    doc_start, uint64 token offsets: doc_start[0] = 0,
 *                                       non-decreasing, doc_start[n_docs] = n_tokens;
 *                                       document d = tokens [doc_start[d], doc_start[d+1])
 *   64 + 8*(n_docs+1)  token_bytes * n_tokens   the tokens (this offset is a multiple of 8)
 *
 * The file ends right after the last token: its size is exactly
 * 64 + 8*(n_docs + 1) + token_bytes*n_tokens. A document may be empty (two
 * equal offsets); our writers never write one. Readers refuse any other
 * version, width or non-zero reserved byte, so that a later version can
 * use them.
 *
 * The writer (data_flat_write_*) creates the missing directories above the
 * output (fsio_mkdirs_parent; removed again if the write fails), knows the
 * document lengths up front, writes the header and offsets, streams the
 * tokens, and publishes the file atomically (temporary name, fsync, rename,
 * fsync of the directory).
 *
 * Callers: data_source.c (data_flat_open), data_synth.c and data_bytes.c
 * (the writer), tests.
 */
#include "data.h"
#include "data_format.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/fsio.h"

#define FLAT_MAGIC       "RSTOKENS"
#define FLAT_VERSION     1u
#define FLAT_HEADER_SIZE 64u

static uint32_t flat_load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t flat_load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The first bytes of a file, printable, for "found ..." in messages. */
static void flat_show_bytes(char *out, size_t n, const uint8_t *p, size_t len) {
    size_t k = 0;
    out[0] = 0;
    k += (size_t)snprintf(out, n, "\"");
    for (size_t i = 0; i < len && k + 6 < n; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\')
            k += (size_t)snprintf(out + k, n - k, "%c", p[i]);
        else
            k += (size_t)snprintf(out + k, n - k, "\\x%02x", p[i]);
    }
    if (k + 2 < n) snprintf(out + k, n - k, "\"");
}

static const char *flat_magic_hint(const char *path, const uint8_t *p, size_t len) {
    if (len >= 7 && memcmp(p, "MMIDIDX", 7) == 0)
        return "this is a Megatron index (.idx): set data.format: megatron and data.path to the prefix\n"
               "(the path without .idx)";
    size_t pl = strlen(path);
    if (pl > 4 && strcmp(path + pl - 4, ".bin") == 0)
        return "a .bin file may be half of a Megatron dataset: then set data.format: megatron and data.path\n"
               "to the prefix (without .bin); flat files come from `ringscan data bytes` or `data synth`";
    return "flat token files are written by `ringscan data bytes` and `ringscan data synth`;\n"
           "the format is in docs/data-format.md";
}

int data_flat_open(DataSource *src, const char *path, char *err, size_t n) {
    src->path = RS_STRDUP(path);
    struct stat st;
    int rc = data_open_file(path, "data file", &src->fd, &st, err, n);
    if (rc) return rc;
    size_t size = (size_t)st.st_size;
    uint8_t p[FLAT_HEADER_SIZE] = {0};
    src->fp.bytes = (int64_t)size; /* data_source_read's messages; data_source_open sets the rest */
    rc = data_source_read(src, p, size < FLAT_HEADER_SIZE ? size : FLAT_HEADER_SIZE, 0, err, n);
    if (rc) return rc;
    const char *check_hint = "the file is damaged or was not written completely; write it again";

    if (size >= 8 && memcmp(p, FLAT_MAGIC, 8) != 0) {
        char found[64];
        flat_show_bytes(found, sizeof found, p, 8);
        return data_error(err, n, RS_EXIT_USAGE, flat_magic_hint(path, p, size),
                          "data file %s is not a ringscan flat token file: expected magic \"RSTOKENS\" at offset 0, "
                          "found %s",
                          path, found);
    }
    if (size < FLAT_HEADER_SIZE)
        return data_error(err, n, RS_EXIT_USAGE, size < 8 ? flat_magic_hint(path, p, size) : check_hint,
                          "data file %s is truncated: a flat token file starts with a %u-byte header, found %zu "
                          "bytes in all",
                          path, FLAT_HEADER_SIZE, size);
    uint32_t version = flat_load_u32(p + 8), tb = flat_load_u32(p + 12);
    uint64_t vocab = flat_load_u64(p + 16), n_tokens = flat_load_u64(p + 24), n_docs = flat_load_u64(p + 32);
    if (version != FLAT_VERSION)
        return data_error(err, n, RS_EXIT_USAGE,
                          "this build of ringscan reads flat version 1; rewrite the file with this build's "
                          "`ringscan data` tools",
                          "data file %s: unsupported flat format version %u at offset 8 (expected %u)", path,
                          version, FLAT_VERSION);
    if (tb != 2 && tb != 4)
        return data_error(err, n, RS_EXIT_USAGE, check_hint,
                          "data file %s: token_bytes %u at offset 12, expected 2 (uint16) or 4 (uint32)", path, tb);
    uint64_t vocab_max = tb == 2 ? 65536u : (uint64_t)DATA_VOCAB_MAX;
    if (vocab < 1 || vocab > vocab_max)
        return data_error(err, n, RS_EXIT_USAGE, check_hint,
                          "data file %s: vocab_size %llu at offset 16, expected 1..%llu for %u-byte tokens", path,
                          (unsigned long long)vocab, (unsigned long long)vocab_max, tb);
    for (int i = 40; i < 64; i++)
        if (p[i] != 0)
            return data_error(err, n, RS_EXIT_USAGE, check_hint,
                              "data file %s: reserved header byte %d is 0x%02x, expected 0 (bytes 40..63 are "
                              "reserved)",
                              path, i, p[i]);
    /* 2^56 documents or tokens would be petabytes: anything larger is damage,
     * and below it the size arithmetic cannot overflow. */
    const uint64_t sane = UINT64_C(1) << 56;
    if (n_docs >= sane || n_tokens >= sane)
        return data_error(err, n, RS_EXIT_USAGE, check_hint,
                          "data file %s: header says n_tokens %llu, n_docs %llu, impossible for a file of %zu "
                          "bytes",
                          path, (unsigned long long)n_tokens, (unsigned long long)n_docs, size);
    uint64_t tok_off = FLAT_HEADER_SIZE + 8 * (n_docs + 1);
    uint64_t want = tok_off + (uint64_t)tb * n_tokens;
    if ((uint64_t)size < want)
        return data_error(err, n, RS_EXIT_USAGE, check_hint,
                          "data file %s is truncated: its header (n_tokens %llu, n_docs %llu, token_bytes %u) "
                          "implies %llu bytes, found %zu",
                          path, (unsigned long long)n_tokens, (unsigned long long)n_docs, tb,
                          (unsigned long long)want, size);
    if ((uint64_t)size > want)
        return data_error(err, n, RS_EXIT_USAGE, check_hint,
                          "data file %s has %llu bytes after the last token: its header (n_tokens %llu, n_docs "
                          "%llu, token_bytes %u) implies %llu bytes, found %zu",
                          path, (unsigned long long)((uint64_t)size - want), (unsigned long long)n_tokens,
                          (unsigned long long)n_docs, tb, (unsigned long long)want, size);
    uint64_t *ds = RS_MALLOC((size_t)(n_docs + 1) * sizeof *ds); /* bounded by the file size, checked above */
    src->doc_start_owned = ds;
    rc = data_source_read(src, ds, (size_t)(n_docs + 1) * sizeof *ds, FLAT_HEADER_SIZE, err, n);
    if (rc) return rc;
    if (ds[0] != 0)
        return data_error(err, n, RS_EXIT_USAGE, check_hint,
                          "data file %s: doc_start[0] = %llu, expected 0", path, (unsigned long long)ds[0]);
    for (uint64_t d = 0; d < n_docs; d++) {
        if (ds[d + 1] < ds[d] || ds[d + 1] > n_tokens)
            return data_error(err, n, RS_EXIT_USAGE, check_hint,
                              "data file %s: doc_start[%llu] = %llu, expected a value in [%llu, n_tokens = %llu] "
                              "(offsets are non-decreasing)",
                              path, (unsigned long long)(d + 1), (unsigned long long)ds[d + 1],
                              (unsigned long long)ds[d], (unsigned long long)n_tokens);
    }
    if (ds[n_docs] != n_tokens)
        return data_error(err, n, RS_EXIT_USAGE, check_hint,
                          "data file %s: doc_start[n_docs = %llu] = %llu, expected n_tokens = %llu", path,
                          (unsigned long long)n_docs, (unsigned long long)ds[n_docs], (unsigned long long)n_tokens);
    src->dtype = tb == 2 ? DATA_DTYPE_U16 : DATA_DTYPE_U32;
    src->token_bytes = (int)tb;
    src->n_tokens = (int64_t)n_tokens;
    src->n_docs = (int64_t)n_docs;
    src->file_vocab = (int64_t)vocab;
    src->doc_start = ds;
    src->tok_off = (int64_t)tok_off;
    return 0;
}

/* ---- writer ---------------------------------------------------------------- */

static void flat_put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void flat_put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

void data_flat_write_abort(DataFlatWriter *w) {
    if (w->file) fclose((FILE *)w->file);
    if (w->tmp) unlink(w->tmp);
    if (w->made_dir) fsio_rmdirs_made(w->path, w->made_dir);
    free(w->made_dir);
    free(w->tmp);
    free(w->path);
    memset(w, 0, sizeof *w);
}

static int flat_write_failed(DataFlatWriter *w, int e, const char *what, char *err, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s", w->path ? w->path : "?");
    int rc = data_error(err, n, RS_EXIT_FAIL, "nothing was written to the output path (a full disk?)",
                        "writing %s: %s failed: %s", path, what, strerror(e));
    data_flat_write_abort(w);
    return rc;
}

int data_flat_write_begin(DataFlatWriter *w, const char *path, int64_t vocab_size, int64_t n_docs,
                          const int64_t *doc_len, char *err, size_t n) {
    memset(w, 0, sizeof *w);
    if (vocab_size < 1 || vocab_size > DATA_VOCAB_MAX)
        return data_error(err, n, RS_EXIT_USAGE, NULL, "vocab_size %lld, expected 1..%lld", (long long)vocab_size,
                          (long long)DATA_VOCAB_MAX);
    int64_t total = 0;
    for (int64_t d = 0; d < n_docs; d++) {
        RS_CHECK(doc_len[d] >= 0, "document %lld has length %lld", (long long)d, (long long)doc_len[d]);
        total += doc_len[d];
    }
    w->path = RS_STRDUP(path);
    size_t tl = strlen(path) + 32;
    w->tmp = RS_MALLOC(tl);
    snprintf(w->tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    w->token_bytes = vocab_size <= 65536 ? 2 : 4;
    w->vocab_size = vocab_size;
    w->n_tokens = total;
    w->n_docs = n_docs;
    char made[4096], msg[4096 + 512];
    int rc = fsio_mkdirs_parent(path, made, sizeof made, msg, sizeof msg);
    if (rc) {
        rc = data_error(err, n, rc, "each directory above the output must be a directory that exists or can be "
                        "created", "%s", msg);
        data_flat_write_abort(w);
        return rc;
    }
    if (made[0]) w->made_dir = RS_STRDUP(made); /* taken back by data_flat_write_abort */
    int fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        rc = data_error(err, n, RS_EXIT_USAGE, "the directory of the output must be writable",
                        "cannot create %s (the temporary name of %s): %s", w->tmp, path, strerror(e));
        data_flat_write_abort(w);
        return rc;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        return flat_write_failed(w, errno, "fdopen", err, n);
    }
    w->file = f;
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    uint8_t h[FLAT_HEADER_SIZE] = {0};
    memcpy(h, FLAT_MAGIC, 8);
    flat_put_u32(h + 8, FLAT_VERSION);
    flat_put_u32(h + 12, (uint32_t)w->token_bytes);
    flat_put_u64(h + 16, (uint64_t)vocab_size);
    flat_put_u64(h + 24, (uint64_t)total);
    flat_put_u64(h + 32, (uint64_t)n_docs);
    if (fwrite(h, 1, sizeof h, f) != sizeof h) return flat_write_failed(w, errno, "write of the header", err, n);
    uint64_t off = 0;
    uint8_t b[8];
    for (int64_t d = 0; d <= n_docs; d++) {
        flat_put_u64(b, off);
        if (fwrite(b, 1, 8, f) != 8) return flat_write_failed(w, errno, "write of the offsets", err, n);
        if (d < n_docs) off += (uint64_t)doc_len[d];
    }
    return 0;
}

int data_flat_write_tokens(DataFlatWriter *w, const int32_t *tokens, int64_t n, char *err, size_t en) {
    RS_CHECK(w->file, "data_flat_write_tokens on a writer that is not open");
    if (w->written + n > w->n_tokens) {
        int rc = data_error(err, en, RS_EXIT_FAIL, NULL, "writing %s: %lld tokens given, the header promised %lld",
                            w->path, (long long)(w->written + n), (long long)w->n_tokens);
        data_flat_write_abort(w);
        return rc;
    }
    uint8_t buf[8192];
    int64_t per = (int64_t)sizeof buf / w->token_bytes;
    for (int64_t k0 = 0; k0 < n; k0 += per) {
        int64_t m = n - k0 < per ? n - k0 : per;
        for (int64_t k = 0; k < m; k++) {
            int32_t v = tokens[k0 + k];
            if (v < 0 || v >= w->vocab_size) {
                int rc = data_error(err, en, RS_EXIT_FAIL, NULL,
                                    "writing %s: token %d at index %lld is outside [0, vocab_size %lld)", w->path,
                                    v, (long long)(w->written + k0 + k), (long long)w->vocab_size);
                data_flat_write_abort(w);
                return rc;
            }
            if (w->token_bytes == 2) {
                uint16_t u = (uint16_t)v;
                memcpy(buf + 2 * k, &u, 2);
            } else {
                uint32_t u = (uint32_t)v;
                memcpy(buf + 4 * k, &u, 4);
            }
        }
        size_t bytes = (size_t)m * (size_t)w->token_bytes;
        if (fwrite(buf, 1, bytes, (FILE *)w->file) != bytes)
            return flat_write_failed(w, errno, "write of the tokens", err, en);
    }
    w->written += n;
    return 0;
}

int data_flat_write_end(DataFlatWriter *w, char *err, size_t n) {
    RS_CHECK(w->file, "data_flat_write_end on a writer that is not open");
    if (w->written != w->n_tokens) {
        int rc = data_error(err, n, RS_EXIT_FAIL, NULL, "writing %s: %lld tokens written, the header promised %lld",
                            w->path, (long long)w->written, (long long)w->n_tokens);
        data_flat_write_abort(w);
        return rc;
    }
    FILE *f = w->file;
    if (fflush(f) != 0) return flat_write_failed(w, errno, "flush", err, n);
    if (fsync(fileno(f)) != 0) return flat_write_failed(w, errno, "fsync", err, n);
    w->file = NULL;
    if (fclose(f) != 0) return flat_write_failed(w, errno, "close", err, n);
    if (rename(w->tmp, w->path) != 0) return flat_write_failed(w, errno, "rename", err, n);
    /* the rename itself is durable once the directory is synced */
    char *dir_copy = RS_STRDUP(w->path);
    int dfd = open(dirname(dir_copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir_copy);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(w->made_dir);
    free(w->tmp);
    free(w->path);
    memset(w, 0, sizeof *w);
    return 0;
}
