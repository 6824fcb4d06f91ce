/*
 * data.h — training data: token sources, the deterministic sample order, packing with document
 * boundaries, and the writers behind `ringscan data`. Formats and packing: docs/data-format.md.
 *
 *   DataSource (data_source.c, data_flat.c, data_megatron.c): one token file with its document
 *     boundaries, our flat format or a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx). Opening
 *     validates every header field and offset against the file sizes; tokens are read with pread into
 *     owned buffers, and the source carries a fingerprint of its data for the checkpoint.
 *   DataSet (data_pack.c): the packed stream the trainer reads. Epoch e orders the documents (file
 *     order, or a Fisher-Yates shuffle seeded by (seed, e)) and concatenates them; sample i of the epoch
 *     is stream tokens [i T, i T + T] (T inputs and their next-token targets). Global sample g is
 *     (epoch g / S, sample g % S), S = (n_tokens - 1) / T; an epoch's last n_tokens - S T tokens are
 *     unused in it. The run's data position is g T tokens, whatever the number of ranks that read it.
 *   Writers (data_flat.c, data_synth.c, data_bytes.c) and the tools (cmd/data.c: `ringscan data
 *     synth|bytes|check|inspect`).
 *
 * Errors: every function that can fail on user input returns 0, RS_EXIT_USAGE (bad input: the file or an
 * argument) or RS_EXIT_FAIL (the system), with one message in `err` whose first line names the file,
 * what was expected and what was found (hints after it). data_fail() prints it the way error.h does and
 * exits with RS_EXIT_USAGE; the trainer calls it on a failed data_open / data_read_sample.
 *
 * Threads: a DataSource is read-only after opening and may be shared; a DataSet caches the current
 * epoch's order, so one DataSet per thread.
 *
 * Callers: cmd/ringscan.c (`ringscan data`), the trainer (data_open, data_read_sample or data_read_span
 * per micro-step), the checkpoint code (data_position_to_sample on resume), tests/unit/test_data.c and
 * tests/test_data.py.
 */
#ifndef RS_DATA_H
#define RS_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdnoreturn.h>
#include <sys/stat.h>

#include "config/config.h"

/* ---- token sources -------------------------------------------------------- */

/* Token element types. Flat files use U16 or U32; Megatron files any of its
 * integer dtype codes (data_megatron.c lists the code table). */
typedef enum {
    DATA_DTYPE_U8,
    DATA_DTYPE_I8,
    DATA_DTYPE_I16,
    DATA_DTYPE_U16,
    DATA_DTYPE_I32,
    DATA_DTYPE_U32,
    DATA_DTYPE_I64,
    DATA_DTYPE_COUNT
} DataDtype;

extern const char *const data_dtype_names[DATA_DTYPE_COUNT + 1]; /* "uint16", ... */
int data_dtype_bytes(DataDtype dt);

/* Token ids are int32 in every buffer the trainer sees, so no vocabulary may
 * be larger than this. */
#define DATA_VOCAB_MAX INT64_C(2147483647)

/* What identifies the data a run reads, stored in its checkpoints (resume
 * compares it, train_ckpt.c). `hash` decides; sizes and times are for the
 * message. The hash is FNV-1a (64-bit words) over token_bytes, n_tokens,
 * n_docs, every document start, and DATA_FP_BLOCKS blocks of DATA_FP_BLOCK
 * token bytes spread evenly over the tokens (first and last included; all of
 * them when the tokens are smaller than that): a fixed read plus 8 bytes per
 * document at open, whatever the file size. A full hash would read the whole
 * file (minutes for hundreds of GB, at every start and resume); the sampled
 * one catches a replaced, regenerated, re-tokenized, truncated or extended
 * file, and misses an edit of a few tokens between the sampled blocks that
 * keeps the size and the documents (its changed mtime is reported). */
