/*
 * test_kda.c — tests of Kimi Delta Attention's chunked delta rule and gates on the cpu backend
 * (kernels/cpu/cpu_kda.c, cpu_elementwise.c cpu_kda_gates_*): the forward and every gradient against the
 * token-by-token recurrence, the CP entries (transition, dstate) against it, the kept Tinv / prep / staged
 * backward bitwise against recomputing, the split of a call into two with the state handed over, and the
 * equality with the Gated DeltaNet kernel when every key channel of a head has the same decay.
 *
 * The reference is lib/backend/backend.h's per-token recurrence in float64, written here independently of
 * the chunked WY form:
 *   reset S at doc_pos == 0;  S = Diag(e^{g_t}) S;  u = S^T k;  S += k (beta (v - u))^T;  o = S^T q / sqrt(dk)
 * with g_t a dk vector per value head (kimi_linear's torch_recurrent_kda / FLA's naive_recurrent_kda).
 * Gradients are compared with float64 central differences of L = sum(o R) + sum(S_final R2).
 *
 * Inputs: q, k normal then L2-normalised per head; v normal; beta = sigmoid(normal); g[t,h,c] =
 * -exp(A_log[h]) softplus(x) with x drawn per channel (so channels decay at different rates; a channel or head
 * offset bug shows), a decay knob from weak to strong. q and k share one padded buffer (ld strides exercised).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test_util.h"

#define KDA_PAD 777.0f

typedef struct KdaProb {
    int64_t  T;
    int      nk, nv, dk, dv, ldq, ldv, ldo;
    float   *qk;      /* (T, ldq): q at column 0, k at nk*dk, then padding */
    float   *v;       /* (T, ldv) */
    float   *g;       /* (T, nv, dk) */
    float   *beta;    /* (T, nv) */
    float   *S0;      /* (nv, dk, dv) or NULL */
    int32_t *doc_pos; /* (T) */
} KdaProb;

static float *kq(const KdaProb *p) { return p->qk; }
static float *kk(const KdaProb *p) { return p->qk + (int64_t)p->nk * p->dk; }
static double kda_softplus(double x) { return x > 20 ? x : log1p(exp(x)); }

/* doc_pos0: tokens of the first document before token 0 (0: it starts one); starts[]: more document starts.
 * same_decay: every channel of a head gets the same g (the GDN case). */
static KdaProb kda_make(int64_t T, int nk, int nv, int dk, int dv, int doc_pos0, const int *starts, int nstarts,
                        int with_S0, double decay, int same_decay) {
    KdaProb p = {.T = T, .nk = nk, .nv = nv, .dk = dk, .dv = dv};
    p.ldq = 2 * nk * dk + 3;
    p.ldv = nv * dv + 2;
    p.ldo = nv * dv + 5;
    p.qk = test_alloc(T * p.ldq * 4);
    p.v = test_alloc(T * p.ldv * 4);
    p.g = test_alloc(T * nv * dk * 4);
    p.beta = test_alloc(T * nv * 4);
    p.doc_pos = test_alloc(T * 4);
    for (int64_t t = 0; t < T; t++) {
        float *row = p.qk + t * p.ldq;
        test_fill_normal(row, 2 * nk * dk, 1.0);
        for (int hh = 0; hh < 2 * nk; hh++) {
            double s = 0;
            for (int a = 0; a < dk; a++) s += (double)row[hh * dk + a] * row[hh * dk + a];
            for (int a = 0; a < dk; a++) row[hh * dk + a] = (float)(row[hh * dk + a] / sqrt(s));
        }
        for (int c = 2 * nk * dk; c < p.ldq; c++) row[c] = KDA_PAD;
        test_fill_normal(p.v + t * p.ldv, nv * dv, 1.0);
        for (int c = nv * dv; c < p.ldv; c++) p.v[t * p.ldv + c] = KDA_PAD;
        for (int h = 0; h < nv; h++) {
            const double A = decay * (0.3 + h);
            double x = 1.5 * test_normal() - 0.5;
            for (int a = 0; a < dk; a++) {
                if (!same_decay) x = 1.5 * test_normal() - 0.5;
                float gv = (float)(-A * kda_softplus(x));
                p.g[(t * nv + h) * dk + a] = gv == 0.0f ? -1e-6f : gv;
            }
            p.beta[t * nv + h] = (float)(1.0 / (1.0 + exp(-test_normal())));
        }
        p.doc_pos[t] = t == 0 ? doc_pos0 : p.doc_pos[t - 1] + 1;
    }
    for (int i = 0; i < nstarts; i++)
        if (starts[i] < T) p.doc_pos[starts[i]] = 0;
    for (int64_t t = 1; t < T; t++)
        if (p.doc_pos[t] != 0) p.doc_pos[t] = p.doc_pos[t - 1] + 1;
    if (with_S0) {
        p.S0 = test_alloc((int64_t)nv * dk * dv * 4);
        test_fill_normal(p.S0, (int64_t)nv * dk * dv, 0.5);
    }
    return p;
}

static KdaProb kda_rows(const KdaProb *p, int64_t t0, int64_t T, float *S0) {
    KdaProb r = *p;
    r.T = T;
    r.qk = p->qk + t0 * p->ldq;
    r.v = p->v + t0 * p->ldv;
    r.g = p->g + t0 * p->nv * p->dk;
    r.beta = p->beta + t0 * p->nv;
    r.doc_pos = p->doc_pos + t0;
    r.S0 = S0;
    return r;
}

static void kda_fwd(float *o, float *S_final, const KdaProb *p, void *kept, int flags) {
    cpu_kda_chunk_forward(o, S_final, kq(p), kk(p), p->v, p->g, p->beta, p->S0, p->doc_pos, p->T, p->nk, p->nv, p->dk,
                          p->dv, p->ldq, p->ldv, p->ldo, kept, flags);
}

typedef struct {
    float *dqk, *dv, *dg, *dbeta, *dS0;
} KdaGrads;

