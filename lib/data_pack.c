/*
 * data_pack.c — the deterministic sample order and packing (see data.h).
 *
 * Epoch e's stream is the file's documents in an order, concatenated:
 *   - data.shuffle false: file order, every epoch.
 *   - data.shuffle true: Fisher–Yates over the identity, with the generator
 *     of rng.h initialised as init(seed, stream = e):
 *       for i = n_docs-1 down to 1: j = below(i + 1); swap(order[i], order[j])
 *     Each epoch has its own order; the same (seed, e) gives the same order on
 *     every machine.
 * cum[k] = the stream offset of the document at place k (prefix sums of the
 * lengths in epoch order; cum[n_docs] = n_tokens). Sample i of the epoch is
 * stream [i*T, i*T + T]; the place holding stream offset p is found by binary
 * search over cum (O(log n_docs)) and the sample then walks forward over the
 * documents it touches, so a read costs O(T + log n_docs), whatever the file
 * size. Only entering a new epoch costs O(n_docs) (the shuffle and its
 * prefix sums, 16 bytes per document, kept for the current epoch).
 *
 * Per token t of the sample: targets[t] = the next stream token when it is in
 * the same document, else -1; doc_pos[t] counts from the document's start or
 * from the sample's start, whichever is later (the model never sees the
 * previous sample, so a continuing document restarts at 0).
 *
 * Callers: the trainer, data_cli.c (inspect), tests.
 */
#include "data.h"

#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "error.h"

struct DataSet {
    DataSource *src;
    int64_t     T;       /* tokens per sample */
    int64_t     S;       /* samples per epoch */
    bool        shuffle;
    uint64_t    seed;
    int64_t     epoch;   /* the epoch `order` and `cum` hold; -1: none yet */
    int64_t    *order;   /* (n_docs) file document at each place; NULL when not shuffled */
    uint64_t   *cum;     /* (n_docs + 1) stream offset of each place; NULL when not shuffled */
};

int64_t           data_samples_per_epoch(const DataSet *ds) { return ds->S; }
int64_t           data_seq_len(const DataSet *ds) { return ds->T; }
const DataSource *data_source(const DataSet *ds) { return ds->src; }

void data_close(DataSet *ds) {
    if (!ds) return;
    data_source_close(ds->src);
    free(ds->order);
    free(ds->cum);
    free(ds);
}

int data_open_source(DataSet **out, DataSource *src, int64_t seq_len, bool shuffle, uint64_t seed, char *err,
                     size_t n) {
    *out = NULL;
    int rc = 0;
    if (seq_len < 1 || seq_len > INT32_MAX)
        rc = data_error(err, n, RS_EXIT_USAGE, NULL, "data.seq_len %lld, expected 1..%d (positions are int32)",
                        (long long)seq_len, INT32_MAX);
    else if (src->n_tokens < seq_len + 1)
        rc = data_error(err, n, RS_EXIT_USAGE, "use a shorter data.seq_len, or more data",
                        "data file %s has %lld tokens; one sample of data.seq_len %lld needs %lld (inputs and the "
                        "next-token target of the last)",
                        src->path, (long long)src->n_tokens, (long long)seq_len, (long long)(seq_len + 1));
    if (rc) {
        data_source_close(src);
        return rc;
    }
    DataSet *ds = RS_CALLOC(1, sizeof *ds);
    ds->src = src;
    ds->T = seq_len;
    ds->S = (src->n_tokens - 1) / seq_len;
    ds->shuffle = shuffle;
    ds->seed = seed;
    ds->epoch = -1;
    if (shuffle) {
        ds->order = RS_MALLOC((size_t)src->n_docs * sizeof *ds->order + 1);
        ds->cum = RS_MALLOC((size_t)(src->n_docs + 1) * sizeof *ds->cum);
    }
    *out = ds;
    return 0;
}

int data_open(DataSet **out, const DataConfig *dc, int64_t vocab_size, uint64_t seed, char *err, size_t n) {
    *out = NULL;
    DataSource *src;
    int rc = data_source_open(&src, (DataFormat)dc->format, dc->path, vocab_size, err, n);
    if (rc) return rc;
    return data_open_source(out, src, dc->seq_len, dc->shuffle, seed, err, n);
}

/* ---- order ----------------------------------------------------------------- */

