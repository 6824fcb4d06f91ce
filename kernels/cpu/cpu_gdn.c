/*
 * cpu_gdn.c — the chunked gated delta rule on the cpu backend: the Backend entries gdn_chunk_forward /
 * gdn_chunk_backward (lib/backend/backend.h, "chunked gated delta rule") and the context-parallel
 * transition cpu_gdn_chunk_transition (cpu_kernels.h). This is the oracle the cuda kernels are checked
 * against, so it is plain loops in a fixed order, no threads. Callers: backend_cpu.c (the table),
 * lib/cp/cp_gdn.c (the transition), tests/unit/test_gdn.c.
 *
 * Per value head h (key head h / (nv/nk)) the tokens are cut into chunks of at most C = 64 rows: a new
 * sub-sequence starts at every token with doc_pos == 0 and is chunked from its own first token. Each
 * chunk runs the WY form (gate cumsum G, A, Tinv = (I + A)^-1 by forward substitution, W, U,
 * vn = U - W S, the outputs, S_out = gam_{L-1} S + K^T (dec * vn)); the backward runs the chunks from
 * the last down with D = dL/dS_out, cut to 0 at every chunk that starts a document, and returns what is
 * left at token 0 as dS0. The formulas, forward and backward, and why they equal the per-token
 * recurrence: docs/design/gdn-kernels.md ("The WY form of one chunk").
 *
 * Numerics: every gate factor is e^{later - earlier} <= 1 (g <= 0); the upper triangle of Gam is
 * selected to 0, never evaluated, so no positive exponent reaches exp. The chunk-local cumsum G, the
 * factors' exponents and dL/dG with its reverse cumsum are double (with strong decay G reaches -300 in
 * a chunk, and dG's terms cancel); the factors, all states and every other sum are fp32, fixed order.
 *
 * Contract notes: these entries have no workspace in backend.h and need one (per-chunk WY scratch, the
 * state entering every chunk of one head), so they RS_MALLOC it and free it before returning. doc_pos
 * must be a valid layout inside the call (doc_pos[t] == 0 or doc_pos[t-1] + 1; anything else, e.g. two
 * zigzag fragments as one call, is fatal). T == 0 is allowed. The kept buffer holds Tinv
 * (cpu_gdn_kept_bytes): a backward reading it gives the bits of one that substitutes again, and a forward
 * told GDN_KEPT_PREP_IN, a transition and a dstate given it copy Tinv instead of substituting (the cuda
 * backend keeps W, U and optionally the chunk states: each backend its own format; here kept_kind
 * changes nothing, the oracle's fp32 states are cheap beside its own products).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "core/error.h"

#define GDN_C 64 /* chunk size */

/* Scratch for one chunk of one value head: the gathered rows, the WY factors and (backward)
 * the gradients of the chunk. Matrices are row-major with row stride GDN_C, dk, dv or ncol. */
typedef struct GdnWork {
    int    dk, dv, ncol;           /* ncol: columns of the carried state (dv, or dv+dk in the transition) */
    int    L;                      /* rows of the current chunk, 1..GDN_C */
    float *q, *k;                  /* (GDN_C, dk) the chunk's rows of q, k (q unscaled) */
    float *v;                      /* (GDN_C, dv) */
    float *beta;                   /* (GDN_C) */
    double *G;                     /* (GDN_C) chunk-local cumulative log gate */
    float *gam, *dec;              /* (GDN_C) e^{G_r}, e^{G_{L-1} - G_r} */
    float *Gam;                    /* (GDN_C, GDN_C) e^{G_r - G_j} for j <= r, 0 above */
    float *KK, *QK;                /* (GDN_C, GDN_C) k_i.k_j (j < i), q_i.k_j (j <= i) */
    float *A;                      /* (GDN_C, GDN_C) beta_i k_i.k_j Gam_ij, strictly lower */
    float *Tinv;                   /* (GDN_C, GDN_C) (I + A)^-1, unit lower triangular */
    float *W;                      /* (GDN_C, dk) */
    float *U;                      /* (GDN_C, dv) */
    float *vn;                     /* (GDN_C, ncol) v_new = [U | 0] - W X */
    /* backward only */
    float *dO;                     /* (GDN_C, dv) the chunk's output-gradient rows */
    float *dvn;                    /* (GDN_C, dv) dL/dvn = dL/dU */
    float *dW, *dXw;               /* (GDN_C, dk) */
    float *dXu;                    /* (GDN_C, dv) */
    float *dqc, *dkc, *dvc;        /* (GDN_C, dk), (GDN_C, dk), (GDN_C, dv) gradients of the chunk's rows */
    float *P, *dP, *dT, *M1, *dA;  /* (GDN_C, GDN_C) */
    double *dG;                    /* (GDN_C) dL/dG */
    float *dbeta;                  /* (GDN_C) */
    float *Din;                    /* (dk, dv) dL/dS entering the chunk */
} GdnWork;

