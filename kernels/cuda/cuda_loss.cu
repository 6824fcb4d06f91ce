/*
 * cuda_loss.cu — the fused lm_head + cross-entropy of the cuda backend (lib/backend/backend.h:
 * lm_head_loss; the oracle is kernels/cpu/cpu_loss.c). The T rows of x go in chunks of `rows`; per chunk:
 *   logits  = x W^T               cuBLASLt, bf16 operands, fp32 into the workspace (n, V)
 *   loss_t  = logsumexp - logit[target]      one cluster per row, fp32 (0 where target < 0)
 *   dlogits = (softmax - onehot) grad_scale  bf16, written over the row's own logits
 *   dx      = dlogits W           cuBLASLt, bf16 out (=)
 *   dw     += dlogits^T x         cuBLASLt, fp32 C, beta 1
 * so the full (T, V) logits never exist and no memory beyond the caller's workspace is used.
 *
 * The loss kernel reads each logit from HBM once (a row of fp32 logits does not stay in L2 across two
 * passes): a row is split over a cluster of LOSS_CLUSTER blocks, each copies its slice into shared
 * memory and takes the slice's max and sum of exp; after a cluster barrier every block combines the
 * cluster's (max, sum) pairs through distributed shared memory in rank order (the same lse in every
 * block) and writes its slice's bf16 dlogits from shared memory. In place: row r's fp32 logits occupy
 * bytes [4Vr, 4V(r+1)) of the workspace, its bf16 dlogits the first half of them (a bf16 matrix of stride
 * 2V, which the GEMMs read as it is); a block's writes land in other blocks' slices of the same row only
 * after the barrier that follows every slice's copy.
 *
 * Numerics: per block e = exp(l - M_b) and their fixed-order sum S_b; the cluster sums S_b exp(M_b - M) in
 * rank order; a dlogit is e exp(M_b - lse) grad_scale, the target's expm1(-loss) grad_scale (p - 1 without
 * cancellation, as on cpu). dlogits are rounded to bf16 for the tensor-core GEMMs (the cpu keeps fp32), so
 * dx and dw carry that rounding (tests/cuda/README.md states the bound). A target >= V is recorded in the
 * device error word and its row treated as ignored. dx or dw NULL skips that gradient, both NULL the
 * dlogits.
 *
 * Callers: through backend_cuda (lib/model/model_step.c), tests/cuda/test_cuda_loss.cu; cuda_loss_rows alone:
 * bench/cuda/loss_timing.cu.
 */
#include <cooperative_groups.h>
#include <limits.h>
#include <math.h>

#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_gemm.h"
#include "cuda_kernels.h"

namespace cg = cooperative_groups;

#define LOSS_THREADS 512
#define LOSS_CLUSTER 8                   /* blocks (one cluster) per row, each holding a slice of it */
#define LOSS_SLICE_MAX_BYTES (200 << 10) /* a slice's fp32 logits in shared memory, at most */

/* slice length of a row: ceil(V / LOSS_CLUSTER) rounded up to 4 (float4 reads, 8-byte bf16 writes) */
static int loss_slice(int V) { return (int)cuda_ceil_div(cuda_ceil_div(V, LOSS_CLUSTER), 4) * 4; }

/* One cluster per row r; block `rank` owns the logits [rank S, min(V, (rank+1) S)). `vec`: V % 4 == 0 and
 * the workspace 16-byte aligned (every row and slice start is then 16-byte aligned). */
