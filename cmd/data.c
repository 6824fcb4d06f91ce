/*
 * data.c — `ringscan data synth | bytes | check | inspect`, the tools
 * that make, validate and show training data.
 *
 * Each subcommand parses its own small option table (`--opt V` or
 * `--opt=V`; integers are plain decimal), calls the library (data_synth.c,
 * data_bytes.c, data_source.c, data_pack.c) and prints a summary. Any bad
 * argument or file prints one message (plus hint lines) to stderr and
 * returns 2; outputs are written under a temporary name and renamed, so a
 * failure leaves no partial file and an existing OUT untouched. Missing
 * directories above OUT are created by the flat writer (data_flat.c).
 *
 * Callers: cmd/ringscan.c (the `data` entry of its command table: the
 * arguments after "data").
 */
#include "cmd.h"

#include "data/data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/ckpt.h"
#include "io/fsio.h"

#define DATA_ERR_MAX 4096

/* ---- option parsing ---------------------------------------------------------- */

typedef enum { CLI_OPT_INT, CLI_OPT_STR } CliOptKind;

typedef struct {
    const char *name; /* "--tokens" */
    CliOptKind  kind;
    void       *dst;  /* int64_t* or const char** */
    int64_t     min;  /* CLI_OPT_INT: inclusive range */
    int64_t     max;
    int         seen;
} CliOpt;

static int data_cli_usage(const char *sub, const char *fmt, const char *arg) {
    fflush(stdout);
    fprintf(stderr, "ringscan data %s: ", sub);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n  hint: `ringscan data %s --help` shows the usage\n", sub);
    return RS_EXIT_USAGE;
}

/* Prints a library error: the first line, then each further line as a hint. */
static int data_cli_fail(const char *sub, int rc, const char *err) {
    fflush(stdout);
    const char *nl = strchr(err, '\n');
    fprintf(stderr, "ringscan data %s: error: %.*s\n", sub, nl ? (int)(nl - err) : (int)strlen(err), err);
    while (nl) {
        const char *p = nl + 1;
        if (!strncmp(p, "  hint: ", 8)) p += 8; /* a message that names its hint already */
        nl = strchr(p, '\n');
        fprintf(stderr, "  hint: %.*s\n", nl ? (int)(nl - p) : (int)strlen(p), p);
    }
    return rc;
}

static int data_cli_parse_int(const char *s, int64_t *out) {
    if (!s || !*s) return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

/* Fills opts and up to max_pos positional arguments. Returns 0, 1 for
 * --help, or RS_EXIT_USAGE after printing the problem. */
static int data_cli_parse(const char *sub, int argc, char **argv, CliOpt *opts, const char **pos, int max_pos,
                          int *n_pos) {
    *n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (a[0] == '-' && a[1]) {
            const char *eq = strchr(a, '=');
            size_t nl = eq ? (size_t)(eq - a) : strlen(a);
            CliOpt *o = NULL;
            for (CliOpt *q = opts; q && q->name; q++)
                if (strlen(q->name) == nl && !strncmp(q->name, a, nl)) o = q;
            if (!o) return data_cli_usage(sub, "unknown option %s", a);
            const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!val) return data_cli_usage(sub, "%s needs a value", o->name);
            if (o->seen) return data_cli_usage(sub, "%s given twice", o->name);
            o->seen = 1;
            if (o->kind == CLI_OPT_STR) {
                *(const char **)o->dst = val;
            } else {
                int64_t v;
                if (data_cli_parse_int(val, &v) || v < o->min || v > o->max) {
                    fflush(stdout);
                    fprintf(stderr,
                            "ringscan data %s: %s %s: expected an integer in [%lld, %lld]\n"
                            "  hint: `ringscan data %s --help` shows the usage\n",
                            sub, o->name, val, (long long)o->min, (long long)o->max, sub);
                    return RS_EXIT_USAGE;
                }
                *(int64_t *)o->dst = v;
            }
        } else {
            if (*n_pos == max_pos) return data_cli_usage(sub, "unexpected argument %s", a);
            pos[(*n_pos)++] = a;
        }
    }
    return 0;
}

