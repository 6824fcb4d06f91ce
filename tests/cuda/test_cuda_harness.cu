/*
 * test_cuda_harness.cu — the GPU harness must be able to fail. Three deliberately wrong results
 * are put through the same comparisons the parity cases use, and each must be caught:
 *   - a wrong kernel result (the cuda RMSNorm run with eps 1e-1 against the cpu's 1e-6, on inputs
 *     whose mean square is ~1e-2): the relative L2 error exceeds CT_BOUND_BF16_OUT;
 *   - an unwritten output (SwiGLU run on one row fewer than compared): the poison (NaN) makes the
 *     error infinite, which no bound passes;
 *   - a write outside the block (copy_2d of one column more than the block): the poisoned margin
 *     is no longer NaN.
 * The checks here call the non-recording measures (test_rel_err_f, a margin scan) and EXPECT
 * that they flag the result; the real cases record such results as failures.
 */
#include <math.h>
#include <stdio.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

TEST(cuda_harness_can_fail) {
    ct_begin();
    /* 1. a wrong kernel result */
    const int64_t T = 33;
    const int D = 64;
    CtMat x = ct_mat(T, D, D, 0);
    ct_mat_fill(&x, 0.1);
    float *w = ct_host_normal(D, 0.5);
    ct_round_bf16(w, D);
    CtMat y = ct_mat(T, D, D, 0), yc = ct_mat(T, D, D, 0);
    bf16 *d_y = ct_mat_up(&y);
    cuda_rmsnorm_forward(d_y, (float *)ct_dev(T * 4), ct_mat_up(&x), ct_up_bf16(w, D), T, 1, D, D, D, 1e-1f, 1);
    ct_mat_down(&y, d_y);
    cpu_rmsnorm_forward(yc.p, ct_host(T), x.p, w, T, 1, D, D, D, 1e-6f, 1);
    double e = test_rel_err_f(ct_mat_dense(&y), ct_mat_dense(&yc), T * D);
    printf("wrong eps: rel err %.3e must exceed %.1e\n", e, CT_BOUND_BF16_OUT);
    EXPECT(e > CT_BOUND_BF16_OUT, "a wrong RMSNorm (eps 1e-1 vs 1e-6) passed: rel err %.3e", e);

    /* 2. an unwritten row */
    const int I = 40;
    CtMat gu = ct_mat(T, 2 * I, 2 * I, 0), o = ct_mat(T, I, I, 0), oc = ct_mat(T, I, I, 0);
    ct_mat_fill(&gu, 1.0);
    bf16 *d_o = ct_mat_up(&o);
    cuda_swiglu_forward(d_o, ct_mat_up(&gu), T - 1, I);
    ct_mat_down(&o, d_o);
    cpu_swiglu_forward(oc.p, gu.p, T, I);
    e = test_rel_err_f(ct_mat_dense(&o), ct_mat_dense(&oc), T * I);
    printf("one row left unwritten: rel err %g must be inf\n", e);
    EXPECT(isinf(e), "an unwritten (poisoned) row passed: rel err %g", e);

    /* 3. a write outside the block */
    CtMat src = ct_mat(9, 14, 14, 0), dst = ct_mat(9, 13, 20, 3);
    ct_mat_fill(&src, 1.0);
    bf16 *d_dst = ct_mat_up(&dst);
    cuda_copy_2d(d_dst, ct_mat_up(&src), 9, 14, 20, 14);
    ct_mat_down(&dst, d_dst);
    int outside = 0;
    for (int64_t i = 0; i < dst.total; i++) {
        int64_t rel = i - dst.pad;
        int inside = rel >= 0 && rel / dst.ld < dst.T && rel % dst.ld < dst.cols;
        outside += !inside && !isnan(dst.base[i]);
    }
    printf("copy of one column too many: %d margin elements written, must be > 0\n", outside);
    EXPECT(outside > 0, "a write outside the block went unseen");
}