#define DATA_FP_BLOCKS 64
#define DATA_FP_BLOCK  4096
typedef struct {
    uint64_t hash;
    int64_t  bytes, mtime_ns;         /* the token file (flat file or PREFIX.bin) when opened */
    int64_t  idx_bytes, idx_mtime_ns; /* megatron: PREFIX.idx; flat: 0 */
    int64_t  ctime_ns;                /* the token file's status change time when opened: the in-run check
                                         only (data_source_check), not stored (a copy or chmod changes it) */
} DataFingerprint;

/* One opened token file. Fields are read-only for callers.
 *
 * Tokens are read with pread(2) into the caller's buffers, never through a
 * mapping: a file truncated while a run reads it is a short read (an error
 * naming the file), not a SIGBUS, and every read checks afterwards that the
 * file's size, mtime and ctime are those it had when opened, so a file
 * overwritten in place stops the run before a step uses what was read from
 * it, even when the writer restored the old mtime (utimensat cannot set
 * ctime; the price: a chmod or chown of the file during the run stops it
 * too, saying so). A file
 * replaced by rename is not seen (the open descriptor keeps the old one);
 * the fingerprint in the checkpoint catches it at resume. */
typedef struct {
    DataFormat      format;
    char           *path;        /* the token file named in messages: the flat file, or PREFIX.bin */
    char           *idx_path;    /* megatron: PREFIX.idx; NULL for flat */
    DataDtype       dtype;
    int             token_bytes; /* bytes per token */
    int64_t         n_tokens;
    int64_t         n_docs;      /* documents, empty ones included */
    int64_t         file_vocab;  /* flat: the header's vocab_size; megatron: 0 (the format has none) */
    int64_t         vocab_limit; /* token ids must lie in [0, vocab_limit): the model's vocab_size when
                                    given, else file_vocab, else DATA_VOCAB_MAX */
    bool            vocab_is_model; /* vocab_limit came from the model (for the hint of a bad id) */
    int             fd;          /* the token file, open read-only; -1 when not open */
    int64_t         tok_off;     /* byte offset of token 0 in it */
    const uint64_t *doc_start;   /* (n_docs + 1) token offsets of document starts, non-decreasing;
                                    [0] = 0, [n_docs] = n_tokens (= doc_start_owned) */
    DataFingerprint fp;          /* filled by data_source_open */
    /* owned resources */
    void     *map;               /* megatron: the index, mapped only while opening; else NULL */
    size_t    map_len;
    uint64_t *doc_start_owned;
} DataSource;

/* Opens and validates `path` (a flat file, or a Megatron prefix without
 * .bin/.idx). vocab_size > 0 is the model's vocabulary: a flat file made for
 * a larger one is refused, and every token read is checked against it;
 * vocab_size <= 0 (the tools) means "no model": the file's own vocab_size,
 * if it has one, is the limit. */
int  data_source_open(DataSource **out, DataFormat format, const char *path, int64_t vocab_size, char *err,
                      size_t n);
void data_source_close(DataSource *src);

/* Token i of the file as stored (signed dtypes may be negative). No range
 * check; a failed read ends the process (tools and tests only). */
int64_t data_source_token(const DataSource *src, int64_t i);

/* dst[k] = token (start + k) for k in [0, n), converted to int32 and checked
 * against [0, vocab_limit): a bad id is an error naming the file, the token's
 * index in the file, its document and the limit. */
int data_source_copy(const DataSource *src, int64_t start, int64_t n, int32_t *dst, char *err, size_t en);

/* Whole-file scan for `ringscan data check`: the largest and smallest token
 * id, and the first token outside [0, vocab_limit) as an error. Reads every
 * token once (sequentially, 1 MiB at a time). */
int data_source_scan(const DataSource *src, int64_t *min_id, int64_t *max_id, char *err, size_t n);

/* The document containing token i: the largest d with doc_start[d] <= i and a
 * non-empty document (binary search, O(log n_docs)). */
int64_t data_source_doc_of(const DataSource *src, int64_t i);

