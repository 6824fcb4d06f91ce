/*
 * test_norm.c — per-op tests of kernels/cpu/cpu_norm.c: RMSNorm (zero-centred 1+w and plain w;
 * one head per token like the layer norms, several heads inside a wider row like q_norm/k_norm),
 * the L2 norm of the GDN q/k (eps on the sum of squares), and the GDN gated RMSNorm.
 *
 * Forward: against float64 naive references written here. Backward: against float64 central
 * finite differences of those references, L = sum(out * R) with R random (R is the dout handed
 * to the kernel). Inputs sit inside wider rows whose margins are NaN (test_strided.h). Shapes
 * include T = 1, 7, 64, 130, odd widths, several heads, and inputs of scale 1e-3 where eps is
 * of the size of the mean (or sum) of squares, so an eps in the wrong place fails.
 *
 * Bounds (relative L2 error): forward 5e-7 (fp32 rounding of a few operations per element; the
 * kernels measure 2e-8..8e-8); backward 1e-6 vs FD (fp32 gradient, measured 3e-8..1e-7, plus FD
 * truncation ~1e-9 with h = 1e-4 of the input scale). A wrong eps placement, a missing 1 + w or
 * a dropped term of the backward is off by 1e-3 or more. Every check prints its measured value.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test_strided.h"
#include "test_util.h"

#define NORM_FWD_BOUND 5e-7
#define NORM_BWD_BOUND 1e-6

static float *norm_floats(int64_t n) { return test_alloc(n * (int64_t)sizeof(float)); }
static double *norm_doubles(int64_t n) { return test_alloc(n * (int64_t)sizeof(double)); }
static float *norm_nans(int64_t n) {
    float *x = norm_floats(n);
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* ================================ RMSNorm ================================ */

typedef struct {
    int64_t T;
    int     nh, D, ldi_extra, ldo_extra;
    double  scale; /* input scale: 1e-3 makes mean(x^2) ~ eps */
    float   eps;
} RmsShape;

static const RmsShape rms_shapes[] = {
    {1, 1, 37, 0, 0, 1.0, 1e-6f},     /* one token, odd width, dense rows */
    {7, 3, 16, 5, 2, 1.0, 1e-6f},     /* q_norm: 3 heads inside a wider projection row */
    {64, 1, 64, 0, 3, 1.0, 1e-6f},    /* a layer norm, output inside a wider row */
    {130, 2, 33, 7, 1, 1e-3, 1e-6f},  /* mean(x^2) ~ 1e-6 = eps: eps placement matters */
    {130, 1, 20, 1, 1, 1.0, 1e-2f},   /* a large eps */
};

/* y[t,h,:] = x * (mean(x^2) + eps)^-1/2 * (zc ? 1 + w : w) for rows [t0, t1) of the dense (T, nh*D) x;
 * y and rstd hold those rows from their start */
static void rms_ref(double *y, double *rstd, const double *x, const double *w, int64_t t0, int64_t t1, int nh, int D,
                    double eps, int zc) {
    for (int64_t t = t0; t < t1; t++)
        for (int h = 0; h < nh; h++) {
            const double *xr = x + (t * nh + h) * D;
            double ss = 0;
            for (int d = 0; d < D; d++) ss += xr[d] * xr[d];
            double r = 1.0 / sqrt(ss / D + eps);
            if (rstd) rstd[(t - t0) * nh + h] = r;
            for (int d = 0; d < D; d++) y[((t - t0) * nh + h) * D + d] = xr[d] * r * (zc ? 1.0 + w[d] : w[d]);
        }
}

typedef struct {
    TestRowRange rows;
    int          nh, D, zc;
    double       eps;
    const double *x, *w, *R; /* x (T,nh*D), w (D), R (T,nh*D) */
    double       *row;       /* (nh*D) scratch: one row of the reference output */
} RmsCtx;

