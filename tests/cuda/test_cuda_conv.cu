/*
 * test_cuda_conv.cu — GPU parity of the causal depthwise conv1d + SiLU (kernels/cuda/cuda_conv.cu)
 * against the cpu oracle (kernels/cpu/cpu_conv.c), forward and backward, with documents (doc_pos
 * resets, including a fragment whose first document started before it and a document start
 * inside the first Kc-1 rows), with and without the halo rows of a previous CP fragment, with
 * dhalo wanted while halo is NULL, Kc from 1 to 16, strided input inside a wider projection row,
 * odd channel counts and mid-vector blocks; the step's shape (6144 channels in rows of 8224, 4133 rows),
 * and rows that take the run kernels' 8-byte vectors but not 16-byte ones.
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
