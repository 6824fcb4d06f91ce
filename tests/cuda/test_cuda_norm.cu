/*
 * test_cuda_norm.cu — GPU parity of kernels/cuda/cuda_rmsnorm.cu and cuda_norm.cu against the cpu oracle
 * (kernels/cpu/cpu_norm.c): RMSNorm (zero-centred and plain, one row per token and several heads
 * inside wider rows), the L2 norm and the gated RMSNorm, forward and backward (the GDN split after the conv
 * is fused with it: test_cuda_conv.cu).
 *
 * Shapes: T = 1 .. 333 (never a multiple of the 8 rows of a block), odd widths, row strides wider
 * than the block, blocks that start mid-vector (pad 3: the scalar path) and aligned ones (the
 * 16-byte path), a row of 13000 (parameter-gradient slices past the default 48 KiB of shared
 * memory); and the RMSNorm calls of the 1B config's step (rms_step_shapes). Bounds (cuda_test.h):
 * bf16 outputs CT_BOUND_BF16_OUT, fp32 statistics and parameter gradients CT_BOUND_F32; `+=` outputs
 * start from the same random values on both sides; every write outside a block is caught
 * (ct_mat_intact); parameter gradients are run twice and must be bitwise equal.
 */
#include <stdio.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

typedef struct {
    int64_t T;
    int     nh, D, ldi_extra, ldo_extra, pad, zc;
    float   eps;
} NormShape;

static const NormShape norm_shapes[] = {
    {1, 1, 37, 0, 0, 3, 1, 1e-6f},     /* one token, odd width: scalar path */
    {7, 3, 16, 5, 2, 3, 1, 1e-6f},     /* q_norm-like: 3 heads inside a wider row, mid-vector */
    {130, 1, 256, 0, 8, 0, 1, 1e-6f},  /* a layer norm, output inside a wider row, 16-byte path */
    {333, 4, 64, 64, 0, 8, 0, 1e-6f},  /* plain w, heads in a projection row, 16-byte path */
    {50, 1, 1536, 0, 0, 0, 1, 1e-6f},  /* the 1B config's hidden size */
    {9, 2, 1000, 3, 5, 3, 1, 1e-2f},   /* wide odd rows, large eps */
    {3, 1, 13000, 0, 0, 0, 1, 1e-6f},  /* dw slices beyond 48 KiB of shared memory */
};

/* RMSNorm only: the step's calls (the 1B config: hidden 1536, attention q_norm 16 heads and k_norm 2 heads of
 * 128 inside the [q|gate|k|v] projection row of 4608) at odd row counts, the conv halo's 3 rows, and the
 * group forward's vectors a lane (1, 3, 8) */
static const NormShape rms_step_shapes[] = {
    {4133, 1, 1536, 0, 0, 0, 1, 1e-6f},      /* ln1 / ln2 of a row chunk: 256 blocks of partials */
    {3, 1, 1536, 0, 0, 0, 1, 1e-6f},         /* the conv halo's gradient rows */
    {1029, 16, 128, 2560, 0, 0, 1, 1e-6f},   /* q_norm: ldi 4608, ldo 2048 */
    {1029, 2, 128, 4352, 256, 0, 1, 1e-6f},  /* k_norm: ldi 4608, ldo 512 ([k|v] rows) */
    {77, 3, 768, 8, 16, 0, 0, 1e-6f},        /* 3 vectors a lane, plain w */
    {500, 1, 2048, 0, 0, 0, 1, 1e-6f},       /* 8 vectors a lane; the backward's loop kernel (D > 1536) */
    {41, 5, 64, 0, 8, 8, 1, 1e-6f},          /* groups of 8 lanes, mid-row start on the 16-byte path */
};

