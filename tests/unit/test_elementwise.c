/*
 * test_elementwise.c — per-op tests of kernels/cpu/cpu_elementwise.c: the token embedding, the
 * Gated DeltaNet gates (beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)), the sigmoid
 * output gate and the SwiGLU.
 *
 * Forward against float64 references written here; backward against float64 central finite
 * differences of them (L = sum(out * R)), with written outputs pre-filled with NaN and
 * accumulated ones (dwte, dA_log, ddt_bias) with random values. Strided operands (b, a, gate)
 * are column blocks with NaN margins (test_strided.h). Inputs include extreme arguments
 * (|x| up to 100, softplus above its threshold of 20) where a naive sigmoid or softplus
 * overflows to inf/NaN.
 *
 * Bounds (relative L2 error): forward 5e-7 (a few fp32 roundings per element, measured
 * <= 1e-7; the embedding is a copy: 0); backward 1e-6 vs FD (measured <= 2e-7; FD truncation
 * ~1e-9 with h = 1e-4).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test_strided.h"
#include "test_util.h"

#define EW_FWD_BOUND 5e-7
#define EW_BWD_BOUND 1e-6

static const int64_t ew_T[] = {1, 7, 64, 130};

static double *ew_doubles(int64_t n) { return test_alloc(n * (int64_t)sizeof(double)); }
static float *ew_floats(int64_t n) { return test_alloc(n * (int64_t)sizeof(float)); }
static float *ew_nans(int64_t n) {
    float *x = ew_floats(n);
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}
static double ew_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ================================ embedding ================================ */

typedef struct {
    int64_t        T;
    int            C;
    const int32_t *tok;
    const double  *R;
} EmbCtx;

static double emb_loss(void *ctx_, double *wte) {
    EmbCtx *c = ctx_;
    double L = 0;
    for (int64_t t = 0; t < c->T; t++)
        for (int j = 0; j < c->C; j++) L += wte[(int64_t)c->tok[t] * c->C + j] * c->R[t * c->C + j];
    return L;
}

TEST(embedding) {
    const int V = 50, C = 37;
    for (size_t k = 0; k < sizeof ew_T / sizeof ew_T[0]; k++) {
        const int64_t T = ew_T[k];
        char m[160];
        int32_t *tok = test_alloc(T * (int64_t)sizeof(int32_t));
        for (int64_t t = 0; t < T; t++) tok[t] = (int32_t)(test_uniform() * V); /* repeats when T > V */
        if (T > 2) tok[T - 1] = tok[0];
        float *wte = ew_floats((int64_t)V * C), *out = ew_nans(T * C);
        test_fill_normal(wte, (int64_t)V * C, 1.0);
        cpu_embedding_forward(out, tok, wte, T, C);
        double *ref = ew_doubles(T * C);
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < C; j++) ref[t * C + j] = wte[(int64_t)tok[t] * C + j];
        snprintf(m, sizeof m, "embedding fwd T=%lld V=%d C=%d (a copy: exact)", (long long)T, V, C);
        test_check_rel(m, out, ref, T * C, 0.0);

        float *dout = ew_floats(T * C), *dwte = ew_floats((int64_t)V * C);
        test_fill_normal(dout, T * C, 1.0);
        test_fill_normal(dwte, (int64_t)V * C, 1.0);
        double *want = ew_doubles((int64_t)V * C), *wd = ew_doubles((int64_t)V * C), *R = ew_doubles(T * C);
        test_to_double(wd, wte, (int64_t)V * C);
        test_to_double(R, dout, T * C);
        EmbCtx ctx = {T, C, tok, R};
        test_fd_grad(want, emb_loss, &ctx, wd, (int64_t)V * C, NULL, 0, 1e-3);
        for (int64_t i = 0; i < (int64_t)V * C; i++) want[i] += dwte[i];
        cpu_embedding_backward(dwte, dout, tok, T, C);
        snprintf(m, sizeof m, "embedding bwd T=%lld V=%d C=%d dwte (+=) vs FD", (long long)T, V, C);
        test_check_rel(m, dwte, want, (int64_t)V * C, EW_BWD_BOUND);
    }
}

/* ================================ GDN gates ================================ */

