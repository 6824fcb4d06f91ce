/*
 * test_cuda_conv.cu — GPU parity of the causal depthwise conv1d + SiLU (kernels/cuda/cuda_conv.cu)
 * against the cpu oracle (kernels/cpu/cpu_conv.c), forward and backward, with documents (doc_pos
 * resets, including a fragment whose first document started before it and a document start
 * inside the first Kc-1 rows), with and without the halo rows of a previous CP fragment, with
 * dhalo wanted while halo is NULL, Kc from 1 to 16, strided input inside a wider projection row,
 * odd channel counts and mid-vector blocks; the step's shape (6144 channels in rows of 8224, 4133 rows),
 * and rows that take the run kernels' 8-byte vectors but not 16-byte ones. cuda_gdn_conv_split: the GDN conv fused
 * with the split after it (kernels/cuda/cuda_gdn_conv_split.cu), below.
 *
 * Bounds (cuda_test.h): out, dinp, dhalo are bf16 outputs of fp32 math on identical inputs,
 * CT_BOUND_BF16_OUT; dw is fp32, CT_BOUND_F32, starts from the same random values on both sides
 * and runs twice (bitwise equal).
 */
#include <stdio.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

typedef struct {
    int64_t T;
    int     C, Kc, ldi_extra, ldo_extra, pad, halo, dhalo, first_doc_pos;
} ConvShape;

