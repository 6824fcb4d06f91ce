/*
 * attn_hint.h — the caller's host-side summary of one block attention call's
 * metadata (AttnHint; lib/backend/backend.h's attention entries take it): over the
 * call's q and k rows, the range of document starts (pos - doc_pos) and, per
 * side, whether the positions are consecutive, with the first, least query
 * and greatest key positions; whether positions rise row by row on both
 * sides, and whether the query rows' positions are the key rows' (a ring
 * rank's own block: its zigzag fragments, positions rising with a gap). That
 * is all the mask's shape depends on: one document or several, every key
 * visible, a causal diagonal, causal by row index.
 *
 * Why: a backend may pick its kernel by the mask's shape (cuda with
 * device.attention_kernel: cudnn sends one-document dense rectangles and
 * causal diagonals to cuDNN, kernels/cuda/attention/cudnn_graph.h cdg_route), but its pos
 * and doc_pos live in device memory, and reading them back would wait for
 * the GPU on every call (issue 22: no host synchronisation inside a step).
 * The caller has the rows on the host (lib/cp/cp_ring.c: CpBatch's copies) and
 * passes their summary, computed by attn_hint_rows (O(Tq + Tk) host work per
 * call, against the call's O(Tq Tk hd)).
 *
 * A wrong hint is caught on both backends, never trusted silently: the cpu
 * backend compares a given hint with its rows on every call (fatal, naming
 * the field); the cuda cuDNN route summarises the same rows on the GPU with
 * this file's fold (kernels/cuda/cuda_attention_cudnn_glue.cu, thread-strided,
 * joined) and records a difference in the device error word, which the host
 * reads where it waits anyway (the step's loss and gradient norm), so the
 * run stops before the optimizer applies the step.
 *
 * The fold is plain C usable on host and device: attn_hint_begin (the
 * empty summary of a call, given its first positions), attn_hint_add (one
 * row, read from the call's rows with the row before it and, for a query,
 * the key row of the same index), attn_hint_join (two partial summaries of
 * the same call).
 *
 * Callers: lib/cp/cp_ring.c, kernels/cuda/attention/cudnn_graph.c, kernels/cpu/cpu_attention.c,
 * kernels/cuda/cuda_attention_cudnn*, bench/bench_ops.c, tests.
 */
#ifndef RS_ATTN_HINT_H
#define RS_ATTN_HINT_H

#include <stdint.h>

#ifdef __CUDACC__
#define ATTN_HINT_HD __host__ __device__
#else
#define ATTN_HINT_HD
#endif

typedef struct AttnHint {
    int32_t doc_min, doc_max;     /* least and greatest pos - doc_pos over the q and the k rows */
    int32_t q_consec, k_consec;   /* 1 when pos[i] == pos[0] + i for every row of that side */
    int32_t pos_q0, pos_k0;       /* first positions (0 for a side without rows) */
    int32_t pos_q_min, pos_k_max; /* least query, greatest key position */
    int32_t rising;               /* 1 when pos[i] > pos[i - 1] for every row of both sides */
    int32_t same_pos;             /* 1 when Tq == Tk and pos_q[i] == pos_k[i], doc_pos_q[i] == doc_pos_k[i] for every row */
    int32_t runs;                 /* query rows: how many document runs (row 0, and every row whose document
                                   * start differs from the row before it, begins one); 0 without rows */
    int32_t run_max;              /* query rows: the greatest min(doc_pos[i], i) + 1, the longest run where the
                                   * positions are consecutive and runs_clean; 0 without rows */
    int32_t runs_clean;           /* 1 when every query run after the first begins at doc_pos 0 (and no doc_pos
                                   * is negative): with consecutive positions, no two runs share a document */
} AttnHint;

enum { ATTN_HINT_FIELDS = 13 };

/* the summary of no rows of a call whose first positions are pos_q0, pos_k0 */
static inline ATTN_HINT_HD AttnHint attn_hint_begin(int32_t pos_q0, int32_t pos_k0) {
    AttnHint h = {INT32_MAX, INT32_MIN, 1, 1, pos_q0, pos_k0, INT32_MAX, INT32_MIN, 1, 1, 0, 0, 1};
    return h;
}

/* adds row i of the keys (is_k) or of the queries of a call over pos_q, doc_q (Tq rows) and pos_k, doc_k (Tk
 * rows); reads that row, the row before it on its side and, for a query row, the key row of the same index */
