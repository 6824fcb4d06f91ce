/*
 * cuda_optim.cu — the optimizer step and the sum of squares behind the
 * gradient norm, on the cuda backend (lib/backend/backend.h: adamw_update,
 * sum_squares; the oracle is kernels/cpu/cpu_optim.c).
 *
 *   adamw_update  AdamW on the fp32 master weights, bias-corrected, decoupled
 *                 decay, per element in fp32 exactly as the cpu writes it (the
 *                 bias corrections 1 - b^step computed once on the host in
 *                 double); the bf16 compute copy the GEMMs read is refreshed
 *                 from the new p in the same pass. 4 elements per thread
 *                 (16-byte fp32 loads) where the pointers allow, one otherwise.
 *   sum_squares   sum x^2 in double, deterministic: stage 1 has a fixed number
 *                 of blocks (a function of n only), each thread sums a fixed
 *                 stride of elements, each block sums its threads in a fixed
 *                 tree into one double of the kernel scratch; stage 2, one
 *                 block, sums those in a fixed tree. The host waits for the
 *                 value (the contract returns it), and the device error word is
 *                 checked at that point.
 *
 * Callers: through backend_cuda (lib/run/train.c), tests/cuda/test_cuda_optim.cu.
 */
#include <math.h>

#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"

#define OPTIM_THREADS 256
#define SUMSQ_BLOCKS_MAX 1024

__device__ __forceinline__ float optim_adamw_one(float *p, float *m, float *v, float g, float lr, float b1, float b2,
                                                 float eps, float wd, float bc1, float bc2) {
    const float mi = b1 * *m + (1.0f - b1) * g;
    const float vi = b2 * *v + (1.0f - b2) * g * g;
    float pi = *p;
    pi -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * pi);
    *m = mi;
    *v = vi;
    *p = pi;
    return pi;
}

/* thread i updates elements [4i, 4i+4) */
__global__ void __launch_bounds__(OPTIM_THREADS) optim_adamw_kernel(float *param /* (n) */, float *m /* (n) */,
                                                                    float *v /* (n) */, bf16 *compute /* (n) or NULL */,
                                                                    const float *grad /* (n) */, int64_t n, float lr,
                                                                    float b1, float b2, float eps, float wd,
                                                                    float grad_scale, float bc1, float bc2, bool vec) {
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= n) return;
    if (vec && i + 4 <= n) {
        float4 p4 = *reinterpret_cast<float4 *>(param + i), m4 = *reinterpret_cast<float4 *>(m + i);
        float4 v4 = *reinterpret_cast<float4 *>(v + i);
        const float4 g4 = *reinterpret_cast<const float4 *>(grad + i);
        optim_adamw_one(&p4.x, &m4.x, &v4.x, g4.x * grad_scale, lr, b1, b2, eps, wd, bc1, bc2);
        optim_adamw_one(&p4.y, &m4.y, &v4.y, g4.y * grad_scale, lr, b1, b2, eps, wd, bc1, bc2);
        optim_adamw_one(&p4.z, &m4.z, &v4.z, g4.z * grad_scale, lr, b1, b2, eps, wd, bc1, bc2);
        optim_adamw_one(&p4.w, &m4.w, &v4.w, g4.w * grad_scale, lr, b1, b2, eps, wd, bc1, bc2);
        *reinterpret_cast<float4 *>(param + i) = p4;
        *reinterpret_cast<float4 *>(m + i) = m4;
        *reinterpret_cast<float4 *>(v + i) = v4;
        if (compute) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(p4.x, p4.y), hi = __floats2bfloat162_rn(p4.z, p4.w);
            *reinterpret_cast<__nv_bfloat162 *>(compute + i) = lo;
            *reinterpret_cast<__nv_bfloat162 *>(compute + i + 2) = hi;
        }
        return;
    }
    for (int64_t j = i; j < n && j < i + 4; j++) {
        const float pj = optim_adamw_one(param + j, m + j, v + j, grad[j] * grad_scale, lr, b1, b2, eps, wd, bc1, bc2);
        if (compute) compute[j] = __float2bfloat16_rn(pj);
    }
}

extern "C" void cuda_adamw_update(float *param, float *m, float *v, void *compute, const float *grad, int64_t n,
                                  float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                                  int step) {
    RS_CHECK(n >= 0, "n = %lld", (long long)n);
    RS_CHECK(step >= 1, "AdamW step %d: steps count from 1", step);
    if (!n) return;
    const float bc1 = (float)(1.0 - pow((double)beta1, step));
    const float bc2 = (float)(1.0 - pow((double)beta2, step));
    RS_CHECK(compute != (void *)param, "adamw_update: the bf16 compute copy cannot be the fp32 master weights");
    const bool vec = cuda_ptr_align(param) >= 16 && cuda_ptr_align(m) >= 16 && cuda_ptr_align(v) >= 16 &&
                     cuda_ptr_align(grad) >= 16 && (!compute || cuda_ptr_align(compute) >= 8);
    optim_adamw_kernel<<<(unsigned)cuda_ceil_div(n, 4 * OPTIM_THREADS), OPTIM_THREADS, 0, cuda_stream()>>>(
        param, m, v, (bf16 *)compute, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2, vec);
    CUDA_LAUNCH_CHECK();
}

/* stage 1: part[b] = sum over this block's grid-stride elements */
__global__ void __launch_bounds__(OPTIM_THREADS) optim_sumsq_kernel(double *part /* (gridDim.x) */,
                                                                    const float *x /* (n) */, int64_t n) {
    __shared__ double sh[CUDA_WARP];
    double s = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double d = x[i];
        s += d * d;
    }
    s = cuda_block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* stage 2: part[0] = sum of part[0..nb) (one block) */
__global__ void __launch_bounds__(OPTIM_THREADS) optim_sumsq_final_kernel(double *part, int nb) {
    __shared__ double sh[CUDA_WARP];
    double s = 0.0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
    s = cuda_block_sum(s, sh);
    if (threadIdx.x == 0) part[0] = s;
}

extern "C" double cuda_sum_squares(const float *x, int64_t n) {
    RS_CHECK(n >= 0, "n = %lld", (long long)n);
    if (!n) return 0.0;
    int64_t nb = cuda_ceil_div(n, 8 * OPTIM_THREADS);
    if (nb > SUMSQ_BLOCKS_MAX) nb = SUMSQ_BLOCKS_MAX;
    double *part = (double *)cuda_scratch((size_t)nb * sizeof(double), "sum_squares");
    optim_sumsq_kernel<<<(unsigned)nb, OPTIM_THREADS, 0, cuda_stream()>>>(part, x, n);
    CUDA_LAUNCH_CHECK();
    optim_sumsq_final_kernel<<<1, OPTIM_THREADS, 0, cuda_stream()>>>(part, (int)nb);
    CUDA_LAUNCH_CHECK();
    double s = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&s, part, sizeof s, cudaMemcpyDeviceToHost, cuda_stream()));
    cuda_error_check(); /* waits for the stream */
    return s;
}
