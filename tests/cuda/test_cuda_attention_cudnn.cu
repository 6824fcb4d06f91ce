/*
 * test_cuda_attention_cudnn.cu — parity of the cuDNN attention route
 * (kernels/cuda/cuda_attention_cudnn.c, device.attention_kernel: cudnn |
 * cudnn_det; issue 19) with the cpu oracle (kernels/cpu/cpu_attention.c),
 * with the bounds of test_cuda_attention.cu: out 5e-3, lse 1e-5, dq/dk/dv
 * increments 5e-3 (relative L2). Cases of build/test_cuda; they need cuDNN 9
 * (cuda_attention_cudnn_load's search, or RS_CUDNN_LIBRARY=path): where it
 * cannot be loaded they print SKIP and pass, unless RS_CUDNN_REQUIRED=1
 * (gpu_regress.sh's parts set it), then they fail.
 *
 * Inputs: q ~ N(0, 1.5^2), k, v, dO ~ N(0, 1), rounded to bf16 (the cpu kernel
 * gets the same values as fp32); k and v interleaved in one [k | v] row as the
 * ring keeps them (ldk = 2 nkv hd). Positions of a contiguous global range
 * for the queries and one for the keys, one document or a document start
 * inside. Gradients are prefilled with random values (the += contract); the
 * increment is compared with the cpu kernel's. Each case also checks the route:
 * the calls it expects on cuDNN went there (cuda_attention_cudnn_counts), the
 * document-masked ones to our kernel.
 *
 *   cuda_attention_cudnn_causal        one-GPU causal, MHA 8/8/128, T = 1000 (not a tile multiple)
 *   cuda_attention_cudnn_gqa           causal GQA 16/2, hd 128 and hd 256
 *   cuda_attention_cudnn_dense         the ring's dense rectangle (every key earlier, causal flag on),
 *                                      GQA 16/2 hd 128, and a non-causal call
 *   cuda_attention_cudnn_documents     a diagonal with a document start inside: cuDNN's variable length;
 *                                      a rectangle across documents: ours; same bounds
 *   cuda_attention_cudnn_varlen        packed documents of one call (q rows = k rows), cuDNN's variable
 *                                      length (ragged q, k, v, out, Stats = our lse, gradients), hd 128: 2
 *                                      documents, 16 of random lengths, one long and 25 short, two one-row
 *                                      documents first, the first begun before the call; T not a multiple
 *                                      of 64, GQA 16/2 and MHA; out, lse, dq, dk, dv against the cpu; the
 *                                      forward and the backward on the variable-length route
 *                                      (cuda_attention_cudnn_varlen_counts) and nothing in the error word
 *   cuda_attention_cudnn_varlen_hd256  the same at hd 256: a document of one row (GQA 16/2), the first
 *                                      document begun before the call (MHA 8/8); the forward on cuDNN, the
 *                                      backward ours (cdg_varlen_backward_ok)
 *   manual_cuda_attention_cudnn_varlen_bwd_hd256: the hd 256 cases with the backward on cuDNN's
 *                                      variable-length graph too (cuda_attention_cudnn_probe_varlen_backward):
 *                                      wrong on cuDNN 9.14, hence ours there (cdg_varlen_backward_ok); a probe
 *                                      for newer cuDNN, run only when named (an illegal address would stop
 *                                      the suite's process)
 *   cuda_attention_cudnn_ring          a zigzag ring of P = 2 seen from rank 0 (queries = fragments 0
 *                                      and 3 of 4), twice: the rule's causal diagonals and dense
 *                                      rectangles, and one call per step (the own block [0 | 3] causal by
 *                                      row index, then 3 x [1, 2] dense), through the entries, merged
 *                                      (cuda_attention_merge), against one cpu call over all keys; the
 *                                      backward of the same calls with the final out and lse,
 *                                      accumulated, against the cpu backward; every call on cuDNN
 *   cuda_attention_cudnn_deterministic cudnn_det: two backward runs from the same prefill bitwise equal;
 *                                      cudnn (its dq accumulator): prints whether they are (no check)
 *   cuda_attention_cudnn_hint          the route follows the caller's hint (lib/backend/attn_hint.h), never the
 *                                      device: right hints send a one-document diagonal to cuDNN and a
 *                                      document-masked one to ours with nothing in the error word; a wrong
 *                                      hint either way (one document claimed for masked rows, which would
 *                                      run the wrong mask, and a document start claimed for plain rows) is
 *                                      recorded as CUDA_ERR_ATTN_HINT naming the field, with the route the
 *                                      hint asked for; a rank's own block with its fragments the other way
 *                                      round runs ours, and a hint claiming its positions rise (cuDNN's
 *                                      causal, the wrong mask) is recorded naming `rising`; packed rows
 *                                      whose second run does not begin its document run ours, and a hint
 *                                      claiming clean runs is recorded naming `runs_clean`
 *
 * Every call passes the hint of its rows, computed on the host (the cpu oracle checks it too).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/cudnn_graph.h"
#include "cpu_kernels.h"
#include "cuda_attention_cudnn.h"
#include "cuda_common.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

#define CC_OUT_BOUND  5e-3
#define CC_LSE_BOUND  1e-5
#define CC_GRAD_BOUND 5e-3

/* 1 when cuDNN is loaded; 0 (and SKIP printed, or a failure under RS_CUDNN_REQUIRED=1) when not */
static int cc_ready(int deterministic) {
    char err[4096];
    const char *path = getenv("RS_CUDNN_LIBRARY");
    if (cuda_attention_cudnn_load(path ? path : "", err, sizeof err)) {
        const char *req = getenv("RS_CUDNN_REQUIRED");
        if (req && req[0] == '1') EXPECT(0, "cuDNN required (RS_CUDNN_REQUIRED=1) but not loadable:\n%s", err);
        else printf("SKIP: cuDNN not loadable here:\n%s\n", err);
        return 0;
    }
    cuda_attention_cudnn_set_deterministic(deterministic);
    printf("%s, %s backward\n", cuda_attention_cudnn_describe(), deterministic ? "deterministic" : "dq-accumulator");
    return 1;
}

