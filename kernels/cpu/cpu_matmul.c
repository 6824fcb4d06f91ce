/*
 * cpu_matmul.c — the cpu backend's dense layer y = x W^T (W is (OC, IC) row-major, the PyTorch
 * nn.Linear layout), forward and backward, through OpenBLAS's cblas_sgemm. Every projection of
 * the model (q/k/v/z/b/a, gate/up/down, o_proj, out_proj) goes through these two entries; the
 * lm_head does not (it is fused with the loss in cpu_loss.c).
 *
 * Implements the Backend entries of the same names (lib/backend/backend.h); reached through backend_cpu
 * by the model code and called directly by tests/unit/test_matmul.c.
 *
 * The ld arguments go straight to the GEMM as its leading dimensions, so a call reads or writes a
 * column block of a wider matrix. With beta = 0 BLAS does not read C, so a written (=) output
 * may hold anything (NaN) before the call. The thread count is OpenBLAS's, fixed once by the
 * trainer; OpenBLAS splits a GEMM over M and N, never over the summed K, so results do not
 * depend on it run to run. CBLAS takes 32-bit sizes: T must fit in an int (the 64-bit products
 * T * ld are formed inside OpenBLAS, which indexes with 64-bit BLASLONG).
 */
#include <cblas.h>
#undef I /* complex.h's imaginary unit, pulled in by cblas.h; I is the MLP width in cpu_kernels.h */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "core/error.h"

static void matmul_check_sizes(int64_t T, int IC, int OC, int ldi, int ldo) {
    RS_CHECK(T >= 0 && T <= INT_MAX, "T = %lld does not fit a CBLAS int", (long long)T);
    RS_CHECK(IC > 0 && OC > 0, "IC %d OC %d", IC, OC);
    RS_CHECK(ldi >= IC && ldo >= OC, "ldi %d < IC %d or ldo %d < OC %d", ldi, IC, ldo, OC);
}

/* out (=, or += when accumulate) = inp @ w^T */
void cpu_matmul_forward(void *out /* (T,ldo) OC columns */, const void *inp /* (T,ldi) IC columns */,
                        const void *w /* (OC,IC) */, int64_t T, int IC, int OC, int ldi, int ldo, int accumulate) {
    matmul_check_sizes(T, IC, OC, ldi, ldo);
    if (T == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, OC, IC, 1.0f, (const float *)inp, ldi,
                (const float *)w, IC, accumulate ? 1.0f : 0.0f, (float *)out, ldo);
}

/* out = resid + inp @ w^T: resid's rows copied into out, then the GEMM adds (beta 1), bitwise the copy and
 * accumulate the model made before */
void cpu_matmul_forward_residual(void *out /* (T,ldo) */, const void *inp /* (T,ldi) */, const void *w /* (OC,IC) */,
                                 const void *resid /* (T,ldr) */, int64_t T, int IC, int OC, int ldi, int ldo,
                                 int ldr) {
    matmul_check_sizes(T, IC, OC, ldi, ldo);
    RS_CHECK(resid != NULL && ldr >= OC, "matmul_forward_residual: ldr %d < OC %d", ldr, OC);
    for (int64_t t = 0; t < T; t++)
        memcpy((float *)out + t * ldo, (const float *)resid + t * ldr, (size_t)OC * sizeof(float));
    cpu_matmul_forward(out, inp, w, T, IC, OC, ldi, ldo, 1);
}

/* dinp (= or += when accumulate_dinp; skipped when NULL) = dout @ w;  dw += dout^T @ inp (skipped when NULL) */
void cpu_matmul_backward(void *dinp /* (T,ldi) IC columns, or NULL */, float *dw /* (OC,IC) += or NULL */,
                         const void *dout /* (T,ldo) OC columns */, const void *inp /* (T,ldi) */,
                         const void *w /* (OC,IC) */, int64_t T, int IC, int OC, int ldi, int ldo,
                         int accumulate_dinp) {
    matmul_check_sizes(T, IC, OC, ldi, ldo);
    RS_CHECK(dinp || dw, "both dinp and dw are NULL: nothing to compute");
    if (T == 0) return;
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, IC, OC, 1.0f, (const float *)dout, ldo,
                    (const float *)w, IC, accumulate_dinp ? 1.0f : 0.0f, (float *)dinp, ldi);
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, (int)T, 1.0f, (const float *)dout, ldo,
                    (const float *)inp, ldi, 1.0f, dw, IC);
}