/* gradient buffers pre-filled with garbage (written, not accumulated) and padding sentinels */
static KdaGrads kda_grads_alloc(const KdaProb *p) {
    KdaGrads d;
    const int64_t T = p->T, ns = (int64_t)p->nv * p->dk * p->dv;
    d.dqk = test_alloc(T * p->ldq * 4);
    d.dv = test_alloc(T * p->ldv * 4);
    d.dg = test_alloc(T * p->nv * p->dk * 4);
    d.dbeta = test_alloc(T * p->nv * 4);
    d.dS0 = test_alloc(ns * 4);
    for (int64_t i = 0; i < T * p->ldq; i++) d.dqk[i] = i % p->ldq < 2 * p->nk * p->dk ? 1e3f : KDA_PAD;
    for (int64_t i = 0; i < T * p->ldv; i++) d.dv[i] = i % p->ldv < p->nv * p->dv ? 1e3f : KDA_PAD;
    for (int64_t i = 0; i < T * p->nv * p->dk; i++) d.dg[i] = 1e3f;
    for (int64_t i = 0; i < T * p->nv; i++) d.dbeta[i] = 1e3f;
    for (int64_t i = 0; i < ns; i++) d.dS0[i] = 1e3f;
    return d;
}

static KdaGrads kda_bwd(const KdaProb *p, const float *dout, const float *dS_final, const void *kept) {
    KdaGrads d = kda_grads_alloc(p);
    cpu_kda_chunk_backward(d.dqk, d.dqk + (int64_t)p->nk * p->dk, d.dv, d.dg, d.dbeta, d.dS0, dout, dS_final, kq(p),
                           kk(p), p->v, p->g, p->beta, p->S0, p->doc_pos, p->T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                           p->ldv, p->ldo, kept, 0);
    return d;
}

static void kda_check_pad(const char *what, const float *x, int64_t T, int width, int ld) {
    int bad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int c = width; c < ld; c++) bad += x[t * ld + c] != KDA_PAD;
    EXPECT(bad == 0, "%s: %d padding entries beyond the row width were overwritten", what, bad);
}

static void kda_dense(float *dst, const float *src, int64_t T, int c0, int width, int ld) {
    for (int64_t t = 0; t < T; t++) memcpy(dst + t * width, src + t * ld + c0, (size_t)width * sizeof(float));
}

/* ---- the float64 reference ---- */

/* x = [q (T,nk dk) | k (T,nk dk) | v (T,nv dv) | g (T,nv,dk) | beta (T,nv) | S0 (nv,dk,dv)] */
typedef struct {
    const KdaProb *p;
    int64_t off_q, off_k, off_v, off_g, off_b, off_s, n;
    double *x, *o, *Sf, *R, *R2, *S, *u;
} KdaRef;

static KdaRef kda_ref_make(const KdaProb *p) {
    KdaRef r = {.p = p};
    const int64_t T = p->T, nq = T * p->nk * p->dk, nvv = T * p->nv * p->dv, ns = (int64_t)p->nv * p->dk * p->dv;
    const int64_t ng = T * p->nv * p->dk;
    r.off_q = 0;
    r.off_k = nq;
    r.off_v = 2 * nq;
    r.off_g = 2 * nq + nvv;
    r.off_b = r.off_g + ng;
    r.off_s = r.off_b + T * p->nv;
    r.n = r.off_s + ns;
    r.x = test_alloc(r.n * 8);
    r.o = test_alloc(nvv * 8);
    r.Sf = test_alloc(ns * 8);
    r.R = test_alloc(nvv * 8);
    r.R2 = test_alloc(ns * 8);
    r.S = test_alloc((int64_t)p->dk * p->dv * 8);
    r.u = test_alloc((int64_t)p->dv * 8);
    for (int64_t t = 0; t < T; t++) {
        for (int c = 0; c < p->nk * p->dk; c++) {
            r.x[r.off_q + t * p->nk * p->dk + c] = kq(p)[t * p->ldq + c];
            r.x[r.off_k + t * p->nk * p->dk + c] = kk(p)[t * p->ldq + c];
        }
        for (int c = 0; c < p->nv * p->dv; c++) r.x[r.off_v + t * p->nv * p->dv + c] = p->v[t * p->ldv + c];
        for (int h = 0; h < p->nv; h++) r.x[r.off_b + t * p->nv + h] = p->beta[t * p->nv + h];
    }
    for (int64_t i = 0; i < ng; i++) r.x[r.off_g + i] = p->g[i];
    for (int64_t i = 0; i < ns; i++) r.x[r.off_s + i] = p->S0 ? p->S0[i] : 0.0;
    return r;
}

static void kda_ref_forward(KdaRef *r, const double *x) {
    const KdaProb *p = r->p;
    const int nk = p->nk, nv = p->nv, dk = p->dk, dv = p->dv;
    const double scale = 1.0 / sqrt((double)dk);
    double *S = r->S, *u = r->u;
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        for (int i = 0; i < dk * dv; i++) S[i] = x[r->off_s + (int64_t)h * dk * dv + i];
        for (int64_t t = 0; t < p->T; t++) {
            const double *q = x + r->off_q + t * nk * dk + kh * dk, *k = x + r->off_k + t * nk * dk + kh * dk;
            const double *v = x + r->off_v + t * nv * dv + h * dv, *g = x + r->off_g + (t * nv + h) * dk;
            const double b = x[r->off_b + t * nv + h];
            for (int e = 0; e < dk; e++) {
                const double a = p->doc_pos[t] == 0 ? 0.0 : exp(g[e]);
                for (int c = 0; c < dv; c++) S[e * dv + c] *= a;
            }
            for (int c = 0; c < dv; c++) {
                u[c] = 0;
                for (int e = 0; e < dk; e++) u[c] += S[e * dv + c] * k[e];
            }
            for (int e = 0; e < dk; e++)
                for (int c = 0; c < dv; c++) S[e * dv + c] += k[e] * b * (v[c] - u[c]);
            double *o = r->o + t * nv * dv + h * dv;
            for (int c = 0; c < dv; c++) {
                o[c] = 0;
                for (int e = 0; e < dk; e++) o[c] += S[e * dv + c] * q[e] * scale;
            }
        }
        memcpy(r->Sf + (int64_t)h * dk * dv, S, (size_t)dk * dv * sizeof(double));
    }
}

