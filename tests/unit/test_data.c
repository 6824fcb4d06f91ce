/*
 * test_data.c — the data module against naive references (lib/data_*.c).
 *
 * Files are real, under a fresh directory in $TMPDIR (or /tmp), removed at
 * the end of each case. Token ids are the tokens' own file indices wherever
 * the vocabulary allows, so "every token of the epoch appears exactly once"
 * and "this target is that token" are plain integer checks. The packer is
 * compared with a stream built the slow, obvious way from data_epoch_order;
 * the order itself is checked for being a permutation, reproducible,
 * different across epochs and seeds, and uniform (chi-square over the 24
 * orders of 4 documents). The generator is pinned to SplitMix64's published
 * outputs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/data.h"
#include "core/rng.h"
#include "core/error.h"
#include "test_util.h"

static char data_test_dir[256];

static const char *data_test_mkdir(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(data_test_dir, sizeof data_test_dir, "%s/rs_test_data_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(data_test_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    return data_test_dir;
}

static void data_test_rmdir(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_test_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", data_test_dir);
}

/* Writes a flat file whose token k (file index) is k % vocab; returns 0. */
static int data_test_write(const char *path, int64_t vocab, int64_t n_docs, const int64_t *len) {
    char err[1024];
    DataFlatWriter w;
    if (data_flat_write_begin(&w, path, vocab, n_docs, len, err, sizeof err)) {
        printf("writer: %s\n", err);
        return 1;
    }
    int64_t total = 0;
    for (int64_t d = 0; d < n_docs; d++) total += len[d];
    int32_t buf[4096];
    for (int64_t k0 = 0; k0 < total; k0 += 4096) {
        int64_t m = total - k0 < 4096 ? total - k0 : 4096;
        for (int64_t k = 0; k < m; k++) buf[k] = (int32_t)((k0 + k) % vocab);
        if (data_flat_write_tokens(&w, buf, m, err, sizeof err)) {
            printf("writer: %s\n", err);
            return 1;
        }
    }
    if (data_flat_write_end(&w, err, sizeof err)) {
        printf("writer: %s\n", err);
        return 1;
    }
    return 0;
}

TEST(rng_is_splitmix64) {
    /* SplitMix64 from state 0: the reference outputs of Vigna's splitmix64.c */
    Rng r = {0};
    uint64_t want[3] = {UINT64_C(0xE220A8397B1DCDAF), UINT64_C(0x6E789E6AA1B965F4), UINT64_C(0x06C45D188009454F)};
    for (int i = 0; i < 3; i++) {
        uint64_t x = rng_next(&r);
        EXPECT(x == want[i], "splitmix64 output %d = %016llx, expected %016llx", i, (unsigned long long)x,
               (unsigned long long)want[i]);
    }
    rng_init(&r, 7, 0);
    for (int i = 0; i < 10000; i++) {
        uint64_t b = 1 + (uint64_t)i % 13;
        EXPECT(rng_below(&r, b) < b, "below(%llu) out of range", (unsigned long long)b);
    }
    printf("rng: splitmix64 reference outputs ok\n");
}

