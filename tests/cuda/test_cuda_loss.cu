/*
 * test_cuda_loss.cu — GPU parity of the chunked fused lm_head + cross-entropy
 * (kernels/cuda/cuda_loss.cu) against the cpu oracle (kernels/cpu/cpu_loss.c): per-token losses,
 * dx and dw, with ignored targets (-1), several chunk sizes (rows = 1, odd, T), odd C and V (the
 * loss kernel's scalar path), slices of one float4 with blocks past the row's end, the Qwen vocabulary (74 KiB slices of a row per cluster block), a
 * losses-only call (dx = dw = NULL), and the device error word for a target >= V.
 *
 * Bounds (cuda_test.h): losses are fp32 from fp32 logits of the same bf16 operands,
 * CT_BOUND_F32; dx (bf16) and dw (fp32) are computed from bf16-rounded dlogits (the tensor-core
 * GEMMs' operand; the cpu keeps fp32), so they carry that rounding too: CT_BOUND_BF16_TWICE. dw
 * starts from the same random values on both sides and runs twice (bitwise equal).
 */
#include <stdio.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

typedef struct {
    int64_t T, rows;
    int     C, V;
} LossShape;

TEST(cuda_lm_head_loss) {
    static const LossShape shapes[] = {
        {1, 1, 8, 5},
        {7, 3, 37, 50},      /* odd everything, chunks of 3 rows (the last one short) */
        {130, 64, 256, 256}, /* the tiny config's head */
        {333, 333, 64, 1000},
        {64, 17, 128, 5003}, /* odd V: dlogit rows of odd stride, 4-byte aligned */
        {9, 4, 16, 20},      /* V % 4 == 0, slices of one float4: blocks 5-7 of a row's cluster hold none */
        {48, 20, 64, 151936}, /* the Qwen vocabulary: 74 KiB slices of a row per cluster block */
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const LossShape s = shapes[k];
        const int64_t T = s.T, TC = T * s.C, VC = (int64_t)s.V * s.C;
        char what[128];
        printf("-- T %lld rows %lld C %d V %d\n", (long long)T, (long long)s.rows, s.C, s.V);
        float *x = ct_host_normal(TC, 1.0), *w = ct_host_normal(VC, 0.3);
        ct_round_bf16(x, TC);
        ct_round_bf16(w, VC);
        int32_t *tg = (int32_t *)test_alloc(T * 4);
        int64_t counted = 0;
        for (int64_t t = 0; t < T; t++) {
            tg[t] = (t > 0 && test_uniform() < 0.2) ? -1 : (int32_t)(test_uniform() * s.V) % s.V;
            counted += tg[t] >= 0;
        }
        const float scale = (float)(1.0 / (double)counted);
        bf16 *d_x = ct_up_bf16(x, TC), *d_w = ct_up_bf16(w, VC);
        int32_t *d_tg = ct_up_i32(tg, T);
        float *d_ws = (float *)ct_dev((size_t)(s.rows * s.V) * 4);
        float *dw0 = ct_host_normal(VC, 0.01), *dwc = ct_clone(dw0, VC), *dw[2], *loss[3];
        float *dx = ct_host(TC);
        for (int run = 0; run < 3; run++) { /* runs 0, 1: everything; run 2: losses only */
            float *d_loss = (float *)ct_dev((size_t)T * 4), *d_dw = run < 2 ? ct_up_f32(dw0, VC) : NULL;
            bf16 *d_dx = run < 2 ? (bf16 *)ct_dev((size_t)TC * 2) : NULL;
            cuda_lm_head_loss(d_loss, d_dx, d_dw, d_x, d_w, d_tg, scale, d_ws, s.rows, T, s.C, s.V);
            loss[run] = ct_host(T);
            ct_down_f32(loss[run], d_loss, T);
            if (run == 0) ct_down_bf16(dx, d_dx, TC);
            if (run < 2) {
                dw[run] = ct_host(VC);
                ct_down_f32(dw[run], d_dw, VC);
            }
        }
        float *lossc = ct_host_nan(T), *dxc = ct_host_nan(TC), *wsc = ct_host_nan(s.rows * s.V);
        cpu_lm_head_loss(lossc, dxc, dwc, x, w, tg, scale, wsc, s.rows, T, s.C, s.V);
        snprintf(what, sizeof what, "lm_head_loss losses [case %zu]", k);
        test_check_rel_f(what, loss[0], lossc, T, CT_BOUND_F32);
        snprintf(what, sizeof what, "lm_head_loss losses only, same values [case %zu]", k);
        ct_bitwise_equal(what, loss[0], loss[2], T);
        snprintf(what, sizeof what, "lm_head_loss dx [case %zu]", k);
        test_check_rel_f(what, dx, dxc, TC, CT_BOUND_BF16_TWICE);
        snprintf(what, sizeof what, "lm_head_loss dw += [case %zu]", k);
        test_check_rel_f(what, dw[0], dwc, VC, CT_BOUND_BF16_TWICE);
        ct_bitwise_equal(what, dw[0], dw[1], VC);
    }
    /* a target >= V is recorded in the device error word */
    float *x = ct_host_normal(3 * 8, 1.0), *w = ct_host_normal(5 * 8, 1.0);
    int32_t tg[3] = {1, 5, 2};
    cuda_lm_head_loss((float *)ct_dev(12), NULL, NULL, ct_up_bf16(x, 24), ct_up_bf16(w, 40), ct_up_i32(tg, 3), 1.0f,
                      (float *)ct_dev(3 * 5 * 4), 3, 3, 8, 5);
    long long index = -1;
    int value = 0, code = cuda_error_take(&index, &value);
    EXPECT(code == CUDA_ERR_TARGET_ID && index == 1 && value == 5, "error word: code %d index %lld value %d", code,
           index, value);
    printf("lm_head_loss: target >= V recorded (code %d, token %lld, target %d) ok\n", code, index, value);
}
