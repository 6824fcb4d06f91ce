/*
 * cp_check.c — the CP algorithms alone against the single-rank kernels
 * (build/cp_check, run by tests/test_cp.py under mpirun -np P):
 *
 *   mpirun -np P build/cp_check gdn|kda|conv|ring DOCS [--samples S] [--seq-len T] [--seed N] [--sabotage]
 *
 * Every rank draws the same whole-sample inputs (fixed seed, normal values,
 * never zero) and computes the reference with ONE kernel call over the whole
 * sample (what a single process does); then it runs its own zigzag
 * fragments through lib/cp*.c with P ranks and compares its rows of every
 * output and input gradient with the reference rows, relative L2 over the
 * world (sums of squares all-reduced), bound 1e-5 (fp32 both sides, different
 * summation orders: the fold, the LSE merge, the dK|dV partials). Parameter
 * gradients that ranks hold partially (the conv weight) are all-reduced
 * first. Rank 0 prints one line per tensor ("gdn o: rel err 3.1e-07 <= 1e-05
 * ok") and the exit code is 1 when any check fails.
 *
 *   gdn    cp_gdn_forward (without the kept chunk states: the whole chain at P = 2, the scan
 *          at P > 2), its remat recompute (no communication), cp_gdn_backward: o twice, dq|dk,
 *          dv, dg, dbeta, and the counters (one state pass each way, none in the recompute);
 *          then the same with kept buffers (checkpoint.gdn_keep), where each fragment's prep is
 *          computed once (gdn_chunk_prep) and read by its transition and forward: every output
 *          bitwise the run without, and the prep calls counted (the chain: one per fragment
 *          2 | 3, read by its forward, fragment 2's by its transition too; the scan: every
 *          fragment's); then with the chunk states kept (the staged schedules), the method
 *          cp_init chose (cp_gdn_method) and every other hybrid schedule of this P (the hybrid,
 *          and the chain of every fragment: cp_gdn_chain.c at P = 2, cp_gdn_hybrid.c above),
 *          six tensors each and their calls counted; at P = 2 also cp_gdn_hybrid.c chaining all
 *          four fragments, which must give the staged chain's bits
 *   kda    the same schedules on a Kimi Delta Attention core (CpGdnCore.kda, g per key channel): o, its
 *          recompute, dq|dk, dv, dg, dbeta and the state passes, without kept buffers and with them and their
 *          chunk states (at cp 2 the staged chain, above it the hybrid)
 *   conv   cp_gdn_halo_forward + conv1d per fragment; conv backward + cp_gdn_halo_backward:
 *          y, dx, dw
 *   ring   cp_ring_forward, cp_ring_backward: out, lse, dq, dk, dv, three times (Cp.ring_calls):
 *          the zigzag rule's calls one by one, one call per step and sample (ours), and auto with
 *          the cuDNN route's choice of fast calls; whole steps make fewer calls than pairs, auto
 *          between the two and as few as whole steps with one document (counted). At cp 2
 *          the backward reads the K|V its forward kept (parallel.ring_keep_kv), or with
 *          --ring-kv passed exchanges it again (ring-flash-attention's order); kept-twice ends
 *          with one more backward without its forward, which must be refused (exit non-zero)
 *
 * --sabotage-prep (gdn) spoils each prep the kept run computes (the last token's Tinv row scaled):
 * the kept run must then differ from the run without, proving the prep is read. --sabotage-fold
 * (gdn) makes the staged runs' gdn_state_affine use M^T for M and M for M^T: the hybrid's folded
 * entries and gradients must then fail (with short fragments, where M is far from symmetric).
 *
 * --sabotage breaks what CP delivers, to prove the checks can fail: gdn swaps
 * each rank's two fragments' entry states and exit gradients before the
 * core's last step (a wrong schedule), conv zeroes the received halo,
 * ring shifts the gathered positions of the other ranks' rows (a wrong
 * mask for every received block). Each must fail.
 *
 * DOCS names a document layout (check_docs below): "many" (documents of
 * 1..200 tokens), "aligned" (starts exactly on and one after fragment
 * boundaries), "one" (one document over everything, and a sample that starts
 * inside a document), "long" (documents longer than a fragment), "edges"
 * (each cp 2 fragment boundary starting a document in some sample, a reset
 * inside cp 2's fragment 2; meant for --samples 4).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/cudnn_graph.h"
#include "backend/backend.h"
#include "backend/runtime.h"
#include "comm/comm.h"
#include "config/config.h"
#include "cp/cp.h"
#include "cp/cp_gdn_hybrid.h"
#include "core/error.h"
#include "core/rng.h"

#define CHECK_BOUND 1e-5

typedef struct {
    Comm     *comm;
    Cp        cp;
    int64_t   T, S;               /* tokens per sample, samples */
    int32_t  *pos, *doc_pos;      /* (S, T) the whole batch */
    int32_t  *lpos, *ldoc;        /* (S, T_local) this rank's rows */
    Rng       rng;
    int       failed;
    int       sabotage;
    const char *docs;             /* the layout's name (check_docs) */
    int       backward_twice;     /* --ring-kv kept-twice: one more ring backward without its forward at the end */
} Check;

/* ---- inputs ------------------------------------------------------------------------- */

/* "edges": with q = T/4 (a cp 2 fragment, several of cp 4 and 8), sample s % 4 has documents starting at
 * q and inside the third quarter (2q + 10: a reset inside cp 2's fragment 2, M = 0); at 2q; at 3q; at
 * q, 2q and 3q: each cp 2 fragment boundary starts a document in some sample */
static int check_edge_starts(int64_t s, int64_t t, int64_t T) {
    const int64_t q = T / 4;
    switch (s % 4) {
    case 0: return t == q || t == 2 * q + 10;
    case 1: return t == 2 * q;
    case 2: return t == 3 * q;
    default: return t == q || t == 2 * q || t == 3 * q;
    }
}

