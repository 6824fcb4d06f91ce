/*
 * test_gdn.c — tests of the chunked gated delta rule on the cpu backend
 * (kernels/cpu/cpu_gdn.c): cpu_gdn_chunk_forward, cpu_gdn_chunk_backward (with the kept
 * Tinv: bitwise the recomputed one, gdn_tinv_kept), cpu_gdn_chunk_prep (the forward, the
 * transition and the dstate reading its Tinv: bitwise, gdn_prep_kept) and
 * the context-parallel entries cpu_gdn_chunk_transition, cpu_gdn_chunk_dstate and
 * cpu_gdn_state_affine.
 *
 * The reference is the per-token recurrence of lib/backend/backend.h, written here in
 * float64 independently of the chunked WY form the kernel uses:
 *   reset S at doc_pos == 0;  S = e^g S;  u = S^T k;  S += k (beta (v - u))^T;  o = S^T q / sqrt(dk)
 * Forward outputs are compared with it, every gradient with float64 central
 * finite differences of it (L = sum(o R) + sum(S_final R2), so dS_final is
 * exercised), the transition with a float64 product of per-token transitions.
 *
 * Inputs: q, k normal then L2-normalised per head; v normal; beta = sigmoid(normal)
 * in (0,1); g = -exp(A_log[h]) softplus(x) with A_log different per head (so a head
 * offset bug shows) and a decay knob from weak (~ -0.01/token) to strong (~ -5/token).
 * q and k live in one buffer (row [q | k | pad], like the projection output) and o, v
 * and the gradients have padded rows, so ld strides are exercised; the padding is
 * checked to be left untouched.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "test_util.h"

#define GDN_PAD_SENTINEL 777.0f

/* One problem in the kernel's strided layout. */
typedef struct GdnProb {
    int64_t  T;
    int      nk, nv, dk, dv, ldq, ldv, ldo;
    float   *qk;      /* (T, ldq): q (nk heads of dk) at column 0, k at column nk*dk, then padding */
    float   *v;       /* (T, ldv) */
    float   *g;       /* (T, nv) */
    float   *beta;    /* (T, nv) */
    float   *S0;      /* (nv, dk, dv) or NULL */
    int32_t *doc_pos; /* (T) */
} GdnProb;

static float *gdn_q(const GdnProb *p) { return p->qk; }
static float *gdn_k(const GdnProb *p) { return p->qk + (int64_t)p->nk * p->dk; }

static double gdn_softplus(double x) { return x > 20 ? x : log1p(exp(x)); }

/* doc_pos: the first token continues a document with doc_pos0 tokens before it (0: it starts
 * one); every t in starts[] starts a document. decay scales the gate magnitude (per head
 * exp(A_log) = decay * (0.3 + h)). */
static GdnProb gdn_prob_make(int64_t T, int nk, int nv, int dk, int dv, int doc_pos0, const int *starts, int nstarts,
                             int with_S0, double decay) {
    GdnProb p = {.T = T, .nk = nk, .nv = nv, .dk = dk, .dv = dv};
    p.ldq = 2 * nk * dk + 3;
    p.ldv = nv * dv + 2;
    p.ldo = nv * dv + 5;
    p.qk = test_alloc(T * p.ldq * (int64_t)sizeof(float));
    p.v = test_alloc(T * p.ldv * (int64_t)sizeof(float));
    p.g = test_alloc(T * nv * (int64_t)sizeof(float));
    p.beta = test_alloc(T * nv * (int64_t)sizeof(float));
    p.doc_pos = test_alloc(T * (int64_t)sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) {
        float *row = p.qk + t * p.ldq;
        test_fill_normal(row, 2 * nk * dk, 1.0);
        for (int hh = 0; hh < 2 * nk; hh++) { /* L2-normalise each q and k head */
            double s = 0;
            for (int a = 0; a < dk; a++) s += (double)row[hh * dk + a] * row[hh * dk + a];
            for (int a = 0; a < dk; a++) row[hh * dk + a] = (float)(row[hh * dk + a] / sqrt(s));
        }
        for (int c = 2 * nk * dk; c < p.ldq; c++) row[c] = GDN_PAD_SENTINEL;
        test_fill_normal(p.v + t * p.ldv, nv * dv, 1.0);
        for (int c = nv * dv; c < p.ldv; c++) p.v[t * p.ldv + c] = GDN_PAD_SENTINEL;
        for (int h = 0; h < nv; h++) {
            double A = decay * (0.3 + h);
            p.g[t * nv + h] = (float)(-A * gdn_softplus(1.5 * test_normal() - 0.5));
            if (p.g[t * nv + h] == 0.0f) p.g[t * nv + h] = -1e-6f; /* never zero */
            p.beta[t * nv + h] = (float)(1.0 / (1.0 + exp(-test_normal())));
        }
        p.doc_pos[t] = t == 0 ? doc_pos0 : p.doc_pos[t - 1] + 1;
    }
    for (int i = 0; i < nstarts; i++)
        if (starts[i] < T) p.doc_pos[starts[i]] = 0;
    for (int64_t t = 1; t < T; t++) /* renumber after the starts */
        if (p.doc_pos[t] != 0) p.doc_pos[t] = p.doc_pos[t - 1] + 1;
    if (with_S0) {
        p.S0 = test_alloc((int64_t)nv * dk * dv * (int64_t)sizeof(float));
        test_fill_normal(p.S0, (int64_t)nv * dk * dv, 0.5);
    }
    return p;
}

/* A view of rows [t0, t0+T) of p, with initial state S0. */
static GdnProb gdn_prob_rows(const GdnProb *p, int64_t t0, int64_t T, float *S0) {
    GdnProb r = *p;
    r.T = T;
    r.qk = p->qk + t0 * p->ldq;
    r.v = p->v + t0 * p->ldv;
    r.g = p->g + t0 * p->nv;
    r.beta = p->beta + t0 * p->nv;
    r.doc_pos = p->doc_pos + t0;
    r.S0 = S0;
    return r;
}

static void gdn_run_forward(float *o /* (T, ldo) */, float *S_final, const GdnProb *p) {
    cpu_gdn_chunk_forward(o, S_final, gdn_q(p), gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, p->T, p->nk, p->nv,
                          p->dk, p->dv, p->ldq, p->ldv, p->ldo, NULL, 0);
}

/* Gradients in the kernel's layout: dqk like qk, dv like v. */
typedef struct GdnGrads {
    float *dqk;   /* (T, ldq) */
    float *dv;    /* (T, ldv) */
    float *dg;    /* (T, nv) */
    float *dbeta; /* (T, nv) */
    float *dS0;   /* (nv, dk, dv) */
} GdnGrads;

/* Backward with every output pre-filled with garbage (they are written, not accumulated);
 * the padding columns keep the sentinel, checked by gdn_check_padding. */