static void gdn_work_init(GdnWork *w, int dk, int dv, int ncol, int backward) {
    memset(w, 0, sizeof(*w));
    w->dk = dk;
    w->dv = dv;
    w->ncol = ncol;
    const size_t C = GDN_C, CC = (size_t)GDN_C * GDN_C, f = sizeof(float);
    w->q = RS_MALLOC(C * dk * f);
    w->k = RS_MALLOC(C * dk * f);
    w->v = RS_MALLOC(C * dv * f);
    w->beta = RS_MALLOC(C * f);
    w->G = RS_MALLOC(C * sizeof(double));
    w->gam = RS_MALLOC(C * f);
    w->dec = RS_MALLOC(C * f);
    w->Gam = RS_MALLOC(CC * f);
    w->KK = RS_MALLOC(CC * f);
    w->QK = RS_MALLOC(CC * f);
    w->A = RS_MALLOC(CC * f);
    w->Tinv = RS_MALLOC(CC * f);
    w->W = RS_MALLOC(C * dk * f);
    w->U = RS_MALLOC(C * dv * f);
    w->vn = RS_MALLOC(C * (size_t)ncol * f);
    if (!backward) return;
    w->dO = RS_MALLOC(C * dv * f);
    w->dvn = RS_MALLOC(C * dv * f);
    w->dW = RS_MALLOC(C * dk * f);
    w->dXw = RS_MALLOC(C * dk * f);
    w->dXu = RS_MALLOC(C * dv * f);
    w->dqc = RS_MALLOC(C * dk * f);
    w->dkc = RS_MALLOC(C * dk * f);
    w->dvc = RS_MALLOC(C * dv * f);
    w->P = RS_MALLOC(CC * f);
    w->dP = RS_MALLOC(CC * f);
    w->dT = RS_MALLOC(CC * f);
    w->M1 = RS_MALLOC(CC * f);
    w->dA = RS_MALLOC(CC * f);
    w->dG = RS_MALLOC(C * sizeof(double));
    w->dbeta = RS_MALLOC(C * f);
    w->Din = RS_MALLOC((size_t)dk * dv * f);
}

static void gdn_work_free(GdnWork *w) {
    float *fs[] = {w->q, w->k, w->v, w->beta, w->gam, w->dec, w->Gam, w->KK, w->QK, w->A, w->Tinv, w->W, w->U,
                   w->vn, w->dO, w->dvn, w->dW, w->dXw, w->dXu, w->dqc, w->dkc, w->dvc, w->P, w->dP, w->dT, w->M1,
                   w->dA, w->dbeta, w->Din};
    for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++) free(fs[i]);
    free(w->G);
    free(w->dG);
    memset(w, 0, sizeof(*w));
}

static float gdn_dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y[0..n) += a * x[0..n) */
static void gdn_axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static void gdn_check_args(const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                           int ldv) {
    RS_CHECK(T >= 0, "gdn: T = %lld", (long long)T);
    RS_CHECK(nk > 0 && nv > 0 && nv % nk == 0, "gdn: nk = %d, nv = %d (nv must be a multiple of nk)", nk, nv);
    RS_CHECK(dim_k > 0 && dim_v > 0, "gdn: dim_k = %d, dim_v = %d", dim_k, dim_v);
    RS_CHECK((int64_t)ldq >= (int64_t)nk * dim_k, "gdn: ldq = %d < nk*dim_k = %d", ldq, nk * dim_k);
    RS_CHECK((int64_t)ldv >= (int64_t)nv * dim_v, "gdn: ldv = %d < nv*dim_v = %d", ldv, nv * dim_v);
    RS_CHECK(T == 0 || doc_pos != NULL, "gdn: doc_pos is NULL");
    for (int64_t t = 0; t < T; t++)
        RS_CHECK(doc_pos[t] >= 0 && (t == 0 || doc_pos[t] == 0 || doc_pos[t] == doc_pos[t - 1] + 1),
                 "gdn: doc_pos[%lld] = %d after doc_pos[%lld] = %d: inside one call a token either starts a "
                 "document (0) or follows its predecessor (+1)",
                 (long long)t, doc_pos[t], (long long)(t > 0 ? t - 1 : 0), t > 0 ? doc_pos[t - 1] : 0);
}

/* Length of the chunk that starts at token t0: up to GDN_C rows, ending before the next
 * document start. */
static int gdn_chunk_len(const int32_t *doc_pos, int64_t t0, int64_t T) {
    int L = 1;
    while (L < GDN_C && t0 + L < T && doc_pos[t0 + L] != 0) L++;
    return L;
}

/* Gathers the L rows of the chunk starting at t0 for value head h / key head kh and builds its
 * factors: G, gam, dec, Gam, KK, QK, A, Tinv, W, U. q NULL: no QK; v NULL: no U (left zero).
 * The kept Tinv (cpu_gdn_kept_bytes): fp32 (T, nv, 64), row i of the chunk at ((t0 + i) nv + h) 64,
 * its columns c <= i as the substitution gives them, 0 above. tinv_out gets it; tinv_in (when not
 * NULL) replaces the substitution by the copy: the same floats. */
