/*
 * kda_gates.cu — Kimi Delta Attention's gates on the GPU: the Backend entries kda_gates_forward / _backward
 * (lib/backend/backend.h; the oracle is cpu_kda_gates_* in kernels/cpu/cpu_elementwise.c). Per token t, value
 * head h and key channel c (w = nv dk columns):
 *   beta[t,h] = sigmoid(b[t,h]),  g[t,h,c] = -exp(A_log[h]) softplus(f[t, h dk + c] + dt_bias[h dk + c])
 * (softplus linear above 20), fp32 from bf16 b and f. The backward: db = dbeta beta (1 - beta), df = dg
 * (-exp(A_log)) softplus'(x) (bf16), ddt_bias += df and dA_log[h] += dg g summed over the tokens (and the head's
 * channels), deterministically: blocks own fixed row ranges, per column in row order within a block, then the
 * blocks in order (cuda_partials_add), then dA_log's channels in order. One thread per element (forward) or per
 * column of a block's rows (backward).
 *
 * Callers: the cuda backend table (lib/model/model_block.c's KDA layers), tests/cuda/test_cuda_kda.cu.
 */
#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_setup.h" /* CUDA_SCRATCH_BYTES */

#define KG_THREADS 256
#define KG_ROWS 64 /* rows per block of the backward, at least */

__global__ void __launch_bounds__(KG_THREADS) kda_gates_forward_kernel(float *beta /* (T,nv) */,
                                                                       float *g /* (T,nv,dk) */,
                                                                       const bf16 *b /* (T,ldb) */,
                                                                       const bf16 *f /* (T,ldf) */,
                                                                       const float *A_log, const float *dt_bias,
                                                                       int64_t T, int nv, int dk, int ldb, int ldf) {
    const int64_t w = (int64_t)nv * dk, idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * w) return;
    const int64_t t = idx / w;
    const int col = (int)(idx % w), h = col / dk;
    if (col % dk == 0) beta[t * nv + h] = cuda_sigmoidf(__bfloat162float(b[t * ldb + h]));
    g[idx] = -expf(A_log[h]) * cuda_softplusf(__bfloat162float(f[t * ldf + col]) + dt_bias[col]);
}

/* per block (rows [r0, r1)): db, df; part_dt[blk][col] = sum of df, part_A[blk][col] = sum of dg g, in row order */
__global__ void __launch_bounds__(KG_THREADS) kda_gates_backward_kernel(
    bf16 *db /* (T,ldb) */, bf16 *df /* (T,ldf) */, float *part_A /* (nb, nv dk) */, float *part_dt /* (nb, nv dk) */,
    const float *dbeta /* (T,nv) */, const float *dg /* (T,nv,dk) */, const bf16 *b, const bf16 *f,
    const float *A_log, const float *dt_bias, int64_t T, int64_t rows_per_block, int nv, int dk, int ldb, int ldf) {
    const int w = nv * dk;
    const int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= w) return;
    const int h = col / dk;
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_block, r1 = min(T, r0 + rows_per_block);
    const float A = expf(A_log[h]), dtb = dt_bias[col];
    float acc_A = 0.0f, acc_dt = 0.0f;
    for (int64_t t = r0; t < r1; t++) {
        const float x = __bfloat162float(f[t * ldf + col]) + dtb, dgt = dg[t * w + col];
        const float dft = dgt * -A * cuda_softplus_gradf(x);
        acc_A += dgt * (-A * cuda_softplusf(x));
        acc_dt += dft;
        df[t * ldf + col] = __float2bfloat16_rn(dft);
        if (col % dk == 0)
            db[t * ldb + h] =
                __float2bfloat16_rn(dbeta[t * nv + h] * cuda_sigmoid_gradf(__bfloat162float(b[t * ldb + h])));
    }
    part_A[(int64_t)blockIdx.x * w + col] = acc_A;
    part_dt[(int64_t)blockIdx.x * w + col] = acc_dt;
}

/* dA_log[h] += sum_c sumA[h dk + c], in channel order */
__global__ void kda_gates_alog_kernel(float *dA_log /* (nv) */, const float *sumA /* (nv dk) */, int nv, int dk) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= nv) return;
    float s = 0.0f;
    for (int c = 0; c < dk; c++) s += sumA[(int64_t)h * dk + c];
    dA_log[h] += s;
}

extern "C" void cuda_kda_gates_forward(float *beta, float *g, const void *b, const void *f, const float *A_log,
                                       const float *dt_bias, int64_t T, int nv, int dk, int ldb, int ldf) {
    RS_CHECK(T >= 0 && nv > 0 && dk > 0 && ldb >= nv && ldf >= nv * dk, "kda gates: T %lld nv %d dk %d ldb %d ldf %d",
             (long long)T, nv, dk, ldb, ldf);
    if (!T) return;
    const int64_t n = T * nv * dk;
    kda_gates_forward_kernel<<<(unsigned)cuda_ceil_div(n, KG_THREADS), KG_THREADS, 0, cuda_stream()>>>(
        beta, g, (const bf16 *)b, (const bf16 *)f, A_log, dt_bias, T, nv, dk, ldb, ldf);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_kda_gates_backward(void *db, void *df, float *dA_log, float *ddt_bias, const float *dbeta,
                                        const float *dg, const void *b, const void *f, const float *A_log,
                                        const float *dt_bias, int64_t T, int nv, int dk, int ldb, int ldf) {
    RS_CHECK(T >= 0 && nv > 0 && dk > 0 && ldb >= nv && ldf >= nv * dk, "kda gates: T %lld nv %d dk %d ldb %d ldf %d",
             (long long)T, nv, dk, ldb, ldf);
    if (!T) return;
    const int w = nv * dk;
    int nb = cuda_partial_blocks(T, KG_ROWS);
    const size_t cap = (CUDA_SCRATCH_BYTES / sizeof(float) - (size_t)w) / (2 * (size_t)w); /* fit the scratch */
    if ((size_t)nb > cap) nb = cap > 0 ? (int)cap : 1;
    const int64_t rpb = cuda_ceil_div(T, nb);
    float *part = (float *)cuda_scratch((2 * (size_t)nb + 1) * w * sizeof(float), "kda_gates_backward");
    float *sumA = part + 2 * (size_t)nb * w;
    kda_gates_backward_kernel<<<dim3((unsigned)nb, (unsigned)cuda_ceil_div(w, KG_THREADS)), KG_THREADS, 0,
                                cuda_stream()>>>((bf16 *)db, (bf16 *)df, part, part + (size_t)nb * w, dbeta, dg,
                                                 (const bf16 *)b, (const bf16 *)f, A_log, dt_bias, T, rpb, nv, dk,
                                                 ldb, ldf);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaMemsetAsync(sumA, 0, (size_t)w * sizeof(float), cuda_stream()));
    cuda_partials_add(sumA, part, nb, w);
    cuda_partials_add(ddt_bias, part + (size_t)nb * w, nb, w);
    kda_gates_alog_kernel<<<(unsigned)cuda_ceil_div(nv, 64), 64, 0, cuda_stream()>>>(dA_log, sumA, nv, dk);
    CUDA_LAUNCH_CHECK();
}
