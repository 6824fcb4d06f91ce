/*
 * cpu_kda.c — Kimi Delta Attention's chunked delta rule on the cpu backend: the Backend entries kda_chunk_*
 * (lib/backend/backend.h, "Kimi Delta Attention"), the gdn_chunk_* entries with a log-decay per key channel,
 * g (T, nv, dk). The oracle the cuda kernels will be checked against: plain loops in a fixed order, no threads.
 * Callers: backend_cpu.c (the table), lib/cp/cp_gdn_fragment.c (through the table), tests/unit/test_kda.c.
 *
 * Per value head h (key head h / (nv/nk)) the tokens are cut into chunks of at most C = 64 rows, a new
 * sub-sequence at every token with doc_pos == 0, as cpu_gdn.c does. In a chunk of L rows with the per-channel
 * cumulative log gate G_r = g_0 + ... + g_r (a dk vector), gam_r = e^{G_r}, E_rj = e^{G_r - G_j} (j <= r) and
 * dec_j = e^{G_{L-1} - G_j}, the state S entering the chunk and the per-token recurrence
 *   S_r = Diag(e^{g_r}) S_{r-1} + k_r d_r^T,   d_r = beta_r (v_r - (Diag(e^{g_r}) S_{r-1})^T k_r)
 * unroll to the WY (UT) form with the decay as a vector:
 *   A_ij   = beta_i sum_c k_i[c] k_j[c] E_ij[c]  (i > j),   Tinv = (I + A)^-1  (forward substitution)
 *   W      = Tinv diag(beta) (gam * K),   U = Tinv diag(beta) V,   vn = U - W S  (= the d_r)
 *   o_r    = scale (S^T (gam_r * q_r) + sum_{j<=r} QK_rj vn_j),   QK_rj = sum_c q_r[c] k_j[c] E_rj[c]
 *   S_out  = Diag(gam_{L-1}) S + sum_j (dec_j * k_j) vn_j^T
 * so a chunk's transition is S_out = M S + H with M = Diag(gam_{L-1}) - (dec * K)^T W: the dk x dk matrix of
 * the CP scan, as GDN's. The backward runs the chunks from the last down with D = dL/dS_out, gradients taken
 * with respect to the cumulative G (per channel) and then reverse-summed inside the chunk into dg. Derivation
 * and where each formula comes from: docs/design/kda.md.
 *
 * Numerics: every decay factor is e^{later - earlier} <= 1 (g <= 0); pairs with j > r are set to 0, never
 * evaluated. G, the factors' exponents and dL/dG are double; factors, states and every other sum are fp32 in a
 * fixed order. The pairwise decays E are kept per chunk as (64, 64, dk) fp32 (2 MiB at dk = 128).
 *
 * Contract notes as cpu_gdn.c's: RS_MALLOC'd scratch freed before returning; doc_pos must be a valid layout
 * inside the call; T == 0 allowed; the kept buffer holds Tinv (fp32 (T, nv, 64), cpu_kda_kept_bytes, the
 * layout of cpu_gdn.c's), so a backward, forward (GDN_KEPT_PREP_IN), transition or dstate reading it gives the
 * bits of one that substitutes again; kept_states changes nothing here.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "core/error.h"

#define KDA_C 64 /* chunk size */

/* Scratch of one chunk of one value head. Matrices row-major, row stride KDA_C, dk, dv or ncol. */
typedef struct KdaWork {
    int     dk, dv, ncol;   /* ncol: columns of the carried state (dv, or dv + dk in the transition) */
    int     L;              /* rows of the current chunk */
    float  *q, *k;          /* (C, dk) */
    float  *v;              /* (C, dv) */
    float  *beta;           /* (C) */
    double *G;              /* (C, dk) cumulative log gate */
    float  *gam, *dec;      /* (C, dk) e^{G_r}, e^{G_{L-1} - G_r} */
    float  *E;              /* (C, C, dk) e^{G_r - G_j} for j <= r, 0 above */
    float  *KK, *QK;        /* (C, C) sum_c k_i k_j E_ij (j < i), sum_c q_r k_j E_rj (j <= r) */
    float  *A, *Tinv;       /* (C, C) beta_i KK_ij strictly lower; (I + A)^-1 */
    float  *W;              /* (C, dk) */
    float  *U;              /* (C, dv) */
    float  *vn;             /* (C, ncol) */
    /* backward only */
    float  *dO, *dvn;       /* (C, dv) */
    float  *dW, *dXw;       /* (C, dk) */
    float  *dXu;            /* (C, dv) */
    float  *dqc, *dkc, *dvc;/* (C, dk), (C, dk), (C, dv) */
    float  *dP, *dT, *M1, *dA; /* (C, C) */
    double *dG;             /* (C, dk) dL/dG */
    float  *dbeta;          /* (C) */
    float  *Din;            /* (dk, dv) dL/dS entering the chunk */
} KdaWork;