__global__ void __cluster_dims__(LOSS_CLUSTER, 1, 1) __launch_bounds__(LOSS_THREADS)
    loss_row_kernel(float *losses /* (n) */, float *logits /* (n, V) fp32; bf16 dlogits out */,
                    const int32_t *targets /* (n) */, int64_t row0, int V, int S, float grad_scale, bool want_grad,
                    bool vec, int *err) {
    extern __shared__ float4 sl4[]; /* (S) fp32: this block's slice of the row */
    float *sl = reinterpret_cast<float *>(sl4);
    __shared__ float sh[CUDA_WARP];
    __shared__ float sh_stat[3]; /* the slice's max, sum of exp(l - max), target logit: read by the cluster */
    __shared__ float sh_res[2];  /* lse, loss */
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int64_t r = blockIdx.x / LOSS_CLUSTER;
    float *lg = logits + r * (int64_t)V;
    bf16 *dl = reinterpret_cast<bf16 *>(lg);
    const int v0 = rank * S, len = max(0, min(V, v0 + S) - v0);
    int32_t target = targets[r];
    if (target >= V) {
        if (rank == 0 && threadIdx.x == 0) cuda_raise(err, CUDA_ERR_TARGET_ID, row0 + r, target);
        target = -1;
    }
    if (target < 0) { /* the same branch in every block of the cluster: none reads the row */
        if (rank == 0 && threadIdx.x == 0) losses[r] = 0.0f;
        if (want_grad)
            for (int i = threadIdx.x; i < len; i += blockDim.x) dl[v0 + i] = __float2bfloat16_rn(0.0f);
        return;
    }
    /* the slice into shared memory (read once from global), its max on the way */
    float m = -INFINITY;
    if (vec) {
        const float4 *src = reinterpret_cast<const float4 *>(lg + v0);
        const int n4 = len / 4;
        for (int i = threadIdx.x; i < n4; i += 4 * blockDim.x) {
            float4 q[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int j = i + k * blockDim.x;
                if (j < n4) q[k] = __ldcs(src + j);
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int j = i + k * blockDim.x;
                if (j < n4) {
                    sl4[j] = q[k];
                    m = fmaxf(m, fmaxf(fmaxf(q[k].x, q[k].y), fmaxf(q[k].z, q[k].w)));
                }
            }
        }
    } else {
        for (int i = threadIdx.x; i < len; i += blockDim.x) {
            const float l = lg[v0 + i];
            sl[i] = l;
            m = fmaxf(m, l);
        }
    }
    const float mw = cuda_warp_max(m);
    if (threadIdx.x % CUDA_WARP == 0) sh[threadIdx.x / CUDA_WARP] = mw;
    __syncthreads();
    float Mb = -INFINITY;
    for (int k = 0; k < (int)(blockDim.x / CUDA_WARP); k++) Mb = fmaxf(Mb, sh[k]);
    if (threadIdx.x == 0 && target >= v0 && target < v0 + len) sh_stat[2] = sl[target - v0];
    __syncthreads();
    /* e = exp(l - Mb) over the logits in shared memory: the dlogits below are e exp(Mb - lse) */
    float s = 0.0f;
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const float e = expf(sl[i] - Mb);
        sl[i] = e;
        s += e;
    }
    const float Sb = cuda_block_sum(s, sh);
    if (threadIdx.x == 0) {
        sh_stat[0] = Mb;
        sh_stat[1] = Sb;
    }
    cluster.sync(); /* every slice is in shared memory (so the bf16 writes below may land anywhere in the row) */
    if (threadIdx.x == 0) { /* the same sums, in rank order, in every block of the cluster */
        float Mk[LOSS_CLUSTER], Sk[LOSS_CLUSTER];
#pragma unroll
        for (int k = 0; k < LOSS_CLUSTER; k++) {
            const float *st = cluster.map_shared_rank(sh_stat, k);
            Mk[k] = st[0];
            Sk[k] = st[1];
        }
        float M = -INFINITY, Ssum = 0.0f;
#pragma unroll
        for (int k = 0; k < LOSS_CLUSTER; k++) M = fmaxf(M, Mk[k]);
#pragma unroll
        for (int k = 0; k < LOSS_CLUSTER; k++)
            if (Mk[k] != -INFINITY) Ssum += Sk[k] * expf(Mk[k] - M);
        const float tl = cluster.map_shared_rank(sh_stat, target / S)[2];
        const float lse = M + logf(Ssum);
        sh_res[0] = lse;
        sh_res[1] = lse - tl;
    }
    cluster.sync(); /* the remote reads are done (a block may exit), sh_res is visible */
    const float lse = sh_res[0], loss = sh_res[1];
    if (rank == 0 && threadIdx.x == 0) losses[r] = loss;
    if (!want_grad) return;
    /* bf16 dlogits from the slice, over the first half of the row's bytes */
    const float d_target = expm1f(-loss) * grad_scale, sc = expf(Mb - lse) * grad_scale;
    if (vec) {
        const int n4 = len / 4;
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            const float4 q = sl4[i];
            const int v = v0 + 4 * i;
            float d[4] = {q.x * sc, q.y * sc, q.z * sc, q.w * sc};
            if (target >= v && target < v + 4) d[target - v] = d_target;
            uint2 u;
            __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
            h[0] = __floats2bfloat162_rn(d[0], d[1]);
            h[1] = __floats2bfloat162_rn(d[2], d[3]);
            *reinterpret_cast<uint2 *>(dl + v) = u;
        }
    } else {
        for (int i = threadIdx.x; i < len; i += blockDim.x) {
            const int v = v0 + i;
            dl[v] = __float2bfloat16_rn(v == target ? d_target : sl[i] * sc);
        }
    }
}

