/*
 * cuda_gdn_mma.h — the warp-level tensor-core pieces the Gated DeltaNet kernels
 * (gdn/gdn.cu) are built from, over the PTX wrappers of cuda_ptx.h (ldmatrix,
 * mma.sync m16n8k16 bf16 -> fp32, cp.async with zero fill): the accumulator
 * coordinates, zeroing, and one warp GEMM that multiplies tiles held in shared memory in any of the
 * four transpose combinations the chunked delta rule needs (K K^T, T^T dW,
 * K^T v, dS^T Q, ...). Header-only so that tests/cuda/test_cuda_gdn.cu can
 * check the fragment layouts on their own.
 *
 * Fragment layout of mma.m16n8k16 (PTX ISA), g = lane / 4, t = lane % 4:
 *   A 16x16 row-major: a0a1 (row g, cols 2t..2t+1), a2a3 (row g+8), a4a5 (row g, cols 2t+8..),
 *                      a6a7 (row g+8, cols 2t+8..)
 *   B 16x8:            b0b1 (rows 2t..2t+1, col g), b2b3 (rows 2t+8..2t+9, col g)
 *   C 16x8 fp32:       c0c1 (row g, cols 2t..2t+1), c2c3 (row g+8, cols 2t..2t+1)
 * gdn_frag_row / gdn_frag_col give an accumulator element's coordinates.
 *
 * Shared-memory tiles are row-major bf16 with a row stride (ld, in elements)
 * that is a multiple of 8 (16-byte rows for ldmatrix) and, to avoid bank
 * conflicts, not a multiple of 64: the kernels pad every row by 8 elements.
 */
#ifndef RS_CUDA_GDN_MMA_H
#define RS_CUDA_GDN_MMA_H

#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda_ptx.h"

#define GDN_DEV __device__ __forceinline__

/* N bf16 zeros (N % 8 == 0, 16-byte aligned) at p in shared memory, generic stores */
template <int N> GDN_DEV void gdn_zero_row(__nv_bfloat16 *p) {
#pragma unroll
    for (int i = 0; i < N / 8; i++) ((uint4 *)p)[i] = make_uint4(0u, 0u, 0u, 0u);
}

/* coordinates of accumulator element e (0..3) of a 16x8 tile whose corner is (0, 0) */
GDN_DEV int gdn_frag_row(int e) { return ((threadIdx.x & 31) >> 2) + ((e >> 1) << 3); }
GDN_DEV int gdn_frag_col(int e) { return ((threadIdx.x & 3) << 1) + (e & 1); }

/*
 * One warp: acc[mi][ni] (16x8 tiles, rows m0 + 16 mi, cols n0 + 8 ni) += A B over k in [0, KD).
 *   AT == false: A is stored row-major (rows m, cols k) at sA, row stride lda.
 *   AT == true:  A = X^T, X stored row-major (rows k, cols m) at sA.
 *   BT == false: B is stored row-major (rows k, cols n) at sB, row stride ldb.
 *   BT == true:  B = Z^T, Z stored row-major (rows n, cols k) at sB.
 * NT must be even (two n tiles per ldmatrix.x4), KD a multiple of 16.
 */
template <int MT, int NT, bool AT, bool BT, int KD>
GDN_DEV void gdn_warp_mma(float (&acc)[MT][NT][4], const __nv_bfloat16 *sA, int lda, const __nv_bfloat16 *sB, int ldb,
                          int m0, int n0) {
    static_assert(NT % 2 == 0 && KD % 16 == 0, "gdn_warp_mma: NT even, KD multiple of 16");
    const int lane = threadIdx.x & 31, r8 = lane & 7, i1 = (lane >> 3) & 1, i2 = lane >> 4;
#pragma unroll 4
    for (int k0 = 0; k0 < KD; k0 += 16) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
            if (!AT) ptx_ldmatrix_x4(a[mi], sA + (m0 + mi * 16 + r8 + i1 * 8) * lda + k0 + i2 * 8);
            else ptx_ldmatrix_x4_trans(a[mi], sA + (k0 + r8 + i2 * 8) * lda + m0 + mi * 16 + i1 * 8);
        }
#pragma unroll
        for (int nj = 0; nj < NT; nj += 2) {
            uint32_t b[4];
            if (!BT) ptx_ldmatrix_x4_trans(b, sB + (k0 + r8 + i1 * 8) * ldb + n0 + nj * 8 + i2 * 8);
            else ptx_ldmatrix_x4(b, sB + (n0 + nj * 8 + r8 + i2 * 8) * ldb + k0 + i1 * 8);
#pragma unroll
            for (int mi = 0; mi < MT; mi++) {
                ptx_mma_bf16_16816(acc[mi][nj], a[mi], b[0], b[1]);
                ptx_mma_bf16_16816(acc[mi][nj + 1], a[mi], b[2], b[3]);
            }
        }
    }
}

template <int MT, int NT> GDN_DEV void gdn_zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;
}

#endif