static double kda_ref_loss(void *ctx, double *x) {
    KdaRef *r = ctx;
    const KdaProb *p = r->p;
    kda_ref_forward(r, x);
    double L = 0;
    for (int64_t i = 0; i < p->T * p->nv * p->dv; i++) L += r->o[i] * r->R[i];
    for (int64_t i = 0; i < (int64_t)p->nv * p->dk * p->dv; i++) L += r->Sf[i] * r->R2[i];
    return L;
}

/* ---- forward ---- */

static void kda_check_forward(const char *tag, const KdaProb *p, double bound) {
    const int64_t T = p->T, no = T * p->nv * p->dv, ns = (int64_t)p->nv * p->dk * p->dv;
    float *o = test_alloc(T * p->ldo * 4), *od = test_alloc(no * 4), *Sf = test_alloc(ns * 4);
    for (int64_t i = 0; i < T * p->ldo; i++) o[i] = KDA_PAD;
    kda_fwd(o, Sf, p, NULL, 0);
    KdaRef r = kda_ref_make(p);
    kda_ref_forward(&r, r.x);
    kda_dense(od, o, T, 0, p->nv * p->dv, p->ldo);
    char name[160];
    snprintf(name, sizeof name, "%s o", tag);
    test_check_rel(name, od, r.o, no, bound);
    snprintf(name, sizeof name, "%s S_final", tag);
    test_check_rel(name, Sf, r.Sf, ns, bound);
    kda_check_pad(tag, o, T, p->nv * p->dv, p->ldo);
}

/* fp32 chunked vs float64 per token: measured rel err <= 5e-7 over these cases; a channel-offset, reset or
 * decay bug gives 1e-3 or more. */
#define KDA_FWD_BOUND 5e-6

TEST(kda_forward_shapes) {
    static const int64_t Ts[] = {1, 5, 63, 64, 65, 200};
    static const struct { int nk, nv, dk, dv, with_S0; double decay; } cfg[] = {
        {1, 1, 16, 16, 0, 0.02}, {2, 2, 32, 16, 1, 2.0}, {3, 3, 16, 32, 1, 0.3}, {1, 2, 32, 32, 1, 0.3},
    };
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
        for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
            KdaProb p = kda_make(Ts[ti], cfg[ci].nk, cfg[ci].nv, cfg[ci].dk, cfg[ci].dv, cfg[ci].with_S0 ? 7 : 0, NULL,
                                 0, cfg[ci].with_S0, cfg[ci].decay, 0);
            char tag[96];
            snprintf(tag, sizeof tag, "T=%lld nk=%d nv=%d dk=%d dv=%d S0=%d decay=%g", (long long)Ts[ti], p.nk, p.nv,
                     p.dk, p.dv, cfg[ci].with_S0, cfg[ci].decay);
            kda_check_forward(tag, &p, KDA_FWD_BOUND);
        }
}

TEST(kda_forward_documents) {
    static const int starts[] = {17, 64, 100, 101, 102, 199};
    static const double decays[] = {0.02, 2.0};
    for (int di = 0; di < 2; di++) {
        char tag[96];
        KdaProb p = kda_make(200, 2, 2, 32, 16, 5, starts, 6, 1, decays[di], 0);
        snprintf(tag, sizeof tag, "docs 17,64,100,101,102,199 S0 decay=%g", decays[di]);
        kda_check_forward(tag, &p, KDA_FWD_BOUND);
        p = kda_make(200, 1, 2, 16, 32, 0, starts, 6, 1, decays[di], 0);
        snprintf(tag, sizeof tag, "doc at 0 (S0 ignored) + docs, nv=2nk decay=%g", decays[di]);
        kda_check_forward(tag, &p, KDA_FWD_BOUND);
    }
    static const int s4[] = {1, 2, 3};
    KdaProb p = kda_make(5, 1, 1, 16, 16, 2, s4, 3, 1, 0.3, 0);
    kda_check_forward("T=5 1-token docs 1,2,3", &p, KDA_FWD_BOUND);
}

/* ---- backward against finite differences ---- */

static void kda_check_grad_fd(const char *what, KdaRef *r, const float *got, int64_t off, int64_t n, int64_t nsamp,
                              double bound) {
    const int64_t m = n < nsamp ? n : nsamp;
    int64_t *idx = test_alloc(m * 8);
    float *g = test_alloc(m * 4);
    double *fd = test_alloc(m * 8);
    for (int64_t j = 0; j < m; j++) {
        idx[j] = off + (n <= nsamp ? j : (int64_t)(test_uniform() * (double)n) % n);
        g[j] = got[idx[j] - off];
    }
    test_fd_grad(fd, kda_ref_loss, r, r->x, r->n, idx, m, 1e-5);
    test_check_rel(what, g, fd, m, bound);
}

