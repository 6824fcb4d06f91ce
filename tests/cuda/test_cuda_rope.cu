/*
 * test_cuda_rope.cu — GPU parity of the partial RoPE (kernels/cuda/cuda_rope.cu) against the cpu
 * oracle (kernels/cpu/cpu_rope.c, angles in double), forward and backward, in place on blocks of
 * wider rows, rd < hd (partial) and rd = hd, positions up to 1e6; and the angle accuracy itself.
 *
 * Bounds: the rotated values are bf16 outputs, CT_BOUND_BF16_OUT (cuda_test.h); the dims past rd
 * must come back unchanged (they are inside the compared block, so any change shows). The angle
 * test writes the kernels' (cos, sin) in fp32 for 4096 positions up to 1e6 (random, and the
 * worst ones near 1e6 and powers of two) and compares with float64: the compensated fp32 angle
 * must stay within ROPE_TRIG_BOUND (max abs error of cos and sin); the plain fp32 product
 * pos * inv_freq is measured beside it for the record (about 3e-2 at 1e6, no bound).
 */
#include <math.h>
#include <stdio.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_rope.h"
#include "cuda_test.h"

/* sincosf (a few ulp of 1, 1.2e-7) + the rounding of the compensation (~1e-7) + the e^4/24 term
 * left out (5e-7 at |e| = 0.06, the largest at pos 1e6) */
#define ROPE_TRIG_BOUND 2e-6

typedef struct {
    int64_t T;
    int     nh, hd, rd, ld_extra, pad;
    int32_t max_pos;
    float   theta;
} RopeShape;

TEST(cuda_rope) {
    static const RopeShape shapes[] = {
        {7, 2, 64, 16, 0, 3, 100, 1e4f},          /* mid-vector block */
        {130, 4, 64, 16, 64, 0, 32768, 1e4f},     /* the tiny config's q: partial 0.25 of 64 */
        {333, 3, 128, 64, 5, 0, 1000000, 1e7f},   /* Qwen3-Next's theta, positions up to 1e6 */
        {50, 2, 256, 256, 0, 8, 1000000, 1e7f},   /* rd = hd = 256, the largest */
        {9, 1, 10, 0, 0, 0, 1000, 1e4f},          /* rd = 0: nothing rotates */
    };
    ct_begin();
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const RopeShape s = shapes[k];
        const int W = s.nh * s.hd, ld = W + s.ld_extra;
        char what[128];
        printf("-- T %lld nh %d hd %d rd %d ld %d pad %d pos <= %d theta %g\n", (long long)s.T, s.nh, s.hd, s.rd, ld,
               s.pad, s.max_pos, (double)s.theta);
        int32_t *pos = (int32_t *)test_alloc(s.T * 4);
        for (int64_t t = 0; t < s.T; t++) pos[t] = t == 0 ? s.max_pos : (int32_t)(test_uniform() * s.max_pos);
        int32_t *d_pos = ct_up_i32(pos, s.T);
        for (int dir = 0; dir < 2; dir++) {
            CtMat x = ct_mat(s.T, W, ld, s.pad);
            ct_mat_fill(&x, 1.0);
            CtMat xc = ct_mat_clone(&x);
            bf16 *d_x = ct_mat_up(&x);
            if (dir == 0) {
                cuda_rope_forward(d_x, d_pos, s.T, s.nh, s.hd, s.rd, ld, s.theta);
                cpu_rope_forward(xc.p, pos, s.T, s.nh, s.hd, s.rd, ld, s.theta);
            } else {
                cuda_rope_backward(d_x, d_pos, s.T, s.nh, s.hd, s.rd, ld, s.theta);
                cpu_rope_backward(xc.p, pos, s.T, s.nh, s.hd, s.rd, ld, s.theta);
            }
            ct_mat_down(&x, d_x);
            snprintf(what, sizeof what, "rope %s [case %zu]", dir ? "bwd" : "fwd", k);
            test_check_rel_f(what, ct_mat_dense(&x), ct_mat_dense(&xc), s.T * W, CT_BOUND_BF16_OUT);
            ct_mat_intact(what, &x);
        }
    }
}

TEST(cuda_rope_angles) {
    ct_begin();
    const int64_t T = 4096;
    int32_t *pos = (int32_t *)test_alloc(T * 4);
    for (int64_t t = 0; t < T; t++) {
        if (t < 64) pos[t] = 1000000 - (int32_t)t;                 /* the largest positions */
        else if (t < 84) pos[t] = (1 << (t - 64)) + (int32_t)(t % 3) - 1; /* around powers of two */
        else pos[t] = (int32_t)(test_uniform() * 1000000.0);
    }
    int32_t *d_pos = ct_up_i32(pos, T);
    static const struct { int rd; float theta; } cfgs[] = {{64, 1e7f}, {16, 1e4f}, {256, 1e7f}};
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        const int rd = cfgs[k].rd, half = rd / 2;
        const float theta = cfgs[k].theta;
        double worst[2] = {0, 0};
        for (int comp = 1; comp >= 0; comp--) {
            float *d_cs = (float *)ct_dev((size_t)(T * half * 2) * 4), *cs = ct_host(T * half * 2);
            cuda_rope_table(d_cs, d_pos, T, rd, theta, comp);
            ct_down_f32(cs, d_cs, T * half * 2);
            double e = 0;
            for (int64_t t = 0; t < T; t++)
                for (int i = 0; i < half; i++) {
                    const double ang = (double)pos[t] * pow((double)theta, -2.0 * i / rd);
                    const double ec = fabs(cs[2 * (t * half + i)] - cos(ang)), es = fabs(cs[2 * (t * half + i) + 1] - sin(ang));
                    e = fmax(e, fmax(ec, es));
                    if (isnan(ec) || isnan(es)) e = INFINITY;
                }
            worst[comp] = e;
        }
        printf("rope angles rd %d theta %g, pos <= 1e6: compensated fp32 max |err| %.3e <= %.1e; plain fp32 max "
               "|err| %.3e (for the record)\n",
               rd, (double)theta, worst[1], ROPE_TRIG_BOUND, worst[0]);
        EXPECT(worst[1] <= ROPE_TRIG_BOUND, "rope angles rd %d: compensated max |err| %.3e > %.1e", rd, worst[1],
               ROPE_TRIG_BOUND);
    }
}