TEST(data_flat_round_trip) {
    const char *dir = data_test_mkdir();
    char path[512];
    snprintf(path, sizeof path, "%s/a.tok", dir);
    int64_t len[6] = {5, 0, 1, 17, 0, 9};
    for (int pass = 0; pass < 2; pass++) {
        int64_t vocab = pass ? 100000 : 7; /* uint32 and uint16 */
        EXPECT(data_test_write(path, vocab, 6, len) == 0, "write");
        char err[1024];
        DataSource *src;
        int rc = data_source_open(&src, DATA_FORMAT_FLAT, path, 0, err, sizeof err);
        EXPECT(rc == 0, "open: %s", err);
        if (rc) break;
        EXPECT(src->n_tokens == 32 && src->n_docs == 6, "n_tokens %lld n_docs %lld", (long long)src->n_tokens,
               (long long)src->n_docs);
        EXPECT(src->token_bytes == (pass ? 4 : 2), "token_bytes %d", src->token_bytes);
        EXPECT(src->file_vocab == vocab && src->vocab_limit == vocab, "vocab %lld", (long long)src->file_vocab);
        int64_t off = 0;
        for (int d = 0; d <= 6; d++) {
            EXPECT(src->doc_start[d] == (uint64_t)off, "doc_start[%d] = %llu, want %lld", d,
                   (unsigned long long)src->doc_start[d], (long long)off);
            if (d < 6) off += len[d];
        }
        int32_t got[32];
        EXPECT(data_source_copy(src, 0, 32, got, err, sizeof err) == 0, "copy: %s", err);
        for (int k = 0; k < 32; k++) EXPECT(got[k] == k % vocab, "token %d = %d", k, got[k]);
        /* the document of each token, empty documents skipped */
        EXPECT(data_source_doc_of(src, 5) == 2 && data_source_doc_of(src, 6) == 3 &&
                   data_source_doc_of(src, 23) == 5 && data_source_doc_of(src, 0) == 0,
               "doc_of: %lld %lld %lld", (long long)data_source_doc_of(src, 5), (long long)data_source_doc_of(src, 6),
               (long long)data_source_doc_of(src, 23));
        data_source_close(src);
        char tmp_name[600];
        snprintf(tmp_name, sizeof tmp_name, "%s.tmp.%ld", path, (long)getpid());
        EXPECT(access(tmp_name, F_OK) != 0, "temporary file left behind");
    }
    data_test_rmdir();
    printf("flat: round trip of 6 documents (2 empty), uint16 and uint32 ok\n");
}

/* The naive reference: epoch stream as (file index) array, document per stream token. */
static void data_test_check_epoch(DataSet *ds, int64_t epoch, int64_t *fails) {
    const DataSource *src = data_source(ds);
    int64_t T = data_seq_len(ds), S = data_samples_per_epoch(ds), N = src->n_tokens;
    char err[1024];
    int64_t *order = malloc((size_t)src->n_docs * sizeof *order);
    int64_t *stream = malloc((size_t)N * sizeof *stream), *sdoc = malloc((size_t)N * sizeof *sdoc);
    EXPECT(data_epoch_order(ds, epoch, order, err, sizeof err) == 0, "order: %s", err);
    int64_t p = 0;
    for (int64_t k = 0; k < src->n_docs; k++)
        for (uint64_t f = src->doc_start[order[k]]; f < src->doc_start[order[k] + 1]; f++) {
            stream[p] = (int64_t)f;
            sdoc[p++] = k;
        }
    EXPECT(p == N, "stream has %lld tokens, file %lld", (long long)p, (long long)N);
    char *seen = calloc((size_t)N, 1);
    int32_t *tok = malloc((size_t)T * 4), *tgt = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4),
            *dp = malloc((size_t)T * 4);
    for (int64_t i = 0; i < S; i++) {
        int64_t g = epoch * S + i;
        if (data_read_sample(ds, g, tok, tgt, pos, dp, err, sizeof err)) {
            EXPECT(0, "read %lld: %s", (long long)g, err);
            break;
        }
        for (int64_t t = 0; t < T; t++) {
            int64_t q = i * T + t, want_tgt = sdoc[q + 1] == sdoc[q] ? stream[q + 1] : -1;
            int64_t want_dp = (t == 0 || sdoc[q - 1] != sdoc[q]) ? 0 : dp[t - 1] + 1;
            if (tok[t] != stream[q] || tgt[t] != want_tgt || pos[t] != t || dp[t] != want_dp) {
                if ((*fails)++ < 5)
                    EXPECT(0, "epoch %lld sample %lld t %lld: token %d/%lld target %d/%lld pos %d doc_pos %d/%lld",
                           (long long)epoch, (long long)i, (long long)t, tok[t], (long long)stream[q], tgt[t],
                           (long long)want_tgt, pos[t], dp[t], (long long)want_dp);
            }
            if (seen[tok[t]]++) {
                if ((*fails)++ < 5) EXPECT(0, "token %d seen twice in epoch %lld", tok[t], (long long)epoch);
            }
        }
    }
    int64_t n_seen = 0;
    for (int64_t f = 0; f < N; f++) n_seen += seen[f];
    EXPECT(n_seen == S * T, "epoch %lld covers %lld tokens, expected S*T = %lld", (long long)epoch,
           (long long)n_seen, (long long)(S * T));
    /* the unseen tokens are exactly the stream's tail */
    for (int64_t q = S * T; q < N; q++) EXPECT(!seen[stream[q]], "tail token %lld was read", (long long)q);
    free(order);
    free(stream);
    free(sdoc);
    free(seen);
    free(tok);
    free(tgt);
    free(pos);
    free(dp);
}