static void gdn_chunk_load(GdnWork *w, const float *q /* (T,ldq) or NULL */, const float *k /* (T,ldq) */,
                           const float *v /* (T,ldv) */, const float *g /* (T,nv) */, const float *beta /* (T,nv) */,
                           int64_t t0, int L, int h, int kh, int nv, int ldq, int ldv,
                           float *tinv_out /* (T,nv,64) or NULL */, const float *tinv_in /* (T,nv,64) or NULL */) {
    const int dk = w->dk, dv = w->dv;
    w->L = L;
    double G = 0.0;
    for (int r = 0; r < L; r++) {
        const int64_t t = t0 + r;
        if (q) memcpy(w->q + (size_t)r * dk, q + t * ldq + (int64_t)kh * dk, (size_t)dk * sizeof(float));
        memcpy(w->k + (size_t)r * dk, k + t * ldq + (int64_t)kh * dk, (size_t)dk * sizeof(float));
        if (v) memcpy(w->v + (size_t)r * dv, v + t * ldv + (int64_t)h * dv, (size_t)dv * sizeof(float));
        w->beta[r] = beta[t * nv + h];
        G += (double)g[t * nv + h];
        w->G[r] = G;
    }
    /* gate factors: only exponents <= 0 are evaluated; the upper triangle is selected to 0 */
    for (int r = 0; r < L; r++) {
        w->gam[r] = (float)exp(w->G[r]);
        w->dec[r] = (float)exp(w->G[L - 1] - w->G[r]);
        float *Gr = w->Gam + (size_t)r * GDN_C;
        for (int j = 0; j < L; j++) Gr[j] = j <= r ? (float)exp(w->G[r] - w->G[j]) : 0.0f;
    }
    for (int i = 0; i < L; i++) {
        const float *ki = w->k + (size_t)i * dk;
        for (int j = 0; j < L; j++) {
            const size_t ij = (size_t)i * GDN_C + j;
            w->KK[ij] = j < i ? gdn_dot(ki, w->k + (size_t)j * dk, dk) : 0.0f;
            w->A[ij] = j < i ? w->beta[i] * w->KK[ij] * w->Gam[ij] : 0.0f;
            if (q) w->QK[ij] = j <= i ? gdn_dot(w->q + (size_t)i * dk, w->k + (size_t)j * dk, dk) : 0.0f;
        }
    }
    /* Tinv = (I + A)^-1 by forward substitution: row i = e_i - sum_{j<i} A_ij (row j) */
    for (int i = 0; i < L; i++) {
        float *Ti = w->Tinv + (size_t)i * GDN_C;
        const int64_t row = ((t0 + i) * nv + h) * GDN_C;
        if (tinv_in) {
            memcpy(Ti, tinv_in + row, (size_t)L * sizeof(float));
            continue;
        }
        for (int c = 0; c < L; c++) Ti[c] = c == i ? 1.0f : 0.0f;
        for (int j = 0; j < i; j++) gdn_axpy(Ti, -w->A[(size_t)i * GDN_C + j], w->Tinv + (size_t)j * GDN_C, j + 1);
        if (tinv_out)
            for (int c = 0; c < GDN_C; c++) tinv_out[row + c] = c <= i ? Ti[c] : 0.0f;
    }
    /* W = Tinv diag(beta gam) K, U = Tinv diag(beta) V */
    for (int i = 0; i < L; i++) {
        float *Wi = w->W + (size_t)i * dk, *Ui = w->U + (size_t)i * dv;
        memset(Wi, 0, (size_t)dk * sizeof(float));
        memset(Ui, 0, (size_t)dv * sizeof(float));
        for (int j = 0; j <= i; j++) {
            const float tij = w->Tinv[(size_t)i * GDN_C + j];
            gdn_axpy(Wi, tij * w->beta[j] * w->gam[j], w->k + (size_t)j * dk, dk);
            if (v) gdn_axpy(Ui, tij * w->beta[j], w->v + (size_t)j * dv, dv);
        }
    }
}

/* vn = [U | 0] - W X for the state X (dk, ncol); U fills the first dv columns. */
static void gdn_chunk_vnew(GdnWork *w, const float *X /* (dk, ncol) */) {
    const int dk = w->dk, dv = w->dv, ncol = w->ncol;
    for (int r = 0; r < w->L; r++) {
        float *vr = w->vn + (size_t)r * ncol;
        for (int c = 0; c < ncol; c++) vr[c] = c < dv ? w->U[(size_t)r * dv + c] : 0.0f;
        for (int a = 0; a < dk; a++) gdn_axpy(vr, -w->W[(size_t)r * dk + a], X + (size_t)a * ncol, ncol);
    }
}

/* X = gam_{L-1} X + sum_j dec_j k_j vn_j^T: the state leaving the chunk. */
static void gdn_chunk_state_update(float *X /* (dk, ncol) */, const GdnWork *w) {
    const int dk = w->dk, ncol = w->ncol, L = w->L;
    for (int a = 0; a < dk; a++) {
        float *Xa = X + (size_t)a * ncol;
        for (int c = 0; c < ncol; c++) Xa[c] *= w->gam[L - 1];
        for (int j = 0; j < L; j++) gdn_axpy(Xa, w->dec[j] * w->k[(size_t)j * dk + a], w->vn + (size_t)j * ncol, ncol);
    }
}

/* O rows of the chunk: o_r = scale (gam_r S^T q_r + sum_{j<=r} (q_r.k_j) Gam_rj vn_j). */
static void gdn_chunk_output(float *o /* (T,ldo), already offset to row t0 and head h */, const GdnWork *w,
                             const float *S /* (dk, dv) */, float scale, int ldo, float *acc /* (dv) */) {
    const int dk = w->dk, dv = w->dv;
    for (int r = 0; r < w->L; r++) {
        memset(acc, 0, (size_t)dv * sizeof(float));
        for (int a = 0; a < dk; a++) gdn_axpy(acc, w->gam[r] * w->q[(size_t)r * dk + a], S + (size_t)a * dv, dv);
        for (int j = 0; j <= r; j++)
            gdn_axpy(acc, w->QK[(size_t)r * GDN_C + j] * w->Gam[(size_t)r * GDN_C + j], w->vn + (size_t)j * dv, dv);
        float *orow = o + (int64_t)r * ldo;
        for (int c = 0; c < dv; c++) orow[c] = scale * acc[c];
    }
}