static void kda_check_backward(const char *tag, const KdaProb *p, double bound) {
    const int64_t T = p->T, nq = T * p->nk * p->dk, nvv = T * p->nv * p->dv, ns = (int64_t)p->nv * p->dk * p->dv;
    KdaRef r = kda_ref_make(p);
    float *dout = test_alloc(T * p->ldo * 4), *dSf = test_alloc(ns * 4);
    test_fill_normal(dout, T * p->ldo, 1.0);
    test_fill_normal(dSf, ns, 1.0);
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < p->nv * p->dv; c++) r.R[t * p->nv * p->dv + c] = dout[t * p->ldo + c];
    for (int64_t i = 0; i < ns; i++) r.R2[i] = dSf[i];
    KdaGrads d = kda_bwd(p, dout, dSf, NULL);
    kda_check_pad("dq|dk", d.dqk, T, 2 * p->nk * p->dk, p->ldq);
    kda_check_pad("dv", d.dv, T, p->nv * p->dv, p->ldv);
    float *dq = test_alloc(nq * 4), *dk = test_alloc(nq * 4), *dv = test_alloc(nvv * 4);
    kda_dense(dq, d.dqk, T, 0, p->nk * p->dk, p->ldq);
    kda_dense(dk, d.dqk, T, p->nk * p->dk, p->nk * p->dk, p->ldq);
    kda_dense(dv, d.dv, T, 0, p->nv * p->dv, p->ldv);
    char name[160];
    const int64_t nsamp = 160, ng = T * p->nv * p->dk;
    snprintf(name, sizeof name, "%s dq", tag);
    kda_check_grad_fd(name, &r, dq, r.off_q, nq, nsamp, bound);
    snprintf(name, sizeof name, "%s dk", tag);
    kda_check_grad_fd(name, &r, dk, r.off_k, nq, nsamp, bound);
    snprintf(name, sizeof name, "%s dv", tag);
    kda_check_grad_fd(name, &r, dv, r.off_v, nvv, nsamp, bound);
    snprintf(name, sizeof name, "%s dg (per channel)", tag);
    kda_check_grad_fd(name, &r, d.dg, r.off_g, ng, ng < 1200 ? ng : 600, bound);
    snprintf(name, sizeof name, "%s dbeta", tag);
    kda_check_grad_fd(name, &r, d.dbeta, r.off_b, T * p->nv, T * p->nv, bound);
    snprintf(name, sizeof name, "%s dS0", tag);
    kda_check_grad_fd(name, &r, d.dS0, r.off_s, ns, nsamp, bound);
}

/* fp32 gradients vs float64 central differences (h = 1e-5); measured rel err <= 2e-6; bound 1e-5. */
#define KDA_BWD_BOUND 1e-5

TEST(kda_backward_fd_documents) {
    static const int starts[] = {40, 70, 129};
    KdaProb p = kda_make(130, 1, 2, 16, 16, 3, starts, 3, 1, 0.5, 0);
    kda_check_backward("T=130 nv=2nk docs 40,70,129", &p, KDA_BWD_BOUND);
}

TEST(kda_backward_fd_strong_decay) {
    KdaProb p = kda_make(130, 2, 2, 16, 16, 11, NULL, 0, 1, 2.0, 0);
    kda_check_backward("T=130 nk=nv=2 strong", &p, KDA_BWD_BOUND);
}

TEST(kda_backward_fd_small) {
    static const int starts[] = {2, 3};
    KdaProb p = kda_make(5, 1, 1, 16, 16, 4, starts, 2, 1, 0.02, 0);
    kda_check_backward("T=5 docs 2,3 weak", &p, KDA_BWD_BOUND);
    static const int s2[] = {64};
    p = kda_make(65, 2, 2, 16, 16, 1, s2, 1, 1, 0.3, 0);
    kda_check_backward("T=65 doc at 64", &p, KDA_BWD_BOUND);
    p = kda_make(64, 1, 1, 16, 32, 9, NULL, 0, 0, 0.02, 0);
    kda_check_backward("T=64 S0=NULL doc_pos[0]=9 weak", &p, KDA_BWD_BOUND);
}

/* ---- one decay for every channel of a head: the Gated DeltaNet kernel's results (an independent oracle) ---- */

TEST(kda_equals_gdn_with_one_decay_per_head) {
    static const int starts[] = {30, 90};
    KdaProb p = kda_make(150, 1, 2, 32, 16, 6, starts, 2, 1, 0.4, 1);
    const int64_t T = p.T, no = T * p.ldo, ns = (int64_t)p.nv * p.dk * p.dv, nqk = T * p.ldq;
    float *gh = test_alloc(T * p.nv * 4);
    for (int64_t i = 0; i < T * p.nv; i++) gh[i] = p.g[i * p.dk];
    float *o1 = test_alloc(no * 4), *o2 = test_alloc(no * 4), *S1 = test_alloc(ns * 4), *S2 = test_alloc(ns * 4);
    kda_fwd(o1, S1, &p, NULL, 0);
    cpu_gdn_chunk_forward(o2, S2, kq(&p), kk(&p), p.v, gh, p.beta, p.S0, p.doc_pos, T, p.nk, p.nv, p.dk, p.dv, p.ldq,
                          p.ldv, p.ldo, NULL, 0);
    test_check_rel_f("one decay per head: o vs gdn", o1, o2, no, 1e-5);
    test_check_rel_f("one decay per head: S_final vs gdn", S1, S2, ns, 1e-5);
    float *dout = test_alloc(no * 4), *dSf = test_alloc(ns * 4);
    test_fill_normal(dout, no, 1.0);
    test_fill_normal(dSf, ns, 1.0);
    KdaGrads d = kda_bwd(&p, dout, dSf, NULL);
    float *dqk = test_alloc(nqk * 4), *dv = test_alloc(T * p.ldv * 4), *dg = test_alloc(T * p.nv * 4);
    float *db = test_alloc(T * p.nv * 4), *dS0 = test_alloc(ns * 4), *dgsum = test_alloc(T * p.nv * 4);
    cpu_gdn_chunk_backward(dqk, dqk + p.nk * p.dk, dv, dg, db, dS0, dout, dSf, kq(&p), kk(&p), p.v, gh, p.beta, p.S0,
                           p.doc_pos, T, p.nk, p.nv, p.dk, p.dv, p.ldq, p.ldv, p.ldo, NULL, 0);
    for (int64_t i = 0; i < T * p.nv; i++) {
        double s = 0;
        for (int a = 0; a < p.dk; a++) s += d.dg[i * p.dk + a];
        dgsum[i] = (float)s;
    }
    for (int64_t t = 0; t < T; t++) /* the padding of the two runs' buffers differs: compare the rows */
        for (int c = 2 * p.nk * p.dk; c < p.ldq; c++) dqk[t * p.ldq + c] = d.dqk[t * p.ldq + c];
    test_check_rel_f("one decay per head: dq|dk vs gdn", d.dqk, dqk, nqk, 1e-5);
    for (int64_t t = 0; t < T; t++)
        for (int c = p.nv * p.dv; c < p.ldv; c++) dv[t * p.ldv + c] = d.dv[t * p.ldv + c];
    test_check_rel_f("one decay per head: dv vs gdn", d.dv, dv, T * p.ldv, 1e-5);
    test_check_rel_f("one decay per head: dbeta vs gdn", d.dbeta, db, T * p.nv, 1e-5);
    test_check_rel_f("one decay per head: dS0 vs gdn", d.dS0, dS0, ns, 1e-5);
    test_check_rel_f("one decay per head: sum over channels of dg vs gdn's dg", dgsum, dg, T * p.nv, 1e-5);
}

