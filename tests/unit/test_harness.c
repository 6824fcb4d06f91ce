/*
 * test_harness.c — checks of the test driver itself, so that a broken
 * comparison cannot make every kernel test pass: a wrong result must fail,
 * and the finite-difference helper must match a known derivative.
 */
#include <math.h>
#include <stdio.h>

#include "test_util.h"

static double harness_cube(void *ctx, double *x) {
    (void)ctx;
    return x[0] * x[0] * x[0] + 2 * x[1];
}

TEST(harness_checks_can_fail) {
    float got[3] = {1, 2, 3};
    double want[3] = {1, 2, 3.1};
    double e = test_rel_err(got, want, 3);
    EXPECT(e > 0.02 && e < 0.03, "rel err of a wrong vector is %g", e);
    EXPECT(test_rel_err(got, (double[]){1, 2, 3}, 3) == 0, "identical vectors differ");
    float nan_vec[1] = {NAN};
    EXPECT(test_rel_err(nan_vec, (double[]){1}, 1) == INFINITY, "NaN must never pass");
    double x[2] = {1.5, -0.3}, g[2];
    test_fd_grad(g, harness_cube, NULL, x, 2, NULL, 0, 1e-5);
    EXPECT(fabs(g[0] - 3 * 1.5 * 1.5) < 1e-8 && fabs(g[1] - 2) < 1e-8, "fd grad %g %g", g[0], g[1]);
    float r[1000];
    test_fill_normal(r, 1000, 1.0);
    for (int i = 0; i < 1000; i++) EXPECT(r[i] != 0.0f, "test_fill_normal produced a zero");
    printf("harness: ok\n");
}
