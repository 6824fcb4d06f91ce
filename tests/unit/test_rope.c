/*
 * test_rope.c — per-op tests of kernels/cpu/cpu_rope.c (partial rotary embedding, rotate-half
 * pairing inside the first rd dims of every head, in place).
 *
 * The reference angles are computed here in long double (inv_freq, angle, cos and sin), so they
 * do not share the kernel's double arithmetic. Checks: forward vs the reference; backward (the inverse
 * rotation of the gradient) vs float64 central finite differences of L = sum(rope(x) * R);
 * forward then backward gives back the input; and at positions up to 1,000,000 the kernel still
 * matches the reference, while the same rotation with fp32 angles (what a careless kernel does)
 * is shown to miss the bound there. Heads sit inside wider rows with NaN margins
 * (test_strided.h); rd = hd, rd = hd/4 (Qwen3-Next), rd/2 odd and rd = 0 are covered.
 *
 * Bounds (relative L2 error): forward 2e-7 (each output is one fp32 rounding of a rotation,
 * measured 1e-8..3e-8, also at pos 1e6); backward vs FD 1e-6 (measured ~2e-8); forward then
 * backward 2e-7 (two roundings, measured ~1e-8). fp32 angles at pos ~1e6 are off by up to 0.03 rad: ~1e-2.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test_strided.h"
#include "test_util.h"

#define ROPE_FWD_BOUND 2e-7
#define ROPE_BWD_BOUND 1e-6
#define ROPE_ROUNDTRIP_BOUND 2e-7

typedef struct {
    int64_t T;
    int     nh, hd, rd, ld_extra;
    float   theta;
    int     pos_max; /* positions drawn in [pos_max - 4096, pos_max] (and 0 for the first token) */
} RopeShape;

static const RopeShape rope_shapes[] = {
    {1, 1, 16, 16, 0, 10000.0f, 0},           /* full rotary, position 0: identity */
    {7, 3, 32, 8, 5, 10000.0f, 5000},         /* partial, factor 0.25, heads inside a wider row */
    {64, 2, 64, 16, 3, 1e7f, 70000},
    {130, 4, 20, 10, 1, 10000.0f, 300000},    /* rd/2 = 5: odd half */
    {130, 2, 256, 64, 0, 1e7f, 1000000},      /* Qwen3-Next head: hd 256, rd 64, theta 1e7 */
    {7, 2, 12, 0, 2, 10000.0f, 100},          /* rd = 0: nothing rotates */
};

static double *rope_doubles(int64_t n) { return test_alloc(n * (int64_t)sizeof(double)); }
static float *rope_floats(int64_t n) { return test_alloc(n * (int64_t)sizeof(float)); }

static void rope_positions(int32_t *pos, int64_t T, int pos_max) {
    for (int64_t t = 0; t < T; t++) {
        int lo = pos_max > 4096 ? pos_max - 4096 : 0;
        pos[t] = lo + (int32_t)(test_uniform() * (pos_max - lo + 1));
        if (pos[t] > pos_max) pos[t] = pos_max;
    }
    pos[0] = 0;
    if (T > 1) pos[T - 1] = pos_max;
}

/* cos and sin of every (token, pair) angle, computed in long double: cs (T, rd/2, 2) */
static double *rope_ref_angles(const int32_t *pos, int64_t T, int rd, double theta) {
    const int half = rd / 2;
    double *cs = rope_doubles(T * half * 2 + 1);
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            long double inv = powl((long double)theta, -2.0L * i / rd);
            long double ang = (long double)pos[t] * inv;
            cs[(t * half + i) * 2] = (double)cosl(ang);
            cs[(t * half + i) * 2 + 1] = (double)sinl(ang);
        }
    return cs;
}

/* y = rope(x) on dense (T, nh*hd), rows [t0, t1), with the angles of rope_ref_angles */
static void rope_ref(double *y, const double *x, const double *cs, int64_t t0, int64_t t1, int nh, int hd, int rd) {
    const int half = rd / 2;
    for (int64_t t = t0; t < t1; t++)
        for (int h = 0; h < nh; h++) {
            const double *xr = x + (t * nh + h) * hd;
            double *yr = y + (t * nh + h) * hd;
            for (int d = 0; d < hd; d++) yr[d] = xr[d];
            for (int i = 0; i < half; i++) {
                double c = cs[(t * half + i) * 2], s = cs[(t * half + i) * 2 + 1];
                yr[i] = xr[i] * c - xr[i + half] * s;
                yr[i + half] = xr[i + half] * c + xr[i] * s;
            }
        }
}

typedef struct {
    TestRowRange   rows;
    int            nh, hd, rd;
    const double  *cs; /* (T, rd/2, 2) */
    const double  *x, *R;
    double        *y; /* (T, nh*hd) scratch */
} RopeCtx;

static double rope_loss(void *ctx_, double *unused) {
    (void)unused;
    RopeCtx *c = ctx_;
    const int64_t W = (int64_t)c->nh * c->hd;
    rope_ref(c->y, c->x, c->cs, c->rows.t0, c->rows.t1, c->nh, c->hd, c->rd);
    double L = 0;
    for (int64_t i = c->rows.t0 * W; i < c->rows.t1 * W; i++) L += c->y[i] * c->R[i];
    return L;
}