void cpu_gdn_chunk_forward(void *o_ /* (T,ldo) nv heads of dim_v */, float *S_final /* (nv,dim_k,dim_v) or NULL */,
                           const void *q_ /* (T,ldq) nk heads of dim_k */, const void *k_ /* (T,ldq) */,
                           const void *v_ /* (T,ldv) nv heads of dim_v */, const float *g /* (T,nv) */,
                           const float *beta /* (T,nv) */, const float *S0 /* (nv,dim_k,dim_v) or NULL */,
                           const int32_t *doc_pos /* (T) */, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                           int ldv, int ldo, void *tinv /* cpu_gdn_kept_bytes(T, nv, dim_k, dim_v, s) written, or NULL */,
                           int kept_flags /* GDN_KEPT_PREP_IN, GDN_KEPT_STATES_IN: Tinv read from tinv (the states
                                             are recomputed from S0: none are kept here); GDN_KEPT_STATES checked */) {
    gdn_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    RS_CHECK((int64_t)ldo >= (int64_t)nv * dim_v, "gdn: ldo = %d < nv*dim_v = %d", ldo, nv * dim_v);
    const char *fault = gdn_kept_flags_fault(o_, S_final, tinv, kept_flags);
    RS_CHECK(!fault, "gdn: %s (kept_flags = %d)", fault ? fault : "", kept_flags);
    const int prep_in = (kept_flags & (GDN_KEPT_PREP_IN | GDN_KEPT_STATES_IN)) != 0;
    float *o = o_;
    const float *q = q_, *k = k_, *v = v_;
    const int dk = dim_k, dv = dim_v;
    const size_t state = (size_t)dk * dv;
    const float scale = (float)(1.0 / sqrt((double)dk));
    GdnWork w;
    gdn_work_init(&w, dk, dv, dv, 0);
    float *S = RS_MALLOC(state * sizeof(float));   /* (dk, dv) the running state */
    float *acc = RS_MALLOC((size_t)dv * sizeof(float));
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        if (S0) memcpy(S, S0 + h * state, state * sizeof(float));
        else memset(S, 0, state * sizeof(float));
        for (int64_t t0 = 0; t0 < T;) {
            const int L = gdn_chunk_len(doc_pos, t0, T);
            if (doc_pos[t0] == 0) memset(S, 0, state * sizeof(float)); /* a document starts: reset */
            gdn_chunk_load(&w, q, k, v, g, beta, t0, L, h, kh, nv, ldq, ldv, prep_in ? NULL : tinv,
                           prep_in ? tinv : NULL);
            gdn_chunk_vnew(&w, S);
            if (o) gdn_chunk_output(o + t0 * ldo + (int64_t)h * dv, &w, S, scale, ldo, acc);
            gdn_chunk_state_update(S, &w);
            t0 += L;
        }
        if (S_final) memcpy(S_final + h * state, S, state * sizeof(float));
    }
    free(acc);
    free(S);
    gdn_work_free(&w);
}

/* Backward of one chunk (formulas in the header). In: w loaded with the chunk's factors and its
 * dO rows, S the state entering the chunk, D = dL/d(state leaving it). Out: w->dqc, w->dkc, w->dvc,
 * w->dG, w->dbeta for the chunk's rows, and w->Din = dL/d(state entering it). */