/* ---- format detection ---------------------------------------------------------- */

static int data_cli_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Picks the format and the path to open: --format as given; else a file
 * starting with "RSTOKENS" is flat, PATH.idx means a Megatron prefix, and
 * PREFIX.bin / PREFIX.idx name the Megatron prefix. *prefix is malloc'd. */
static int data_cli_resolve(const char *sub, const char *path, const char *format, DataFormat *fmt,
                            char **prefix) {
    if (format) {
        if (!strcmp(format, "flat")) *fmt = DATA_FORMAT_FLAT;
        else if (!strcmp(format, "megatron")) *fmt = DATA_FORMAT_MEGATRON;
        else return data_cli_usage(sub, "--format %s: expected flat or megatron", format);
        *prefix = RS_STRDUP(path);
        return 0;
    }
    size_t pl = strlen(path);
    char *idx = RS_MALLOC(pl + 5);
    snprintf(idx, pl + 5, "%s.idx", path);
    struct stat ist; /* PATH.idx there in any kind: a Megatron prefix, whose reader names a FIFO or directory */
    int has_idx = stat(idx, &ist) == 0;
    free(idx);
    char magic[8] = {0};
    char why[4352];
    FILE *f = fsio_fopen_regular(path, NULL, NULL, why, sizeof why); /* a FIFO is not waited on: the opener says why */
    int flat = 0;
    if (f) {
        flat = fread(magic, 1, 8, f) == 8 && !memcmp(magic, "RSTOKENS", 8);
        fclose(f);
    }
    *prefix = RS_STRDUP(path);
    if (flat || (!has_idx && data_cli_is_file(path) && !(pl > 4 && (!strcmp(path + pl - 4, ".idx") ||
                                                                     !strcmp(path + pl - 4, ".bin"))))) {
        *fmt = DATA_FORMAT_FLAT;
        return 0;
    }
    if (!has_idx && pl > 4 && (!strcmp(path + pl - 4, ".idx") || !strcmp(path + pl - 4, ".bin"))) {
        (*prefix)[pl - 4] = 0; /* PREFIX.bin or PREFIX.idx: the Megatron prefix */
        *fmt = DATA_FORMAT_MEGATRON;
        return 0;
    }
    if (has_idx) {
        *fmt = DATA_FORMAT_MEGATRON;
        return 0;
    }
    free(*prefix);
    *prefix = NULL;
    fflush(stdout);
    fprintf(stderr,
            "ringscan data %s: error: %s %s (expected a flat file, or a Megatron prefix with %s.idx)\n"
            "  hint: check the path; --format flat|megatron skips the guessing\n",
            sub, path, access(path, F_OK) == 0 ? "is not a regular file" : "does not exist", path);
    return RS_EXIT_USAGE;
}

/* ---- synth ------------------------------------------------------------------------ */

static void data_cli_synth_help(FILE *f) {
    DataSynthConfig c;
    data_synth_defaults(&c);
    fprintf(f,
            "usage: ringscan data synth OUT [--tokens N] [--vocab V] [--seed S] [--min-doc L] [--max-doc L]\n"
            "                           [--pairs P] [--queries Q] [--gap G] [--keys K] [--branch B]\n\n"
            "Writes a flat token file of a long-range recall task: each document starts with key-value\n"
            "pairs and ends with queries for some of the keys, whose answers need the pairs hundreds of\n"
            "tokens back; filler with local structure (a Markov chain) fills the space between, so a small\n"
            "model's loss falls early, before it learns recall. Prints the loss floor (a perfect model),\n"
            "the unigram loss (a model that ignores context) and ln(vocab) (an untrained model).\n\n"
            "Options (default):\n"
            "  --tokens N    tokens in the file (%lld)\n"
            "  --vocab V     vocabulary size (%lld); uint16 tokens up to 65536, uint32 above\n"
            "  --seed S      random seed (%llu); the same options and seed give the same file\n"
            "  --min-doc L   shortest document, tokens (%lld)\n"
            "  --max-doc L   longest document, tokens (%lld); lengths are uniform in between\n"
            "  --pairs P     key-value pairs per document (%lld)\n"
            "  --queries Q   queries per document, distinct keys of its pairs (%lld)\n"
            "  --gap G       filler tokens after each answer (%lld)\n"
            "  --keys K      distinct keys, and distinct values (vocab/4)\n"
            "  --branch B    successors per filler token (%lld): filler costs ln B nats a token\n\n",
            (long long)c.n_tokens, (long long)c.vocab, (unsigned long long)c.seed, (long long)c.min_doc,
            (long long)c.max_doc, (long long)c.pairs, (long long)c.queries, (long long)c.gap, (long long)c.branch);
    data_synth_print_layout(&c, f);
}

