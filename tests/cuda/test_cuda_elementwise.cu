/*
 * test_cuda_elementwise.cu — GPU parity of kernels/cuda/cuda_elementwise.cu against the cpu oracle
 * (kernels/cpu/cpu_elementwise.c): the embedding (forward exact; backward through the sorted,
 * deterministic segments, with a few ids repeated hundreds of times), the Gated DeltaNet gates
 * (including softplus arguments above its threshold of 20), the sigmoid output gate and SwiGLU,
 * forward and backward (at the 1B config's widths and an odd row count too, rows of 257 and 513 vectors,
 * and saturated gates); and the device error word for a negative token id.
 *
 * Bounds (cuda_test.h): the embedding forward is a copy (bound 0: bitwise); bf16 outputs
 * CT_BOUND_BF16_OUT; fp32 gates and parameter gradients CT_BOUND_F32. Parameter gradients run
 * twice and must be bitwise equal; `+=` outputs start from the same random values on both sides.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

TEST(cuda_embedding) {
    static const struct { int64_t T; int V, C; } shapes[] = {{1, 5, 8}, {333, 50, 37}, {1000, 300, 256}, {64, 7, 1536}};
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t T = shapes[k].T;
        const int V = shapes[k].V, C = shapes[k].C;
        char what[128];
        printf("-- T %lld V %d C %d\n", (long long)T, V, C);
        int32_t *tok = (int32_t *)test_alloc(T * 4);
        for (int64_t t = 0; t < T; t++) /* 40% one id: long segments; the rest spread */
            tok[t] = test_uniform() < 0.4 ? V / 2 : (int32_t)(test_uniform() * V) % V;
        float *wte = ct_host_normal((int64_t)V * C, 1.0);
        ct_round_bf16(wte, (int64_t)V * C);
        int32_t *d_tok = ct_up_i32(tok, T);
        bf16 *d_wte = ct_up_bf16(wte, (int64_t)V * C), *d_out = (bf16 *)ct_dev((size_t)(T * C) * 2);
        cuda_embedding_forward(d_out, d_tok, d_wte, T, C);
        float *out = ct_host(T * C), *outc = ct_host_nan(T * C);
        ct_down_bf16(out, d_out, T * C);
        cpu_embedding_forward(outc, tok, wte, T, C);
        snprintf(what, sizeof what, "embedding fwd [case %zu]", k);
        test_check_rel_f(what, out, outc, T * C, 0.0);

        float *g = ct_host_normal(T * C, 1.0);
        ct_round_bf16(g, T * C);
        bf16 *d_g = ct_up_bf16(g, T * C);
        float *dw0 = ct_host_normal((int64_t)V * C, 0.1), *dwc = ct_clone(dw0, (int64_t)V * C), *dw[2];
        for (int run = 0; run < 2; run++) {
            float *d_dw = ct_up_f32(dw0, (int64_t)V * C);
            cuda_embedding_backward(d_dw, d_g, d_tok, T, C);
            dw[run] = ct_host((int64_t)V * C);
            ct_down_f32(dw[run], d_dw, (int64_t)V * C);
        }
        cpu_embedding_backward(dwc, g, tok, T, C);
        snprintf(what, sizeof what, "embedding bwd dwte += [case %zu]", k);
        test_check_rel_f(what, dw[0], dwc, (int64_t)V * C, CT_BOUND_F32);
        ct_bitwise_equal(what, dw[0], dw[1], (int64_t)V * C);
    }
    /* a negative id is recorded in the device error word, naming the token */
    int32_t bad[4] = {1, 2, -7, 3};
    float *wte = ct_host_normal(4 * 8, 1.0);
    cuda_embedding_forward(ct_dev(4 * 8 * 2), ct_up_i32(bad, 4), ct_up_bf16(wte, 32), 4, 8);
    long long index = -1;
    int value = 0, code = cuda_error_take(&index, &value);
    EXPECT(code == CUDA_ERR_TOKEN_ID && index == 2 && value == -7, "error word: code %d index %lld value %d", code,
           index, value);
    printf("embedding: negative id recorded (code %d, token %lld, id %d) ok\n", code, index, value);
}