static void gdn_chunk_backward(GdnWork *w, const float *S /* (dk, dv) */, const float *D /* (dk, dv) */,
                               float scale) {
    const int dk = w->dk, dv = w->dv, L = w->L;
    const size_t C = GDN_C;
    gdn_chunk_vnew(w, S);
    for (int r = 0; r < L; r++) {
        w->dG[r] = 0.0;
        w->dbeta[r] = 0.0f;
    }
    /* P_rj = scale (q_r.k_j) Gam_rj and dP_rj = dO_r.vn_j, j <= r; dG from the e^{G_r - G_j} in P */
    for (int r = 0; r < L; r++)
        for (int j = 0; j <= r; j++) {
            const float p = scale * w->QK[r * C + j] * w->Gam[r * C + j];
            const float dp = gdn_dot(w->dO + (size_t)r * dv, w->vn + (size_t)j * dv, dv);
            w->P[r * C + j] = p;
            w->dP[r * C + j] = dp;
            w->dG[r] += (double)dp * p;
            w->dG[j] -= (double)dp * p;
        }
    /* dvn_j = sum_{r>=j} P_rj dO_r + dec_j D^T k_j */
    for (int j = 0; j < L; j++) {
        float *dvj = w->dvn + (size_t)j * dv;
        memset(dvj, 0, (size_t)dv * sizeof(float));
        for (int a = 0; a < dk; a++) gdn_axpy(dvj, w->dec[j] * w->k[(size_t)j * dk + a], D + (size_t)a * dv, dv);
        for (int r = j; r < L; r++) gdn_axpy(dvj, w->P[r * C + j], w->dO + (size_t)r * dv, dv);
    }
    /* dq_r = scale gam_r S dO_r + scale sum_{j<=r} dP_rj Gam_rj k_j; the first part also gives dG_r */
    for (int r = 0; r < L; r++) {
        float *dqr = w->dqc + (size_t)r * dk;
        const float *dOr = w->dO + (size_t)r * dv;
        for (int a = 0; a < dk; a++) dqr[a] = scale * w->gam[r] * gdn_dot(S + (size_t)a * dv, dOr, dv);
        w->dG[r] += gdn_dot(w->q + (size_t)r * dk, dqr, dk);
        for (int j = 0; j <= r; j++)
            gdn_axpy(dqr, scale * w->dP[r * C + j] * w->Gam[r * C + j], w->k + (size_t)j * dk, dk);
    }
    /* dk_j = dec_j D vn_j + scale sum_{r>=j} dP_rj Gam_rj q_r; the first part also gives dG through
     * dec_j = e^{G_{L-1} - G_j}. The carried state's own decay gives dG_{L-1} += gam_{L-1} <S, D>. */
    for (int j = 0; j < L; j++) {
        float *dkj = w->dkc + (size_t)j * dk;
        const float *vj = w->vn + (size_t)j * dv;
        for (int a = 0; a < dk; a++) dkj[a] = w->dec[j] * gdn_dot(D + (size_t)a * dv, vj, dv);
        const double y = gdn_dot(w->k + (size_t)j * dk, dkj, dk);
        w->dG[L - 1] += y;
        w->dG[j] -= y;
        for (int r = j; r < L; r++)
            gdn_axpy(dkj, scale * w->dP[r * C + j] * w->Gam[r * C + j], w->q + (size_t)r * dk, dk);
    }
    w->dG[L - 1] += (double)w->gam[L - 1] * gdn_dot(S, D, dk * dv);
    /* Din = gam_{L-1} D + scale sum_r gam_r q_r dO_r^T - sum_r W_r dvn_r^T */
    for (int a = 0; a < dk; a++) {
        float *Da = w->Din + (size_t)a * dv;
        for (int c = 0; c < dv; c++) Da[c] = w->gam[L - 1] * D[(size_t)a * dv + c];
        for (int r = 0; r < L; r++) {
            gdn_axpy(Da, scale * w->gam[r] * w->q[(size_t)r * dk + a], w->dO + (size_t)r * dv, dv);
            gdn_axpy(Da, -w->W[(size_t)r * dk + a], w->dvn + (size_t)r * dv, dv);
        }
    }
    /* dW_r = -S dvn_r (dU = dvn) */
    for (int r = 0; r < L; r++)
        for (int a = 0; a < dk; a++)
            w->dW[(size_t)r * dk + a] = -gdn_dot(S + (size_t)a * dv, w->dvn + (size_t)r * dv, dv);
    /* dXw = Tinv^T dW, dXu = Tinv^T dU */
    for (int j = 0; j < L; j++) {
        float *xw = w->dXw + (size_t)j * dk, *xu = w->dXu + (size_t)j * dv;
        memset(xw, 0, (size_t)dk * sizeof(float));
        memset(xu, 0, (size_t)dv * sizeof(float));
        for (int i = j; i < L; i++) {
            gdn_axpy(xw, w->Tinv[i * C + j], w->dW + (size_t)i * dk, dk);
            gdn_axpy(xu, w->Tinv[i * C + j], w->dvn + (size_t)i * dv, dv);
        }
    }
    /* dTinv_ij = dW_i.Xw_j + dU_i.Xu_j, strictly lower (i > j) */
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++)
            w->dT[i * C + j] = j < i ? w->beta[j] * w->gam[j] * gdn_dot(w->dW + (size_t)i * dk, w->k + (size_t)j * dk, dk) +
                                           w->beta[j] * gdn_dot(w->dvn + (size_t)i * dv, w->v + (size_t)j * dv, dv)
                                     : 0.0f;
    /* M1 = Tinv^T dTinv: M1_ib = sum_{c >= i, c > b} Tinv_ci dT_cb */
    for (int i = 0; i < L; i++)
        for (int b = 0; b < L; b++) {
            float s = 0.0f;
            for (int c = (i > b + 1 ? i : b + 1); c < L; c++) s += w->Tinv[c * C + i] * w->dT[c * C + b];
            w->M1[i * C + b] = s;
        }
    /* dA_ij = -(M1 Tinv^T)_ij = -sum_{b <= j} M1_ib Tinv_jb, strictly lower */
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++) {
            float s = 0.0f;
            if (j < i)
                for (int b = 0; b <= j; b++) s += w->M1[i * C + b] * w->Tinv[j * C + b];
            w->dA[i * C + j] = -s;
        }
    /* Xw_r = beta_r gam_r k_r, Xu_r = beta_r v_r */
    for (int r = 0; r < L; r++) {
        const float *kr = w->k + (size_t)r * dk, *xw = w->dXw + (size_t)r * dk;
        const float kx = gdn_dot(kr, xw, dk);
        gdn_axpy(w->dkc + (size_t)r * dk, w->beta[r] * w->gam[r], xw, dk);
        w->dbeta[r] += w->gam[r] * kx + gdn_dot(w->v + (size_t)r * dv, w->dXu + (size_t)r * dv, dv);
        w->dG[r] += (double)w->beta[r] * w->gam[r] * kx;
        float *dvr = w->dvc + (size_t)r * dv;
        for (int c = 0; c < dv; c++) dvr[c] = w->beta[r] * w->dXu[(size_t)r * dv + c];
    }
    /* A_ij = beta_i (k_i.k_j) Gam_ij, i > j */
    for (int i = 0; i < L; i++)
        for (int j = 0; j < i; j++) {
            const float da = w->dA[i * C + j];
            const float c = da * w->beta[i] * w->Gam[i * C + j];
            w->dbeta[i] += da * w->KK[i * C + j] * w->Gam[i * C + j];
            gdn_axpy(w->dkc + (size_t)i * dk, c, w->k + (size_t)j * dk, dk);
            gdn_axpy(w->dkc + (size_t)j * dk, c, w->k + (size_t)i * dk, dk);
            const double x = (double)da * w->A[i * C + j];
            w->dG[i] += x;
            w->dG[j] -= x;
        }
}