/* ---- the CP transition S_final = M S0 + H, and the state gradient ---- */

static void kda_ref_transition(double *M, double *H, const KdaProb *p) {
    const int nk = p->nk, nv = p->nv, dk = p->dk, dv = p->dv, nc = dv + dk;
    double *X = test_alloc((int64_t)dk * nc * 8), *u = test_alloc(nc * 8);
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        for (int e = 0; e < dk; e++)
            for (int c = 0; c < nc; c++) X[e * nc + c] = c == dv + e ? 1.0 : 0.0;
        for (int64_t t = 0; t < p->T; t++) {
            const float *k = kk(p) + t * p->ldq + kh * dk, *v = p->v + t * p->ldv + h * dv;
            const float *g = p->g + (t * nv + h) * dk;
            const double b = p->beta[t * nv + h];
            for (int e = 0; e < dk; e++)
                for (int c = 0; c < nc; c++) X[e * nc + c] = p->doc_pos[t] == 0 ? 0.0 : exp((double)g[e]) * X[e * nc + c];
            for (int c = 0; c < nc; c++) {
                u[c] = 0;
                for (int e = 0; e < dk; e++) u[c] += X[e * nc + c] * k[e];
            }
            for (int e = 0; e < dk; e++)
                for (int c = 0; c < nc; c++) X[e * nc + c] += k[e] * b * ((c < dv ? v[c] : 0.0) - u[c]);
        }
        for (int e = 0; e < dk; e++)
            for (int c = 0; c < nc; c++) {
                if (c < dv) H[((int64_t)h * dk + e) * dv + c] = X[e * nc + c];
                else M[((int64_t)h * dk + e) * dk + c - dv] = X[e * nc + c];
            }
    }
}

static void kda_check_transition(const char *tag, const KdaProb *p, int expect_reset, double bound) {
    const int nv = p->nv, dk = p->dk, dv = p->dv;
    const int64_t nm = (int64_t)nv * dk * dk, nh = (int64_t)nv * dk * dv;
    float *M = test_alloc(nm * 4), *H = test_alloc(nh * 4);
    for (int64_t i = 0; i < nm; i++) M[i] = 1e3f;
    cpu_kda_chunk_transition(M, H, kk(p), p->v, p->g, p->beta, p->doc_pos, p->T, p->nk, nv, dk, dv, p->ldq, p->ldv,
                             NULL, 0);
    double *Mr = test_alloc(nm * 8), *Hr = test_alloc(nh * 8);
    kda_ref_transition(Mr, Hr, p);
    char name[160];
    snprintf(name, sizeof name, "%s H", tag);
    test_check_rel(name, H, Hr, nh, bound);
    if (expect_reset) {
        int nonzero = 0;
        for (int64_t i = 0; i < nm; i++) nonzero += M[i] != 0.0f;
        EXPECT(nonzero == 0, "%s: M has %d nonzero entries although a document starts inside", tag, nonzero);
        printf("%s M == 0 exactly: %s\n", tag, nonzero ? "NO" : "ok");
    } else {
        snprintf(name, sizeof name, "%s M", tag);
        test_check_rel(name, M, Mr, nm, bound);
    }
    /* the forward from a random S0 lands on M S0 + H; the backward with dout = 0 gives M^T dS_final */
    float *S0 = test_alloc(nh * 4), *Sf = test_alloc(nh * 4), *o = test_alloc(p->T * p->ldo * 4);
    double *want = test_alloc(nh * 8);
    test_fill_normal(S0, nh, 1.0);
    KdaProb ps = *p;
    ps.S0 = S0;
    kda_fwd(o, Sf, &ps, NULL, 0);
    for (int h = 0; h < nv; h++)
        for (int e = 0; e < dk; e++)
            for (int c = 0; c < dv; c++) {
                double s = H[((int64_t)h * dk + e) * dv + c];
                for (int f = 0; f < dk; f++) s += (double)M[((int64_t)h * dk + e) * dk + f] * S0[((int64_t)h * dk + f) * dv + c];
                want[((int64_t)h * dk + e) * dv + c] = s;
            }
    snprintf(name, sizeof name, "%s S_final(S0) vs M S0 + H", tag);
    test_check_rel(name, Sf, want, nh, bound);
    float *dout = test_alloc(p->T * p->ldo * 4), *dSf = test_alloc(nh * 4);
    test_fill_normal(dSf, nh, 1.0);
    KdaGrads d = kda_bwd(p, dout, dSf, NULL);
    for (int h = 0; h < nv; h++)
        for (int f = 0; f < dk; f++)
            for (int c = 0; c < dv; c++) {
                double s = 0;
                for (int e = 0; e < dk; e++) s += (double)M[((int64_t)h * dk + e) * dk + f] * dSf[((int64_t)h * dk + e) * dv + c];
                want[((int64_t)h * dk + f) * dv + c] = s;
            }
    snprintf(name, sizeof name, "%s dS0 (dout = 0) vs M^T dS_final", tag);
    test_check_rel(name, d.dS0, want, nh, bound);
}

