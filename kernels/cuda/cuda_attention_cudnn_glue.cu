/*
 * cuda_attention_cudnn_glue.cu — the small kernels around cuDNN's attention
 * calls (cuda_attention_cudnn.h): the route's metadata summary (read back to
 * the host), the LSE layout transposes between cuDNN's Stats (nh, Tq) and our
 * lse (Tq, nh) (lib/attn_cudnn_graph.h's index maps), and the fp32 += bf16
 * add of cuDNN's dq/dk/dv into our accumulators. All on the compute stream.
 *
 * Callers: kernels/cuda/cuda_attention_cudnn.c.
 */
#include <cuda_bf16.h>
#include <stdint.h>

#include "attn_cudnn_graph.h"
#include "cuda_attention_cudnn.h"
#include "cuda_common.h"

/* out[0..7] = CdgMeta: doc_min, doc_max, q_consec, k_consec, pos_q0, pos_k0, pos_q_min, pos_k_max; one block */
static __global__ void cudnn_meta_kernel(int32_t *out, const int32_t *pos_q, const int32_t *doc_q, int64_t Tq,
                                         const int32_t *pos_k, const int32_t *doc_k, int64_t Tk) {
    __shared__ int32_t s[6];
    if (threadIdx.x == 0) s[0] = INT32_MAX, s[1] = INT32_MIN, s[2] = 1, s[3] = 1, s[4] = INT32_MAX, s[5] = INT32_MIN;
    __syncthreads();
    int32_t dmin = INT32_MAX, dmax = INT32_MIN, qc = 1, kc = 1, qmin = INT32_MAX, kmax = INT32_MIN;
    const int32_t q0 = Tq ? pos_q[0] : 0, k0 = Tk ? pos_k[0] : 0;
    for (int64_t i = threadIdx.x; i < Tq + Tk; i += blockDim.x) {
        const bool isk = i >= Tq;
        const int64_t r = isk ? i - Tq : i;
        const int32_t p = isk ? pos_k[r] : pos_q[r], d = p - (isk ? doc_k[r] : doc_q[r]);
        dmin = min(dmin, d), dmax = max(dmax, d);
        if ((int64_t)p != (int64_t)(isk ? k0 : q0) + r) (isk ? kc : qc) = 0;
        if (isk) kmax = max(kmax, p);
        else qmin = min(qmin, p);
    }
    atomicMin(&s[0], dmin), atomicMax(&s[1], dmax), atomicMin(&s[2], qc), atomicMin(&s[3], kc);
    atomicMin(&s[4], qmin), atomicMax(&s[5], kmax);
    __syncthreads();
    if (threadIdx.x == 0) {
        out[0] = s[0], out[1] = s[1], out[2] = s[2], out[3] = s[3], out[4] = q0, out[5] = k0, out[6] = s[4];
        out[7] = s[5];
    }
}

static int32_t *cudnn_meta_dev, *cudnn_meta_host;

extern "C" void cuda_cudnn_meta(int32_t host_meta[8], const int32_t *pos_q, const int32_t *doc_pos_q, int64_t Tq,
                                const int32_t *pos_k, const int32_t *doc_pos_k, int64_t Tk) {
    if (!cudnn_meta_dev) {
        CUDA_CHECK(cudaMalloc(&cudnn_meta_dev, 8 * sizeof(int32_t)));
        CUDA_CHECK(cudaMallocHost(&cudnn_meta_host, 8 * sizeof(int32_t)));
    }
    cudnn_meta_kernel<<<1, 1024, 0, cuda_stream()>>>(cudnn_meta_dev, pos_q, doc_pos_q, Tq, pos_k, doc_pos_k, Tk);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(cudnn_meta_host, cudnn_meta_dev, 8 * sizeof(int32_t), cudaMemcpyDeviceToHost,
                               cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    for (int i = 0; i < 8; i++) host_meta[i] = cudnn_meta_host[i];
}

static __global__ void cudnn_transpose_kernel(float *dst, const float *src, int64_t Tq, int nh, int to_lse) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= Tq * nh) return;
    const int64_t t = i / nh;
    const int h = (int)(i % nh);
    if (to_lse) dst[cdg_lse_at(t, h, nh)] = src[cdg_stats_at(t, h, Tq)];
    else dst[cdg_stats_at(t, h, Tq)] = src[cdg_lse_at(t, h, nh)];
}

extern "C" void cuda_cudnn_stats_to_lse(float *lse, const float *stats, int64_t Tq, int nh) {
    const int64_t n = Tq * nh;
    if (!n) return;
    cudnn_transpose_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(lse, stats, Tq, nh, 1);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_cudnn_lse_to_stats(float *stats, const float *lse, int64_t Tq, int nh) {
    const int64_t n = Tq * nh;
    if (!n) return;
    cudnn_transpose_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(stats, lse, Tq, nh, 0);
    CUDA_LAUNCH_CHECK();
}

static __global__ void cudnn_add_bf16_kernel(float *dst, const __nv_bfloat16 *src, int64_t rows, int cols, int ld_dst,
                                             int ld_src) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    const int64_t r = i / cols;
    const int c = (int)(i % cols);
    dst[r * ld_dst + c] += __bfloat162float(src[r * ld_src + c]);
}

extern "C" void cuda_cudnn_add_bf16(float *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src) {
    const int64_t n = rows * cols;
    if (!n) return;
    cudnn_add_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(
        dst, (const __nv_bfloat16 *)src, rows, cols, ld_dst, ld_src);
    CUDA_LAUNCH_CHECK();
}