typedef struct {
    int nh, nkv, hd, causal;
    int64_t q0, nq, k0, nk; /* global positions [q0, q0 + nq) and [k0, k0 + nk) */
    int64_t doc_cut;        /* > 0: a document starts at this global position */
} CcCase;

static void cc_meta(int32_t *pos, int32_t *doc_pos, int64_t p0, int64_t n, int64_t cut) {
    for (int64_t i = 0; i < n; i++) {
        int64_t p = p0 + i;
        pos[i] = (int32_t)p;
        doc_pos[i] = (int32_t)(cut > 0 && p >= cut ? p - cut : p);
    }
}

typedef struct {
    int64_t nq, nk;
    int qd, kvd, ldk;
    float *q, *kv, *dout;             /* host, bf16-rounded: (nq, qd), (nk, 2 kvd), (nq, qd) */
    int32_t *pq, *dq_, *pk, *dk_;     /* metadata */
    bf16 *d_q, *d_kv, *d_dout;
    int32_t *d_pq, *d_dpq, *d_pk, *d_dpk;
} CcData;

static void cc_setup(CcData *a, const CcCase *c, uint64_t seed) {
    memset(a, 0, sizeof *a);
    a->nq = c->nq, a->nk = c->nk, a->qd = c->nh * c->hd, a->kvd = c->nkv * c->hd, a->ldk = 2 * a->kvd;
    test_rng_seed(seed);
    a->q = ct_host_normal(a->nq * a->qd, 1.5);
    a->kv = ct_host_normal(a->nk * a->ldk, 1.0);
    a->dout = ct_host_normal(a->nq * a->qd, 1.0);
    ct_round_bf16(a->q, a->nq * a->qd);
    ct_round_bf16(a->kv, a->nk * a->ldk);
    ct_round_bf16(a->dout, a->nq * a->qd);
    a->pq = (int32_t *)test_alloc(a->nq * 4 + 4), a->dq_ = (int32_t *)test_alloc(a->nq * 4 + 4);
    a->pk = (int32_t *)test_alloc(a->nk * 4 + 4), a->dk_ = (int32_t *)test_alloc(a->nk * 4 + 4);
    cc_meta(a->pq, a->dq_, c->q0, c->nq, c->doc_cut);
    cc_meta(a->pk, a->dk_, c->k0, c->nk, c->doc_cut);
    a->d_q = ct_up_bf16(a->q, a->nq * a->qd);
    a->d_kv = ct_up_bf16(a->kv, a->nk * a->ldk);
    a->d_dout = ct_up_bf16(a->dout, a->nq * a->qd);
    a->d_pq = ct_up_i32(a->pq, a->nq), a->d_dpq = ct_up_i32(a->dq_, a->nq);
    a->d_pk = ct_up_i32(a->pk, a->nk), a->d_dpk = ct_up_i32(a->dk_, a->nk);
}

/* relative L2 over the finite entries; -inf entries must match exactly */
static void cc_check_lse(const char *what, const float *got, const float *want, int64_t n) {
    float *g = ct_host(n), *w = ct_host(n);
    int64_t m = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (want[i] == -INFINITY) bad += got[i] != -INFINITY;
        else g[m] = got[i], w[m++] = want[i];
    }
    EXPECT(!bad, "%s: %lld rows that see no key differ", what, (long long)bad);
    if (m) test_check_rel_f(what, g, w, m, CC_LSE_BOUND);
}

/* 1 in the probe: the variable-length backward on cuDNN at every head dim (cuda_attention_cudnn_probe_varlen_backward) */
static int cc_varlen_bwd_any;

/* forward and backward of one case's data against the cpu; expect_cudnn: the calls must go to cuDNN (else to
 * ours); expect_varlen: and through the variable-length route */