static int data_cli_synth(int argc, char **argv) {
    DataSynthConfig c;
    data_synth_defaults(&c);
    int64_t seed = (int64_t)c.seed;
    CliOpt opts[] = {
        {"--tokens", CLI_OPT_INT, &c.n_tokens, 2, INT64_C(1) << 40, 0},
        {"--vocab", CLI_OPT_INT, &c.vocab, 16, 1 << 20, 0},
        {"--seed", CLI_OPT_INT, &seed, 0, INT64_MAX, 0},
        {"--min-doc", CLI_OPT_INT, &c.min_doc, 1, 1 << 30, 0},
        {"--max-doc", CLI_OPT_INT, &c.max_doc, 1, 1 << 30, 0},
        {"--pairs", CLI_OPT_INT, &c.pairs, 1, 1 << 20, 0},
        {"--queries", CLI_OPT_INT, &c.queries, 1, 1 << 20, 0},
        {"--gap", CLI_OPT_INT, &c.gap, 0, 1 << 20, 0},
        {"--keys", CLI_OPT_INT, &c.keys, 1, 1 << 20, 0},
        {"--branch", CLI_OPT_INT, &c.branch, 1, 1 << 20, 0},
        {NULL, 0, NULL, 0, 0, 0},
    };
    const char *pos[1];
    int n_pos, rc = data_cli_parse("synth", argc, argv, opts, pos, 1, &n_pos);
    if (rc == 1) {
        data_cli_synth_help(stdout);
        return RS_EXIT_OK;
    }
    if (rc) return rc;
    if (n_pos != 1) return data_cli_usage("synth", "%s", "missing OUT, the file to write");
    c.seed = (uint64_t)seed;
    char err[DATA_ERR_MAX];
    DataSynthStats st;
    rc = ckpt_check_output(pos[0], FSIO_OUT_FILE, "data synth OUT", err, sizeof err); /* before any work */
    if (!rc) rc = data_synth_write(&c, pos[0], &st, err, sizeof err);
    if (rc) return data_cli_fail("synth", rc, err);
    printf("wrote %s: %lld tokens (%s), %lld documents, vocab %lld, seed %llu\n", pos[0], (long long)st.n_tokens,
           c.vocab <= 65536 ? "uint16" : "uint32", (long long)st.n_docs, (long long)c.vocab,
           (unsigned long long)c.seed);
    printf("  documents   length min %lld, mean %.1f, max %lld; %lld longer than 512 tokens\n",
           (long long)st.doc_min, st.doc_mean, (long long)st.doc_max, (long long)st.docs_over_512);
    printf("  recall      %lld pairs, %lld queries; distance pair->answer min %lld, mean %.1f, max %lld; "
           "%lld over 512 tokens\n",
           (long long)st.pairs, (long long)st.queries, (long long)st.recall_min, st.recall_mean,
           (long long)st.recall_max, (long long)st.recall_over_512);
    printf("  loss floor  %.4f nats/token  a perfect model that sees each whole document (%lld targets)\n",
           st.floor_nats, (long long)st.n_targets);
    printf("  unigram     %.4f nats/token  the best model that ignores context\n", st.unigram_nats);
    printf("  uniform     %.4f nats/token  ln(vocab), an untrained model\n", log((double)c.vocab));
    printf("  (a document cut by a sample boundary loses its pairs in the next sample, so training\n"
           "   at a short seq_len stays somewhat above the floor)\n");
    return RS_EXIT_OK;
}