TEST(data_pack_matches_naive_stream) {
    const char *dir = data_test_mkdir();
    char path[512];
    snprintf(path, sizeof path, "%s/p.tok", dir);
    /* lengths from 0 to 300: empty, one-token, shorter and longer than T */
    test_rng_seed(11);
    int64_t n_docs = 150, len[150];
    for (int64_t d = 0; d < n_docs; d++) {
        double u = test_uniform();
        len[d] = d % 17 == 3 ? 0 : d % 13 == 5 ? 1 : (int64_t)(u * u * 300);
    }
    EXPECT(data_test_write(path, 1 << 20, n_docs, len) == 0, "write");
    int64_t Ts[3] = {1, 7, 64}, fails = 0, samples = 0;
    for (int shuffle = 0; shuffle < 2; shuffle++)
        for (int ti = 0; ti < 3; ti++) {
            char err[1024];
            DataSource *src;
            EXPECT(data_source_open(&src, DATA_FORMAT_FLAT, path, 1 << 20, err, sizeof err) == 0, "%s", err);
            DataSet *ds;
            EXPECT(data_open_source(&ds, src, Ts[ti], shuffle, 1234, err, sizeof err) == 0, "%s", err);
            EXPECT(data_samples_per_epoch(ds) == (src->n_tokens - 1) / Ts[ti], "S");
            for (int64_t e = 0; e < 3; e++) data_test_check_epoch(ds, e, &fails);
            /* going back to an earlier epoch gives the same samples */
            data_test_check_epoch(ds, 1, &fails);
            samples += 4 * data_samples_per_epoch(ds);
            data_close(ds);
        }
    EXPECT(fails == 0, "%lld mismatching positions", (long long)fails);
    data_test_rmdir();
    printf("pack: %lld samples of T in {1, 7, 64}, shuffled and not, 3 epochs: tokens, targets, pos, doc_pos "
           "equal the naive stream; every token once per epoch\n",
           (long long)samples);
}

TEST(data_span_equals_sample_slice) {
    const char *dir = data_test_mkdir();
    char path[512];
    snprintf(path, sizeof path, "%s/s.tok", dir);
    int64_t len[40];
    for (int d = 0; d < 40; d++) len[d] = 1 + (d * 37) % 90;
    EXPECT(data_test_write(path, 1 << 20, 40, len) == 0, "write");
    char err[1024];
    DataSource *src;
    DataSet *ds;
    EXPECT(data_source_open(&src, DATA_FORMAT_FLAT, path, 0, err, sizeof err) == 0, "%s", err);
    EXPECT(data_open_source(&ds, src, 128, true, 5, err, sizeof err) == 0, "%s", err);
    int32_t a[4][128], b[4][128];
    test_rng_seed(3);
    int checked = 0;
    for (int64_t g = 0; g < 3 * data_samples_per_epoch(ds); g++) {
        EXPECT(data_read_sample(ds, g, a[0], a[1], a[2], a[3], err, sizeof err) == 0, "%s", err);
        for (int rep = 0; rep < 8; rep++) {
            int64_t t0 = (int64_t)(test_uniform() * 128), l = (int64_t)(test_uniform() * (128 - t0 + 1));
            if (t0 + l > 128) l = 128 - t0;
            EXPECT(data_read_span(ds, g, t0, l, b[0], b[1], b[2], b[3], err, sizeof err) == 0, "%s", err);
            for (int k = 0; k < 4; k++)
                EXPECT(memcmp(a[k] + t0, b[k], (size_t)l * 4) == 0, "sample %lld span [%lld,+%lld) array %d differs",
                       (long long)g, (long long)t0, (long long)l, k);
            checked++;
        }
    }
    EXPECT(data_read_span(ds, 0, 100, 29, b[0], b[1], b[2], b[3], err, sizeof err) == RS_EXIT_USAGE,
           "a span past T must fail");
    data_close(ds);
    data_test_rmdir();
    printf("span: %d random spans equal the slices of their samples\n", checked);
}