/* the loss pass over n rows of fp32 logits (n, V) at `logits`: losses, and with want_grad the bf16 dlogits over
 * them in place (stride 2V). Called per row chunk by cuda_lm_head_loss; bench/cuda/loss_timing.cu times it alone. */
extern "C" void cuda_loss_rows(float *losses /* (n) */, float *logits /* (n, V) */, const int32_t *targets /* (n) */,
                               int64_t row0, int64_t n, int V, float grad_scale, int want_grad) {
    RS_CHECK(n >= 0 && n <= INT_MAX / LOSS_CLUSTER && V > 0, "n %lld V %d", (long long)n, V);
    if (n == 0) return;
    const int S = loss_slice(V);
    const size_t slice_bytes = (size_t)S * sizeof(float);
    RS_CHECK(slice_bytes <= LOSS_SLICE_MAX_BYTES, "lm_head_loss: V = %d needs %zu bytes of shared memory per block (%d)",
             V, slice_bytes, LOSS_SLICE_MAX_BYTES);
    CUDA_CHECK(cudaFuncSetAttribute(loss_row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)slice_bytes));
    /* all of the SM's 228 KiB to shared memory: three blocks of a 74 KiB slice fit, not two */
    CUDA_CHECK(cudaFuncSetAttribute(loss_row_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
    const bool vec = V % 4 == 0 && cuda_ptr_align(logits) >= 16;
    loss_row_kernel<<<(unsigned)(n * LOSS_CLUSTER), LOSS_THREADS, slice_bytes, cuda_stream()>>>(
        losses, logits, targets, row0, V, S, grad_scale, want_grad != 0, vec, cuda_error_word());
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_lm_head_loss(float *losses, void *dx, float *dw, const void *x, const void *w,
                                  const int32_t *targets, float grad_scale, float *workspace, int64_t rows, int64_t T,
                                  int C, int V) {
    RS_CHECK(T >= 0 && C > 0 && V > 0, "T %lld C %d V %d", (long long)T, C, V);
    RS_CHECK(rows > 0 && rows <= INT_MAX / LOSS_CLUSTER, "rows = %lld", (long long)rows);
    const bf16 *xb = (const bf16 *)x;
    for (int64_t r0 = 0; r0 < T; r0 += rows) {
        const int64_t n = T - r0 < rows ? T - r0 : rows;
        cuda_gemm(workspace, 1, V, xb + r0 * C, C, 0, w, C, 1, n, V, C, 0);
        cuda_loss_rows(losses + r0, workspace, targets + r0, r0, n, V, grad_scale, dx || dw);
        const bf16 *dl = (const bf16 *)workspace; /* (n, 2V): the first V of each row */
        if (dx) cuda_gemm((bf16 *)dx + r0 * C, 0, C, dl, 2 * (int64_t)V, 0, w, C, 0, n, C, V, 0);
        if (dw) cuda_gemm(dw, 1, C, dl, 2 * (int64_t)V, 1, xb + r0 * C, C, 0, V, C, n, 1);
    }
}