static void cc_run_data(const char *name, const CcCase *c, CcData &a, int expect_cudnn, int expect_varlen) {
    const int64_t nq = a.nq, nk = a.nk;
    int64_t c0[4], c1[4], v0[2], v1[2];
    cuda_attention_cudnn_counts(c0);
    cuda_attention_cudnn_varlen_counts(v0);

    /* forward */
    float *out_ref = ct_host(nq * a.qd), *lse_ref = ct_host(nq * c->nh);
    const AttnHint h = attn_hint_rows(a.pq, a.dq_, nq, a.pk, a.dk_, nk);
    cpu_attention_forward(out_ref, lse_ref, a.q, a.kv, a.kv + a.kvd, a.pq, a.dq_, a.pk, a.dk_, &h, nq, nk, c->nh,
                          c->nkv, c->hd, a.qd, a.ldk, a.qd, c->causal);
    bf16 *d_out = (bf16 *)ct_dev((size_t)nq * a.qd * 2);
    float *d_lse = (float *)ct_dev((size_t)nq * c->nh * 4);
    cuda_attention_cudnn_forward(d_out, d_lse, a.d_q, a.d_kv, a.d_kv + a.kvd, a.d_pq, a.d_dpq, a.d_pk, a.d_dpk, &h,
                                 nq, nk, c->nh, c->nkv, c->hd, a.qd, a.ldk, a.qd, c->causal);
    float *out = ct_host(nq * a.qd), *lse = ct_host(nq * c->nh);
    ct_down_bf16(out, d_out, nq * a.qd);
    ct_down_f32(lse, d_lse, nq * c->nh);
    char what[160];
    snprintf(what, sizeof what, "%s out", name);
    test_check_rel_f(what, out, out_ref, nq * a.qd, CC_OUT_BOUND);
    snprintf(what, sizeof what, "%s lse", name);
    cc_check_lse(what, lse, lse_ref, nq * c->nh);

    /* backward with the cpu's final out (bf16) and lse */
    float *out_b = ct_clone(out_ref, nq * a.qd);
    ct_round_bf16(out_b, nq * a.qd);
    bf16 *d_outb = ct_up_bf16(out_b, nq * a.qd);
    float *d_lse_ref = ct_up_f32(lse_ref, nq * c->nh);
    float *gq_ref = ct_host(nq * a.qd), *gkv_ref = ct_host(nk * a.ldk);
    memset(gq_ref, 0, (size_t)nq * a.qd * 4);
    memset(gkv_ref, 0, (size_t)nk * a.ldk * 4);
    cpu_attention_backward(gq_ref, gkv_ref, gkv_ref + a.kvd, a.dout, out_b, lse_ref, a.q, a.kv, a.kv + a.kvd, a.pq,
                           a.dq_, a.pk, a.dk_, &h, nq, nk, c->nh, c->nkv, c->hd, a.qd, a.ldk, a.qd, c->causal);
    float *pre_q = ct_host_normal(nq * a.qd, 1.0), *pre_kv = ct_host_normal(nk * a.ldk, 1.0);
    float *d_gq = ct_up_f32(pre_q, nq * a.qd), *d_gkv = ct_up_f32(pre_kv, nk * a.ldk);
    cuda_attention_cudnn_backward(d_gq, d_gkv, d_gkv + a.kvd, a.d_dout, d_outb, d_lse_ref, a.d_q, a.d_kv,
                                  a.d_kv + a.kvd, a.d_pq, a.d_dpq, a.d_pk, a.d_dpk, &h, nq, nk, c->nh, c->nkv, c->hd,
                                  a.qd, a.ldk, a.qd, c->causal);
    float *gq = ct_host(nq * a.qd), *gkv = ct_host(nk * a.ldk);
    ct_down_f32(gq, d_gq, nq * a.qd);
    ct_down_f32(gkv, d_gkv, nk * a.ldk);
    for (int64_t i = 0; i < nq * a.qd; i++) gq[i] -= pre_q[i];
    for (int64_t i = 0; i < nk * a.ldk; i++) gkv[i] -= pre_kv[i];
    float *gk = ct_host(nk * a.kvd), *gv = ct_host(nk * a.kvd), *gk_ref = ct_host(nk * a.kvd), *gv_ref = ct_host(nk * a.kvd);
    for (int64_t t = 0; t < nk; t++)
        for (int i = 0; i < a.kvd; i++) {
            gk[t * a.kvd + i] = gkv[t * a.ldk + i], gv[t * a.kvd + i] = gkv[t * a.ldk + a.kvd + i];
            gk_ref[t * a.kvd + i] = gkv_ref[t * a.ldk + i], gv_ref[t * a.kvd + i] = gkv_ref[t * a.ldk + a.kvd + i];
        }
    snprintf(what, sizeof what, "%s dq", name);
    test_check_rel_f(what, gq, gq_ref, nq * a.qd, CC_GRAD_BOUND);
    snprintf(what, sizeof what, "%s dk", name);
    test_check_rel_f(what, gk, gk_ref, nk * a.kvd, CC_GRAD_BOUND);
    snprintf(what, sizeof what, "%s dv", name);
    test_check_rel_f(what, gv, gv_ref, nk * a.kvd, CC_GRAD_BOUND);

    cuda_attention_cudnn_counts(c1);
    cuda_attention_cudnn_varlen_counts(v1);
    const int64_t on_cudnn = (c1[0] - c0[0]) + (c1[2] - c0[2]), on_ours = (c1[1] - c0[1]) + (c1[3] - c0[3]);
    const int64_t on_varlen = (v1[0] - v0[0]) + (v1[1] - v0[1]);
    printf("%s: calls on cuDNN %lld (variable length %lld), on ours %lld\n", name, (long long)on_cudnn,
           (long long)on_varlen, (long long)on_ours);
    /* a variable-length call: the forward on cuDNN, the backward too where cdg_varlen_backward_ok (hd <= 128) or
     * the probe sends it (cuda_attention_cudnn.c cd_route), else ours */
    const int nvl = expect_varlen ? 1 + (cc_varlen_bwd_any || cdg_varlen_backward_ok(c->hd)) : 0;
    const int want_cudnn = expect_varlen ? nvl : expect_cudnn ? 2 : 0;
    EXPECT(on_cudnn == want_cudnn && on_ours == 2 - want_cudnn, "%s: routed cuDNN %lld / ours %lld, want %d / %d",
           name, (long long)on_cudnn, (long long)on_ours, want_cudnn, 2 - want_cudnn);
    EXPECT(on_varlen == nvl, "%s: %lld calls on the variable-length route, want %d", name, (long long)on_varlen,
           nvl);
    long long field = -1;
    int value = 0, code = cuda_error_take(&field, &value);
    EXPECT(code == CUDA_ERR_NONE, "%s: the device error word holds %d (field %s)", name, code,
           attn_hint_field_name((int)field));
}