/* Opens a regular file read-only into *fd (and *st). Anything else (a FIFO, a
 * device, a directory) is refused from stat(2) before it is opened, and the
 * open never blocks (O_NONBLOCK), so a FIFO named as data cannot hang a run.
 * `what` names the file's role in messages ("data file", "Megatron index"). */
int data_open_file(const char *path, const char *what, int *fd, struct stat *st, char *err, size_t n);
/* data_open_file, then maps the whole file read-only (*len = 0 and *ptr =
 * NULL for an empty file). For files read once while opening (the Megatron
 * index, the text inputs of data_bytes.c). */
int data_map_file(const char *path, const char *what, void **ptr, size_t *len, char *err, size_t n);
/* Reads `len` bytes at byte offset `off` of the token file into buf; a short
 * read (the file shrank) is an error saying the file changed. */
int data_source_read(const DataSource *src, void *buf, size_t len, int64_t off, char *err, size_t n);
/* st_mtim in nanoseconds: the data fingerprint's mtime */
int64_t data_mtime_ns(const struct stat *st);
/* 0 when the token file still has the size, mtime and ctime it had when opened; else
 * an error naming the file, both sizes and both times (data_read_span calls
 * it after every read). */
int data_source_check(const DataSource *src, char *err, size_t n);

/* ---- the packed, ordered stream (data_pack.c) ----------------------------- */

typedef struct DataSet DataSet;

/* Opens dc->path as dc->format and packs samples of dc->seq_len tokens;
 * dc->shuffle orders documents per epoch from `seed` (the run's run.seed).
 * Refuses a file with fewer than seq_len + 1 tokens. */
int  data_open(DataSet **out, const DataConfig *dc, int64_t vocab_size, uint64_t seed, char *err, size_t n);
/* The same over an opened source, which the DataSet then owns (closed by
 * data_close, also on failure). */
int  data_open_source(DataSet **out, DataSource *src, int64_t seq_len, bool shuffle, uint64_t seed, char *err,
                      size_t n);
void data_close(DataSet *ds);

int64_t           data_samples_per_epoch(const DataSet *ds); /* S */
int64_t           data_seq_len(const DataSet *ds);           /* T */
const DataSource *data_source(const DataSet *ds);

/* Sample g = (epoch g / S, i = g % S); every output holds T int32 values:
 *   tokens[t]  = stream[i*T + t]
 *   targets[t] = stream[i*T + t + 1] when that token belongs to the same
 *                document as tokens[t], else -1 (no prediction across a
 *                document end)
 *   pos[t]     = t
 *   doc_pos[t] = tokens of tokens[t]'s document before t within this sample
 *                (0 at each document start and at t = 0, also for a document
 *                continuing from the previous sample)
 * Any of targets, pos, doc_pos may be NULL. O(T + log n_docs) per call,
 * plus an O(n_docs) shuffle when g enters a new epoch. */
int data_read_sample(DataSet *ds, int64_t g, int32_t *tokens, int32_t *targets, int32_t *pos, int32_t *doc_pos,
                     char *err, size_t n);
/* Positions [t0, t0 + len) of sample g only (a context-parallel rank's
 * segment): out[k] is what data_read_sample gives at t = t0 + k. */
int data_read_span(DataSet *ds, int64_t g, int64_t t0, int64_t len, int32_t *tokens, int32_t *targets,
                   int32_t *pos, int32_t *doc_pos, char *err, size_t n);
/* data_read_span in the shape of cp.h's CpReadSpan (cp_read_sample's reader): ctx is a
 * DataSpanReader, whose err holds the message of a failed read (train.c, eval.c). */
typedef struct {
    DataSet *data;
    char     err[2048];
} DataSpanReader;
int data_span_read(void *ctx, int64_t g, int64_t t0, int64_t len, int32_t *tokens, int32_t *targets, int32_t *pos,
                   int32_t *doc_pos);

/* order[k] = the file's document index at place k of the stream of `epoch`
 * (n_docs values). Identity when not shuffled. */
int data_epoch_order(DataSet *ds, int64_t epoch, int64_t *order, char *err, size_t n);