static void kda_work_init(KdaWork *w, int dk, int dv, int ncol, int backward) {
    memset(w, 0, sizeof(*w));
    w->dk = dk;
    w->dv = dv;
    w->ncol = ncol;
    const size_t C = KDA_C, CC = (size_t)KDA_C * KDA_C, f = sizeof(float);
    w->q = RS_MALLOC(C * dk * f);
    w->k = RS_MALLOC(C * dk * f);
    w->v = RS_MALLOC(C * dv * f);
    w->beta = RS_MALLOC(C * f);
    w->G = RS_MALLOC(C * dk * sizeof(double));
    w->gam = RS_MALLOC(C * dk * f);
    w->dec = RS_MALLOC(C * dk * f);
    w->E = RS_MALLOC(CC * dk * f);
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
    w->dP = RS_MALLOC(CC * f);
    w->dT = RS_MALLOC(CC * f);
    w->M1 = RS_MALLOC(CC * f);
    w->dA = RS_MALLOC(CC * f);
    w->dG = RS_MALLOC(C * dk * sizeof(double));
    w->dbeta = RS_MALLOC(C * f);
    w->Din = RS_MALLOC((size_t)dk * dv * f);
}

static void kda_work_free(KdaWork *w) {
    float *fs[] = {w->q,  w->k,  w->v,   w->beta, w->gam, w->dec, w->E,   w->KK,  w->QK,  w->A,   w->Tinv,
                   w->W,  w->U,  w->vn,  w->dO,   w->dvn, w->dW,  w->dXw, w->dXu, w->dqc, w->dkc, w->dvc,
                   w->dP, w->dT, w->M1,  w->dA,   w->dbeta, w->Din};
    for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++) free(fs[i]);
    free(w->G);
    free(w->dG);
    memset(w, 0, sizeof(*w));
}

static float kda_dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* sum_c a[c] b[c] e[c] */
static float kda_dot3(const float *a, const float *b, const float *e, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i] * e[i];
    return s;
}

static void kda_axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static void kda_check_args(const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                           int ldv) {
    RS_CHECK(T >= 0, "kda: T = %lld", (long long)T);
    RS_CHECK(nk > 0 && nv > 0 && nv % nk == 0, "kda: nk = %d, nv = %d (nv must be a multiple of nk)", nk, nv);
    RS_CHECK(dim_k > 0 && dim_v > 0, "kda: dim_k = %d, dim_v = %d", dim_k, dim_v);
    RS_CHECK((int64_t)ldq >= (int64_t)nk * dim_k, "kda: ldq = %d < nk*dim_k = %d", ldq, nk * dim_k);
    RS_CHECK((int64_t)ldv >= (int64_t)nv * dim_v, "kda: ldv = %d < nv*dim_v = %d", ldv, nv * dim_v);
    RS_CHECK(T == 0 || doc_pos != NULL, "kda: doc_pos is NULL");
    for (int64_t t = 0; t < T; t++)
        RS_CHECK(doc_pos[t] >= 0 && (t == 0 || doc_pos[t] == 0 || doc_pos[t] == doc_pos[t - 1] + 1),
                 "kda: doc_pos[%lld] = %d after doc_pos[%lld] = %d: inside one call a token either starts a "
                 "document (0) or follows its predecessor (+1)",
                 (long long)t, doc_pos[t], (long long)(t > 0 ? t - 1 : 0), t > 0 ? doc_pos[t - 1] : 0);
}

/* the chunk starting at t0: up to KDA_C rows, ending before the next document start */
static int kda_chunk_len(const int32_t *doc_pos, int64_t t0, int64_t T) {
    int L = 1;
    while (L < KDA_C && t0 + L < T && doc_pos[t0 + L] != 0) L++;
    return L;
}

