/*
 * test_matmul.c — per-op tests of kernels/cpu/cpu_matmul.c (y = x W^T through cblas_sgemm).
 *
 * Forward against a float64 triple loop written here, written (=, output pre-filled with NaN)
 * and accumulated (+=, output pre-filled with random values); backward against float64 central
 * finite differences of that loop (L = sum(out * R)) for dinp written, dinp accumulated, dinp
 * skipped (NULL), and dw accumulated onto random values. Inputs and outputs are column blocks of
 * wider rows with NaN margins (test_strided.h), so a wrong ld reads NaN or writes a margin.
 * The largest shape (K = 257, big enough for OpenBLAS's blocked paths) checks the backward
 * against the float64 closed form (dout W, dout^T x), which the smaller shapes tie to FD.
 *
 * Bounds (relative L2 error): 1e-6 for forward and backward. fp32 sums of K products with
 * random signs measure 5e-8..2e-7 here; a wrong transpose, ld or beta is off by O(1).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test_strided.h"
#include "test_util.h"

#define MATMUL_BOUND 1e-6

typedef struct {
    int64_t T;
    int     IC, OC, ldi_extra, ldo_extra;
    int     fd; /* check against finite differences (else against the closed form) */
} MatShape;

static const MatShape mat_shapes[] = {
    {1, 37, 29, 0, 0, 1},
    {7, 16, 33, 5, 3, 1},
    {64, 64, 48, 0, 7, 1},
    {130, 37, 29, 11, 2, 1},
    {130, 257, 129, 3, 5, 0},
};

static double *mat_doubles(int64_t n) { return test_alloc(n * (int64_t)sizeof(double)); }
static float *mat_floats(int64_t n) { return test_alloc(n * (int64_t)sizeof(float)); }

/* out[t,o] = sum_i inp[t,i] w[o,i], rows [t0, t1), dense (T, IC) / (OC, IC) / (T, OC) */
static void mat_ref(double *out, const double *inp, const double *w, int64_t t0, int64_t t1, int IC, int OC) {
    for (int64_t t = t0; t < t1; t++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int i = 0; i < IC; i++) s += inp[t * IC + i] * w[(int64_t)o * IC + i];
            out[t * OC + o] = s;
        }
}

typedef struct {
    TestRowRange rows;
    int          IC, OC;
    const double *inp, *w, *R;
    double       *out; /* (T, OC) scratch */
} MatCtx;

static double mat_loss(void *ctx_, double *unused) {
    (void)unused;
    MatCtx *c = ctx_;
    mat_ref(c->out, c->inp, c->w, c->rows.t0, c->rows.t1, c->IC, c->OC);
    double L = 0;
    for (int64_t t = c->rows.t0; t < c->rows.t1; t++)
        for (int o = 0; o < c->OC; o++) L += c->out[t * c->OC + o] * c->R[t * c->OC + o];
    return L;
}

TEST(matmul_forward) {
    for (size_t si = 0; si < sizeof mat_shapes / sizeof mat_shapes[0]; si++) {
        const MatShape *s = &mat_shapes[si];
        const int64_t T = s->T;
        const int ldi = s->IC + s->ldi_extra, ldo = s->OC + s->ldo_extra;
        for (int acc = 0; acc <= 1; acc++) {
            char m[200];
            snprintf(m, sizeof m, "matmul fwd T=%lld IC=%d OC=%d ldi=%d ldo=%d %s", (long long)T, s->IC, s->OC, ldi,
                     ldo, acc ? "+=" : "=");
            TestStrided x = test_strided_new(T, s->IC, ldi), out = test_strided_new(T, s->OC, ldo);
            test_strided_fill_normal(&x, 1.0);
            float *w = mat_floats((int64_t)s->OC * s->IC);
            test_fill_normal(w, (int64_t)s->OC * s->IC, 1.0);
            double *pre = mat_doubles(T * s->OC);
            if (acc) {
                test_strided_fill_normal(&out, 3.0);
                test_strided_get(pre, &out);
            }
            cpu_matmul_forward(out.p, x.p, w, T, s->IC, s->OC, ldi, ldo, acc);
            double *xd = mat_doubles(T * s->IC), *wd = mat_doubles((int64_t)s->OC * s->IC), *ref = mat_doubles(T * s->OC);
            test_strided_get(xd, &x);
            test_to_double(wd, w, (int64_t)s->OC * s->IC);
            mat_ref(ref, xd, wd, 0, T, s->IC, s->OC);
            for (int64_t i = 0; i < T * s->OC; i++) ref[i] += pre[i];
            float *got = mat_floats(T * s->OC);
            test_strided_getf(got, &out);
            test_check_rel(m, got, ref, T * s->OC, MATMUL_BOUND);
            test_strided_intact(m, &out);
        }
    }
}