static inline ATTN_HINT_HD void attn_hint_add(AttnHint *h, int is_k, int64_t i, const int32_t *pos_q,
                                              const int32_t *doc_q, int64_t Tq, const int32_t *pos_k,
                                              const int32_t *doc_k, int64_t Tk) {
    const int32_t *pos = is_k ? pos_k : pos_q;
    const int32_t p = pos[i], d = p - (is_k ? doc_k : doc_q)[i];
    if (d < h->doc_min) h->doc_min = d;
    if (d > h->doc_max) h->doc_max = d;
    if (i > 0 && p <= pos[i - 1]) h->rising = 0;
    if (Tq != Tk || (!is_k && (p != pos_k[i] || doc_q[i] != doc_k[i]))) h->same_pos = 0;
    if (is_k) {
        if ((int64_t)p != (int64_t)h->pos_k0 + i) h->k_consec = 0;
        if (p > h->pos_k_max) h->pos_k_max = p;
    } else {
        if ((int64_t)p != (int64_t)h->pos_q0 + i) h->q_consec = 0;
        if (p < h->pos_q_min) h->pos_q_min = p;
        const int32_t dp = doc_q[i];
        if (i == 0) h->runs++;
        else if (d != pos[i - 1] - doc_q[i - 1]) {
            h->runs++;
            if (dp != 0) h->runs_clean = 0;
        }
        if (dp < 0) h->runs_clean = 0;
        const int64_t len = ((int64_t)dp < i ? (int64_t)dp : i) + 1;
        if (len > h->run_max) h->run_max = (int32_t)len;
    }
}

/* a = the summary of a's rows and b's (partial summaries of the same call) */
static inline ATTN_HINT_HD void attn_hint_join(AttnHint *a, const AttnHint *b) {
    if (b->doc_min < a->doc_min) a->doc_min = b->doc_min;
    if (b->doc_max > a->doc_max) a->doc_max = b->doc_max;
    a->q_consec &= b->q_consec;
    a->k_consec &= b->k_consec;
    if (b->pos_q_min < a->pos_q_min) a->pos_q_min = b->pos_q_min;
    if (b->pos_k_max > a->pos_k_max) a->pos_k_max = b->pos_k_max;
    a->rising &= b->rising;
    a->same_pos &= b->same_pos;
    a->runs += b->runs;
    if (b->run_max > a->run_max) a->run_max = b->run_max;
    a->runs_clean &= b->runs_clean;
}

/* field i of h in declaration order (messages, device comparison) */
static inline ATTN_HINT_HD int32_t attn_hint_field(const AttnHint *h, int i) {
    const int32_t v[ATTN_HINT_FIELDS] = {h->doc_min,  h->doc_max,   h->q_consec,  h->k_consec, h->pos_q0,
                                         h->pos_k0,   h->pos_q_min, h->pos_k_max, h->rising,   h->same_pos,
                                         h->runs,     h->run_max,   h->runs_clean};
    return v[i];
}

/* the first field where a and b differ, -1 when they agree */
static inline ATTN_HINT_HD int attn_hint_differs(const AttnHint *a, const AttnHint *b) {
    for (int i = 0; i < ATTN_HINT_FIELDS; i++)
        if (attn_hint_field(a, i) != attn_hint_field(b, i)) return i;
    return -1;
}

static inline const char *attn_hint_field_name(int i) {
    static const char *const names[ATTN_HINT_FIELDS] = {"doc_min",  "doc_max",   "q_consec",  "k_consec",
                                                        "pos_q0",   "pos_k0",    "pos_q_min", "pos_k_max",
                                                        "rising",   "same_pos",  "runs",      "run_max",
                                                        "runs_clean"};
    return i >= 0 && i < ATTN_HINT_FIELDS ? names[i] : "?";
}

/* the summary of a call's rows, from host memory (the caller's copies of pos and doc_pos) */
static inline AttnHint attn_hint_rows(const int32_t *pos_q, const int32_t *doc_pos_q, int64_t Tq,
                                      const int32_t *pos_k, const int32_t *doc_pos_k, int64_t Tk) {
    AttnHint h = attn_hint_begin(Tq ? pos_q[0] : 0, Tk ? pos_k[0] : 0);
    for (int64_t i = 0; i < Tq; i++) attn_hint_add(&h, 0, i, pos_q, doc_pos_q, Tq, pos_k, doc_pos_k, Tk);
    for (int64_t i = 0; i < Tk; i++) attn_hint_add(&h, 1, i, pos_q, doc_pos_q, Tq, pos_k, doc_pos_k, Tk);
    return h;
}

#endif
