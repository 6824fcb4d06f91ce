/*
 * test_optim.c — per-op tests of kernels/cpu/cpu_optim.c: the AdamW step and the double sum of
 * squares.
 *
 * AdamW: three steps against a float64 reference of the formula in lib/backend/backend.h, with weight
 * decay, grad_scale != 1, and gradients whose sizes span 1e-4..1 so that eps (1e-6 here) matters
 * for the small ones (eps inside the sqrt, or a missing bias correction, is off by far more than
 * the bounds). Checked after every step: p, m, v, and the update p - p_before on its own (it is
 * ~1e-2 of p, so an error in it hides in p). The `compute` copy: a separate buffer gets exactly
 * the updated p; compute == param and compute == NULL give the same p bitwise.
 * sum_squares: against a long double sum; n = 0, 1, 1000003; two calls agree bitwise; an fp32
 * accumulator is shown to miss the bound.
 *
 * Bounds (relative L2 error): p, m, v 1e-6 (fp32 arithmetic, measured 3e-8..6e-8); the update
 * 2e-6 (it inherits the fp32 rounding of p, 6e-8 of |p| ~ 0.05, relative to an update of ~1e-2,
 * plus its own few roundings); a decay term taken from the new p instead of the old one is off by
 * ~1e-3, eps inside the sqrt or a missing bias correction by far more. sum_squares 1e-12 (double
 * accumulation of 1e6 terms, measured 2e-13; an fp32 accumulator: 4e-4).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test_util.h"

TEST(adamw_update) {
    const int64_t n = 1037;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-6f, wd = 0.1f, gs = 0.5f;
    float *p = test_alloc(n * 4), *m = test_alloc(n * 4), *v = test_alloc(n * 4), *g = test_alloc(n * 4);
    float *p_same = test_alloc(n * 4), *m_same = test_alloc(n * 4), *v_same = test_alloc(n * 4);
    float *p_null = test_alloc(n * 4), *m_null = test_alloc(n * 4), *v_null = test_alloc(n * 4);
    float *compute = test_alloc(n * 4), *p_before = test_alloc(n * 4);
    double *rp = test_alloc(n * 8), *rm = test_alloc(n * 8), *rv = test_alloc(n * 8), *rdelta = test_alloc(n * 8);
    float *delta = test_alloc(n * 4);
    test_fill_normal(p, n, 0.05); /* of the size of initialised weights (N(0, 0.02) in the model) */
    memcpy(p_same, p, (size_t)n * 4);
    memcpy(p_null, p, (size_t)n * 4);
    test_to_double(rp, p, n);
    for (int64_t i = 0; i < n; i++) compute[i] = NAN;

    for (int step = 1; step <= 3; step++) {
        for (int64_t i = 0; i < n; i++) g[i] = (float)(test_normal() * pow(10.0, -4.0 * test_uniform()));
        memcpy(p_before, p, (size_t)n * 4);
        cpu_adamw_update(p, m, v, compute, g, n, lr, b1, b2, eps, wd, gs, step);
        cpu_adamw_update(p_same, m_same, v_same, p_same, g, n, lr, b1, b2, eps, wd, gs, step);
        cpu_adamw_update(p_null, m_null, v_null, NULL, g, n, lr, b1, b2, eps, wd, gs, step);

        /* the float64 reference, carried in double across the steps */
        const double bc1 = 1.0 - pow((double)b1, step), bc2 = 1.0 - pow((double)b2, step);
        for (int64_t i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            rm[i] = b1 * rm[i] + (1.0 - b1) * gi;
            rv[i] = b2 * rv[i] + (1.0 - b2) * gi * gi;
            rp[i] -= lr * ((rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps) + wd * rp[i]);
            delta[i] = p[i] - p_before[i];
        }
        char what[120];
        snprintf(what, sizeof what, "adamw step %d p", step);
        test_check_rel(what, p, rp, n, 1e-6);
        snprintf(what, sizeof what, "adamw step %d m", step);
        test_check_rel(what, m, rm, n, 1e-6);
        snprintf(what, sizeof what, "adamw step %d v", step);
        test_check_rel(what, v, rv, n, 1e-6);
        /* the update this step, against the reference update from the kernel's own p_before */
        for (int64_t i = 0; i < n; i++)
            rdelta[i] = -lr * ((rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps) + wd * (double)p_before[i]);
        snprintf(what, sizeof what, "adamw step %d update p - p_before", step);
        test_check_rel(what, delta, rdelta, n, 2e-6);

        EXPECT(!memcmp(compute, p, (size_t)n * 4), "step %d: compute is not a copy of the updated param", step);
        EXPECT(!memcmp(p_same, p, (size_t)n * 4) && !memcmp(m_same, m, (size_t)n * 4),
               "step %d: compute == param changes the result", step);
        EXPECT(!memcmp(p_null, p, (size_t)n * 4) && !memcmp(v_null, v, (size_t)n * 4),
               "step %d: compute == NULL changes the result", step);
        printf("adamw step %d: compute copy exact, compute == param and NULL bitwise equal ok\n", step);
    }
}

TEST(sum_squares) {
    static const int64_t ns[] = {0, 1, 1000003};
    for (int k = 0; k < 3; k++) {
        const int64_t n = ns[k];
        float *x = test_alloc(n * 4);
        test_fill_normal(x, n, 1e-3);
        long double want = 0;
        float f32 = 0;
        for (int64_t i = 0; i < n; i++) {
            want += (long double)x[i] * x[i];
            f32 += x[i] * x[i];
        }
        double got = cpu_sum_squares(x, n), again = cpu_sum_squares(x, n);
        double e = n ? fabs((double)((got - want) / want)) : fabs(got);
        EXPECT(e <= 1e-12, "sum_squares n=%lld: rel err %.3e > 1e-12", (long long)n, e);
        EXPECT(memcmp(&got, &again, sizeof got) == 0, "sum_squares n=%lld: two calls differ", (long long)n);
        printf("sum_squares n=%lld: rel err %.3e <= 1e-12, deterministic ok\n", (long long)n, e);
        if (n > 1000) {
            double e32 = fabs((double)((f32 - want) / want));
            EXPECT(e32 > 1e-12 * 100, "an fp32 accumulator would pass (rel err %.3e)", e32);
            printf("sum_squares n=%lld with an fp32 accumulator: rel err %.3e (the test catches it) ok\n",
                   (long long)n, e32);
        }
    }
}