/* The chunk list of [0, T) (chunks restart at document starts): count, starts[], lens[] (caller frees). */
static int64_t kda_chunks(const int32_t *doc_pos, int64_t T, int64_t **starts, int **lens) {
    int64_t n = 0;
    for (int64_t t0 = 0; t0 < T; t0 += kda_chunk_len(doc_pos, t0, T)) n++;
    *starts = RS_MALLOC((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    *lens = RS_MALLOC((size_t)(n > 0 ? n : 1) * sizeof(int));
    n = 0;
    for (int64_t t0 = 0; t0 < T; t0 += (*lens)[n - 1]) {
        (*starts)[n] = t0;
        (*lens)[n++] = kda_chunk_len(doc_pos, t0, T);
    }
    return n;
}

/* Gathers the L rows of the chunk at t0 for value head h / key head kh and builds G, gam, dec, E, KK, QK, A,
 * Tinv, W, U. q NULL: no QK; v NULL: no U. Tinv as cpu_gdn.c keeps it ((T, nv, 64), row i of the chunk at
 * ((t0 + i) nv + h) 64): tinv_out gets it, tinv_in replaces the substitution (the same floats). */
static void kda_chunk_load(KdaWork *w, const float *q, const float *k, const float *v, const float *g /* (T,nv,dk) */,
                           const float *beta, int64_t t0, int L, int h, int kh, int nv, int ldq, int ldv,
                           float *tinv_out, const float *tinv_in) {
    const int dk = w->dk, dv = w->dv;
    w->L = L;
    for (int r = 0; r < L; r++) {
        const int64_t t = t0 + r;
        if (q) memcpy(w->q + (size_t)r * dk, q + t * ldq + (int64_t)kh * dk, (size_t)dk * sizeof(float));
        memcpy(w->k + (size_t)r * dk, k + t * ldq + (int64_t)kh * dk, (size_t)dk * sizeof(float));
        if (v) memcpy(w->v + (size_t)r * dv, v + t * ldv + (int64_t)h * dv, (size_t)dv * sizeof(float));
        w->beta[r] = beta[t * nv + h];
        const float *gt = g + (t * nv + h) * (int64_t)dk;
        for (int a = 0; a < dk; a++) w->G[(size_t)r * dk + a] = (r ? w->G[(size_t)(r - 1) * dk + a] : 0.0) + gt[a];
    }
    /* decay factors: exponents <= 0 only; pairs j > r set to 0 */
    const double *GL = w->G + (size_t)(L - 1) * dk;
    for (int r = 0; r < L; r++) {
        const double *Gr = w->G + (size_t)r * dk;
        for (int a = 0; a < dk; a++) {
            w->gam[(size_t)r * dk + a] = (float)exp(Gr[a]);
            w->dec[(size_t)r * dk + a] = (float)exp(GL[a] - Gr[a]);
        }
        for (int j = 0; j < L; j++) {
            float *Erj = w->E + ((size_t)r * KDA_C + j) * dk;
            const double *Gj = w->G + (size_t)j * dk;
            for (int a = 0; a < dk; a++) Erj[a] = j <= r ? (float)exp(Gr[a] - Gj[a]) : 0.0f;
        }
    }
    for (int i = 0; i < L; i++) {
        const float *ki = w->k + (size_t)i * dk;
        for (int j = 0; j < L; j++) {
            const size_t ij = (size_t)i * KDA_C + j;
            const float *Eij = w->E + ij * dk, *kj = w->k + (size_t)j * dk;
            w->KK[ij] = j < i ? kda_dot3(ki, kj, Eij, dk) : 0.0f;
            w->A[ij] = j < i ? w->beta[i] * w->KK[ij] : 0.0f;
            if (q) w->QK[ij] = j <= i ? kda_dot3(w->q + (size_t)i * dk, kj, Eij, dk) : 0.0f;
        }
    }
    for (int i = 0; i < L; i++) {
        float *Ti = w->Tinv + (size_t)i * KDA_C;
        const int64_t row = ((t0 + i) * nv + h) * KDA_C;
        if (tinv_in) {
            memcpy(Ti, tinv_in + row, (size_t)L * sizeof(float));
            continue;
        }
        for (int c = 0; c < L; c++) Ti[c] = c == i ? 1.0f : 0.0f;
        for (int j = 0; j < i; j++) kda_axpy(Ti, -w->A[(size_t)i * KDA_C + j], w->Tinv + (size_t)j * KDA_C, j + 1);
        if (tinv_out)
            for (int c = 0; c < KDA_C; c++) tinv_out[row + c] = c <= i ? Ti[c] : 0.0f;
    }
    /* W_i = sum_{j<=i} Tinv_ij beta_j (gam_j * k_j), U_i = sum_{j<=i} Tinv_ij beta_j v_j */
    for (int i = 0; i < L; i++) {
        float *Wi = w->W + (size_t)i * dk, *Ui = w->U + (size_t)i * dv;
        memset(Wi, 0, (size_t)dk * sizeof(float));
        memset(Ui, 0, (size_t)dv * sizeof(float));
        for (int j = 0; j <= i; j++) {
            const float tb = w->Tinv[(size_t)i * KDA_C + j] * w->beta[j];
            const float *kj = w->k + (size_t)j * dk, *gj = w->gam + (size_t)j * dk;
            for (int a = 0; a < dk; a++) Wi[a] += tb * gj[a] * kj[a];
            if (v) kda_axpy(Ui, tb, w->v + (size_t)j * dv, dv);
        }
    }
}

/* vn = [U | 0] - W X for the state X (dk, ncol) */
static void kda_chunk_vnew(KdaWork *w, const float *X) {
    const int dk = w->dk, dv = w->dv, ncol = w->ncol;
    for (int r = 0; r < w->L; r++) {
        float *vr = w->vn + (size_t)r * ncol;
        for (int c = 0; c < ncol; c++) vr[c] = c < dv ? w->U[(size_t)r * dv + c] : 0.0f;
        for (int a = 0; a < dk; a++) kda_axpy(vr, -w->W[(size_t)r * dk + a], X + (size_t)a * ncol, ncol);
    }
}

/* X = Diag(gam_{L-1}) X + sum_j (dec_j * k_j) vn_j^T: the state leaving the chunk */
static void kda_chunk_state_update(float *X /* (dk, ncol) */, const KdaWork *w) {
    const int dk = w->dk, ncol = w->ncol, L = w->L;
    for (int a = 0; a < dk; a++) {
        float *Xa = X + (size_t)a * ncol;
        const float ga = w->gam[(size_t)(L - 1) * dk + a];
        for (int c = 0; c < ncol; c++) Xa[c] *= ga;
        for (int j = 0; j < L; j++)
            kda_axpy(Xa, w->dec[(size_t)j * dk + a] * w->k[(size_t)j * dk + a], w->vn + (size_t)j * ncol, ncol);
    }
}

/* o_r = scale (S^T (gam_r * q_r) + sum_{j<=r} QK_rj vn_j) */
static void kda_chunk_output(float *o /* offset to row t0, head h */, const KdaWork *w, const float *S, float scale,
                             int ldo, float *acc) {
    const int dk = w->dk, dv = w->dv;
    for (int r = 0; r < w->L; r++) {
        memset(acc, 0, (size_t)dv * sizeof(float));
        for (int a = 0; a < dk; a++)
            kda_axpy(acc, w->gam[(size_t)r * dk + a] * w->q[(size_t)r * dk + a], S + (size_t)a * dv, dv);
        for (int j = 0; j <= r; j++) kda_axpy(acc, w->QK[(size_t)r * KDA_C + j], w->vn + (size_t)j * dv, dv);
        float *orow = o + (int64_t)r * ldo;
        for (int c = 0; c < dv; c++) orow[c] = scale * acc[c];
    }
}

void cpu_kda_chunk_forward(void *o_ /* (T,ldo) */, float *S_final /* (nv,dim_k,dim_v) or NULL */,
                           const void *q_ /* (T,ldq) */, const void *k_ /* (T,ldq) */, const void *v_ /* (T,ldv) */,
                           const float *g /* (T,nv,dim_k) */, const float *beta /* (T,nv) */, const float *S0,
                           const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv,
                           int ldo, void *tinv /* cpu_kda_kept_bytes or NULL */, int kept_flags) {
    kda_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    RS_CHECK((int64_t)ldo >= (int64_t)nv * dim_v, "kda: ldo = %d < nv*dim_v = %d", ldo, nv * dim_v);
    const char *fault = gdn_kept_flags_fault(o_, S_final, tinv, kept_flags);
    RS_CHECK(!fault, "kda: %s (kept_flags = %d)", fault ? fault : "", kept_flags);
    const int prep_in = (kept_flags & (GDN_KEPT_PREP_IN | GDN_KEPT_STATES_IN)) != 0;
    float *o = o_;
    const float *q = q_, *k = k_, *v = v_;
    const int dk = dim_k, dv = dim_v;
    const size_t state = (size_t)dk * dv;
    const float scale = (float)(1.0 / sqrt((double)dk));
    KdaWork w;
    kda_work_init(&w, dk, dv, dv, 0);
    float *S = RS_MALLOC(state * sizeof(float));
    float *acc = RS_MALLOC((size_t)dv * sizeof(float));
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        if (S0) memcpy(S, S0 + h * state, state * sizeof(float));
        else memset(S, 0, state * sizeof(float));
        for (int64_t t0 = 0; t0 < T;) {
            const int L = kda_chunk_len(doc_pos, t0, T);
            if (doc_pos[t0] == 0) memset(S, 0, state * sizeof(float));
            kda_chunk_load(&w, q, k, v, g, beta, t0, L, h, kh, nv, ldq, ldv, prep_in ? NULL : tinv,
                           prep_in ? tinv : NULL);
            kda_chunk_vnew(&w, S);
            if (o) kda_chunk_output(o + t0 * ldo + (int64_t)h * dv, &w, S, scale, ldo, acc);
            kda_chunk_state_update(S, &w);
            t0 += L;
        }
        if (S_final) memcpy(S_final + h * state, S, state * sizeof(float));
    }
    free(acc);
    free(S);
    kda_work_free(&w);
}

/* Backward of one chunk (the header's forward, differentiated with respect to G per channel; docs/design/kda.md).
 * In: w loaded with the chunk's factors and dO rows, S entering, D = dL/d(state leaving). Out: w->dqc, dkc, dvc,
 * dG, dbeta and w->Din = dL/d(state entering). */
static void kda_chunk_backward(KdaWork *w, const float *S /* (dk, dv) */, const float *D /* (dk, dv) */, float scale) {
    const int dk = w->dk, dv = w->dv, L = w->L;
    const size_t C = KDA_C;
    kda_chunk_vnew(w, S);
    for (int r = 0; r < L; r++) w->dbeta[r] = 0.0f;
    for (size_t i = 0; i < (size_t)L * dk; i++) w->dG[i] = 0.0;
    /* dP_rj = dO_r . vn_j (j <= r); the output reads P_rj = scale QK_rj */
    for (int r = 0; r < L; r++)
        for (int j = 0; j <= r; j++) w->dP[r * C + j] = kda_dot(w->dO + (size_t)r * dv, w->vn + (size_t)j * dv, dv);
    /* dvn_j = sum_{r>=j} scale QK_rj dO_r + D^T (dec_j * k_j) */
    for (int j = 0; j < L; j++) {
        float *dvj = w->dvn + (size_t)j * dv;
        memset(dvj, 0, (size_t)dv * sizeof(float));
        for (int a = 0; a < dk; a++)
            kda_axpy(dvj, w->dec[(size_t)j * dk + a] * w->k[(size_t)j * dk + a], D + (size_t)a * dv, dv);
        for (int r = j; r < L; r++) kda_axpy(dvj, scale * w->QK[r * C + j], w->dO + (size_t)r * dv, dv);
    }
    /* dq_r[a] = scale gam_r[a] (S_a . dO_r) + scale sum_{j<=r} dP_rj k_j[a] E_rj[a];
     * dG_r[a] += q_r[a] times the first part; each QK term gives z = scale dP_rj q_r[a] k_j[a] E_rj[a] to
     * dG_r[a] and -z to dG_j[a] */
    for (int r = 0; r < L; r++) {
        float *dqr = w->dqc + (size_t)r * dk;
        const float *dOr = w->dO + (size_t)r * dv, *qr = w->q + (size_t)r * dk;
        double *dGr = w->dG + (size_t)r * dk;
        for (int a = 0; a < dk; a++) {
            dqr[a] = scale * w->gam[(size_t)r * dk + a] * kda_dot(S + (size_t)a * dv, dOr, dv);
            dGr[a] += (double)qr[a] * dqr[a];
        }
        for (int j = 0; j <= r; j++) {
            const float s = scale * w->dP[r * C + j];
            const float *kj = w->k + (size_t)j * dk, *Erj = w->E + ((size_t)r * C + j) * dk;
            double *dGj = w->dG + (size_t)j * dk;
            for (int a = 0; a < dk; a++) {
                const float x = s * kj[a] * Erj[a];
                dqr[a] += x;
                if (j < r) {
                    const double z = (double)x * qr[a];
                    dGr[a] += z;
                    dGj[a] -= z;
                }
            }
        }
    }
    /* dk_j[a] = dec_j[a] (D_a . vn_j) + scale sum_{r>=j} dP_rj q_r[a] E_rj[a]; the first part y = k_j[a] dec_j[a]
     * (D_a . vn_j) gives y to dG_{L-1}[a] and -y to dG_j[a]; the carried state's decay gam_{L-1}[a] (S_a . D_a) */
    double *dGL = w->dG + (size_t)(L - 1) * dk;
    for (int j = 0; j < L; j++) {
        float *dkj = w->dkc + (size_t)j * dk;
        const float *vj = w->vn + (size_t)j * dv, *kj = w->k + (size_t)j * dk;
        double *dGj = w->dG + (size_t)j * dk;
        for (int a = 0; a < dk; a++) {
            dkj[a] = w->dec[(size_t)j * dk + a] * kda_dot(D + (size_t)a * dv, vj, dv);
            const double y = (double)kj[a] * dkj[a];
            dGL[a] += y;
            dGj[a] -= y;
        }
        for (int r = j; r < L; r++) {
            const float s = scale * w->dP[r * C + j];
            const float *qr = w->q + (size_t)r * dk, *Erj = w->E + ((size_t)r * C + j) * dk;
            for (int a = 0; a < dk; a++) dkj[a] += s * qr[a] * Erj[a];
        }
    }
    for (int a = 0; a < dk; a++)
        dGL[a] += (double)w->gam[(size_t)(L - 1) * dk + a] * kda_dot(S + (size_t)a * dv, D + (size_t)a * dv, dv);
    /* Din_a = gam_{L-1}[a] D_a + scale sum_r gam_r[a] q_r[a] dO_r - sum_r W_r[a] dvn_r */
    for (int a = 0; a < dk; a++) {
        float *Da = w->Din + (size_t)a * dv;
        const float ga = w->gam[(size_t)(L - 1) * dk + a];
        for (int c = 0; c < dv; c++) Da[c] = ga * D[(size_t)a * dv + c];
        for (int r = 0; r < L; r++) {
            kda_axpy(Da, scale * w->gam[(size_t)r * dk + a] * w->q[(size_t)r * dk + a], w->dO + (size_t)r * dv, dv);
            kda_axpy(Da, -w->W[(size_t)r * dk + a], w->dvn + (size_t)r * dv, dv);
        }
    }
    /* dW_r[a] = -(S_a . dvn_r); dU = dvn */
    for (int r = 0; r < L; r++)
        for (int a = 0; a < dk; a++) w->dW[(size_t)r * dk + a] = -kda_dot(S + (size_t)a * dv, w->dvn + (size_t)r * dv, dv);
    /* dXw = Tinv^T dW, dXu = Tinv^T dU */
    for (int j = 0; j < L; j++) {
        float *xw = w->dXw + (size_t)j * dk, *xu = w->dXu + (size_t)j * dv;
        memset(xw, 0, (size_t)dk * sizeof(float));
        memset(xu, 0, (size_t)dv * sizeof(float));
        for (int i = j; i < L; i++) {
            kda_axpy(xw, w->Tinv[i * C + j], w->dW + (size_t)i * dk, dk);
            kda_axpy(xu, w->Tinv[i * C + j], w->dvn + (size_t)i * dv, dv);
        }
    }
    /* dTinv_ij = dW_i . Xw_j + dU_i . Xu_j (i > j), Xw_j = beta_j gam_j * k_j, Xu_j = beta_j v_j */
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++)
            w->dT[i * C + j] =
                j < i ? w->beta[j] * kda_dot3(w->dW + (size_t)i * dk, w->k + (size_t)j * dk, w->gam + (size_t)j * dk, dk) +
                            w->beta[j] * kda_dot(w->dvn + (size_t)i * dv, w->v + (size_t)j * dv, dv)
                      : 0.0f;
    /* M1 = Tinv^T dT; dA = -(M1 Tinv^T), strictly lower */
    for (int i = 0; i < L; i++)
        for (int b = 0; b < L; b++) {
            float s = 0.0f;
            for (int c = (i > b + 1 ? i : b + 1); c < L; c++) s += w->Tinv[c * C + i] * w->dT[c * C + b];
            w->M1[i * C + b] = s;
        }
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++) {
            float s = 0.0f;
            if (j < i)
                for (int b = 0; b <= j; b++) s += w->M1[i * C + b] * w->Tinv[j * C + b];
            w->dA[i * C + j] = -s;
        }
    /* through Xw_r = beta_r gam_r * k_r and Xu_r = beta_r v_r */
    for (int r = 0; r < L; r++) {
        const float *kr = w->k + (size_t)r * dk, *xw = w->dXw + (size_t)r * dk, *gr = w->gam + (size_t)r * dk;
        float *dkr = w->dkc + (size_t)r * dk;
        double *dGr = w->dG + (size_t)r * dk;
        float db = 0.0f;
        for (int a = 0; a < dk; a++) {
            const float gx = gr[a] * xw[a];
            dkr[a] += w->beta[r] * gx;
            db += gx * kr[a];
            dGr[a] += (double)w->beta[r] * gx * kr[a];
        }
        w->dbeta[r] += db + kda_dot(w->v + (size_t)r * dv, w->dXu + (size_t)r * dv, dv);
        float *dvr = w->dvc + (size_t)r * dv;
        for (int c = 0; c < dv; c++) dvr[c] = w->beta[r] * w->dXu[(size_t)r * dv + c];
    }
    /* A_ij = beta_i sum_a k_i[a] k_j[a] E_ij[a] (i > j) */
    for (int i = 0; i < L; i++)
        for (int j = 0; j < i; j++) {
            const float da = w->dA[i * C + j], c = da * w->beta[i];
            w->dbeta[i] += da * w->KK[i * C + j];
            const float *ki = w->k + (size_t)i * dk, *kj = w->k + (size_t)j * dk, *Eij = w->E + ((size_t)i * C + j) * dk;
            float *dki = w->dkc + (size_t)i * dk, *dkj = w->dkc + (size_t)j * dk;
            double *dGi = w->dG + (size_t)i * dk, *dGj = w->dG + (size_t)j * dk;
            for (int a = 0; a < dk; a++) {
                const float ce = c * Eij[a];
                dki[a] += ce * kj[a];
                dkj[a] += ce * ki[a];
                const double x = (double)ce * ki[a] * kj[a];
                dGi[a] += x;
                dGj[a] -= x;
            }
        }
}

