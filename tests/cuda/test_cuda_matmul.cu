/*
 * test_cuda_matmul.cu — GPU parity of the cuBLASLt dense layer (kernels/cuda/cuda_matmul.cu)
 * against the cpu oracle (kernels/cpu/cpu_matmul.c, OpenBLAS sgemm on the same bf16-rounded
 * values): forward (= and += into the bf16 output: the fused residual add), backward dinp (= and
 * +=, and skipped with NULL) and dW (fp32 +=); the forward with the residual from another buffer
 * (matmul_forward_residual: cuBLASLt's C is not its D, each with its own stride and alignment).
 *
 * Shapes: T from 1 to 333, odd IC/OC, strided column blocks (ldi, ldo wider than the block),
 * blocks that start mid-vector (pad 3: 2-byte aligned operands, which cuBLASLt must be told) and
 * aligned ones, K up to 1536. Bounds (cuda_test.h): bf16 outputs CT_BOUND_BF16_OUT (fp32
 * accumulation on both sides, output rounding only), dW CT_BOUND_F32 (fp32 C, order only). dW
 * runs twice and must be bitwise equal. cuda_gemm_choice_bits: the algorithm a plan chooses gives
 * the bits of cuBLASLt's first choice.
 */
#include <stdio.h>

#include "cpu_kernels.h"
#include "cuda_gemm.h"
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
        float *dw[3];
        CtMat di2 = ct_mat_clone(&di);
        for (int run = 0; run < 3; run++) { /* both, dw only (dinp NULL), dinp only (dw NULL: dW untouched) */
            bf16 *d_di = ct_mat_up(run == 2 ? &di2 : &di);
            float *d_dw = ct_up_f32(dw0, (int64_t)s.OC * s.IC);
            cuda_matmul_backward(run == 1 ? NULL : d_di, run == 2 ? NULL : d_dw, d_g, run == 2 ? NULL : d_x, d_w, s.T,
                                 s.IC, s.OC, ldi, ldo, s.accumulate);
            if (run == 0) ct_mat_down(&di, d_di);
            if (run == 2) ct_mat_down(&di2, d_di);
            dw[run] = ct_host((int64_t)s.OC * s.IC);
            ct_down_f32(dw[run], d_dw, (int64_t)s.OC * s.IC);
        }
        snprintf(what, sizeof what, "matmul bwd dinp alone (dw NULL) [case %zu]", k);
        ct_bitwise_equal(what, ct_mat_dense(&di2), ct_mat_dense(&di), s.T * s.IC);
        snprintf(what, sizeof what, "matmul bwd dW untouched when NULL [case %zu]", k);
        ct_bitwise_equal(what, dw[2], dw0, (int64_t)s.OC * s.IC);
        cpu_matmul_backward(dic.p, dwc, g.p, x.p, w.p, s.T, s.IC, s.OC, ldi, ldo, s.accumulate);
        snprintf(what, sizeof what, "matmul bwd dinp %s [case %zu]", s.accumulate ? "+=" : "=", k);
        test_check_rel_f(what, ct_mat_dense(&di), ct_mat_dense(&dic), s.T * s.IC, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &di);
        snprintf(what, sizeof what, "matmul bwd dW += [case %zu]", k);
        test_check_rel_f(what, dw[0], dwc, (int64_t)s.OC * s.IC, CT_BOUND_F32);
        ct_bitwise_equal(what, dw[0], dw[1], (int64_t)s.OC * s.IC); /* the second run skipped dinp (NULL) */
    }
}

/* out = resid + x W^T with resid in its own buffer (the block's residual add: h = x + out_proj(...),
 * out = h + down(...)); the same random inputs on both sides, bound CT_BOUND_BF16_OUT (fp32 accumulation
 * on both sides, the output's rounding only); resid untouched (bitwise), nothing written outside out's
 * block. Shapes: aligned and mid-vector (pad 3) blocks, resid at a stride different from out's. */
typedef struct {
    int64_t T;
    int     IC, OC, ldi_extra, ldo_extra, ldr_extra, pad_o, pad_r;
} ResidShape;