typedef struct {
    TestRowRange rows;
    int          nv;
    const double *b, *a, *A_log, *dt_bias, *Rb, *Rg; /* b, a, Rb, Rg (T,nv) dense */
} GatesCtx;

static double gates_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

static void gates_ref(double *beta, double *g, const GatesCtx *c, int64_t t, int h) {
    int64_t i = t * c->nv + h;
    *beta = ew_sigmoid(c->b[i]);
    *g = -exp(c->A_log[h]) * gates_softplus(c->a[i] + c->dt_bias[h]);
}

static double gates_loss(void *ctx_, double *unused) {
    (void)unused;
    GatesCtx *c = ctx_;
    double L = 0;
    for (int64_t t = c->rows.t0; t < c->rows.t1; t++)
        for (int h = 0; h < c->nv; h++) {
            double beta, g;
            gates_ref(&beta, &g, c, t, h);
            L += beta * c->Rb[t * c->nv + h] + g * c->Rg[t * c->nv + h];
        }
    return L;
}

TEST(gdn_gates) {
    static const int nvs[] = {1, 3, 4, 5}, extra[] = {0, 6, 1, 9};
    for (size_t k = 0; k < sizeof ew_T / sizeof ew_T[0]; k++) {
        const int64_t T = ew_T[k];
        const int nv = nvs[k], ld = nv + extra[k];
        const int64_t n = T * nv;
        char what[120], m[200];
        snprintf(what, sizeof what, "gdn_gates T=%lld nv=%d ld=%d", (long long)T, nv, ld);
        TestStrided b = test_strided_new(T, nv, ld), a = test_strided_new(T, nv, ld);
        test_strided_fill_normal(&b, 3.0);
        test_strided_fill_normal(&a, 3.0);
        /* extremes: softplus above its threshold (a + dt_bias ~ 25, 100) and far below, sigmoid of +-100 */
        if (n >= 4) {
            a.p[0] = 24.0f;
            a.p[(T - 1) * ld + nv - 1] = 99.0f;
            a.p[(T / 2) * ld] = -40.0f;
            b.p[0] = 100.0f;
            b.p[(T - 1) * ld + nv - 1] = -100.0f;
        }
        float *A_log = ew_floats(nv), *dt_bias = ew_floats(nv);
        for (int h = 0; h < nv; h++) {
            A_log[h] = (float)log(0.5 + 15.5 * test_uniform());
            dt_bias[h] = (float)(1.0 + 0.3 * test_normal());
        }
        float *beta = ew_nans(n), *g = ew_nans(n);
        cpu_gdn_gates_forward(beta, g, b.p, a.p, A_log, dt_bias, T, nv, ld);

        double *bd = ew_doubles(n), *ad = ew_doubles(n), *Ad = ew_doubles(nv), *dtd = ew_doubles(nv);
        test_strided_get(bd, &b);
        test_strided_get(ad, &a);
        test_to_double(Ad, A_log, nv);
        test_to_double(dtd, dt_bias, nv);
        double *rbeta = ew_doubles(n), *rg = ew_doubles(n);
        GatesCtx ctx = {{0, T}, nv, bd, ad, Ad, dtd, NULL, NULL};
        for (int64_t t = 0; t < T; t++)
            for (int h = 0; h < nv; h++) gates_ref(&rbeta[t * nv + h], &rg[t * nv + h], &ctx, t, h);
        snprintf(m, sizeof m, "%s fwd beta", what);
        test_check_rel(m, beta, rbeta, n, EW_FWD_BOUND);
        snprintf(m, sizeof m, "%s fwd g", what);
        test_check_rel(m, g, rg, n, EW_FWD_BOUND);

        /* backward: db, da written (NaN before); dA_log, ddt_bias += onto random values */
        float *dbeta = ew_floats(n), *dg = ew_floats(n), *dA = ew_floats(nv), *ddt = ew_floats(nv);
        test_fill_normal(dbeta, n, 1.0);
        test_fill_normal(dg, n, 1.0);
        test_fill_normal(dA, nv, 1.0);
        test_fill_normal(ddt, nv, 1.0);
        double *wA = ew_doubles(nv), *wdt = ew_doubles(nv);
        test_to_double(wA, dA, nv);
        test_to_double(wdt, ddt, nv);
        TestStrided db = test_strided_new(T, nv, ld), da = test_strided_new(T, nv, ld);
        cpu_gdn_gates_backward(db.p, da.p, dA, ddt, dbeta, dg, b.p, a.p, A_log, dt_bias, T, nv, ld);

        double *Rb = ew_doubles(n), *Rg = ew_doubles(n), *gb = ew_doubles(n), *ga = ew_doubles(n);
        double *gA = ew_doubles(nv), *gdt = ew_doubles(nv);
        test_to_double(Rb, dbeta, n);
        test_to_double(Rg, dg, n);
        ctx.Rb = Rb;
        ctx.Rg = Rg;
        test_fd_rows(gb, gates_loss, &ctx, bd, T, nv, 1e-4);
        test_fd_rows(ga, gates_loss, &ctx, ad, T, nv, 1e-4);
        test_fd_grad(gA, gates_loss, &ctx, Ad, nv, NULL, 0, 1e-5);
        test_fd_grad(gdt, gates_loss, &ctx, dtd, nv, NULL, 0, 1e-4);
        for (int h = 0; h < nv; h++) {
            wA[h] += gA[h];
            wdt[h] += gdt[h];
        }
        float *got = ew_floats(n);
        test_strided_getf(got, &db);
        snprintf(m, sizeof m, "%s bwd db", what);
        test_check_rel(m, got, gb, n, EW_BWD_BOUND);
        test_strided_intact(m, &db);
        test_strided_getf(got, &da);
        snprintf(m, sizeof m, "%s bwd da", what);
        test_check_rel(m, got, ga, n, EW_BWD_BOUND);
        test_strided_intact(m, &da);
        snprintf(m, sizeof m, "%s bwd dA_log (+=)", what);
        test_check_rel(m, dA, wA, nv, EW_BWD_BOUND);
        snprintf(m, sizeof m, "%s bwd ddt_bias (+=)", what);
        test_check_rel(m, ddt, wdt, nv, EW_BWD_BOUND);
    }
}