TEST(cuda_rmsnorm) {
    ct_begin();
    const size_t n1 = sizeof norm_shapes / sizeof norm_shapes[0];
    for (size_t k = 0; k < n1 + sizeof rms_step_shapes / sizeof rms_step_shapes[0]; k++) {
        const NormShape s = k < n1 ? norm_shapes[k] : rms_step_shapes[k - n1];
        const int W = s.nh * s.D, ldi = W + s.ldi_extra, ldo = W + s.ldo_extra;
        const int64_t R = s.T * s.nh;
        char what[160];
        printf("-- T %lld nh %d D %d ldi %d ldo %d pad %d %s eps %g\n", (long long)s.T, s.nh, s.D, ldi, ldo, s.pad,
               s.zc ? "zero-centred" : "plain", (double)s.eps);
        CtMat x = ct_mat(s.T, W, ldi, s.pad);
        ct_mat_fill(&x, 1.0);
        float *w = ct_host_normal(s.D, 0.5);
        ct_round_bf16(w, s.D);
        bf16 *d_x = ct_mat_up(&x), *d_w = ct_up_bf16(w, s.D);

        /* forward */
        CtMat y = ct_mat(s.T, W, ldo, s.pad), yc = ct_mat(s.T, W, ldo, s.pad);
        bf16 *d_y = ct_mat_up(&y);
        float *d_rstd = (float *)ct_dev((size_t)R * 4);
        cuda_rmsnorm_forward(d_y, d_rstd, d_x, d_w, s.T, s.nh, s.D, ldi, ldo, s.eps, s.zc);
        ct_mat_down(&y, d_y);
        float *rstd = ct_host(R), *rstd_c = ct_host_nan(R);
        ct_down_f32(rstd, d_rstd, R);
        cpu_rmsnorm_forward(yc.p, rstd_c, x.p, w, s.T, s.nh, s.D, ldi, ldo, s.eps, s.zc);
        snprintf(what, sizeof what, "rmsnorm fwd out [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&y), ct_mat_dense(&yc), R * s.D, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &y);
        snprintf(what, sizeof what, "rmsnorm fwd rstd [case %zu]", k);
        test_check_rel_f(what, rstd, rstd_c, R, CT_BOUND_F32);

        /* backward: dinp += and dw += from the same random prefill; the cpu's rstd on both sides */
        CtMat g = ct_mat(s.T, W, ldo, s.pad), di = ct_mat(s.T, W, ldi, s.pad);
        ct_mat_fill(&g, 1.0);
        ct_mat_fill(&di, 0.5);
        float *dw0 = ct_host_normal(s.D, 0.1);
        CtMat dic = ct_mat_clone(&di);
        float *dwc = ct_clone(dw0, s.D);
        bf16 *d_g = ct_mat_up(&g);
        float *d_rstd_c = ct_up_f32(rstd_c, R), *dw[2];
        CtMat dis[2] = {ct_mat_clone(&di), ct_mat_clone(&di)};
        for (int run = 0; run < 2; run++) {
            bf16 *d_di = ct_mat_up(&dis[run]);
            float *d_dw = ct_up_f32(dw0, s.D);
            cuda_rmsnorm_backward(d_di, d_dw, d_g, d_x, d_w, d_rstd_c, s.T, s.nh, s.D, ldi, ldo, s.zc);
            ct_mat_down(&dis[run], d_di);
            dw[run] = ct_host(s.D);
            ct_down_f32(dw[run], d_dw, s.D);
        }
        cpu_rmsnorm_backward(dic.p, dwc, g.p, x.p, w, rstd_c, s.T, s.nh, s.D, ldi, ldo, s.zc);
        snprintf(what, sizeof what, "rmsnorm bwd dinp += [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&dis[0]), ct_mat_dense(&dic), R * s.D, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &dis[0]);
        snprintf(what, sizeof what, "rmsnorm bwd dw += [case %zu]", k);
        test_check_rel_f(what, dw[0], dwc, s.D, CT_BOUND_F32);
        ct_bitwise_equal(what, dw[0], dw[1], s.D);
    }
}

TEST(cuda_l2norm) {
    ct_begin();
    for (size_t k = 0; k < sizeof norm_shapes / sizeof norm_shapes[0]; k++) {
        const NormShape s = norm_shapes[k];
        const int W = s.nh * s.D, ldi = W + s.ldi_extra, ldo = W + s.ldo_extra;
        const int64_t R = s.T * s.nh;
        char what[160];
        printf("-- T %lld nh %d D %d ldi %d ldo %d pad %d\n", (long long)s.T, s.nh, s.D, ldi, ldo, s.pad);
        CtMat x = ct_mat(s.T, W, ldi, s.pad);
        ct_mat_fill(&x, k == 1 ? 1e-3 : 1.0); /* case 1: sum(x^2) ~ eps, so the eps placement matters */
        bf16 *d_x = ct_mat_up(&x);
        CtMat y = ct_mat(s.T, W, ldo, s.pad), yc = ct_mat(s.T, W, ldo, s.pad);
        bf16 *d_y = ct_mat_up(&y);
        float *d_rstd = (float *)ct_dev((size_t)R * 4);
        cuda_l2norm_forward(d_y, d_rstd, d_x, s.T, s.nh, s.D, ldi, ldo);
        ct_mat_down(&y, d_y);
        float *rstd = ct_host(R), *rstd_c = ct_host_nan(R);
        ct_down_f32(rstd, d_rstd, R);
        cpu_l2norm_forward(yc.p, rstd_c, x.p, s.T, s.nh, s.D, ldi, ldo);
        snprintf(what, sizeof what, "l2norm fwd out [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&y), ct_mat_dense(&yc), R * s.D, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &y);
        snprintf(what, sizeof what, "l2norm fwd rstd [case %zu]", k);
        test_check_rel_f(what, rstd, rstd_c, R, CT_BOUND_F32);

        /* backward from the cuda forward's output (bf16, the same values on both sides) */
        CtMat g = ct_mat(s.T, W, ldo, s.pad);
        ct_mat_fill(&g, 1.0);
        bf16 *d_g = ct_mat_up(&g);
        CtMat di = ct_mat(s.T, W, ldi, s.pad), dic = ct_mat(s.T, W, ldi, s.pad);
        bf16 *d_di = ct_mat_up(&di);
        float *d_rstd_c = ct_up_f32(rstd_c, R);
        cuda_l2norm_backward(d_di, d_g, d_y, d_rstd_c, s.T, s.nh, s.D, ldi, ldo);
        ct_mat_down(&di, d_di);
        cpu_l2norm_backward(dic.p, g.p, y.p, rstd_c, s.T, s.nh, s.D, ldi, ldo);
        snprintf(what, sizeof what, "l2norm bwd dinp [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&di), ct_mat_dense(&dic), R * s.D, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &di);
        if (ldi == ldo) { /* in place, as the model may call it: dinp == dout */
            bf16 *d_gi = ct_mat_up(&g);
            cuda_l2norm_backward(d_gi, d_gi, d_y, d_rstd_c, s.T, s.nh, s.D, ldi, ldo);
            CtMat gi = ct_mat_clone(&g);
            ct_mat_down(&gi, d_gi);
            snprintf(what, sizeof what, "l2norm bwd in place [case %zu]", k);
            test_check_rel_f(what, ct_mat_dense(&gi), ct_mat_dense(&dic), R * s.D, CT_BOUND_BF16_OUT);
        }
    }
}

typedef struct {
    int64_t T;
    int     nv, dv, ldz_extra, pad;
} GatedShape;

TEST(cuda_gated_rmsnorm) {
    static const GatedShape shapes[] = {
        {1, 1, 37, 0, 0},    /* odd head dim: scalar path */
        {7, 3, 64, 11, 0},   /* z inside a wider row (the GDN projection) at an odd stride */
        {130, 4, 128, 96, 0}, /* the 1B config's value heads, 16-byte path */
        {333, 2, 64, 0, 3},  /* z block mid-vector */
        {4133, 16, 128, 6176, 0}, /* the step: z inside the GDN projection row (ldz 8224), 256 blocks of partials */
        {1029, 16, 128, 0, 0},    /* dense z, an odd row count */
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const GatedShape s = shapes[k];
        const int W = s.nv * s.dv, ldz = W + s.ldz_extra;
        const int64_t R = s.T * s.nv;
        const float eps = 1e-6f;
        char what[160];
        printf("-- T %lld nv %d dv %d ldz %d pad(z) %d\n", (long long)s.T, s.nv, s.dv, ldz, s.pad);
        CtMat x = ct_mat(s.T, W, W, 0), z = ct_mat(s.T, W, ldz, s.pad);
        ct_mat_fill(&x, 1.0);
        ct_mat_fill(&z, 2.0);
        float *w = ct_host_normal(s.dv, 1.0);
        ct_round_bf16(w, s.dv);
        bf16 *d_x = ct_mat_up(&x), *d_z = ct_mat_up(&z), *d_w = ct_up_bf16(w, s.dv);
        CtMat y = ct_mat(s.T, W, W, 0), yc = ct_mat(s.T, W, W, 0);
        bf16 *d_y = ct_mat_up(&y);
        float *d_rstd = (float *)ct_dev((size_t)R * 4), *rstd = ct_host(R), *rstd_c = ct_host_nan(R);
        cuda_gated_rmsnorm_forward(d_y, d_rstd, d_x, d_z, d_w, s.T, s.nv, s.dv, ldz, eps);
        ct_mat_down(&y, d_y);
        ct_down_f32(rstd, d_rstd, R);
        cpu_gated_rmsnorm_forward(yc.p, rstd_c, x.p, z.p, w, s.T, s.nv, s.dv, ldz, eps);
        snprintf(what, sizeof what, "gated_rmsnorm fwd out [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&y), ct_mat_dense(&yc), R * s.dv, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &y);
        snprintf(what, sizeof what, "gated_rmsnorm fwd rstd [case %zu]", k);
        test_check_rel_f(what, rstd, rstd_c, R, CT_BOUND_F32);

        CtMat g = ct_mat(s.T, W, W, 0);
        ct_mat_fill(&g, 1.0);
        float *dw0 = ct_host_normal(s.dv, 0.1), *dwc = ct_clone(dw0, s.dv), *dw[2];
        bf16 *d_g = ct_mat_up(&g);
        float *d_rstd_c = ct_up_f32(rstd_c, R);
        CtMat dx[2] = {ct_mat(s.T, W, W, 0), ct_mat(s.T, W, W, 0)};
        CtMat dz[2] = {ct_mat(s.T, W, ldz, s.pad), ct_mat(s.T, W, ldz, s.pad)};
        for (int run = 0; run < 2; run++) {
            bf16 *d_dx = ct_mat_up(&dx[run]), *d_dz = ct_mat_up(&dz[run]);
            float *d_dw = ct_up_f32(dw0, s.dv);
            cuda_gated_rmsnorm_backward(d_dx, d_dz, d_dw, d_g, d_x, d_z, d_w, d_rstd_c, s.T, s.nv, s.dv, ldz);
            ct_mat_down(&dx[run], d_dx);
            ct_mat_down(&dz[run], d_dz);
            dw[run] = ct_host(s.dv);
            ct_down_f32(dw[run], d_dw, s.dv);
        }
        CtMat dxc = ct_mat(s.T, W, W, 0), dzc = ct_mat(s.T, W, ldz, s.pad);
        cpu_gated_rmsnorm_backward(dxc.p, dzc.p, dwc, g.p, x.p, z.p, w, rstd_c, s.T, s.nv, s.dv, ldz);
        snprintf(what, sizeof what, "gated_rmsnorm bwd dx [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&dx[0]), ct_mat_dense(&dxc), R * s.dv, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &dx[0]);
        snprintf(what, sizeof what, "gated_rmsnorm bwd dz [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&dz[0]), ct_mat_dense(&dzc), R * s.dv, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &dz[0]);
        snprintf(what, sizeof what, "gated_rmsnorm bwd dw += [case %zu]", k);
        test_check_rel_f(what, dw[0], dwc, s.dv, CT_BOUND_F32);
        ct_bitwise_equal(what, dw[0], dw[1], s.dv);
    }
}