/* ---- bytes ------------------------------------------------------------------------ */

static int data_cli_bytes(int argc, char **argv) {
    const char *split_name = "blank";
    CliOpt opts[] = {
        {"--doc-split", CLI_OPT_STR, &split_name, 0, 0, 0},
        {NULL, 0, NULL, 0, 0, 0},
    };
    const char **pos = RS_MALLOC((size_t)(argc + 1) * sizeof *pos);
    int n_pos, rc = data_cli_parse("bytes", argc, argv, opts, pos, argc, &n_pos);
    if (rc == 1) {
        printf("usage: ringscan data bytes OUT IN... [--doc-split blank|file]\n\n"
               "Writes a flat token file of byte-level tokens (vocab 256, uint16): every byte of the\n"
               "input text files is one token.\n\n"
               "  --doc-split blank  (default) a document is a run of non-blank lines, bytes as in the file,\n"
               "                     newlines included; blank lines (only spaces, tabs, \\r) separate them\n"
               "  --doc-split file   each input file is one document\n");
        free(pos);
        return RS_EXIT_OK;
    }
    if (!rc && n_pos < 2) rc = data_cli_usage("bytes", "%s", "expected OUT and at least one input file");
    DataDocSplit split = DATA_DOC_SPLIT_BLANK;
    if (!rc) {
        if (!strcmp(split_name, "file")) split = DATA_DOC_SPLIT_FILE;
        else if (strcmp(split_name, "blank") != 0)
            rc = data_cli_usage("bytes", "--doc-split %s: expected blank or file", split_name);
    }
    if (rc) {
        free(pos);
        return rc;
    }
    char err[DATA_ERR_MAX];
    DataBytesStats st;
    rc = ckpt_check_output(pos[0], FSIO_OUT_FILE, "data bytes OUT", err, sizeof err); /* before any work */
    if (!rc) rc = data_bytes_write(pos[0], pos + 1, n_pos - 1, split, &st, err, sizeof err);
    if (rc) {
        free(pos);
        return data_cli_fail("bytes", rc, err);
    }
    printf("wrote %s: %lld tokens (bytes, vocab 256, uint16), %lld documents from %lld file%s (--doc-split %s)\n",
           pos[0], (long long)st.n_tokens, (long long)st.n_docs, (long long)st.n_files, st.n_files == 1 ? "" : "s",
           split_name);
    free(pos);
    return RS_EXIT_OK;
}

/* ---- check ------------------------------------------------------------------------ */