static void cc_run(const char *name, const CcCase *c, int expect_cudnn, uint64_t seed) {
    CcData a;
    cc_setup(&a, c, seed);
    cc_run_data(name, c, a, expect_cudnn, 0);
}

TEST(cuda_attention_cudnn_causal) {
    ct_begin();
    if (!cc_ready(0)) return;
    CcCase c = {8, 8, 128, 1, 0, 1000, 0, 1000, 0};
    cc_run("causal 8/8/128 T 1000", &c, 1, 1901);
}

TEST(cuda_attention_cudnn_gqa) {
    ct_begin();
    if (!cc_ready(0)) return;
    CcCase c = {16, 2, 128, 1, 0, 768, 0, 768, 0};
    cc_run("causal GQA 16/2/128 T 768", &c, 1, 1902);
    CcCase c2 = {16, 2, 256, 1, 0, 520, 0, 520, 0};
    cc_run("causal GQA 16/2/256 T 520", &c2, 1, 1903);
}

TEST(cuda_attention_cudnn_dense) {
    ct_begin();
    if (!cc_ready(0)) return;
    CcCase c = {16, 2, 128, 1, 1536, 512, 0, 512, 0}; /* every key earlier: the ring's dense rectangle */
    cc_run("dense rectangle 16/2/128", &c, 1, 1904);
    CcCase c2 = {8, 8, 256, 0, 0, 300, 300, 450, 0}; /* not causal */
    cc_run("non-causal 8/8/256", &c2, 1, 1905);
}

TEST(cuda_attention_cudnn_documents) {
    ct_begin();
    if (!cc_ready(0)) return;
    CcCase c = {8, 2, 128, 1, 0, 640, 0, 640, 200}; /* a document starts at 200: variable length */
    CcData a;
    cc_setup(&a, &c, 1906);
    cc_run_data("diagonal with a document start", &c, a, 1, 1);
    CcCase c2 = {8, 2, 128, 1, 1024, 256, 0, 512, 300}; /* earlier keys of another document: ours */
    cc_run("rectangle across documents", &c2, 0, 1907);
}

/* ---- packed documents: cuDNN's variable length ---- */

/* one call over T packed rows (q rows = k rows) of documents of the given lengths, positions from p0, the
 * first document begun `before` tokens before the call */
static void cc_varlen(const char *name, int nh, int nkv, int hd, const int64_t *len, int nd, int32_t p0,
                      int32_t before, int expect_varlen, uint64_t seed) {
    int64_t T = 0;
    for (int d = 0; d < nd; d++) T += len[d];
    CcCase c = {nh, nkv, hd, 1, p0, T, p0, T, 0};
    CcData a;
    cc_setup(&a, &c, seed);
    int64_t t = 0;
    for (int d = 0; d < nd; d++)
        for (int64_t i = 0; i < len[d]; i++, t++) {
            a.pq[t] = a.pk[t] = p0 + (int32_t)t;
            a.dq_[t] = a.dk_[t] = (int32_t)i + (d == 0 ? before : 0);
        }
    a.d_pq = ct_up_i32(a.pq, T), a.d_dpq = ct_up_i32(a.dq_, T);
    a.d_pk = ct_up_i32(a.pk, T), a.d_dpk = ct_up_i32(a.dk_, T);
    cc_run_data(name, &c, a, 1, expect_varlen);
}

static void cc_varlen_cases(void) {
    int64_t len[64];
    len[0] = 613, len[1] = 387;
    cc_varlen("varlen 2 documents, GQA 16/2/128, T 1000", 16, 2, 128, len, 2, 0, 0, 1, 1920);
    test_rng_seed(1921);
    int64_t T = 0;
    for (int d = 0; d < 16; d++) T += len[d] = 1 + (int64_t)(test_uniform() * 250);
    printf("16 random documents: %lld rows\n", (long long)T);
    cc_varlen("varlen 16 random documents, GQA 16/2/128", 16, 2, 128, len, 16, 0, 0, 1, 1922);
    len[0] = 2000;
    for (int d = 1; d <= 25; d++) len[d] = 40;
    cc_varlen("varlen one long and 25 short, MHA 8/8/128, T 3000", 8, 8, 128, len, 26, 0, 0, 1, 1923);
    len[0] = 1, len[1] = 1, len[2] = 998;
    cc_varlen("varlen two one-row documents first, MHA 4/4/128, T 1000", 4, 4, 128, len, 3, 0, 0, 1, 1926);
    len[0] = 700, len[1] = 555, len[2] = 245;
    cc_varlen("varlen first document begun before the call, GQA 16/2/128, T 1500", 16, 2, 128, len, 3, 4096, 100, 1,
              1927);
}

static void cc_varlen_cases_hd256(void) {
    int64_t len[3] = {300, 1, 476};
    cc_varlen("varlen a document of one row, GQA 16/2/256, T 777", 16, 2, 256, len, 3, 0, 0, 1, 1924);
    len[0] = 700, len[1] = 555, len[2] = 245;
    cc_varlen("varlen first document begun before the call, MHA 8/8/256, T 1500", 8, 8, 256, len, 3, 4096, 100, 1,
              1925);
}

TEST(cuda_attention_cudnn_varlen) {
    ct_begin();
    if (!cc_ready(0)) return;
    cc_varlen_cases();
}