void cpu_gdn_chunk_backward(void *dq_ /* (T,ldq) */, void *dk_ /* (T,ldq) */, void *dv_ /* (T,ldv) */,
                            float *dg /* (T,nv) */, float *dbeta /* (T,nv) */, float *dS0 /* (nv,dim_k,dim_v) or NULL */,
                            const void *dout_ /* (T,ldo) */, const float *dS_final /* (nv,dim_k,dim_v) or NULL */,
                            const void *q_ /* (T,ldq) */, const void *k_ /* (T,ldq) */, const void *v_ /* (T,ldv) */,
                            const float *g /* (T,nv) */, const float *beta /* (T,nv) */,
                            const float *S0 /* (nv,dim_k,dim_v) or NULL */, const int32_t *doc_pos /* (T) */,
                            int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo,
                            const void *tinv_ /* the forward's, or NULL */, int kept_kind /* unused */) {
    gdn_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    RS_CHECK((int64_t)ldo >= (int64_t)nv * dim_v, "gdn: ldo = %d < nv*dim_v = %d", ldo, nv * dim_v);
    const float *tinv = tinv_;
    float *dq_out = dq_, *dk_out = dk_, *dv_out = dv_;
    const float *dout = dout_, *q = q_, *k = k_, *v = v_;
    const int dk = dim_k, dv = dim_v;
    const size_t state = (size_t)dk * dv;
    const float scale = (float)(1.0 / sqrt((double)dk));

    /* the chunk list (chunks restart at document starts), walked backwards below */
    int64_t nchunks = 0;
    for (int64_t t0 = 0; t0 < T; t0 += gdn_chunk_len(doc_pos, t0, T)) nchunks++;
    int64_t *starts = RS_MALLOC((size_t)(nchunks > 0 ? nchunks : 1) * sizeof(int64_t));
    int *lens = RS_MALLOC((size_t)(nchunks > 0 ? nchunks : 1) * sizeof(int));
    nchunks = 0;
    for (int64_t t0 = 0; t0 < T; t0 += lens[nchunks - 1]) {
        starts[nchunks] = t0;
        lens[nchunks++] = gdn_chunk_len(doc_pos, t0, T);
    }

    GdnWork w;
    gdn_work_init(&w, dk, dv, dv, 1);
    float *states = RS_MALLOC((size_t)(nchunks > 0 ? nchunks : 1) * state * sizeof(float)); /* (nchunks, dk, dv) entering each chunk */
    float *D = RS_MALLOC(state * sizeof(float)); /* (dk, dv) dL/dS, carried from the last chunk down */

    /* dq, dk collect every value head of their key head: clear our columns only (ld may be wider) */
    for (int64_t t = 0; t < T; t++) {
        memset(dq_out + t * ldq, 0, (size_t)nk * dk * sizeof(float));
        memset(dk_out + t * ldq, 0, (size_t)nk * dk * sizeof(float));
    }
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        /* pass 1: recompute the state entering every chunk */
        float *S = states;
        if (S0) memcpy(S, S0 + h * state, state * sizeof(float));
        else memset(S, 0, state * sizeof(float));
        for (int64_t c = 0; c < nchunks; c++) {
            S = states + c * state;
            if (doc_pos[starts[c]] == 0) memset(S, 0, state * sizeof(float));
            if (c + 1 == nchunks) break;
            memcpy(S + state, S, state * sizeof(float));
            gdn_chunk_load(&w, q, k, v, g, beta, starts[c], lens[c], h, kh, nv, ldq, ldv, NULL, tinv);
            gdn_chunk_vnew(&w, S);
            gdn_chunk_state_update(S + state, &w);
        }
        /* pass 2: from the last chunk down */
        if (dS_final) memcpy(D, dS_final + h * state, state * sizeof(float));
        else memset(D, 0, state * sizeof(float));
        for (int64_t c = nchunks - 1; c >= 0; c--) {
            const int64_t t0 = starts[c];
            const int L = lens[c];
            gdn_chunk_load(&w, q, k, v, g, beta, t0, L, h, kh, nv, ldq, ldv, NULL, tinv);
            for (int r = 0; r < L; r++)
                memcpy(w.dO + (size_t)r * dv, dout + (t0 + r) * ldo + (int64_t)h * dv, (size_t)dv * sizeof(float));
            gdn_chunk_backward(&w, states + c * state, D, scale);
            double acc = 0.0; /* dg_r = sum_{r' >= r} dG_r' inside the chunk */
            for (int r = L - 1; r >= 0; r--) {
                const int64_t t = t0 + r;
                acc += w.dG[r];
                dg[t * nv + h] = (float)acc;
                dbeta[t * nv + h] = w.dbeta[r];
                gdn_axpy(dq_out + t * ldq + (int64_t)kh * dk, 1.0f, w.dqc + (size_t)r * dk, dk);
                gdn_axpy(dk_out + t * ldq + (int64_t)kh * dk, 1.0f, w.dkc + (size_t)r * dk, dk);
                memcpy(dv_out + t * ldv + (int64_t)h * dv, w.dvc + (size_t)r * dv, (size_t)dv * sizeof(float));
            }
            /* a chunk that starts a document began from a reset state: nothing flows further back */
            if (doc_pos[t0] == 0) memset(D, 0, state * sizeof(float));
            else memcpy(D, w.Din, state * sizeof(float));
        }
        if (dS0) memcpy(dS0 + h * state, D, state * sizeof(float));
    }
    free(D);
    free(states);
    free(starts);
    free(lens);
    gdn_work_free(&w);
}

/* backend.h gdn_chunk_backward_stage on a cpu backend, from its whole backward `whole`: dkept holds the
 * stage's dS_final (NULL: 0), (nv, dk, dv) fp32. DOUT does nothing; STATE runs the whole backward into its
 * own scratch for dS0 and keeps dS_final; GRADS runs it again from the kept dS_final. The stages give the
 * bits of one call because they are that call (the oracle's cost does not matter; the cuda entry splits the
 * work). */