/* fp32 vs float64; weak to moderate decay so that M stays far from underflow; bound 1e-5 */
TEST(kda_transition) {
    KdaProb p = kda_make(150, 1, 2, 16, 32, 4, NULL, 0, 0, 0.02, 0);
    kda_check_transition("T=150 nv=2nk no docs", &p, 0, 1e-5);
    p = kda_make(64, 2, 2, 32, 32, 1, NULL, 0, 0, 0.1, 0);
    kda_check_transition("T=64 no docs", &p, 0, 1e-5);
    p = kda_make(1, 1, 1, 16, 16, 9, NULL, 0, 0, 0.3, 0);
    kda_check_transition("T=1", &p, 0, 1e-5);
    static const int starts[] = {70};
    p = kda_make(150, 2, 2, 16, 16, 4, starts, 1, 0, 0.1, 0);
    kda_check_transition("T=150 doc at 70", &p, 1, 1e-5);
    static const int last[] = {129};
    p = kda_make(130, 1, 1, 16, 16, 2, last, 1, 0, 0.1, 0);
    kda_check_transition("T=130 doc at the last token", &p, 1, 1e-5);
}

/* dstate (dout alone) == the backward's dS0 with dS_final = 0; plus M^T dS_final == the backward's dS0 with it */
static void kda_check_dstate(const char *tag, const KdaProb *p, double bound) {
    const int nv = p->nv, dk = p->dk, dv = p->dv;
    const int64_t nm = (int64_t)nv * dk * dk, nh = (int64_t)nv * dk * dv;
    float *dout = test_alloc(p->T * p->ldo * 4), *dSf = test_alloc(nh * 4), *dS = test_alloc(nh * 4);
    test_fill_normal(dout, p->T * p->ldo, 1.0);
    test_fill_normal(dSf, nh, 1.0);
    for (int64_t i = 0; i < nh; i++) dS[i] = 1e3f;
    cpu_kda_chunk_dstate(dS, dout, kq(p), kk(p), p->g, p->beta, p->doc_pos, p->T, p->nk, nv, dk, dv, p->ldq, p->ldo,
                         NULL, 0);
    KdaGrads d0 = kda_bwd(p, dout, NULL, NULL);
    double *want = test_alloc(nh * 8);
    char name[160];
    test_to_double(want, d0.dS0, nh);
    snprintf(name, sizeof name, "%s dstate vs backward dS0 (dS_final = 0)", tag);
    test_check_rel(name, dS, want, nh, bound);
    float *M = test_alloc(nm * 4), *H = test_alloc(nh * 4), *split = test_alloc(nh * 4);
    cpu_kda_chunk_transition(M, H, kk(p), p->v, p->g, p->beta, p->doc_pos, p->T, p->nk, nv, dk, dv, p->ldq, p->ldv,
                             NULL, 0);
    KdaGrads d1 = kda_bwd(p, dout, dSf, NULL);
    cpu_gdn_state_affine(split, M, dSf, dS, 1, nv, dk, dv);
    test_to_double(want, d1.dS0, nh);
    snprintf(name, sizeof name, "%s dstate + M^T dS_final vs backward dS0", tag);
    test_check_rel(name, split, want, nh, bound);
}

TEST(kda_dstate) {
    KdaProb p = kda_make(150, 1, 2, 16, 32, 4, NULL, 0, 0, 0.05, 0);
    kda_check_dstate("T=150 nv=2nk no docs", &p, 1e-5);
    static const int starts[] = {70, 100};
    p = kda_make(150, 2, 2, 32, 16, 4, starts, 2, 0, 0.1, 0);
    kda_check_dstate("T=150 docs at 70, 100", &p, 1e-5);
    p = kda_make(80, 1, 1, 16, 16, 0, NULL, 0, 0, 0.1, 0); /* a document at 0: exactly 0 */
    const int64_t nh = (int64_t)p.nv * p.dk * p.dv;
    float *dout = test_alloc(p.T * p.ldo * 4), *dS = test_alloc(nh * 4);
    test_fill_normal(dout, p.T * p.ldo, 1.0);
    for (int64_t i = 0; i < nh; i++) dS[i] = 1e3f;
    cpu_kda_chunk_dstate(dS, dout, kq(&p), kk(&p), p.g, p.beta, p.doc_pos, p.T, p.nk, p.nv, p.dk, p.dv, p.ldq, p.ldo,
                         NULL, 0);
    int nonzero = 0;
    for (int64_t i = 0; i < nh; i++) nonzero += dS[i] != 0.0f;
    EXPECT(nonzero == 0, "doc at 0: dstate has %d nonzero entries", nonzero);
    printf("doc at 0: dstate == 0 exactly: %s\n", nonzero ? "NO" : "ok");
}

/* ---- kept Tinv, prep, stages: the bits of recomputing ---- */