/* hd 256 apart (a refusal of cuDNN's stops the process: the hd 128 cases report first) */
TEST(cuda_attention_cudnn_varlen_hd256) {
    ct_begin();
    if (!cc_ready(0)) return;
    cc_varlen_cases_hd256();
}

/* the hd 256 cases with the backward on cuDNN's variable-length graph (not what runs: wrong on cuDNN 9.14; an
 * illegal address here would stop the process, hence manual_: run only when named) */
TEST(manual_cuda_attention_cudnn_varlen_bwd_hd256) {
    ct_begin();
    if (!cc_ready(0)) return;
    cuda_attention_cudnn_probe_varlen_backward(1), cc_varlen_bwd_any = 1;
    cc_varlen_cases_hd256();
    cuda_attention_cudnn_probe_varlen_backward(0), cc_varlen_bwd_any = 0;
}

/* ---- a ring step sequence ---- */

/* One call of a ring schedule seen from rank 0 of P = 2: query rows [qr, qr + nq) of the rank's 2N, keys from
 * the rank's own block (own: rows [kr, kr + nk) of its packed fragments 0 and 3) or from the sample's keys
 * (global rows [kr, kr + nk)). */
typedef struct {
    int64_t qr, nq;
    int     own;
    int64_t kr, nk;
    int     causal;
} CcPiece;

/* rank 0's queries (fragments 0 and 3 of 4) through the pieces, forward merged and backward accumulated,
 * against one cpu call of its queries over every key; every call must go to cuDNN */