static double rms_loss(void *ctx_, double *unused) {
    (void)unused;
    RmsCtx *c = ctx_;
    int64_t W = (int64_t)c->nh * c->D;
    double L = 0;
    for (int64_t t = c->rows.t0; t < c->rows.t1; t++) {
        rms_ref(c->row, NULL, c->x, c->w, t, t + 1, c->nh, c->D, c->eps, c->zc);
        for (int64_t j = 0; j < W; j++) L += c->row[j] * c->R[t * W + j];
    }
    return L;
}

static void rms_case(const RmsShape *s, int zc) {
    const int64_t T = s->T, W = (int64_t)s->nh * s->D;
    const int ldi = (int)W + s->ldi_extra, ldo = (int)W + s->ldo_extra;
    char what[160];
    snprintf(what, sizeof what, "rmsnorm T=%lld nh=%d D=%d ldi=%d ldo=%d scale=%g eps=%g %s", (long long)T, s->nh,
             s->D, ldi, ldo, s->scale, (double)s->eps, zc ? "1+w" : "w");

    TestStrided x = test_strided_new(T, (int)W, ldi), out = test_strided_new(T, (int)W, ldo);
    test_strided_fill_normal(&x, s->scale);
    float *w = norm_floats(s->D), *rstd = norm_nans(T * s->nh);
    test_fill_normal(w, s->D, 0.5);
    if (!zc) for (int d = 0; d < s->D; d++) w[d] += 1.0f; /* a plain scale lives around 1 */

    cpu_rmsnorm_forward(out.p, rstd, x.p, w, T, s->nh, s->D, ldi, ldo, s->eps, zc);

    double *xd = norm_doubles(T * W), *wd = norm_doubles(s->D), *yref = norm_doubles(T * W),
           *rref = norm_doubles(T * s->nh);
    float *y = norm_floats(T * W);
    test_strided_get(xd, &x);
    test_to_double(wd, w, s->D);
    rms_ref(yref, rref, xd, wd, 0, T, s->nh, s->D, s->eps, zc);
    test_strided_getf(y, &out);
    char m[200];
    snprintf(m, sizeof m, "%s fwd out", what);
    test_check_rel(m, y, yref, T * W, NORM_FWD_BOUND);
    snprintf(m, sizeof m, "%s fwd rstd", what);
    test_check_rel(m, rstd, rref, T * s->nh, NORM_FWD_BOUND);
    snprintf(m, sizeof m, "%s fwd out", what);
    test_strided_intact(m, &out);

    /* backward: dinp += and dw += onto random values */
    TestStrided dout = test_strided_new(T, (int)W, ldo), dinp = test_strided_new(T, (int)W, ldi);
    test_strided_fill_normal(&dout, 1.0);
    test_strided_fill_normal(&dinp, 1.0 / s->scale); /* of the size of the gradient */
    float *dw = norm_floats(s->D), *dw0 = norm_floats(s->D);
    test_fill_normal(dw, s->D, 1.0);
    memcpy(dw0, dw, (size_t)s->D * sizeof(float));
    double *dinp0 = norm_doubles(T * W), *R = norm_doubles(T * W);
    test_strided_get(dinp0, &dinp);
    test_strided_get(R, &dout);

    cpu_rmsnorm_backward(dinp.p, dw, dout.p, x.p, w, rstd, T, s->nh, s->D, ldi, ldo, zc);

    RmsCtx ctx = {{0, T}, s->nh, s->D, zc, s->eps, xd, wd, R, norm_doubles(W)};
    double *gx = norm_doubles(T * W), *gw = norm_doubles(s->D);
    const double h = 1e-4 * s->scale;
    test_fd_rows(gx, rms_loss, &ctx, xd, T, W, h);
    test_fd_grad(gw, rms_loss, &ctx, wd, s->D, NULL, 0, 1e-4);
    for (int64_t i = 0; i < T * W; i++) gx[i] += dinp0[i];
    for (int d = 0; d < s->D; d++) gw[d] += dw0[d];
    float *got = norm_floats(T * W);
    test_strided_getf(got, &dinp);
    snprintf(m, sizeof m, "%s bwd dinp (+=)", what);
    test_check_rel(m, got, gx, T * W, NORM_BWD_BOUND);
    test_strided_intact(m, &dinp);
    snprintf(m, sizeof m, "%s bwd dw (+=)", what);
    test_check_rel(m, dw, gw, s->D, NORM_BWD_BOUND);
}

