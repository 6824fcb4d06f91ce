/*
 * cpu_optim.c — the cpu backend's optimizer step and the sum of squares behind the gradient
 * norm.
 *   adamw_update: AdamW on fp32 master weights, bias-corrected, decoupled weight decay, exactly
 *     the formula of lib/backend/backend.h:
 *       g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *       p -= lr * (m/(1-b1^step) / (sqrt(v/(1-b2^step)) + eps) + wd * p)
 *     (the decay term uses p before this step). The bias corrections 1 - b^step are computed once
 *     in double; the per-element arithmetic is fp32, as on cuda. `compute` (the activation-type
 *     copy the GEMMs read) gets a copy of the updated p when it is not NULL and not p itself.
 *   sum_squares: sum of x^2 in double, in index order (deterministic; fp32 squares would lose
 *     the small gradients of a large model).
 * Implements the Backend entries of the same names (lib/backend/backend.h); reached through backend_cpu
 * by lib/run/train.c and called directly by tests/unit/test_optim.c.
 */
#include <math.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "core/error.h"

void cpu_adamw_update(float *param /* (n) */, float *m /* (n) */, float *v /* (n) */, void *compute_ /* (n) or NULL */,
                      const float *grad /* (n) */, int64_t n, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float grad_scale, int step) {
    RS_CHECK(n >= 0, "n = %lld", (long long)n);
    RS_CHECK(step >= 1, "AdamW step %d: steps count from 1", step);
    const float bc1 = (float)(1.0 - pow((double)beta1, step));
    const float bc2 = (float)(1.0 - pow((double)beta2, step));
    float *compute = compute_ == (void *)param ? NULL : compute_;
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        float p = param[i];
        p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + weight_decay * p);
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
        if (compute) compute[i] = p;
    }
}

double cpu_sum_squares(const float *x /* (n) */, int64_t n) {
    RS_CHECK(n >= 0, "n = %lld", (long long)n);
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}