/* ============================= sigmoid gate ============================== */

typedef struct {
    TestRowRange rows;
    int          D;
    const double *x, *gate, *R; /* (T,D) dense */
} SigCtx;

static double sig_loss(void *ctx_, double *unused) {
    (void)unused;
    SigCtx *c = ctx_;
    double L = 0;
    for (int64_t t = c->rows.t0; t < c->rows.t1; t++)
        for (int d = 0; d < c->D; d++) {
            int64_t i = t * c->D + d;
            L += c->x[i] * ew_sigmoid(c->gate[i]) * c->R[i];
        }
    return L;
}

TEST(sigmoid_gate) {
    static const int Ds[] = {37, 24, 64, 33}, extra[] = {0, 24, 3, 31};
    for (size_t k = 0; k < sizeof ew_T / sizeof ew_T[0]; k++) {
        const int64_t T = ew_T[k];
        const int D = Ds[k], ldg = D + extra[k];
        const int64_t n = T * D;
        char what[120], m[200];
        snprintf(what, sizeof what, "sigmoid_gate T=%lld D=%d ldg=%d", (long long)T, D, ldg);
        float *x = ew_floats(n), *out = ew_nans(n);
        test_fill_normal(x, n, 1.0);
        TestStrided gate = test_strided_new(T, D, ldg);
        test_strided_fill_normal(&gate, 3.0);
        gate.p[0] = 100.0f;
        gate.p[(T - 1) * ldg + D - 1] = -100.0f;
        cpu_sigmoid_gate_forward(out, x, gate.p, T, D, ldg);
        double *xd = ew_doubles(n), *gd = ew_doubles(n), *ref = ew_doubles(n);
        test_to_double(xd, x, n);
        test_strided_get(gd, &gate);
        for (int64_t i = 0; i < n; i++) ref[i] = xd[i] * ew_sigmoid(gd[i]);
        snprintf(m, sizeof m, "%s fwd", what);
        test_check_rel(m, out, ref, n, EW_FWD_BOUND);

        float *dout = ew_floats(n), *dx = ew_nans(n);
        test_fill_normal(dout, n, 1.0);
        TestStrided dgate = test_strided_new(T, D, ldg);
        cpu_sigmoid_gate_backward(dx, dgate.p, dout, x, gate.p, T, D, ldg);
        double *R = ew_doubles(n), *gx = ew_doubles(n), *gg = ew_doubles(n);
        test_to_double(R, dout, n);
        SigCtx ctx = {{0, T}, D, xd, gd, R};
        test_fd_rows(gx, sig_loss, &ctx, xd, T, D, 1e-4);
        test_fd_rows(gg, sig_loss, &ctx, gd, T, D, 1e-4);
        snprintf(m, sizeof m, "%s bwd dx", what);
        test_check_rel(m, dx, gx, n, EW_BWD_BOUND);
        float *got = ew_floats(n);
        test_strided_getf(got, &dgate);
        snprintf(m, sizeof m, "%s bwd dgate", what);
        test_check_rel(m, got, gg, n, EW_BWD_BOUND);
        test_strided_intact(m, &dgate);
    }
}