TEST(cuda_matmul_residual) {
    static const ResidShape shapes[] = {
        {1, 8, 8, 0, 0, 0, 0, 0},
        {7, 37, 13, 3, 5, 0, 3, 0},       /* odd sizes, out mid-vector, resid aligned */
        {130, 256, 512, 0, 0, 8, 0, 3},   /* resid mid-vector at a wider stride */
        {333, 2048, 1536, 0, 0, 0, 0, 0}, /* the 1B config's out_proj: Vd 2048 -> H 1536 */
        {200, 4096, 1536, 0, 8, 40, 8, 8}, /* the MLP's down, strided out and resid */
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const ResidShape s = shapes[k];
        const int ldi = s.IC + s.ldi_extra, ldo = s.OC + s.ldo_extra, ldr = s.OC + s.ldr_extra;
        char what[160];
        printf("-- T %lld IC %d OC %d ldi %d ldo %d ldr %d pad out %d resid %d\n", (long long)s.T, s.IC, s.OC, ldi,
               ldo, ldr, s.pad_o, s.pad_r);
        CtMat x = ct_mat(s.T, s.IC, ldi, 0), w = ct_mat(s.OC, s.IC, s.IC, 0), r = ct_mat(s.T, s.OC, ldr, s.pad_r);
        ct_mat_fill(&x, 1.0);
        ct_mat_fill(&w, 0.05);
        ct_mat_fill(&r, 1.0);
        CtMat y = ct_mat(s.T, s.OC, ldo, s.pad_o);
        CtMat yc = ct_mat_clone(&y), r0 = ct_mat_clone(&r);
        bf16 *d_x = ct_mat_up(&x), *d_w = ct_mat_up(&w), *d_r = ct_mat_up(&r), *d_y = ct_mat_up(&y);
        cuda_matmul_forward_residual(d_y, d_x, d_w, d_r, s.T, s.IC, s.OC, ldi, ldo, ldr);
        ct_mat_down(&y, d_y);
        ct_mat_down(&r, d_r);
        cpu_matmul_forward_residual(yc.p, x.p, w.p, r0.p, s.T, s.IC, s.OC, ldi, ldo, ldr);
        snprintf(what, sizeof what, "matmul fwd residual out [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&y), ct_mat_dense(&yc), s.T * s.OC, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &y);
        snprintf(what, sizeof what, "matmul fwd residual resid unchanged [case %zu]", k);
        ct_bitwise_equal(what, ct_mat_dense(&r), ct_mat_dense(&r0), s.T * s.OC);
    }
}

/* The algorithm a GEMM plan chooses at its first call (kernels/cuda/cuda_matmul.cu: the fastest of cuBLASLt's
 * candidates of the first's summation order, each checked by a hash) gives the heuristic's first choice's bits: the
 * model's shapes (the 1B config at its 8,384-row chunk and odd ones), each form the dense layer calls (forward,
 * forward with the residual from another buffer, backward data), bitwise against the same call with choosing off,
 * at the first (timed) call and the next. Prints whether the forward's plan chose another algorithm than the first. */
typedef struct {
    int64_t M;
    int     N, K, resid;
} ChoiceShape;

TEST(cuda_gemm_choice_bits) {
    static const ChoiceShape shapes[] = {
        {8384, 8192, 1536, 0}, /* the MLP's gate_up forward (cuBLASLt's first is not its fastest on an H200) */
        {8384, 4096, 1536, 0}, /* the MLP's down, backward data */
        {8384, 4608, 1536, 0}, /* attention's in_proj forward */
        {8384, 1536, 2048, 1}, /* out_proj forward with the residual */
        {1000, 8224, 1536, 0}, /* GDN's in_proj, a short chunk */
        {333, 1536, 4096, 1},
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const ChoiceShape s = shapes[k];
        char what[160];
        float *x = ct_host_normal(s.M * s.K, 1.0), *w = ct_host_normal((int64_t)s.N * s.K, 0.05);
        float *r = ct_host_normal(s.M * s.N, 1.0), *ref = ct_host(s.M * s.N), *got = ct_host(s.M * s.N);
        ct_round_bf16(x, s.M * s.K);
        ct_round_bf16(w, (int64_t)s.N * s.K);
        ct_round_bf16(r, s.M * s.N);
        bf16 *d_x = ct_up_bf16(x, s.M * s.K), *d_w = ct_up_bf16(w, (int64_t)s.N * s.K), *d_r = ct_up_bf16(r, s.M * s.N);
        bf16 *d_y = (bf16 *)ct_dev((size_t)s.M * s.N * sizeof(bf16));
        for (int tune = 0; tune <= 1; tune++) {
            cuda_gemm_reset(tune);
            for (int call = 0; call < 1 + tune; call++) {
                if (s.resid) cuda_matmul_forward_residual(d_y, d_x, d_w, d_r, s.M, s.K, s.N, s.K, s.N, s.N);
                else cuda_matmul_forward(d_y, d_x, d_w, s.M, s.K, s.N, s.K, s.N, 0);
                ct_down_bf16(tune ? got : ref, d_y, s.M * s.N);
                if (tune) {
                    snprintf(what, sizeof what, "gemm choice M %lld N %d K %d call %d: the first choice's bits",
                             (long long)s.M, s.N, s.K, call);
                    ct_bitwise_equal(what, got, ref, s.M * s.N);
                }
            }
        }
        printf("-- M %lld N %d K %d%s: the plan chose %s\n", (long long)s.M, s.N, s.K, s.resid ? " (residual)" : "",
               cuda_gemm_reset(1) ? "another algorithm than cuBLASLt's first" : "cuBLASLt's first");
        /* backward data of the same shape (dinp = dout W: M x K from M x N), bitwise across the choice */
        float *dx_ref = ct_host(s.M * s.K), *dx_got = ct_host(s.M * s.K);
        float *dw = ct_host((int64_t)s.N * s.K);
        for (int64_t i = 0; i < (int64_t)s.N * s.K; i++) dw[i] = 0.0f;
        float *d_dw = ct_up_f32(dw, (int64_t)s.N * s.K);
        bf16 *d_dx = (bf16 *)ct_dev((size_t)s.M * s.K * sizeof(bf16));
        for (int tune = 0; tune <= 1; tune++) {
            cuda_gemm_reset(tune);
            cuda_matmul_backward(d_dx, d_dw, d_r, d_x, d_w, s.M, s.K, s.N, s.K, s.N, 0);
            ct_down_bf16(tune ? dx_got : dx_ref, d_dx, s.M * s.K);
        }
        snprintf(what, sizeof what, "gemm choice backward data M %lld N %d K %d: the first choice's bits",
                 (long long)s.M, s.N, s.K);
        ct_bitwise_equal(what, dx_got, dx_ref, s.M * s.K);
    }
    cuda_gemm_reset(1);
}