void cpu_kda_chunk_backward(void *dq_ /* (T,ldq) */, void *dk_ /* (T,ldq) */, void *dv_ /* (T,ldv) */,
                            float *dg /* (T,nv,dim_k) */, float *dbeta /* (T,nv) */, float *dS0, const void *dout_,
                            const float *dS_final, const void *q_, const void *k_, const void *v_, const float *g,
                            const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv,
                            int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *tinv_, int kept_states) {
    kda_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    RS_CHECK((int64_t)ldo >= (int64_t)nv * dim_v, "kda: ldo = %d < nv*dim_v = %d", ldo, nv * dim_v);
    const float *tinv = tinv_;
    float *dq_out = dq_, *dk_out = dk_, *dv_out = dv_;
    const float *dout = dout_, *q = q_, *k = k_, *v = v_;
    const int dk = dim_k, dv = dim_v;
    const size_t state = (size_t)dk * dv;
    const float scale = (float)(1.0 / sqrt((double)dk));
    int64_t *starts;
    int *lens;
    const int64_t nchunks = kda_chunks(doc_pos, T, &starts, &lens);
    KdaWork w;
    kda_work_init(&w, dk, dv, dv, 1);
    float *states = RS_MALLOC((size_t)(nchunks > 0 ? nchunks : 1) * state * sizeof(float));
    float *D = RS_MALLOC(state * sizeof(float));
    double *acc = RS_MALLOC((size_t)dk * sizeof(double));
    for (int64_t t = 0; t < T; t++) { /* dq, dk collect every value head of their key head */
        memset(dq_out + t * ldq, 0, (size_t)nk * dk * sizeof(float));
        memset(dk_out + t * ldq, 0, (size_t)nk * dk * sizeof(float));
    }
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        /* pass 1: the state entering every chunk */
        float *S = states;
        if (S0) memcpy(S, S0 + h * state, state * sizeof(float));
        else memset(S, 0, state * sizeof(float));
        for (int64_t c = 0; c < nchunks; c++) {
            S = states + c * state;
            if (doc_pos[starts[c]] == 0) memset(S, 0, state * sizeof(float));
            if (c + 1 == nchunks) break;
            memcpy(S + state, S, state * sizeof(float));
            kda_chunk_load(&w, q, k, v, g, beta, starts[c], lens[c], h, kh, nv, ldq, ldv, NULL, tinv);
            kda_chunk_vnew(&w, S);
            kda_chunk_state_update(S + state, &w);
        }
        /* pass 2: from the last chunk down */
        if (dS_final) memcpy(D, dS_final + h * state, state * sizeof(float));
        else memset(D, 0, state * sizeof(float));
        for (int64_t c = nchunks - 1; c >= 0; c--) {
            const int64_t t0 = starts[c];
            const int L = lens[c];
            kda_chunk_load(&w, q, k, v, g, beta, t0, L, h, kh, nv, ldq, ldv, NULL, tinv);
            for (int r = 0; r < L; r++)
                memcpy(w.dO + (size_t)r * dv, dout + (t0 + r) * ldo + (int64_t)h * dv, (size_t)dv * sizeof(float));
            kda_chunk_backward(&w, states + c * state, D, scale);
            for (int a = 0; a < dk; a++) acc[a] = 0.0; /* dg_r = sum_{r' >= r} dG_r' inside the chunk */
            for (int r = L - 1; r >= 0; r--) {
                const int64_t t = t0 + r;
                float *dgt = dg + (t * nv + h) * (int64_t)dk;
                for (int a = 0; a < dk; a++) {
                    acc[a] += w.dG[(size_t)r * dk + a];
                    dgt[a] = (float)acc[a];
                }
                dbeta[t * nv + h] = w.dbeta[r];
                kda_axpy(dq_out + t * ldq + (int64_t)kh * dk, 1.0f, w.dqc + (size_t)r * dk, dk);
                kda_axpy(dk_out + t * ldq + (int64_t)kh * dk, 1.0f, w.dkc + (size_t)r * dk, dk);
                memcpy(dv_out + t * ldv + (int64_t)h * dv, w.dvc + (size_t)r * dv, (size_t)dv * sizeof(float));
            }
            if (doc_pos[t0] == 0) memset(D, 0, state * sizeof(float));
            else memcpy(D, w.Din, state * sizeof(float));
        }
        if (dS0) memcpy(dS0 + h * state, D, state * sizeof(float));
    }
    free(acc);
    free(D);
    free(states);
    free(starts);
    free(lens);
    kda_work_free(&w);
}