TEST(data_shuffle_order) {
    const char *dir = data_test_mkdir();
    char path[512];
    snprintf(path, sizeof path, "%s/o.tok", dir);
    int64_t len[200];
    for (int d = 0; d < 200; d++) len[d] = 1 + d % 5;
    EXPECT(data_test_write(path, 1000, 200, len) == 0, "write");
    char err[1024];
    DataSet *ds[3];
    for (int k = 0; k < 3; k++) {
        DataSource *src;
        EXPECT(data_source_open(&src, DATA_FORMAT_FLAT, path, 0, err, sizeof err) == 0, "%s", err);
        EXPECT(data_open_source(&ds[k], src, 16, true, k < 2 ? 42 : 43, err, sizeof err) == 0, "%s", err);
    }
    int64_t o[4][200];
    data_epoch_order(ds[0], 5, o[0], err, sizeof err);
    data_epoch_order(ds[1], 5, o[1], err, sizeof err); /* same seed, another DataSet */
    data_epoch_order(ds[0], 6, o[2], err, sizeof err); /* next epoch */
    data_epoch_order(ds[2], 5, o[3], err, sizeof err); /* another seed */
    char seen[200] = {0};
    for (int k = 0; k < 200; k++) seen[o[0][k]]++;
    for (int k = 0; k < 200; k++) EXPECT(seen[k] == 1, "document %d appears %d times", k, seen[k]);
    EXPECT(memcmp(o[0], o[1], sizeof o[0]) == 0, "same seed and epoch, different orders");
    EXPECT(memcmp(o[0], o[2], sizeof o[0]) != 0, "epochs 5 and 6 have the same order");
    EXPECT(memcmp(o[0], o[3], sizeof o[0]) != 0, "seeds 42 and 43 give the same order");
    int fixed = 0;
    for (int k = 0; k < 200; k++) fixed += o[0][k] == k;
    EXPECT(fixed < 10, "%d of 200 documents stay in place: not shuffled", fixed);
    for (int k = 0; k < 3; k++) data_close(ds[k]);
    /* no shuffle: file order in every epoch */
    DataSource *src;
    DataSet *plain;
    EXPECT(data_source_open(&src, DATA_FORMAT_FLAT, path, 0, err, sizeof err) == 0, "%s", err);
    EXPECT(data_open_source(&plain, src, 16, false, 42, err, sizeof err) == 0, "%s", err);
    data_epoch_order(plain, 3, o[0], err, sizeof err);
    for (int k = 0; k < 200; k++) EXPECT(o[0][k] == k, "unshuffled order[%d] = %lld", k, (long long)o[0][k]);
    data_close(plain);

    /* uniform over the 24 orders of 4 documents: chi-square, 23 degrees of freedom */
    int64_t len4[4] = {1, 1, 1, 1};
    EXPECT(data_test_write(path, 1000, 4, len4) == 0, "write");
    EXPECT(data_source_open(&src, DATA_FORMAT_FLAT, path, 0, err, sizeof err) == 0, "%s", err);
    EXPECT(data_open_source(&plain, src, 1, true, 9, err, sizeof err) == 0, "%s", err);
    int64_t hist[256] = {0}, E = 24000;
    for (int64_t e = 0; e < E; e++) {
        int64_t p[4];
        data_epoch_order(plain, e, p, err, sizeof err);
        hist[p[0] * 64 + p[1] * 16 + p[2] * 4 + p[3]]++;
    }
    double chi2 = 0;
    int cells = 0;
    for (int c = 0; c < 256; c++) {
        int a = c / 64, b = c / 16 % 4, d = c / 4 % 4, f = c % 4;
        if (a == b || a == d || a == f || b == d || b == f || d == f) {
            EXPECT(hist[c] == 0, "impossible order %d seen", c);
            continue;
        }
        double want = (double)E / 24;
        chi2 += (hist[c] - want) * (hist[c] - want) / want;
        cells++;
    }
    /* P(chi2_23 > 55) < 2e-4 */
    EXPECT(cells == 24 && chi2 < 55, "chi-square %.1f over %d orders (bound 55)", chi2, cells);
    data_close(plain);
    data_test_rmdir();
    printf("shuffle: permutation, reproducible, differs by epoch and seed; chi-square %.1f <= 55 over 24 orders\n",
           chi2);
}