static GdnGrads gdn_run_backward(const GdnProb *p, const float *dout /* (T, ldo) */, const float *dS_final) {
    GdnGrads d;
    const int64_t T = p->T, ns = (int64_t)p->nv * p->dk * p->dv;
    d.dqk = test_alloc(T * p->ldq * (int64_t)sizeof(float));
    d.dv = test_alloc(T * p->ldv * (int64_t)sizeof(float));
    d.dg = test_alloc(T * p->nv * (int64_t)sizeof(float));
    d.dbeta = test_alloc(T * p->nv * (int64_t)sizeof(float));
    d.dS0 = test_alloc(ns * (int64_t)sizeof(float));
    for (int64_t i = 0; i < T * p->ldq; i++) d.dqk[i] = i % p->ldq < 2 * p->nk * p->dk ? 1e3f : GDN_PAD_SENTINEL;
    for (int64_t i = 0; i < T * p->ldv; i++) d.dv[i] = i % p->ldv < p->nv * p->dv ? 1e3f : GDN_PAD_SENTINEL;
    for (int64_t i = 0; i < T * p->nv; i++) d.dg[i] = d.dbeta[i] = 1e3f;
    for (int64_t i = 0; i < ns; i++) d.dS0[i] = 1e3f;
    cpu_gdn_chunk_backward(d.dqk, d.dqk + (int64_t)p->nk * p->dk, d.dv, d.dg, d.dbeta, d.dS0, dout, dS_final, gdn_q(p),
                           gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                           p->ldv, p->ldo, NULL, 0);
    return d;
}

static void gdn_check_padding(const char *what, const float *x, int64_t T, int width, int ld) {
    int bad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int c = width; c < ld; c++) bad += x[t * ld + c] != GDN_PAD_SENTINEL;
    EXPECT(bad == 0, "%s: %d padding entries beyond the row width were overwritten", what, bad);
}

/* dst (T, width) dense = the first width columns of src (T, ld), starting at column c0 */
static void gdn_dense(float *dst, const float *src, int64_t T, int c0, int width, int ld) {
    for (int64_t t = 0; t < T; t++) memcpy(dst + t * width, src + t * ld + c0, (size_t)width * sizeof(float));
}

/* ---- the float64 reference ---- */

/* Parameters as one float64 vector, dense: [q (T,nk*dk) | k (T,nk*dk) | v (T,nv*dv) | g (T,nv) |
 * beta (T,nv) | S0 (nv,dk,dv)]; the finite differences perturb it. */
typedef struct GdnRef {
    const GdnProb *p;
    int64_t  off_q, off_k, off_v, off_g, off_b, off_s, n;
    double  *x;
    double  *o;      /* (T, nv*dv) */
    double  *Sf;     /* (nv, dk, dv) */
    double  *R, *R2; /* loss weights, shaped like o and Sf */
    double  *S, *u;  /* scratch (dk, dv), (dv) */
} GdnRef;

static GdnRef gdn_ref_make(const GdnProb *p) {
    GdnRef r = {.p = p};
    const int64_t T = p->T, nq = T * p->nk * p->dk, nvv = T * p->nv * p->dv, ns = (int64_t)p->nv * p->dk * p->dv;
    r.off_q = 0;
    r.off_k = nq;
    r.off_v = 2 * nq;
    r.off_g = 2 * nq + nvv;
    r.off_b = r.off_g + T * p->nv;
    r.off_s = r.off_b + T * p->nv;
    r.n = r.off_s + ns;
    r.x = test_alloc(r.n * (int64_t)sizeof(double));
    r.o = test_alloc(nvv * (int64_t)sizeof(double));
    r.Sf = test_alloc(ns * (int64_t)sizeof(double));
    r.R = test_alloc(nvv * (int64_t)sizeof(double));
    r.R2 = test_alloc(ns * (int64_t)sizeof(double));
    r.S = test_alloc((int64_t)p->dk * p->dv * (int64_t)sizeof(double));
    r.u = test_alloc((int64_t)p->dv * (int64_t)sizeof(double));
    for (int64_t t = 0; t < T; t++) {
        for (int c = 0; c < p->nk * p->dk; c++) {
            r.x[r.off_q + t * p->nk * p->dk + c] = gdn_q(p)[t * p->ldq + c];
            r.x[r.off_k + t * p->nk * p->dk + c] = gdn_k(p)[t * p->ldq + c];
        }
        for (int c = 0; c < p->nv * p->dv; c++) r.x[r.off_v + t * p->nv * p->dv + c] = p->v[t * p->ldv + c];
        for (int h = 0; h < p->nv; h++) {
            r.x[r.off_g + t * p->nv + h] = p->g[t * p->nv + h];
            r.x[r.off_b + t * p->nv + h] = p->beta[t * p->nv + h];
        }
    }
    for (int64_t i = 0; i < ns; i++) r.x[r.off_s + i] = p->S0 ? p->S0[i] : 0.0;
    return r;
}

