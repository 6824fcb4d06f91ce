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

#include "core/rng.h"
#include "core/error.h"

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

/* One document's piece of a span: `len` tokens at file token `file`, going to out[out..]; `next` is
 * the file token after the piece when the span ends inside the document (its last target), else -1. */
typedef struct {
    int64_t file, len, out, next;
} DataPiece;

static int data_piece_cmp(const void *x, const void *y) {
    int64_t a = ((const DataPiece *)x)->file, b = ((const DataPiece *)y)->file;
    return a < b ? -1 : a > b;
}

/* Pieces closer than this many tokens in the file are read by one pread (reading the gap costs less
 * than a call), up to DATA_RANGE_MAX tokens a read. */
#define DATA_GAP_MAX   4096
#define DATA_RANGE_MAX (1 << 20)

/* out[piece.out ..] = the pieces' tokens: the pieces sorted by file position and read in ranges of
 * nearby pieces, so many small shuffled documents cost a few large reads, not one call each (1M-token
 * samples of 1..5-token documents: tests/unit/test_data.c). Sorts pc. */
static int data_read_pieces(const DataSource *src, DataPiece *pc, int64_t np, int32_t *out, char *err, size_t n) {
    qsort(pc, (size_t)np, sizeof *pc, data_piece_cmp);
    int32_t *buf = NULL;
    int64_t buf_cap = 0;
    int rc = 0;
    for (int64_t i = 0; i < np && !rc;) {
        int64_t r0 = pc[i].file, r1 = pc[i].file + pc[i].len, e = i + 1;
        while (e < np && pc[e].file - r1 <= DATA_GAP_MAX && pc[e].file + pc[e].len - r0 <= DATA_RANGE_MAX) {
            if (pc[e].file + pc[e].len > r1) r1 = pc[e].file + pc[e].len;
            e++;
        }
        if (e == i + 1) { /* alone: straight into place */
            rc = data_source_copy(src, pc[i].file, pc[i].len, out + pc[i].out, err, n);
            i = e;
            continue;
        }
        if (r1 - r0 > buf_cap) buf = RS_REALLOC(buf, (size_t)(buf_cap = r1 - r0) * sizeof *buf);
        rc = data_source_copy(src, r0, r1 - r0, buf, err, n);
        for (; i < e && !rc; i++) memcpy(out + pc[i].out, buf + (pc[i].file - r0), (size_t)pc[i].len * sizeof *out);
        i = e;
    }
    free(buf);
    return rc;
}

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
    /* the span's pieces: one per document it touches, in stream order */
    int64_t np = 0, cap = 16;
    DataPiece *pc = RS_MALLOC((size_t)cap * sizeof *pc);
    for (int64_t p = a; p < end;) {
        while (cum[k + 1] <= (uint64_t)p) k++; /* past empty documents */
        const int64_t doc = ds->shuffle ? ds->order[k] : k;
        const int64_t file0 = (int64_t)src->doc_start[doc];          /* file offset of the document */
        const int64_t d0 = (int64_t)cum[k], d1 = (int64_t)cum[k + 1]; /* its stream range */
        const int64_t seg_end = d1 < end ? d1 : end;
        const int64_t m = seg_end - p, off = p - a;
        if (np == cap) pc = RS_REALLOC(pc, (size_t)(cap *= 2) * sizeof *pc);
        pc[np++] = (DataPiece){file0 + (p - d0), m, off, seg_end < d1 ? file0 + (seg_end - d0) : -1};
        const int64_t from = d0 > base ? d0 : base; /* where doc_pos counts from */
        for (int64_t j = 0; j < m; j++) {
            if (pos) pos[off + j] = (int32_t)(t0 + off + j);
            if (doc_pos) doc_pos[off + j] = (int32_t)(p + j - from);
        }
        p = seg_end;
    }
    /* unshuffled, the stream is the file: one read for the whole span; shuffled, the pieces in file order */
    int rc = !ds->shuffle ? (len > 0 ? data_source_copy(src, a, len, tokens, err, n) : 0)
                          : data_read_pieces(src, pc, np, tokens, err, n);
    for (int64_t c = 0; c < np && targets && !rc; c++) {
        const DataPiece *q = &pc[c];
        for (int64_t j = 0; j + 1 < q->len; j++) targets[q->out + j] = tokens[q->out + j + 1];
        int32_t last = -1; /* the document ends here; else the span ends inside it: its next token */
        if (q->next >= 0) rc = data_source_copy(src, q->next, 1, &last, err, n);
        targets[q->out + q->len - 1] = last;
    }
    free(pc);
    if (rc) return rc;
    /* after the reads: a file overwritten in place before or while they ran is caught here */
    return data_source_check(src, err, n);
}

int data_span_read(void *ctx, int64_t g, int64_t t0, int64_t len, int32_t *tokens, int32_t *targets, int32_t *pos,
                   int32_t *doc_pos) {
    DataSpanReader *r = ctx;
    return data_read_span(r->data, g, t0, len, tokens, targets, pos, doc_pos, r->err, sizeof r->err);
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