/* the staged backward: cpu_gdn.c's (its stages are calls of the whole backward, which is ours here) */
void cpu_kda_chunk_backward_stage(int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta,
                                  float *dS0, const void *dout, const float *dS_final, const void *q, const void *k,
                                  const void *v, const float *g, const float *beta, const float *S0,
                                  const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq,
                                  int ldv, int ldo, const void *kept, int kept_kind) {
    cpu_gdn_backward_stage_of(cpu_kda_chunk_backward, stage, dkept, dq, dk, dv, dg, dbeta, dS0, dout, dS_final, q, k,
                              v, g, beta, S0, doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv, ldo, kept, kept_kind);
}

/* the stages carry dS_final, (nv, dk, dv) fp32, as cpu_gdn.c's */
size_t cpu_kda_dkept_bytes(int64_t T, int nv, int dim_k, int dim_v) { return cpu_gdn_dkept_bytes(T, nv, dim_k, dim_v); }

/* Tinv, fp32 (T, nv, 64): cpu_gdn.c's layout */
size_t cpu_kda_kept_bytes(int64_t T, int nv, int dim_k, int dim_v, int states) {
    return cpu_gdn_kept_bytes(T, nv, dim_k, dim_v, states);
}

void cpu_kda_chunk_prep(void *tinv, const void *k_, const void *v_, const float *g, const float *beta,
                        const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv,
                        int kept_states) {
    kda_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    RS_CHECK(tinv || T == 0, "kda: cpu_kda_chunk_prep without a kept buffer");
    KdaWork w;
    kda_work_init(&w, dim_k, dim_v, dim_v, 0);
    for (int h = 0; h < nv; h++)
        for (int64_t t0 = 0; t0 < T;) {
            const int L = kda_chunk_len(doc_pos, t0, T);
            kda_chunk_load(&w, NULL, k_, NULL, g, beta, t0, L, h, h / (nv / nk), nv, ldq, ldv, tinv, NULL);
            t0 += L;
        }
    kda_work_free(&w);
}

