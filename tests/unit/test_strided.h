/*
 * test_strided.h — helpers the dense-kernel tests share (test_norm.c, test_matmul.c,
 * test_elementwise.c, test_rope.c, test_loss.c):
 *   TestStrided        a (T, cols) block inside rows of ld floats, with STRIDED_PAD poisoned
 *                      floats before the first row and a poisoned row after the last, so the
 *                      block starts mid-row like q inside [q|k|v|z|b|a]. Everything outside the
 *                      block is NaN: a kernel that reads outside its columns produces NaN (caught
 *                      by test_check_rel), one that writes outside them is caught by
 *                      test_strided_intact.
 *   test_fd_rows       finite differences of a row-local scalar function, one row at a time (the
 *                      reference is evaluated on that row only, so a full-tensor gradient costs
 *                      O(T * row^2), not O((T * row)^2)).
 * Everything is static inline (header-only) so each test file stays self-contained.
 */
#ifndef RS_TEST_STRIDED_H
#define RS_TEST_STRIDED_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "test_util.h"

#define STRIDED_PAD 3

typedef struct {
    float  *base;  /* the whole allocation */
    float  *p;     /* what the kernel gets: row t, column c at p[t*ld + c] */
    int64_t T;
    int     cols, ld;
    int64_t total; /* floats in base */
} TestStrided;

static inline TestStrided test_strided_new(int64_t T, int cols, int ld) {
    TestStrided s = {0};
    s.T = T;
    s.cols = cols;
    s.ld = ld;
    s.total = STRIDED_PAD + (T + 1) * (int64_t)ld;
    s.base = test_alloc(s.total * (int64_t)sizeof(float));
    for (int64_t i = 0; i < s.total; i++) s.base[i] = NAN;
    s.p = s.base + STRIDED_PAD;
    return s;
}

static inline void test_strided_fill_normal(TestStrided *s, double scale) {
    for (int64_t t = 0; t < s->T; t++) test_fill_normal(s->p + t * s->ld, s->cols, scale);
}

/* the block, gathered into a dense (T, cols) array */
static inline void test_strided_get(double *dst, const TestStrided *s) {
    for (int64_t t = 0; t < s->T; t++)
        for (int c = 0; c < s->cols; c++) dst[t * s->cols + c] = s->p[t * s->ld + c];
}
static inline void test_strided_getf(float *dst, const TestStrided *s) {
    for (int64_t t = 0; t < s->T; t++)
        for (int c = 0; c < s->cols; c++) dst[t * s->cols + c] = s->p[t * s->ld + c];
}
static inline void test_strided_setf(TestStrided *s, const float *src) {
    for (int64_t t = 0; t < s->T; t++)
        for (int c = 0; c < s->cols; c++) s->p[t * s->ld + c] = src[t * s->cols + c];
}

/* every float outside the block is still NaN */
static inline int test_strided_intact(const char *what, const TestStrided *s) {
    for (int64_t i = 0; i < s->total; i++) {
        int64_t rel = i - STRIDED_PAD;
        int inside = rel >= 0 && rel / s->ld < s->T && rel % s->ld < s->cols;
        if (!inside && !isnan(s->base[i])) {
            test_fail(__FILE__, __LINE__, "%s: wrote outside its columns (row %lld col %lld)", what,
                      (long long)(rel >= 0 ? rel / s->ld : -1), (long long)(rel >= 0 ? rel % s->ld : rel));
            return 0;
        }
    }
    printf("%s: margins untouched ok\n", what);
    return 1;
}

/* ---- row-at-a-time finite differences ----
 * A context for test_fd_rows starts with a TestRowRange; the scalar function sums its reference
 * only over rows [t0, t1). x is (T, W) dense; grad gets dL/dx for every element. */
typedef struct {
    int64_t t0, t1;
} TestRowRange;

static inline void test_fd_rows(double *grad /* (T,W) */, TestScalarFn f, void *ctx, double *x /* (T,W) */,
                                int64_t T, int64_t W, double h) {
    TestRowRange *rr = ctx;
    int64_t *idx = test_alloc(W * (int64_t)sizeof(int64_t));
    for (int64_t t = 0; t < T; t++) {
        rr->t0 = t;
        rr->t1 = t + 1;
        for (int64_t j = 0; j < W; j++) idx[j] = t * W + j;
        test_fd_grad(grad + t * W, f, ctx, x, T * W, idx, W, h);
    }
    rr->t0 = 0;
    rr->t1 = T;
}

#endif
