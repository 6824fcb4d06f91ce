/*
 * test_loss.c — per-op tests of kernels/cpu/cpu_loss.c (lm_head + cross-entropy, fused, in row
 * chunks).
 *
 * Against a float64 dense reference written here (the full (T, V) logits, a max-shifted
 * log-sum-exp, loss, dlogits = (softmax - onehot) * grad_scale, dx = dlogits W, dw = dlogits^T
 * x), and the gradients also against float64 central finite differences of
 * L = grad_scale * sum_t loss_t. Shapes have rows > T, rows == T, and rows < T with T not a
 * multiple of rows; some targets are -1 (loss 0, no gradient); logits of scale 1, 3, 30 and 300
 * (at 300 the logits reach ~1000, where exp overflows even in double without the max shift).
 * dx starts as NaN (written), dw as random values (+=); the workspace starts as NaN.
 *
 * Bounds (relative L2 error): losses 1e-6 at every scale (measured 4e-8..8e-8: the loss is formed
 * in double from fp32 logits whose error is ~1e-7 relative). Gradients 1e-6 at logit scale <= 3
 * (measured 5e-8..2.4e-7); 5e-6 at scale 30, where an fp32 logit error of ~1e-5 absolute moves
 * the softmax by that much (measured 4.5e-7); 2e-5 at scale 300, where in addition the FD of a
 * sum of losses ~1e5 loses ~1e-11 per evaluation to rounding (measured 3.9e-6 vs FD, 3.8e-7 vs
 * the closed form). A missing max shift gives inf/NaN; a wrong sign, a missing -onehot, a lost
 * chunk or an ignored target that still counts is off by 1e-2 or more.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test_strided.h"
#include "test_util.h"

typedef struct {
    int64_t T;
    int     C, V;
    int64_t rows;
    double  scale;      /* logit standard deviation */
    float   grad_scale;
    double  bound_loss, bound_grad;
} LossShape;

static const LossShape loss_shapes[] = {
    {1, 16, 37, 4, 1.0, 1.0f, 1e-6, 1e-6},          /* rows > T */
    {7, 24, 50, 3, 1.0, 0.25f, 1e-6, 1e-6},         /* 7 = 3 + 3 + 1 */
    {64, 32, 67, 64, 3.0, 1.0f / 64, 1e-6, 1e-6},   /* rows == T */
    {130, 24, 67, 48, 30.0, 0.01f, 1e-6, 5e-6},     /* large logits; 130 = 48 + 48 + 34 */
    {130, 8, 41, 17, 300.0, 1.0f, 1e-6, 2e-5},      /* logits ~1000: exp overflows without the shift */
};

static double *loss_doubles(int64_t n) { return test_alloc(n * (int64_t)sizeof(double)); }
static float *loss_floats(int64_t n) { return test_alloc(n * (int64_t)sizeof(float)); }

/* losses and, when dlogits != NULL, (softmax - onehot) * gs, rows [t0, t1); logits (T, V) scratch */
static void loss_ref(double *losses, double *dlogits, double *logits, const double *x, const double *w,
                     const int32_t *tg, double gs, int64_t t0, int64_t t1, int C, int V) {
    for (int64_t t = t0; t < t1; t++) {
        double *lg = logits + t * V;
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += x[t * C + c] * w[(int64_t)v * C + c];
            lg[v] = s;
        }
        double mx = lg[0], sum = 0;
        for (int v = 1; v < V; v++) mx = fmax(mx, lg[v]);
        for (int v = 0; v < V; v++) sum += exp(lg[v] - mx);
        double lse = mx + log(sum);
        losses[t] = tg[t] < 0 ? 0.0 : lse - lg[tg[t]];
        if (dlogits)
            for (int v = 0; v < V; v++)
                dlogits[t * V + v] = tg[t] < 0 ? 0.0 : (exp(lg[v] - lse) - (v == tg[t])) * gs;
    }
}