static int data_cli_cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int data_cli_check(int argc, char **argv) {
    const char *format = NULL;
    int64_t vocab = 0;
    CliOpt opts[] = {
        {"--format", CLI_OPT_STR, &format, 0, 0, 0},
        {"--vocab", CLI_OPT_INT, &vocab, 1, DATA_VOCAB_MAX, 0},
        {NULL, 0, NULL, 0, 0, 0},
    };
    const char *pos[1];
    int n_pos, rc = data_cli_parse("check", argc, argv, opts, pos, 1, &n_pos);
    if (rc == 1) {
        printf("usage: ringscan data check PATH [--format flat|megatron] [--vocab V]\n\n"
               "Validates a token file and prints its summary: tokens, documents, document lengths, token\n"
               "ids. Reads every token: with --vocab V (the model's vocab_size) every id must be < V;\n"
               "without it, < the flat header's vocab_size. Exit 0 when valid, 2 otherwise.\n\n"
               "PATH is a flat file, or a Megatron dataset given by its prefix (PREFIX.bin + PREFIX.idx)\n"
               "or by either of its two files. --format skips the guessing.\n");
        return RS_EXIT_OK;
    }
    if (rc) return rc;
    if (n_pos != 1) return data_cli_usage("check", "%s", "missing PATH");
    DataFormat fmt;
    char *prefix;
    rc = data_cli_resolve("check", pos[0], format, &fmt, &prefix);
    if (rc) return rc;
    char err[DATA_ERR_MAX];
    DataSource *src;
    rc = data_source_open(&src, fmt, prefix, vocab, err, sizeof err);
    free(prefix);
    if (rc) return data_cli_fail("check", rc, err);
    int64_t lo, hi;
    rc = data_source_scan(src, &lo, &hi, err, sizeof err);
    if (rc) {
        data_source_close(src);
        return data_cli_fail("check", rc, err);
    }
    int64_t *len = RS_MALLOC((size_t)src->n_docs * sizeof *len + 1), empty = 0;
    for (int64_t d = 0; d < src->n_docs; d++) {
        len[d] = (int64_t)(src->doc_start[d + 1] - src->doc_start[d]);
        empty += len[d] == 0;
    }
    qsort(len, (size_t)src->n_docs, sizeof *len, data_cli_cmp_i64);
    if (fmt == DATA_FORMAT_FLAT) printf("%s: valid flat token file (version 1)\n", src->path);
    else printf("%s + %s: valid Megatron indexed dataset\n", src->path, src->idx_path);
    printf("  tokens      %lld (%s, %d byte%s each)\n", (long long)src->n_tokens, data_dtype_names[src->dtype],
           src->token_bytes, src->token_bytes == 1 ? "" : "s");
    if (src->n_docs)
        printf("  documents   %lld (%lld empty); length min %lld, median %lld, mean %.1f, max %lld\n",
               (long long)src->n_docs, (long long)empty, (long long)len[0], (long long)len[src->n_docs / 2],
               (double)src->n_tokens / (double)src->n_docs, (long long)len[src->n_docs - 1]);
    else printf("  documents   0\n");
    printf("  token ids   min %lld, max %lld; all < %lld (%s)\n", (long long)lo, (long long)hi,
           (long long)src->vocab_limit,
           src->vocab_is_model ? "--vocab" : src->file_vocab ? "vocab_size in the header" : "int32");
    free(len);
    data_source_close(src);
    return RS_EXIT_OK;
}

/* ---- inspect ---------------------------------------------------------------------- */