TEST(rope) {
    for (size_t si = 0; si < sizeof rope_shapes / sizeof rope_shapes[0]; si++) {
        const RopeShape *s = &rope_shapes[si];
        const int64_t T = s->T, W = (int64_t)s->nh * s->hd;
        const int ld = (int)W + s->ld_extra;
        char what[160], m[220];
        snprintf(what, sizeof what, "rope T=%lld nh=%d hd=%d rd=%d ld=%d theta=%g pos<=%d", (long long)T, s->nh, s->hd,
                 s->rd, ld, (double)s->theta, s->pos_max);
        int32_t *pos = test_alloc(T * (int64_t)sizeof(int32_t));
        rope_positions(pos, T, s->pos_max);
        TestStrided x = test_strided_new(T, (int)W, ld);
        test_strided_fill_normal(&x, 1.0);
        float *x0 = rope_floats(T * W);
        test_strided_getf(x0, &x);

        cpu_rope_forward(x.p, pos, T, s->nh, s->hd, s->rd, ld, s->theta);
        double *xd = rope_doubles(T * W), *ref = rope_doubles(T * W);
        test_to_double(xd, x0, T * W);
        double *cs = rope_ref_angles(pos, T, s->rd, s->theta);
        rope_ref(ref, xd, cs, 0, T, s->nh, s->hd, s->rd);
        float *got = rope_floats(T * W);
        test_strided_getf(got, &x);
        snprintf(m, sizeof m, "%s fwd", what);
        test_check_rel(m, got, ref, T * W, ROPE_FWD_BOUND);
        test_strided_intact(m, &x);

        cpu_rope_backward(x.p, pos, T, s->nh, s->hd, s->rd, ld, s->theta);
        test_strided_getf(got, &x);
        snprintf(m, sizeof m, "%s fwd then bwd restores x", what);
        test_check_rel(m, got, xd, T * W, ROPE_ROUNDTRIP_BOUND);

        /* backward of the gradient vs FD of the reference */
        TestStrided dx = test_strided_new(T, (int)W, ld);
        test_strided_fill_normal(&dx, 1.0);
        double *R = rope_doubles(T * W), *gx = rope_doubles(T * W);
        test_strided_get(R, &dx);
        cpu_rope_backward(dx.p, pos, T, s->nh, s->hd, s->rd, ld, s->theta);
        RopeCtx ctx = {{0, T}, s->nh, s->hd, s->rd, cs, xd, R, rope_doubles(T * W)};
        test_fd_rows(gx, rope_loss, &ctx, xd, T, W, 1e-3);
        test_strided_getf(got, &dx);
        snprintf(m, sizeof m, "%s bwd vs FD", what);
        test_check_rel(m, got, gx, T * W, ROPE_BWD_BOUND);
        test_strided_intact(m, &dx);
    }
}

/* Positions near 1,000,000 with both thetas: the kernel matches the long double reference, and a
 * rotation with fp32 angles (pos and inv_freq in float, as torch computes them) misses the same
 * bound by orders of magnitude, so this test would catch an fp32-angle kernel. */
TEST(rope_long_context) {
    const int64_t T = 64;
    const int nh = 2, hd = 64, rd = 64, W = nh * hd;
    static const float thetas[] = {10000.0f, 1e7f};
    for (int k = 0; k < 2; k++) {
        const float theta = thetas[k];
        int32_t *pos = test_alloc(T * (int64_t)sizeof(int32_t));
        for (int64_t t = 0; t < T; t++) pos[t] = 1000000 - (int32_t)(t * 7919 % 20000);
        pos[0] = 1000000;
        float *x = rope_floats(T * W), *x32 = rope_floats(T * W);
        test_fill_normal(x, T * W, 1.0);
        memcpy(x32, x, (size_t)(T * W) * sizeof(float));
        double *xd = rope_doubles(T * W), *ref = rope_doubles(T * W);
        test_to_double(xd, x, T * W);
        rope_ref(ref, xd, rope_ref_angles(pos, T, rd, theta), 0, T, nh, hd, rd);

        cpu_rope_forward(x, pos, T, nh, hd, rd, W, theta);
        char m[160];
        snprintf(m, sizeof m, "rope pos ~1e6 theta=%g fwd", (double)theta);
        test_check_rel(m, x, ref, T * W, ROPE_FWD_BOUND);

        /* the same rotation with fp32 angles */
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < rd / 2; i++) {
                float inv = 1.0f / powf(theta, (float)(2 * i) / rd);
                float ang = (float)pos[t] * inv;
                float c = cosf(ang), s = sinf(ang);
                for (int h = 0; h < nh; h++) {
                    float *xr = x32 + t * W + h * hd, a = xr[i], b = xr[i + rd / 2];
                    xr[i] = a * c - b * s;
                    xr[i + rd / 2] = b * c + a * s;
                }
            }
        double e32 = test_rel_err(x32, ref, T * W);
        EXPECT(e32 > 100 * ROPE_FWD_BOUND, "fp32 angles give rel err %.3e: the bound would not catch them", e32);
        printf("rope pos ~1e6 theta=%g with fp32 angles: rel err %.3e > %.1e (the test catches it) ok\n",
               (double)theta, e32, 100 * ROPE_FWD_BOUND);
    }
}