TEST(rmsnorm_zero_centred) {
    for (size_t i = 0; i < sizeof rms_shapes / sizeof rms_shapes[0]; i++) rms_case(&rms_shapes[i], 1);
}

TEST(rmsnorm_plain) {
    for (size_t i = 0; i < sizeof rms_shapes / sizeof rms_shapes[0]; i++) rms_case(&rms_shapes[i], 0);
}

/* zero_centred with w must equal plain with 1 + w (forward and backward), and must differ from
 * plain with w: the flag is honoured in both directions. */
TEST(rmsnorm_zero_centred_vs_plain) {
    const int64_t T = 9;
    const int nh = 2, D = 24, W = nh * D;
    float *x = norm_floats(T * W), *w = norm_floats(D), *w1 = norm_floats(D), *dout = norm_floats(T * W);
    test_fill_normal(x, T * W, 1.0);
    test_fill_normal(w, D, 0.3);
    test_fill_normal(dout, T * W, 1.0);
    for (int d = 0; d < D; d++) w1[d] = 1.0f + w[d];
    float *y_zc = norm_floats(T * W), *y_pl = norm_floats(T * W), *y_w = norm_floats(T * W);
    float *r_zc = norm_floats(T * nh), *r_pl = norm_floats(T * nh);
    cpu_rmsnorm_forward(y_zc, r_zc, x, w, T, nh, D, W, W, 1e-6f, 1);
    cpu_rmsnorm_forward(y_pl, r_pl, x, w1, T, nh, D, W, W, 1e-6f, 0);
    cpu_rmsnorm_forward(y_w, r_pl, x, w, T, nh, D, W, W, 1e-6f, 0);
    test_check_rel_f("rmsnorm zero_centred(w) vs plain(1+w) fwd", y_zc, y_pl, T * W, 1e-7);
    double diff = test_rel_err_f(y_w, y_zc, T * W);
    EXPECT(diff > 0.1, "plain(w) and zero_centred(w) agree (rel %g): the flag is ignored", diff);
    printf("rmsnorm plain(w) vs zero_centred(w): rel diff %.3e > 0.1 ok\n", diff);

    float *dx_zc = norm_floats(T * W), *dx_pl = norm_floats(T * W), *dw_zc = norm_floats(D), *dw_pl = norm_floats(D);
    float *dx_w = norm_floats(T * W), *dw_w = norm_floats(D);
    cpu_rmsnorm_backward(dx_zc, dw_zc, dout, x, w, r_zc, T, nh, D, W, W, 1);
    cpu_rmsnorm_backward(dx_pl, dw_pl, dout, x, w1, r_zc, T, nh, D, W, W, 0);
    cpu_rmsnorm_backward(dx_w, dw_w, dout, x, w, r_zc, T, nh, D, W, W, 0);
    test_check_rel_f("rmsnorm zero_centred(w) vs plain(1+w) bwd dinp", dx_zc, dx_pl, T * W, 1e-7);
    test_check_rel_f("rmsnorm zero_centred(w) vs plain(1+w) bwd dw", dw_zc, dw_pl, D, 1e-7);
    diff = test_rel_err_f(dx_w, dx_zc, T * W);
    EXPECT(diff > 0.1, "plain(w) and zero_centred(w) backward agree (rel %g)", diff);
}

/* ================================ L2 norm ================================ */

#define L2_EPS 1e-6 /* docs/design/model.md: on the sum of squares */