/* S_final = M S0 + H: [S | M] carried as dv + dk columns from [0 | I], after the last document start alone */
void cpu_kda_chunk_transition(float *M /* (nv,dim_k,dim_k) */, float *H /* (nv,dim_k,dim_v) */, const void *k_,
                              const void *v_, const float *g, const float *beta, const int32_t *doc_pos, int64_t T,
                              int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, const void *tinv,
                              int kept_states) {
    kda_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, ldv);
    const float *k = k_, *v = v_;
    const int dk = dim_k, dv = dim_v;
    int64_t tstart = -1;
    for (int64_t t = T - 1; t >= 0 && tstart < 0; t--)
        if (doc_pos[t] == 0) tstart = t;
    const int carry_M = tstart < 0;
    if (tstart < 0) tstart = 0;
    const int ncol = dv + (carry_M ? dk : 0);
    KdaWork w;
    kda_work_init(&w, dk, dv, ncol, 0);
    float *X = RS_MALLOC((size_t)dk * ncol * sizeof(float));
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        memset(X, 0, (size_t)dk * ncol * sizeof(float));
        if (carry_M)
            for (int a = 0; a < dk; a++) X[(size_t)a * ncol + dv + a] = 1.0f;
        for (int64_t t0 = tstart; t0 < T;) {
            const int L = kda_chunk_len(doc_pos, t0, T);
            kda_chunk_load(&w, NULL, k, v, g, beta, t0, L, h, kh, nv, ldq, ldv, NULL, tinv);
            kda_chunk_vnew(&w, X);
            kda_chunk_state_update(X, &w);
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
    kda_work_free(&w);
}