/* Data position <-> sample index. tokens = g * T. On resume the stored
 * position must be a multiple of T (seq_len is an identity key). */
int64_t data_tokens_consumed(const DataSet *ds, int64_t g);
int     data_position_to_sample(const DataSet *ds, int64_t tokens, int64_t *g, char *err, size_t n);

/* Prints `err` as "ringscan: error ... <first line>" + "hint:" lines and exits
 * RS_EXIT_USAGE. */
noreturn void data_fail(const char *err);

/* Formats an error: first line from fmt, then `hint` (may be NULL; several
 * lines separated by '\n'). Returns `code`. For the data_*.c files. */
int data_error(char *err, size_t n, int code, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---- writing a flat file (data_flat.c) ------------------------------------ */

/* Writes PATH through PATH.tmp.PID: header and document offsets first (the
 * document lengths are known up front), then tokens in order, then fsync,
 * rename over PATH and fsync of the directory. Missing directories above PATH
 * are created first. On any failure, or on abort, the temporary file and the
 * directories this writer created are removed and PATH is untouched. */
typedef struct {
    char    *path, *tmp;
    char    *made_dir;    /* outermost directory created for PATH, or NULL */
    void    *file;        /* FILE* */
    int      token_bytes;
    int64_t  vocab_size;
    int64_t  n_tokens, n_docs;
    int64_t  written;     /* tokens so far */
} DataFlatWriter;

int  data_flat_write_begin(DataFlatWriter *w, const char *path, int64_t vocab_size, int64_t n_docs,
                           const int64_t *doc_len, char *err, size_t n);
int  data_flat_write_tokens(DataFlatWriter *w, const int32_t *tokens, int64_t n, char *err, size_t en);
int  data_flat_write_end(DataFlatWriter *w, char *err, size_t n);
void data_flat_write_abort(DataFlatWriter *w);

/* ---- the synthetic long-range recall task (data_synth.c) ------------------ */

typedef struct {
    int64_t  n_tokens;   /* --tokens */
    int64_t  vocab;      /* --vocab */
    uint64_t seed;       /* --seed */
    int64_t  min_doc, max_doc; /* --min-doc, --max-doc: document length range, tokens */
    int64_t  pairs;      /* --pairs: key-value pairs per document */
    int64_t  queries;    /* --queries: pairs asked for late in the document */
    int64_t  gap;        /* --gap: filler tokens after each answer */
    int64_t  keys;       /* --keys: size of the key (and of the value) range */
    int64_t  branch;     /* --branch: successors per filler token in the filler chain */
} DataSynthConfig;

typedef struct {
    int64_t n_tokens, n_docs;
    int64_t doc_min, doc_max, docs_over_512;
    double  doc_mean;
    int64_t pairs, queries;                     /* written in full */
    int64_t recall_min, recall_max, recall_over_512;
    double  recall_mean;                         /* tokens from a pair's value to its answer */
    double  floor_nats;    /* mean -log p of every target under the generating process */
    double  unigram_nats;  /* entropy of the targets' unigram distribution */
    int64_t n_targets;
} DataSynthStats;

void data_synth_defaults(DataSynthConfig *c);
/* Checks the options against each other (message names the options). */
int  data_synth_validate(const DataSynthConfig *c, char *err, size_t n);
int  data_synth_write(const DataSynthConfig *c, const char *path, DataSynthStats *st, char *err, size_t n);
void data_synth_print_layout(const DataSynthConfig *c, void *file /* FILE* */);

/* ---- byte-level tokens of text files (data_bytes.c) ----------------------- */

typedef enum { DATA_DOC_SPLIT_BLANK, DATA_DOC_SPLIT_FILE } DataDocSplit;

typedef struct {
    int64_t n_files, n_docs, n_tokens;
} DataBytesStats;

int data_bytes_write(const char *path, const char *const *inputs, int n_inputs, DataDocSplit split,
                     DataBytesStats *st, char *err, size_t n);

#endif