static void cc_ring_schedule(const char *name, const CcPiece *pc, int npc) {
    enum { N = 384 };                         /* fragment length; 4 fragments, rank 0 of P = 2 holds 0 and 3 */
    const int nh = 16, nkv = 2, hd = 128, qd = nh * hd, kvd = nkv * hd, ldk = 2 * kvd;
    CcCase all = {nh, nkv, hd, 1, 0, 4 * N, 0, 4 * N, 0};
    CcData a;
    cc_setup(&a, &all, 1908); /* every token of the sample; q rows of fragments 0 and 3 are rank 0's */
    /* rank 0's rows: global rows [0, N) and [3N, 4N), packed (queries, and its own block's keys) */
    float *q0 = ct_host(2 * N * qd), *dout0 = ct_host(2 * N * qd), *kv0 = ct_host(2 * N * ldk);
    int32_t pq[2 * N], dpq[2 * N];
    for (int64_t i = 0; i < 2 * N; i++) {
        int64_t g = i < N ? i : 2 * N + i;
        memcpy(q0 + i * qd, a.q + g * qd, (size_t)qd * 4);
        memcpy(dout0 + i * qd, a.dout + g * qd, (size_t)qd * 4);
        memcpy(kv0 + i * ldk, a.kv + g * ldk, (size_t)ldk * 4);
        pq[i] = dpq[i] = (int32_t)g;
    }
    /* the cpu: one call of rank 0's queries against every key */
    float *out_ref = ct_host(2 * N * qd), *lse_ref = ct_host(2 * N * nh);
    cpu_attention_forward(out_ref, lse_ref, q0, a.kv, a.kv + kvd, pq, dpq, a.pk, a.dk_, NULL, 2 * N, 4 * N, nh, nkv,
                          hd, qd, ldk, qd, 1);
    bf16 *d_q0 = ct_up_bf16(q0, 2 * N * qd), *d_dout0 = ct_up_bf16(dout0, 2 * N * qd);
    bf16 *d_kv0 = ct_up_bf16(kv0, 2 * N * ldk);
    int32_t *d_pq = ct_up_i32(pq, 2 * N);
    float *d_run_out = (float *)ct_dev((size_t)2 * N * qd * 4), *d_run_lse = (float *)ct_dev((size_t)2 * N * nh * 4);
    float *neg = ct_host(2 * N * nh);
    for (int64_t i = 0; i < 2 * N * nh; i++) neg[i] = -INFINITY;
    CUDA_CHECK(cudaMemset(d_run_out, 0, (size_t)2 * N * qd * 4));
    CUDA_CHECK(cudaMemcpy(d_run_lse, neg, (size_t)2 * N * nh * 4, cudaMemcpyHostToDevice));
    bf16 *d_blk = (bf16 *)ct_dev((size_t)2 * N * qd * 2);
    float *d_blk_lse = (float *)ct_dev((size_t)2 * N * nh * 4);
    int64_t c0[4], c1[4];
    cuda_attention_cudnn_counts(c0);
#define CC_KEYS(p, base_own, base_all) ((p)->own ? (base_own) : (base_all))
    for (int i = 0; i < npc; i++) {
        const CcPiece *p = &pc[i];
        const int32_t *pk = CC_KEYS(p, pq, a.pk) + p->kr, *dk = CC_KEYS(p, dpq, a.dk_) + p->kr;
        const int32_t *d_pk = CC_KEYS(p, d_pq, a.d_pk) + p->kr, *d_dk = CC_KEYS(p, d_pq, a.d_dpk) + p->kr;
        const bf16 *d_kv = CC_KEYS(p, d_kv0, a.d_kv) + p->kr * ldk;
        const AttnHint h = attn_hint_rows(pq + p->qr, dpq + p->qr, p->nq, pk, dk, p->nk);
        cuda_attention_cudnn_forward(d_blk, d_blk_lse, d_q0 + p->qr * qd, d_kv, d_kv + kvd, d_pq + p->qr,
                                     d_pq + p->qr, d_pk, d_dk, &h, p->nq, p->nk, nh, nkv, hd, qd, ldk, qd, p->causal);
        cuda_attention_merge(d_run_out + p->qr * qd, d_run_lse + p->qr * nh, d_blk, d_blk_lse, p->nq, nh, hd, qd);
    }
    float *out = ct_host(2 * N * qd), *lse = ct_host(2 * N * nh);
    ct_down_f32(out, d_run_out, 2 * N * qd);
    ct_down_f32(lse, d_run_lse, 2 * N * nh);
    char what[160];
    snprintf(what, sizeof what, "%s out", name);
    test_check_rel_f(what, out, out_ref, 2 * N * qd, CC_OUT_BOUND);
    snprintf(what, sizeof what, "%s lse", name);
    cc_check_lse(what, lse, lse_ref, 2 * N * nh);

    /* backward: the same pieces with the final out (bf16) and lse, dq and dk|dv accumulated (the own block's
     * dk|dv in its packed rows, added to the sample's rows after) */
    float *out_b = ct_clone(out_ref, 2 * N * qd);
    ct_round_bf16(out_b, 2 * N * qd);
    bf16 *d_outb = ct_up_bf16(out_b, 2 * N * qd);
    float *d_lse_ref = ct_up_f32(lse_ref, 2 * N * nh);
    float *gq_ref = ct_host(2 * N * qd), *gkv_ref = ct_host(4 * N * ldk);
    memset(gq_ref, 0, (size_t)2 * N * qd * 4);
    memset(gkv_ref, 0, (size_t)4 * N * ldk * 4);
    cpu_attention_backward(gq_ref, gkv_ref, gkv_ref + kvd, dout0, out_b, lse_ref, q0, a.kv, a.kv + kvd, pq, dpq, a.pk,
                           a.dk_, NULL, 2 * N, 4 * N, nh, nkv, hd, qd, ldk, qd, 1);
    float *d_gq = (float *)ct_dev((size_t)2 * N * qd * 4), *d_gkv = (float *)ct_dev((size_t)4 * N * ldk * 4);
    float *d_gkv0 = (float *)ct_dev((size_t)2 * N * ldk * 4);
    CUDA_CHECK(cudaMemset(d_gq, 0, (size_t)2 * N * qd * 4));
    CUDA_CHECK(cudaMemset(d_gkv, 0, (size_t)4 * N * ldk * 4));
    CUDA_CHECK(cudaMemset(d_gkv0, 0, (size_t)2 * N * ldk * 4));
    for (int i = 0; i < npc; i++) {
        const CcPiece *p = &pc[i];
        const int32_t *pk = CC_KEYS(p, pq, a.pk) + p->kr, *dk = CC_KEYS(p, dpq, a.dk_) + p->kr;
        const int32_t *d_pk = CC_KEYS(p, d_pq, a.d_pk) + p->kr, *d_dk = CC_KEYS(p, d_pq, a.d_dpk) + p->kr;
        const bf16 *d_kv = CC_KEYS(p, d_kv0, a.d_kv) + p->kr * ldk;
        float *d_g = CC_KEYS(p, d_gkv0, d_gkv) + p->kr * ldk;
        const AttnHint h = attn_hint_rows(pq + p->qr, dpq + p->qr, p->nq, pk, dk, p->nk);
        cuda_attention_cudnn_backward(d_gq + p->qr * qd, d_g, d_g + kvd, d_dout0 + p->qr * qd, d_outb + p->qr * qd,
                                      d_lse_ref + p->qr * nh, d_q0 + p->qr * qd, d_kv, d_kv + kvd, d_pq + p->qr,
                                      d_pq + p->qr, d_pk, d_dk, &h, p->nq, p->nk, nh, nkv, hd, qd, ldk, qd, p->causal);
    }
#undef CC_KEYS
    float *gq = ct_host(2 * N * qd), *gkv = ct_host(4 * N * ldk), *gkv0 = ct_host(2 * N * ldk);
    ct_down_f32(gq, d_gq, 2 * N * qd);
    ct_down_f32(gkv, d_gkv, 4 * N * ldk);
    ct_down_f32(gkv0, d_gkv0, 2 * N * ldk);
    for (int64_t i = 0; i < 2 * N; i++)
        for (int c = 0; c < ldk; c++) gkv[(i < N ? i : 2 * N + i) * ldk + c] += gkv0[i * ldk + c];
    snprintf(what, sizeof what, "%s dq", name);
    test_check_rel_f(what, gq, gq_ref, 2 * N * qd, CC_GRAD_BOUND);
    snprintf(what, sizeof what, "%s dk|dv", name);
    test_check_rel_f(what, gkv, gkv_ref, 4 * N * ldk, CC_GRAD_BOUND);
    cuda_attention_cudnn_counts(c1);
    printf("%s: %d calls each way, on cuDNN %lld / %lld, on ours %lld / %lld\n", name, npc,
           (long long)(c1[0] - c0[0]), (long long)(c1[2] - c0[2]), (long long)(c1[1] - c0[1]),
           (long long)(c1[3] - c0[3]));
    EXPECT(c1[0] - c0[0] == npc && c1[2] - c0[2] == npc && c1[1] == c0[1] && c1[3] == c0[3],
           "%s: want all %d forward and backward calls on cuDNN", name, npc);
    long long field = -1;
    int value = 0, code = cuda_error_take(&field, &value);
    EXPECT(code == CUDA_ERR_NONE, "%s: the device error word holds %d (field %lld)", name, code, field);
}