void cpu_gdn_backward_stage_of(CpuGdnBackward *whole, int stage, void *dkept, void *dq, void *dk, void *dv, float *dg,
                               float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q,
                               const void *k, const void *v, const float *g, const float *beta, const float *S0,
                               const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                               int ldv, int ldo, const void *kept, int kept_kind) {
    RS_CHECK(stage == GDN_BWD_DOUT || stage == GDN_BWD_STATE || stage == GDN_BWD_GRADS,
             "gdn: backward stage %d (GDN_BWD_DOUT, _STATE or _GRADS)", stage);
    RS_CHECK(dkept && kept, "gdn: the staged backward needs dkept and the forward's kept buffer");
    gdn_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    const size_t state = (size_t)nv * dim_k * dim_v;
    float *D = dkept;
    if (stage == GDN_BWD_DOUT) return;
    if (stage == GDN_BWD_GRADS) {
        whole(dq, dk, dv, dg, dbeta, NULL, dout, D, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv,
              ldo, kept, kept_kind);
        return;
    }
    if (dS_final) memcpy(D, dS_final, state * sizeof(float));
    else memset(D, 0, state * sizeof(float));
    if (!dS0) return;
    const size_t rows = (size_t)(T > 0 ? T : 1); /* the gradients this stage does not write, into scratch */
    float *sq = RS_MALLOC(rows * ldq * sizeof(float)), *sk = RS_MALLOC(rows * ldq * sizeof(float));
    /* dg (rows, nv) here, (rows, nv, dim_k) for cpu_kda.c's whole backward: room for the wider, then dbeta */
    float *sv = RS_MALLOC(rows * ldv * sizeof(float)), *sgb = RS_MALLOC(rows * nv * (dim_k + 1) * sizeof(float));
    whole(sq, sk, sv, sgb, sgb + rows * nv * dim_k, dS0, dout, D, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq,
          ldv, ldo, kept, kept_kind);
    free(sq);
    free(sk);
    free(sv);
    free(sgb);
}

void cpu_gdn_chunk_backward_stage(int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta,
                                  float *dS0, const void *dout, const float *dS_final, const void *q, const void *k,
                                  const void *v, const float *g, const float *beta, const float *S0,
                                  const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                                  int ldv, int ldo, const void *kept, int kept_kind) {
    cpu_gdn_backward_stage_of(cpu_gdn_chunk_backward, stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k,
                              v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_kind);
}

size_t cpu_gdn_dkept_bytes(int64_t T, int nv, int dim_k, int dim_v) {
    (void)T;
    return (size_t)nv * dim_k * dim_v * sizeof(float);
}

/* the kept buffer of the cpu entries: Tinv, fp32 (T, nv, 64) (gdn_chunk_load's layout); dim_k, dim_v and
 * states unused (no chunk states are kept here) */
size_t cpu_gdn_kept_bytes(int64_t T, int nv, int dim_k, int dim_v, int states) {
    return (size_t)T * nv * GDN_C * sizeof(float);
}

/* Tinv of every chunk into tinv (gdn_chunk_load's layout): the bytes cpu_gdn_chunk_forward writes there */
void cpu_gdn_chunk_prep(void *tinv /* cpu_gdn_kept_bytes(T, nv, dim_k, dim_v, s) */, const void *k_ /* (T,ldq) */,
                        const void *v_ /* (T,ldv) */, const float *g /* (T,nv) */, const float *beta /* (T,nv) */,
                        const int32_t *doc_pos /* (T) */, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                        int ldv, int kept_kind /* unused */) {
    gdn_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    RS_CHECK(tinv || T == 0, "gdn: cpu_gdn_chunk_prep without a kept buffer");
    GdnWork w;
    gdn_work_init(&w, dim_k, dim_v, dim_v, 0);
    for (int h = 0; h < nv; h++)
        for (int64_t t0 = 0; t0 < T;) {
            const int L = gdn_chunk_len(doc_pos, t0, T);
            gdn_chunk_load(&w, NULL, k_, NULL, g, beta, t0, L, h, h / (nv / nk), nv, ldq, ldv, tinv, NULL);
            t0 += L;
        }
    gdn_work_free(&w);
}

void cpu_gdn_chunk_transition(float *M /* (nv,dim_k,dim_k) */, float *H /* (nv,dim_k,dim_v) */,
                              const void *k_ /* (T,ldq) nk heads of dim_k */, const void *v_ /* (T,ldv) */,
                              const float *g /* (T,nv) */, const float *beta /* (T,nv) */,
                              const int32_t *doc_pos /* (T) */, int64_t T, int nk, int nv, int dim_k, int dim_v,
                              int ldq, int ldv, const void *tinv /* its Tinv (cpu_gdn_chunk_prep), or NULL */,
                              int kept_kind /* unused */) {
    gdn_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    const float *k = k_, *v = v_;
    const int dk = dim_k, dv = dim_v;
    /* Only the part after the last document start matters; before it the state is reset. */
    int64_t tstart = -1;
    for (int64_t t = T - 1; t >= 0 && tstart < 0; t--)
        if (doc_pos[t] == 0) tstart = t;
    const int carry_M = tstart < 0; /* no reset inside: M is carried as the last dk columns */
    if (tstart < 0) tstart = 0;
    const int ncol = dv + (carry_M ? dk : 0);
    GdnWork w;
    gdn_work_init(&w, dk, dv, ncol, 0);
    float *X = RS_MALLOC((size_t)dk * ncol * sizeof(float)); /* (dk, ncol) = [S | M] */
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        memset(X, 0, (size_t)dk * ncol * sizeof(float)); /* [0 | I]: S0 enters through the M columns */
        if (carry_M)
            for (int a = 0; a < dk; a++) X[(size_t)a * ncol + dv + a] = 1.0f;
        for (int64_t t0 = tstart; t0 < T;) {
            const int L = gdn_chunk_len(doc_pos, t0, T);
            gdn_chunk_load(&w, NULL, k, v, g, beta, t0, L, h, kh, nv, ldq, ldv, NULL, tinv);
            gdn_chunk_vnew(&w, X);
            gdn_chunk_state_update(X, &w);
            t0 += L;
        }
        for (int a = 0; a < dk; a++) {
            memcpy(H + ((size_t)h * dk + a) * dv, X + (size_t)a * ncol, (size_t)dv * sizeof(float));
            float *Ma = M + ((size_t)h * dk + a) * dk;
            if (carry_M) memcpy(Ma, X + (size_t)a * ncol + dv, (size_t)dk * sizeof(float));
            else memset(Ma, 0, (size_t)dk * sizeof(float));
        }
    }
    free(X);
    gdn_work_free(&w);
}

