/*
 * test_util.h — the small driver under the per-op tests (tests/unit).
 *
 * pytest (tests/test_ops.py) is the test framework: it asks `build/test_ops
 * --list` for the case names and runs `build/test_ops NAME` for each, so every
 * case is its own pytest test. This header gives the cases what they share:
 *   TEST(name) { ... }        defines and registers a case (no central list)
 *   EXPECT(cond, fmt, ...)    records a failure with file:line and goes on
 *   test_check_rel(...)       relative L2 error of an fp32 result against a
 *                             float64 reference, printed with its bound
 *   test_rng_*, test_fill_*   a seeded generator; fills never produce zeros
 *   test_fd_*                 central finite differences in float64
 * Every check prints one line ("name: rel err 3.1e-07 <= 1e-05 ok"), so the
 * pytest log shows the margins, not only pass/fail.
 */
#ifndef RS_TEST_UTIL_H
#define RS_TEST_UTIL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*TestFn)(void);
void test_register(const char *name, TestFn fn);

#define TEST(name)                                                                    \
    static void test_case_##name(void);                                               \
    __attribute__((constructor)) static void test_register_##name(void) {             \
        test_register(#name, test_case_##name);                                       \
    }                                                                                 \
    static void test_case_##name(void)

void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define EXPECT(cond, ...)                                               \
    do {                                                                \
        if (!(cond)) test_fail(__FILE__, __LINE__, __VA_ARGS__);        \
    } while (0)

/* ---- random inputs (xorshift64*, fixed seed per case) ---- */
void   test_rng_seed(uint64_t seed);
double test_uniform(void);                 /* (0, 1) */
double test_normal(void);                  /* N(0, 1) */
/* x[i] = scale * N(0,1), redrawn until |x| > 1e-3 * scale: never zero */
void   test_fill_normal(float *x, int64_t n, double scale);
void   test_fill_uniform(float *x, int64_t n, double lo, double hi); /* never exactly 0 */
void   test_to_double(double *dst, const float *src, int64_t n);
void   test_to_float(float *dst, const double *src, int64_t n);

/* ---- comparisons ---- */
/* ||got - want||_2 / ||want||_2 (want all zero: ||got - want||_2) */
double test_rel_err(const float *got, const double *want, int64_t n);
double test_rel_err_f(const float *got, const float *want, int64_t n);
/* prints "what: rel err E <= bound ok" or records a failure; returns 1 when within */
int    test_check_rel(const char *what, const float *got, const double *want, int64_t n, double bound);
int    test_check_rel_f(const char *what, const float *got, const float *want, int64_t n, double bound);
/* a NaN/Inf anywhere is a failure of its own */
int    test_check_finite(const char *what, const float *x, int64_t n);

/* ---- finite differences in float64 ----
 * f(ctx, x) returns a scalar (typically sum(out * R) of a float64 reference
 * forward); grad[i] = (f(x + h e_i) - f(x - h e_i)) / 2h for each i in idx
 * (all n when idx is NULL). x is restored. */
typedef double (*TestScalarFn)(void *ctx, double *x);
void   test_fd_grad(double *grad, TestScalarFn f, void *ctx, double *x, int64_t n, const int64_t *idx,
                    int64_t n_idx, double h);

/* ---- scratch ---- */
void *test_alloc(int64_t bytes); /* zeroed; freed at exit of the case */
void  test_free_all(void);

#ifdef __cplusplus
}
#endif

#endif