typedef struct {
    TestRowRange   rows;
    int            C, V;
    double         gs;
    const double  *x, *w;
    const int32_t *tg;
    double        *losses, *logits; /* scratch (T), (T, V) */
} LossCtx;

static double loss_total(void *ctx_, double *unused) {
    (void)unused;
    LossCtx *c = ctx_;
    loss_ref(c->losses, NULL, c->logits, c->x, c->w, c->tg, c->gs, c->rows.t0, c->rows.t1, c->C, c->V);
    double L = 0;
    for (int64_t t = c->rows.t0; t < c->rows.t1; t++) L += c->losses[t];
    return c->gs * L;
}

TEST(lm_head_loss) {
    for (size_t si = 0; si < sizeof loss_shapes / sizeof loss_shapes[0]; si++) {
        const LossShape *s = &loss_shapes[si];
        const int64_t T = s->T, C = s->C, V = s->V;
        char what[160], m[220];
        snprintf(what, sizeof what, "lm_head_loss T=%lld C=%d V=%d rows=%lld logit scale=%g grad_scale=%g",
                 (long long)T, s->C, s->V, (long long)s->rows, s->scale, (double)s->grad_scale);
        float *x = loss_floats(T * C), *w = loss_floats(V * C);
        test_fill_normal(x, T * C, 1.0);
        test_fill_normal(w, V * C, s->scale / sqrt((double)C));
        int32_t *tg = test_alloc(T * (int64_t)sizeof(int32_t));
        int ignored = 0;
        for (int64_t t = 0; t < T; t++) {
            tg[t] = (int32_t)(test_uniform() * V);
            if (T > 1 && (test_uniform() < 0.2 || t == T - 1)) tg[t] = -1, ignored++;
        }
        float *losses = loss_floats(T), *dx = loss_floats(T * C), *dw = loss_floats(V * C);
        float *ws = loss_floats(s->rows * V);
        for (int64_t i = 0; i < T * C; i++) dx[i] = NAN;
        for (int64_t i = 0; i < s->rows * V; i++) ws[i] = NAN;
        for (int64_t t = 0; t < T; t++) losses[t] = NAN;
        test_fill_normal(dw, V * C, 0.1);
        double *dw0 = loss_doubles(V * C);
        test_to_double(dw0, dw, V * C);

        cpu_lm_head_loss(losses, dx, dw, x, w, tg, s->grad_scale, ws, s->rows, T, s->C, s->V);

        /* the dense float64 reference */
        double *xd = loss_doubles(T * C), *wd = loss_doubles(V * C), *rl = loss_doubles(T), *dl = loss_doubles(T * V),
               *lg = loss_doubles(T * V), *rdx = loss_doubles(T * C), *rdw = loss_doubles(V * C);
        test_to_double(xd, x, T * C);
        test_to_double(wd, w, V * C);
        loss_ref(rl, dl, lg, xd, wd, tg, s->grad_scale, 0, T, s->C, s->V);
        double lmax = 0;
        for (int64_t i = 0; i < T * V; i++) lmax = fmax(lmax, fabs(lg[i]));
        for (int64_t t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                double a = 0;
                for (int v = 0; v < V; v++) a += dl[t * V + v] * wd[(int64_t)v * C + c];
                rdx[t * C + c] = a;
            }
        for (int v = 0; v < V; v++)
            for (int c = 0; c < C; c++) {
                double a = dw0[(int64_t)v * C + c];
                for (int64_t t = 0; t < T; t++) a += dl[t * V + v] * xd[t * C + c];
                rdw[(int64_t)v * C + c] = a;
            }
        printf("%s: max |logit| %.1f, %d ignored targets\n", what, lmax, ignored);
        snprintf(m, sizeof m, "%s losses", what);
        test_check_rel(m, losses, rl, T, s->bound_loss);
        for (int64_t t = 0; t < T; t++)
            if (tg[t] < 0) EXPECT(losses[t] == 0.0f, "%s: ignored token %lld has loss %g", what, (long long)t, losses[t]);
        snprintf(m, sizeof m, "%s dx vs dense reference", what);
        test_check_rel(m, dx, rdx, T * C, s->bound_grad);
        for (int64_t t = 0; t < T; t++)
            if (tg[t] < 0)
                for (int c = 0; c < C; c++)
                    EXPECT(dx[t * C + c] == 0.0f, "%s: ignored token %lld has dx %g", what, (long long)t, dx[t * C + c]);
        snprintf(m, sizeof m, "%s dw (+=) vs dense reference", what);
        test_check_rel(m, dw, rdw, V * C, s->bound_grad);

        /* the same gradients by finite differences of grad_scale * sum(losses) */
        LossCtx ctx = {{0, T}, s->C, s->V, s->grad_scale, xd, wd, tg, loss_doubles(T), loss_doubles(T * V)};
        double *gx = loss_doubles(T * C), *gw = loss_doubles(V * C);
        const double h = 1e-4 / fmax(1.0, s->scale);
        test_fd_rows(gx, loss_total, &ctx, xd, T, C, h);
        test_fd_grad(gw, loss_total, &ctx, wd, V * C, NULL, 0, h);
        for (int64_t i = 0; i < V * C; i++) gw[i] += dw0[i];
        snprintf(m, sizeof m, "%s dx vs FD", what);
        test_check_rel(m, dx, gx, T * C, s->bound_grad);
        snprintf(m, sizeof m, "%s dw (+=) vs FD", what);
        test_check_rel(m, dw, gw, V * C, s->bound_grad);
    }
}