void cpu_gdn_chunk_dstate(float *dS0 /* (nv,dim_k,dim_v) */, const void *dout_ /* (T,ldo) */,
                          const void *q_ /* (T,ldq) */, const void *k_ /* (T,ldq) */, const float *g /* (T,nv) */,
                          const float *beta /* (T,nv) */, const int32_t *doc_pos /* (T) */, int64_t T, int nk,
                          int nv, int dim_k, int dim_v, int ldq, int ldo,
                          const void *tinv /* its Tinv (the forward's, cpu_gdn_chunk_prep's), or NULL */,
                          int kept_kind /* unused */) {
    gdn_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, nv * dim_v);
    RS_CHECK((int64_t)ldo >= (int64_t)nv * dim_v, "gdn: ldo = %d < nv*dim_v = %d", ldo, nv * dim_v);
    const float *dout = dout_, *q = q_, *k = k_;
    const int dk = dim_k, dv = dim_v;
    const size_t state = (size_t)dk * dv, C = GDN_C;
    const float scale = (float)(1.0 / sqrt((double)dk));
    /* S0 reaches only the tokens before the first document start */
    int64_t tstop = 0;
    while (tstop < T && doc_pos[tstop] != 0) tstop++;
    int64_t nchunks = 0;
    for (int64_t t0 = 0; t0 < tstop; t0 += gdn_chunk_len(doc_pos, t0, tstop)) nchunks++;
    int64_t *starts = RS_MALLOC((size_t)(nchunks > 0 ? nchunks : 1) * sizeof(int64_t));
    int *lens = RS_MALLOC((size_t)(nchunks > 0 ? nchunks : 1) * sizeof(int));
    nchunks = 0;
    for (int64_t t0 = 0; t0 < tstop; t0 += lens[nchunks - 1]) {
        starts[nchunks] = t0;
        lens[nchunks++] = gdn_chunk_len(doc_pos, t0, tstop);
    }
    GdnWork w;
    gdn_work_init(&w, dk, dv, dv, 1);
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        float *D = dS0 + h * state; /* (dk, dv) dL/dS leaving the current chunk, then entering it */
        memset(D, 0, state * sizeof(float));
        for (int64_t c = nchunks - 1; c >= 0; c--) {
            const int64_t t0 = starts[c];
            const int L = lens[c];
            gdn_chunk_load(&w, q, k, NULL, g, beta, t0, L, h, kh, nv, ldq, 0, NULL, tinv);
            for (int r = 0; r < L; r++)
                memcpy(w.dO + (size_t)r * dv, dout + (t0 + r) * ldo + (int64_t)h * dv, (size_t)dv * sizeof(float));
            /* dvn_j = sum_{r>=j} P_rj dO_r + dec_j D^T k_j (as in gdn_chunk_backward; no S needed) */
            for (int j = 0; j < L; j++) {
                float *dvj = w.dvn + (size_t)j * dv;
                memset(dvj, 0, (size_t)dv * sizeof(float));
                for (int a = 0; a < dk; a++) gdn_axpy(dvj, w.dec[j] * w.k[(size_t)j * dk + a], D + (size_t)a * dv, dv);
                for (int r = j; r < L; r++)
                    gdn_axpy(dvj, scale * w.QK[r * C + j] * w.Gam[r * C + j], w.dO + (size_t)r * dv, dv);
            }
            /* Din = gam_{L-1} D + scale sum_r gam_r q_r dO_r^T - sum_r W_r dvn_r^T */
            for (int a = 0; a < dk; a++) {
                float *Da = w.Din + (size_t)a * dv;
                for (int cc = 0; cc < dv; cc++) Da[cc] = w.gam[L - 1] * D[(size_t)a * dv + cc];
                for (int r = 0; r < L; r++) {
                    gdn_axpy(Da, scale * w.gam[r] * w.q[(size_t)r * dk + a], w.dO + (size_t)r * dv, dv);
                    gdn_axpy(Da, -w.W[(size_t)r * dk + a], w.dvn + (size_t)r * dv, dv);
                }
            }
            memcpy(D, w.Din, state * sizeof(float));
        }
    }
    free(starts);
    free(lens);
    gdn_work_free(&w);
}

void cpu_gdn_state_affine(float *S_out /* (nv,dim_k,dim_v) */, const float *M /* (nv,dim_k,dim_k) */,
                          const float *S_in /* (nv,dim_k,dim_v) or NULL */, const float *H /* (nv,dim_k,dim_v) */,
                          int transpose_M, int nv, int dim_k, int dim_v) {
    RS_CHECK(S_out != S_in, "gdn_state_affine: S_out must not alias S_in");
    const int dk = dim_k, dv = dim_v;
    for (int h = 0; h < nv; h++) {
        const float *Mh = M + (size_t)h * dk * dk, *Sh = S_in ? S_in + (size_t)h * dk * dv : NULL;
        const float *Hh = H + (size_t)h * dk * dv;
        float *Oh = S_out + (size_t)h * dk * dv;
        for (int a = 0; a < dk; a++) {
            float *Oa = Oh + (size_t)a * dv;
            memcpy(Oa, Hh + (size_t)a * dv, (size_t)dv * sizeof(float));
            if (!Sh) continue;
            for (int b = 0; b < dk; b++) {
                const float mab = transpose_M ? Mh[(size_t)b * dk + a] : Mh[(size_t)a * dk + b];
                gdn_axpy(Oa, mab, Sh + (size_t)b * dv, dv);
            }
        }
    }
}
