/*
 * data_synth.c — a synthetic long-range recall task, written as a flat file (`ringscan data synth`),
 * and its loss floor.
 *
 * Tokens for vocabulary V with K keys (K = V/4 by default): 0 <doc>, 1 <kv> (starts "<kv> key value"),
 * 2 <q> (starts "<q> key value", value = the key's value in its pair), 3 reserved, [4, 4+K) keys,
 * [4+K, 4+2K) values, [4+2K, V) filler.
 *
 * A document of length L (uniform in [min_doc, max_doc]): <doc>; P pairs with distinct keys and uniform
 * values; filler from a Markov chain with B fixed successors per token (the table drawn once per file);
 * then Q query blocks "<q> key value" plus G filler tokens each, over Q distinct keys of the document's
 * pairs in random order. The answers need the pair, hundreds of tokens back; the filler is a bigram a
 * tiny model learns fast, so the loss falls before recall is learned. The file ends where --tokens is
 * reached (the last document cut short).
 *
 * The loss floor is the mean of -ln p(token | its document so far) under this generating process, over
 * every target, including the model's uncertainty about where the query region starts (known only
 * through L); the unigram loss is the entropy of the targets' token frequencies. The derivation term by
 * term: docs/design/synthetic-recall.md.
 *
 * Random streams (rng.h): the successor table, the document lengths and the contents each have their own
 * stream of --seed, so changing one option changes only what it must.
 *
 * Callers: data_cli.c (`ringscan data synth`), tests/test_data.py.
 */
#include "data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/error.h"

enum { SYNTH_DOC = 0, SYNTH_KV = 1, SYNTH_Q = 2, SYNTH_FIRST = 4 };

void data_synth_defaults(DataSynthConfig *c) {
    memset(c, 0, sizeof *c);
    c->n_tokens = INT64_C(1) << 21;
    c->vocab = 256;
    c->seed = 1;
    c->min_doc = 96;
    c->max_doc = 1024;
    c->pairs = 8;
    c->queries = 4;
    c->gap = 8;
    c->keys = 0; /* V / 4 */
    c->branch = 4;
}

static int64_t synth_keys(const DataSynthConfig *c) { return c->keys > 0 ? c->keys : c->vocab / 4; }
static int64_t synth_filler(const DataSynthConfig *c) { return c->vocab - SYNTH_FIRST - 2 * synth_keys(c); }
static int64_t synth_query_region(const DataSynthConfig *c) { return c->queries * (3 + c->gap); }

int data_synth_validate(const DataSynthConfig *c, char *err, size_t n) {
    const char *h = "`ringscan data synth --help` shows the token layout and the defaults";
    if (c->n_tokens < 2 || c->n_tokens > (INT64_C(1) << 40))
        return data_error(err, n, RS_EXIT_USAGE, h, "--tokens %lld, expected 2..2^40", (long long)c->n_tokens);
    if (c->vocab < 16 || c->vocab > (1 << 20))
        return data_error(err, n, RS_EXIT_USAGE, h, "--vocab %lld, expected 16..1048576", (long long)c->vocab);
    int64_t K = synth_keys(c);
    if (c->keys < 0 || K < 1 || synth_filler(c) < 2)
        return data_error(err, n, RS_EXIT_USAGE, h,
                          "--keys %lld with --vocab %lld leaves %lld filler tokens; need keys >= 1 and "
                          "4 + 2*keys + 2 <= vocab",
                          (long long)K, (long long)c->vocab, (long long)synth_filler(c));
    if (c->pairs < 1 || c->pairs > K)
        return data_error(err, n, RS_EXIT_USAGE, h, "--pairs %lld, expected 1..%lld (the number of keys)",
                          (long long)c->pairs, (long long)K);
    if (c->queries < 1 || c->queries > c->pairs)
        return data_error(err, n, RS_EXIT_USAGE, h, "--queries %lld, expected 1..%lld (--pairs)",
                          (long long)c->queries, (long long)c->pairs);
    if (c->gap < 0 || c->gap > (1 << 20))
        return data_error(err, n, RS_EXIT_USAGE, h, "--gap %lld, expected 0..1048576", (long long)c->gap);
    if (c->branch < 1 || c->branch > synth_filler(c))
        return data_error(err, n, RS_EXIT_USAGE, h, "--branch %lld, expected 1..%lld (the filler tokens)",
                          (long long)c->branch, (long long)synth_filler(c));
    if (c->max_doc > (1 << 30) || c->max_doc < c->min_doc)
        return data_error(err, n, RS_EXIT_USAGE, h, "--max-doc %lld, expected --min-doc (%lld) .. 2^30",
                          (long long)c->max_doc, (long long)c->min_doc);
    int64_t need = 3 * c->pairs + 2 + synth_query_region(c);
    if (c->min_doc < need)
        return data_error(err, n, RS_EXIT_USAGE, h,
                          "--min-doc %lld is too short: a document needs <doc>, 3*pairs (%lld), one filler token "
                          "and queries*(3+gap) (%lld) = %lld tokens",
                          (long long)c->min_doc, (long long)(3 * c->pairs), (long long)synth_query_region(c),
                          (long long)need);
    return 0;
}