/* The per-token recurrence over x, into r->o and r->Sf. */
static void gdn_ref_forward(GdnRef *r, const double *x) {
    const GdnProb *p = r->p;
    const int nk = p->nk, nv = p->nv, dk = p->dk, dv = p->dv;
    const double scale = 1.0 / sqrt((double)dk);
    double *S = r->S, *u = r->u;
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        for (int i = 0; i < dk * dv; i++) S[i] = x[r->off_s + (int64_t)h * dk * dv + i]; /* 0 when S0 is NULL */
        for (int64_t t = 0; t < p->T; t++) {
            const double *q = x + r->off_q + t * nk * dk + kh * dk, *k = x + r->off_k + t * nk * dk + kh * dk;
            const double *v = x + r->off_v + t * nv * dv + h * dv;
            const double a = exp(x[r->off_g + t * nv + h]), b = x[r->off_b + t * nv + h];
            if (p->doc_pos[t] == 0)
                for (int i = 0; i < dk * dv; i++) S[i] = 0.0;
            for (int i = 0; i < dk * dv; i++) S[i] *= a;
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

static double gdn_ref_loss(void *ctx, double *x) {
    GdnRef *r = ctx;
    const GdnProb *p = r->p;
    gdn_ref_forward(r, x);
    double L = 0;
    for (int64_t i = 0; i < p->T * p->nv * p->dv; i++) L += r->o[i] * r->R[i];
    for (int64_t i = 0; i < (int64_t)p->nv * p->dk * p->dv; i++) L += r->Sf[i] * r->R2[i];
    return L;
}

/* ---- forward against the recurrence ---- */

static void gdn_check_forward(const char *tag, const GdnProb *p, double bound) {
    const int64_t T = p->T, no = T * p->nv * p->dv, ns = (int64_t)p->nv * p->dk * p->dv;
    float *o = test_alloc(T * p->ldo * (int64_t)sizeof(float));
    float *od = test_alloc(no * (int64_t)sizeof(float));
    float *Sf = test_alloc(ns * (int64_t)sizeof(float));
    for (int64_t i = 0; i < T * p->ldo; i++) o[i] = GDN_PAD_SENTINEL;
    gdn_run_forward(o, Sf, p);
    GdnRef r = gdn_ref_make(p);
    gdn_ref_forward(&r, r.x);
    gdn_dense(od, o, T, 0, p->nv * p->dv, p->ldo);
    char name[160];
    snprintf(name, sizeof(name), "%s o", tag);
    test_check_rel(name, od, r.o, no, bound);
    snprintf(name, sizeof(name), "%s S_final", tag);
    test_check_rel(name, Sf, r.Sf, ns, bound);
    gdn_check_padding(tag, o, T, p->nv * p->dv, p->ldo);
}

/* Bounds: fp32 chunked vs float64 per-token, measured rel err <= 3.2e-7 over every case of this
 * file; 5e-6 leaves 15x for other compilers/CPUs, while any real bug (a head offset, a missed
 * reset, a wrong gate) gives 1e-3 or more. */
#define GDN_FWD_BOUND 5e-6

TEST(gdn_forward_shapes) {
    static const int64_t Ts[] = {1, 5, 63, 64, 65, 200, 300};
    static const struct { int nk, nv, dk, dv, with_S0; double decay; } cfg[] = {
        {1, 1, 16, 16, 0, 0.02}, {2, 2, 32, 16, 1, 2.0}, {3, 3, 16, 64, 1, 0.3},
        {4, 4, 32, 32, 1, 0.02}, {1, 2, 64, 64, 1, 2.0}, {2, 4, 16, 32, 1, 0.3},
    };
    for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++)
        for (size_t ci = 0; ci < sizeof(cfg) / sizeof(cfg[0]); ci++) {
            GdnProb p = gdn_prob_make(Ts[ti], cfg[ci].nk, cfg[ci].nv, cfg[ci].dk, cfg[ci].dv, cfg[ci].with_S0 ? 7 : 0,
                                      NULL, 0, cfg[ci].with_S0, cfg[ci].decay);
            char tag[96];
            snprintf(tag, sizeof(tag), "T=%lld nk=%d nv=%d dk=%d dv=%d S0=%d decay=%g", (long long)Ts[ti], p.nk, p.nv,
                     p.dk, p.dv, cfg[ci].with_S0, cfg[ci].decay);
            gdn_check_forward(tag, &p, GDN_FWD_BOUND);
        }
}

/* Documents starting at t=0, mid-chunk (17, 100), on a chunk boundary (64), two adjacent
 * 1-token documents (100, 101), one at the last token; S0 given with doc_pos[0] != 0 (it reaches
 * the first document only) and with doc_pos[0] == 0 (it must be ignored). */
TEST(gdn_forward_documents) {
    static const int starts[] = {17, 64, 100, 101, 102, 199};
    static const double decays[] = {0.02, 2.0};
    for (int di = 0; di < 2; di++) {
        char tag[96];
        GdnProb p = gdn_prob_make(200, 1, 2, 32, 16, 5, starts, 6, 1, decays[di]);
        snprintf(tag, sizeof(tag), "docs 17,64,100,101,102,199 S0 decay=%g", decays[di]);
        gdn_check_forward(tag, &p, GDN_FWD_BOUND);
        p = gdn_prob_make(200, 2, 4, 16, 32, 0, starts, 6, 1, decays[di]);
        snprintf(tag, sizeof(tag), "doc at 0 (S0 ignored) + docs, GQA decay=%g", decays[di]);
        gdn_check_forward(tag, &p, GDN_FWD_BOUND);
    }
    static const int s2[] = {64};
    GdnProb p = gdn_prob_make(65, 2, 2, 16, 16, 3, s2, 1, 1, 0.3);
    gdn_check_forward("T=65 doc at 64", &p, GDN_FWD_BOUND);
    static const int s3[] = {128, 150, 299};
    p = gdn_prob_make(300, 1, 1, 64, 32, 40, s3, 3, 1, 0.3);
    gdn_check_forward("T=300 docs 128,150,299", &p, GDN_FWD_BOUND);
    static const int s4[] = {1, 2, 3};
    p = gdn_prob_make(5, 1, 2, 16, 16, 2, s4, 3, 1, 0.3);
    gdn_check_forward("T=5 1-token docs 1,2,3", &p, GDN_FWD_BOUND);
}

/* The reset at a document start must also cut S0: with doc_pos[0] == 0, dS0 is exactly 0 and
 * the output does not depend on S0 at all. */
TEST(gdn_doc_start_ignores_S0) {
    static const int starts[] = {40};
    GdnProb p = gdn_prob_make(70, 1, 2, 16, 16, 0, starts, 1, 1, 0.3);
    GdnProb p0 = p;
    p0.S0 = NULL;
    const int64_t no = p.T * p.ldo;
    float *o1 = test_alloc(no * (int64_t)sizeof(float)), *o2 = test_alloc(no * (int64_t)sizeof(float));
    gdn_run_forward(o1, NULL, &p);
    gdn_run_forward(o2, NULL, &p0);
    EXPECT(memcmp(o1, o2, (size_t)no * sizeof(float)) == 0, "output depends on S0 although doc_pos[0] == 0");
    float *dout = test_alloc(no * (int64_t)sizeof(float));
    test_fill_normal(dout, no, 1.0);
    GdnGrads d = gdn_run_backward(&p, dout, NULL);
    int nonzero = 0;
    for (int64_t i = 0; i < (int64_t)p.nv * p.dk * p.dv; i++) nonzero += d.dS0[i] != 0.0f;
    EXPECT(nonzero == 0, "dS0 has %d nonzero entries although doc_pos[0] == 0", nonzero);
    printf("doc start at 0: S0 ignored, dS0 == 0 ok\n");
}

/* ---- backward against finite differences ---- */

/* Compares one gradient (dense float, n entries at x offset off) with central differences of the
 * reference loss at up to nsamp entries (all when n <= nsamp; otherwise a random subset). */
static void gdn_check_grad_fd(const char *what, GdnRef *r, const float *got, int64_t off, int64_t n, int64_t nsamp,
                              double bound) {
    const int64_t m = n < nsamp ? n : nsamp;
    int64_t *idx = test_alloc(m * (int64_t)sizeof(int64_t));
    float *g = test_alloc(m * (int64_t)sizeof(float));
    double *fd = test_alloc(m * (int64_t)sizeof(double));
    for (int64_t j = 0; j < m; j++) {
        idx[j] = off + (n <= nsamp ? j : (int64_t)(test_uniform() * (double)n) % n);
        g[j] = got[idx[j] - off];
    }
    test_fd_grad(fd, gdn_ref_loss, r, r->x, r->n, idx, m, 1e-5);
    test_check_rel(what, g, fd, m, bound);
}

static void gdn_check_backward(const char *tag, const GdnProb *p, double bound) {
    const int64_t T = p->T, nq = T * p->nk * p->dk, nvv = T * p->nv * p->dv, ns = (int64_t)p->nv * p->dk * p->dv;
    GdnRef r = gdn_ref_make(p);
    float *dout = test_alloc(T * p->ldo * (int64_t)sizeof(float));
    float *dSf = test_alloc(ns * (int64_t)sizeof(float));
    test_fill_normal(dout, T * p->ldo, 1.0);
    test_fill_normal(dSf, ns, 1.0);
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < p->nv * p->dv; c++) r.R[t * p->nv * p->dv + c] = dout[t * p->ldo + c];
    for (int64_t i = 0; i < ns; i++) r.R2[i] = dSf[i];
    GdnGrads d = gdn_run_backward(p, dout, dSf);
    gdn_check_padding("dq|dk", d.dqk, T, 2 * p->nk * p->dk, p->ldq);
    gdn_check_padding("dv", d.dv, T, p->nv * p->dv, p->ldv);
    float *dq = test_alloc(nq * (int64_t)sizeof(float)), *dk = test_alloc(nq * (int64_t)sizeof(float));
    float *dv = test_alloc(nvv * (int64_t)sizeof(float));
    gdn_dense(dq, d.dqk, T, 0, p->nk * p->dk, p->ldq);
    gdn_dense(dk, d.dqk, T, p->nk * p->dk, p->nk * p->dk, p->ldq);
    gdn_dense(dv, d.dv, T, 0, p->nv * p->dv, p->ldv);
    char name[160];
    const int64_t nsamp = 160;
    snprintf(name, sizeof(name), "%s dq", tag);
    gdn_check_grad_fd(name, &r, dq, r.off_q, nq, nsamp, bound);
    snprintf(name, sizeof(name), "%s dk", tag);
    gdn_check_grad_fd(name, &r, dk, r.off_k, nq, nsamp, bound);
    snprintf(name, sizeof(name), "%s dv", tag);
    gdn_check_grad_fd(name, &r, dv, r.off_v, nvv, nsamp, bound);
    snprintf(name, sizeof(name), "%s dg", tag); /* every entry: chunk edges and document starts all show */
    gdn_check_grad_fd(name, &r, d.dg, r.off_g, T * p->nv, T * p->nv, bound);
    snprintf(name, sizeof(name), "%s dbeta", tag);
    gdn_check_grad_fd(name, &r, d.dbeta, r.off_b, T * p->nv, T * p->nv, bound);
    snprintf(name, sizeof(name), "%s dS0", tag);
    gdn_check_grad_fd(name, &r, d.dS0, r.off_s, ns, nsamp, bound);
}