TEST(cuda_attention_cudnn_ring) {
    ct_begin();
    if (!cc_ready(0)) return;
    enum { N = 384 };
    /* the zigzag rule's calls: the diagonals of fragments 0 and 3, the rectangle 3 x 0 (step 0, the own block),
     * then 3 x 1 and 3 x 2 (step 1) */
    const CcPiece pairs[5] = {{0, N, 1, 0, N, 1}, {N, N, 1, N, N, 1}, {N, N, 1, 0, N, 0},
                              {N, N, 0, N, N, 0}, {N, N, 0, 2 * N, N, 0}};
    cc_ring_schedule("ring pieces", pairs, 5);
    /* one call per step (lib/cp/cp_ring.c's bounding boxes): the own block causal by row index (its positions rise
     * with a gap), then fragment 3 x fragments 1 and 2 dense */
    const CcPiece steps[2] = {{0, 2 * N, 1, 0, 2 * N, 1}, {N, N, 0, N, 2 * N, 1}};
    cc_ring_schedule("ring steps", steps, 2);
}

/* ---- determinism ---- */

static void cc_backward_twice(const char *name, int must_equal) {
    CcCase c = {16, 2, 128, 1, 0, 2048, 0, 2048, 0};
    CcData a;
    cc_setup(&a, &c, 1909);
    const int64_t T = a.nq;
    float *out = ct_host(T * a.qd), *lse = ct_host(T * c.nh);
    const AttnHint h = attn_hint_rows(a.pq, a.dq_, T, a.pk, a.dk_, T);
    cpu_attention_forward(out, lse, a.q, a.kv, a.kv + a.kvd, a.pq, a.dq_, a.pk, a.dk_, &h, T, T, c.nh, c.nkv, c.hd,
                          a.qd, a.ldk, a.qd, 1);
    ct_round_bf16(out, T * a.qd);
    bf16 *d_out = ct_up_bf16(out, T * a.qd);
    float *d_lse = ct_up_f32(lse, T * c.nh);
    float *pre_q = ct_host_normal(T * a.qd, 1.0), *pre_kv = ct_host_normal(T * a.ldk, 1.0);
    float *res[2][2];
    for (int r = 0; r < 2; r++) {
        float *d_gq = ct_up_f32(pre_q, T * a.qd), *d_gkv = ct_up_f32(pre_kv, T * a.ldk);
        cuda_attention_cudnn_backward(d_gq, d_gkv, d_gkv + a.kvd, a.d_dout, d_out, d_lse, a.d_q, a.d_kv, a.d_kv + a.kvd,
                                      a.d_pq, a.d_dpq, a.d_pk, a.d_dpk, &h, T, T, c.nh, c.nkv, c.hd, a.qd, a.ldk, a.qd,
                                      1);
        res[r][0] = ct_host(T * a.qd), res[r][1] = ct_host(T * a.ldk);
        ct_down_f32(res[r][0], d_gq, T * a.qd);
        ct_down_f32(res[r][1], d_gkv, T * a.ldk);
    }
    int eq = !memcmp(res[0][0], res[1][0], (size_t)T * a.qd * 4) && !memcmp(res[0][1], res[1][1], (size_t)T * a.ldk * 4);
    printf("%s: two backward runs %s\n", name, eq ? "bitwise equal" : "DIFFER");
    if (must_equal) {
        ct_bitwise_equal("cudnn_det dq", res[0][0], res[1][0], T * a.qd);
        ct_bitwise_equal("cudnn_det dk|dv", res[0][1], res[1][1], T * a.ldk);
    }
}

TEST(cuda_attention_cudnn_deterministic) {
    ct_begin();
    if (!cc_ready(1)) return;
    cc_backward_twice("cudnn_det (2k causal 16/2/128)", 1);
    cuda_attention_cudnn_set_deterministic(0);
    cc_backward_twice("cudnn (dq accumulator, information only)", 0);
}

/* ---- the hint ---- */

/* one forward of rows (pq, dq_) x (pk, dk_) with hint h; returns the error word's code (cleared) and the field
 * it names; *to_cudnn: whether the call went to cuDNN */
static int cc_forward_with(const CcData *a, const CcCase *c, const AttnHint *h, int *to_cudnn, long long *field) {
    bf16 *d_out = (bf16 *)ct_dev((size_t)a->nq * a->qd * 2);
    float *d_lse = (float *)ct_dev((size_t)a->nq * c->nh * 4);
    int64_t c0[4], c1[4];
    cuda_attention_cudnn_counts(c0);
    cuda_attention_cudnn_forward(d_out, d_lse, a->d_q, a->d_kv, a->d_kv + a->kvd, a->d_pq, a->d_dpq, a->d_pk,
                                 a->d_dpk, h, a->nq, a->nk, c->nh, c->nkv, c->hd, a->qd, a->ldk, a->qd, c->causal);
    cuda_attention_cudnn_counts(c1);
    *to_cudnn = c1[0] > c0[0];
    int value = 0;
    *field = -1;
    return cuda_error_take(field, &value);
}