static void check_docs(Check *c, const char *name) {
    for (int64_t s = 0; s < c->S; s++) {
        int32_t *pos = c->pos + s * c->T, *dp = c->doc_pos + s * c->T;
        int64_t frag = c->cp.L.frag_len;
        int32_t carry = s % 2 ? 37 : 0; /* odd samples start inside a document */
        if (!strcmp(name, "edges")) {
            for (int64_t t = 0; t < c->T; t++) {
                pos[t] = (int32_t)t;
                dp[t] = t == 0 ? carry : check_edge_starts(s, t, c->T) ? 0 : dp[t - 1] + 1;
            }
            continue;
        }
        int64_t next = 0;               /* where the next document starts */
        /* "aligned": starts on a fragment boundary (3f, 4f, 5f, 8f) and one after it (f+1, 4f+1),
         * documents of 1 token, shorter than, equal to and spanning several fragments */
        const int64_t pattern[6] = {frag + 1, 2 * frag - 1, frag, 1, frag - 1, 3 * frag};
        int k = 0;
        for (int64_t t = 0; t < c->T; t++) {
            pos[t] = (int32_t)t;
            if (t == next && t > 0) carry = 0;
            int starts = t == next;
            if (starts) {
                int64_t len;
                if (!strcmp(name, "many")) len = 1 + (int64_t)(rng_uniform(&c->rng) * 200);
                else if (!strcmp(name, "aligned")) len = pattern[k++ % 6];
                else if (!strcmp(name, "one")) len = c->T;
                else if (!strcmp(name, "long")) len = frag + 1 + (int64_t)(rng_uniform(&c->rng) * 2 * frag);
                else RS_USAGE("DOCS is many | aligned | one | long | edges", "unknown document layout '%s'", name);
                next = t + len;
            }
            dp[t] = starts && t > 0 ? 0 : (t == 0 ? carry : dp[t - 1] + 1);
        }
    }
}

static float *check_normal(Check *c, int64_t n, double scale) {
    float *x = RS_MALLOC((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        double v;
        do v = rng_normal(&c->rng); while (fabs(v) < 1e-3);
        x[i] = (float)(scale * v);
    }
    return x;
}

/* rows of the local layout <- rows of the whole batch (width w, every sample) */
static float *check_local(const Check *c, const float *global, int w) {
    const CpLayout *L = &c->cp.L;
    float *out = RS_MALLOC((size_t)(c->S * L->T_local * w) * sizeof(float));
    for (int64_t s = 0; s < c->S; s++)
        for (int f = 0; f < L->nlocal; f++)
            memcpy(out + (s * L->T_local + f * L->frag_len) * w,
                   global + (s * c->T + (int64_t)L->frag_global[f] * L->frag_len) * w,
                   (size_t)(L->frag_len * w) * sizeof(float));
    return out;
}

/* relative L2 of this rank's rows `got` (local layout) against the whole-batch `want`, over the world */
static void check_rows(Check *c, const char *what, const float *got, const float *want_global, int w) {
    float *want = check_local(c, want_global, w);
    int64_t n = c->S * c->cp.L.T_local * w;
    double sq[2] = {0, 0};
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        sq[0] += d * d;
        sq[1] += (double)want[i] * want[i];
    }
    free(want);
    comm_allreduce_sum_f64(c->comm, c->comm->world, sq, 2);
    double e = sq[1] > 0 ? sqrt(sq[0] / sq[1]) : sqrt(sq[0]);
    if (!(e <= CHECK_BOUND)) c->failed++;
    if (c->comm->rank == 0)
        printf("%s: rel err %.3e <= %.0e %s\n", what, e, CHECK_BOUND, e <= CHECK_BOUND ? "ok" : "FAIL");
}

static void check_whole(Check *c, const char *what, const float *got, const float *want, int64_t n) {
    double sq[2] = {0, 0};
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        sq[0] += d * d;
        sq[1] += (double)want[i] * want[i];
    }
    double e = sq[1] > 0 ? sqrt(sq[0] / sq[1]) : sqrt(sq[0]);
    if (!(e <= CHECK_BOUND)) c->failed++;
    if (c->comm->rank == 0)
        printf("%s: rel err %.3e <= %.0e %s\n", what, e, CHECK_BOUND, e <= CHECK_BOUND ? "ok" : "FAIL");
}

/* ---- Gated DeltaNet core ------------------------------------------------------------------ */

/* --sabotage for gdn: at the start of the core's last step (the chain's tail, the scan's chunk
 * pass), each sample's two local fragments trade their entry states (forward) or the gradients
 * arriving at their exits (backward): what a schedule that mixes up its states computes. */
typedef struct {
    float  *states, *dstate;
    int64_t n, hh;
    int     last; /* the core's last step */
} CheckSpoil;

static void check_spoil_mark(void *ctx, int pass, int t, int phase) {
    CheckSpoil *sp = ctx;
    float *x = pass == 0 ? sp->states : sp->dstate;
    (void)phase;
    if (t != sp->last) return;
    for (int64_t i = 0; i + 2 * sp->hh <= sp->n; i += 2 * sp->hh)
        for (int64_t j = 0; j < sp->hh; j++) {
            float tmp = x[i + j];
            x[i + j] = x[i + sp->hh + j];
            x[i + sp->hh + j] = tmp;
        }
}


/* The kept run's backend: backend_cpu with the prep, the forward and the transition counted (and, with
 * --sabotage-prep, each prep spoiled) */
static struct {
    double preps, prep_in, trans_kept; /* calls: gdn_chunk_prep, forwards told PREP_IN, transitions given kept */
    double stages, dstates;            /* calls: gdn_chunk_backward_stage, gdn_chunk_dstate */
    int    spoil;                      /* --sabotage-prep */
    int    flip;                       /* --sabotage-fold: every fold's product with M^T for M and M for M^T */
} check_prep;

static void check_be_dstate(float *dS0, const void *dout, const void *q, const void *k, const float *g,
                            const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int dv, int ldq,
                            int ldo, const void *kept, int kept_kind) {
    check_prep.dstates++;
    backend_cpu.gdn_chunk_dstate(dS0, dout, q, k, g, beta, doc_pos, T, nk, nv, dk, dv, ldq, ldo, kept, kept_kind);
}

static void check_be_affine(float *S_out, const float *M, const float *S_in, const float *H, int transpose_M, int nv,
                            int dk, int dv) {
    backend_cpu.gdn_state_affine(S_out, M, S_in, H, check_prep.flip ? !transpose_M : transpose_M, nv, dk, dv);
}

static void check_be_stage(int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0,
                           const void *dout, const float *dS_final, const void *q, const void *k, const void *v,
                           const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T,
                           int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept,
                           int kept_kind) {
    check_prep.stages++;
    backend_cpu.gdn_chunk_backward_stage(stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta,
                                         S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_kind);
}

static void check_be_prep(void *kept, const void *k, const void *v, const float *g, const float *beta,
                          const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int dv, int ldq, int ldv,
                          int kept_kind) {
    backend_cpu.gdn_chunk_prep(kept, k, v, g, beta, doc_pos, T, nk, nv, dk, dv, ldq, ldv, kept_kind);
    check_prep.preps++;
    float *row = (float *)kept + (T - 1) * nv * 64; /* cpu_gdn_kept_bytes' Tinv (T, nv, 64): the last token's */
    for (int i = 0; check_prep.spoil && i < nv * 64; i++) row[i] *= 1.5f;
}