/* fp32 gradients vs float64 central differences (h = 1e-5: truncation and rounding ~1e-9 here).
 * Measured rel err <= 4.5e-7, except dg of the T=5 case at 1.4e-6 (few, small entries that are
 * sums of cancelling terms); bound 1e-5. */
#define GDN_BWD_BOUND 1e-5

TEST(gdn_backward_fd_documents) {
    static const int starts[] = {40, 70, 129};
    GdnProb p = gdn_prob_make(130, 1, 2, 16, 32, 3, starts, 3, 1, 0.5);
    gdn_check_backward("T=130 GQA docs 40,70,129", &p, GDN_BWD_BOUND);
}

TEST(gdn_backward_fd_strong_decay) {
    GdnProb p = gdn_prob_make(130, 2, 4, 16, 16, 11, NULL, 0, 1, 2.0);
    gdn_check_backward("T=130 nk=2 nv=4 strong", &p, GDN_BWD_BOUND);
}

TEST(gdn_backward_fd_small) {
    static const int starts[] = {2, 3};
    GdnProb p = gdn_prob_make(5, 1, 1, 32, 16, 4, starts, 2, 1, 0.02);
    gdn_check_backward("T=5 docs 2,3 weak", &p, GDN_BWD_BOUND);
    static const int s2[] = {64};
    p = gdn_prob_make(65, 2, 2, 16, 16, 1, s2, 1, 1, 0.3);
    gdn_check_backward("T=65 doc at 64", &p, GDN_BWD_BOUND);
    p = gdn_prob_make(64, 1, 1, 16, 32, 9, NULL, 0, 0, 0.02); /* S0 = NULL: dS0 is taken at S0 = 0 */
    gdn_check_backward("T=64 S0=NULL doc_pos[0]=9 weak", &p, GDN_BWD_BOUND);
}

/* ---- the kept Tinv (backend.h gdn_kept_bytes; the cpu backend keeps Tinv): the backward that reads the forward's Tinv gives the
 * bits of the backward that solves again, and writing it leaves the forward's bits alone ---- */