TEST(cuda_gdn_gates) {
    static const struct { int64_t T; int nv, ld, pad; } shapes[] = {{1, 1, 1, 0}, {7, 3, 11, 3}, {333, 32, 40, 0},
                                                                    {1000, 4, 64, 8}};
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t T = shapes[k].T;
        const int nv = shapes[k].nv, ld = shapes[k].ld, pad = shapes[k].pad;
        const int64_t n = T * nv;
        char what[128];
        printf("-- T %lld nv %d ld %d pad %d\n", (long long)T, nv, ld, pad);
        CtMat b = ct_mat(T, nv, ld, pad), a = ct_mat(T, nv, ld, pad);
        ct_mat_fill(&b, 3.0);
        ct_mat_fill(&a, 8.0); /* with dt_bias, some a + dt_bias > 20: softplus's linear branch */
        float *A_log = ct_host(nv), *dt_bias = ct_host_normal(nv, 4.0);
        test_fill_uniform(A_log, nv, -2.0, 2.0);
        bf16 *d_b = ct_mat_up(&b), *d_a = ct_mat_up(&a);
        float *d_Alog = ct_up_f32(A_log, nv), *d_dtb = ct_up_f32(dt_bias, nv);
        float *d_beta = (float *)ct_dev(n * 4), *d_gg = (float *)ct_dev(n * 4);
        cuda_gdn_gates_forward(d_beta, d_gg, d_b, d_a, d_Alog, d_dtb, T, nv, ld);
        float *beta = ct_host(n), *gg = ct_host(n), *betac = ct_host_nan(n), *ggc = ct_host_nan(n);
        ct_down_f32(beta, d_beta, n);
        ct_down_f32(gg, d_gg, n);
        cpu_gdn_gates_forward(betac, ggc, b.p, a.p, A_log, dt_bias, T, nv, ld);
        snprintf(what, sizeof what, "gates fwd beta [case %zu]", k);
        test_check_rel_f(what, beta, betac, n, CT_BOUND_F32);
        snprintf(what, sizeof what, "gates fwd g [case %zu]", k);
        test_check_rel_f(what, gg, ggc, n, CT_BOUND_F32);

        float *dbeta = ct_host_normal(n, 1.0), *dg = ct_host_normal(n, 1.0);
        float *d_dbeta = ct_up_f32(dbeta, n), *d_dg = ct_up_f32(dg, n);
        float *dA0 = ct_host_normal(nv, 0.1), *ddt0 = ct_host_normal(nv, 0.1);
        float *dAc = ct_clone(dA0, nv), *ddtc = ct_clone(ddt0, nv), *dA[2], *ddt[2];
        CtMat db = ct_mat(T, nv, ld, pad), da = ct_mat(T, nv, ld, pad);
        for (int run = 0; run < 2; run++) {
            bf16 *d_db = ct_mat_up(&db), *d_da = ct_mat_up(&da);
            float *d_dA = ct_up_f32(dA0, nv), *d_ddt = ct_up_f32(ddt0, nv);
            cuda_gdn_gates_backward(d_db, d_da, d_dA, d_ddt, d_dbeta, d_dg, d_b, d_a, d_Alog, d_dtb, T, nv, ld);
            if (run == 0) {
                ct_mat_down(&db, d_db);
                ct_mat_down(&da, d_da);
            }
            dA[run] = ct_host(nv);
            ddt[run] = ct_host(nv);
            ct_down_f32(dA[run], d_dA, nv);
            ct_down_f32(ddt[run], d_ddt, nv);
        }
        CtMat dbc = ct_mat(T, nv, ld, pad), dac = ct_mat(T, nv, ld, pad);
        cpu_gdn_gates_backward(dbc.p, dac.p, dAc, ddtc, dbeta, dg, b.p, a.p, A_log, dt_bias, T, nv, ld);
        snprintf(what, sizeof what, "gates bwd db [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&db), ct_mat_dense(&dbc), n, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &db);
        snprintf(what, sizeof what, "gates bwd da [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&da), ct_mat_dense(&dac), n, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &da);
        snprintf(what, sizeof what, "gates bwd dA_log += [case %zu]", k);
        test_check_rel_f(what, dA[0], dAc, nv, CT_BOUND_F32);
        ct_bitwise_equal(what, dA[0], dA[1], nv);
        snprintf(what, sizeof what, "gates bwd ddt_bias += [case %zu]", k);
        test_check_rel_f(what, ddt[0], ddtc, nv, CT_BOUND_F32);
        ct_bitwise_equal(what, ddt[0], ddt[1], nv);
    }
}

TEST(cuda_sigmoid_gate) {
    static const struct { int64_t T; int D, ldg, pad; double gscale; } shapes[] = {
        {1, 8, 8, 0, 3.0}, {7, 37, 50, 3, 3.0}, {333, 256, 512, 0, 3.0}, {130, 64, 72, 8, 3.0},
        {4133, 2048, 2048, 0, 3.0}, /* the 1B config's attention output (16 heads of 128), an odd row count */
        {5, 2056, 2100, 0, 3.0},    /* 257 vectors a row: a second block column with one live thread */
        {64, 256, 256, 0, 40.0},    /* saturated gates (|gate| up to ~150: exp overflows to inf) */
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t T = shapes[k].T;
        const int D = shapes[k].D, ldg = shapes[k].ldg, pad = shapes[k].pad;
        char what[128];
        printf("-- T %lld D %d ldg %d pad %d\n", (long long)T, D, ldg, pad);
        CtMat x = ct_mat(T, D, D, 0), gate = ct_mat(T, D, ldg, pad), g = ct_mat(T, D, D, 0);
        ct_mat_fill(&x, 1.0);
        ct_mat_fill(&gate, shapes[k].gscale);
        ct_mat_fill(&g, 1.0);
        bf16 *d_x = ct_mat_up(&x), *d_gate = ct_mat_up(&gate), *d_g = ct_mat_up(&g);
        CtMat y = ct_mat(T, D, D, 0), yc = ct_mat(T, D, D, 0);
        bf16 *d_y = ct_mat_up(&y);
        cuda_sigmoid_gate_forward(d_y, d_x, d_gate, T, D, ldg);
        ct_mat_down(&y, d_y);
        cpu_sigmoid_gate_forward(yc.p, x.p, gate.p, T, D, ldg);
        snprintf(what, sizeof what, "sigmoid_gate fwd [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&y), ct_mat_dense(&yc), T * D, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &y);
        CtMat dx = ct_mat(T, D, D, 0), dgt = ct_mat(T, D, ldg, pad);
        CtMat dxc = ct_mat(T, D, D, 0), dgtc = ct_mat(T, D, ldg, pad);
        bf16 *d_dx = ct_mat_up(&dx), *d_dgt = ct_mat_up(&dgt);
        cuda_sigmoid_gate_backward(d_dx, d_dgt, d_g, d_x, d_gate, T, D, ldg);
        ct_mat_down(&dx, d_dx);
        ct_mat_down(&dgt, d_dgt);
        cpu_sigmoid_gate_backward(dxc.p, dgtc.p, g.p, x.p, gate.p, T, D, ldg);
        snprintf(what, sizeof what, "sigmoid_gate bwd dx [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&dx), ct_mat_dense(&dxc), T * D, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &dx);
        snprintf(what, sizeof what, "sigmoid_gate bwd dgate [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&dgt), ct_mat_dense(&dgtc), T * D, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &dgt);
    }
}

TEST(cuda_swiglu) {
    static const struct { int64_t T; int I; double scale; } shapes[] = {
        {1, 8, 2.0}, {7, 37, 2.0}, {333, 512, 2.0}, {64, 4096, 2.0},
        {4133, 4096, 2.0}, /* the 1B config's intermediate size, an odd row count */
        {3, 4100, 2.0},    /* 513 vectors a row, not 16-byte rows: the scalar path across three block columns */
        {9, 2056, 30.0},   /* a second block column with one live thread; saturated gates */
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t T = shapes[k].T;
        const int I = shapes[k].I;
        char what[128];
        printf("-- T %lld I %d\n", (long long)T, I);
        CtMat gu = ct_mat(T, 2 * I, 2 * I, 0), g = ct_mat(T, I, I, 0);
        ct_mat_fill(&gu, shapes[k].scale);
        ct_mat_fill(&g, 1.0);
        bf16 *d_gu = ct_mat_up(&gu), *d_g = ct_mat_up(&g);
        CtMat y = ct_mat(T, I, I, 0), yc = ct_mat(T, I, I, 0);
        bf16 *d_y = ct_mat_up(&y);
        cuda_swiglu_forward(d_y, d_gu, T, I);
        ct_mat_down(&y, d_y);
        cpu_swiglu_forward(yc.p, gu.p, T, I);
        snprintf(what, sizeof what, "swiglu fwd [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&y), ct_mat_dense(&yc), T * I, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &y);
        CtMat dgu = ct_mat(T, 2 * I, 2 * I, 0), dguc = ct_mat(T, 2 * I, 2 * I, 0);
        CtMat dgu2 = ct_mat(T, 2 * I, 2 * I, 0), y2 = ct_mat(T, I, I, 0);
        bf16 *d_dgu = ct_mat_up(&dgu), *d_dgu2 = ct_mat_up(&dgu2), *d_y2 = ct_mat_up(&y2);
        cuda_swiglu_backward(d_dgu, NULL, d_g, d_gu, T, I);
        cuda_swiglu_backward(d_dgu2, d_y2, d_g, d_gu, T, I); /* with out: the forward's bits again */
        ct_mat_down(&dgu, d_dgu);
        ct_mat_down(&dgu2, d_dgu2);
        ct_mat_down(&y2, d_y2);
        cpu_swiglu_backward(dguc.p, NULL, g.p, gu.p, T, I);
        snprintf(what, sizeof what, "swiglu bwd [case %zu]", k);
        test_check_rel_f(what, ct_mat_dense(&dgu), ct_mat_dense(&dguc), T * 2 * I, CT_BOUND_BF16_OUT);
        ct_mat_intact(what, &dgu);
        snprintf(what, sizeof what, "swiglu bwd with out: dgate_up as without [case %zu]", k);
        ct_bitwise_equal(what, ct_mat_dense(&dgu2), ct_mat_dense(&dgu), T * 2 * I);
        snprintf(what, sizeof what, "swiglu bwd with out: out as the forward's [case %zu]", k);
        ct_bitwise_equal(what, ct_mat_dense(&y2), ct_mat_dense(&y), T * I);
        ct_mat_intact(what, &y2);
    }
}
