/*
 * data_megatron.c — reading a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx), the format
 * Megatron's tools/preprocess_data.py writes, as verified against Megatron-LM's own reader and writer
 * (megatron/core/datasets/indexed_dataset.py, commit 00caa53a). The byte layout, table by table, is in
 * docs/data-format.md; in short, all little-endian:
 *   PREFIX.idx  magic "MMIDIDX\x00\x00", uint64 version 1, uint8 dtype code, uint64 sequence count S,
 *               uint64 document_indices count D, then int32[S] lengths, int64[S] byte pointers into
 *               .bin, int64[D] document_indices (and int8[S] modes in multimodal datasets), unpadded, so
 *               the int64 arrays are unaligned and read with memcpy
 *   PREFIX.bin  every sequence's tokens back to back; sequence i occupies [pointer[i], pointer[i] +
 *               length[i] itemsize), and .bin is exactly sum(lengths) itemsize bytes
 * Document d is the sequences [document_indices[d], document_indices[d+1]) (document_indices starts at
 * 0 and ends at S: D = documents + 1).
 *
 * Beyond the reader's own checks we require what Megatron's writer always produces, with a clear error
 * otherwise: exact sizes, lengths >= 0, contiguous pointers, document_indices non-decreasing within
 * [0, S], an integer dtype, no sequence_modes (multimodal data is not text tokens).
 *
 * We build one array of n_docs + 1 document start offsets, in tokens (8 bytes per document); the index is
 * mapped only while opening, and the tokens are read from the .bin with pread (data.h says why).
 *
 * Callers: data_source.c (data_megatron_open).
 */
#include "data.h"
#include "data_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

#define MEG_MAGIC       "MMIDIDX\x00\x00"
#define MEG_MAGIC_LEN   9
#define MEG_HEADER_SIZE 34

static uint64_t meg_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static int64_t meg_i64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}
static int32_t meg_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Megatron dtype code -> ours; -1 for floats, -2 for unknown codes. */
static int meg_dtype(unsigned code) {
    switch (code) {
    case 1: return DATA_DTYPE_U8;
    case 2: return DATA_DTYPE_I8;
    case 3: return DATA_DTYPE_I16;
    case 4: return DATA_DTYPE_I32;
    case 5: return DATA_DTYPE_I64;
    case 6:
    case 7: return -1;
    case 8: return DATA_DTYPE_U16;
    default: return -2;
    }
}

static int meg_has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