TEST(data_bad_token_at_read) {
    const char *dir = data_test_mkdir();
    char path[512];
    snprintf(path, sizeof path, "%s/v.tok", dir);
    int64_t len[3] = {300, 300, 400};
    EXPECT(data_test_write(path, 1000, 3, len) == 0, "write"); /* token k = k: ids up to 999 */
    char err[1024];
    DataSource *src;
    DataSet *ds;
    /* a model vocab smaller than the header's: refused at open */
    int rc = data_source_open(&src, DATA_FORMAT_FLAT, path, 500, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, path) && strstr(err, "vocab_size 1000"), "open with vocab 500: %d %s",
           rc, err);
    /* lower the header's vocab to 700 in place: tokens 700.. are now bad */
    FILE *f = fopen(path, "r+b");
    uint64_t v = 700;
    fseek(f, 16, SEEK_SET);
    fwrite(&v, 8, 1, f);
    fclose(f);
    EXPECT(data_source_open(&src, DATA_FORMAT_FLAT, path, 0, err, sizeof err) == 0, "%s", err);
    EXPECT(data_open_source(&ds, src, 100, false, 0, err, sizeof err) == 0, "%s", err);
    int32_t tok[100], tgt[100];
    EXPECT(data_read_sample(ds, 5, tok, tgt, NULL, NULL, err, sizeof err) == 0, "sample 5 (ids 500..600): %s", err);
    rc = data_read_sample(ds, 6, tok, tgt, NULL, NULL, err, sizeof err); /* ids 600..700: the target 700 is bad */
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, path) && strstr(err, "token index 700") &&
               strstr(err, "document 2") && strstr(err, "[0, 700)"),
           "sample 6: %d %s", rc, err);
    printf("bad id: %s\n", err);
    data_close(ds);
    data_test_rmdir();
}