static void check_be_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g,
                             const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv,
                             int dk, int dv, int ldq, int ldv, int ldo, void *kept, int kept_flags) {
    check_prep.prep_in += (kept_flags & GDN_KEPT_PREP_IN) != 0;
    backend_cpu.gdn_chunk_forward(o, S_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dk, dv, ldq, ldv, ldo, kept,
                                  kept_flags);
}

static void check_be_transition(float *M, float *H, const void *k, const void *v, const float *g, const float *beta,
                                const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int dv, int ldq, int ldv,
                                const void *kept, int kept_kind) {
    check_prep.trans_kept += kept != NULL;
    backend_cpu.gdn_chunk_transition(M, H, k, v, g, beta, doc_pos, T, nk, nv, dk, dv, ldq, ldv, kept, kept_kind);
}

/* 1 when any rank's n floats at a and b differ in a bit */
static int check_differs(Check *c, const float *a, const float *b, int64_t n) {
    return comm_allreduce_max_int(c->comm, c->comm->world, memcmp(a, b, (size_t)n * sizeof(float)) != 0);
}

static void check_gdn(Check *c, int nk, int nv, int dk, int dv) {
    const Backend *be = &backend_cpu;
    const CpLayout *L = &c->cp.L;
    const int64_t T = c->T, S = c->S, rows = S * L->T_local, Kd = (int64_t)nk * dk, Vd = (int64_t)nv * dv;
    const int ldq = (int)(2 * Kd);
    const int64_t hh = (int64_t)nv * dk * dv;
    /* inputs: [q | k] L2-normalised per head, v, g < 0 per head, beta in (0,1), dO */
    float *qk = check_normal(c, S * T * ldq, 1.0), *v = check_normal(c, S * T * Vd, 1.0);
    for (int64_t i = 0; i < S * T * 2 * nk; i++) {
        float *x = qk + i * dk;
        double ss = 0;
        for (int j = 0; j < dk; j++) ss += (double)x[j] * x[j];
        for (int j = 0; j < dk; j++) x[j] = (float)(x[j] / sqrt(ss + 1e-6));
    }
    float *g = RS_MALLOC((size_t)(S * T * nv) * sizeof(float)), *beta = RS_MALLOC((size_t)(S * T * nv) * sizeof(float));
    for (int64_t i = 0; i < S * T * nv; i++) {
        double a = 0.05 * (1 + i % nv); /* per-head decay */
        g[i] = (float)(-a * log1p(exp(rng_normal(&c->rng))));
        beta[i] = (float)(1.0 / (1.0 + exp(-rng_normal(&c->rng))));
    }
    float *dO = check_normal(c, S * T * Vd, 1.0);

    /* reference: one call per sample over the whole sample */
    float *o = RS_MALLOC((size_t)(S * T * Vd) * 4), *dqk = RS_MALLOC((size_t)(S * T * ldq) * 4);
    float *dv_ = RS_MALLOC((size_t)(S * T * Vd) * 4), *dg = RS_MALLOC((size_t)(S * T * nv) * 4);
    float *db = RS_MALLOC((size_t)(S * T * nv) * 4);
    for (int64_t s = 0; s < S; s++) {
        int64_t r = s * T;
        be->gdn_chunk_forward(o + r * Vd, NULL, qk + r * ldq, qk + r * ldq + Kd, v + r * Vd, g + r * nv, beta + r * nv,
                              NULL, c->doc_pos + r, T, nk, nv, dk, dv, ldq, (int)Vd, (int)Vd, NULL, 0);
        be->gdn_chunk_backward(dqk + r * ldq, dqk + r * ldq + Kd, dv_ + r * Vd, dg + r * nv, db + r * nv, NULL,
                               dO + r * Vd, NULL, qk + r * ldq, qk + r * ldq + Kd, v + r * Vd, g + r * nv,
                               beta + r * nv, NULL, c->doc_pos + r, T, nk, nv, dk, dv, ldq, (int)Vd, (int)Vd, NULL, 0);
    }

    /* CP: this rank's fragments */
    float *lqk = check_local(c, qk, ldq), *lv = check_local(c, v, (int)Vd), *lg = check_local(c, g, nv);
    float *lb = check_local(c, beta, nv), *ldO = check_local(c, dO, (int)Vd);
    float *states = RS_MALLOC((size_t)(S * L->nlocal * hh) * 4);
    float *M = RS_MALLOC((size_t)(S * L->nlocal * nv * dk * dk) * 4);
    float *lo = RS_MALLOC((size_t)(rows * Vd) * 4), *ldqk = RS_MALLOC((size_t)(rows * ldq) * 4);
    float *ldv = RS_MALLOC((size_t)(rows * Vd) * 4), *ldg = RS_MALLOC((size_t)(rows * nv) * 4);
    float *ldb = RS_MALLOC((size_t)(rows * nv) * 4);
    CpGdnDims d = {.nk = nk, .nv = nv, .dk = dk, .dv = dv, .Cc = 0, .Kc = 0};
    Cp *cp = &c->cp;
    const int multi = L->P > 1;
    CpGdnCore core = {.q = lqk, .k = lqk + Kd, .v = lv, .g = lg, .beta = lb, .ldq = ldq, .ldv = (int)Vd,
                      .ldo = (int)Vd, .states = multi ? states : NULL, .M = M};
    CpGdnGrads grads = {.dq = ldqk, .dk = ldqk + Kd, .dv = ldv, .dg = ldg, .dbeta = ldb, .dout = ldO};
    CheckSpoil spoil = {.states = states, .dstate = cp->dstate, .n = S * L->nlocal * hh, .hh = hh};
    cp_gdn_steps(cp, &spoil.last);
    spoil.last--;
    if (c->sabotage == 1) { /* a wrong schedule: each rank's two fragments trade what the CP group passed them */
        cp->step_mark = check_spoil_mark;
        cp->step_mark_ctx = &spoil;
    }
    cp_gdn_forward(cp, 0, lo, &core, 1, &d);
    check_rows(c, "gdn o", lo, o, (int)Vd);
    /* the remat recompute: from the entry states the forward kept, nothing communicated */
    float *again = RS_MALLOC((size_t)(rows * Vd) * 4);
    const int64_t passes = cp->count.scan_allgathers_fwd[0];
    cp_gdn_forward(cp, 0, again, &core, 0, &d);
    check_rows(c, "gdn o, recomputed", again, o, (int)Vd);
    free(again);
    cp_gdn_backward(cp, 0, &grads, &core, &d);
    check_rows(c, "gdn dq|dk", ldqk, dqk, ldq);
    check_rows(c, "gdn dv", ldv, dv_, (int)Vd);
    check_rows(c, "gdn dg", ldg, dg, nv);
    check_rows(c, "gdn dbeta", ldb, db, nv);
    /* one state pass each way with P > 1, none in the recompute; every fragment's forward counted */
    const int64_t fwd = cp->count.scan_allgathers_fwd[0], bwd = cp->count.scan_allgathers_bwd[0];
    const int64_t runs = cp->count.gdn_forwards[0], want = multi ? 1 : 0;
    const int ok = passes == want && fwd == want && bwd == want && runs == 2 * S * L->nlocal;
    if (!ok) c->failed++;
    if (c->comm->rank == 0)
        printf("gdn passes: forward %lld, after the recompute %lld, backward %lld (want %lld); fragment forwards "
               "%lld (want %lld) %s\n", (long long)passes, (long long)fwd, (long long)bwd, (long long)want,
               (long long)runs, (long long)(2 * S * L->nlocal), ok ? "ok" : "FAIL");

    /* again with kept buffers (cpu: Tinv), through the counting backend: the prep shared, the same bits */
    Backend counted = backend_cpu;
    counted.gdn_chunk_prep = check_be_prep;
    counted.gdn_chunk_forward = check_be_forward;
    counted.gdn_chunk_transition = check_be_transition;
    check_prep.spoil = c->sabotage == 2;
    const size_t kb = backend_cpu.gdn_kept_bytes(L->frag_len, nv, dk, dv, 0);
    float *ko = RS_MALLOC((size_t)(rows * Vd) * 4), *kagain = RS_MALLOC((size_t)(rows * Vd) * 4);
    float *kdqk = RS_MALLOC((size_t)(rows * ldq) * 4), *kdv = RS_MALLOC((size_t)(rows * Vd) * 4);
    float *kdg = RS_MALLOC((size_t)(rows * nv) * 4), *kdb = RS_MALLOC((size_t)(rows * nv) * 4);
    float *again0 = RS_MALLOC((size_t)(rows * Vd) * 4);
    CpGdnCore kcore = core;
    kcore.kept = RS_CALLOC((size_t)(S * L->nlocal), kb);
    kcore.kept_bytes = kb;
    CpGdnGrads kgrads = {.dq = kdqk, .dk = kdqk + Kd, .dv = kdv, .dg = kdg, .dbeta = kdb, .dout = ldO};
    cp->be = &counted;
    cp_gdn_forward(cp, 0, ko, &kcore, 1, &d);
    cp_gdn_forward(cp, 0, kagain, &kcore, 0, &d);
    cp_gdn_backward(cp, 0, &kgrads, &kcore, &d);
    cp->be = &backend_cpu;
    cp_gdn_forward(cp, 0, again0, &core, 0, &d); /* the run without kept's recompute, from the same states */
    const int differs = check_differs(c, ko, lo, rows * Vd) | check_differs(c, kagain, again0, rows * Vd) |
                        check_differs(c, kdqk, ldqk, rows * ldq) | check_differs(c, kdv, ldv, rows * Vd) |
                        check_differs(c, kdg, ldg, rows * nv) | check_differs(c, kdb, ldb, rows * nv);
    if (differs) c->failed++;
    double calls[3] = {check_prep.preps, check_prep.prep_in, check_prep.trans_kept};
    comm_allreduce_sum_f64(c->comm, c->comm->world, calls, 3);
    /* the chain: fragments 2 and 3 of each sample, fragment 2's transition; the scan: every fragment; P = 1: none */
    const double frags = (double)S * L->nglobal, want_prep = L->P == 2 ? 2.0 * S : L->P > 2 ? frags : 0;
    const double want_trans = L->P == 2 ? (double)S : L->P > 2 ? frags : 0;
    const int calls_ok = calls[0] == want_prep && calls[1] == want_prep && calls[2] == want_trans;
    if (!calls_ok) c->failed++;
    if (c->comm->rank == 0) {
        printf("gdn with kept buffers: o, o recomputed, dq|dk, dv, dg, dbeta bitwise the run without: %s\n",
               differs ? "FAIL" : "ok");
        printf("gdn prep: computed %.0f, read by forwards %.0f, by transitions %.0f (want %.0f, %.0f, %.0f) %s\n",
               calls[0], calls[1], calls[2], want_prep, want_prep, want_trans, calls_ok ? "ok" : "FAIL");
    }
    free(kcore.kept);

    /* the staged schedules (kept with its chunk states, checkpoint.gdn_keep: states; cp->gdn_dkept): the method
       cp_init chose (at P = 2 the chain, each hand-off after state passes alone), then the other hybrid schedules
       this P allows; each against the reference (another fp32 order), its calls counted */
    RS_CHECK(L->P != 2 || cp->gdn_dkept, "cp_check: cp_init gave the cp 2 chain no gdn_dkept");
    const CpGdnMethod chosen = cp->gdn_method;
    CpGdnMethod runs_m[3] = {chosen};
    int nm = 1;
    for (int m = CP_GDN_CHAIN; L->P > 1 && m <= CP_GDN_HYBRID; m++)
        if (m != (int)chosen) runs_m[nm++] = (CpGdnMethod)m;
    if (c->comm->rank == 0) {
        printf("gdn staged methods:");
        for (int k = 0; k < nm; k++) printf(" %s", cp_gdn_method_names[runs_m[k]]);
        printf(" (cp_gdn_method: %s)\n", cp_gdn_method_names[chosen]);
    }
    Backend staged = counted;
    staged.gdn_chunk_backward_stage = check_be_stage;
    staged.gdn_chunk_dstate = check_be_dstate;
    staged.gdn_state_affine = check_be_affine;
    const size_t kbs = backend_cpu.gdn_kept_bytes(L->frag_len, nv, dk, dv, 1);
    CpGdnCore score = core;
    score.kept = RS_CALLOC((size_t)(S * L->nlocal), kbs);
    score.kept_bytes = kbs;
    score.kept_kind = 1;
    for (int k = 0; k < nm; k++) {
        const CpGdnMethod m = runs_m[k];
        char label[64];
        snprintf(label, sizeof label, "(staged %s)", cp_gdn_method_names[m]);
        if (m != cp->gdn_method) cp_gdn_set_method(cp, m);
        memset(&check_prep, 0, sizeof check_prep);
        check_prep.spoil = c->sabotage == 2;
        check_prep.flip = c->sabotage == 3;
        cp->be = &staged;
        cp_gdn_forward(cp, 0, ko, &score, 1, &d);
        char what[128];
        snprintf(what, sizeof what, "gdn o %s", label);
        check_rows(c, what, ko, o, (int)Vd);
        cp_gdn_forward(cp, 0, kagain, &score, 0, &d);
        snprintf(what, sizeof what, "gdn o, recomputed %s", label);
        check_rows(c, what, kagain, o, (int)Vd);
        cp_gdn_backward(cp, 0, &kgrads, &score, &d);
        cp->be = &backend_cpu;
        snprintf(what, sizeof what, "gdn dq|dk %s", label);
        check_rows(c, what, kdqk, dqk, ldq);
        snprintf(what, sizeof what, "gdn dv %s", label);
        check_rows(c, what, kdv, dv_, (int)Vd);
        snprintf(what, sizeof what, "gdn dg %s", label);
        check_rows(c, what, kdg, dg, nv);
        snprintf(what, sizeof what, "gdn dbeta %s", label);
        check_rows(c, what, kdb, db, nv);
        double scalls[5] = {check_prep.preps, check_prep.prep_in, check_prep.trans_kept, check_prep.stages,
                            check_prep.dstates};
        comm_allreduce_sum_f64(c->comm, c->comm->world, scalls, 5);
        /* per sample: the cp 2 chain preps fragments 1 | 2 (rank 1) and 3 (rank 0), read by the state passes of 1 and
           2 and by fragment 3's forward, no transition, three stages for each of fragments 1, 2, 3. The hybrid code
           with C chained (P, or 2P - 1 for the chain at P >= 3): every fragment's prep but fragment 0's (inside its
           state pass) once, each read once; the transitions of fragments C .. 2P - 2; three stages for each chained
           fragment but fragment 0 (whole), the folded ones C .. 2P - 1 whole after their dL (chaining every fragment,
           none is folded: fragment 2P - 1 in stages too). The scan: every fragment's prep, transition and dL. */
        const int P = L->P, C = m == CP_GDN_HYBRID ? P : 2 * P - 1;
        const int hybrid = P > 1 && (m == CP_GDN_HYBRID || (m == CP_GDN_CHAIN && P > 2));
        const double fr = (double)S * (2 * P - 1);
        double swant[5] = {want_prep, want_prep, want_trans, 0, P > 1 ? frags : 0};
        if (P == 2 && m == CP_GDN_CHAIN) {
            const double w[5] = {3.0 * S, 3.0 * S, 0, 9.0 * S, 0};
            memcpy(swant, w, sizeof w);
        } else if (hybrid) {
            const int gather = C <= 2 * P - 2, staged_b = gather ? C - P : P;
            const double w[5] = {fr, fr, (double)S * (2 * P - 1 - C), 3.0 * S * (P - 1 + staged_b),
                                 (double)S * (gather ? 2 * P - C : 0)};
            memcpy(swant, w, sizeof w);
        }
        const int scalls_ok = !memcmp(scalls, swant, sizeof scalls);
        if (!scalls_ok) c->failed++;
        if (c->comm->rank == 0)
            printf("gdn staged %s: prep computed %.0f, read by forwards %.0f, transitions %.0f, backward stages %.0f, "
                   "dL passes %.0f (want %.0f, %.0f, %.0f, %.0f, %.0f) %s\n", cp_gdn_method_names[m], scalls[0],
                   scalls[1], scalls[2], scalls[3], scalls[4], swant[0], swant[1], swant[2], swant[3], swant[4],
                   scalls_ok ? "ok" : "FAIL");
        if (P == 2 && m == CP_GDN_CHAIN && !c->sabotage) { /* the hybrid code chaining all four fragments: these bits */
            float *bits[6] = {ko, kagain, kdqk, kdv, kdg, kdb};
            const int64_t len[6] = {rows * Vd, rows * Vd, rows * ldq, rows * Vd, rows * nv, rows * nv};
            float *keep[6];
            for (int b = 0; b < 6; b++) {
                keep[b] = RS_MALLOC((size_t)len[b] * 4);
                memcpy(keep[b], bits[b], (size_t)len[b] * 4);
            }
            cp->be = &staged;
            cp_hybrid_forward(cp, 0, ko, &score, 3, &d);
            cp_gdn_forward(cp, 0, kagain, &score, 0, &d);
            cp_hybrid_backward(cp, 0, &kgrads, &score, 3, &d);
            cp->be = &backend_cpu;
            int diff = 0;
            for (int b = 0; b < 6; b++) {
                diff |= check_differs(c, bits[b], keep[b], len[b]);
                free(keep[b]);
            }
            if (diff) c->failed++;
            if (c->comm->rank == 0)
                printf("gdn hybrid code chaining all 4 fragments: o, o recomputed, dq|dk, dv, dg, dbeta bitwise the "
                       "staged chain: %s\n", diff ? "FAIL" : "ok");
        }
    }
    cp_gdn_set_method(cp, chosen);
    free(score.kept);
    float *bufs[] = {qk, v,   g,    beta, dO,  o,   dqk,   dv_,    dg,   db,   lqk,  lv,  lg,  lb,    ldO,   states,
                     M,  lo,  ldqk, ldv,  ldg, ldb, ko, kagain, kdqk, kdv, kdg, kdb, again0};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* ---- Kimi Delta Attention core (the same schedules, CpGdnCore.kda: g per key channel) ------------------ */

/* cp_gdn_forward, its remat recompute and cp_gdn_backward on a KDA core against one kda_chunk_* call per sample;
 * then the same with kept buffers and the chunk states (cp 2: the staged chain, where cp_init gave gdn_dkept) */
static void check_kda(Check *c, int nk, int nv, int dk, int dv) {
    const Backend *be = &backend_cpu;
    const CpLayout *L = &c->cp.L;
    const int64_t T = c->T, S = c->S, rows = S * L->T_local, Kd = (int64_t)nk * dk, Vd = (int64_t)nv * dv;
    const int ldq = (int)(2 * Kd), gw = nv * dk;
    const int64_t hh = (int64_t)nv * dk * dv;
    float *qk = check_normal(c, S * T * ldq, 1.0), *v = check_normal(c, S * T * Vd, 1.0);
    for (int64_t i = 0; i < S * T * 2 * nk; i++) {
        float *x = qk + i * dk;
        double ss = 0;
        for (int j = 0; j < dk; j++) ss += (double)x[j] * x[j];
        for (int j = 0; j < dk; j++) x[j] = (float)(x[j] / sqrt(ss + 1e-6));
    }
    float *g = RS_MALLOC((size_t)(S * T * gw) * 4), *beta = RS_MALLOC((size_t)(S * T * nv) * 4);
    for (int64_t i = 0; i < S * T * gw; i++) /* a decay per key channel, heads and channels apart */
        g[i] = (float)(-0.05 * (1 + (i / dk) % nv) * log1p(exp(rng_normal(&c->rng))));
    for (int64_t i = 0; i < S * T * nv; i++) beta[i] = (float)(1.0 / (1.0 + exp(-rng_normal(&c->rng))));
    float *dO = check_normal(c, S * T * Vd, 1.0);
    float *o = RS_MALLOC((size_t)(S * T * Vd) * 4), *dqk = RS_MALLOC((size_t)(S * T * ldq) * 4);
    float *dv_ = RS_MALLOC((size_t)(S * T * Vd) * 4), *dg = RS_MALLOC((size_t)(S * T * gw) * 4);
    float *db = RS_MALLOC((size_t)(S * T * nv) * 4);
    for (int64_t s = 0; s < S; s++) {
        int64_t r = s * T;
        be->kda_chunk_forward(o + r * Vd, NULL, qk + r * ldq, qk + r * ldq + Kd, v + r * Vd, g + r * gw, beta + r * nv,
                              NULL, c->doc_pos + r, T, nk, nv, dk, dv, ldq, (int)Vd, (int)Vd, NULL, 0);
        be->kda_chunk_backward(dqk + r * ldq, dqk + r * ldq + Kd, dv_ + r * Vd, dg + r * gw, db + r * nv, NULL,
                               dO + r * Vd, NULL, qk + r * ldq, qk + r * ldq + Kd, v + r * Vd, g + r * gw,
                               beta + r * nv, NULL, c->doc_pos + r, T, nk, nv, dk, dv, ldq, (int)Vd, (int)Vd, NULL, 0);
    }
    float *lqk = check_local(c, qk, ldq), *lv = check_local(c, v, (int)Vd), *lg = check_local(c, g, gw);
    float *lb = check_local(c, beta, nv), *ldO = check_local(c, dO, (int)Vd);
    float *states = RS_MALLOC((size_t)(S * L->nlocal * hh) * 4);
    float *M = RS_MALLOC((size_t)(S * L->nlocal * nv * dk * dk) * 4);
    float *lo = RS_MALLOC((size_t)(rows * Vd) * 4), *again = RS_MALLOC((size_t)(rows * Vd) * 4);
    float *ldqk = RS_MALLOC((size_t)(rows * ldq) * 4), *ldv = RS_MALLOC((size_t)(rows * Vd) * 4);
    float *ldg = RS_MALLOC((size_t)(rows * gw) * 4), *ldb = RS_MALLOC((size_t)(rows * nv) * 4);
    CpGdnDims d = {.nk = nk, .nv = nv, .dk = dk, .dv = dv, .Cc = 0, .Kc = 0};
    Cp *cp = &c->cp;
    const int multi = L->P > 1;
    CheckSpoil spoil = {.states = states, .dstate = cp->dstate, .n = S * L->nlocal * hh, .hh = hh};
    cp_gdn_steps(cp, &spoil.last);
    spoil.last--;
    if (c->sabotage == 1) {
        cp->step_mark = check_spoil_mark;
        cp->step_mark_ctx = &spoil;
    }
    const size_t kbs = be->kda_kept_bytes(L->frag_len, nv, dk, dv, 1);
    for (int kept = 0; kept < 2; kept++) { /* without kept buffers, then with them and their chunk states */
        CpGdnCore core = {.q = lqk, .k = lqk + Kd, .v = lv, .g = lg, .beta = lb, .ldq = ldq, .ldv = (int)Vd,
                          .ldo = (int)Vd, .states = multi ? states : NULL, .M = M, .kda = 1};
        if (kept) {
            core.kept = RS_CALLOC((size_t)(S * L->nlocal), kbs);
            core.kept_bytes = kbs;
            core.kept_kind = 1;
        }
        CpGdnGrads grads = {.dq = ldqk, .dk = ldqk + Kd, .dv = ldv, .dg = ldg, .dbeta = ldb, .dout = ldO};
        const char *tag = kept ? (L->P == 2 && cp->gdn_dkept ? " (kept, staged chain)" : " (kept)") : "";
        char name[96];
        cp_counters_reset(cp);
        cp_gdn_forward(cp, 0, lo, &core, 1, &d);
        snprintf(name, sizeof name, "kda o%s", tag);
        check_rows(c, name, lo, o, (int)Vd);
        const int64_t passes = cp->count.scan_allgathers_fwd[0];
        cp_gdn_forward(cp, 0, again, &core, 0, &d);
        snprintf(name, sizeof name, "kda o, recomputed%s", tag);
        check_rows(c, name, again, o, (int)Vd);
        cp_gdn_backward(cp, 0, &grads, &core, &d);
        snprintf(name, sizeof name, "kda dq|dk%s", tag);
        check_rows(c, name, ldqk, dqk, ldq);
        snprintf(name, sizeof name, "kda dv%s", tag);
        check_rows(c, name, ldv, dv_, (int)Vd);
        snprintf(name, sizeof name, "kda dg (per key channel)%s", tag);
        check_rows(c, name, ldg, dg, gw);
        snprintf(name, sizeof name, "kda dbeta%s", tag);
        check_rows(c, name, ldb, db, nv);
        const int64_t want = multi ? 1 : 0, fwd = cp->count.scan_allgathers_fwd[0];
        const int ok = passes == want && fwd == want && cp->count.scan_allgathers_bwd[0] == want;
        if (!ok) c->failed++;
        if (c->comm->rank == 0)
            printf("kda passes%s: forward %lld, after the recompute %lld, backward %lld (want %lld) %s\n", tag,
                   (long long)passes, (long long)fwd, (long long)cp->count.scan_allgathers_bwd[0], (long long)want,
                   ok ? "ok" : "FAIL");
        free(core.kept);
    }
    float *bufs[] = {qk, v, g, beta, dO, o, dqk, dv_, dg, db, lqk, lv, lg, lb, ldO, states, M, lo, again, ldqk, ldv,
                     ldg, ldb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* ---- conv halo ------------------------------------------------------------------------------ */

static void check_conv(Check *c, int C, int Kc) {
    const Backend *be = &backend_cpu;
    const CpLayout *L = &c->cp.L;
    const int64_t T = c->T, S = c->S, rows = S * L->T_local, tail = (int64_t)(Kc - 1) * C;
    const int ldi = C + 3; /* the pre-conv input inside a wider projection row */
    float *x = check_normal(c, S * T * ldi, 1.0), *w = check_normal(c, (int64_t)C * Kc, 0.5);
    float *dy = check_normal(c, S * T * C, 1.0);
    float *y = RS_MALLOC((size_t)(S * T * C) * 4), *dx = RS_CALLOC((size_t)(S * T * ldi), 4);
    float *dw = RS_CALLOC((size_t)C * Kc, 4);
    for (int64_t s = 0; s < S; s++) {
        int64_t r = s * T;
        be->conv1d_silu_forward(y + r * C, x + r * ldi, NULL, w, c->doc_pos + r, T, C, Kc, ldi, C);
        be->conv1d_silu_backward(dx + r * ldi, NULL, dw, dy + r * C, x + r * ldi, NULL, w, c->doc_pos + r, T, C, Kc,
                                 ldi, C);
    }
    Cp *cp = &c->cp;
    const int multi = L->P > 1;
    float *lx = check_local(c, x, ldi), *ldy = check_local(c, dy, C);
    float *halo = RS_MALLOC((size_t)(S * L->nlocal * tail) * 4);
    float *ly = RS_MALLOC((size_t)(rows * C) * 4), *ldx = RS_CALLOC((size_t)(rows * ldi), 4);
    float *ldw = RS_CALLOC((size_t)C * Kc, 4);
    CpGdnDims d = {.Cc = C, .Kc = Kc};
    if (multi) cp_gdn_halo_forward(cp, 0, halo, lx, ldi, &d);
    if (c->sabotage) memset(halo, 0, (size_t)(S * L->nlocal * tail) * 4);
    for (int64_t s = 0; s < S; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t r = cp_frag_row(cp, (int)s, f), i = s * L->nlocal + f;
            be->conv1d_silu_forward(ly + r * C, lx + r * ldi, multi ? halo + i * tail : NULL, w, c->ldoc + r,
                                    L->frag_len, C, Kc, ldi, C);
        }
    check_rows(c, "conv y", ly, y, C);
    for (int64_t s = 0; s < S; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t r = cp_frag_row(cp, (int)s, f), i = s * L->nlocal + f;
            be->conv1d_silu_backward(ldx + r * ldi, multi ? (float *)cp->halo_send + i * tail : NULL, ldw,
                                     ldy + r * C, lx + r * ldi, multi ? halo + i * tail : NULL, w, c->ldoc + r,
                                     L->frag_len, C, Kc, ldi, C);
        }
    if (multi) cp_gdn_halo_backward(cp, 0, ldx, ldi, cp->halo_send, &d);
    check_rows(c, "conv dx", ldx, dx, ldi);
    comm_allreduce_sum_f32(c->comm, c->comm->world, ldw, (int64_t)C * Kc);
    check_whole(c, "conv dw (summed over ranks)", ldw, dw, (int64_t)C * Kc);
    float *bufs[] = {x, w, dy, y, dx, dw, lx, ldy, halo, ly, ldx, ldw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* ---- ring attention ------------------------------------------------------------------------- */

static void check_ring(Check *c, int nh, int nkv, int hd) {
    const Backend *be = &backend_cpu;
    const CpLayout *L = &c->cp.L;
    const int64_t T = c->T, S = c->S, rows = S * L->T_local;
    const int qd = nh * hd, kvd = nkv * hd, ldk = 2 * kvd;
    float *q = check_normal(c, S * T * qd, 1.0), *kv = check_normal(c, S * T * ldk, 1.0);
    float *dout = check_normal(c, S * T * qd, 1.0);
    float *out = RS_MALLOC((size_t)(S * T * qd) * 4), *lse = RS_MALLOC((size_t)(S * T * nh) * 4);
    float *dq = RS_CALLOC((size_t)(S * T * qd), 4), *dkv = RS_CALLOC((size_t)(S * T * ldk), 4);
    for (int64_t s = 0; s < S; s++) {
        int64_t r = s * T;
        be->attention_forward(out + r * qd, lse + r * nh, q + r * qd, kv + r * ldk, kv + r * ldk + kvd, c->pos + r,
                              c->doc_pos + r, c->pos + r, c->doc_pos + r, NULL, T, T, nh, nkv, hd, qd, ldk, qd, 1);
        be->attention_backward(dq + r * qd, dkv + r * ldk, dkv + r * ldk + kvd, dout + r * qd, out + r * qd,
                               lse + r * nh, q + r * qd, kv + r * ldk, kv + r * ldk + kvd, c->pos + r, c->doc_pos + r,
                               c->pos + r, c->doc_pos + r, NULL, T, T, nh, nkv, hd, qd, ldk, qd, 1);
    }
    float *lq = check_local(c, q, qd), *lkv = check_local(c, kv, ldk), *ldout = check_local(c, dout, qd);
    float *lout = RS_MALLOC((size_t)(rows * qd) * 4), *llse = RS_MALLOC((size_t)(rows * nh) * 4);
    float *ldq = RS_MALLOC((size_t)(rows * qd) * 4), *ldkv = RS_MALLOC((size_t)(rows * ldk) * 4);
    CpAttnDims d = {.nh = nh, .nkv = nkv, .hd = hd};
    if (c->sabotage) /* every other rank's rows one position later: the masks of received blocks go wrong */
        for (int r = 0; r < L->P; r++)
            for (int64_t i = 0; r != L->rank && i < rows; i++) {
                c->cp.batch.pos[(int64_t)r * rows + i]++;
                c->cp.batch.pos_dev[(int64_t)r * rows + i]++; /* host memory on the cpu backend */
            }
    /* the zigzag rule's calls one by one, one call per step and sample (ours), and auto with the cuDNN
       route's choice of fast calls (cdg_route_fast, the cuda route's attention_fast): each against the
       reference; whole steps must make fewer calls (at most one per step and sample) where there is more than
       one rank, auto as many as whole steps with one document, and never fewer nor more than the two */
    static const RingCalls how[3] = {RING_CALLS_PAIRS, RING_CALLS_STEPS, RING_CALLS_AUTO};
    Backend routed = backend_cpu;
    routed.attention_fast = cdg_route_fast;
    int calls[3], most[3];
    for (int m = 0; m < 3; m++) {
        char name[64];
        c->cp.ring_calls = how[m];
        c->cp.be = how[m] == RING_CALLS_AUTO ? &routed : be;
        const int64_t calls0 = c->cp.count.attn_kernel_calls[1];
        cp_ring_forward(&c->cp, 1, lout, llse, lq, lkv, &d);
        calls[m] = (int)comm_allreduce_sum_scalar(c->comm, c->comm->world,
                                                  (double)(c->cp.count.attn_kernel_calls[1] - calls0));
        most[m] = comm_allreduce_max_int(c->comm, c->comm->world, (int)(c->cp.count.attn_kernel_calls[1] - calls0));
        const char *what[4] = {"out", "lse", "dq", "dk|dv"};
#define RING_NAME(i) (snprintf(name, sizeof name, "ring %s (%s)", what[i], ring_calls_names[how[m]]), name)
        check_rows(c, RING_NAME(0), lout, out, qd);
        check_rows(c, RING_NAME(1), llse, lse, nh);
        memset(ldq, 0, (size_t)(rows * qd) * 4);
        memset(ldkv, 0, (size_t)(rows * ldk) * 4);
        cp_ring_backward(&c->cp, 1, ldq, ldkv, ldout, lout, llse, lq, lkv, &d);
        check_rows(c, RING_NAME(2), ldq, dq, qd);
        check_rows(c, RING_NAME(3), ldkv, dkv, ldk);
#undef RING_NAME
    }
    c->cp.be = be;
    const int calls_ok = most[1] <= S * L->P && (L->P == 1 || calls[1] < calls[0]) && calls[1] <= calls[2] &&
                         calls[2] <= calls[0] && (strcmp(c->docs, "one") || calls[2] == calls[1]);
    if (c->comm->rank == 0)
        printf("ring forward calls over the ranks: pairs %d, whole steps %d (at most %d on a rank, bound %lld), "
               "auto with cuDNN's route %d; the backward's K|V %s %s\n",
               calls[0], calls[1], most[1], (long long)(S * L->P), calls[2],
               c->cp.ring_keep_kv ? "kept from the forward" : "passed", calls_ok ? "ok" : "FAIL");
    if (!calls_ok) c->failed++;
    if (c->backward_twice) { /* the kept K|V was read: a second backward must be refused, not run on it */
        if (c->comm->rank == 0) printf("ring backward again without its forward (must be refused)\n");
        fflush(stdout);
        cp_ring_backward(&c->cp, 1, ldq, ldkv, ldout, lout, llse, lq, lkv, &d);
        if (c->comm->rank == 0) printf("ring backward again: ran, FAIL\n");
        c->failed++;
    }
    float *bufs[] = {q, kv, dout, out, lse, dq, dkv, lq, lkv, ldout, lout, llse, ldq, ldkv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

int main(int argc, char **argv) {
    Comm comm;
    comm_init(&comm, &argc, &argv);
    if (argc < 3)
        RS_USAGE(NULL, "usage: cp_check gdn|kda|conv|ring DOCS [--samples S] [--seq-len T] [--seed N] [--sabotage] "
                       "[--sabotage-prep] [--sabotage-fold] [--ring-kv kept|passed|kept-twice]");
    const char *what = argv[1], *docs = argv[2];
    int64_t S = 2, T = 1024, seed = 7;
    int sabotage = 0, keep_kv = 1, twice = 0;
    for (int i = 3; i < argc; i += 2) {
        const int flag = !strcmp(argv[i], "--sabotage") || !strcmp(argv[i], "--sabotage-prep") ||
                         !strcmp(argv[i], "--sabotage-fold");
        if (i + 1 == argc && !flag) RS_USAGE(NULL, "%s needs a value", argv[i]);
        if (!strcmp(argv[i], "--samples")) S = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq-len")) T = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--ring-kv") && (!strcmp(argv[i + 1], "kept") || !strcmp(argv[i + 1], "passed") ||
                                                   !strcmp(argv[i + 1], "kept-twice"))) {
            keep_kv = strcmp(argv[i + 1], "passed") != 0;
            twice = !strcmp(argv[i + 1], "kept-twice");
        }
        else if (flag) {
            sabotage = !strcmp(argv[i], "--sabotage") ? 1 : !strcmp(argv[i], "--sabotage-prep") ? 2 : 3;
            i--;
        }
        else RS_USAGE(NULL, "unknown argument %s", argv[i]);
    }
    /* a small model: the CP buffers are sized from the config's dims */
    Config cfg;
    config_init_defaults(&cfg);
    ModelConfig *m = &cfg.model;
    m->hidden_size = 64;
    m->num_attention_heads = 4;
    m->num_key_value_heads = 2;
    m->head_dim = 16;
    m->linear_num_key_heads = 2;
    m->linear_num_value_heads = 4;
    m->linear_key_head_dim = 16;
    m->linear_value_head_dim = 8;
    m->linear_conv_kernel_dim = 4;
    m->num_hidden_layers = 2; /* layer 0 GDN (KDA with "kda"), layer 1 attention */
    if (!strcmp(what, "kda")) m->linear_attention = LINEAR_ATTN_KDA; /* cp_init sizes its buffers by the backend's */
    m->full_attention_interval = 2;
    cfg.data.seq_len = T;
    cfg.data.micro_batch = S;
    cfg.parallel.cp = comm.world_size;
    cfg.parallel.dp = 1;
    cfg.parallel.ring_keep_kv = keep_kv;
    char why[4096];
    if (!runtime_open(&cfg, &comm, why, sizeof why)) RS_USAGE(NULL, "%s", why); /* cpu: the groups, BLAS threads */

    Check c = {.comm = &comm, .T = T, .S = S, .sabotage = sabotage, .docs = docs, .backward_twice = twice};
    rng_init(&c.rng, (uint64_t)seed, 0);
    cp_init(&c.cp, &comm, &backend_cpu, &cfg);
    c.pos = RS_MALLOC((size_t)(S * T) * 4);
    c.doc_pos = RS_MALLOC((size_t)(S * T) * 4);
    check_docs(&c, docs);
    c.lpos = RS_MALLOC((size_t)(S * c.cp.L.T_local) * 4);
    c.ldoc = RS_MALLOC((size_t)(S * c.cp.L.T_local) * 4);
    for (int64_t s = 0; s < S; s++)
        for (int f = 0; f < c.cp.L.nlocal; f++) {
            int64_t o = s * c.cp.L.T_local + f * c.cp.L.frag_len, gsrc = s * T + (int64_t)c.cp.L.frag_global[f] * c.cp.L.frag_len;
            memcpy(c.lpos + o, c.pos + gsrc, (size_t)c.cp.L.frag_len * 4);
            memcpy(c.ldoc + o, c.doc_pos + gsrc, (size_t)c.cp.L.frag_len * 4);
        }
    cp_batch_begin(&c.cp, 0, c.lpos, c.ldoc);
    if (comm.rank == 0) printf("cp_check %s %s: cp %d, %lld samples of %lld tokens\n", what, docs, comm.world_size,
                               (long long)S, (long long)T);
    if (!strcmp(what, "gdn")) check_gdn(&c, 2, 4, 16, 8);
    else if (!strcmp(what, "kda")) check_kda(&c, 2, 4, 16, 8);
    else if (!strcmp(what, "conv")) check_conv(&c, 2 * 2 * 16 + 4 * 8, 4);
    else if (!strcmp(what, "ring")) check_ring(&c, 4, 2, 16);
    else RS_USAGE(NULL, "cp_check: first argument is gdn | kda | conv | ring, not '%s'", what);
    int failed = comm_allreduce_max_int(&comm, comm.world, c.failed);
    cp_free(&c.cp);
    free(c.pos);
    free(c.doc_pos);
    free(c.lpos);
    free(c.ldoc);
    comm_finalize(&comm);
    return failed ? 1 : 0;
}
