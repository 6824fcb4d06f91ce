/*
 * cuda_loss.cu — the fused lm_head + cross-entropy of the cuda backend
 * (lib/backend.h: lm_head_loss; the oracle is kernels/cpu/cpu_loss.c). The T
 * rows of x go in chunks of `rows`; per chunk of n rows:
 *   logits  = x W^T               cuBLASLt, bf16 operands, fp32 into the workspace (n, V)
 *   loss_t  = logsumexp - logit[target]      one block per row, fp32 (0 where target < 0)
 *   dlogits = (softmax - onehot) grad_scale  bf16, written over the row's own logits
 *   dx      = dlogits W           cuBLASLt, bf16 out (=)
 *   dw     += dlogits^T x         cuBLASLt, fp32 C, beta 1
 * so the full (T, V) logits never exist and no memory beyond the caller's
 * workspace is used.
 *
 * In-place bf16 dlogits: row r's fp32 logits occupy bytes [4Vr, 4V(r+1)) of
 * the workspace; its bf16 dlogits go to the first half of the same bytes,
 * [4Vr, 4Vr + 2V), i.e. a bf16 matrix of stride 2V, which the two GEMMs read
 * as it is. The block walks the row in steps of LOSS_UNROLL x blockDim
 * elements: it reads a step's logits, waits at a barrier, then writes that
 * step's bf16 values, which overlap only logits of this step or earlier ones
 * (already read).
 *
 * Numerics: per thread an online max and sum of exp (fp32), combined across
 * the block in a fixed order; the target's dlogit is expm1(-loss) grad_scale
 * (p - 1 without cancellation, as on cpu). dlogits are rounded to bf16 for
 * the tensor-core GEMMs (the cpu keeps fp32): dx and dw carry that rounding
 * (tests/cuda/README.md states the bound). A target >= V is recorded in the
 * device error word and its row is treated as ignored. dx or dw NULL skips
 * that gradient, both NULL skip the dlogits.
 *
 * Callers: through backend_cuda (lib/model_step.c), tests/cuda/test_cuda_loss.cu.
 */
#include <limits.h>
#include <math.h>

#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_gemm.h"
#include "cuda_kernels.h"

#define LOSS_THREADS 512
#define LOSS_UNROLL 4 /* logits per thread between two barriers of the dlogits pass */

__global__ void __launch_bounds__(LOSS_THREADS) loss_row_kernel(float *losses /* (n) */,
                                                                float *logits /* (n, V) fp32; bf16 dlogits out */,
                                                                const int32_t *targets /* (n) */, int64_t row0, int V,
                                                                float grad_scale, bool want_grad, int *err) {
    __shared__ float sh[CUDA_WARP];
    __shared__ float sh_target_logit;
    const int64_t r = blockIdx.x;
    float *lg = logits + r * (int64_t)V;
    int32_t target = targets[r];
    if (target >= V) {
        if (threadIdx.x == 0) cuda_raise(err, CUDA_ERR_TARGET_ID, row0 + r, target);
        target = -1;
    }
    if (target < 0) {
        if (threadIdx.x == 0) losses[r] = 0.0f;
        if (want_grad) {
            bf16 *dl = reinterpret_cast<bf16 *>(lg);
            for (int v = threadIdx.x; v < V; v += blockDim.x) dl[v] = __float2bfloat16_rn(0.0f);
        }
        return;
    }
    /* pass 1: max and sum of exp, online */
    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        const float l = lg[v];
        if (l > m) {
            s = s * expf(m - l) + 1.0f;
            m = l;
        } else {
            s += expf(l - m);
        }
    }
    if (threadIdx.x == 0) sh_target_logit = lg[target];
    /* block max, then the sum rescaled to it */
    float mw = cuda_warp_max(m);
    if (threadIdx.x % CUDA_WARP == 0) sh[threadIdx.x / CUDA_WARP] = mw;
    __syncthreads();
    float M = -INFINITY;
    for (int k = 0; k < (int)(blockDim.x / CUDA_WARP); k++) M = fmaxf(M, sh[k]);
    __syncthreads();
    const float S = cuda_block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), sh);
    const float lse = M + logf(S);
    const float loss = lse - sh_target_logit;
    if (threadIdx.x == 0) losses[r] = loss;
    if (!want_grad) return;
    /* pass 2: bf16 dlogits over the first half of the row's bytes, a step of LOSS_UNROLL x blockDim
     * elements at a time (the values of step [base, e) land in bytes [2 base, 2 e): logits < e, read) */
    bf16 *dl = reinterpret_cast<bf16 *>(lg);
    const float d_target = expm1f(-loss) * grad_scale;
    for (int base = 0; base < V; base += LOSS_UNROLL * blockDim.x) {
        float l[LOSS_UNROLL];
#pragma unroll
        for (int k = 0; k < LOSS_UNROLL; k++) {
            const int v = base + k * blockDim.x + threadIdx.x;
            l[k] = v < V ? lg[v] : 0.0f;
        }
        __syncthreads(); /* every logit of this step is read before any of its bf16 values lands */
#pragma unroll
        for (int k = 0; k < LOSS_UNROLL; k++) {
            const int v = base + k * blockDim.x + threadIdx.x;
            if (v < V) dl[v] = __float2bfloat16_rn(v == target ? d_target : expf(l[k] - lse) * grad_scale);
        }
    }
}

extern "C" void cuda_lm_head_loss(float *losses, void *dx, float *dw, const void *x, const void *w,
                                  const int32_t *targets, float grad_scale, float *workspace, int64_t rows, int64_t T,
                                  int C, int V) {
    RS_CHECK(T >= 0 && C > 0 && V > 0, "T %lld C %d V %d", (long long)T, C, V);
    RS_CHECK(rows > 0 && rows <= INT_MAX, "rows = %lld", (long long)rows);
    const bf16 *xb = (const bf16 *)x;
    const bool want_grad = dx || dw;
    for (int64_t r0 = 0; r0 < T; r0 += rows) {
        const int64_t n = T - r0 < rows ? T - r0 : rows;
        cuda_gemm(workspace, 1, V, xb + r0 * C, C, 0, w, C, 1, n, V, C, 0);
        loss_row_kernel<<<(unsigned)n, LOSS_THREADS, 0, cuda_stream()>>>(losses + r0, workspace, targets + r0, r0, V,
                                                                        grad_scale, want_grad, cuda_error_word());
        CUDA_LAUNCH_CHECK();
        const bf16 *dl = (const bf16 *)workspace; /* (n, 2V): the first V of each row */
        if (dx) cuda_gemm((bf16 *)dx + r0 * C, 0, C, dl, 2 * (int64_t)V, 0, w, C, 0, n, C, V, 0);
        if (dw) cuda_gemm(dw, 1, C, dl, 2 * (int64_t)V, 1, xb + r0 * C, C, 0, V, C, n, 1);
    }
}