static void data_shuffle_order(int64_t *order, int64_t n_docs, uint64_t seed, int64_t epoch) {
    for (int64_t k = 0; k < n_docs; k++) order[k] = k;
    Rng r;
    rng_init(&r, seed, (uint64_t)epoch);
    for (int64_t i = n_docs - 1; i >= 1; i--) {
        int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

static void data_set_epoch(DataSet *ds, int64_t epoch) {
    if (!ds->shuffle || ds->epoch == epoch) return;
    const DataSource *src = ds->src;
    data_shuffle_order(ds->order, src->n_docs, ds->seed, epoch);
    ds->cum[0] = 0;
    for (int64_t k = 0; k < src->n_docs; k++) {
        int64_t d = ds->order[k];
        ds->cum[k + 1] = ds->cum[k] + (src->doc_start[d + 1] - src->doc_start[d]);
    }
    ds->epoch = epoch;
}

int data_epoch_order(DataSet *ds, int64_t epoch, int64_t *order, char *err, size_t n) {
    if (epoch < 0) return data_error(err, n, RS_EXIT_USAGE, NULL, "epoch %lld, expected >= 0", (long long)epoch);
    if (!ds->shuffle) {
        for (int64_t k = 0; k < ds->src->n_docs; k++) order[k] = k;
        return 0;
    }
    data_set_epoch(ds, epoch);
    memcpy(order, ds->order, (size_t)ds->src->n_docs * sizeof *order);
    return 0;
}

/* ---- samples --------------------------------------------------------------- */

int data_read_span(DataSet *ds, int64_t g, int64_t t0, int64_t len, int32_t *tokens, int32_t *targets,
                   int32_t *pos, int32_t *doc_pos, char *err, size_t n) {
    const DataSource *src = ds->src;
    if (g < 0) return data_error(err, n, RS_EXIT_USAGE, NULL, "sample index %lld, expected >= 0", (long long)g);
    if (t0 < 0 || len < 0 || t0 + len > ds->T)
        return data_error(err, n, RS_EXIT_USAGE, NULL, "span [%lld, %lld) of a sample, expected within [0, %lld)",
                          (long long)t0, (long long)(t0 + len), (long long)ds->T);
    int64_t epoch = g / ds->S, i = g % ds->S;
    data_set_epoch(ds, epoch);
    const uint64_t *cum = ds->shuffle ? ds->cum : src->doc_start;
    const int64_t base = i * ds->T;         /* stream offset of the sample's first token */
    const int64_t a = base + t0, end = a + len; /* stream range of these inputs; end <= n_tokens - 1 */

    /* the place holding stream offset a: largest k < n_docs with cum[k] <= a */
    int64_t lo = 0, hi = src->n_docs;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (cum[mid] <= (uint64_t)a) lo = mid;
        else hi = mid;
    }
    int64_t k = lo;
    /* unshuffled, the stream is the file: one read for the whole span (a shuffled stream reads each
     * document's piece where it lies in the file) */
    const bool whole = !ds->shuffle;
    if (whole && len > 0) {
        int rc = data_source_copy(src, a, len, tokens, err, n);
        if (rc) return rc;
    }
    for (int64_t p = a; p < end;) {
        while (cum[k + 1] <= (uint64_t)p) k++; /* past empty documents */
        const int64_t doc = ds->shuffle ? ds->order[k] : k;
        const int64_t file0 = (int64_t)src->doc_start[doc];          /* file offset of the document */
        const int64_t d0 = (int64_t)cum[k], d1 = (int64_t)cum[k + 1]; /* its stream range */
        const int64_t seg_end = d1 < end ? d1 : end;
        const int64_t m = seg_end - p, off = p - a;
        int rc = whole ? 0 : data_source_copy(src, file0 + (p - d0), m, tokens + off, err, n);
        if (rc) return rc;
        const int64_t from = d0 > base ? d0 : base; /* where doc_pos counts from */
        for (int64_t j = 0; j < m; j++) {
            if (pos) pos[off + j] = (int32_t)(t0 + off + j);
            if (doc_pos) doc_pos[off + j] = (int32_t)(p + j - from);
        }
        if (targets) {
            for (int64_t j = 0; j + 1 < m; j++) targets[off + j] = tokens[off + j + 1];
            int32_t last = -1;
            if (seg_end < d1) { /* the span ends inside the document: its next token is the target */
                rc = data_source_copy(src, file0 + (seg_end - d0), 1, &last, err, n);
                if (rc) return rc;
            }
            targets[off + m - 1] = last;
        }
        p = seg_end;
    }
    /* after the reads: a file overwritten in place before or while they ran is caught here */
    return data_source_check(src, err, n);
}

int data_read_sample(DataSet *ds, int64_t g, int32_t *tokens, int32_t *targets, int32_t *pos, int32_t *doc_pos,
                     char *err, size_t n) {
    return data_read_span(ds, g, 0, ds->T, tokens, targets, pos, doc_pos, err, n);
}

/* ---- data position ------------------------------------------------------- */

int64_t data_tokens_consumed(const DataSet *ds, int64_t g) {
    RS_CHECK(g >= 0 && g <= INT64_MAX / ds->T, "sample index %lld times seq_len %lld overflows", (long long)g,
             (long long)ds->T);
    return g * ds->T;
}

int data_position_to_sample(const DataSet *ds, int64_t tokens, int64_t *g, char *err, size_t n) {
    if (tokens < 0 || tokens % ds->T != 0)
        return data_error(err, n, RS_EXIT_USAGE,
                          "a run's data position is a whole number of samples; was data.seq_len changed since the "
                          "checkpoint?",
                          "data position %lld tokens is not a multiple of data.seq_len %lld", (long long)tokens,
                          (long long)ds->T);
    *g = tokens / ds->T;
    return 0;
}
