/*
 * cuda_norm.cuh — what the normalisation kernels of kernels/cuda share (C++ only): the rows-per-block and
 * shared-memory rules of the row kernels' backward (warps x D fp32 slices of the dw sums), and the group
 * sums of the group kernels (a row = LPR lanes x 8 columns, butterflies inside the group: fixed order).
 *
 * Callers: cuda_norm.cu (L2 norm, GDN split, gated RMSNorm), cuda_rmsnorm.cu (RMSNorm).
 */
#ifndef RS_CUDA_NORM_CUH
#define RS_CUDA_NORM_CUH

#include "cuda_common.h"
#include "cuda_device.cuh"

#define NORM_WARPS 8          /* rows (warps) per block of the forward kernels */
#define NORM_SMEM_DEFAULT 49152
#define NORM_SMEM_MAX (227 * 1024)
#define L2NORM_EPS 1e-6f      /* on the sum of squares (docs/design/model.md) */

static inline int norm_rows_blocks(int64_t rows) { return (int)cuda_ceil_div(rows, NORM_WARPS); }

/* Warps per block of a backward with dw: the shared slices (warps x D fp32) fit the default 48 KiB
 * when they can; a single warp's slice beyond that asks for more shared memory. */
static inline int norm_bwd_warps(int D, size_t *smem) {
    int nw = 8;
    while (nw > 1 && (size_t)nw * D * sizeof(float) > NORM_SMEM_DEFAULT) nw >>= 1;
    *smem = (size_t)nw * D * sizeof(float);
    RS_CHECK(*smem <= NORM_SMEM_MAX, "norm backward: row width %d needs %zu bytes of shared memory (at most %d)", D,
             *smem, NORM_SMEM_MAX);
    return nw;
}

template <typename K>
static inline void norm_allow_smem(K kernel, size_t smem) {
    if (smem > NORM_SMEM_DEFAULT)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

#define NORM_GROUP_THREADS 512 /* threads per block of the group kernels (L2 norm, gated RMSNorm, RMSNorm bwd) */

/* sum over the LPR lanes of a row's group (butterfly inside the group: fixed order) */
template <int LPR>
__device__ __forceinline__ float norm_group_sum(float v) {
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif
