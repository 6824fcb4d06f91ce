/*
 * cpu_rope.c — the cpu backend's partial rotary position embedding (docs/design/model.md), in place on q or
 * k: only the first rd dims of every head rotate, with rotate-half (NeoX) pairing inside them:
 * for i < rd/2, angle = pos * theta^(-2i/rd),
 *   x_i' = x_i cos - x_{i+rd/2} sin,   x_{i+rd/2}' = x_{i+rd/2} cos + x_i sin;
 * dims [rd, hd) pass through. The backward is the inverse (transposed) rotation of the gradient.
 *
 * Implements the Backend entries rope_forward/rope_backward (lib/backend/backend.h); reached through
 * backend_cpu by the model code and called directly by tests/unit/test_rope.c.
 *
 * Long context: at pos ~ 1e6 an fp32 angle is off by up to ~0.03 rad (half an ulp of 1e6 in fp32
 * is 0.031), so inv_freq, the angle, cos and sin are all computed in double here, and the
 * rotation of each pair too; only the result is rounded to fp32. The (cos, sin) of a token are
 * computed once and used for every head.
 */
#include <math.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "core/error.h"

/* dir = +1: the forward rotation; dir = -1: its inverse */
static void rope_rotate(float *x /* (T,ld) nh heads of hd */, const int32_t *pos /* (T) */, int64_t T, int nh,
                        int hd, int rd, int ld, float theta, int dir) {
    RS_CHECK(T >= 0 && nh > 0 && hd > 0, "T %lld nh %d hd %d", (long long)T, nh, hd);
    RS_CHECK(rd >= 0 && rd <= hd && rd % 2 == 0, "rotary dims rd = %d must be even and <= hd = %d", rd, hd);
    RS_CHECK(ld >= nh * hd, "ld %d < nh*hd = %d", ld, nh * hd);
    RS_CHECK(theta > 0.0f, "theta = %g", (double)theta);
    const int half = rd / 2;
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            double inv_freq = pow((double)theta, -2.0 * i / rd);
            double angle = (double)pos[t] * inv_freq;
            double c = cos(angle), s = dir * sin(angle);
            for (int h = 0; h < nh; h++) {
                float *xh = x + t * ld + (int64_t)h * hd;
                double x0 = xh[i], x1 = xh[i + half];
                xh[i] = (float)(x0 * c - x1 * s);
                xh[i + half] = (float)(x1 * c + x0 * s);
            }
        }
    }
}

void cpu_rope_forward(void *x /* (T,ld) nh heads of hd, in place */, const int32_t *pos /* (T) */, int64_t T, int nh,
                      int hd, int rd, int ld, float theta) {
    rope_rotate(x, pos, T, nh, hd, rd, ld, theta, +1);
}

void cpu_rope_backward(void *dx /* (T,ld) nh heads of hd, in place */, const int32_t *pos /* (T) */, int64_t T,
                       int nh, int hd, int rd, int ld, float theta) {
    rope_rotate(dx, pos, T, nh, hd, rd, ld, theta, -1);
}
