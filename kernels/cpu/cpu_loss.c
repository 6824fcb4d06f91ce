/*
 * cpu_loss.c — the cpu backend's fused lm_head + cross-entropy. The T rows of x are taken in
 * chunks of `rows`; for each chunk:
 *   logits   = x W^T                                  (rows, V) fp32, in the caller's workspace
 *   loss_t   = logsumexp(logits_t) - logits_t[target]  (0 where target < 0: ignored token)
 *   dlogits  = (softmax(logits_t) - onehot) * grad_scale, in place of the logits (0 rows where
 *              ignored)
 *   dx       = dlogits W                              (written)
 *   dw      += dlogits^T x
 * so the full (T, V) logits never exist. The GEMMs are OpenBLAS cblas_sgemm.
 *
 * Implements the Backend entry lm_head_loss (lib/backend/backend.h); reached through backend_cpu by the
 * model's loss step and called directly by tests/unit/test_loss.c.
 *
 * Numerics: the log-sum-exp subtracts the row max before exponentiating (no overflow at any
 * logit scale), sums the exponentials in double in vocabulary order, and the loss is formed in
 * double as (max + log(sum)) - logit[target]; the target's dlogit is expm1(-loss) * grad_scale
 * (p - 1 without cancellation when p is near 1). dw sums the chunks in order, so the result is
 * deterministic for a given `rows` (not across different `rows`: OpenBLAS picks its GEMM
 * kernels by M, so another chunk size rounds differently, ~1e-7).
 *
 * Decisions where backend.h is silent: a target >= V is a fatal error; dx and dw may each be NULL
 * to skip that gradient (evaluation computes losses only). grad_scale is applied to dlogits, so
 * the mean loss over N counted tokens takes grad_scale = 1/N.
 */
#include <cblas.h>
#undef I /* complex.h's imaginary unit, pulled in by cblas.h; I is the MLP width in cpu_kernels.h */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "core/error.h"

void cpu_lm_head_loss(float *losses /* (T) */, void *dx_ /* (T,C) = , or NULL */, float *dw /* (V,C) +=, or NULL */,
                      const void *x_ /* (T,C) */, const void *w_ /* (V,C) */, const int32_t *targets /* (T) */,
                      float grad_scale, float *workspace /* (rows,V) */, int64_t rows, int64_t T, int C, int V) {
    RS_CHECK(T >= 0 && C > 0 && V > 0, "T %lld C %d V %d", (long long)T, C, V);
    RS_CHECK(rows > 0 && rows <= INT_MAX, "rows = %lld", (long long)rows);
    float *dx = dx_;
    const float *x = x_, *w = w_;
    for (int64_t r0 = 0; r0 < T; r0 += rows) {
        const int n = (int)(T - r0 < rows ? T - r0 : rows);
        const float *xc = x + r0 * C;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, C, 1.0f, xc, C, w, C, 0.0f, workspace, V);
        for (int r = 0; r < n; r++) {
            float *lg = workspace + (int64_t)r * V; /* logits, then dlogits */
            const int32_t target = targets[r0 + r];
            RS_CHECK(target < V, "target %d of token %lld is >= vocab size %d", target, (long long)(r0 + r), V);
            if (target < 0) {
                losses[r0 + r] = 0.0f;
                for (int v = 0; v < V; v++) lg[v] = 0.0f;
                continue;
            }
            float mx = lg[0];
            for (int v = 1; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
            double sum = 0.0;
            for (int v = 0; v < V; v++) sum += exp((double)lg[v] - mx);
            const double lse = (double)mx + log(sum);
            const double loss = lse - lg[target];
            losses[r0 + r] = (float)loss;
            for (int v = 0; v < V; v++) lg[v] = (float)(exp((double)lg[v] - lse) * grad_scale);
            lg[target] = (float)(expm1(-loss) * grad_scale); /* p - 1 without cancellation as p -> 1 */
        }
        if (dx)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, V, 1.0f, workspace, V, w, C, 0.0f,
                        dx + r0 * C, C);
        if (dw)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, n, 1.0f, workspace, V, xc, C, 1.0f, dw, C);
    }
}
