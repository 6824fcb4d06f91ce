/*
 * test_cuda_matmul.cu — GPU parity of the cuBLASLt dense layer (kernels/cuda/cuda_matmul.cu)
 * against the cpu oracle (kernels/cpu/cpu_matmul.c, OpenBLAS sgemm on the same bf16-rounded
 * values): forward (= and += into the bf16 output: the fused residual add), backward dinp (= and
 * +=, and skipped with NULL) and dW (fp32 +=).
 *
 * Shapes: T from 1 to 333, odd IC/OC, strided column blocks (ldi, ldo wider than the block),
 * blocks that start mid-vector (pad 3: 2-byte aligned operands, which cuBLASLt must be told) and
 * aligned ones, K up to 1536. Bounds (cuda_test.h): bf16 outputs CT_BOUND_BF16_OUT (fp32
 * accumulation on both sides, output rounding only), dW CT_BOUND_F32 (fp32 C, order only). dW
 * runs twice and must be bitwise equal.
 */
#include <stdio.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

typedef struct {
    int64_t T;
    int     IC, OC, ldi_extra, ldo_extra, pad, accumulate;
} MatmulShape;

TEST(cuda_matmul) {
    static const MatmulShape shapes[] = {
        {1, 8, 8, 0, 0, 0, 0},
        {7, 37, 13, 3, 5, 3, 1},      /* odd sizes and strides, mid-vector: 2-byte alignment */
        {130, 256, 512, 0, 0, 0, 1},  /* aligned, accumulate (residual add) */
        {333, 64, 96, 64, 32, 0, 0},  /* column blocks of wider rows */
        {200, 1536, 384, 0, 8, 8, 1}, /* K = 1536 */
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const MatmulShape s = shapes[k];
        const int ldi = s.IC + s.ldi_extra, ldo = s.OC + s.ldo_extra;
        char what[160];
        printf("-- T %lld IC %d OC %d ldi %d ldo %d pad %d accumulate %d\n", (long long)s.T, s.IC, s.OC, ldi, ldo,
               s.pad, s.accumulate);
        CtMat x = ct_mat(s.T, s.IC, ldi, s.pad), w = ct_mat(s.OC, s.IC, s.IC, 0);
        ct_mat_fill(&x, 1.0);
        ct_mat_fill(&w, 0.1);
        bf16 *d_x = ct_mat_up(&x), *d_w = ct_mat_up(&w);

        /* forward */
        CtMat y = ct_mat(s.T, s.OC, ldo, s.pad);
        if (s.accumulate) ct_mat_fill(&y, 1.0);
        CtMat yc = ct_mat_clone(&y);
        bf16 *d_y = ct_mat_up(&y);
        cuda_matmul_forward(d_y, d_x, d_w, s.T, s.IC, s.OC, ldi, ldo, s.accumulate);
        ct_mat_down(&y, d_y);
        cpu_matmul_forward(yc.p, x.p, w.p, s.T, s.IC, s.OC, ldi, ldo, s.accumulate);
        snprintf(what, sizeof what, "matmul fwd out %s [case %zu]", s.accumulate ? "+=" : "=", k);
        test_check_rel_f(what, ct_mat_dense(&y), ct_mat_dense(&yc), s.T * s.OC, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &y);

        /* backward */
        CtMat g = ct_mat(s.T, s.OC, ldo, s.pad);
        ct_mat_fill(&g, 1.0);
        bf16 *d_g = ct_mat_up(&g);
        CtMat di = ct_mat(s.T, s.IC, ldi, s.pad);
        if (s.accumulate) ct_mat_fill(&di, 1.0);
        CtMat dic = ct_mat_clone(&di);
        float *dw0 = ct_host_normal((int64_t)s.OC * s.IC, 0.1), *dwc = ct_clone(dw0, (int64_t)s.OC * s.IC);
        float *dw[2];
        for (int run = 0; run < 2; run++) {
            bf16 *d_di = ct_mat_up(&di);
            float *d_dw = ct_up_f32(dw0, (int64_t)s.OC * s.IC);
            cuda_matmul_backward(run == 0 ? d_di : NULL, d_dw, d_g, d_x, d_w, s.T, s.IC, s.OC, ldi, ldo, s.accumulate);
            if (run == 0) ct_mat_down(&di, d_di);
            dw[run] = ct_host((int64_t)s.OC * s.IC);
            ct_down_f32(dw[run], d_dw, (int64_t)s.OC * s.IC);
        }
        cpu_matmul_backward(dic.p, dwc, g.p, x.p, w.p, s.T, s.IC, s.OC, ldi, ldo, s.accumulate);
        snprintf(what, sizeof what, "matmul bwd dinp %s [case %zu]", s.accumulate ? "+=" : "=", k);
        test_check_rel_f(what, ct_mat_dense(&di), ct_mat_dense(&dic), s.T * s.IC, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &di);
        snprintf(what, sizeof what, "matmul bwd dW += [case %zu]", k);
        test_check_rel_f(what, dw[0], dwc, (int64_t)s.OC * s.IC, CT_BOUND_F32);
        ct_bitwise_equal(what, dw[0], dw[1], (int64_t)s.OC * s.IC); /* the second run skipped dinp (NULL) */
    }
}
