/*
 * data_bytes.c — byte-level tokens of text files (`ringscan data bytes`).
 *
 * Every byte is one token (vocab 256, stored as uint16 in a flat file), so
 * any text becomes training data without a tokenizer. Documents:
 *   --doc-split file   each input file is one document (its exact bytes)
 *   --doc-split blank  each input file is cut at blank lines: a document is a
 *                      maximal run of non-blank lines, with each line's bytes
 *                      exactly as in the file, its '\n' included; a blank line
 *                      holds only spaces, tabs and '\r' and is not part of any
 *                      document. (This is the default.)
 * An empty input, or one with only blank lines, adds no document.
 *
 * Inputs are memory-mapped and read twice: once to find the documents
 * (16 bytes of memory per document), once to write the tokens through the
 * flat writer, which publishes the output atomically. Every input is opened
 * before the output is created, so a missing input writes nothing.
 *
 * Callers: data_cli.c, tests/test_data.py.
 */
#include "data.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/error.h"

typedef struct {
    int64_t *file, *off, *len; /* per document: input index, byte offset, bytes */
    int64_t  n, cap;
} BytesDocs;

static void bytes_docs_add(BytesDocs *d, int64_t file, int64_t off, int64_t len) {
    if (len == 0) return;
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 1024;
        d->file = RS_REALLOC(d->file, (size_t)d->cap * sizeof *d->file);
        d->off = RS_REALLOC(d->off, (size_t)d->cap * sizeof *d->off);
        d->len = RS_REALLOC(d->len, (size_t)d->cap * sizeof *d->len);
    }
    d->file[d->n] = file;
    d->off[d->n] = off;
    d->len[d->n] = len;
    d->n++;
}

static void bytes_split_blank(BytesDocs *d, int64_t file, const uint8_t *p, int64_t n) {
    int64_t doc = -1; /* start of the current document, -1: between documents */
    for (int64_t i = 0; i < n;) {
        int64_t e = i, blank = 1;
        while (e < n && p[e] != '\n') {
            if (p[e] != ' ' && p[e] != '\t' && p[e] != '\r') blank = 0;
            e++;
        }
        int64_t next = e < n ? e + 1 : n; /* the line is [i, next) */
        if (blank && doc >= 0) {
            bytes_docs_add(d, file, doc, i - doc);
            doc = -1;
        } else if (!blank && doc < 0) {
            doc = i;
        }
        i = next;
    }
    if (doc >= 0) bytes_docs_add(d, file, doc, n - doc);
}

int data_bytes_write(const char *path, const char *const *inputs, int n_inputs, DataDocSplit split,
                     DataBytesStats *st, char *err, size_t n) {
    memset(st, 0, sizeof *st);
    void **map = RS_CALLOC((size_t)n_inputs, sizeof *map);
    size_t *size = RS_CALLOC((size_t)n_inputs, sizeof *size);
    BytesDocs docs = {0};
    int rc = 0;
    for (int f = 0; f < n_inputs && !rc; f++) {
        rc = data_map_file(inputs[f], "input file", &map[f], &size[f], err, n);
        if (rc) break;
        if (map[f]) madvise(map[f], size[f], MADV_SEQUENTIAL);
        if (split == DATA_DOC_SPLIT_FILE) bytes_docs_add(&docs, f, 0, (int64_t)size[f]);
        else bytes_split_blank(&docs, f, map[f], (int64_t)size[f]);
    }
    int64_t total = 0;
    for (int64_t d = 0; d < docs.n; d++) total += docs.len[d];
    if (!rc && total == 0)
        rc = data_error(err, n, RS_EXIT_USAGE, "give text files with something in them",
                        "the %d input file%s hold no document (empty, or only blank lines); nothing was written",
                        n_inputs, n_inputs == 1 ? "" : "s");
    if (!rc) {
        DataFlatWriter w;
        rc = data_flat_write_begin(&w, path, 256, docs.n, docs.len, err, n);
        int32_t buf[16384];
        for (int64_t d = 0; d < docs.n && !rc; d++) {
            const uint8_t *p = (const uint8_t *)map[docs.file[d]] + docs.off[d];
            for (int64_t k0 = 0; k0 < docs.len[d] && !rc; k0 += 16384) {
                int64_t m = docs.len[d] - k0 < 16384 ? docs.len[d] - k0 : 16384;
                for (int64_t k = 0; k < m; k++) buf[k] = p[k0 + k];
                rc = data_flat_write_tokens(&w, buf, m, err, n);
            }
        }
        if (!rc) rc = data_flat_write_end(&w, err, n);
    }
    if (!rc) {
        st->n_files = n_inputs;
        st->n_docs = docs.n;
        st->n_tokens = total;
    }
    for (int f = 0; f < n_inputs; f++)
        if (map[f]) munmap(map[f], size[f]);
    free(map);
    free(size);
    free(docs.file);
    free(docs.off);
    free(docs.len);
    return rc;
}