static void kda_check_kept(const char *tag, const KdaProb *p) {
    const int64_t T = p->T, no = T * p->ldo, ns = (int64_t)p->nv * p->dk * p->dv, nm = (int64_t)p->nv * p->dk * p->dk;
    const size_t kb = cpu_kda_kept_bytes(T, p->nv, p->dk, p->dv, 1), db = cpu_kda_dkept_bytes(T, p->nv, p->dk, p->dv);
    float *o = test_alloc(no * 4), *o2 = test_alloc(no * 4), *Sf = test_alloc(ns * 4), *Sf2 = test_alloc(ns * 4);
    float *kept = test_alloc((int64_t)kb), *prep = test_alloc((int64_t)kb), *dkept = test_alloc((int64_t)db);
    test_fill_normal(prep, (int64_t)(kb / 4), 1.0);
    kda_fwd(o, Sf, p, kept, GDN_KEPT_STATES);
    cpu_kda_chunk_prep(prep, kk(p), p->v, p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq, p->ldv, 1);
    EXPECT(!memcmp(kept, prep, kb), "%s: the prep differs from the forward's kept Tinv", tag);
    kda_fwd(o2, Sf2, p, prep, GDN_KEPT_STATES | GDN_KEPT_PREP_IN);
    EXPECT(!memcmp(o, o2, (size_t)no * 4) && !memcmp(Sf, Sf2, (size_t)ns * 4),
           "%s: the forward from the prep differs from the one computing it", tag);
    float *M = test_alloc(nm * 4), *H = test_alloc(ns * 4), *M2 = test_alloc(nm * 4), *H2 = test_alloc(ns * 4);
    cpu_kda_chunk_transition(M, H, kk(p), p->v, p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq, p->ldv,
                             NULL, 0);
    cpu_kda_chunk_transition(M2, H2, kk(p), p->v, p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                             p->ldv, prep, 0);
    EXPECT(!memcmp(M, M2, (size_t)nm * 4) && !memcmp(H, H2, (size_t)ns * 4),
           "%s: the transition from the prep differs", tag);
    float *dout = test_alloc(no * 4), *dSf = test_alloc(ns * 4), *dS = test_alloc(ns * 4), *dS2 = test_alloc(ns * 4);
    test_fill_normal(dout, no, 1.0);
    test_fill_normal(dSf, ns, 1.0);
    cpu_kda_chunk_dstate(dS, dout, kq(p), kk(p), p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                         p->ldo, NULL, 0);
    cpu_kda_chunk_dstate(dS2, dout, kq(p), kk(p), p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                         p->ldo, prep, 0);
    EXPECT(!memcmp(dS, dS2, (size_t)ns * 4), "%s: the dstate from the prep differs", tag);
    /* the backward reading the kept Tinv, and the staged backward, against the one that substitutes again */
    KdaGrads a = kda_bwd(p, dout, dSf, NULL), b = kda_bwd(p, dout, dSf, kept);
    const int64_t n[5] = {T * p->ldq, T * p->ldv, T * p->nv * p->dk, T * p->nv, ns};
    float *ga[5] = {a.dqk, a.dv, a.dg, a.dbeta, a.dS0}, *gb[5] = {b.dqk, b.dv, b.dg, b.dbeta, b.dS0};
    static const char *names[5] = {"dq|dk", "dv", "dg", "dbeta", "dS0"};
    for (int i = 0; i < 5; i++)
        EXPECT(!memcmp(ga[i], gb[i], (size_t)n[i] * 4), "%s: the backward from the kept Tinv differs in %s", tag,
               names[i]);
    KdaGrads c = kda_grads_alloc(p); /* the same fill, then the three stages into them */
    for (int stage = GDN_BWD_DOUT; stage <= GDN_BWD_GRADS; stage++)
        cpu_kda_chunk_backward_stage(stage, dkept, c.dqk, c.dqk + p->nk * p->dk, c.dv, c.dg, c.dbeta,
                                     stage == GDN_BWD_STATE ? c.dS0 : NULL, dout, dSf, kq(p), kk(p), p->v, p->g,
                                     p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq, p->ldv, p->ldo,
                                     kept, GDN_KEPT_STATES);
    float *gc[5] = {c.dqk, c.dv, c.dg, c.dbeta, c.dS0};
    for (int i = 0; i < 5; i++)
        EXPECT(!memcmp(ga[i], gc[i], (size_t)n[i] * 4), "%s: the staged backward differs in %s", tag, names[i]);
    printf("%s: kept Tinv, prep and stages compared bitwise\n", tag);
}

TEST(kda_kept) {
    static const int starts[] = {30, 64, 65, 120};
    KdaProb p = kda_make(150, 1, 2, 16, 16, 6, starts, 4, 1, 0.3, 0);
    kda_check_kept("T=150 docs", &p);
    p = kda_make(130, 2, 2, 32, 16, 0, NULL, 0, 1, 0.05, 0);
    kda_check_kept("T=130 doc at 0", &p);
}

/* ---- [0,T) == [0,T1) then [T1,T) with the state handed over (rounding only) ---- */

