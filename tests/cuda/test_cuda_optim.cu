/*
 * test_cuda_optim.cu — GPU parity of AdamW and the sum of squares (kernels/cuda/cuda_optim.cu)
 * against the cpu oracle (kernels/cpu/cpu_optim.c).
 *
 * AdamW: sizes 1 .. 2^20 + 3 (the 16-byte path and its scalar tail), a buffer starting one
 * element past alignment (the scalar path), step 1 and 100, weight decay, grad_scale. p, m, v are
 * fp32 outputs of the same fp32 formula (CT_BOUND_F32; only FMA contraction differs); the bf16
 * compute copy is compared with the cpu's new p (CT_BOUND_BF16_OUT: its rounding).
 * sum_squares: double on both sides, only the order of the sums differs: relative 1e-12; two
 * runs must be bitwise equal (the reduction order is fixed).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

#define SUMSQ_BOUND 1e-12

TEST(cuda_adamw) {
    static const struct { int64_t n; int offset, step; } shapes[] = {{1, 0, 1}, {7, 0, 3}, {1000, 1, 100}, {(1 << 20) + 3, 0, 100}};
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t n = shapes[k].n, o = shapes[k].offset;
        const int step = shapes[k].step;
        char what[128];
        printf("-- n %lld offset %lld step %d\n", (long long)n, (long long)o, step);
        float *p = ct_host_normal(n + o, 0.05), *m = ct_host_normal(n + o, 0.01), *g = ct_host_normal(n + o, 0.1);
        float *v = ct_host(n + o);
        test_fill_uniform(v, n + o, 1e-6, 1e-3);
        float *d_p = ct_up_f32(p, n + o), *d_m = ct_up_f32(m, n + o), *d_v = ct_up_f32(v, n + o);
        float *d_g = ct_up_f32(g, n + o);
        bf16 *d_c = (bf16 *)ct_dev((size_t)(n + o) * 2);
        const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
        cuda_adamw_update(d_p + o, d_m + o, d_v + o, d_c + o, d_g + o, n, lr, b1, b2, eps, wd, gs, step);
        float *pc = ct_clone(p, n + o), *mc = ct_clone(m, n + o), *vc = ct_clone(v, n + o);
        cpu_adamw_update(pc + o, mc + o, vc + o, NULL, g + o, n, lr, b1, b2, eps, wd, gs, step);
        float *got = ct_host(n + o), *comp = ct_host(n + o);
        ct_down_f32(got, d_p, n + o);
        snprintf(what, sizeof what, "adamw p [case %zu]", k);
        test_check_rel_f(what, got + o, pc + o, n, CT_BOUND_F32);
        ct_down_f32(got, d_m, n + o);
        snprintf(what, sizeof what, "adamw m [case %zu]", k);
        test_check_rel_f(what, got + o, mc + o, n, CT_BOUND_F32);
        ct_down_f32(got, d_v, n + o);
        snprintf(what, sizeof what, "adamw v [case %zu]", k);
        test_check_rel_f(what, got + o, vc + o, n, CT_BOUND_F32);
        ct_down_bf16(comp, d_c, n + o);
        snprintf(what, sizeof what, "adamw bf16 compute copy [case %zu]", k);
        test_check_rel_f(what, comp + o, pc + o, n, CT_BOUND_BF16_OUT);
        EXPECT(o == 0 || isnan(comp[0]), "adamw [case %zu]: wrote before its range", k);
    }
}

TEST(cuda_sum_squares) {
    static const int64_t sizes[] = {1, 1000, (1 << 22) + 5};
    ct_begin();
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int64_t n = sizes[k];
        float *x = ct_host_normal(n, 1e-3);
        float *d_x = ct_up_f32(x, n);
        const double a = cuda_sum_squares(d_x, n), b = cuda_sum_squares(d_x, n), c = cpu_sum_squares(x, n);
        const double e = fabs(a - c) / c;
        printf("sum_squares n %lld: rel err %.3e <= %.1e%s\n", (long long)n, e, SUMSQ_BOUND, e <= SUMSQ_BOUND ? " ok" : "");
        EXPECT(e <= SUMSQ_BOUND, "sum_squares n %lld: rel err %.3e > %.1e", (long long)n, e, SUMSQ_BOUND);
        EXPECT(memcmp(&a, &b, sizeof a) == 0, "sum_squares n %lld: two runs differ (%.17g, %.17g)", (long long)n, a, b);
    }
}