/* dS0 of the call's own outputs (no gradient at its final state): the state-gradient pass alone, over the tokens
 * before the first document start */
void cpu_kda_chunk_dstate(float *dS0 /* (nv,dim_k,dim_v) */, const void *dout_, const void *q_, const void *k_,
                          const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv,
                          int dim_k, int dim_v, int ldq, int ldo, const void *tinv, int kept_states) {
    kda_check_args(doc_pos, T, nk, nv, dim_k, dim_v, ldq, nv * dim_v);
    RS_CHECK((int64_t)ldo >= (int64_t)nv * dim_v, "kda: ldo = %d < nv*dim_v = %d", ldo, nv * dim_v);
    const float *dout = dout_, *q = q_, *k = k_;
    const int dk = dim_k, dv = dim_v;
    const size_t state = (size_t)dk * dv, C = KDA_C;
    const float scale = (float)(1.0 / sqrt((double)dk));
    int64_t tstop = 0;
    while (tstop < T && doc_pos[tstop] != 0) tstop++;
    int64_t *starts;
    int *lens;
    const int64_t nchunks = kda_chunks(doc_pos, tstop, &starts, &lens);
    KdaWork w;
    kda_work_init(&w, dk, dv, dv, 1);
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        float *D = dS0 + h * state;
        memset(D, 0, state * sizeof(float));
        for (int64_t c = nchunks - 1; c >= 0; c--) {
            const int64_t t0 = starts[c];
            const int L = lens[c];
            kda_chunk_load(&w, q, k, NULL, g, beta, t0, L, h, kh, nv, ldq, 0, NULL, tinv);
            for (int r = 0; r < L; r++)
                memcpy(w.dO + (size_t)r * dv, dout + (t0 + r) * ldo + (int64_t)h * dv, (size_t)dv * sizeof(float));
            for (int j = 0; j < L; j++) { /* dvn_j = sum_{r>=j} scale QK_rj dO_r + D^T (dec_j * k_j) */
                float *dvj = w.dvn + (size_t)j * dv;
                memset(dvj, 0, (size_t)dv * sizeof(float));
                for (int a = 0; a < dk; a++)
                    kda_axpy(dvj, w.dec[(size_t)j * dk + a] * w.k[(size_t)j * dk + a], D + (size_t)a * dv, dv);
                for (int r = j; r < L; r++) kda_axpy(dvj, scale * w.QK[r * C + j], w.dO + (size_t)r * dv, dv);
            }
            for (int a = 0; a < dk; a++) { /* Din_a = gam_{L-1}[a] D_a + scale sum_r gam_r[a] q_r[a] dO_r - W^T dvn */
                float *Da = w.Din + (size_t)a * dv;
                const float ga = w.gam[(size_t)(L - 1) * dk + a];
                for (int cc = 0; cc < dv; cc++) Da[cc] = ga * D[(size_t)a * dv + cc];
                for (int r = 0; r < L; r++) {
                    kda_axpy(Da, scale * w.gam[(size_t)r * dk + a] * w.q[(size_t)r * dk + a], w.dO + (size_t)r * dv,
                             dv);
                    kda_axpy(Da, -w.W[(size_t)r * dk + a], w.dvn + (size_t)r * dv, dv);
                }
            }
            memcpy(D, w.Din, state * sizeof(float));
        }
    }
    free(starts);
    free(lens);
    kda_work_free(&w);
}
