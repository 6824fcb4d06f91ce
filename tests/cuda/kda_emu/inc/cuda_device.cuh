/* cuda_device.cuh (kda_emu) — the helpers of kernels/cuda/cuda_device.cuh that kda_gates.cu uses, on the host (the
 * same formulas; cuda_partials_add sums the blocks in the same order) */
#pragma once
#include "cuda_common.h"
#define CUDA_MAX_PARTIALS 256
#define CUDA_WARP 32
static inline int64_t cuda_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int cuda_partial_blocks(int64_t rows, int64_t rows_per_block_min) {
    int64_t b = cuda_ceil_div(rows, rows_per_block_min);
    if (b > CUDA_MAX_PARTIALS) b = CUDA_MAX_PARTIALS;
    return b < 1 ? 1 : (int)b;
}
static inline float cuda_sigmoidf(float x) { if (x >= 0.0f) return 1.0f / (1.0f + expf(-x)); float e = expf(x); return e / (1.0f + e); }
static inline float cuda_sigmoid_gradf(float x) { return cuda_sigmoidf(x) * cuda_sigmoidf(-x); }
static inline float cuda_softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static inline float cuda_softplus_gradf(float x) { return x > 20.0f ? 1.0f : cuda_sigmoidf(x); }
static inline void cuda_partials_add(float *out, const float *part, int nb, int64_t ncols) {
    for (int64_t c = 0; c < ncols; c++) { float s = 0; for (int b = 0; b < nb; b++) s += part[(int64_t)b * ncols + c]; out[c] += s; }
}