void data_synth_print_layout(const DataSynthConfig *c, void *file) {
    FILE *f = file;
    int64_t K = synth_keys(c), F = synth_filler(c);
    fprintf(f,
            "Token layout (vocab %lld, keys %lld):\n"
            "  0            <doc>  first token of every document\n"
            "  1            <kv>   starts a pair   \"<kv> key value\"\n"
            "  2            <q>    starts a query  \"<q> key value\" (value = the key's value in its pair)\n"
            "  3            reserved, never written\n"
            "  %-5lld..%-5lld keys\n"
            "  %-5lld..%-5lld values\n"
            "  %-5lld..%-5lld filler (%lld tokens): a Markov chain, %lld successors per token\n",
            (long long)c->vocab, (long long)K, (long long)SYNTH_FIRST, (long long)(SYNTH_FIRST + K - 1),
            (long long)(SYNTH_FIRST + K), (long long)(SYNTH_FIRST + 2 * K - 1), (long long)(SYNTH_FIRST + 2 * K),
            (long long)(c->vocab - 1), (long long)F, (long long)c->branch);
    fprintf(f,
            "Document (length L uniform in [min-doc, max-doc]):\n"
            "  <doc>, then %lld pairs with distinct keys, then filler, then the last %lld tokens:\n"
            "  %lld query blocks \"<q> key value\" + %lld filler tokens each, asking for distinct keys of the\n"
            "  document's pairs. The answers need the pairs, hundreds of tokens back.\n",
            (long long)c->pairs, (long long)synth_query_region(c), (long long)c->queries, (long long)c->gap);
}

/* ---- generation ------------------------------------------------------------ */

typedef struct {
    const DataSynthConfig *c;
    int64_t  K, F, B, P, Q, G;
    int64_t  s_min, s_max;
    int32_t *succ;      /* (F, B) successor table, filler-relative ids */
    int32_t *key_perm;  /* (K) scratch for drawing distinct keys */
    int32_t *fill_perm; /* (F) scratch for drawing the successor table */
    int32_t *values;    /* (P) the document's values, by pair */
    int32_t *asked;     /* (P) pair indices; [q, P) not asked yet */
    Rng  rng;       /* contents */
} Synth;

/* One document of full length L into tok[0..L) with -ln p per position in
 * lp[0..L) (lp[0] unused), pair value positions in pair_at[0..P) and, per
 * query q, the answer position ans_at[q] and its pair index ans_pair[q]. */