int data_megatron_open(DataSource *src, const char *prefix, char *err, size_t n) {
    size_t pl = strlen(prefix);
    src->path = RS_MALLOC(pl + 5);
    src->idx_path = RS_MALLOC(pl + 5);
    snprintf(src->path, pl + 5, "%s.bin", prefix);
    snprintf(src->idx_path, pl + 5, "%s.idx", prefix);
    const char *idx = src->idx_path, *bin = src->path;
    const char *damaged = "the index is damaged or was not written completely; run Megatron's preprocessing again";

    if ((meg_has_suffix(prefix, ".bin") || meg_has_suffix(prefix, ".idx")) && access(idx, F_OK) != 0)
        return data_error(err, n, RS_EXIT_USAGE,
                          "data.path of a Megatron dataset is the prefix, without .bin or .idx",
                          "Megatron index %s does not exist (data.path %s ends in %s)", idx, prefix,
                          prefix + pl - 4);
    void *map;
    size_t size;
    int rc = data_map_file(idx, "Megatron index", &map, &size, err, n);
    if (rc) return rc;
    src->map = map; /* released at the end: only doc_start is kept */
    src->map_len = size;
    const uint8_t *p = map;

    if (size >= MEG_MAGIC_LEN && memcmp(p, MEG_MAGIC, MEG_MAGIC_LEN) != 0) {
        char found[64] = "";
        size_t k = 0;
        for (size_t i = 0; i < MEG_MAGIC_LEN && k + 5 < sizeof found; i++)
            k += (size_t)snprintf(found + k, sizeof found - k, (p[i] >= 0x20 && p[i] < 0x7f) ? "%c" : "\\x%02x",
                                  p[i]);
        return data_error(err, n, RS_EXIT_USAGE,
                          size >= 8 && memcmp(p, "RSTOKENS", 8) == 0
                              ? "this is a ringscan flat file: set data.format: flat and data.path to it"
                              : damaged,
                          "Megatron index %s: expected magic \"MMIDIDX\\x00\\x00\" at offset 0, found \"%s\"", idx,
                          found);
    }
    if (size < MEG_HEADER_SIZE)
        return data_error(err, n, RS_EXIT_USAGE, damaged,
                          "Megatron index %s is truncated: the header is %d bytes, found %zu bytes in all", idx,
                          MEG_HEADER_SIZE, size);
    uint64_t version = meg_u64(p + 9);
    unsigned code = p[17];
    uint64_t S = meg_u64(p + 18), D = meg_u64(p + 26);
    if (version != 1)
        return data_error(err, n, RS_EXIT_USAGE, damaged,
                          "Megatron index %s: version %llu at offset 9, expected 1", idx, (unsigned long long)version);
    int dt = meg_dtype(code);
    if (dt == -1)
        return data_error(err, n, RS_EXIT_USAGE, "token files hold integers; this dataset holds floats",
                          "Megatron index %s: dtype code %u (%s) at offset 17, expected an integer dtype", idx, code,
                          code == 6 ? "float64" : "float32");
    if (dt == -2)
        return data_error(err, n, RS_EXIT_USAGE, damaged,
                          "Megatron index %s: dtype code %u at offset 17, expected one of 1 uint8, 2 int8, 3 int16, "
                          "4 int32, 5 int64, 8 uint16",
                          idx, code);
    const uint64_t sane = UINT64_C(1) << 56;
    if (S >= sane || D >= sane)
        return data_error(err, n, RS_EXIT_USAGE, damaged,
                          "Megatron index %s: sequence count %llu and document count %llu are impossible for a "
                          "file of %zu bytes",
                          idx, (unsigned long long)S, (unsigned long long)D, size);
    uint64_t want = MEG_HEADER_SIZE + 12 * S + 8 * D;
    if ((uint64_t)size == want + S && S > 0)
        return data_error(err, n, RS_EXIT_USAGE, "use a text-only dataset",
                          "Megatron index %s has sequence_modes (a multimodal dataset): %zu bytes, %llu more than "
                          "the %llu of a text dataset with %llu sequences",
                          idx, size, (unsigned long long)S, (unsigned long long)want, (unsigned long long)S);
    if ((uint64_t)size != want)
        return data_error(err, n, RS_EXIT_USAGE, damaged,
                          "Megatron index %s is %s: its header (%llu sequences, %llu document indices) implies "
                          "%llu bytes, found %zu",
                          idx, (uint64_t)size < want ? "truncated" : "longer than its header says",
                          (unsigned long long)S, (unsigned long long)D, (unsigned long long)want, size);
    if (D < 1)
        return data_error(err, n, RS_EXIT_USAGE, damaged,
                          "Megatron index %s: document count 0, expected at least 1 (document_indices starts "
                          "with 0)",
                          idx);
    const uint8_t *lens = p + MEG_HEADER_SIZE, *ptrs = lens + 4 * S, *docs = ptrs + 8 * S;
    int itemsize = data_dtype_bytes((DataDtype)dt);

    /* sequences: lengths >= 0, stored back to back from byte 0 */
    uint64_t expect_ptr = 0;
    for (uint64_t s = 0; s < S; s++) {
        int32_t len = meg_i32(lens + 4 * s);
        int64_t ptr = meg_i64(ptrs + 8 * s);
        if (len < 0)
            return data_error(err, n, RS_EXIT_USAGE, damaged,
                              "Megatron index %s: sequence_lengths[%llu] = %d, expected >= 0", idx,
                              (unsigned long long)s, len);
        if (ptr < 0 || (uint64_t)ptr != expect_ptr)
            return data_error(err, n, RS_EXIT_USAGE,
                              "ringscan reads sequences stored back to back, as Megatron's IndexedDatasetBuilder "
                              "writes them",
                              "Megatron index %s: sequence_pointers[%llu] = %lld, expected %llu (the byte where "
                              "sequence %llu ends)",
                              idx, (unsigned long long)s, (long long)ptr, (unsigned long long)expect_ptr,
                              (unsigned long long)(s ? s - 1 : 0));
        expect_ptr += (uint64_t)len * (uint64_t)itemsize;
    }
    uint64_t n_tokens = expect_ptr / (uint64_t)itemsize;

    /* documents: [0, ..., S], non-decreasing */
    for (uint64_t d = 0; d < D; d++) {
        int64_t v = meg_i64(docs + 8 * d), prev = d ? meg_i64(docs + 8 * (d - 1)) : 0;
        if (d == 0 && v != 0)
            return data_error(err, n, RS_EXIT_USAGE, damaged,
                              "Megatron index %s: document_indices[0] = %lld, expected 0", idx, (long long)v);
        if (v < prev || (uint64_t)v > S)
            return data_error(err, n, RS_EXIT_USAGE, damaged,
                              "Megatron index %s: document_indices[%llu] = %lld, expected a value in [%lld, "
                              "sequence count %llu] (non-decreasing)",
                              idx, (unsigned long long)d, (long long)v, (long long)prev, (unsigned long long)S);
    }
    int64_t last = meg_i64(docs + 8 * (D - 1));
    if ((uint64_t)last != S)
        return data_error(err, n, RS_EXIT_USAGE, damaged,
                          "Megatron index %s: the last document index is %lld, expected the sequence count %llu", idx,
                          (long long)last, (unsigned long long)S);

    /* the tokens */
    struct stat st;
    rc = data_open_file(bin, "Megatron data file", &src->fd, &st, err, n);
    if (rc) return rc;
    if ((uint64_t)st.st_size != expect_ptr)
        return data_error(err, n, RS_EXIT_USAGE,
                          "the .bin and .idx do not belong together, or the .bin was not written completely",
                          "Megatron data file %s is %lld bytes; its index %s (%llu tokens of %s) implies %llu bytes",
                          bin, (long long)st.st_size, idx, (unsigned long long)n_tokens, data_dtype_names[dt],
                          (unsigned long long)expect_ptr);

    uint64_t n_docs = D - 1;
    uint64_t *ds = RS_MALLOC((size_t)(n_docs + 1) * sizeof *ds);
    for (uint64_t d = 0; d <= n_docs; d++) {
        uint64_t s = (uint64_t)meg_i64(docs + 8 * d);
        ds[d] = s == S ? n_tokens : (uint64_t)meg_i64(ptrs + 8 * s) / (uint64_t)itemsize;
    }
    src->doc_start_owned = ds;
    src->doc_start = ds;
    src->dtype = (DataDtype)dt;
    src->token_bytes = itemsize;
    src->n_tokens = (int64_t)n_tokens;
    src->n_docs = (int64_t)n_docs;
    src->file_vocab = 0;
    src->tok_off = 0;
    munmap(src->map, src->map_len);
    src->map = NULL;
    return 0;
}