TEST(data_megatron_reads_back) {
    const char *dir = data_test_mkdir();
    char prefix[512], p[600];
    snprintf(prefix, sizeof prefix, "%s/meg", dir);
    /* 3 documents over 5 sequences: [0,2) [2,3) [3,5); int32 tokens = index */
    int32_t lens[5] = {3, 4, 0, 6, 2};
    int64_t docs[4] = {0, 2, 3, 5};
    snprintf(p, sizeof p, "%s.idx", prefix);
    FILE *f = fopen(p, "wb");
    fwrite("MMIDIDX\x00\x00", 1, 9, f);
    uint64_t u = 1, S = 5, D = 4;
    uint8_t code = 4;
    fwrite(&u, 8, 1, f);
    fwrite(&code, 1, 1, f);
    fwrite(&S, 8, 1, f);
    fwrite(&D, 8, 1, f);
    fwrite(lens, 4, 5, f);
    int64_t ptr = 0;
    for (int s = 0; s < 5; s++) {
        fwrite(&ptr, 8, 1, f);
        ptr += 4 * lens[s];
    }
    fwrite(docs, 8, 4, f);
    fclose(f);
    snprintf(p, sizeof p, "%s.bin", prefix);
    f = fopen(p, "wb");
    for (int32_t k = 0; k < 15; k++) fwrite(&k, 4, 1, f);
    fclose(f);
    char err[1024];
    DataSource *src;
    int rc = data_source_open(&src, DATA_FORMAT_MEGATRON, prefix, 0, err, sizeof err);
    EXPECT(rc == 0, "open: %s", err);
    if (!rc) {
        uint64_t want[4] = {0, 7, 7, 15};
        EXPECT(src->n_tokens == 15 && src->n_docs == 3 && src->dtype == DATA_DTYPE_I32, "n_tokens %lld n_docs %lld",
               (long long)src->n_tokens, (long long)src->n_docs);
        for (int d = 0; d < 4; d++)
            EXPECT(src->doc_start[d] == want[d], "doc_start[%d] = %llu, want %llu", d,
                   (unsigned long long)src->doc_start[d], (unsigned long long)want[d]);
        for (int k = 0; k < 15; k++) EXPECT(data_source_token(src, k) == k, "token %d", k);
        data_source_close(src);
    }
    data_test_rmdir();
    printf("megatron: 5 sequences in 3 documents (one empty) read back\n");
}

TEST(data_read_1m_token_samples) {
    /* 8M tokens in ~2.7M documents of 1..5 tokens; samples of 2^20 tokens */
    const char *dir = data_test_mkdir();
    char path[512];
    snprintf(path, sizeof path, "%s/big.tok", dir);
    int64_t n_docs = 0, total = 0, cap = 3000000;
    int64_t *len = malloc((size_t)cap * sizeof *len);
    while (total < (INT64_C(8) << 20)) {
        len[n_docs] = 1 + n_docs % 5;
        total += len[n_docs++];
    }
    EXPECT(data_test_write(path, 65536, n_docs, len) == 0, "write");
    free(len);
    char err[1024];
    DataSource *src;
    DataSet *ds;
    EXPECT(data_source_open(&src, DATA_FORMAT_FLAT, path, 65536, err, sizeof err) == 0, "%s", err);
    EXPECT(data_open_source(&ds, src, 1 << 20, true, 1, err, sizeof err) == 0, "%s", err);
    int64_t T = 1 << 20;
    int32_t *tok = malloc((size_t)T * 4), *tgt = malloc((size_t)T * 4), *dp = malloc((size_t)T * 4);
    struct timespec a, b, c;
    clock_gettime(CLOCK_MONOTONIC, &a);
    EXPECT(data_read_sample(ds, 0, tok, tgt, NULL, dp, err, sizeof err) == 0, "%s", err); /* + shuffle */
    clock_gettime(CLOCK_MONOTONIC, &b);
    for (int64_t g = 1; g < 7; g++) EXPECT(data_read_sample(ds, g, tok, tgt, NULL, dp, err, sizeof err) == 0, "%s", err);
    clock_gettime(CLOCK_MONOTONIC, &c);
    double first = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6;
    double per = ((double)(c.tv_sec - b.tv_sec) * 1e3 + (double)(c.tv_nsec - b.tv_nsec) * 1e-6) / 6;
    int64_t starts = 0;
    for (int64_t t = 0; t < T; t++) starts += dp[t] == 0;
    EXPECT(starts > 300000, "only %lld document starts in a sample", (long long)starts);
    /* shuffled documents lie anywhere in the file: read in file order, nearby pieces by one pread
     * (data_pack.c data_read_pieces), ~85 ms a sample here (one pread per document was ~0.9 us each,
     * 0.3-2.3 s a sample) */
    EXPECT(per < 1000, "%.1f ms per 1M-token sample", per);
    printf("1M-token samples from %lld documents: %.1f ms first (with the epoch's shuffle), %.1f ms each after; "
           "%lld documents in the last\n",
           (long long)n_docs, first, per, (long long)starts);
    free(tok);
    free(tgt);
    free(dp);
    data_close(ds);
    data_test_rmdir();
}