TEST(cuda_attention_cudnn_hint) {
    ct_begin();
    if (!cc_ready(0)) return;
    CcCase plain = {8, 2, 128, 1, 0, 512, 0, 512, 0}, cut = {8, 2, 128, 1, 0, 512, 0, 512, 200};
    CcData a, b;
    cc_setup(&a, &plain, 1910);
    cc_setup(&b, &cut, 1911);
    const AttnHint ha = attn_hint_rows(a.pq, a.dq_, a.nq, a.pk, a.dk_, a.nk);
    const AttnHint hb = attn_hint_rows(b.pq, b.dq_, b.nq, b.pk, b.dk_, b.nk);
    int to_cudnn;
    long long field;
    int code = cc_forward_with(&a, &plain, &ha, &to_cudnn, &field);
    printf("right hint, one document: %s, error code %d\n", to_cudnn ? "cuDNN" : "ours", code);
    EXPECT(to_cudnn && code == CUDA_ERR_NONE, "one-document diagonal: cuDNN %d, error %d", to_cudnn, code);
    code = cc_forward_with(&b, &cut, &hb, &to_cudnn, &field);
    printf("right hint, a document start: %s, error code %d\n", to_cudnn ? "cuDNN (variable length)" : "ours", code);
    EXPECT(to_cudnn && code == CUDA_ERR_NONE, "document-masked diagonal: cuDNN %d, error %d", to_cudnn, code);
    code = cc_forward_with(&b, &cut, &ha, &to_cudnn, &field); /* masked rows, one document claimed */
    printf("wrong hint (one document claimed): %s, error code %d, field %s\n", to_cudnn ? "cuDNN" : "ours", code,
           attn_hint_field_name((int)field));
    EXPECT(to_cudnn && code == CUDA_ERR_ATTN_HINT && (field == 0 || field == 1),
           "a hint claiming one document for masked rows: cuDNN %d, error %d, field %lld", to_cudnn, code, field);
    code = cc_forward_with(&a, &plain, &hb, &to_cudnn, &field); /* plain rows, a document start claimed */
    printf("wrong hint (a document start claimed): %s, error code %d, field %s\n", to_cudnn ? "cuDNN" : "ours", code,
           attn_hint_field_name((int)field));
    EXPECT(to_cudnn && code == CUDA_ERR_ATTN_HINT, "a hint claiming a document start (variable length): cuDNN %d, "
           "error %d", to_cudnn, code);
    /* packed documents whose second run does not begin its document: ours by its hint; a hint claiming clean
     * runs would send it to variable length (the runs' mask is not ours) and is recorded naming runs_clean */
    CcData r;
    cc_setup(&r, &cut, 1913);
    for (int64_t i = 200; i < r.nq; i++) r.dq_[i] = r.dk_[i] = (int32_t)(i - 200 + 7);
    r.d_dpq = ct_up_i32(r.dq_, r.nq), r.d_dpk = ct_up_i32(r.dk_, r.nk);
    const AttnHint hr = attn_hint_rows(r.pq, r.dq_, r.nq, r.pk, r.dk_, r.nk);
    code = cc_forward_with(&r, &cut, &hr, &to_cudnn, &field);
    printf("right hint, a run not beginning its document: %s, error code %d\n", to_cudnn ? "cuDNN" : "ours", code);
    EXPECT(!hr.runs_clean && !to_cudnn && code == CUDA_ERR_NONE, "unclean runs: clean %d, cuDNN %d, error %d",
           hr.runs_clean, to_cudnn, code);
    AttnHint clean = hr;
    clean.runs_clean = 1;
    code = cc_forward_with(&r, &cut, &clean, &to_cudnn, &field);
    printf("wrong hint (clean runs claimed): %s, error code %d, field %s\n", to_cudnn ? "cuDNN" : "ours", code,
           attn_hint_field_name((int)field));
    EXPECT(to_cudnn && code == CUDA_ERR_ATTN_HINT && !strcmp(attn_hint_field_name((int)field), "runs_clean"),
           "a hint claiming clean runs: cuDNN %d, error %d, field %lld", to_cudnn, code, field);
    /* a rank's own block with its fragments the other way round ([3 | 0]: positions fall once): ours by its
     * hint; a hint claiming they rise would send it to cuDNN's causal by row index, the wrong mask */
    CcData f;
    cc_setup(&f, &plain, 1912);
    for (int64_t i = 0; i < f.nq; i++) f.pq[i] = f.dq_[i] = f.pk[i] = f.dk_[i] = (int32_t)(i < 256 ? 256 + i : i - 256);
    f.d_pq = ct_up_i32(f.pq, f.nq), f.d_dpq = ct_up_i32(f.dq_, f.nq);
    f.d_pk = ct_up_i32(f.pk, f.nk), f.d_dpk = ct_up_i32(f.dk_, f.nk);
    const AttnHint hf = attn_hint_rows(f.pq, f.dq_, f.nq, f.pk, f.dk_, f.nk);
    code = cc_forward_with(&f, &plain, &hf, &to_cudnn, &field);
    printf("right hint, own block falling once: %s, error code %d\n", to_cudnn ? "cuDNN" : "ours", code);
    EXPECT(hf.same_pos && !hf.rising && !to_cudnn && code == CUDA_ERR_NONE,
           "own block [3 | 0]: same_pos %d rising %d, cuDNN %d, error %d", hf.same_pos, hf.rising, to_cudnn, code);
    AttnHint lie = hf;
    lie.rising = 1;
    code = cc_forward_with(&f, &plain, &lie, &to_cudnn, &field);
    printf("wrong hint (rising claimed): %s, error code %d, field %s\n", to_cudnn ? "cuDNN" : "ours", code,
           attn_hint_field_name((int)field));
    EXPECT(to_cudnn && code == CUDA_ERR_ATTN_HINT && !strcmp(attn_hint_field_name((int)field), "rising"),
           "a hint claiming rising positions: cuDNN %d, error %d, field %lld", to_cudnn, code, field);
}