typedef struct {
    int64_t T;
    int     nh, D, ldi_extra, ldo_extra;
    double  scale; /* 1e-3 with D = 8: sum(x^2) ~ 8e-6, so eps on the sum vs on the mean differ */
} L2Shape;

static const L2Shape l2_shapes[] = {
    {1, 1, 37, 0, 0, 1.0},
    {7, 3, 16, 5, 2, 1.0},
    {64, 4, 32, 0, 0, 1.0}, /* dense, ldi == ldo: also run in place */
    {130, 2, 8, 3, 3, 1e-3},
    {130, 5, 13, 1, 4, 1.0},
};

/* y = x (sum(x^2) + 1e-6)^-1/2 per head, rows [t0, t1); y and rstd hold those rows from their start */
static void l2_ref(double *y, double *rstd, const double *x, int64_t t0, int64_t t1, int nh, int D) {
    for (int64_t t = t0; t < t1; t++)
        for (int h = 0; h < nh; h++) {
            const double *xr = x + (t * nh + h) * D;
            double ss = 0;
            for (int d = 0; d < D; d++) ss += xr[d] * xr[d];
            double r = 1.0 / sqrt(ss + L2_EPS);
            if (rstd) rstd[(t - t0) * nh + h] = r;
            for (int d = 0; d < D; d++) y[((t - t0) * nh + h) * D + d] = xr[d] * r;
        }
}

typedef struct {
    TestRowRange rows;
    int          nh, D;
    const double *x, *R;
    double       *row; /* (nh*D) scratch */
} L2Ctx;

static double l2_loss(void *ctx_, double *unused) {
    (void)unused;
    L2Ctx *c = ctx_;
    int64_t W = (int64_t)c->nh * c->D;
    double L = 0;
    for (int64_t t = c->rows.t0; t < c->rows.t1; t++) {
        l2_ref(c->row, NULL, c->x, t, t + 1, c->nh, c->D);
        for (int64_t j = 0; j < W; j++) L += c->row[j] * c->R[t * W + j];
    }
    return L;
}

TEST(l2norm) {
    for (size_t si = 0; si < sizeof l2_shapes / sizeof l2_shapes[0]; si++) {
        const L2Shape *s = &l2_shapes[si];
        const int64_t T = s->T, W = (int64_t)s->nh * s->D;
        const int ldi = (int)W + s->ldi_extra, ldo = (int)W + s->ldo_extra;
        char what[128], m[200];
        snprintf(what, sizeof what, "l2norm T=%lld nh=%d D=%d ldi=%d ldo=%d scale=%g", (long long)T, s->nh, s->D, ldi,
                 ldo, s->scale);
        TestStrided x = test_strided_new(T, (int)W, ldi), out = test_strided_new(T, (int)W, ldo);
        test_strided_fill_normal(&x, s->scale);
        float *rstd = norm_nans(T * s->nh);
        cpu_l2norm_forward(out.p, rstd, x.p, T, s->nh, s->D, ldi, ldo);

        double *xd = norm_doubles(T * W), *yref = norm_doubles(T * W), *rref = norm_doubles(T * s->nh);
        float *y = norm_floats(T * W);
        test_strided_get(xd, &x);
        l2_ref(yref, rref, xd, 0, T, s->nh, s->D);
        test_strided_getf(y, &out);
        snprintf(m, sizeof m, "%s fwd out", what);
        test_check_rel(m, y, yref, T * W, NORM_FWD_BOUND);
        test_strided_intact(m, &out);
        snprintf(m, sizeof m, "%s fwd rstd", what);
        test_check_rel(m, rstd, rref, T * s->nh, NORM_FWD_BOUND);

        /* backward: dinp is written (=), so it starts as NaN */
        TestStrided dout = test_strided_new(T, (int)W, ldo), dinp = test_strided_new(T, (int)W, ldi);
        test_strided_fill_normal(&dout, 1.0);
        cpu_l2norm_backward(dinp.p, dout.p, out.p, rstd, T, s->nh, s->D, ldi, ldo);
        double *R = norm_doubles(T * W), *gx = norm_doubles(T * W);
        test_strided_get(R, &dout);
        L2Ctx ctx = {{0, T}, s->nh, s->D, xd, R, norm_doubles(W)};
        test_fd_rows(gx, l2_loss, &ctx, xd, T, W, 1e-4 * s->scale);
        float *got = norm_floats(T * W);
        test_strided_getf(got, &dinp);
        snprintf(m, sizeof m, "%s bwd dinp", what);
        test_check_rel(m, got, gx, T * W, NORM_BWD_BOUND);
        test_strided_intact(m, &dinp);

        if (ldi == ldo) { /* in place: dinp = dout */
            cpu_l2norm_backward(dout.p, dout.p, out.p, rstd, T, s->nh, s->D, ldi, ldo);
            float *inplace = norm_floats(T * W);
            test_strided_getf(inplace, &dout);
            snprintf(m, sizeof m, "%s bwd in place vs out of place", what);
            test_check_rel_f(m, inplace, got, T * W, 0.0);
        }
    }
}