static void gdn_check_tinv_kept(const char *tag, const GdnProb *p) {
    const int64_t T = p->T, no = T * p->ldo, ns = (int64_t)p->nv * p->dk * p->dv;
    float *o = test_alloc(no * (int64_t)sizeof(float)), *o2 = test_alloc(no * (int64_t)sizeof(float));
    float *Sf = test_alloc(ns * (int64_t)sizeof(float)), *Sf2 = test_alloc(ns * (int64_t)sizeof(float));
    float *tinv = test_alloc((int64_t)cpu_gdn_kept_bytes(T, p->nv, p->dk, p->dv, 0));
    float *dout = test_alloc(no * (int64_t)sizeof(float)), *dSf = test_alloc(ns * (int64_t)sizeof(float));
    test_fill_normal(dout, no, 1.0);
    test_fill_normal(dSf, ns, 0.5);
    gdn_run_forward(o, Sf, p);
    cpu_gdn_chunk_forward(o2, Sf2, gdn_q(p), gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk,
                          p->dv, p->ldq, p->ldv, p->ldo, tinv, 0);
    EXPECT(!memcmp(o, o2, (size_t)no * sizeof(float)) && !memcmp(Sf, Sf2, (size_t)ns * sizeof(float)),
          "%s: the forward writing Tinv changed o or S_final", tag);
    GdnGrads a = gdn_run_backward(p, dout, dSf);
    GdnGrads b = a; /* the same garbage pre-fill, then the kept Tinv */
    b.dqk = test_alloc(T * p->ldq * (int64_t)sizeof(float));
    b.dv = test_alloc(T * p->ldv * (int64_t)sizeof(float));
    b.dg = test_alloc(T * p->nv * (int64_t)sizeof(float));
    b.dbeta = test_alloc(T * p->nv * (int64_t)sizeof(float));
    b.dS0 = test_alloc(ns * (int64_t)sizeof(float));
    for (int64_t i = 0; i < T * p->ldq; i++) b.dqk[i] = i % p->ldq < 2 * p->nk * p->dk ? 1e3f : GDN_PAD_SENTINEL;
    for (int64_t i = 0; i < T * p->ldv; i++) b.dv[i] = i % p->ldv < p->nv * p->dv ? 1e3f : GDN_PAD_SENTINEL;
    cpu_gdn_chunk_backward(b.dqk, b.dqk + (int64_t)p->nk * p->dk, b.dv, b.dg, b.dbeta, b.dS0, dout, dSf, gdn_q(p),
                           gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                           p->ldv, p->ldo, tinv, 0);
    const struct { const char *name; const float *x, *y; int64_t n; } c[] = {
        {"dq|dk", a.dqk, b.dqk, T * p->ldq}, {"dv", a.dv, b.dv, T * p->ldv}, {"dg", a.dg, b.dg, T * p->nv},
        {"dbeta", a.dbeta, b.dbeta, T * p->nv}, {"dS0", a.dS0, b.dS0, ns}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        EXPECT(!memcmp(c[i].x, c[i].y, (size_t)c[i].n * sizeof(float)), "%s: %s with the kept Tinv differs from the "
              "recomputed one", tag, c[i].name);
    /* and the kept Tinv is read: one token's row zeroed (every head) changes the gradients */
    memset(tinv + (T / 2) * p->nv * 64, 0, (size_t)p->nv * 64 * sizeof(float));
    float *db2 = test_alloc(T * p->nv * (int64_t)sizeof(float));
    memcpy(db2, b.dbeta, (size_t)(T * p->nv) * sizeof(float));
    cpu_gdn_chunk_backward(b.dqk, b.dqk + (int64_t)p->nk * p->dk, b.dv, b.dg, b.dbeta, b.dS0, dout, dSf, gdn_q(p),
                           gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                           p->ldv, p->ldo, tinv, 0);
    EXPECT(memcmp(db2, b.dbeta, (size_t)(T * p->nv) * sizeof(float)) != 0, "%s: a sabotaged kept Tinv went unseen", tag);
}

/* two problems for the kept buffer: documents (1-token ones, one at the last token), S0; GQA, strong decay */
static void gdn_kept_doc_cases(void (*check)(const char *tag, const GdnProb *p)) {
    static const int starts[] = {17, 64, 100, 101, 102, 199};
    GdnProb p = gdn_prob_make(200, 1, 2, 32, 16, 5, starts, 6, 1, 0.3);
    check("T=200 docs, S0", &p);
    p = gdn_prob_make(200, 2, 4, 16, 32, 0, starts, 6, 1, 2.0);
    check("T=200 docs, GQA, strong decay", &p);
}

TEST(gdn_tinv_kept) {
    gdn_kept_doc_cases(gdn_check_tinv_kept);
    static const int s3[] = {128, 150, 299};
    GdnProb p = gdn_prob_make(300, 1, 1, 64, 32, 40, s3, 3, 1, 0.02);
    gdn_check_tinv_kept("T=300 docs, weak decay", &p);
    static const int s4[] = {1, 2, 3};
    p = gdn_prob_make(5, 1, 2, 16, 16, 2, s4, 3, 0, 0.3);
    gdn_check_tinv_kept("T=5 1-token docs, S0 NULL", &p);
}

/* ---- split invariance: [0,T) == [0,T1) then [T1,T) with the state handed over ---- */

/* rows [t0, t0+T) of dst (dense, width) = the first width columns of src (T, ld) from column c0 */
static void gdn_dense_at(float *dst, int64_t t0, const float *src, int64_t T, int c0, int width, int ld) {
    gdn_dense(dst + t0 * width, src, T, c0, width, ld);
}

static void gdn_check_split(const char *tag, const GdnProb *p, int64_t T1, double bound) {
    const int64_t T = p->T, T2 = T - T1, ns = (int64_t)p->nv * p->dk * p->dv;
    const int wq = p->nk * p->dk, wv = p->nv * p->dv;
    float *o = test_alloc(T * p->ldo * (int64_t)sizeof(float)), *o12 = test_alloc(T * p->ldo * (int64_t)sizeof(float));
    float *Sf = test_alloc(ns * (int64_t)sizeof(float)), *Sf1 = test_alloc(ns * (int64_t)sizeof(float));
    float *Sf2 = test_alloc(ns * (int64_t)sizeof(float));
    gdn_run_forward(o, Sf, p);
    GdnProb p1 = gdn_prob_rows(p, 0, T1, p->S0), p2 = gdn_prob_rows(p, T1, T2, Sf1);
    gdn_run_forward(o12, Sf1, &p1);
    gdn_run_forward(o12 + T1 * p->ldo, Sf2, &p2);
    float *a = test_alloc(T * wv * (int64_t)sizeof(float)), *b = test_alloc(T * wv * (int64_t)sizeof(float));
    gdn_dense(a, o12, T, 0, wv, p->ldo);
    gdn_dense(b, o, T, 0, wv, p->ldo);
    char name[160];
    snprintf(name, sizeof(name), "%s split o", tag);
    test_check_rel_f(name, a, b, T * wv, bound);
    snprintf(name, sizeof(name), "%s split S_final", tag);
    test_check_rel_f(name, Sf2, Sf, ns, bound);

    /* backward: the second part's dS0 is the first part's dS_final */
    float *dout = test_alloc(T * p->ldo * (int64_t)sizeof(float)), *dSf = test_alloc(ns * (int64_t)sizeof(float));
    test_fill_normal(dout, T * p->ldo, 1.0);
    test_fill_normal(dSf, ns, 1.0);
    GdnGrads dw = gdn_run_backward(p, dout, dSf);
    GdnGrads d2 = gdn_run_backward(&p2, dout + T1 * p->ldo, dSf);
    GdnGrads d1 = gdn_run_backward(&p1, dout, d2.dS0);
    static const char *names[] = {"dq", "dk", "dv"};
    for (int which = 0; which < 3; which++) {
        const int width = which < 2 ? wq : wv, c0 = which == 1 ? wq : 0, ld = which < 2 ? p->ldq : p->ldv;
        const float *whole = which < 2 ? dw.dqk : dw.dv, *g1 = which < 2 ? d1.dqk : d1.dv, *g2 = which < 2 ? d2.dqk : d2.dv;
        float *x = test_alloc(T * width * (int64_t)sizeof(float)), *y = test_alloc(T * width * (int64_t)sizeof(float));
        gdn_dense_at(x, 0, g1, T1, c0, width, ld);
        gdn_dense_at(x, T1, g2, T2, c0, width, ld);
        gdn_dense(y, whole, T, c0, width, ld);
        snprintf(name, sizeof(name), "%s split %s", tag, names[which]);
        test_check_rel_f(name, x, y, T * width, bound);
    }
    float *x = test_alloc(T * p->nv * (int64_t)sizeof(float));
    memcpy(x, d1.dg, (size_t)(T1 * p->nv) * sizeof(float));
    memcpy(x + T1 * p->nv, d2.dg, (size_t)(T2 * p->nv) * sizeof(float));
    snprintf(name, sizeof(name), "%s split dg", tag);
    test_check_rel_f(name, x, dw.dg, T * p->nv, bound);
    memcpy(x, d1.dbeta, (size_t)(T1 * p->nv) * sizeof(float));
    memcpy(x + T1 * p->nv, d2.dbeta, (size_t)(T2 * p->nv) * sizeof(float));
    snprintf(name, sizeof(name), "%s split dbeta", tag);
    test_check_rel_f(name, x, dw.dbeta, T * p->nv, bound);
    snprintf(name, sizeof(name), "%s split dS0", tag);
    test_check_rel_f(name, d1.dS0, dw.dS0, ns, bound);
}

/* Both sides fp32 with different chunk cuts, so they differ by rounding only: measured
 * rel err <= 3.9e-7; bound 5e-6. */
TEST(gdn_split_invariance) {
    static const struct { int ndocs; int starts[3]; int64_t T1; const char *tag; } cases[] = {
        {0, {0}, 77, "no docs, T1=77"},
        {1, {30}, 77, "doc at 30 (part 1), T1=77"},
        {2, {150, 151}, 77, "docs at 150,151 (part 2), T1=77"},
        {1, {77}, 77, "doc at T1=77"},
        {3, {20, 100, 130}, 90, "docs at 20 | 100,130, T1=90"},
        {0, {0}, 199, "no docs, T1=199 (1-token part 2)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        GdnProb p = gdn_prob_make(200, 1, 2, 32, 16, 6, cases[i].starts, cases[i].ndocs, 1, 0.3);
        gdn_check_split(cases[i].tag, &p, cases[i].T1, 5e-6);
    }
}

/* ---- the CP transition: S_final = M S0 + H ---- */

/* float64 reference: the per-token recurrence carried on X = [H | M] from [0 | I], reset to 0 at
 * every document start (M then stays 0). */
static void gdn_ref_transition(double *M /* (nv,dk,dk) */, double *H /* (nv,dk,dv) */, const GdnProb *p) {
    const int nk = p->nk, nv = p->nv, dk = p->dk, dv = p->dv, nc = dv + dk;
    double *X = test_alloc((int64_t)dk * nc * (int64_t)sizeof(double)), *u = test_alloc(nc * (int64_t)sizeof(double));
    for (int h = 0; h < nv; h++) {
        const int kh = h / (nv / nk);
        for (int e = 0; e < dk; e++)
            for (int c = 0; c < nc; c++) X[e * nc + c] = c == dv + e ? 1.0 : 0.0;
        for (int64_t t = 0; t < p->T; t++) {
            const float *k = gdn_k(p) + t * p->ldq + kh * dk, *v = p->v + t * p->ldv + h * dv;
            const double a = exp((double)p->g[t * nv + h]), b = p->beta[t * nv + h];
            for (int i = 0; i < dk * nc; i++) X[i] = p->doc_pos[t] == 0 ? 0.0 : a * X[i];
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

static void gdn_check_transition(const char *tag, const GdnProb *p, int expect_reset, double bound) {
    const int nv = p->nv, dk = p->dk, dv = p->dv;
    const int64_t nm = (int64_t)nv * dk * dk, nh = (int64_t)nv * dk * dv;
    float *M = test_alloc(nm * (int64_t)sizeof(float)), *H = test_alloc(nh * (int64_t)sizeof(float));
    for (int64_t i = 0; i < nm; i++) M[i] = 1e3f; /* written, not accumulated */
    cpu_gdn_chunk_transition(M, H, gdn_k(p), p->v, p->g, p->beta, p->doc_pos, p->T, p->nk, nv, dk, dv, p->ldq, p->ldv,
                             NULL, 0);
    double *Mr = test_alloc(nm * (int64_t)sizeof(double)), *Hr = test_alloc(nh * (int64_t)sizeof(double));
    gdn_ref_transition(Mr, Hr, p);
    char name[160];
    snprintf(name, sizeof(name), "%s H", tag);
    test_check_rel(name, H, Hr, nh, bound);
    if (expect_reset) {
        int nonzero = 0;
        for (int64_t i = 0; i < nm; i++) nonzero += M[i] != 0.0f;
        EXPECT(nonzero == 0, "%s: M has %d nonzero entries although a document starts inside", tag, nonzero);
        printf("%s M == 0 exactly: %s\n", tag, nonzero ? "NO" : "ok");
    } else {
        snprintf(name, sizeof(name), "%s M", tag);
        test_check_rel(name, M, Mr, nm, bound);
    }
    /* the forward from two random S0 lands on M S0 + H */
    float *S0 = test_alloc(nh * (int64_t)sizeof(float)), *Sf = test_alloc(nh * (int64_t)sizeof(float));
    float *o = test_alloc(p->T * p->ldo * (int64_t)sizeof(float));
    double *want = test_alloc(nh * (int64_t)sizeof(double));
    for (int trial = 0; trial < 2; trial++) {
        test_fill_normal(S0, nh, 1.0);
        GdnProb ps = *p;
        ps.S0 = S0;
        gdn_run_forward(o, Sf, &ps);
        for (int h = 0; h < nv; h++)
            for (int e = 0; e < dk; e++)
                for (int c = 0; c < dv; c++) {
                    double s = H[((int64_t)h * dk + e) * dv + c];
                    for (int f = 0; f < dk; f++)
                        s += (double)M[((int64_t)h * dk + e) * dk + f] * S0[((int64_t)h * dk + f) * dv + c];
                    want[((int64_t)h * dk + e) * dv + c] = s;
                }
        snprintf(name, sizeof(name), "%s S_final(S0 #%d) vs M S0 + H", tag, trial);
        test_check_rel(name, Sf, want, nh, bound);
    }
    /* the backward carries a gradient at the final state back to dS0 = M^T dS_final (with no
     * output gradient): the CP backward folds the segments with M^T */
    float *dout = test_alloc(p->T * p->ldo * (int64_t)sizeof(float)), *dSf = test_alloc(nh * (int64_t)sizeof(float));
    test_fill_normal(dSf, nh, 1.0);
    GdnGrads d = gdn_run_backward(p, dout, dSf);
    for (int h = 0; h < nv; h++)
        for (int f = 0; f < dk; f++)
            for (int c = 0; c < dv; c++) {
                double s = 0;
                for (int e = 0; e < dk; e++)
                    s += (double)M[((int64_t)h * dk + e) * dk + f] * dSf[((int64_t)h * dk + e) * dv + c];
                want[((int64_t)h * dk + f) * dv + c] = s;
            }
    snprintf(name, sizeof(name), "%s dS0 (dout = 0) vs M^T dS_final", tag);
    test_check_rel(name, d.dS0, want, nh, bound);
}

/* fp32 vs float64: measured rel err <= 1.3e-6 (M over 150 tokens); bound 1e-5. Decay is weak to
 * moderate so that M (which carries e^{sum g} over the whole range) stays far from fp32 underflow. */
TEST(gdn_transition) {
    GdnProb p = gdn_prob_make(150, 1, 2, 16, 32, 4, NULL, 0, 0, 0.02);
    gdn_check_transition("T=150 GQA no docs", &p, 0, 1e-5);
    p = gdn_prob_make(64, 2, 2, 32, 16, 1, NULL, 0, 0, 0.1);
    gdn_check_transition("T=64 no docs", &p, 0, 1e-5);
    p = gdn_prob_make(1, 1, 1, 16, 16, 9, NULL, 0, 0, 0.3);
    gdn_check_transition("T=1", &p, 0, 1e-5);
    static const int starts[] = {70};
    p = gdn_prob_make(150, 2, 4, 32, 16, 4, starts, 1, 0, 0.1);
    gdn_check_transition("T=150 GQA doc at 70", &p, 1, 1e-5);
    p = gdn_prob_make(100, 1, 1, 16, 16, 0, NULL, 0, 0, 0.1);
    gdn_check_transition("T=100 doc at 0", &p, 1, 1e-5);
    static const int last[] = {129};
    p = gdn_prob_make(130, 1, 2, 16, 16, 2, last, 1, 0, 0.1);
    gdn_check_transition("T=130 doc at the last token", &p, 1, 1e-5);
}

/* The CP backward's split of dS0 (docs/design/gdn-cp.md): the full backward's dS0 with a gradient
 * dS_final arriving at the end equals the call's own state gradient (cpu_gdn_chunk_dstate, dout
 * only) plus M^T dS_final. The full backward is checked against finite differences above, so this
 * pins the state-gradient pass to it. */
static void gdn_check_dstate(const char *tag, const GdnProb *p, double bound) {
    const int nv = p->nv, dk = p->dk, dv = p->dv;
    const int64_t nm = (int64_t)nv * dk * dk, nh = (int64_t)nv * dk * dv;
    float *dout = test_alloc(p->T * p->ldo * (int64_t)sizeof(float));
    test_fill_normal(dout, p->T * p->ldo, 1.0);
    float *dSf = test_alloc(nh * (int64_t)sizeof(float));
    test_fill_normal(dSf, nh, 1.0);
    float *dS = test_alloc(nh * (int64_t)sizeof(float));
    for (int64_t i = 0; i < nh; i++) dS[i] = 1e3f; /* written, not accumulated */
    cpu_gdn_chunk_dstate(dS, dout, gdn_q(p), gdn_k(p), p->g, p->beta, p->doc_pos, p->T, p->nk, nv, dk, dv, p->ldq,
                         p->ldo, NULL, 0);
    GdnGrads d0 = gdn_run_backward(p, dout, NULL);
    char name[160];
    double *want = test_alloc(nh * (int64_t)sizeof(double));
    test_to_double(want, d0.dS0, nh);
    snprintf(name, sizeof(name), "%s dstate vs backward dS0 (dS_final = 0)", tag);
    test_check_rel(name, dS, want, nh, bound);
    float *M = test_alloc(nm * (int64_t)sizeof(float)), *H = test_alloc(nh * (int64_t)sizeof(float));
    cpu_gdn_chunk_transition(M, H, gdn_k(p), p->v, p->g, p->beta, p->doc_pos, p->T, p->nk, nv, dk, dv, p->ldq, p->ldv,
                             NULL, 0);
    GdnGrads d1 = gdn_run_backward(p, dout, dSf);
    float *split = test_alloc(nh * (int64_t)sizeof(float));
    cpu_gdn_state_affine(split, M, dSf, dS, 1, nv, dk, dv);
    test_to_double(want, d1.dS0, nh);
    snprintf(name, sizeof(name), "%s dstate + M^T dS_final vs backward dS0", tag);
    test_check_rel(name, split, want, nh, bound);
}

/* ---- the prep written alone (cpu_gdn_chunk_prep, backend.h gdn_chunk_prep): the Tinv the forward would
 * write, and the forward told GDN_KEPT_PREP_IN and the transition given it read it: the bits of computing
 * it inside ---- */

static void gdn_check_prep_kept(const char *tag, const GdnProb *p) {
    const int64_t T = p->T, no = T * p->ldo, ns = (int64_t)p->nv * p->dk * p->dv, nm = (int64_t)p->nv * p->dk * p->dk;
    const size_t kb = cpu_gdn_kept_bytes(T, p->nv, p->dk, p->dv, 0);
    float *o = test_alloc(no * 4), *o2 = test_alloc(no * 4), *Sf = test_alloc(ns * 4), *Sf2 = test_alloc(ns * 4);
    float *fwd_kept = test_alloc((int64_t)kb), *prep = test_alloc((int64_t)kb);
    test_fill_normal(prep, (int64_t)(kb / sizeof(float)), 1.0); /* every byte is written */
    cpu_gdn_chunk_forward(o, Sf, gdn_q(p), gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk,
                          p->dv, p->ldq, p->ldv, p->ldo, fwd_kept, 0);
    cpu_gdn_chunk_prep(prep, gdn_k(p), p->v, p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq, p->ldv,
                       0);
    EXPECT(!memcmp(fwd_kept, prep, kb), "%s: the prep's Tinv differs from the forward's", tag);
    cpu_gdn_chunk_forward(o2, Sf2, gdn_q(p), gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk,
                          p->dv, p->ldq, p->ldv, p->ldo, prep, GDN_KEPT_PREP_IN);
    EXPECT(!memcmp(o, o2, (size_t)no * 4) && !memcmp(Sf, Sf2, (size_t)ns * 4),
           "%s: the forward from the prep differs from the forward computing it", tag);
    EXPECT(!memcmp(fwd_kept, prep, kb), "%s: the forward told PREP_IN wrote its kept buffer", tag);
    float *M = test_alloc(nm * 4), *H = test_alloc(ns * 4), *M2 = test_alloc(nm * 4), *H2 = test_alloc(ns * 4);
    cpu_gdn_chunk_transition(M, H, gdn_k(p), p->v, p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                             p->ldv, NULL, 0);
    cpu_gdn_chunk_transition(M2, H2, gdn_k(p), p->v, p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                             p->ldv, prep, 0);
    EXPECT(!memcmp(M, M2, (size_t)nm * 4) && !memcmp(H, H2, (size_t)ns * 4),
           "%s: the transition from the prep differs from the one computing it", tag);
    float *dout = test_alloc(no * 4), *dS = test_alloc(ns * 4), *dS2 = test_alloc(ns * 4);
    test_fill_normal(dout, no, 1.0);
    cpu_gdn_chunk_dstate(dS, dout, gdn_q(p), gdn_k(p), p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                         p->ldo, NULL, 0);
    cpu_gdn_chunk_dstate(dS2, dout, gdn_q(p), gdn_k(p), p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv,
                         p->ldq, p->ldo, prep, 0);
    EXPECT(!memcmp(dS, dS2, (size_t)ns * 4), "%s: the dstate from the prep differs from the one computing it", tag);
    /* and each reads it: the first and last tokens' Tinv rows scaled change the forward's output, the
     * transition's H (the last token follows the last document start) and, where the state enters, the dstate
     * (the first token precedes the first document start) */
    for (int64_t t = 0; t < T; t += T - 1)
        for (int i = 0; i < p->nv * 64; i++) prep[(t * p->nv) * 64 + i] *= 1.5f;
    cpu_gdn_chunk_forward(o2, Sf2, gdn_q(p), gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk,
                          p->dv, p->ldq, p->ldv, p->ldo, prep, GDN_KEPT_PREP_IN);
    cpu_gdn_chunk_transition(M2, H2, gdn_k(p), p->v, p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                             p->ldv, prep, 0);
    EXPECT(memcmp(o, o2, (size_t)no * 4) != 0, "%s: a sabotaged prep went unseen by the forward", tag);
    EXPECT(memcmp(H, H2, (size_t)ns * 4) != 0, "%s: a sabotaged prep went unseen by the transition", tag);
    cpu_gdn_chunk_dstate(dS2, dout, gdn_q(p), gdn_k(p), p->g, p->beta, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv,
                         p->ldq, p->ldo, prep, 0);
    EXPECT(p->doc_pos[0] == 0 || memcmp(dS, dS2, (size_t)ns * 4) != 0, "%s: a sabotaged prep went unseen by the dstate",
           tag);
}

TEST(gdn_prep_kept) {
    gdn_kept_doc_cases(gdn_check_prep_kept);
    GdnProb p = gdn_prob_make(150, 1, 1, 64, 32, 40, NULL, 0, 1, 0.02);
    gdn_check_prep_kept("T=150 no docs, weak decay", &p);
    /* kept_flags against backend.h's rules: refused (a fatal error), never recomputed or half done */
    static const struct {
        const char *what;
        int         o, kept, S_final, flags;
    } bad[] = {
        {"GDN_KEPT_PREP_IN without kept", 1, 0, 0, GDN_KEPT_PREP_IN},
        {"kept_flags 16 (unknown)", 1, 1, 0, 16},
        {"o NULL without GDN_KEPT_STATES", 0, 1, 1, 0},
        {"o NULL without kept", 0, 0, 1, GDN_KEPT_STATES},
        {"GDN_KEPT_STATES_IN without GDN_KEPT_STATES", 1, 1, 0, GDN_KEPT_STATES_IN},
        {"GDN_KEPT_STATES_IN with S_final", 1, 1, 1, GDN_KEPT_STATES | GDN_KEPT_STATES_IN},
        {"GDN_KEPT_STATES_IN with o NULL", 0, 1, 0, GDN_KEPT_STATES | GDN_KEPT_STATES_IN},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fflush(stdout);
        const pid_t pid = fork();
        if (pid == 0) {
            float *o = test_alloc(p.T * p.ldo * 4), *Sf = test_alloc((int64_t)p.nv * p.dk * p.dv * 4);
            float *kept = test_alloc((int64_t)cpu_gdn_kept_bytes(p.T, p.nv, p.dk, p.dv, 1));
            cpu_gdn_chunk_forward(bad[i].o ? o : NULL, bad[i].S_final ? Sf : NULL, gdn_q(&p), gdn_k(&p), p.v, p.g,
                                  p.beta, p.S0, p.doc_pos, p.T, p.nk, p.nv, p.dk, p.dv, p.ldq, p.ldv, p.ldo,
                                  bad[i].kept ? kept : NULL, bad[i].flags);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        EXPECT(WIFEXITED(st) && WEXITSTATUS(st) != 0, "%s was not refused", bad[i].what);
        printf("%s refused: %s\n", bad[i].what, WIFEXITED(st) && WEXITSTATUS(st) ? "ok" : "NO");
    }
}

/* ---- the forward and the backward in stages (backend.h: o NULL then GDN_KEPT_STATES_IN;
 * gdn_chunk_backward_stage): the bits of one call each, and every stage's part needed ---- */

static void gdn_check_staged(const char *tag, const GdnProb *p) {
    const int64_t T = p->T, no = T * p->ldo, ns = (int64_t)p->nv * p->dk * p->dv, nq = T * p->ldq;
    const int64_t nvv = T * p->ldv, ng = T * p->nv;
    const size_t kb = cpu_gdn_kept_bytes(T, p->nv, p->dk, p->dv, 1), db = cpu_gdn_dkept_bytes(T, p->nv, p->dk, p->dv);
    float *o = test_alloc(no * 4), *o2 = test_alloc(no * 4), *Sf = test_alloc(ns * 4), *Sf2 = test_alloc(ns * 4);
    float *kept = test_alloc((int64_t)kb), *kept2 = test_alloc((int64_t)kb), *dkept = test_alloc((int64_t)db);
    test_fill_normal(o, no, 1.0); /* the same bytes where neither writes (ldo is wider) */
    memcpy(o2, o, (size_t)no * 4);
    cpu_gdn_chunk_forward(o, Sf, gdn_q(p), gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk,
                          p->dv, p->ldq, p->ldv, p->ldo, kept, GDN_KEPT_STATES);
    cpu_gdn_chunk_forward(NULL, Sf2, gdn_q(p), gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk,
                          p->dv, p->ldq, p->ldv, p->ldo, kept2, GDN_KEPT_STATES);
    EXPECT(!memcmp(Sf, Sf2, (size_t)ns * 4) && !memcmp(kept, kept2, kb),
           "%s: the state pass alone differs from the whole forward (S_final or kept)", tag);
    cpu_gdn_chunk_forward(o2, NULL, gdn_q(p), gdn_k(p), p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk,
                          p->dv, p->ldq, p->ldv, p->ldo, kept2, GDN_KEPT_STATES | GDN_KEPT_STATES_IN);
    EXPECT(!memcmp(o, o2, (size_t)no * 4), "%s: the outputs from the state pass differ from the whole forward's", tag);

    float *dout = test_alloc(no * 4), *dSf = test_alloc(ns * 4);
    test_fill_normal(dout, no, 1.0);
    test_fill_normal(dSf, ns, 1.0);
    float *g1[5], *g2[5]; /* dq, dk, dv, dg, dbeta of the whole backward and of the stages */
    const int64_t n[5] = {nq, nq, nvv, ng, ng};
    for (int i = 0; i < 5; i++) {
        g1[i] = test_alloc(n[i] * 4);
        g2[i] = test_alloc(n[i] * 4);
        test_fill_normal(g1[i], n[i], 1.0); /* the same bytes where neither writes */
        memcpy(g2[i], g1[i], (size_t)n[i] * 4);
    }
    float *dS0 = test_alloc(ns * 4), *dS02 = test_alloc(ns * 4);
    cpu_gdn_chunk_backward(g1[0], g1[1], g1[2], g1[3], g1[4], dS0, dout, dSf, gdn_q(p), gdn_k(p), p->v, p->g, p->beta,
                           p->S0, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq, p->ldv, p->ldo, kept, 1);
    for (int stage = GDN_BWD_DOUT; stage <= GDN_BWD_GRADS; stage++) {
        cpu_gdn_chunk_backward_stage(stage, dkept, g2[0], g2[1], g2[2], g2[3], g2[4], dS02, dout, dSf, gdn_q(p), gdn_k(p),
                                     p->v, p->g, p->beta, p->S0, p->doc_pos, T, p->nk, p->nv, p->dk, p->dv, p->ldq,
                                     p->ldv, p->ldo, kept2, GDN_KEPT_STATES);
        if (stage == GDN_BWD_STATE) /* the state-gradient pass gives dS0 and carries the rest: spoil dS_final */
            test_fill_normal(dSf, ns, 1.0);
    }
    static const char *names[5] = {"dq", "dk", "dv", "dg", "dbeta"};
    for (int i = 0; i < 5; i++)
        EXPECT(!memcmp(g1[i], g2[i], (size_t)n[i] * 4), "%s: the staged backward's %s differs from the whole one's",
               tag, names[i]);
    EXPECT(!memcmp(dS0, dS02, (size_t)ns * 4), "%s: the staged backward's dS0 differs from the whole one's", tag);
}

TEST(gdn_staged) {
    gdn_kept_doc_cases(gdn_check_staged);
    GdnProb p = gdn_prob_make(150, 1, 1, 64, 32, 40, NULL, 0, 1, 0.02);
    gdn_check_staged("T=150 no docs, weak decay", &p);
}

/* fp32 both sides, different summation orders: measured <= 1e-6; bound 1e-5. */
TEST(gdn_dstate) {
    GdnProb p = gdn_prob_make(150, 1, 2, 16, 32, 4, NULL, 0, 0, 0.05);
    gdn_check_dstate("T=150 GQA no docs", &p, 1e-5);
    static const int starts[] = {70, 100};
    p = gdn_prob_make(150, 2, 4, 32, 16, 4, starts, 2, 0, 0.1);
    gdn_check_dstate("T=150 docs at 70, 100", &p, 1e-5);
    p = gdn_prob_make(1, 1, 1, 16, 16, 9, NULL, 0, 0, 0.3);
    gdn_check_dstate("T=1", &p, 1e-5);
    /* a document starts at token 0: S0 reaches nothing, the state gradient is exactly 0 */
    p = gdn_prob_make(80, 1, 1, 16, 16, 0, NULL, 0, 0, 0.1);
    const int64_t nh = (int64_t)p.nv * p.dk * p.dv;
    float *dout = test_alloc(p.T * p.ldo * (int64_t)sizeof(float)), *dS = test_alloc(nh * (int64_t)sizeof(float));
    test_fill_normal(dout, p.T * p.ldo, 1.0);
    for (int64_t i = 0; i < nh; i++) dS[i] = 1e3f;
    cpu_gdn_chunk_dstate(dS, dout, gdn_q(&p), gdn_k(&p), p.g, p.beta, p.doc_pos, p.T, p.nk, p.nv, p.dk, p.dv, p.ldq,
                         p.ldo, NULL, 0);
    int nonzero = 0;
    for (int64_t i = 0; i < nh; i++) nonzero += dS[i] != 0.0f;
    EXPECT(nonzero == 0, "doc at 0: dstate has %d nonzero entries", nonzero);
    printf("doc at 0: dstate == 0 exactly: %s\n", nonzero ? "NO" : "ok");
}

/* S_out = op(M) S_in + H against float64, both orientations, and S_in = NULL. */
TEST(gdn_state_affine) {
    const int nv = 3, dk = 16, dv = 24;
    const int64_t nm = (int64_t)nv * dk * dk, nh = (int64_t)nv * dk * dv;
    float *M = test_alloc(nm * 4), *S = test_alloc(nh * 4), *H = test_alloc(nh * 4), *out = test_alloc(nh * 4);
    double *want = test_alloc(nh * 8);
    test_fill_normal(M, nm, 0.3);
    test_fill_normal(S, nh, 1.0);
    test_fill_normal(H, nh, 1.0);
    for (int tr = 0; tr < 3; tr++) {
        const int transpose = tr == 1, with_S = tr < 2;
        cpu_gdn_state_affine(out, M, with_S ? S : NULL, H, transpose, nv, dk, dv);
        for (int h = 0; h < nv; h++)
            for (int a = 0; a < dk; a++)
                for (int c = 0; c < dv; c++) {
                    double s = H[((int64_t)h * dk + a) * dv + c];
                    for (int b = 0; with_S && b < dk; b++) {
                        const double m = transpose ? M[((int64_t)h * dk + b) * dk + a] : M[((int64_t)h * dk + a) * dk + b];
                        s += m * S[((int64_t)h * dk + b) * dv + c];
                    }
                    want[((int64_t)h * dk + a) * dv + c] = s;
                }
        char name[64];
        snprintf(name, sizeof name, "state_affine %s", tr == 0 ? "M S + H" : tr == 1 ? "M^T S + H" : "S = NULL");
        test_check_rel(name, out, want, nh, 1e-6);
    }
}