TEST(kda_split_invariance) {
    static const struct { int ndocs; int starts[3]; int64_t T1; const char *tag; } cases[] = {
        {0, {0}, 77, "no docs, T1=77"},
        {1, {30}, 77, "doc at 30, T1=77"},
        {1, {77}, 77, "doc at T1=77"},
        {2, {150, 151}, 90, "docs at 150,151, T1=90"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        KdaProb p = kda_make(200, 1, 2, 16, 16, 6, cases[ci].starts, cases[ci].ndocs, 1, 0.3, 0);
        const int64_t T = p.T, T1 = cases[ci].T1, T2 = T - T1, ns = (int64_t)p.nv * p.dk * p.dv;
        float *o = test_alloc(T * p.ldo * 4), *o12 = test_alloc(T * p.ldo * 4);
        float *Sf = test_alloc(ns * 4), *Sf1 = test_alloc(ns * 4), *Sf2 = test_alloc(ns * 4);
        kda_fwd(o, Sf, &p, NULL, 0);
        KdaProb p1 = kda_rows(&p, 0, T1, p.S0), p2 = kda_rows(&p, T1, T2, Sf1);
        kda_fwd(o12, Sf1, &p1, NULL, 0);
        kda_fwd(o12 + T1 * p.ldo, Sf2, &p2, NULL, 0);
        for (int64_t t = 0; t < T; t++) /* compare the rows only */
            for (int c = p.nv * p.dv; c < p.ldo; c++) o12[t * p.ldo + c] = o[t * p.ldo + c];
        char name[160];
        snprintf(name, sizeof name, "%s split o", cases[ci].tag);
        test_check_rel_f(name, o12, o, T * p.ldo, 5e-6);
        snprintf(name, sizeof name, "%s split S_final", cases[ci].tag);
        test_check_rel_f(name, Sf2, Sf, ns, 5e-6);
        float *dout = test_alloc(T * p.ldo * 4), *dSf = test_alloc(ns * 4);
        test_fill_normal(dout, T * p.ldo, 1.0);
        test_fill_normal(dSf, ns, 1.0);
        KdaGrads dw = kda_bwd(&p, dout, dSf, NULL);
        KdaGrads d2 = kda_bwd(&p2, dout + T1 * p.ldo, dSf, NULL);
        KdaGrads d1 = kda_bwd(&p1, dout, d2.dS0, NULL);
        float *dg = test_alloc(T * p.nv * p.dk * 4);
        memcpy(dg, d1.dg, (size_t)(T1 * p.nv * p.dk) * 4);
        memcpy(dg + T1 * p.nv * p.dk, d2.dg, (size_t)(T2 * p.nv * p.dk) * 4);
        snprintf(name, sizeof name, "%s split dg", cases[ci].tag);
        test_check_rel_f(name, dg, dw.dg, T * p.nv * p.dk, 5e-6);
        float *dqk = test_alloc(T * p.ldq * 4);
        memcpy(dqk, d1.dqk, (size_t)(T1 * p.ldq) * 4);
        memcpy(dqk + T1 * p.ldq, d2.dqk, (size_t)(T2 * p.ldq) * 4);
        snprintf(name, sizeof name, "%s split dq|dk", cases[ci].tag);
        test_check_rel_f(name, dqk, dw.dqk, T * p.ldq, 5e-6);
        snprintf(name, sizeof name, "%s split dS0", cases[ci].tag);
        test_check_rel_f(name, d1.dS0, dw.dS0, ns, 5e-6);
    }
}

/* ---- the gates: g = -exp(A_log) softplus(f + dt_bias) per channel, beta = sigmoid(b) ---- */

typedef struct {
    int64_t T;
    int nv, dk, ldb, ldf;
    const float *dg, *dbeta;
} GateRef;

/* x = [b (T,nv) | f (T,nv dk) | A_log (nv) | dt_bias (nv dk)]: sum(dg g) + sum(dbeta beta) */
static double kda_gates_loss(void *ctx, double *x) {
    const GateRef *r = ctx;
    const int64_t T = r->T, w = (int64_t)r->nv * r->dk;
    const double *b = x, *f = x + T * r->nv, *A = f + T * w, *dt = A + r->nv;
    double L = 0;
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < r->nv; h++) {
            L += r->dbeta[t * r->nv + h] / (1.0 + exp(-b[t * r->nv + h]));
            for (int c = h * r->dk; c < (h + 1) * r->dk; c++)
                L += r->dg[t * w + c] * -exp(A[h]) * kda_softplus(f[t * w + c] + dt[c]);
        }
    return L;
}

TEST(kda_gates) {
    const int64_t T = 37;
    const int nv = 3, dk = 8, w = nv * dk, ldb = nv + 5, ldf = w + 3;
    float *b = test_alloc(T * ldb * 4), *f = test_alloc(T * ldf * 4), *A = test_alloc(nv * 4), *dt = test_alloc(w * 4);
    test_fill_normal(b, T * ldb, 2.0);
    test_fill_normal(f, T * ldf, 3.0);
    f[5] = 25.0f; /* above softplus's threshold */
    test_fill_uniform(A, nv, -1.5, 1.0);
    test_fill_uniform(dt, w, -1.0, 1.0);
    float *beta = test_alloc(T * nv * 4), *g = test_alloc(T * w * 4);
    cpu_kda_gates_forward(beta, g, b, f, A, dt, T, nv, dk, ldb, ldf);
    double *gw = test_alloc(T * w * 8), *bw = test_alloc(T * nv * 8);
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < nv; h++) {
            bw[t * nv + h] = 1.0 / (1.0 + exp(-(double)b[t * ldb + h]));
            for (int c = h * dk; c < (h + 1) * dk; c++)
                gw[t * w + c] = -exp((double)A[h]) * kda_softplus((double)f[t * ldf + c] + dt[c]);
        }
    test_check_rel("kda gates g", g, gw, T * w, 1e-6);
    test_check_rel("kda gates beta", beta, bw, T * nv, 1e-6);
    float *dg = test_alloc(T * w * 4), *dbeta = test_alloc(T * nv * 4);
    test_fill_normal(dg, T * w, 1.0);
    test_fill_normal(dbeta, T * nv, 1.0);
    float *db = test_alloc(T * ldb * 4), *df = test_alloc(T * ldf * 4), *dA = test_alloc(nv * 4), *ddt = test_alloc(w * 4);
    for (int h = 0; h < nv; h++) dA[h] = 0.5f; /* accumulated into */
    cpu_kda_gates_backward(db, df, dA, ddt, dbeta, dg, b, f, A, dt, T, nv, dk, ldb, ldf);
    GateRef r = {T, nv, dk, ldb, ldf, dg, dbeta};
    const int64_t n = T * nv + T * w + nv + w;
    double *x = test_alloc(n * 8), *fd = test_alloc(n * 8);
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nv; h++) x[t * nv + h] = b[t * ldb + h];
        for (int c = 0; c < w; c++) x[T * nv + t * w + c] = f[t * ldf + c];
    }
    for (int h = 0; h < nv; h++) x[T * nv + T * w + h] = A[h];
    for (int c = 0; c < w; c++) x[T * nv + T * w + nv + c] = dt[c];
    test_fd_grad(fd, kda_gates_loss, &r, x, n, NULL, n, 1e-6);
    float *got = test_alloc(n * 4);
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nv; h++) got[t * nv + h] = db[t * ldb + h];
        for (int c = 0; c < w; c++) got[T * nv + t * w + c] = df[t * ldf + c];
    }
    for (int h = 0; h < nv; h++) got[T * nv + T * w + h] = dA[h] - 0.5f;
    for (int c = 0; c < w; c++) got[T * nv + T * w + nv + c] = ddt[c];
    test_check_rel("kda gates db", got, fd, T * nv, 1e-5);
    test_check_rel("kda gates df", got + T * nv, fd + T * nv, T * w, 1e-5);
    test_check_rel("kda gates dA_log (+=)", got + T * nv + T * w, fd + T * nv + T * w, nv, 1e-5);
    test_check_rel("kda gates ddt_bias", got + T * nv + T * w + nv, fd + T * nv + T * w + nv, w, 1e-5);
}