/* ============================ gated RMSNorm ============================== */

typedef struct {
    int64_t T;
    int     nv, dv, ldz_extra;
    double  scale;
    float   eps;
} GatedShape;

static const GatedShape gated_shapes[] = {
    {1, 1, 16, 0, 1.0, 1e-6f},
    {7, 3, 12, 5, 1.0, 1e-6f},   /* z inside the wider [q|k|v|z|b|a] row */
    {64, 2, 32, 0, 1.0, 1e-6f},  /* dense z: also run in place (dx = dout) */
    {130, 4, 9, 1, 1e-3, 1e-6f}, /* mean(x^2) ~ eps */
};

/* y = w (x rstd) silu(z) per (token, head), rows [t0, t1); y and rstd hold those rows from their start */
static void gated_ref(double *y, double *rstd, const double *x, const double *z, const double *w, int64_t t0, int64_t t1,
                      int nv, int dv, double eps) {
    for (int64_t t = t0; t < t1; t++)
        for (int h = 0; h < nv; h++) {
            const double *xr = x + (t * nv + h) * dv, *zr = z + (t * nv + h) * dv;
            double ss = 0;
            for (int d = 0; d < dv; d++) ss += xr[d] * xr[d];
            double r = 1.0 / sqrt(ss / dv + eps);
            if (rstd) rstd[(t - t0) * nv + h] = r;
            for (int d = 0; d < dv; d++)
                y[((t - t0) * nv + h) * dv + d] = w[d] * (xr[d] * r) * (zr[d] / (1.0 + exp(-zr[d])));
        }
}

typedef struct {
    TestRowRange rows;
    int          nv, dv;
    double       eps;
    const double *x, *z, *w, *R;
    double       *row; /* (nv*dv) scratch */
} GatedCtx;

static double gated_loss(void *ctx_, double *unused) {
    (void)unused;
    GatedCtx *c = ctx_;
    int64_t W = (int64_t)c->nv * c->dv;
    double L = 0;
    for (int64_t t = c->rows.t0; t < c->rows.t1; t++) {
        gated_ref(c->row, NULL, c->x, c->z, c->w, t, t + 1, c->nv, c->dv, c->eps);
        for (int64_t j = 0; j < W; j++) L += c->row[j] * c->R[t * W + j];
    }
    return L;
}