/* The chunk size changes only fp32 rounding: rows = 1 and 5 agree with rows = T within 1e-6
 * (OpenBLAS picks different GEMM kernels for different M, so the logits are not bitwise equal
 * across chunk sizes), and one chunk size run twice is bitwise deterministic. */
TEST(lm_head_loss_chunking) {
    const int64_t T = 23;
    const int C = 12, V = 29;
    float *x = loss_floats(T * C), *w = loss_floats((int64_t)V * C);
    test_fill_normal(x, T * C, 1.0);
    test_fill_normal(w, (int64_t)V * C, 1.0);
    int32_t *tg = test_alloc(T * (int64_t)sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) tg[t] = t % 4 == 3 ? -1 : (int32_t)(test_uniform() * V);
    static const int64_t rows[] = {23, 1, 5, 5};
    float *l0 = NULL, *dx0 = NULL, *dw0 = NULL, *l5 = NULL, *dx5 = NULL, *dw5 = NULL;
    for (int k = 0; k < 4; k++) {
        float *l = loss_floats(T), *dx = loss_floats(T * C), *dw = loss_floats((int64_t)V * C);
        float *ws = loss_floats(rows[k] * V);
        cpu_lm_head_loss(l, dx, dw, x, w, tg, 0.5f, ws, rows[k], T, C, V);
        if (k == 0) {
            l0 = l, dx0 = dx, dw0 = dw;
            continue;
        }
        char m[120];
        if (k == 3) {
            EXPECT(!memcmp(l, l5, (size_t)T * sizeof(float)) && !memcmp(dx, dx5, (size_t)(T * C) * sizeof(float)) &&
                       !memcmp(dw, dw5, (size_t)V * C * sizeof(float)),
                   "lm_head_loss rows=5 twice: results differ");
            printf("lm_head_loss rows=5 twice: bitwise equal ok\n");
            continue;
        }
        if (k == 2) l5 = l, dx5 = dx, dw5 = dw;
        snprintf(m, sizeof m, "lm_head_loss rows=%lld vs rows=T: losses", (long long)rows[k]);
        test_check_rel_f(m, l, l0, T, 1e-6);
        snprintf(m, sizeof m, "lm_head_loss rows=%lld vs rows=T: dx", (long long)rows[k]);
        test_check_rel_f(m, dx, dx0, T * C, 1e-6);
        snprintf(m, sizeof m, "lm_head_loss rows=%lld vs rows=T: dw", (long long)rows[k]);
        test_check_rel_f(m, dw, dw0, (int64_t)V * C, 1e-6);
    }
}
