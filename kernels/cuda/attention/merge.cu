/*
 * merge.cu — the fp32 LSE merge of two attention partials (Backend attention_merge, cuda_attention_merge):
 * the running (out (T,nh*hd) fp32, lse (T,nh)) and a partial (out_b (T,ldb) bf16, lse_b (T,nh)) become
 * their softmax-weighted combination, as if one call had seen both key sets; a partial row that saw no
 * key (lse -inf) leaves the running row as it is. One warp per (row, head). Callers: lib/cp/cp_ring.c (the
 * ring attention's pieces), tests/cuda/test_cuda_attention.cu.
 */
#include "attention.cuh"
#include "cuda_kernels.h"

/* ---- merge ----------------------------------------------------------------------------------- */

static __global__ void attn_merge_kernel(float *out /* (T,nh*hd) running */, float *lse /* (T,nh) running */,
                                         const bf16 *out_b /* (T,ldb) */, const float *lse_b /* (T,nh) */, int64_t T,
                                         int nh, int hd, int ldb) {
    const int64_t w = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= T * nh) return;
    const float Lb = lse_b[w];
    if (Lb == -INFINITY) return; /* the partial saw no key: out_b is not read */
    const float L = lse[w];
    const int64_t t = w / nh, h = w % nh;
    float *o = out + w * hd;
    const bf16 *ob = out_b + t * ldb + h * hd;
    if (L == -INFINITY) { /* nothing merged yet: take the partial, out is not read */
        for (int d = lane; d < hd; d += 32) o[d] = __bfloat162float(ob[d]);
        __syncwarp();
        if (lane == 0) lse[w] = Lb;
        return;
    }
    const float e = expf(-fabsf(L - Lb)); /* in (0, 1] */
    const float w_hi = 1.0f / (1.0f + e), w_lo = e * w_hi;
    const float wa = L >= Lb ? w_hi : w_lo, wb = L >= Lb ? w_lo : w_hi;
    for (int d = lane; d < hd; d += 32) o[d] = wa * o[d] + wb * __bfloat162float(ob[d]);
    __syncwarp(); /* every lane has read lse[w] before it is replaced */
    if (lane == 0) lse[w] = (L >= Lb ? L : Lb) + log1pf(e);
}

extern "C" void cuda_attention_merge(float *out /* (T,nh*hd) running */, float *lse /* (T,nh) running */,
                                     const void *out_b /* (T,ldb) partial */, const float *lse_b /* (T,nh) partial */,
                                     int64_t T, int nh, int hd, int ldb) {
    RS_CHECK(T >= 0 && nh > 0 && hd > 0 && ldb >= nh * hd, "cuda_attention_merge: T = %lld, nh = %d, hd = %d, ldb = %d",
             (long long)T, nh, hd, ldb);
    if (T == 0) return;
    const int64_t warps = T * nh;
    attn_merge_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, cuda_stream()>>>(out, lse, (const bf16 *)out_b, lse_b, T,
                                                                              nh, hd, ldb);
    CUDA_LAUNCH_CHECK();
}