/* ================================ SwiGLU ================================ */

typedef struct {
    TestRowRange rows;
    int          I;
    const double *gu, *R; /* gu (T,2I), R (T,I) */
} SwiCtx;

static double swi_loss(void *ctx_, double *unused) {
    (void)unused;
    SwiCtx *c = ctx_;
    double L = 0;
    for (int64_t t = c->rows.t0; t < c->rows.t1; t++)
        for (int i = 0; i < c->I; i++) {
            double gv = c->gu[t * 2 * c->I + i], uv = c->gu[t * 2 * c->I + c->I + i];
            L += gv * ew_sigmoid(gv) * uv * c->R[t * c->I + i];
        }
    return L;
}

TEST(swiglu) {
    static const int Is[] = {37, 5, 64, 21};
    for (size_t k = 0; k < sizeof ew_T / sizeof ew_T[0]; k++) {
        const int64_t T = ew_T[k];
        const int I = Is[k];
        const int64_t n = T * I;
        char what[120], m[200];
        snprintf(what, sizeof what, "swiglu T=%lld I=%d", (long long)T, I);
        float *gu = ew_floats(2 * n), *out = ew_nans(n);
        for (int64_t t = 0; t < T; t++) {
            test_fill_normal(gu + t * 2 * I, I, 3.0);    /* gate */
            test_fill_normal(gu + t * 2 * I + I, I, 1.0); /* up */
        }
        gu[0] = 100.0f;
        gu[(T - 1) * 2 * I + I - 1] = -100.0f;
        cpu_swiglu_forward(out, gu, T, I);
        double *gud = ew_doubles(2 * n), *ref = ew_doubles(n);
        test_to_double(gud, gu, 2 * n);
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < I; i++) {
                double gv = gud[t * 2 * I + i];
                ref[t * I + i] = gv * ew_sigmoid(gv) * gud[t * 2 * I + I + i];
            }
        snprintf(m, sizeof m, "%s fwd", what);
        test_check_rel(m, out, ref, n, EW_FWD_BOUND);

        float *dout = ew_floats(n), *dgu = ew_nans(2 * n), *dgu2 = ew_nans(2 * n), *out2 = ew_nans(n);
        test_fill_normal(dout, n, 1.0);
        cpu_swiglu_backward(dgu, NULL, dout, gu, T, I);
        /* with `out`: the forward's output again, bit for bit, and the same gradient */
        cpu_swiglu_backward(dgu2, out2, dout, gu, T, I);
        if (memcmp(out2, out, (size_t)n * sizeof *out))
            test_fail(__FILE__, __LINE__, "%s bwd: out differs from the forward's bits", what);
        if (memcmp(dgu2, dgu, (size_t)(2 * n) * sizeof *dgu))
            test_fail(__FILE__, __LINE__, "%s bwd: dgate_up differs with out written", what);
        double *R = ew_doubles(n), *want = ew_doubles(2 * n);
        test_to_double(R, dout, n);
        SwiCtx ctx = {{0, T}, I, gud, R};
        test_fd_rows(want, swi_loss, &ctx, gud, T, 2 * I, 1e-4);
        snprintf(m, sizeof m, "%s bwd dgate_up", what);
        test_check_rel(m, dgu, want, 2 * n, EW_BWD_BOUND);
    }
}