TEST(gated_rmsnorm) {
    for (size_t si = 0; si < sizeof gated_shapes / sizeof gated_shapes[0]; si++) {
        const GatedShape *s = &gated_shapes[si];
        const int64_t T = s->T, W = (int64_t)s->nv * s->dv;
        const int ldz = (int)W + s->ldz_extra;
        char what[128], m[200];
        snprintf(what, sizeof what, "gated_rmsnorm T=%lld nv=%d dv=%d ldz=%d scale=%g", (long long)T, s->nv, s->dv, ldz,
                 s->scale);
        float *x = norm_floats(T * W), *w = norm_floats(s->dv), *out = norm_nans(T * W), *rstd = norm_nans(T * s->nv);
        test_fill_normal(x, T * W, s->scale);
        test_fill_normal(w, s->dv, 1.0);
        TestStrided z = test_strided_new(T, (int)W, ldz);
        test_strided_fill_normal(&z, 2.0);
        cpu_gated_rmsnorm_forward(out, rstd, x, z.p, w, T, s->nv, s->dv, ldz, s->eps);

        double *xd = norm_doubles(T * W), *zd = norm_doubles(T * W), *wd = norm_doubles(s->dv),
               *yref = norm_doubles(T * W), *rref = norm_doubles(T * s->nv);
        test_to_double(xd, x, T * W);
        test_strided_get(zd, &z);
        test_to_double(wd, w, s->dv);
        gated_ref(yref, rref, xd, zd, wd, 0, T, s->nv, s->dv, s->eps);
        snprintf(m, sizeof m, "%s fwd out", what);
        test_check_rel(m, out, yref, T * W, NORM_FWD_BOUND);
        snprintf(m, sizeof m, "%s fwd rstd", what);
        test_check_rel(m, rstd, rref, T * s->nv, NORM_FWD_BOUND);

        /* backward: dx =, dz = (NaN before), dw += onto random values */
        float *dout = norm_floats(T * W), *dx = norm_nans(T * W), *dw = norm_floats(s->dv), *dw0 = norm_floats(s->dv);
        test_fill_normal(dout, T * W, 1.0);
        test_fill_normal(dw, s->dv, 1.0);
        memcpy(dw0, dw, (size_t)s->dv * sizeof(float));
        TestStrided dz = test_strided_new(T, (int)W, ldz);
        cpu_gated_rmsnorm_backward(dx, dz.p, dw, dout, x, z.p, w, rstd, T, s->nv, s->dv, ldz);

        double *R = norm_doubles(T * W), *gx = norm_doubles(T * W), *gz = norm_doubles(T * W), *gw = norm_doubles(s->dv);
        test_to_double(R, dout, T * W);
        GatedCtx ctx = {{0, T}, s->nv, s->dv, s->eps, xd, zd, wd, R, norm_doubles(W)};
        test_fd_rows(gx, gated_loss, &ctx, xd, T, W, 1e-4 * s->scale);
        test_fd_rows(gz, gated_loss, &ctx, zd, T, W, 1e-4);
        test_fd_grad(gw, gated_loss, &ctx, wd, s->dv, NULL, 0, 1e-4);
        for (int d = 0; d < s->dv; d++) gw[d] += dw0[d];
        float *got = norm_floats(T * W);
        snprintf(m, sizeof m, "%s bwd dx", what);
        test_check_rel(m, dx, gx, T * W, NORM_BWD_BOUND);
        test_strided_getf(got, &dz);
        snprintf(m, sizeof m, "%s bwd dz", what);
        test_check_rel(m, got, gz, T * W, NORM_BWD_BOUND);
        test_strided_intact(m, &dz);
        snprintf(m, sizeof m, "%s bwd dw (+=)", what);
        test_check_rel(m, dw, gw, s->dv, NORM_BWD_BOUND);

        if (ldz == W) { /* in place: dx = dout */
            float *dw2 = norm_floats(s->dv);
            float *dz2 = norm_floats(T * W);
            cpu_gated_rmsnorm_backward(dout, dz2, dw2, dout, x, z.p, w, rstd, T, s->nv, s->dv, ldz);
            snprintf(m, sizeof m, "%s bwd in place vs out of place", what);
            test_check_rel_f(m, dout, dx, T * W, 0.0);
        }
    }
}

/* gdn_split_forward/backward (the fused op of the GDN layer's split after the conv) are, on cpu, the L2 norm
 * and two copies: bitwise the unfused calls the model made before, on strided blocks whose pads are checked */