static int data_cli_inspect(int argc, char **argv) {
    const char *format = NULL;
    int64_t vocab = 0, sample = -1, seq_len = -1, seed = -1, count = 1;
    CliOpt opts[] = {
        {"--sample", CLI_OPT_INT, &sample, 0, INT64_MAX, 0},
        {"--seq-len", CLI_OPT_INT, &seq_len, 1, INT32_MAX, 0},
        {"--count", CLI_OPT_INT, &count, 1, INT64_C(1) << 30, 0},
        {"--seed", CLI_OPT_INT, &seed, 0, INT64_MAX, 0},
        {"--format", CLI_OPT_STR, &format, 0, 0, 0},
        {"--vocab", CLI_OPT_INT, &vocab, 1, DATA_VOCAB_MAX, 0},
        {NULL, 0, NULL, 0, 0, 0},
    };
    const char *pos[1];
    int n_pos, rc = data_cli_parse("inspect", argc, argv, opts, pos, 1, &n_pos);
    if (rc == 1) {
        printf("usage: ringscan data inspect PATH --sample I --seq-len T [--count N] [--seed S]\n"
               "                             [--format flat|megatron] [--vocab V]\n\n"
               "Prints packed samples I .. I+N-1 as the trainer reads them with data.seq_len T: per position\n"
               "t the token, its target (-1 at a document's last token: no prediction across documents)\n"
               "and doc_pos (tokens of the same document before t within the sample).\n"
               "  --seed S   shuffle documents per epoch as the trainer does with data.shuffle: true and\n"
               "             run.seed: S; without it, file order (data.shuffle: false)\n"
               "  --count N  samples to print (1)\n"
               "PATH and --format as in `ringscan data check`.\n");
        return RS_EXIT_OK;
    }
    if (rc) return rc;
    if (n_pos != 1) return data_cli_usage("inspect", "%s", "missing PATH");
    if (sample < 0) return data_cli_usage("inspect", "%s", "missing --sample I");
    if (seq_len < 0) return data_cli_usage("inspect", "%s", "missing --seq-len T");
    DataFormat fmt;
    char *prefix;
    rc = data_cli_resolve("inspect", pos[0], format, &fmt, &prefix);
    if (rc) return rc;
    char err[DATA_ERR_MAX];
    DataSource *src;
    rc = data_source_open(&src, fmt, prefix, vocab, err, sizeof err);
    free(prefix);
    if (rc) return data_cli_fail("inspect", rc, err);
    DataSet *ds;
    rc = data_open_source(&ds, src, seq_len, seed >= 0, (uint64_t)(seed >= 0 ? seed : 0), err, sizeof err);
    if (rc) return data_cli_fail("inspect", rc, err);
    int32_t *tok = RS_MALLOC((size_t)seq_len * sizeof *tok), *tgt = RS_MALLOC((size_t)seq_len * sizeof *tgt),
            *dpos = RS_MALLOC((size_t)seq_len * sizeof *dpos);
    int64_t S = data_samples_per_epoch(ds);
    for (int64_t g = sample; g < sample + count && !rc; g++) {
        rc = data_read_sample(ds, g, tok, tgt, NULL, dpos, err, sizeof err);
        if (rc) break;
        int64_t i = g % S, docs = 0;
        for (int64_t t = 0; t < seq_len; t++) docs += dpos[t] == 0;
        printf("sample %lld: epoch %lld, sample %lld of %lld in the epoch, stream tokens [%lld, %lld], %lld "
               "document%s, %s\n",
               (long long)g, (long long)(g / S), (long long)i, (long long)S, (long long)(i * seq_len),
               (long long)(i * seq_len + seq_len), (long long)docs, docs == 1 ? "" : "s",
               seed >= 0 ? "shuffled" : "file order");
        printf("%9s %9s %9s %9s\n", "t", "token", "target", "doc_pos");
        for (int64_t t = 0; t < seq_len; t++)
            printf("%9lld %9d %9d %9d\n", (long long)t, tok[t], tgt[t], dpos[t]);
    }
    free(tok);
    free(tgt);
    free(dpos);
    data_close(ds);
    if (rc) return data_cli_fail("inspect", rc, err);
    return RS_EXIT_OK;
}

/* ---- dispatch ---------------------------------------------------------------------- */

static void data_cli_help(FILE *f) {
    fprintf(f, "usage: ringscan data SUBCOMMAND ...   (ringscan data SUBCOMMAND --help for details)\n\n"
               "  synth OUT [options]        write a synthetic long-range recall task (flat file)\n"
               "  bytes OUT IN... [options]  write byte-level tokens of text files (flat file)\n"
               "  check PATH [options]       validate a flat file or Megatron dataset and summarise it\n"
               "  inspect PATH --sample I --seq-len T [options]\n"
               "                             print packed samples: tokens, targets, doc_pos\n\n"
               "OUT's missing directories are created. Formats: docs/data-format.md.\n"
               "Exit codes: 0 ok, 1 system failure, 2 bad argument or file.\n");
}

int cmd_data(int argc, char **argv) {
    if (argc < 1) {
        data_cli_help(stderr);
        return RS_EXIT_USAGE;
    }
    const char *sub = argv[0];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        data_cli_help(stdout);
        return RS_EXIT_OK;
    }
    if (!strcmp(sub, "synth")) return data_cli_synth(argc - 1, argv + 1);
    if (!strcmp(sub, "bytes")) return data_cli_bytes(argc - 1, argv + 1);
    if (!strcmp(sub, "check")) return data_cli_check(argc - 1, argv + 1);
    if (!strcmp(sub, "inspect")) return data_cli_inspect(argc - 1, argv + 1);
    fprintf(stderr, "ringscan data: unknown subcommand '%s' (synth, bytes, check, inspect)\n"
                    "  hint: `ringscan data --help` lists them\n",
            sub);
    return RS_EXIT_USAGE;
}