static void synth_document(Synth *sy, int64_t L, int32_t *tok, double *lp, int64_t *pair_at, int64_t *ans_at,
                           int64_t *ans_pair) {
    const int64_t K = sy->K, F = sy->F, B = sy->B, P = sy->P, Q = sy->Q, G = sy->G;
    const int32_t key0 = SYNTH_FIRST, val0 = SYNTH_FIRST + (int32_t)K, fill0 = SYNTH_FIRST + 2 * (int32_t)K;
    Rng *r = &sy->rng;
    int64_t t = 0;
    tok[t] = SYNTH_DOC;
    lp[t++] = 0;
    int32_t *values = sy->values, *asked = sy->asked;
    for (int64_t j = 0; j < P; j++) { /* distinct keys: a partial Fisher–Yates over the key ids */
        int64_t pick = j + (int64_t)rng_below(r, (uint64_t)(K - j));
        int32_t tmp = sy->key_perm[j];
        sy->key_perm[j] = sy->key_perm[pick];
        sy->key_perm[pick] = tmp;
        values[j] = (int32_t)rng_below(r, (uint64_t)K);
        tok[t] = SYNTH_KV;
        lp[t++] = 0;
        tok[t] = key0 + sy->key_perm[j];
        lp[t++] = log((double)(K - j));
        tok[t] = val0 + values[j];
        pair_at[j] = t;
        lp[t++] = log((double)K);
    }
    const int64_t s = L - Q * (3 + G);
    int32_t prev = -1;
    for (; t < s; t++) {
        double h = t >= sy->s_min ? 1.0 / (double)(sy->s_max - t + 1) : 0.0;
        if (prev < 0) {
            prev = (int32_t)rng_below(r, (uint64_t)F);
            lp[t] = log((double)F);
        } else {
            prev = sy->succ[prev * B + (int64_t)rng_below(r, (uint64_t)B)];
            lp[t] = log((double)B);
        }
        lp[t] -= log1p(-h);
        tok[t] = fill0 + prev;
    }
    for (int64_t j = 0; j < P; j++) asked[j] = (int32_t)j;
    for (int64_t q = 0; q < Q; q++) {
        tok[t] = SYNTH_Q;
        lp[t++] = q == 0 ? log((double)(sy->s_max - s + 1)) : 0.0; /* -ln h(s), then certain */
        int64_t pick = q + (int64_t)rng_below(r, (uint64_t)(P - q));
        int32_t tmp = asked[q];
        asked[q] = asked[pick];
        asked[pick] = tmp;
        int32_t j = asked[q];
        tok[t] = key0 + sy->key_perm[j];
        lp[t++] = log((double)(P - q));
        tok[t] = val0 + values[j];
        ans_at[q] = t;
        ans_pair[q] = j;
        lp[t++] = 0; /* the answer: determined by the pair */
        prev = -1;
        for (int64_t k = 0; k < G; k++, t++) {
            if (prev < 0) {
                prev = (int32_t)rng_below(r, (uint64_t)F);
                lp[t] = log((double)F);
            } else {
                prev = sy->succ[prev * B + (int64_t)rng_below(r, (uint64_t)B)];
                lp[t] = log((double)B);
            }
            tok[t] = fill0 + prev;
        }
    }
    RS_CHECK(t == L, "synth document filled %lld of %lld tokens", (long long)t, (long long)L);
}