TEST(gdn_split_is_l2norm_and_copies) {
    const int64_t T = 37;
    const int nk = 2, dk = 16, Vd = 24, Kd2 = 2 * nk * dk, Cc = Kd2 + Vd, ldc = Cc + 5, ldz = Vd + 7;
    TestStrided conv = test_strided_new(T, Cc, ldc), zin = test_strided_new(T, Vd, ldz);
    test_strided_fill_normal(&conv, 1.0);
    test_strided_fill_normal(&zin, 1.0);
    TestStrided qk = test_strided_new(T, Kd2, Kd2), v = test_strided_new(T, Vd, Vd), z = test_strided_new(T, Vd, Vd);
    TestStrided qk0 = test_strided_new(T, Kd2, Kd2), v0 = test_strided_new(T, Vd, Vd), z0 = test_strided_new(T, Vd, Vd);
    float *rstd = norm_nans(T * 2 * nk), *rstd0 = norm_nans(T * 2 * nk);
    cpu_gdn_split_forward(qk.p, rstd, v.p, z.p, conv.p, zin.p, T, nk, dk, Vd, ldc, ldz);
    cpu_l2norm_forward(qk0.p, rstd0, conv.p, T, 2 * nk, dk, ldc, Kd2);
    cpu_copy_2d(v0.p, conv.p + Kd2, T, Vd, Vd, ldc);
    cpu_copy_2d(z0.p, zin.p, T, Vd, Vd, ldz);
    EXPECT(!memcmp(qk.p, qk0.p, (size_t)(T * Kd2) * 4), "gdn_split fwd qk differs from l2norm_forward");
    EXPECT(!memcmp(rstd, rstd0, (size_t)(T * 2 * nk) * 4), "gdn_split fwd rstd differs");
    for (int64_t t = 0; t < T; t++) {
        EXPECT(!memcmp(v.p + t * Vd, v0.p + t * Vd, (size_t)Vd * 4), "gdn_split fwd v row %lld", (long long)t);
        EXPECT(!memcmp(z.p + t * Vd, z0.p + t * Vd, (size_t)Vd * 4), "gdn_split fwd z row %lld", (long long)t);
    }
    test_strided_intact("gdn_split fwd qk", &qk);

    TestStrided dqk = test_strided_new(T, Kd2, Kd2), dv = test_strided_new(T, Vd, Vd), dz = test_strided_new(T, Vd, Vd);
    test_strided_fill_normal(&dqk, 1.0);
    test_strided_fill_normal(&dv, 1.0);
    test_strided_fill_normal(&dz, 1.0);
    TestStrided dconv = test_strided_new(T, Cc, ldc), dzout = test_strided_new(T, Vd, ldz);
    TestStrided dconv0 = test_strided_new(T, Cc, ldc), dzout0 = test_strided_new(T, Vd, ldz);
    cpu_gdn_split_backward(dconv.p, dzout.p, dqk.p, qk.p, rstd, dv.p, dz.p, T, nk, dk, Vd, ldc, ldz);
    cpu_copy_2d(dzout0.p, dz.p, T, Vd, ldz, Vd);
    cpu_l2norm_backward(dconv0.p, dqk.p, qk.p, rstd, T, 2 * nk, dk, ldc, Kd2);
    cpu_copy_2d(dconv0.p + Kd2, dv.p, T, Vd, ldc, Vd);
    for (int64_t t = 0; t < T; t++) {
        EXPECT(!memcmp(dconv.p + t * ldc, dconv0.p + t * ldc, (size_t)Cc * 4), "gdn_split bwd dconv row %lld",
               (long long)t);
        EXPECT(!memcmp(dzout.p + t * ldz, dzout0.p + t * ldz, (size_t)Vd * 4), "gdn_split bwd dzout row %lld",
               (long long)t);
    }
    test_strided_intact("gdn_split bwd dconv", &dconv);
    test_strided_intact("gdn_split bwd dzout (the gates' columns beside it untouched)", &dzout);
}