/* mode 0: dinp written; 1: dinp accumulated; 2: dinp NULL (dw only) */
TEST(matmul_backward) {
    static const char *mode_name[4] = {"dinp =", "dinp +=", "dinp NULL", "dw NULL"};
    for (size_t si = 0; si < sizeof mat_shapes / sizeof mat_shapes[0]; si++) {
        const MatShape *s = &mat_shapes[si];
        const int64_t T = s->T, nw = (int64_t)s->OC * s->IC;
        const int ldi = s->IC + s->ldi_extra, ldo = s->OC + s->ldo_extra;
        TestStrided x = test_strided_new(T, s->IC, ldi), dout = test_strided_new(T, s->OC, ldo);
        test_strided_fill_normal(&x, 1.0);
        test_strided_fill_normal(&dout, 1.0);
        float *w = mat_floats(nw);
        test_fill_normal(w, nw, 1.0);
        double *xd = mat_doubles(T * s->IC), *wd = mat_doubles(nw), *R = mat_doubles(T * s->OC);
        test_strided_get(xd, &x);
        test_to_double(wd, w, nw);
        test_strided_get(R, &dout);

        /* the float64 gradients of L = sum(out * R) */
        double *gx = mat_doubles(T * s->IC), *gw = mat_doubles(nw);
        const char *how;
        if (s->fd) {
            MatCtx ctx = {{0, T}, s->IC, s->OC, xd, wd, R, mat_doubles(T * s->OC)};
            test_fd_rows(gx, mat_loss, &ctx, xd, T, s->IC, 1e-3);
            test_fd_grad(gw, mat_loss, &ctx, wd, nw, NULL, 0, 1e-3);
            how = "vs FD";
        } else {
            for (int64_t t = 0; t < T; t++)
                for (int i = 0; i < s->IC; i++) {
                    double a = 0;
                    for (int o = 0; o < s->OC; o++) a += R[t * s->OC + o] * wd[(int64_t)o * s->IC + i];
                    gx[t * s->IC + i] = a;
                }
            for (int o = 0; o < s->OC; o++)
                for (int i = 0; i < s->IC; i++) {
                    double a = 0;
                    for (int64_t t = 0; t < T; t++) a += R[t * s->OC + o] * xd[t * s->IC + i];
                    gw[(int64_t)o * s->IC + i] = a;
                }
            how = "vs closed form";
        }

        for (int mode = 0; mode < 4; mode++) { /* dinp =, dinp +=, dw only, dinp only */
            char m[200];
            snprintf(m, sizeof m, "matmul bwd T=%lld IC=%d OC=%d ldi=%d ldo=%d %s %s", (long long)T, s->IC, s->OC, ldi,
                     ldo, mode_name[mode], how);
            TestStrided dinp = test_strided_new(T, s->IC, ldi);
            double *pre = mat_doubles(T * s->IC), *want = mat_doubles(T * s->IC), *want_w = mat_doubles(nw);
            if (mode == 1) {
                test_strided_fill_normal(&dinp, 3.0);
                test_strided_get(pre, &dinp);
            }
            float *dw = mat_floats(nw);
            test_fill_normal(dw, nw, 3.0);
            for (int64_t i = 0; i < nw; i++) want_w[i] = dw[i] + gw[i];
            for (int64_t i = 0; mode == 3 && i < nw; i++) want_w[i] = dw[i]; /* untouched */
            cpu_matmul_backward(mode == 2 ? NULL : dinp.p, mode == 3 ? NULL : dw, dout.p, mode == 3 ? NULL : x.p, w, T,
                                s->IC, s->OC, ldi, ldo, mode == 1);
            char mm[240];
            if (mode != 2) {
                for (int64_t i = 0; i < T * s->IC; i++) want[i] = pre[i] + gx[i];
                float *got = mat_floats(T * s->IC);
                test_strided_getf(got, &dinp);
                snprintf(mm, sizeof mm, "%s: dinp", m);
                test_check_rel(mm, got, want, T * s->IC, MATMUL_BOUND);
                test_strided_intact(mm, &dinp);
            }
            snprintf(mm, sizeof mm, "%s: dw (%s)", m, mode == 3 ? "untouched" : "+=");
            test_check_rel(mm, dw, want_w, nw, mode == 3 ? 0.0 : MATMUL_BOUND);
        }
    }
}

/* matmul_forward_residual: out = resid + x W^T from resid's own buffer (strides differ), bitwise the copy
 * then accumulate the model made before, resid untouched, nothing outside out's block written */
TEST(matmul_forward_residual) {
    const int64_t T = 29;
    const int IC = 19, OC = 23, ldi = IC + 2, ldo = OC + 3, ldr = OC + 9;
    TestStrided x = test_strided_new(T, IC, ldi), r = test_strided_new(T, OC, ldr);
    test_strided_fill_normal(&x, 1.0);
    test_strided_fill_normal(&r, 2.0);
    float *w = mat_floats((int64_t)OC * IC);
    test_fill_normal(w, (int64_t)OC * IC, 1.0);
    float *r0 = mat_floats(T * OC);
    test_strided_getf(r0, &r);
    TestStrided out = test_strided_new(T, OC, ldo), ref = test_strided_new(T, OC, ldo);
    cpu_matmul_forward_residual(out.p, x.p, w, r.p, T, IC, OC, ldi, ldo, ldr);
    for (int64_t t = 0; t < T; t++) memcpy(ref.p + t * ldo, r.p + t * ldr, (size_t)OC * 4);
    cpu_matmul_forward(ref.p, x.p, w, T, IC, OC, ldi, ldo, 1);
    for (int64_t t = 0; t < T; t++)
        EXPECT(!memcmp(out.p + t * ldo, ref.p + t * ldo, (size_t)OC * 4), "matmul_forward_residual row %lld differs "
               "from the copy + accumulate", (long long)t);
    float *r1 = mat_floats(T * OC);
    test_strided_getf(r1, &r);
    EXPECT(!memcmp(r0, r1, (size_t)(T * OC) * 4), "matmul_forward_residual changed resid");
    test_strided_intact("matmul_forward_residual out", &out);
}