int data_synth_write(const DataSynthConfig *c, const char *path, DataSynthStats *st, char *err, size_t n) {
    int rc = data_synth_validate(c, err, n);
    if (rc) return rc;
    memset(st, 0, sizeof *st);
    Synth sy = {.c = c, .K = synth_keys(c), .F = synth_filler(c), .B = c->branch, .P = c->pairs, .Q = c->queries,
                .G = c->gap};
    sy.s_min = c->min_doc - synth_query_region(c);
    sy.s_max = c->max_doc - synth_query_region(c);

    /* the successor table: B distinct filler successors per filler token */
    sy.succ = RS_MALLOC((size_t)(sy.F * sy.B) * sizeof *sy.succ);
    sy.fill_perm = RS_MALLOC((size_t)sy.F * sizeof *sy.fill_perm);
    sy.key_perm = RS_MALLOC((size_t)sy.K * sizeof *sy.key_perm);
    for (int64_t a = 0; a < sy.F; a++) sy.fill_perm[a] = (int32_t)a;
    for (int64_t a = 0; a < sy.K; a++) sy.key_perm[a] = (int32_t)a;
    Rng rc_chain;
    rng_init(&rc_chain, c->seed, RNG_STREAM_SYNTH_CHAIN);
    for (int64_t a = 0; a < sy.F; a++)
        for (int64_t b = 0; b < sy.B; b++) {
            int64_t pick = b + (int64_t)rng_below(&rc_chain, (uint64_t)(sy.F - b));
            int32_t tmp = sy.fill_perm[b];
            sy.fill_perm[b] = sy.fill_perm[pick];
            sy.fill_perm[pick] = tmp;
            sy.succ[a * sy.B + b] = sy.fill_perm[b];
        }

    /* document lengths: drawn until --tokens is reached, the last one cut */
    Rng rl;
    rng_init(&rl, c->seed, RNG_STREAM_SYNTH_LENGTHS);
    int64_t cap = 1024, n_docs = 0, total = 0;
    int64_t *full = RS_MALLOC((size_t)cap * sizeof *full), *len = RS_MALLOC((size_t)cap * sizeof *len);
    while (total < c->n_tokens) {
        if (n_docs == cap) {
            cap *= 2;
            full = RS_REALLOC(full, (size_t)cap * sizeof *full);
            len = RS_REALLOC(len, (size_t)cap * sizeof *len);
        }
        int64_t L = c->min_doc + (int64_t)rng_below(&rl, (uint64_t)(c->max_doc - c->min_doc + 1));
        full[n_docs] = L;
        len[n_docs] = L < c->n_tokens - total ? L : c->n_tokens - total;
        total += len[n_docs++];
    }

    DataFlatWriter w;
    rc = data_flat_write_begin(&w, path, c->vocab, n_docs, len, err, n);
    rng_init(&sy.rng, c->seed, RNG_STREAM_SYNTH_TOKENS);
    sy.values = RS_MALLOC((size_t)sy.P * sizeof *sy.values);
    sy.asked = RS_MALLOC((size_t)sy.P * sizeof *sy.asked);
    int32_t *tok = RS_MALLOC((size_t)c->max_doc * sizeof *tok);
    double *lp = RS_MALLOC((size_t)c->max_doc * sizeof *lp);
    int64_t *pair_at = RS_MALLOC((size_t)sy.P * sizeof *pair_at), *ans_at = RS_MALLOC((size_t)sy.Q * sizeof *ans_at),
            *ans_pair = RS_MALLOC((size_t)sy.Q * sizeof *ans_pair);
    int64_t *count = RS_CALLOC((size_t)c->vocab, sizeof *count);
    double lp_sum = 0, recall_sum = 0;
    st->doc_min = INT64_MAX;
    st->recall_min = INT64_MAX;
    for (int64_t d = 0; d < n_docs && !rc; d++) {
        int64_t L = full[d], m = len[d];
        synth_document(&sy, L, tok, lp, pair_at, ans_at, ans_pair);
        for (int64_t t = 1; t < m; t++) {
            lp_sum += lp[t];
            count[tok[t]]++;
        }
        st->n_targets += m - 1;
        for (int64_t j = 0; j < sy.P; j++) st->pairs += pair_at[j] < m;
        for (int64_t q = 0; q < sy.Q; q++) {
            if (ans_at[q] >= m) continue;
            int64_t dist = ans_at[q] - pair_at[ans_pair[q]];
            st->queries++;
            recall_sum += (double)dist;
            if (dist < st->recall_min) st->recall_min = dist;
            if (dist > st->recall_max) st->recall_max = dist;
            st->recall_over_512 += dist > 512;
        }
        if (m < st->doc_min) st->doc_min = m;
        if (m > st->doc_max) st->doc_max = m;
        st->docs_over_512 += m > 512;
        rc = data_flat_write_tokens(&w, tok, m, err, n);
    }
    if (!rc) rc = data_flat_write_end(&w, err, n);
    if (!rc) {
        st->n_tokens = total;
        st->n_docs = n_docs;
        st->doc_mean = (double)total / (double)n_docs;
        st->recall_mean = st->queries ? recall_sum / (double)st->queries : 0;
        if (!st->queries) st->recall_min = 0;
        st->floor_nats = st->n_targets ? lp_sum / (double)st->n_targets : 0;
        double H = 0;
        for (int64_t v = 0; v < c->vocab; v++)
            if (count[v]) {
                double p = (double)count[v] / (double)st->n_targets;
                H -= p * log(p);
            }
        st->unigram_nats = H;
    }
    free(tok);
    free(lp);
    free(pair_at);
    free(ans_at);
    free(ans_pair);
    free(count);
    free(full);
    free(len);
    free(sy.succ);
    free(sy.fill_perm);
    free(sy.key_perm);
    free(sy.values);
    free(sy.asked);
    return rc;
}