TEST(cuda_conv1d_silu) {
    static const ConvShape shapes[] = {
        {1, 8, 4, 0, 0, 0, 0, 0, 0},
        {7, 37, 4, 3, 5, 3, 1, 1, 9},       /* odd sizes, mid-vector, halo read and its gradient */
        {130, 512, 4, 288, 0, 0, 1, 1, 2},  /* [q|k|v] inside the GDN projection row; a doc starts in row 1 */
        {333, 64, 3, 0, 8, 8, 0, 1, 40},    /* halo NULL but dhalo wanted: the gradient of zero rows */
        {64, 16, 1, 0, 0, 0, 1, 1, 3},      /* Kc = 1: no halo rows at all */
        {50, 24, 16, 8, 0, 0, 1, 1, 100},   /* Kc = 16, the largest */
        /* the run kernels (Kc = 4) at the step's shape: [q|k|v] = 6144 channels inside the 8224-wide GDN
         * projection row, a chunk of an odd row count after the first (halo read, its gradient wanted), in a
         * document that began before the chunk: 17 blocks of runs, the last one short */
        {4133, 6144, 4, 2080, 0, 0, 1, 1, 5000},
        {300, 6, 4, 2, 0, 0, 1, 1, 0},      /* 6 channels: a 2-channel group, the scalar path */
        {97, 1028, 4, 4, 12, 0, 0, 1, 1},   /* 8-byte rows that are not 16-byte rows; one live lane in the last block */
        {40, 64, 4, 0, 0, 4, 1, 0, 2},      /* the block starts 8 bytes into a row: 8-byte vectors */
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const ConvShape s = shapes[k];
        const int C = s.C, Kc = s.Kc, ldi = C + s.ldi_extra, ldo = C + s.ldo_extra;
        const int64_t T = s.T, nh = (int64_t)(Kc - 1) * C;
        char what[128];
        printf("-- T %lld C %d Kc %d ldi %d ldo %d pad %d halo %d dhalo %d doc_pos[0] %d\n", (long long)T, C, Kc, ldi,
               ldo, s.pad, s.halo, s.dhalo, s.first_doc_pos);
        int32_t *doc_pos = (int32_t *)test_alloc(T * 4);
        for (int64_t t = 0; t < T; t++) /* documents: ~1 start in 20 tokens, one in row 1 of case 2 */
            doc_pos[t] = t == 0 ? s.first_doc_pos : (test_uniform() < 0.05 || (k == 2 && t == 1)) ? 0 : doc_pos[t - 1] + 1;
        CtMat x = ct_mat(T, C, ldi, s.pad), g = ct_mat(T, C, ldo, s.pad);
        ct_mat_fill(&x, 1.0);
        ct_mat_fill(&g, 1.0);
        float *w = ct_host_normal((int64_t)C * Kc, 0.5), *halo = NULL;
        ct_round_bf16(w, (int64_t)C * Kc);
        bf16 *d_x = ct_mat_up(&x), *d_g = ct_mat_up(&g), *d_w = ct_up_bf16(w, (int64_t)C * Kc), *d_halo = NULL;
        if (s.halo && nh) {
            halo = ct_host_normal(nh, 1.0);
            ct_round_bf16(halo, nh);
            d_halo = ct_up_bf16(halo, nh);
        }
        int32_t *d_doc = ct_up_i32(doc_pos, T);

        CtMat y = ct_mat(T, C, ldo, s.pad), yc = ct_mat(T, C, ldo, s.pad);
        bf16 *d_y = ct_mat_up(&y);
        cuda_conv1d_silu_forward(d_y, d_x, d_halo, d_w, d_doc, T, C, Kc, ldi, ldo);
        ct_mat_down(&y, d_y);
        cpu_conv1d_silu_forward(yc.p, x.p, halo, w, doc_pos, T, C, Kc, ldi, ldo);
        snprintf(what, sizeof what, "conv fwd [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&y), ct_mat_dense(&yc), T * C, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &y);

        float *dw0 = ct_host_normal((int64_t)C * Kc, 0.1), *dwc = ct_clone(dw0, (int64_t)C * Kc), *dw[2];
        CtMat di = ct_mat(T, C, ldi, s.pad), dic = ct_mat(T, C, ldi, s.pad);
        float *dh = ct_host_nan(nh + 1), *dhc = s.dhalo ? ct_host_nan(nh + 1) : NULL;
        for (int run = 0; run < 2; run++) {
            bf16 *d_di = ct_mat_up(&di), *d_dh = s.dhalo ? (bf16 *)ct_dev((size_t)(nh + 1) * 2) : NULL;
            float *d_dw = ct_up_f32(dw0, (int64_t)C * Kc);
            cuda_conv1d_silu_backward(d_di, d_dh, d_dw, d_g, d_x, d_halo, d_w, d_doc, T, C, Kc, ldi, ldo);
            if (run == 0) {
                ct_mat_down(&di, d_di);
                if (d_dh) ct_down_bf16(dh, d_dh, nh + 1);
            }
            dw[run] = ct_host((int64_t)C * Kc);
            ct_down_f32(dw[run], d_dw, (int64_t)C * Kc);
        }
        cpu_conv1d_silu_backward(dic.p, dhc, dwc, g.p, x.p, halo, w, doc_pos, T, C, Kc, ldi, ldo);
        snprintf(what, sizeof what, "conv bwd dinp [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&di), ct_mat_dense(&dic), T * C, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &di);
        if (s.dhalo && nh) {
            snprintf(what, sizeof what, "conv bwd dhalo [case %zu]", k);
            test_check_rel_f(what, dh, dhc, nh, CT_BOUND_BF16_OUT);
            EXPECT(isnan(dh[nh]), "conv bwd dhalo [case %zu]: wrote past the halo rows", k);
        }
        snprintf(what, sizeof what, "conv bwd dw += [case %zu]", k);
        test_check_rel_f(what, dw[0], dwc, (int64_t)C * Kc, CT_BOUND_F32);
        ct_bitwise_equal(what, dw[0], dw[1], (int64_t)C * Kc);
    }
}

/* the GDN conv fused with the split after it (gdn_conv_split_forward/backward) against two oracles: the fp32
 * cpu entries (the kernel rounds the conv output and dconv to bf16 where the unfused pair stores them, so its
 * bf16 outputs get CT_BOUND_BF16_TWICE, rstd, v and dw CT_BOUND_BF16_OUT), and the cpu conv and split with that
 * intermediate rounded to bf16 (qk, dproj, dhalo CT_BOUND_BF16_OUT; rstd CT_BOUND_F32; dw CONV_SPLIT_DW_ROUNDED:
 * a bf16 ulp of dconv flips now and then where the head's dot is summed in another order). proj rows are
 * [q|k|v|z|gates]: the gates' columns and the pads must stay untouched; z and dz are copies, bitwise. Shapes:
 * dk 64 and 128, v and z ending inside a warp, odd Vd one element into the rows (the scalar path), a halo read
 * or not, its gradient, documents (a start every ~1/rate tokens, the first doc_pos[0] tokens before the call),
 * and the 1B layer (nk 16, dk 128, Vd 2048 in rows of 8224) over 4133 rows: 17 blocks of runs, the last short. */
#define CONV_SPLIT_DW_ROUNDED 2e-4

typedef struct {
    int64_t T;
    int     nk, dk, Vd, gates, pad, halo, dhalo, first_doc_pos;
    double  rate;
} ConvSplitShape;

TEST(cuda_gdn_conv_split) {
    static const ConvSplitShape shapes[] = {
        {1, 1, 64, 64, 0, 0, 1, 1, 0, 0.0},
        {37, 1, 64, 36, 4, 0, 1, 1, 9, 0.05},
        {70, 2, 64, 37, 2, 1, 0, 1, 0, 0.1},
        {300, 2, 128, 256, 8, 0, 1, 1, 2, 0.02},
        {97, 2, 128, 128, 0, 0, 1, 1, 1000, 0.3},
        {4133, 16, 128, 2048, 32, 0, 1, 1, 5000, 0.05},
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const ConvSplitShape s = shapes[k];
        const int Kc = 4, Kd2 = 2 * s.nk * s.dk, Cc = Kd2 + s.Vd, Vd = s.Vd, ldp = Cc + Vd + s.gates;
        const int64_t T = s.T, nh = (int64_t)(Kc - 1) * Cc, R = T * 2 * s.nk;
        char what[160];
        printf("-- T %lld nk %d dk %d Vd %d ldp %d pad %d halo %d dhalo %d doc_pos[0] %d rate %.2f\n", (long long)T,
               s.nk, s.dk, Vd, ldp, s.pad, s.halo, s.dhalo, s.first_doc_pos, s.rate);
        int32_t *doc_pos = (int32_t *)test_alloc(T * 4);
        for (int64_t t = 0; t < T; t++)
            doc_pos[t] = t == 0 ? s.first_doc_pos : test_uniform() < s.rate ? 0 : doc_pos[t - 1] + 1;
        CtMat proj = ct_mat(T, Cc + Vd, ldp, s.pad);
        ct_mat_fill(&proj, 1.0);
        float *w = ct_host_normal((int64_t)Cc * Kc, 0.5), *halo = NULL;
        ct_round_bf16(w, (int64_t)Cc * Kc);
        bf16 *d_proj = ct_mat_up(&proj), *d_w = ct_up_bf16(w, (int64_t)Cc * Kc), *d_halo = NULL;
        if (s.halo) {
            halo = ct_host_normal(nh, 1.0);
            ct_round_bf16(halo, nh);
            d_halo = ct_up_bf16(halo, nh);
        }
        int32_t *d_doc = ct_up_i32(doc_pos, T);

        /* forward */
        CtMat qk = ct_mat(T, Kd2, Kd2, 0), v = ct_mat(T, Vd, Vd, 0), z = ct_mat(T, Vd, Vd, 0);
        bf16 *d_qk = ct_mat_up(&qk), *d_v = ct_mat_up(&v), *d_z = ct_mat_up(&z);
        float *d_rstd = (float *)ct_dev((size_t)R * 4), *rstd = ct_host(R);
        cuda_gdn_conv_split_forward(d_qk, d_rstd, d_v, d_z, d_proj, d_halo, d_w, d_doc, T, s.nk, s.dk, Vd, Kc, ldp);
        ct_mat_down(&qk, d_qk);
        ct_mat_down(&v, d_v);
        ct_mat_down(&z, d_z);
        ct_down_f32(rstd, d_rstd, R);
        float *qkc = ct_host(T * Kd2), *rc = ct_host(R), *vc = ct_host(T * Vd), *zc = ct_host(T * Vd);
        cpu_gdn_conv_split_forward(qkc, rc, vc, zc, proj.p, halo, w, doc_pos, T, s.nk, s.dk, Vd, Kc, ldp);
        float *conv = ct_host(T * Cc), *qkr = ct_host(T * Kd2), *rr = ct_host(R), *vr = ct_host(T * Vd);
        float *zr = ct_host(T * Vd);
        cpu_conv1d_silu_forward(conv, proj.p, halo, w, doc_pos, T, Cc, Kc, ldp, Cc);
        ct_round_bf16(conv, T * Cc);
        cpu_gdn_split_forward(qkr, rr, vr, zr, conv, proj.p + Cc, T, s.nk, s.dk, Vd, Cc, ldp);
        snprintf(what, sizeof what, "conv_split fwd qk [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&qk), qkc, T * Kd2, CT_BOUND_BF16_TWICE);
        ct_mat_intact(what, &qk);
        snprintf(what, sizeof what, "conv_split fwd qk, rounded oracle [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&qk), qkr, T * Kd2, CT_BOUND_BF16_OUT);
        snprintf(what, sizeof what, "conv_split fwd rstd [case %zu]", k);
        test_check_rel_f(what, rstd, rc, R, CT_BOUND_BF16_OUT);
        snprintf(what, sizeof what, "conv_split fwd rstd, rounded oracle [case %zu]", k);
        test_check_rel_f(what, rstd, rr, R, CT_BOUND_F32);
        snprintf(what, sizeof what, "conv_split fwd v [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&v), vc, T * Vd, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &v);
        snprintf(what, sizeof what, "conv_split fwd z [case %zu]", k);
        ct_bitwise_equal(what, ct_mat_dense(&z), zc, T * Vd);
        ct_mat_intact(what, &z);

        /* backward from the cuda forward's qk and rstd (the same values on every side) */
        CtMat dqk = ct_mat(T, Kd2, Kd2, 0), dv = ct_mat(T, Vd, Vd, 0), dz = ct_mat(T, Vd, Vd, 0);
        ct_mat_fill(&dqk, 1.0);
        ct_mat_fill(&dv, 1.0);
        ct_mat_fill(&dz, 1.0);
        bf16 *d_dqk = ct_mat_up(&dqk), *d_dv = ct_mat_up(&dv), *d_dz = ct_mat_up(&dz);
        const float *qkh = ct_mat_dense(&qk);
        float *dw0 = ct_host_normal((int64_t)Cc * Kc, 0.1), *dw[2];
        CtMat dproj = ct_mat(T, Cc + Vd, ldp, s.pad);
        float *dh = ct_host_nan(nh + 1);
        for (int run = 0; run < 2; run++) {
            bf16 *d_dp = ct_mat_up(&dproj), *d_dh = s.dhalo ? (bf16 *)ct_dev((size_t)(nh + 1) * 2) : NULL;
            float *d_dw = ct_up_f32(dw0, (int64_t)Cc * Kc);
            cuda_gdn_conv_split_backward(d_dp, d_dh, d_dw, d_dqk, d_qk, d_rstd, d_dv, d_dz, d_proj, d_halo, d_w, d_doc,
                                         T, s.nk, s.dk, Vd, Kc, ldp);
            if (run == 0) {
                ct_mat_down(&dproj, d_dp);
                if (d_dh) ct_down_bf16(dh, d_dh, nh + 1);
            }
            dw[run] = ct_host((int64_t)Cc * Kc);
            ct_down_f32(dw[run], d_dw, (int64_t)Cc * Kc);
        }
        CtMat dpc = ct_mat(T, Cc + Vd, ldp, s.pad), dpr = ct_mat(T, Cc + Vd, ldp, s.pad);
        float *dhc = ct_host_nan(nh + 1), *dhr = ct_host_nan(nh + 1);
        float *dwc = ct_clone(dw0, (int64_t)Cc * Kc), *dwr = ct_clone(dw0, (int64_t)Cc * Kc);
        cpu_gdn_conv_split_backward(dpc.p, s.dhalo ? dhc : NULL, dwc, dqk.p, qkh, rstd, dv.p, dz.p, proj.p, halo, w,
                                    doc_pos, T, s.nk, s.dk, Vd, Kc, ldp);
        float *dconv = ct_host(T * Cc);
        cpu_gdn_split_backward(dconv, dpr.p + Cc, dqk.p, qkh, rstd, dv.p, dz.p, T, s.nk, s.dk, Vd, Cc, ldp);
        ct_round_bf16(dconv, T * Cc);
        cpu_conv1d_silu_backward(dpr.p, s.dhalo ? dhr : NULL, dwr, dconv, proj.p, halo, w, doc_pos, T, Cc, Kc, ldp,
                                 Cc);
        /* dproj's q|k|v columns against both oracles, its z columns bitwise */
        const float *g = ct_mat_dense(&dproj), *gc = ct_mat_dense(&dpc), *gr = ct_mat_dense(&dpr);
        float *a = ct_host(T * Cc), *bc = ct_host(T * Cc), *br = ct_host(T * Cc), *za = ct_host(T * Vd);
        float *zb = ct_host(T * Vd);
        for (int64_t t = 0; t < T; t++) {
            for (int c = 0; c < Cc; c++)
                a[t * Cc + c] = g[t * (Cc + Vd) + c], bc[t * Cc + c] = gc[t * (Cc + Vd) + c],
                br[t * Cc + c] = gr[t * (Cc + Vd) + c];
            for (int c = 0; c < Vd; c++) za[t * Vd + c] = g[t * (Cc + Vd) + Cc + c], zb[t * Vd + c] = dz.p[t * Vd + c];
        }
        snprintf(what, sizeof what, "conv_split bwd dproj q|k|v [case %zu]", k);
        test_check_rel_f(what, a, bc, T * Cc, CT_BOUND_BF16_TWICE);
        ct_mat_intact(what, &dproj);
        snprintf(what, sizeof what, "conv_split bwd dproj q|k|v, rounded oracle [case %zu]", k);
        test_check_rel_f(what, a, br, T * Cc, CT_BOUND_BF16_OUT);
        snprintf(what, sizeof what, "conv_split bwd dproj z = dz [case %zu]", k);
        ct_bitwise_equal(what, za, zb, T * Vd);
        if (s.dhalo) {
            snprintf(what, sizeof what, "conv_split bwd dhalo [case %zu]", k);
            test_check_rel_f(what, dh, dhc, nh, CT_BOUND_BF16_TWICE);
            snprintf(what, sizeof what, "conv_split bwd dhalo, rounded oracle [case %zu]", k);
            test_check_rel_f(what, dh, dhr, nh, CT_BOUND_BF16_OUT);
            EXPECT(isnan(dh[nh]), "conv_split bwd dhalo [case %zu]: wrote past the halo rows", k);
        }
        snprintf(what, sizeof what, "conv_split bwd dw += [case %zu]", k);
        test_check_rel_f(what, dw[0], dwc, (int64_t)Cc * Kc, CT_BOUND_BF16_OUT);
        snprintf(what, sizeof what, "conv_split bwd dw +=, rounded oracle [case %zu]", k);
        test_check_rel_f(what, dw[0], dwr, (int64_t)Cc * Kc, CONV_SPLIT_DW_ROUNDED);
        ct_bitwise_equal(what, dw[0], dw[1], (int64_t)Cc * Kc);
    }
}
